//! Stand-in for the upstream capture job: creates the Kafka topics and publishes change
//! events from JSONL files (`fixtures/cdc/*.jsonl`), one record per line.
//!
//! Each line is `{"topic", "key", "value"}`. The record value is the `value` JSON object
//! serialised compactly; when `value` is a JSON *string* (the malformed-input cases of
//! `edge-cases.jsonl`), the record value is that string's raw UTF-8 bytes. The key is the
//! `key` string as given (no key when absent or `null`).
//!
//! The producer is idempotent (`enable.idempotence=true`, `acks=all`), so retries neither
//! duplicate nor reorder records within a partition. Records are enqueued in file order and
//! every delivery is awaited, also in file order, before [`publish_file`] returns.

use anyhow::{bail, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use serde_json::Value;
use std::collections::VecDeque;
use std::path::Path;
use std::time::Duration;

/// The topics pixgate reads and writes, with their partition counts.
pub const PIXGATE_TOPICS: [(&str, i32); 3] = [
    ("device.upserted", 3),
    ("charge.upserted", 3),
    ("pixgate.deadletter", 1),
];

/// At most this many records are in flight before the oldest delivery is awaited.
const WINDOW: usize = 1000;

/// One record to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureRecord {
    /// Kafka topic.
    pub topic: String,
    /// Record key (UTF-8), if any.
    pub key: Option<String>,
    /// Record value bytes.
    pub value: Vec<u8>,
}

/// Parses one JSONL line into a record (see the module docs for the value rule).
///
/// # Errors
/// Not a JSON object, no `topic`, or no `value`.
pub fn parse_line(line: &str) -> Result<CaptureRecord> {
    let v: Value = serde_json::from_str(line).context("line is not JSON")?;
    let topic = v
        .get("topic")
        .and_then(Value::as_str)
        .context("no \"topic\"")?
        .to_string();
    let key = match v.get("key") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    };
    let value = match v.get("value") {
        None => bail!("no \"value\""),
        Some(Value::String(s)) => s.as_bytes().to_vec(),
        Some(other) => serde_json::to_vec(other)?,
    };
    Ok(CaptureRecord { topic, key, value })
}

/// Reads every non-blank line of a JSONL file as a record.
///
/// # Errors
/// The file cannot be read or a line is not a valid event line (the error names the line).
pub fn read_records(path: &Path) -> Result<Vec<CaptureRecord>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| parse_line(l).with_context(|| format!("{}:{}", path.display(), n + 1)))
        .collect()
}

/// Creates `topics` (name, partitions) with replication factor 1; a topic that already
/// exists is fine (tansu has no auto-creation, so run this before producing or consuming).
///
/// # Errors
/// The admin client cannot be created or the broker refuses a topic for another reason.
pub async fn ensure_topics(brokers: &str, topics: &[(&str, i32)]) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("creating Kafka admin client")?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|(name, parts)| NewTopic::new(name, *parts, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(15)))
        .request_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics(&new, &opts)
        .await
        .context("CreateTopics")?;
    for r in results {
        match r {
            Ok(name) => tracing::info!(topic = %name, "topic created"),
            Err((name, RDKafkaErrorCode::TopicAlreadyExists)) => {
                tracing::info!(topic = %name, "topic already exists")
            }
            Err((name, code)) => bail!("creating topic {name}: {code}"),
        }
    }
    Ok(())
}

/// An idempotent producer for `brokers`.
///
/// # Errors
/// librdkafka refuses the configuration.
pub fn producer(brokers: &str) -> Result<FutureProducer> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", "30000")
        .set("linger.ms", "5")
        .create()
        .context("creating Kafka producer")
}

async fn await_delivery(f: DeliveryFuture, n: usize) -> Result<()> {
    match f.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => bail!("record {n}: delivery failed: {e}"),
        Err(_) => bail!("record {n}: delivery cancelled (producer gone)"),
    }
}

/// Publishes `records` in order and awaits every delivery. Returns how many were delivered.
///
/// # Errors
/// A record could not be delivered (the first such error).
pub async fn publish_records(
    producer: &FutureProducer,
    records: &[CaptureRecord],
) -> Result<usize> {
    let mut pending: VecDeque<(usize, DeliveryFuture)> = VecDeque::new();
    for (n, r) in records.iter().enumerate() {
        loop {
            let mut rec = FutureRecord::to(&r.topic).payload(&r.value[..]);
            if let Some(k) = &r.key {
                rec = rec.key(k.as_bytes());
            }
            match producer.send_result(rec) {
                Ok(f) => {
                    pending.push_back((n, f));
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    match pending.pop_front() {
                        Some((m, f)) => await_delivery(f, m).await?,
                        None => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
                Err((e, _)) => bail!("record {n}: cannot enqueue: {e}"),
            }
        }
        if pending.len() >= WINDOW {
            let (m, f) = pending.pop_front().expect("non-empty");
            await_delivery(f, m).await?;
        }
    }
    while let Some((m, f)) = pending.pop_front() {
        await_delivery(f, m).await?;
    }
    Ok(records.len())
}

/// Publishes every line of a JSONL event file (see the module docs), in file order, and
/// awaits every delivery. Returns the number of records published.
///
/// # Errors
/// The file is unreadable or malformed (nothing is sent then), or a delivery failed.
pub async fn publish_file(brokers: &str, path: &Path) -> Result<usize> {
    let records = read_records(path)?;
    let producer = producer(brokers)?;
    let n = publish_records(&producer, &records).await?;
    tracing::info!(file = %path.display(), records = n, "published");
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_values_are_compact_json_and_strings_are_raw() {
        let r = parse_line(
            r#"{"topic": "charge.upserted", "key": "abc", "value": {"a": 1, "b": [1, 2]}}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            CaptureRecord {
                topic: "charge.upserted".into(),
                key: Some("abc".into()),
                value: br#"{"a":1,"b":[1,2]}"#.to_vec()
            }
        );
        let r =
            parse_line(r#"{"topic": "charge.upserted", "key": "abc", "value": "{\"oops\": tr"}"#)
                .unwrap();
        assert_eq!(r.value, br#"{"oops": tr"#.to_vec());
        let r = parse_line(r#"{"topic": "t", "key": null, "value": "é"}"#).unwrap();
        assert_eq!(r.key, None);
        assert_eq!(r.value, "é".as_bytes());
        assert!(parse_line(r#"{"key": "k", "value": {}}"#).is_err());
        assert!(parse_line("nope").is_err());
    }

    #[test]
    fn fixture_files_parse() {
        for f in ["devices.jsonl", "charges.jsonl", "edge-cases.jsonl"] {
            let p = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../fixtures/cdc")
                .join(f);
            let recs = read_records(&p).unwrap();
            assert!(!recs.is_empty(), "{f}");
        }
    }
}

/// Load generation: synthetic Pix charge lifecycles on `charge.upserted`.
pub mod generate {
    use super::{producer, publish_records, CaptureRecord};
    use anyhow::{Context, Result};
    use chrono::{DateTime, SecondsFormat, Utc};
    use serde_json::{json, Value};
    use std::path::Path;
    use std::time::Duration;

    /// A card machine charges can be created on, with its company.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct TerminalRef {
        /// Terminal device id.
        pub terminal: String,
        /// Its company id.
        pub company: String,
        /// Its company's merchant name (used on the charge).
        pub merchant: String,
    }

    /// The enabled terminals of a `device.upserted` JSONL file (last event per id wins).
    ///
    /// # Errors
    /// The file cannot be read.
    pub fn terminals_from_jsonl(path: &Path) -> Result<Vec<TerminalRef>> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut out: Vec<TerminalRef> = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let doc = &v["value"]["fullDocument"];
            let id = doc["_id"]["$oid"].as_str();
            let company = doc["company"]["$oid"].as_str();
            if let (Some(id), Some(company)) = (id, company) {
                out.retain(|t| t.terminal != id);
                if doc["kind"] == "terminal" && doc["enabled"] != false {
                    out.push(TerminalRef {
                        terminal: id.into(),
                        company: company.into(),
                        merchant: format!("Loja {}", &company[..6.min(company.len())]),
                    });
                }
            }
        }
        Ok(out)
    }

    /// SplitMix64: deterministic per seed, good enough for load shapes.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
        fn hex24(&mut self) -> String {
            format!("{:016x}{:08x}", self.next(), self.next() as u32)
        }
    }

    fn date(t: DateTime<Utc>) -> Value {
        json!({"$date": t.to_rfc3339_opts(SecondsFormat::Millis, true)})
    }

    /// One lifecycle event of a synthetic charge.
    fn event(doc: &Value, op: &str, at: DateTime<Utc>, counter: u32) -> CaptureRecord {
        let id = doc["_id"]["$oid"].as_str().unwrap_or_default().to_string();
        let t = at.timestamp().max(0) as u64;
        let value = json!({
            "eventId": format!("Charge:{id}:{}", (t << 32) | counter as u64),
            "operationType": op,
            "ns": {"db": "payments", "coll": "Charge"},
            "documentKey": {"_id": {"$oid": id}},
            "clusterTime": {"$timestamp": {"t": t, "i": counter}},
            "wallTime": date(at),
            "fullDocument": doc,
        });
        CaptureRecord {
            topic: "charge.upserted".into(),
            key: Some(id),
            value: serde_json::to_vec(&value).expect("json"),
        }
    }

    /// The events of `count` charge lifecycles starting at `start`, `1/rate_per_s` s apart:
    /// insert `ACTIVE`, then 0.5–5 s later an update to `COMPLETED` (4 in 5, with payer and
    /// end-to-end id) or `EXPIRED`. Sorted by time; each with the offset (from `start`) at
    /// which to publish it. Charges expire 15 minutes after creation, real time.
    pub fn lifecycle_records(
        count: usize,
        rate_per_s: f64,
        seed: u64,
        terminals: &[TerminalRef],
        start: DateTime<Utc>,
    ) -> Vec<(Duration, CaptureRecord)> {
        let mut rng = Rng(seed);
        let mut out: Vec<(Duration, CaptureRecord)> = Vec::with_capacity(count * 2);
        let rate = if rate_per_s > 0.0 { rate_per_s } else { 1.0 };
        let mut counter: u32 = 0;
        for n in 0..count {
            let created_off = Duration::from_secs_f64(n as f64 / rate);
            let done_off = created_off + Duration::from_millis(500 + rng.below(4500));
            let created = start + chrono::Duration::from_std(created_off).unwrap_or_default();
            let done = start + chrono::Duration::from_std(done_off).unwrap_or_default();
            let id = rng.hex24();
            let cents = 100 + rng.below(49_900);
            let txid = format!("{:016x}{:016x}", rng.next(), rng.next());
            let (company, terminal, merchant) = match terminals {
                [] => (rng.hex24(), None, "Loja Exemplo".to_string()),
                ts => {
                    let t = &ts[rng.below(ts.len() as u64) as usize];
                    (
                        t.company.clone(),
                        Some(t.terminal.clone()),
                        t.merchant.clone(),
                    )
                }
            };
            let mut doc = json!({
                "_id": {"$oid": id},
                "company": {"$oid": company},
                "value": cents,
                "status": "ACTIVE",
                "type": "STATIC",
                "identifier": txid,
                "transactionID": txid,
                "pixKey": format!("pix.{}@example.com", &company[..6.min(company.len())]),
                "merchant": {"name": merchant, "city": "São Paulo"},
                "additionalInfo": [{"key": "Pão de queijo", "value": format!("{}x", 1 + rng.below(5))}],
                "expiresDate": date(created + chrono::Duration::minutes(15)),
                "createdAt": date(created),
                "updatedAt": date(created),
                "__v": 0,
            });
            if let Some(t) = terminal {
                doc["terminal"] = json!({"$oid": t});
            }
            counter = counter.wrapping_add(1);
            out.push((created_off, event(&doc, "insert", created, counter)));
            doc["__v"] = json!(1);
            doc["updatedAt"] = date(done);
            if rng.below(5) < 4 {
                doc["status"] = json!("COMPLETED");
                doc["paidAt"] = date(done);
                doc["payer"] = json!({"name": "José da Silva"});
                doc["endToEndId"] = json!(format!(
                    "E{:031}",
                    rng.next() as u128 * 1_000_000_007 % 10u128.pow(31)
                ));
            } else {
                doc["status"] = json!("EXPIRED");
            }
            counter = counter.wrapping_add(1);
            out.push((done_off, event(&doc, "update", done, counter)));
        }
        out.sort_by_key(|(off, _)| *off);
        out
    }

    /// Publishes `count` synthetic charge lifecycles at about `rate_per_s` new charges per
    /// second (updates follow 0.5–5 s later), deterministic for a `seed`. Charges are created
    /// on `terminals` (none: on unknown companies, so nothing is shown). Returns the number
    /// of records published.
    ///
    /// # Errors
    /// Producer creation or a delivery failed.
    pub async fn generate(
        brokers: &str,
        rate_per_s: f64,
        count: usize,
        seed: u64,
        terminals: &[TerminalRef],
    ) -> Result<usize> {
        let records = lifecycle_records(count, rate_per_s, seed, terminals, Utc::now());
        let producer = producer(brokers)?;
        let start = tokio::time::Instant::now();
        let mut sent = 0;
        let mut i = 0;
        while i < records.len() {
            // Batch everything that is due now, then wait for the next.
            let now = start.elapsed();
            let due: Vec<CaptureRecord> = records[i..]
                .iter()
                .take_while(|(off, _)| *off <= now)
                .map(|(_, r)| r.clone())
                .collect();
            if due.is_empty() {
                tokio::time::sleep_until(start + records[i].0).await;
                continue;
            }
            i += due.len();
            sent += publish_records(&producer, &due).await?;
        }
        Ok(sent)
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn lifecycles_are_deterministic_and_ordered_per_charge() {
            let ts = vec![TerminalRef {
                terminal: "t1".into(),
                company: "c1c1c1c1".into(),
                merchant: "Loja".into(),
            }];
            let start = Utc::now();
            let a = lifecycle_records(20, 10.0, 7, &ts, start);
            let b = lifecycle_records(20, 10.0, 7, &ts, start);
            assert_eq!(a.len(), 40);
            assert_eq!(
                a.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>(),
                b.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>()
            );
            let mut seen = std::collections::HashMap::new();
            for (_, r) in &a {
                let v: Value = serde_json::from_slice(&r.value).unwrap();
                let ver = v["fullDocument"]["__v"].as_u64().unwrap();
                let prev = seen.insert(r.key.clone().unwrap(), ver);
                assert_eq!(
                    prev.map(|p| p + 1).unwrap_or(0),
                    ver,
                    "insert before update"
                );
                assert_eq!(v["fullDocument"]["terminal"]["$oid"], "t1");
            }
        }
    }
}
