//! Decoding a `charge.upserted` record: the consumer's path
//! (`charge_record::decode_charge_record`, typed, borrowed) against the reference decoders
//! (`cdc::decode_envelope` into a `serde_json::Value`, then `cdc::decode_charge`), on the
//! records of `fixtures/cdc/charges.jsonl`, in the same process.
//!
//! Prints µs per record for each and their ratio. Run:
//! `cargo bench -p cdc --bench charge_decode [-- RECORDS]`.

use std::time::Instant;

fn main() {
    let n: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(300_000);
    let path = format!("{}/../fixtures/cdc/charges.jsonl", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let records: Vec<Vec<u8>> = text
        .lines()
        .map(|l| {
            serde_json::to_vec(&serde_json::from_str::<serde_json::Value>(l).expect("fixture line")["value"])
                .expect("value")
        })
        .collect();
    let time = |decode: &dyn Fn(&[u8]) -> bool| {
        let t = Instant::now();
        let ok = (0..n).filter(|i| decode(&records[i % records.len()])).count();
        assert_eq!(ok, n, "every fixture charge decodes");
        t.elapsed().as_secs_f64() * 1e6 / n as f64
    };
    let reference = |b: &[u8]| cdc::charge_record::decode_with_values(b).is_ok_and(|r| matches!(r.charge, Some(Ok(_))));
    let fast = |b: &[u8]| cdc::charge_record::decode_charge_record(b).is_ok_and(|r| matches!(r.charge, Some(Ok(_))));
    // Alternate, twice each, so a change in the machine's speed shows as a spread.
    let (r1, f1, r2, f2) = (time(&reference), time(&fast), time(&reference), time(&fast));
    let avg = records.iter().map(Vec::len).sum::<usize>() / records.len();
    println!("charge record decode ({n} records of {avg} bytes on average): reference {r1:.2} / {r2:.2} µs, consumer path {f1:.2} / {f2:.2} µs = {:.2} × the reference", (f1 + f2) / (r1 + r2));
}
