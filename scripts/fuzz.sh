#!/usr/bin/env bash
# Fuzzes pixgate's decoders of untrusted bytes with cargo-fuzz (libFuzzer), one target after
# the other, each for a fixed time. Targets and their properties: fuzz/README.md.
#
#   scripts/fuzz.sh                      # every target, 600 s each
#   scripts/fuzz.sh -t 60 brcode_parse   # one target, 60 s
#   scripts/fuzz.sh --seeds              # only (re)write the seed files from the fixtures
#
# Installs cargo-fuzz if missing (`cargo install cargo-fuzz`, about a minute) and needs the
# nightly toolchain (`rustup toolchain install nightly`). The first build of the fuzz crate
# takes a while: it compiles the workspace's dependencies with coverage instrumentation
# into fuzz/target. One libFuzzer process per target (-jobs=1 -workers=1): libFuzzer then
# writes the run's log to fuzz/logs/<target>/fuzz-0.log; its summary is printed here.
# A crash leaves its input in fuzz/artifacts/<target>/ and makes this script fail.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fuzz="$root/fuzz"
fixtures="$root/fixtures"
all_targets=(brcode_parse escpos_decode cdc_decode)

seconds=600
seeds_only=false
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    -t|--time) seconds="$2"; shift 2 ;;
    --seeds) seeds_only=true; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")

# libFuzzer limits for every target: -malloc_limit_mb catches a single allocation sized by
# a lying length field (the decoders' largest legitimate buffer is the ESC/POS page, 576
# dots x 20,000 rows, about 12 MB, doubled while it grows); -timeout fails one input that
# takes longer than 10 s.
limits="-rss_limit_mb=2048 -malloc_limit_mb=256 -timeout=10"

# Seed files are named seed-*; libFuzzer's own finds (named by their SHA-1) are not
# committed (fuzz/.gitignore).
write_seeds() {
  python3 - "$fixtures" "$fuzz/corpus" <<'PY'
import json, os, sys
fixtures, corpus = sys.argv[1], sys.argv[2]

def put(target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)

# BR Code: every payload of the vectors, and every brCode field of the CDC fixtures.
vectors = json.load(open(os.path.join(fixtures, "brcode/vectors.json"), encoding="utf-8"))
for i, v in enumerate(vectors):
    put("brcode_parse", f"vector-{i:02}", v["payload"].encode("utf-8"))
seen = set()
for line in open(os.path.join(fixtures, "cdc/charges.jsonl"), encoding="utf-8"):
    doc = json.loads(line)["value"].get("fullDocument") or {}
    code = doc.get("brCode")
    if isinstance(code, str) and code not in seen:
        seen.add(code)
        put("brcode_parse", f"charge-{len(seen):03}", code.encode("utf-8"))

# CDC: each fixture line's record value, as the capture simulator publishes it (a JSON
# value serialised compactly, a string value as its raw bytes).
for fname in ("devices.jsonl", "charges.jsonl", "edge-cases.jsonl"):
    for n, line in enumerate(open(os.path.join(fixtures, "cdc", fname), encoding="utf-8")):
        value = json.loads(line)["value"]
        data = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        put("cdc_decode", f"{fname.split('.')[0]}-{n:03}", data.encode("utf-8"))

# ESC/POS: the public streams, after the target's selector byte (0 = 80 mm, generic model).
streams = set()
for sub in ("escpos-php", "escpos-tools"):
    for fname in sorted(os.listdir(os.path.join(fixtures, "escpos", sub))):
        data = open(os.path.join(fixtures, "escpos", sub, fname), "rb").read()
        if fname.endswith(".bin") and data not in streams:  # receipt-with-logo is in both
            streams.add(data)
            put("escpos_decode", f"{sub}-{fname[:-4]}", b"\x00" + data)
PY
  # Receipts as pixgate renders them (paid receipts, and pay-with-Pix slips with native and
  # raster QR, 58 and 80 mm): render's output test writes them to /tmp/render-samples.
  (cd "$root" && cargo test -q -p render --test outputs receipts_for_58_and_80_mm_native_and_raster >/dev/null)
  for f in /tmp/render-samples/receipt-*mm-*.bin; do
    name="$(basename "$f" .bin)"
    case "$name" in *-58mm-*) sel='\001' ;; *) sel='\000' ;; esac
    { printf "$sel"; cat "$f"; } > "$fuzz/corpus/escpos_decode/seed-render-$name"
  done
  for t in "${all_targets[@]}"; do
    echo "seeds for $t: $(ls "$fuzz/corpus/$t"/seed-* | wc -l) files, $(cat "$fuzz/corpus/$t"/seed-* | wc -c) bytes"
  done
}

if $seeds_only; then
  write_seeds
  exit 0
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "installing cargo-fuzz (cargo install cargo-fuzz)"
  cargo install cargo-fuzz
fi
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "the nightly toolchain is needed: rustup toolchain install nightly --profile minimal" >&2
  exit 1
fi
for t in "${targets[@]}"; do
  ls "$fuzz/corpus/$t"/seed-* >/dev/null 2>&1 || { write_seeds; break; }
done

status=0
for t in "${targets[@]}"; do
  mkdir -p "$fuzz/logs/$t" "$fuzz/corpus/$t"
  echo "== $t: ${seconds}s"
  # libFuzzer writes fuzz-0.log into its working directory (and repeats it on stdout when
  # the job ends): run from the target's log dir, keep stdout beside it, print the summary.
  (cd "$fuzz/logs/$t" && rm -f fuzz-0.log &&
    features=()
    [ "$t" = escpos_decode ] && features=(--features escpos)
    cargo +nightly fuzz run --fuzz-dir "$fuzz" "${features[@]}" "$t" "$fuzz/corpus/$t" -- \
      -max_total_time="$seconds" -jobs=1 -workers=1 $limits -print_final_stats=1 >run.out 2>&1) || status=1
  log="$fuzz/logs/$t/fuzz-0.log"
  grep -E '^#[0-9]+[[:space:]]+(INITED|DONE)|^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)|^SUMMARY|ERROR: libFuzzer|Test unit written' "$log" || true
  if grep -qE 'Test unit written|^SUMMARY' "$log"; then
    echo "!! $t crashed: see $log and fuzz/artifacts/$t/" >&2
    status=1
  fi
done
exit $status
