#!/usr/bin/env bash
# Installs Debian packages for the ensure-*.sh scripts: apt-get as root, or through sudo
# without a password; retries once after `apt-get update` (a fresh machine may have no
# package lists yet, and an install from a stale list can fail).
# Usage: apt-install.sh WHY PACKAGE...   (WHY is said in the messages)
set -euo pipefail
why="$1"; shift
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: $* missing and there is no apt-get here; install them with this system's" >&2
  echo "       package manager (Debian packages: $*)." >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "error: $* not installed, and installing them needs root: run" >&2
  echo "       'sudo apt-get install -y $*' (or this script as root), then try again." >&2
  exit 1
fi
echo "installing $* ($why)..." >&2
export DEBIAN_FRONTEND=noninteractive
if ! "${as_root[@]}" apt-get install -y --no-install-recommends "$@" >&2; then
  "${as_root[@]}" apt-get update >&2
  "${as_root[@]}" apt-get install -y --no-install-recommends "$@" >&2
fi
