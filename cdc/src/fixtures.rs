//! The bundled CDC fixtures (`fixtures/cdc/`) as Kafka records, for unit tests (here, and in
//! crates that turn on the feature `fixtures` for their tests).

use serde_json::Value;

/// Path of a fixtures file, e.g. `charges.jsonl`.
pub fn path(name: &str) -> String {
    format!("{}/../fixtures/cdc/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// The records of a `.jsonl` fixtures file as `(topic, value bytes)`: a JSON object value is
/// serialised, a string value (the malformed-input cases) is its raw bytes, as the capture
/// simulator publishes them.
///
/// # Panics
/// The file is missing or a line is not a fixture record (a broken fixture fails the test).
pub fn records(name: &str) -> Vec<(String, Vec<u8>)> {
    std::fs::read_to_string(path(name))
        .expect("the fixtures file is in the repository")
        .lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).expect("a fixture line is JSON");
            let bytes = match &r["value"] {
                Value::String(s) => s.clone().into_bytes(),
                v => serde_json::to_vec(v).expect("a JSON value serialises"),
            };
            (r["topic"].as_str().expect("a fixture record names its topic").to_string(), bytes)
        })
        .collect()
}
