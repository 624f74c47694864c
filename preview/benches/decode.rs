//! What one ESC/POS decode costs, on the fuzz seeds (`fuzz/corpus/escpos_decode`, every
//! public stream and rendered receipt pixgate tests with) and on deterministic mutations of
//! them (the kind of input the fuzz target sees), with the printer's paper (20,000 dots) and
//! with the dashboard's preview cap ([`PREVIEW_MAX_HEIGHT`]).
//!
//! Run with `cargo bench -p preview --bench decode`; it prints inputs per second, the mean
//! and the slowest input per set, and the ratio of the capped to the uncapped run (same
//! process, same inputs). Results go in `docs/benchmarks.md`.

use preview::escpos::{decode, DecodeOptions, PREVIEW_MAX_HEIGHT};
use std::path::Path;
use std::time::{Duration, Instant};

/// xorshift64*: the same mutations on every run and machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// libFuzzer-like mutations: flip, overwrite, insert a byte, or duplicate or drop a run.
fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(8) {
        if v.is_empty() {
            v.push(rng.next() as u8);
            continue;
        }
        let i = rng.below(v.len());
        match rng.below(5) {
            0 => v[i] ^= 1 << rng.below(8),
            1 => v[i] = rng.next() as u8,
            2 => v.insert(i, rng.next() as u8),
            3 => {
                let len = 1 + rng.below(64.min(v.len() - i));
                let run: Vec<u8> = v[i..i + len].to_vec();
                for _ in 0..1 + rng.below(16) {
                    v.splice(i..i, run.iter().copied());
                }
            }
            _ => {
                let len = 1 + rng.below(64.min(v.len() - i));
                v.drain(i..i + len);
            }
        }
    }
    v
}

struct Figures {
    inputs: usize,
    total: Duration,
    slowest: Duration,
}

fn run(inputs: &[Vec<u8>], opts: &DecodeOptions) -> Figures {
    let mut slowest = Duration::ZERO;
    let start = Instant::now();
    for input in inputs {
        let t = Instant::now();
        let d = decode(input, opts);
        std::hint::black_box(&d);
        slowest = slowest.max(t.elapsed());
    }
    Figures { inputs: inputs.len(), total: start.elapsed(), slowest }
}

fn print(name: &str, f: &Figures) {
    let per = f.total.as_secs_f64() / f.inputs as f64;
    println!(
        "{name:<34} {:>6} inputs {:>9.0} inputs/s {:>9.1} µs/input  slowest {:>8.1} ms",
        f.inputs,
        1.0 / per,
        per * 1e6,
        f.slowest.as_secs_f64() * 1e3
    );
}

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/escpos_decode");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("seed-"))
        .map(|e| std::fs::read(e.path()).expect("seed"))
        // Byte 0 is the fuzz target's selector, not part of the stream.
        .filter_map(|b| b.split_first().map(|(_, s)| s.to_vec()))
        .collect();
    seeds.sort();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mutants: Vec<Vec<u8>> = (0..2000).map(|i| mutate(&seeds[i % seeds.len()], &mut rng)).collect();
    // Worst case for the paper: the widest, tallest characters (`GS ! 0x77`) and feeds.
    let mut tall = b"\x1d\x21\x77".to_vec();
    for _ in 0..2000 {
        tall.extend_from_slice(b"WWWWWW\n");
    }
    let tall = vec![tall; 20];

    let full = DecodeOptions::mm80();
    let capped = DecodeOptions::preview(576);
    println!("ESC/POS decode, release build; paper 576 dots; cap {PREVIEW_MAX_HEIGHT} dots");
    // One warm-up pass fills the process-wide glyph cache for both runs alike.
    run(&seeds, &full);
    let reps: Vec<Vec<u8>> = (0..20).flat_map(|_| seeds.iter().cloned()).collect();
    for (name, inputs) in [("seeds x20", &reps), ("mutated seeds", &mutants), ("GS ! 0x77 text, 2000 lines", &tall)] {
        let a = run(inputs, &full);
        let b = run(inputs, &capped);
        print(&format!("{name}, 20,000 dots"), &a);
        print(&format!("{name}, preview cap"), &b);
        println!("{:<34} capped/uncapped time {:.2}", "", b.total.as_secs_f64() / a.total.as_secs_f64());
    }
}
