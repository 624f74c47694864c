//! The team's BR Code vectors (`fixtures/brcode/vectors.json`), loaded once for the two
//! tests that run every vector: `render/tests/brcode_vectors.rs` (the parser) and
//! `gateway/tests/brcode_cli.rs` (the `pixgate brcode` CLI), which includes this file with
//! `#[path]`. A missing or unreadable file fails them.

// Each including test uses part of this module.
#![allow(dead_code)]

use serde_json::Value;

/// Where the vectors are. Both including crates sit one level below the repository root,
/// so the path is the same from either manifest directory.
pub const VECTORS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/brcode/vectors.json");

/// What must happen to vector `v`: its `expect` (`accept`, `reject`, `either`).
///
/// # Panics
/// `v` has no string `expect` (a broken fixture fails the test).
pub fn expectation(v: &Value) -> &str {
    v["expect"].as_str().expect("vector has an expect")
}

/// The vectors.
///
/// # Panics
/// The file cannot be read, or it is not JSON.
pub fn load() -> Vec<Value> {
    let text = std::fs::read_to_string(VECTORS).unwrap_or_else(|e| panic!("BR Code vectors at {VECTORS}: {e}"));
    serde_json::from_str(&text).expect("vectors.json is valid JSON")
}

/// The rule a rejected vector's `expect_rule` (free text) names, read by keyword.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// "not a Pix payload": the GUI of field 26 is not `br.gov.bcb.pix`.
    NotPix,
    /// "payload over 512 bytes".
    TooLong,
    /// "wrong CRC": field 63 does not match the CRC16 of the rest.
    Crc,
    /// A rule about one EMV field: `59` (merchant name), `62` (additional data), `62-05`
    /// (txid), `54` (amount).
    Tag(&'static str),
    /// Structural damage (misaligned, truncated, wrong length prefix): a TLV error, a CRC
    /// mismatch or a missing field are all correct answers.
    Structural,
}

/// Reads `expect_rule` (case-insensitive keywords, checked in this order: "not a pix",
/// "512", "wrong crc", "merchant name over", "field 62", "txid", "amount").
pub fn rule(expect_rule: &str) -> Rule {
    let r = expect_rule.to_lowercase();
    if r.contains("not a pix") {
        Rule::NotPix
    } else if r.contains("512") {
        Rule::TooLong
    } else if r.contains("wrong crc") {
        Rule::Crc
    } else if r.contains("merchant name over") {
        Rule::Tag("59")
    } else if r.contains("field 62") {
        Rule::Tag("62")
    } else if r.contains("txid") {
        Rule::Tag("62-05")
    } else if r.contains("amount") {
        Rule::Tag("54")
    } else {
        Rule::Structural
    }
}
