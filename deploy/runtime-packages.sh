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
# Each library under both of its names (/lib is a link to /usr/lib on Debian 12, and dpkg knows
# a file by the path its package installed it as), all in one dpkg -S: it reads its database once.
wanted=""
patterns=""
# $libs, $wanted and $patterns are split into words on purpose: paths have no spaces.
# shellcheck disable=SC2086
for lib in $(printf '%s\n' $libs | sort -u); do
  skipped=0
  for prefix in $skips; do
    case "$lib" in "$prefix"*) skipped=1 ;; esac
  done
  [ "$skipped" -eq 1 ] && continue
  wanted="$wanted $lib"
  case "$lib" in
    /usr/*) patterns="$patterns $lib ${lib#/usr}" ;;
    *) patterns="$patterns $lib /usr$lib" ;;
  esac
done
[ -n "$wanted" ] || exit 0
# shellcheck disable=SC2086
owners=$(dpkg -S $patterns 2>/dev/null || true)
for lib in $wanted; do
  short=${lib#/usr}
  if ! printf '%s\n' "$owners" | grep -q -e ": $lib\$" -e ": $short\$" -e ": /usr$short\$"; then
    echo "runtime-packages.sh: no Debian package owns $lib" >&2
    exit 1
  fi
done
printf '%s\n' "$owners" | cut -d: -f1 | sort -u
