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
pub fn records(name: &str) -> Vec<(String, Vec<u8>)> {
    std::fs::read_to_string(path(name))
        .unwrap()
        .lines()
        .map(|l| {
            let r: Value = serde_json::from_str(l).unwrap();
            let bytes = match &r["value"] {
                Value::String(s) => s.clone().into_bytes(),
                v => serde_json::to_vec(v).unwrap(),
            };
            (r["topic"].as_str().unwrap().to_string(), bytes)
        })
        .collect()
}
