#!/usr/bin/env bash
# The main job: pixgate end to end on a fixtures folder.
#
#   scripts/demo.sh [FIXTURES] [OUT] [--burst]   (defaults: fixtures/cdc, out)
#
# Installs the Kafka-protocol broker if missing (tansu, ~15 min once), builds pixgate and
# the simulators, then runs pixgate-demo: broker + pixgate + one simulated device per
# registry entry + the capture simulator. Leaves PNGs, transcripts and summary.json in OUT
# and stops everything it started, also on Ctrl-C.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fixtures="$(realpath -m "${1:-$root/fixtures/cdc}")"
out="$(realpath -m "${2:-out}")"
cd "$root"
"$root/scripts/ensure-tansu.sh" >/dev/null
echo "[demo] building pixgate and the simulators (first build takes a few minutes)..."
cargo build -p gateway -p pixgate-tests --bins
target="${CARGO_TARGET_DIR:-$root/target}"
exec "$target/debug/pixgate-demo" "$fixtures" "$out" "${@:3}"
