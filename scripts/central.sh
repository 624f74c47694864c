#!/usr/bin/env bash
# The central shape on one machine: tansu, Debian's mosquitto as the devices' broker (TLS,
# client certificates, an ACL), three pixgate replicas with cluster.enabled and a generated
# scenario's simulated fleet; prints what each replica did and checks every effect against
# an independent model. With --kills N, replicas other than the first are SIGKILLed and
# started again mid-run; their queues move to the others through the delivery log. With
# --freeze-ms MS, replica r1 is frozen (SIGSTOP) and replaced by a process with its
# identity, then continued: the broker's log shows whose connections were cut for whom.
# With --broker-restarts N, mosquitto is SIGKILLed and started again mid-run. With --scale
# (and --replicas 2), a third replica joins and r1 then leaves on SIGTERM.
#
#   scripts/central.sh [pixgate-central options]   (--replicas 2|3, --events, --devices, --seed, --kills, --freeze-ms, --broker-restarts, --scale)
#
# Installs tansu (~15 min, once) and mosquitto if missing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
"$root/scripts/ensure-tansu.sh" >/dev/null
"$root/scripts/ensure-mosquitto.sh" >/dev/null
echo "[central] building pixgate and the harness (first build takes a few minutes)..."
cargo build -p gateway -p pixgate-tests --bins
target="${CARGO_TARGET_DIR:-$root/target}"
exec "$target/debug/pixgate-central" "$@"
