#!/usr/bin/env bash
# All tests, integration tests included (they start a tansu broker on loopback, the pixgate
# binary and the device simulators). Installs tansu if missing (~15 min, once per machine)
# and Debian's mosquitto-clients (the outside MQTT peer of tests/tests/mosquitto_peer.rs),
# Debian's chromium and chromium-driver (tests/tests/dashboard.rs drives the dashboard in a
# headless browser), and cargo-deb (tests/tests/debian_package.rs packages the debug binary built here, installs
# it with dpkg and purges it again: run as root).
# tests/tests/upstream.rs makes a Python virtualenv under the target folder once and installs
# confluent-kafka from PyPI into it (the upstream producer that is not pixgate's), and
# publishes with Debian's kcat a record whose header key is not UTF-8.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
"$root/scripts/ensure-tansu.sh" >/dev/null
"$root/scripts/ensure-mosquitto.sh" >/dev/null
"$root/scripts/ensure-chromium.sh" >/dev/null
"$root/scripts/ensure-cargo-deb.sh" >/dev/null
"$root/scripts/ensure-kcat.sh" >/dev/null
# The end-to-end tests run the pixgate binary as a child process: build it first.
cargo build --workspace --bins
cargo test --workspace --no-fail-fast "$@"
