//! The whole render of one charge, per second on one core:
//!
//! - `raster_qr_receipt`: BR Code (static, [`encode_static`]) + QR ([`render::qr::encode`]),
//!   then the ESC/POS pay-with-Pix slip with the QR as a `GS v 0` raster, generic 80 mm printer
//!   (the printed job with the most work: the paid receipt carries no QR);
//! - `native_qr_receipt`: the same slip for a printer that prints `GS ( k` itself (no QR
//!   encode in pixgate);
//! - `paid_receipt`: the charge's paid receipt (no BR Code, no QR), generic 80 mm printer;
//! - `qr_screen_png`: the card machine's pay-with-Pix screen (720 × 1280) as a PNG.
//!
//! Goals (render issue): ≥ 20,000 raster-QR receipts/s/core, ≥ 200,000 native-QR
//! receipts/s/core.
//!
//! `cargo bench -p render --bench receipt` runs criterion (throughput in elements/s = renders/s)
//! and then prints `RATE <name> <renders per second>` lines from its own interleaved timing
//! (alternating short batches of each case so that they see the same machine load; median
//! of the batches), timed with the thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`) so that
//! the figure is per core even when other processes share the machine (`CLOCK` says which
//! clock was used; wall time where the CPU clock is unavailable). With `PIXGATE_BENCH_RATES_ONLY=1` only the `RATE` lines are printed
//! (what `scripts/bench-render.sh` reads), and `PIXGATE_BENCH_SECONDS` sets their total
//! measuring time (default 6 s). `PAYLOAD <brcode>` is the BR Code rendered, for the
//! python-escpos comparison to check it renders the same one.
//!
//! Job sizes: `PIXGATE_BENCH_SIZES=1` prints `SIZE <case> <paper mm> raw=<bytes>
//! json=<bytes>` for each printed job at 58 and 80 mm and exits: the ESC/POS bytes a
//! device that asks for raw payloads gets against the JSON job (base64 payload) the others
//! get.
//!
//! Profiling: `PIXGATE_BENCH_PROFILE=raster_qr_receipt:2000` runs one case that many
//! times and exits, e.g. under `valgrind --tool=callgrind` (deterministic instruction
//! counts, unlike wall time on a shared machine).

// A bench that panics is a failed run; criterion_group! defines an undocumented pub fn.
#![allow(clippy::unwrap_used, missing_docs)]

use chrono::{DateTime, Utc};
use criterion::{criterion_group, Criterion, Throughput};
use render::brcode::{encode_static, StaticPix};
use render::codepage::CodePage;
use render::receipt::{render_receipt_for, render_receipt_into, PrinterProfile, PrinterSetup, Receipt, ReceiptKind};
use render::screen::{self, render_screen, Screen};
use render::Locale;
use std::hint::black_box;
use std::time::{Duration, Instant};

/// A charge as the gateway decodes it (the fields a receipt, a slip and a screen use).
struct Charge {
    id: &'static str,
    pix_key: &'static str,
    value_cents: u64,
    merchant_name: &'static str,
    merchant_city: &'static str,
    transaction_id: &'static str,
    items: [(&'static str, &'static str); 2],
    comment: &'static str,
    payer_name: &'static str,
    paid_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    end_to_end_id: &'static str,
}

fn charge() -> Charge {
    Charge {
        id: "6748a1f0c2b3d4e5f6a7b8c9",
        pix_key: "padaria.paoeacucar@example.com",
        value_cents: 123_456,
        merchant_name: "Padaria Pão e Açúcar",
        merchant_city: "São Paulo",
        transaction_id: "PIXGATEBENCH0001",
        items: [("Pão de queijo", "3x"), ("Café coado", "2x")],
        comment: "Sem açúcar, por favor",
        payer_name: "José da Conceição",
        paid_at: DateTime::parse_from_rfc3339("2026-11-27T12:01:07Z").unwrap().with_timezone(&Utc),
        expires_at: DateTime::parse_from_rfc3339("2026-11-27T12:15:00Z").unwrap().with_timezone(&Utc),
        end_to_end_id: "E25328704202611271201yxv2kgafrfw",
    }
}

/// The static BR Code for the charge (what `gateway::jobs::pix_payload` builds when the
/// charge has no `brCode`).
fn brcode(c: &Charge) -> String {
    encode_static(&StaticPix {
        key: c.pix_key.into(),
        amount_cents: Some(c.value_cents),
        merchant_name: c.merchant_name.into(),
        merchant_city: c.merchant_city.into(),
        txid: Some(c.transaction_id.into()),
        description: None,
    })
    .expect("valid charge")
}

/// One pay-with-Pix slip from the charge, BR Code written and drawn as a QR (as
/// `gateway::jobs::render_job` for a printer's `display_qr`).
fn receipt_bytes(c: &Charge, setup: &PrinterSetup) -> Vec<u8> {
    render_receipt_for(&slip(c), setup).expect("renders")
}

/// The paid receipt of the charge.
fn paid_bytes(c: &Charge, setup: &PrinterSetup) -> Vec<u8> {
    render_receipt_for(&paid(c), setup).expect("renders")
}

/// The pay-with-Pix slip of the charge, its BR Code written.
fn slip(c: &Charge) -> Receipt {
    Receipt { kind: ReceiptKind::PayWithPix { expires_at: Some(c.expires_at) }, brcode: Some(brcode(c)), ..paid(c) }
}

/// The paid receipt of the charge: no BR Code, it prints none.
fn paid(c: &Charge) -> Receipt {
    Receipt {
        kind: ReceiptKind::Paid,
        merchant_name: c.merchant_name.into(),
        merchant_city: c.merchant_city.into(),
        amount_cents: c.value_cents,
        items: c.items.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        comment: Some(c.comment.into()),
        payer_name: Some(c.payer_name.into()),
        paid_at: Some(c.paid_at),
        time_zone: chrono_tz::America::Sao_Paulo,
        end_to_end_id: Some(c.end_to_end_id.into()),
        charge_id: c.id.into(),
        txid: Some(c.transaction_id.into()),
        brcode: None,
        locale: Locale::PtBr,
    }
}

/// The card machine's pay-with-Pix screen as a PNG.
fn screen_png(c: &Charge) -> Vec<u8> {
    let s = Screen::PayWithPix {
        merchant_name: c.merchant_name.into(),
        amount_cents: c.value_cents,
        brcode: brcode(c),
        expires_at: Some(c.expires_at),
    };
    screen::to_png(&render_screen(&s, 720, 1280, Locale::PtBr, chrono_tz::America::Sao_Paulo))
}

fn setups() -> (PrinterSetup, PrinterSetup) {
    let raster = PrinterProfile { paper_width_mm: 80, code_page: CodePage::Cp860, native_qr: false }.generic();
    let native = PrinterProfile { native_qr: true, ..raster.printer }.generic();
    (raster, native)
}

fn bench(c: &mut Criterion) {
    let ch = charge();
    let (raster, native) = setups();
    let payload = brcode(&ch);

    let mut g = c.benchmark_group("render_one_charge");
    g.throughput(Throughput::Elements(1));
    g.bench_function("raster_qr_receipt", |b| b.iter(|| receipt_bytes(black_box(&ch), &raster)));
    g.bench_function("native_qr_receipt", |b| b.iter(|| receipt_bytes(black_box(&ch), &native)));
    g.bench_function("paid_receipt", |b| b.iter(|| paid_bytes(black_box(&ch), &raster)));
    g.bench_function("qr_screen_png", |b| b.iter(|| screen_png(black_box(&ch))));
    g.finish();

    // The parts, to see where a receipt's time goes.
    let mut p = c.benchmark_group("render_parts");
    p.throughput(Throughput::Elements(1));
    p.bench_function("brcode_encode_static", |b| b.iter(|| brcode(black_box(&ch))));
    p.bench_function("qr_encode", |b| b.iter(|| render::qr::encode(black_box(&payload)).unwrap()));
    // The native-QR slip's layout alone (charge and BR Code ready), into a reused buffer.
    let r = slip(&ch);
    let mut buf = Vec::new();
    p.bench_function("native_receipt_layout_into_reused_buffer", |b| {
        b.iter(|| {
            buf.clear();
            render_receipt_into(&mut buf, black_box(&r), &native).unwrap();
        })
    });
    let s = Screen::PayWithPix {
        merchant_name: ch.merchant_name.into(),
        amount_cents: ch.value_cents,
        brcode: payload.clone(),
        expires_at: Some(ch.expires_at),
    };
    p.bench_function("screen_picture_only", |b| {
        b.iter(|| render_screen(black_box(&s), 720, 1280, Locale::PtBr, chrono_tz::America::Sao_Paulo))
    });
    let img = render_screen(&s, 720, 1280, Locale::PtBr, chrono_tz::America::Sao_Paulo);
    p.bench_function("screen_png_encode_only", |b| b.iter(|| screen::to_png(black_box(&img))));
    p.finish();
}

/// This thread's CPU time (`clock_gettime(CLOCK_THREAD_CPUTIME_ID)`), or `None` if the
/// platform has no such clock.
fn thread_cpu_time() -> Option<Duration> {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32));
        }
    }
    None
}

/// A stopwatch on the thread's CPU time, or on wall time without it.
fn now() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    thread_cpu_time().unwrap_or_else(|| START.get_or_init(Instant::now).elapsed())
}

/// Renders per second of each case, measured in alternating batches for `total` in all.
fn rates(total: Duration) -> Vec<(&'static str, f64)> {
    let ch = charge();
    let (raster, native) = setups();
    type Case<'a> = (&'static str, Box<dyn Fn() + 'a>);
    let cases: Vec<Case> = vec![
        ("raster_qr_receipt", Box::new(|| drop(black_box(receipt_bytes(black_box(&ch), &raster))))),
        ("native_qr_receipt", Box::new(|| drop(black_box(receipt_bytes(black_box(&ch), &native))))),
        ("paid_receipt", Box::new(|| drop(black_box(paid_bytes(black_box(&ch), &raster))))),
        ("qr_screen_png", Box::new(|| drop(black_box(screen_png(black_box(&ch)))))),
    ];
    // Batch sizes of about 20 ms each, from a first estimate.
    let iters: Vec<u32> = cases
        .iter()
        .map(|(_, f)| {
            let t = now();
            let mut n = 0u32;
            while now() - t < Duration::from_millis(50) {
                f();
                n += 1;
            }
            ((n as f64 * 0.4) as u32).max(1)
        })
        .collect();
    let rounds = (total.as_secs_f64() / (0.02 * cases.len() as f64)).max(5.0) as usize;
    let mut per_case: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..rounds {
        for (k, (_, f)) in cases.iter().enumerate() {
            let t = now();
            for _ in 0..iters[k] {
                f();
            }
            per_case[k].push(iters[k] as f64 / (now() - t).as_secs_f64());
        }
    }
    cases
        .iter()
        .zip(per_case.iter_mut())
        .map(|((name, _), r)| {
            r.sort_by(f64::total_cmp);
            (*name, r[r.len() / 2])
        })
        .collect()
}

fn print_rates() {
    let secs = std::env::var("PIXGATE_BENCH_SECONDS").ok().and_then(|s| s.parse::<f64>().ok()).unwrap_or(6.0);
    println!("PAYLOAD {}", brcode(&charge()));
    println!("CLOCK {}", if thread_cpu_time().is_some() { "thread-cpu" } else { "wall" });
    for (name, r) in rates(Duration::from_secs_f64(secs)) {
        println!("RATE {name} {r:.0}");
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench
}

/// `SIZE` lines: each printed job's ESC/POS bytes against its JSON job, at 58 and 80 mm.
fn print_sizes() {
    let c = charge();
    for mm in [58, 80] {
        let raster = PrinterProfile { paper_width_mm: mm, code_page: CodePage::Cp860, native_qr: false }.generic();
        let native = PrinterProfile { native_qr: true, ..raster.printer }.generic();
        let cases = [
            ("slip_raster_qr", receipt_bytes(&c, &raster)),
            ("slip_native_qr", receipt_bytes(&c, &native)),
            ("paid_receipt", paid_bytes(&c, &raster)),
        ];
        for (name, raw) in cases {
            let job = device_protocol::Job {
                v: 1,
                message_id: "5f0c6d2a9b8e4f1a3c7d2e6b9a0f4c8d".into(),
                seq: 12_345,
                kind: device_protocol::EffectKind::PrintReceipt,
                event_id: "Charge:6748a1f0c2b3d4e5f6a7b8c9:7442103620327571457".into(),
                charge_id: c.id.into(),
                content_type: device_protocol::messages::CONTENT_ESCPOS.into(),
                payload: device_protocol::Job::encode_payload(&raw),
                expires_at: Some(c.expires_at),
            };
            println!("SIZE {name} {mm} raw={} json={}", raw.len(), job.to_json().len());
        }
    }
}

fn main() {
    if std::env::var("PIXGATE_BENCH_SIZES").as_deref() == Ok("1") {
        print_sizes();
        return;
    }
    // Every case renders something a reader accepts (checked in the tests; here only that
    // they run and have the expected shape).
    let ch = charge();
    let (raster, native) = setups();
    assert!(receipt_bytes(&ch, &raster).windows(3).any(|w| w == [0x1D, 0x76, 0x30]), "raster QR");
    assert!(receipt_bytes(&ch, &native).windows(3).any(|w| w == [0x1D, 0x28, 0x6B]), "native QR");
    assert!(
        !paid_bytes(&ch, &raster).windows(3).any(|w| w == [0x1D, 0x28, 0x6B] || w == [0x1D, 0x76, 0x30]),
        "no QR on the paid receipt"
    );
    assert!(screen_png(&ch).starts_with(b"\x89PNG"));
    if let Ok(spec) = std::env::var("PIXGATE_BENCH_PROFILE") {
        let (name, n) = spec.split_once(':').expect("PIXGATE_BENCH_PROFILE=<case>:<iterations>");
        let n: u32 = n.parse().expect("iterations");
        for _ in 0..n {
            match name {
                "raster_qr_receipt" => drop(black_box(receipt_bytes(black_box(&ch), &raster))),
                "native_qr_receipt" => drop(black_box(receipt_bytes(black_box(&ch), &native))),
                "paid_receipt" => drop(black_box(paid_bytes(black_box(&ch), &raster))),
                "qr_screen_png" => drop(black_box(screen_png(black_box(&ch)))),
                other => panic!("unknown case {other}"),
            }
        }
        return;
    }
    if std::env::var("PIXGATE_BENCH_RATES_ONLY").as_deref() == Ok("1") {
        print_rates();
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
    print_rates();
}
