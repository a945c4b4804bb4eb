#!/bin/sh
# Prints the Debian packages that provide the shared libraries the given programs load (one name
# a line, sorted): what a runtime image installs instead of the build dependencies. Uses ldd and
# dpkg -S, so it runs where the programs were built (the build stage of deploy/Dockerfile*).
# A library no package owns is an error, except under a --skip PREFIX (the CUDA libraries of
# NVIDIA's base images, which the runtime base image has too).
# Usage: deploy/runtime-packages.sh [--skip PREFIX]... PROGRAM...
set -eu
skips=""
while [ $# -gt 0 ] && [ "$1" = "--skip" ]; do
  skips="$skips $2"
  shift 2
done
if [ $# -eq 0 ]; then
  echo "usage: runtime-packages.sh [--skip PREFIX]... PROGRAM..." >&2
  exit 2
fi
libs=""
for program in "$@"; do
  if ! out=$(ldd "$program" 2>&1); then
    echo "runtime-packages.sh: ldd $program: $out" >&2
    exit 1
  fi
  if printf '%s\n' "$out" | grep -q 'not found'; then
    echo "runtime-packages.sh: $program needs libraries that are not installed:" >&2
    printf '%s\n' "$out" | grep 'not found' >&2
    exit 1
  fi
  # "libzmq.so.5 => /lib/x86_64-linux-gnu/libzmq.so.5 (0x...)": the resolved path.
  libs="$libs $(printf '%s\n' "$out" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')"
done
packages=""
# $libs and $packages are split into words on purpose: paths and package names have no spaces.
# shellcheck disable=SC2086
for lib in $(printf '%s\n' $libs | sort -u); do
  skipped=0
  for prefix in $skips; do
    case "$lib" in "$prefix"*) skipped=1 ;; esac
  done
  [ "$skipped" -eq 1 ] && continue
  # dpkg knows the path as installed; /lib is a link to /usr/lib on Debian 12.
  owner=$(dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null ||
          dpkg -S "/usr$lib" 2>/dev/null) || {
    echo "runtime-packages.sh: no Debian package owns $lib" >&2
    exit 1
  }
  packages="$packages $(printf '%s\n' "$owner" | cut -d: -f1)"
done
# shellcheck disable=SC2086
printf '%s\n' $packages | sort -u
