#!/usr/bin/env bash
# Installs Debian's mosquitto-clients (mosquitto_sub, mosquitto_pub) and the mosquitto broker
# (mosquitto, mosquitto_passwd) if they are missing: tests/tests/mosquitto_peer.rs plays a card
# machine with the clients, as an outside MQTT peer; tests/tests/sim_tls.rs runs the broker with
# TLS and device credentials. Uses apt-get (as root, or through sudo without a password);
# prints the mosquitto_sub path. (Where systemd runs, the package also starts a system broker on
# port 1883; the tests never use it, each starts its own broker on a free loopback port.)
set -euo pipefail
# Debian puts the broker in /usr/sbin, which a normal user's PATH may lack.
have_broker() { command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ]; }
if command -v mosquitto_sub >/dev/null 2>&1 && command -v mosquitto_pub >/dev/null 2>&1 \
  && command -v mosquitto_passwd >/dev/null 2>&1 && have_broker; then
  command -v mosquitto_sub; exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "error: the mosquitto clients or broker are missing and there is no apt-get here; install" >&2
  echo "       them with this system's package manager (Debian: mosquitto-clients, mosquitto)." >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo -n)
else
  echo "error: mosquitto-clients or mosquitto is not installed, and installing them needs root: run" >&2
  echo "       'sudo apt-get install -y mosquitto-clients mosquitto' (or this script as root), then try again." >&2
  exit 1
fi
echo "installing mosquitto-clients and mosquitto (MQTT peer and TLS broker for the integration tests)..." >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh machine may have no package lists yet; an install from a stale list can also fail.
if ! "${as_root[@]}" apt-get install -y --no-install-recommends mosquitto-clients mosquitto >&2; then
  "${as_root[@]}" apt-get update >&2
  "${as_root[@]}" apt-get install -y --no-install-recommends mosquitto-clients mosquitto >&2
fi
command -v mosquitto_sub >/dev/null 2>&1 || { echo "error: mosquitto-clients installed but mosquitto_sub is not on PATH" >&2; exit 1; }
have_broker || { echo "error: mosquitto installed but neither on PATH nor /usr/sbin/mosquitto" >&2; exit 1; }
command -v mosquitto_sub
