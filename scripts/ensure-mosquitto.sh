#!/usr/bin/env bash
# Installs Debian's mosquitto-clients (mosquitto_sub, mosquitto_pub) if they are missing:
# tests/tests/mosquitto_peer.rs plays a card machine with them, as an outside MQTT peer.
# Uses apt-get (as root, or through sudo without a password); prints the mosquitto_sub path.
set -euo pipefail
if command -v mosquitto_sub >/dev/null 2>&1 && command -v mosquitto_pub >/dev/null 2>&1; then
  command -v mosquitto_sub; exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: mosquitto_sub/mosquitto_pub are missing and there is no apt-get here; install the" >&2
  echo "       mosquitto clients with this system's package manager (Debian: mosquitto-clients)." >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "error: mosquitto-clients is not installed, and installing it needs root: run" >&2
  echo "       'sudo apt-get install -y mosquitto-clients' (or this script as root), then try again." >&2
  exit 1
fi
echo "installing mosquitto-clients (MQTT peer for the integration tests)..." >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet; an install from a stale list can also fail.
if ! "${as_root[@]}" apt-get install -y --no-install-recommends mosquitto-clients >&2; then
  "${as_root[@]}" apt-get update >&2
  "${as_root[@]}" apt-get install -y --no-install-recommends mosquitto-clients >&2
fi
command -v mosquitto_sub >/dev/null 2>&1 || { echo "error: mosquitto-clients installed but mosquitto_sub is not on PATH" >&2; exit 1; }
command -v mosquitto_sub
