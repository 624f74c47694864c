#!/usr/bin/env bash
# Receipts per second on one core: pixgate's renderer (render/benches/receipt.rs) against
# python-escpos rendering the same pay-with-Pix slip (render/benches/python_escpos_bench.py),
# native QR (`GS ( k`) and raster QR (`GS v 0`), measured in this one run (the two take
# turns, 3 rounds) and printed as a table with the ratios. Rates are per second of thread
# CPU time on both sides, so they are per core even when the machine is busy; other load
# still costs cache and memory bandwidth, so compare ratios rather than absolute figures
# across runs.
#
#   scripts/bench-render.sh [SECONDS]   # measuring time per side, default 6
#
# The first run builds the bench in release mode and installs python-escpos into a virtual
# environment under the cargo target directory (both once); it needs python3 (>= 3.9).
# The full criterion report (and the parts of a receipt): cargo bench -p render --bench receipt
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seconds="${1:-6}"

echo "building the receipt bench (release)..." >&2
build="$(cargo bench -p render --bench receipt --no-run 2>&1)" || { echo "$build" >&2; exit 1; }
bench="$(echo "$build" | sed -n 's/.*Executable benches\/receipt\.rs (\(.*\))$/\1/p' | tail -1)"
if [ ! -x "$bench" ]; then
  echo "could not find the receipt bench binary in cargo's output:" >&2
  echo "$build" >&2
  exit 1
fi
echo "measuring pixgate and python-escpos in turns (${seconds} s each)..." >&2
python3 "$root/render/benches/python_escpos_bench.py" --pixgate-bench "$bench" --seconds "$seconds"
