#!/usr/bin/env bash
# Fleet scale: the same simulated fleet over TLS (a secret per device) against pixgate and
# against Debian's mosquitto, side by side. Figures are printed, never asserted.
#
#   scripts/fleet-bench.sh [DEVICES [EVENTS]]     default 1,000 devices, 20,000 charge events
#
# pixgate: `pixgate-load --tls secret` (tansu, a backlog of EVENTS charge events drained to
# the fleet, 20 s of live traffic). mosquitto: `fleet-mosquitto` (TLS listener, password
# file, ACL with `pattern … pixgate/v1/devices/%u/…`; a client plays the gateway and
# publishes as many jobs as pixgate delivered). Both print a `FLEET …` line; this script
# tabulates them. Run it on an otherwise idle machine; it runs under `nice -n 10`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
devices="${1:-1000}"
events="${2:-20000}"
"$root/scripts/ensure-tansu.sh" >/dev/null
"$root/scripts/ensure-mosquitto.sh" >/dev/null
target="${CARGO_TARGET_DIR:-$root/target}"
echo "[fleet-bench] building pixgate, pixgate-load and fleet-mosquitto in release..."
cargo build --release -p gateway -p pixgate-tests --bins
export PIXGATE_BIN="$target/release/pixgate"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

echo "[fleet-bench] pixgate: $devices devices over TLS, $events charge events"
nice -n 10 "$target/release/pixgate-load" --tls secret --devices "$devices" --events "$events" \
  --live-seconds 20 2>"$out/pixgate.err" | tee "$out/pixgate.out" | grep -v '^  t=' || true
pixgate_line="$(grep '^FLEET ' "$out/pixgate.out" || true)"
jobs="$(sed -n 's/.* messages=\([0-9]*\).*/\1/p' <<<"$pixgate_line")"
jobs="${jobs:-$events}"

echo "[fleet-bench] mosquitto: $devices devices over TLS, $jobs jobs"
nice -n 10 "$target/release/fleet-mosquitto" --devices "$devices" --jobs "$jobs" \
  2>"$out/mosquitto.err" | tee "$out/mosquitto.out" || true
mosquitto_line="$(grep '^FLEET ' "$out/mosquitto.out" || true)"

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }
echo
echo "Fleet of $devices devices over TLS (secret per device), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB RAM"
printf '| %-40s | %-12s | %-12s |\n' figure pixgate mosquitto
printf '|%s|%s|%s|\n' "$(printf -- '-%.0s' {1..42})" "$(printf -- '-%.0s' {1..14})" "$(printf -- '-%.0s' {1..14})"
row() { printf '| %-40s | %-12s | %-12s |\n' "$1" "$(field "$2" "$pixgate_line")" "$(field "$2" "$mosquitto_line")"; }
row "connections held (of $devices)" held
row "time to all connected, s" connect_s
row "handshakes/s (average to all connected)" handshakes_per_s
row "handshakes/s (best 5 s)" peak_handshakes_per_s
row "failed connection attempts" failed_attempts
row "resident memory, all connected, MiB" rss_connected_mib
row "resident memory, peak, MiB" rss_peak_mib
row "messages (jobs acked)" messages
row "messages/s" messages_per_s
row "broker CPU per message, µs" cpu_us_per_msg
echo
echo "pixgate's messages/s and CPU per message include reading Kafka, rendering and the durable"
echo "outbox; mosquitto's only route a ready job and its ack. A held count is the fewest devices"
echo "connected while messages flowed."
[ -n "$pixgate_line" ] || echo "the pixgate run gave no figures (see its output above)"
[ -n "$mosquitto_line" ] || echo "the mosquitto run gave no figures (see its output above)"
