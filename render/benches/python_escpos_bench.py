#!/usr/bin/env python3
"""The QR slip of render/benches/receipt.rs, rendered with python-escpos, and the rates side by side.

What one python-escpos slip does (the same as pixgate's `raster_qr_receipt` /
`native_qr_receipt`): build the static Pix BR Code of the charge (TLV fields, CRC16), format
the amount and the expiry time, and write the same pay-with-Pix slip to a `Dummy` printer
(Epson TM-T20II profile: 576 dots, 48 columns, code page CP860): centred bold double-size
merchant name, city, title, amount, items, charge id, txid, the QR at error correction M
with 6-dot modules, the scan hint, "Válido até" and the expiry, cut. The QR is either native
(`GS ( k`, `qr(native=True)`) or an image (`qr(native=False)`: the `qrcode` package draws
it, Pillow converts it, `GS v 0` sends it). The printer object is reused and cleared between
slips (cheaper for python-escpos than a new one). The paid receipt prints no QR, so the
slip is the printed job that compares QR work.

Rates are receipts per second of this thread's CPU time (`time.thread_time`), the median of
short batches, like the Rust bench's `RATE` lines (also thread CPU time), so both are per core
even on a shared machine. To share the machine's mood fairly, the two sides take turns:
`--rounds` times the Rust bench binary runs (`PIXGATE_BENCH_RATES_ONLY=1`), then this script
measures; the table shows the median of the rounds and the range of the per-round ratios.

Usage:
    python3 render/benches/python_escpos_bench.py --pixgate-bench PATH [--seconds 6] [--rounds 3]

PATH is the built receipt bench (`cargo bench -p render --bench receipt --no-run` prints it);
scripts/bench-render.sh builds it and runs this. With PYTHON_ESCPOS_DUMP=prefix the two
python-escpos jobs are written to prefix-native.bin and prefix-raster.bin (to print them
with `printer-sim decode`).

The script installs python-escpos (PyPI `python-escpos`) into a virtual environment under
the cargo target directory the first time and re-runs itself there; later runs reuse it.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
import venv

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
VENV = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(REPO, "target"), "python-escpos-venv")
REQUIREMENT = "python-escpos==3.1"


def ensure_venv():
    """Re-executes this script inside VENV, creating it and installing python-escpos first if needed."""
    py = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    if not os.path.exists(py):
        print(f"creating {VENV}", file=sys.stderr)
        venv.create(VENV, with_pip=True)
    has = subprocess.run([py, "-c", "import escpos.printer, qrcode, PIL"], capture_output=True).returncode == 0
    if not has:
        print(f"installing {REQUIREMENT} into {VENV}", file=sys.stderr)
        subprocess.run([py, "-m", "pip", "install", "--quiet", REQUIREMENT], check=True)
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


# --- the charge (the same values as `charge()` in receipt.rs) -------------------------------

CHARGE = {
    "id": "6748a1f0c2b3d4e5f6a7b8c9",
    "pix_key": "padaria.paoeacucar@example.com",
    "value_cents": 123_456,
    "merchant_name": "Padaria Pão e Açúcar",
    "merchant_city": "São Paulo",
    "transaction_id": "PIXGATEBENCH0001",
    "items": [("Pão de queijo", "3x"), ("Café coado", "2x")],
    "comment": "Sem açúcar, por favor",
    "payer_name": "José da Conceição",
    "paid_at": "2026-11-27T12:01:07+00:00",
    "expires_at": "2026-11-27T12:15:00+00:00",
    "end_to_end_id": "E25328704202611271201yxv2kgafrfw",
}
COLUMNS = 48  # font A on 576 dots


def crc16(data: bytes) -> int:
    """CRC-16/CCITT-FALSE (EMV-MPM field 63)."""
    crc = 0xFFFF
    for b in data:
        crc ^= b << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
    return crc


def fold_upper(text: str, limit: int) -> str:
    """Uppercase ASCII letters, digits and the BR Code punctuation; accents dropped."""
    import unicodedata

    plain = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().upper()
    out = []
    for c in plain:
        if c.isalnum() or c in "$%*+-./: ":
            if c == " " and (not out or out[-1] == " "):
                continue
            out.append(c)
    return "".join(out)[:limit].rstrip()


def tlv(tag: str, value: str) -> str:
    return f"{tag}{len(value):02d}{value}"


def brcode(c) -> str:
    """The static Pix BR Code pixgate writes for the charge (render::brcode::encode_static)."""
    mai = tlv("00", "br.gov.bcb.pix") + tlv("01", c["pix_key"])
    cents = c["value_cents"]
    body = (
        tlv("00", "01")
        + tlv("26", mai)
        + tlv("52", "0000")
        + tlv("53", "986")
        + tlv("54", f"{cents // 100}.{cents % 100:02d}")
        + tlv("58", "BR")
        + tlv("59", fold_upper(c["merchant_name"], 25))
        + tlv("60", fold_upper(c["merchant_city"], 15))
        + tlv("62", tlv("05", c["transaction_id"]))
        + "6304"
    )
    return body + f"{crc16(body.encode()):04X}"


def amount_pt_br(cents: int) -> str:
    whole = f"{cents // 100:,}".replace(",", ".")
    return f"R$ {whole},{cents % 100:02d}"


def receipt(p, c, native: bool) -> bytes:
    """One pay-with-Pix slip, as pixgate lays it out (render::receipt::render_receipt_for)."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from escpos.constants import QR_ECLEVEL_M

    p.clear()
    # ESC @, ESC t 3 (CP860): python-escpos sends no code table when the encoding is
    # forced; pixgate's jobs start with both, so the job is self-contained here too.
    p._raw(b"\x1b@\x1bt\x03")
    payload = brcode(c)
    expires = datetime.fromisoformat(c["expires_at"]).astimezone(ZoneInfo("America/Sao_Paulo")).strftime("%d/%m/%Y %H:%M")
    p.set(align="center", bold=True, double_height=True, double_width=True)
    p.textln(c["merchant_name"])
    p.set(align="center", bold=False, normal_textsize=True)
    p.textln(c["merchant_city"])
    p.ln()
    p.set(align="center", bold=True, normal_textsize=True)
    p.textln("PAGUE COM PIX")
    p.set(align="center", bold=False, normal_textsize=True)
    p.textln("Total")
    p.set(align="center", bold=True, double_height=True, double_width=True)
    p.textln(amount_pt_br(c["value_cents"]))
    p.set(align="left", bold=False, normal_textsize=True)
    p.textln("-" * COLUMNS)
    for name, value in c["items"]:
        p.textln(name.ljust(COLUMNS - len(value)) + value)
    p.textln("-" * COLUMNS)
    p.textln(f"Cobrança: {c['id']}")
    p.textln(f"ID da transação: {c['transaction_id']}")
    p.ln()
    p.set(align="center", bold=False, normal_textsize=True)
    if native:
        p.qr(payload, ec=QR_ECLEVEL_M, size=6, native=True)
    else:
        p.qr(payload, ec=QR_ECLEVEL_M, size=6, native=False, center=True)
    p.textln("Escaneie o QR code no app do seu banco")
    p.set(align="center", bold=True, normal_textsize=True)
    p.textln(f"Válido até: {expires}")
    p.set(align="left", bold=False, normal_textsize=True)
    p.cut()
    return p.output


def rate(fn, seconds: float) -> float:
    """Calls per second of thread CPU time: median over batches of about 0.2 s."""
    t = time.thread_time()
    n = 0
    while time.thread_time() - t < 0.1:
        fn()
        n += 1
    batch = max(1, int(n * 2))
    rates = []
    end = time.thread_time() + seconds
    while time.thread_time() < end or len(rates) < 3:
        t = time.thread_time()
        for _ in range(batch):
            fn()
        rates.append(batch / (time.thread_time() - t))
    return statistics.median(rates)


def run_pixgate(bench: str, seconds: float):
    """One run of the Rust bench in rates-only mode: ({case: rate}, BR Code, clock)."""
    env = dict(os.environ, PIXGATE_BENCH_RATES_ONLY="1", PIXGATE_BENCH_SECONDS=str(seconds))
    out = subprocess.run([bench], env=env, capture_output=True, text=True, check=True).stdout
    rates, payload, clock = {}, None, None
    for line in out.splitlines():
        parts = line.split()
        if parts[:1] == ["RATE"] and len(parts) == 3:
            rates[parts[1]] = float(parts[2])
        elif parts[:1] == ["PAYLOAD"]:
            payload = line.split(" ", 1)[1].strip()
        elif parts[:1] == ["CLOCK"]:
            clock = parts[1]
    if not rates or payload is None:
        sys.exit(f"{bench}: no RATE/PAYLOAD lines in its output:\n{out}")
    return rates, payload, clock


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pixgate-bench", required=True, help="path of the built receipt bench binary")
    ap.add_argument("--seconds", type=float, default=6.0, help="measuring time per side, all rounds together")
    ap.add_argument("--rounds", type=int, default=3, help="alternations of pixgate and python-escpos")
    args = ap.parse_args()
    ensure_venv()

    import escpos
    from escpos.printer import Dummy

    p = Dummy(profile="TM-T20II")
    p.charcode("CP860")
    native = receipt(p, CHARGE, native=True)
    raster = receipt(p, CHARGE, native=False)
    ours = brcode(CHARGE)
    # The same kind of job: a GS ( k symbol holding the BR Code, or a GS v 0 raster.
    assert b"\x1d(k" in native and ours.encode() in native, "native receipt without GS ( k and the BR Code"
    assert b"\x1dv0" in raster and b"\x1d(k" not in raster, "raster receipt without GS v 0"
    if os.environ.get("PYTHON_ESCPOS_DUMP"):
        for name, job in [("native", native), ("raster", raster)]:
            with open(f"{os.environ['PYTHON_ESCPOS_DUMP']}-{name}.bin", "wb") as f:
                f.write(job)

    cases = [("native_qr_receipt", "native QR (GS ( k)", True), ("raster_qr_receipt", "raster QR (GS v 0)", False)]
    rounds = max(1, args.rounds)
    share = args.seconds / rounds
    pixgate_rounds, py_rounds, clock = [], [], None
    for _ in range(rounds):
        rates, payload, clock = run_pixgate(args.pixgate_bench, share)
        if payload != ours:
            sys.exit(f"BR Codes differ, not the same receipt:\n  pixgate        {payload}\n  python-escpos  {ours}")
        pixgate_rounds.append(rates)
        py_rounds.append({case: rate(lambda: receipt(p, CHARGE, native=n), share / len(cases)) for case, _, n in cases})

    version = getattr(escpos, "__version__", None) or "?"
    print(f"Receipts per second on one core (thread CPU time, pixgate clock {clock}; median of {rounds} alternating rounds;")
    print(f"python-escpos {version} on Python {sys.version.split()[0]}, Dummy printer, TM-T20II profile)")
    print(f"{'receipt':<22}{'pixgate':>11}{'python-escpos':>15}{'ratio':>8}   per-round ratios")
    for case, label, _ in cases:
        ours_rate = statistics.median(r[case] for r in pixgate_rounds)
        theirs = statistics.median(r[case] for r in py_rounds)
        per_round = sorted(a[case] / b[case] for a, b in zip(pixgate_rounds, py_rounds))
        spread = f"{per_round[0]:.0f}x..{per_round[-1]:.0f}x"
        print(f"{label:<22}{ours_rate:>11,.0f}{theirs:>15,.0f}{ours_rate / theirs:>7.0f}x   {spread}")
    paid = statistics.median(r.get("paid_receipt", float("nan")) for r in pixgate_rounds)
    print(f"{'paid receipt (no QR)':<22}{paid:>11,.0f}{'-':>15}{'-':>8}")
    screen = statistics.median(r.get("qr_screen_png", float("nan")) for r in pixgate_rounds)
    print(f"{'QR screen PNG':<22}{screen:>11,.0f}{'-':>15}{'-':>8}")


if __name__ == "__main__":
    main()
