#!/usr/bin/env bash
# Installs Debian's chromium and chromium-driver (chromedriver) if they are missing:
# tests/tests/dashboard.rs loads the operator's dashboard in a real headless browser over
# WebDriver (tests/src/browser.rs). Uses apt-get (as root, or through sudo without a
# password: scripts/apt-install.sh); prints the chromedriver path.
set -euo pipefail
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  "$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" "headless browser for the dashboard test" chromium chromium-driver
fi
command -v chromium >/dev/null 2>&1 || { echo "error: chromium installed but not on PATH" >&2; exit 1; }
command -v chromedriver >/dev/null 2>&1 || { echo "error: chromium-driver installed but chromedriver is not on PATH" >&2; exit 1; }
command -v chromedriver
