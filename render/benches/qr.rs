//! `qr_fast::encode` vs the `qrcode` crate on a 150-byte static Pix payload at level M.
//!
//! Run with `cargo bench -p render --bench qr`. Both encoders are measured in the same run
//! and the ratio is printed at the end (absolute times on a shared 2-core machine are
//! noisy; the ratio is the figure to compare).

// A bench that panics is a failed run; criterion_group! defines an undocumented pub fn.
#![allow(clippy::unwrap_used, missing_docs)]

use criterion::{criterion_group, Criterion};
use render::brcode::{encode_static, StaticPix};
use render::qr_fast::{self, Ec};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// A static Pix BR Code of exactly 150 bytes: phone key, amount, name, city, txid, and
/// a description grown until the total is 150 bytes.
fn payload() -> String {
    for txid_len in (1..=25).rev() {
        for n in 0..=72 {
            let p = encode_static(&StaticPix {
                key: "+5511924754327".into(),
                amount_cents: Some(12_345),
                merchant_name: "Padaria Pao Dourado".into(),
                merchant_city: "Sao Paulo".into(),
                txid: Some("PEDIDO20261127000123XYZAB"[..txid_len].into()),
                description: (n > 0)
                    .then(|| "Pedido na padaria, obrigado pela preferencia!!!!!!!!!!!!!!!!!!!!!!!!!!!!"[..n].into()),
            })
            .unwrap();
            if p.len() == 150 {
                return p;
            }
        }
    }
    panic!("could not build a 150-byte payload");
}

fn bench(c: &mut Criterion) {
    let p = payload();
    let data = p.as_bytes();
    let ours = qr_fast::encode(data, Ec::M).unwrap();
    let theirs = qrcode::QrCode::with_error_correction_level(data, qrcode::EcLevel::M).unwrap();
    println!(
        "payload {} bytes; qr_fast: version {} mask {} (byte mode alone: version {}); qrcode: version {:?}",
        data.len(),
        ours.version,
        ours.mask,
        qr_fast::version::smallest_version(data.len(), Ec::M).unwrap(),
        theirs.version()
    );

    let mut g = c.benchmark_group("qr_150B_pix_M");
    g.bench_function("qr_fast", |b| b.iter(|| qr_fast::encode(black_box(data), Ec::M).unwrap()));
    g.bench_function("qrcode_crate", |b| {
        b.iter(|| qrcode::QrCode::with_error_correction_level(black_box(data), qrcode::EcLevel::M).unwrap())
    });
    g.finish();

    // Where the time goes inside qr_fast (version ≤ 11: one 64-bit word per row).
    let version = ours.version;
    assert!(version <= 11, "stage benches assume one word per row");
    let segments = qr_fast::segment::optimal(data, version);
    let data_cw = qr_fast::bits::data_codewords(data, &segments, version, Ec::M);
    let codewords = qr_fast::rs::interleave(&data_cw, version, Ec::M);
    let template = qr_fast::matrix::Template::<1>::new(version);
    let placed = template.place(&codewords);
    let mut s = c.benchmark_group("qr_fast_stages");
    s.bench_function("0_segmentation", |b| b.iter(|| qr_fast::segment::optimal(black_box(data), version)));
    s.bench_function("1_data_codewords", |b| {
        b.iter(|| qr_fast::bits::data_codewords(black_box(data), &segments, version, Ec::M))
    });
    s.bench_function("2_reed_solomon_interleave", |b| {
        b.iter(|| qr_fast::rs::interleave(black_box(&data_cw), version, Ec::M))
    });
    s.bench_function("3_template_build_cold_once_per_version", |b| {
        b.iter(|| qr_fast::matrix::Template::<1>::new(black_box(version)))
    });
    s.bench_function("4_placement", |b| b.iter(|| black_box(&template).place(black_box(&codewords))));
    s.bench_function("5_mask_selection_8x", |b| b.iter(|| qr_fast::mask::choose(black_box(&placed), &template, Ec::M)));
    s.bench_function("5a_one_penalty", |b| b.iter(|| qr_fast::mask::penalty(black_box(&placed))));
    let (_, grid) = qr_fast::mask::choose(&placed, &template, Ec::M);
    s.bench_function("6_to_bools", |b| b.iter(|| black_box(&grid).to_bools()));
    s.finish();

    // Interleaved A/B timing for the summary line: alternating short batches so that both
    // encoders see the same machine load; median of the per-batch per-symbol times.
    let per_symbol = |f: &dyn Fn(), iters: u32| {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        t.elapsed() / iters
    };
    let fast = || {
        black_box(qr_fast::encode(black_box(data), Ec::M).unwrap());
    };
    let slow = || {
        black_box(qrcode::QrCode::with_error_correction_level(black_box(data), qrcode::EcLevel::M).unwrap());
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..41 {
        a.push(per_symbol(&fast, 400));
        b.push(per_symbol(&slow, 20));
    }
    a.sort();
    b.sort();
    let (ma, mb): (Duration, Duration) = (a[a.len() / 2], b[b.len() / 2]);
    println!(
        "SUMMARY 150-byte Pix payload, EC M, one core: qr_fast {:.2} µs/symbol, qrcode crate {:.1} µs/symbol, ratio {:.1}x",
        ma.as_secs_f64() * 1e6,
        mb.as_secs_f64() * 1e6,
        mb.as_secs_f64() / ma.as_secs_f64()
    );
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(3));
    targets = bench
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
