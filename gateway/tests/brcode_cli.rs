//! `pixgate brcode decode|encode` as a user runs it: the built binary on every payload of
//! `fixtures/brcode/vectors.json`. The exit code must match the vector's validity,
//! the printed JSON its `fields`, a rejection's stderr must name the rule's EMV tag, and a
//! payload encoded from a valid vector's fields must decode back to them (checked by
//! `render::brcode::parse`, not only by the CLI).
//!
//! The vectors' loader is `render/tests/support/brcode_vectors.rs`, shared with
//! `render/tests/brcode_vectors.rs`.

// A test: a panic in its helpers is a failed test, as in its #[test] functions.
#![allow(clippy::unwrap_used)]

use render::brcode::{fold_upper, parse};
use serde_json::Value;
use std::io::Write;
use std::process::{Command, Output, Stdio};
use vectors::{expectation, load, Rule};

#[path = "../../render/tests/support/brcode_vectors.rs"]
mod vectors;

const PIXGATE: &str = env!("CARGO_BIN_EXE_pixgate");

fn pixgate(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(PIXGATE)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("pixgate starts");
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The CLI's JSON name for a `fields` key of `vectors.json`.
fn json_name(fixture_name: &str) -> &str {
    match fixture_name {
        "city" => "merchant_city",
        n => n,
    }
}

/// The EMV tag a fixture's `expect_rule` is about, where it names one (see
/// [`vectors::rule`]); the CLI's error names it as `(…, tag T)`.
fn rule_tag(rule: &str) -> Option<&'static str> {
    match vectors::rule(rule) {
        Rule::NotPix => Some("26-00"),
        Rule::Crc => Some("63"),
        Rule::Tag(t) => Some(t),
        Rule::TooLong | Rule::Structural => None,
    }
}

#[test]
fn decode_every_vector() {
    let vectors = load();
    for (i, v) in vectors.iter().enumerate() {
        let payload = v["payload"].as_str().unwrap();
        let expect = expectation(v);
        let out = pixgate(&["brcode", "decode", payload], None);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        match (expect, out.status.code()) {
            ("accept", Some(0)) => {
                let json: Value = serde_json::from_str(&stdout)
                    .unwrap_or_else(|e| panic!("#{i}: stdout is not JSON ({e}): {stdout}"));
                for (name, want) in v["fields"].as_object().unwrap() {
                    assert_eq!(&json[json_name(name)], want, "#{i} field {name}");
                }
                assert_eq!(json["kind"], v["kind"], "#{i}");
                assert!(stderr.is_empty(), "#{i}: {stderr}");
            }
            ("reject", Some(1)) => {
                assert!(stdout.is_empty(), "#{i}: a rejected payload printed {stdout}");
                assert!(stderr.starts_with("error: "), "#{i}: {stderr}");
                let rule = v["expect_rule"].as_str().unwrap_or("field 62");
                if let Some(tag) = rule_tag(rule) {
                    assert!(stderr.contains(&format!("tag {tag})")), "#{i}: rule {rule:?} but stderr {stderr}");
                }
            }
            ("either", Some(0 | 1)) => {}
            (e, code) => panic!("#{i}: expected {e}, exit {code:?}\n  stdout {stdout}\n  stderr {stderr}"),
        }
    }
}

#[test]
fn decode_reads_stdin_with_a_trailing_newline() {
    let vectors = load();
    let payload = vectors[0]["payload"].as_str().unwrap();
    let out = pixgate(&["brcode", "decode", "-"], Some(&format!("{payload}\r\n")));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(json["crc"], vectors[0]["fields"]["crc"]);
}

/// Each valid vector's parts through `encode`, then `decode` (and `render::brcode::parse`):
/// key or URL, amount, description and (static) txid come back; name and city come back
/// folded.
#[test]
fn encode_decode_round_trip_of_every_valid_vector() {
    let vectors = load();
    let mut checked = 0;
    for (i, v) in vectors.iter().enumerate() {
        let payload = v["payload"].as_str().unwrap();
        if expectation(v) != "accept" {
            continue;
        }
        let original = parse(payload).unwrap();
        let cents = original.amount_cents().map(|c| c.to_string());
        let mut args = vec!["brcode", "encode", "--name", &original.merchant_name, "--city", &original.merchant_city];
        match (&original.key, &original.url) {
            (Some(k), _) => {
                args.extend(["--key", k.as_str(), "--txid", original.txid.as_str()]);
                if let Some(d) = &original.description {
                    args.extend(["--description", d.as_str()]);
                }
            }
            (None, Some(u)) => args.extend(["--url", u.as_str()]),
            (None, None) => unreachable!("parse guarantees a key or a URL"),
        }
        if let Some(c) = &cents {
            args.extend(["--amount-cents", c.as_str()]);
        }
        let out = pixgate(&args, None);
        assert_eq!(out.status.code(), Some(0), "#{i}: {}", text(&out.stderr));
        let encoded = text(&out.stdout).trim_end().to_string();

        let again =
            parse(&encoded).unwrap_or_else(|e| panic!("#{i}: encoder output rejected by render: {e}\n{encoded}"));
        assert_eq!(again.key, original.key, "#{i}");
        assert_eq!(again.url, original.url, "#{i}");
        assert_eq!(again.amount_cents(), original.amount_cents(), "#{i}");
        assert_eq!(again.description, original.description, "#{i}");
        // The dynamic writer always says `***`: the payer's bank takes the txid from the URL.
        let txid = if original.is_dynamic() { "***" } else { original.txid.as_str() };
        assert_eq!(again.txid, txid, "#{i}");
        assert_eq!(again.merchant_name, fold_upper(&original.merchant_name, 25), "#{i}");
        assert_eq!(again.merchant_city, fold_upper(&original.merchant_city, 15), "#{i}");

        let out = pixgate(&["brcode", "decode", &encoded], None);
        assert_eq!(out.status.code(), Some(0), "#{i}");
        let json: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
        assert_eq!(json["crc"].as_str(), Some(again.crc.as_str()), "#{i}");
        assert_eq!(json["amount_cents"].as_u64(), original.amount_cents(), "#{i}");
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} valid vectors");
}

/// Input the encoder cannot make a BR Code of: exit 1 and the tag on stderr, nothing on
/// stdout. Clap's own usage errors (both --key and --url) exit 2.
#[test]
fn encode_refuses_bad_input_with_the_tag() {
    let cases: [(&[&str], &str); 3] = [
        (&["--key", &"k".repeat(78), "--name", "Loja", "--city", "Recife"], "tag 26-01"),
        (&["--key", "pix@example.com", "--name", "🍞 &", "--city", "Recife"], "tag 59"),
        (&["--url", "https://", "--name", "Loja", "--city", "Recife"], "tag 26-25"),
    ];
    for (args, tag) in cases {
        let mut all = vec!["brcode", "encode"];
        all.extend_from_slice(args);
        let out = pixgate(&all, None);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(out.stdout.is_empty());
        assert!(text(&out.stderr).contains(tag), "{args:?}: {}", text(&out.stderr));
    }
    let out = pixgate(&["brcode", "encode", "--key", "k", "--url", "u", "--name", "L", "--city", "R"], None);
    assert_eq!(out.status.code(), Some(2));
}
