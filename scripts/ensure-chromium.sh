#!/usr/bin/env bash
# Installs Debian's chromium and chromium-driver (chromedriver) if they are missing:
# tests/tests/dashboard.rs loads the operator's dashboard in a real headless browser over
# WebDriver (tests/src/browser.rs). Uses apt-get (as root, or through sudo without a
# password); prints the chromedriver path.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
  command -v chromedriver; exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: chromium or chromedriver is missing and there is no apt-get here; install them" >&2
  echo "       with this system's package manager (Debian: chromium, chromium-driver)." >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "error: chromium or chromium-driver is not installed, and installing them needs root: run" >&2
  echo "       'sudo apt-get install -y chromium chromium-driver' (or this script as root), then try again." >&2
  exit 1
fi
echo "installing chromium and chromium-driver (headless browser for the dashboard test)..." >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet; an install from a stale list can also fail.
if ! "${as_root[@]}" apt-get install -y --no-install-recommends chromium chromium-driver >&2; then
  "${as_root[@]}" apt-get update >&2
  "${as_root[@]}" apt-get install -y --no-install-recommends chromium chromium-driver >&2
fi
command -v chromium >/dev/null 2>&1 || { echo "error: chromium installed but not on PATH" >&2; exit 1; }
command -v chromedriver >/dev/null 2>&1 || { echo "error: chromium-driver installed but chromedriver is not on PATH" >&2; exit 1; }
command -v chromedriver
