#!/usr/bin/env bash
# The load harness and the full-scale proofs, in release (figures are printed, never asserted).
#
#   scripts/load.sh [pixgate-load options]   backlog drain + live traffic, measured; default a
#                                            1,000,000-event backlog (e.g. --events 100000)
#   scripts/load.sh crash                    the SIGKILL proof at full scale: 20,000 charge
#                                            events, 500 devices, 20 kills (PIXGATE_SCALE_*
#                                            override), in the test profile like CI
#
# Installs tansu if missing (~15 min, once). `pixgate-load --help` lists the options.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
"$root/scripts/ensure-tansu.sh" >/dev/null
target="${CARGO_TARGET_DIR:-$root/target}"
if [ "${1:-}" = "crash" ]; then
  shift
  cargo build --workspace --bins  # as scripts/test.sh: the same features, so the same artifacts
  export PIXGATE_SCALE_EVENTS="${PIXGATE_SCALE_EVENTS:-20000}"
  export PIXGATE_SCALE_DEVICES="${PIXGATE_SCALE_DEVICES:-500}"
  export PIXGATE_SCALE_KILLS="${PIXGATE_SCALE_KILLS:-20}"
  exec cargo test -p pixgate-tests --test crash_scale -- --nocapture "$@"
fi
echo "[load] building pixgate and the harness in release..."
cargo build --release -p gateway -p pixgate-tests --bins
exec "$target/release/pixgate-load" "$@"
