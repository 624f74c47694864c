#!/usr/bin/env bash
# Installs Debian's mosquitto-clients (mosquitto_sub, mosquitto_pub) and the mosquitto broker
# (mosquitto, mosquitto_passwd) if they are missing: tests/tests/mosquitto_peer.rs plays a card
# machine with the clients, as an outside MQTT peer; tests/tests/sim_tls.rs runs the broker with
# TLS and device credentials. Uses apt-get (as root, or through sudo without a password:
# scripts/apt-install.sh); prints the mosquitto_sub path. (Where systemd runs, the package also
# starts a system broker on port 1883; the tests never use it, each starts its own broker on a
# free loopback port.)
set -euo pipefail
# Debian puts the broker in /usr/sbin, which a normal user's PATH may lack.
have_broker() { command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ]; }
if command -v mosquitto_sub >/dev/null 2>&1 && command -v mosquitto_pub >/dev/null 2>&1 \
  && command -v mosquitto_passwd >/dev/null 2>&1 && have_broker; then
  command -v mosquitto_sub; exit 0
fi
"$(dirname "${BASH_SOURCE[0]}")/apt-install.sh" "MQTT peer and TLS broker for the integration tests" \
  mosquitto-clients mosquitto
command -v mosquitto_sub >/dev/null 2>&1 || { echo "error: mosquitto-clients installed but mosquitto_sub is not on PATH" >&2; exit 1; }
have_broker || { echo "error: mosquitto installed but neither on PATH nor /usr/sbin/mosquitto" >&2; exit 1; }
command -v mosquitto_sub
