#!/usr/bin/env bash
# Sets a fresh Debian 12 machine up for LiteLLaMA: installs the Debian packages listed in
# scripts/debian-packages.txt, configures and builds the project, and fetches/creates the assets
# (tokenizer files, the embedded default model).
# Usage: scripts/setup.sh [--no-build] [--build-type Release|Debug] [--hip]
#   --hip  also installs the packages of the list's HIP section (after its "#@hip" line) for the
#          HIP build (cmake -DLITELLAMA_HIP=ON), and builds that way; a plain setup skips them.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build_type=Release
do_build=1
hip=0
while [ $# -gt 0 ]; do
  case "$1" in
    --no-build) do_build=0 ;;
    --hip) hip=1 ;;
    --build-type) build_type="$2"; shift ;;
    *) echo "setup.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done

# Sections: everything before a "#@hip" line, and the HIP section after it (with --hip).
mapfile -t pkgs < <(awk -v hip="$hip" '/^#@hip/ { s = "hip"; next } /^[[:space:]]*#/ { next }
  s != "hip" || hip == 1' scripts/debian-packages.txt | tr -s ' \t' '\n' | grep -v '^$')
# A package counts as present when it is installed or when an installed package provides it
# (NodeSource's nodejs provides npm, and conflicts with Debian's npm package).
provided="$(dpkg-query -W -f='${Status}|${Provides}\n' 2>/dev/null |
  awk -F'|' '$1 ~ /install ok installed/ { print $2 }' | tr ',' '\n' | sed 's/(.*//; s/ //g' |
  sort -u)"
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' && continue
  grep -qx -- "$p" <<<"$provided" && continue
  missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${#missing[@]} Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

bash scripts/fetch-assets.sh
# The official openai npm client of the API's integration test, at the versions and checksums
# tests/integration/openai_client/package-lock.json pins.
npm ci --prefix tests/integration/openai_client --ignore-scripts --no-audit --no-fund \
  --loglevel=error

if [ "$do_build" -eq 1 ]; then
  jobs="$(nproc)"
  hip_args=()
  [ "$hip" -eq 0 ] || hip_args=(-DLITELLAMA_HIP=ON)
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$build_type" "${hip_args[@]}"
  cmake --build build -j"$jobs"
fi
