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
pub const PIXGATE_TOPICS: [(&str, i32); 3] =
    [("device.upserted", 3), ("charge.upserted", 3), ("pixgate.deadletter", 1)];

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
    let topic = v.get("topic").and_then(Value::as_str).context("no \"topic\"")?.to_string();
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
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
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
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers).create().context("creating Kafka admin client")?;
    let new: Vec<NewTopic> =
        topics.iter().map(|(name, parts)| NewTopic::new(name, *parts, TopicReplication::Fixed(1))).collect();
    let opts = AdminOptions::new()
        .operation_timeout(Some(Duration::from_secs(15)))
        .request_timeout(Some(Duration::from_secs(30)));
    let results = admin.create_topics(&new, &opts).await.context("CreateTopics")?;
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

/// Where a record landed: `(partition, offset)`.
pub type Position = (i32, i64);

async fn await_delivery(f: DeliveryFuture, n: usize) -> Result<Position> {
    match f.await {
        Ok(Ok(delivery)) => Ok((delivery.partition, delivery.offset)),
        Ok(Err((e, _))) => bail!("record {n}: delivery failed: {e}"),
        Err(_) => bail!("record {n}: delivery cancelled (producer gone)"),
    }
}

/// Publishes `records` in order and awaits every delivery. Returns how many were delivered.
///
/// # Errors
/// A record could not be delivered (the first such error).
pub async fn publish_records(producer: &FutureProducer, records: &[CaptureRecord]) -> Result<usize> {
    Ok(publish_records_at(producer, records, None).await?.len())
}

/// Publishes `records` in order, to `partition` if given (else the producer's partitioner
/// picks by key), awaits every delivery and returns where each record landed, in input
/// order. At most 1000 deliveries are outstanding at a time.
///
/// # Errors
/// A record could not be delivered (the first such error).
pub async fn publish_records_at(
    producer: &FutureProducer,
    records: &[CaptureRecord],
    partition: Option<i32>,
) -> Result<Vec<Position>> {
    let mut positions = Vec::with_capacity(records.len());
    let mut pending: VecDeque<(usize, DeliveryFuture)> = VecDeque::new();
    for (n, r) in records.iter().enumerate() {
        loop {
            let mut rec = FutureRecord::to(&r.topic).payload(&r.value[..]);
            if let Some(k) = &r.key {
                rec = rec.key(k.as_bytes());
            }
            if let Some(p) = partition {
                rec = rec.partition(p);
            }
            match producer.send_result(rec) {
                Ok(f) => {
                    pending.push_back((n, f));
                    break;
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => match pending.pop_front() {
                    Some((m, f)) => positions.push(await_delivery(f, m).await?),
                    None => tokio::time::sleep(Duration::from_millis(50)).await,
                },
                Err((e, _)) => bail!("record {n}: cannot enqueue: {e}"),
            }
        }
        if pending.len() >= WINDOW {
            let (m, f) = pending.pop_front().expect("non-empty");
            positions.push(await_delivery(f, m).await?);
        }
    }
    while let Some((m, f)) = pending.pop_front() {
        positions.push(await_delivery(f, m).await?);
    }
    Ok(positions)
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
        let r = parse_line(r#"{"topic": "charge.upserted", "key": "abc", "value": {"a": 1, "b": [1, 2]}}"#).unwrap();
        assert_eq!(
            r,
            CaptureRecord {
                topic: "charge.upserted".into(),
                key: Some("abc".into()),
                value: br#"{"a":1,"b":[1,2]}"#.to_vec()
            }
        );
        let r = parse_line(r#"{"topic": "charge.upserted", "key": "abc", "value": "{\"oops\": tr"}"#).unwrap();
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
            let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/cdc").join(f);
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
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
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
                    (t.company.clone(), Some(t.terminal.clone()), t.merchant.clone())
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
                doc["endToEndId"] = json!(format!("E{:031}", rng.next() as u128 * 1_000_000_007 % 10u128.pow(31)));
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
            let due: Vec<CaptureRecord> =
                records[i..].iter().take_while(|(off, _)| *off <= now).map(|(_, r)| r.clone()).collect();
            if due.is_empty() {
                tokio::time::sleep_until(start + records[i].0).await;
                continue;
            }
            i += due.len();
            sent += publish_records(&producer, &due).await?;
        }
        Ok(sent)
    }

    /// The shape of a synthetic world for scale tests and load runs (see [`Scenario`]).
    #[derive(Debug, Clone)]
    pub struct ScenarioConfig {
        /// Same seed and start, same registry and events, byte for byte.
        pub seed: u64,
        /// Devices in the registry: companies of 1–7 devices, about 2 in 5 printers.
        pub devices: usize,
        /// `charge.upserted` events in total (the last lifecycles may be cut short).
        pub charge_events: usize,
        /// Creation time of the first charge; charges are created 100 ms apart (document
        /// dates and `clusterTime` only: publishing pace is the caller's).
        pub start: DateTime<Utc>,
        /// `expiresDate` − `createdAt` of every charge.
        pub expires_in: chrono::Duration,
    }

    impl ScenarioConfig {
        /// `devices` devices and `charge_events` events from `seed`, starting now, charges
        /// payable for 6 hours (long enough for any run, so no job is refused as expired).
        pub fn new(seed: u64, devices: usize, charge_events: usize) -> Self {
            ScenarioConfig { seed, devices, charge_events, start: Utc::now(), expires_in: chrono::Duration::hours(6) }
        }
    }

    /// A company of the synthetic registry.
    #[derive(Debug, Clone)]
    struct Company {
        id: String,
        merchant: &'static str,
        city: &'static str,
        pix_key: String,
    }

    /// A card machine charges can be created on.
    #[derive(Debug, Clone)]
    struct Till {
        terminal: String,
        company: usize,
    }

    /// A synthetic world: a device registry and a stream of interleaved Pix charge
    /// lifecycles on it. What pixgate must do with it comes from
    /// [`crate::expected::Model`], not from here.
    ///
    /// Registry: companies of 1–7 devices with a `defaultForCompany` printer; printers of
    /// the models, paper widths (58/80 mm), code pages and `nativeQr` settings of the
    /// fixtures; card machines mostly paired with one of their company's printers, some
    /// unpaired or paired with another company's printer (receipt on the default printer
    /// instead), about 1 in 40 disabled.
    ///
    /// Lifecycles (per 100): 46 paid on a card machine (`ACTIVE` → `COMPLETED`), 14 expired,
    /// 8 paid after an edit that keeps the status (`no_status_change`), 6 paid and the
    /// `COMPLETED` event delivered twice (same `eventId`), 6 paid and then an old version
    /// captured late (`stale_version`: the QR must not reappear), 4 expired and deleted, 12
    /// without a card machine (10 paid: receipt on the default printer; 2 expired: nothing)
    /// and 4 paid on a card machine with a dynamic BR Code. About 30 % of all charges are
    /// dynamic (`brCode`, URL in 26-25), the rest static (`pixKey`); `value` is sometimes
    /// `{"$numberLong"}`; a few amounts are extreme (1 centavo, R$ 99,999.99).
    #[derive(Debug, Clone)]
    pub struct Scenario {
        cfg: ScenarioConfig,
        devices: Vec<CaptureRecord>,
        companies: Vec<Company>,
        tills: Vec<Till>,
    }

    const MERCHANTS: [&str; 8] = [
        "Padaria Pão Quente",
        "Mercadinho São João",
        "Açaí da Praça",
        "Café Três Corações",
        "Farmácia Popular Ávila",
        "Lanchonete do Zé",
        "Sorveteria Glória",
        "Papelaria Êxito",
    ];
    const CITIES: [&str; 6] = ["São Paulo", "Belo Horizonte", "Curitiba", "Goiânia", "Maceió", "Porto Alegre"];
    /// (model, paper mm, code page, nativeQr): the combinations of the fixtures.
    const PRINTERS: [(&str, u8, &str, bool); 8] = [
        ("Bematech MP-4200 TH", 80, "CP860", true),
        ("Bematech MP-4200 TH", 58, "CP860", false),
        ("Bematech MP-4200 TH", 80, "CP860", false),
        ("Bematech MP-4200 TH", 58, "CP850", false),
        ("Elgin i9", 80, "CP860", true),
        ("Elgin i9", 80, "CP850", true),
        ("Epson TM-T20X", 58, "CP850", true),
        ("Epson TM-T20X", 80, "CP850", false),
    ];
    const TERMINALS: [&str; 3] = ["PAX A920", "Gertec GPOS700", "Sunmi P2"];

    fn envelope(coll: &str, id: &str, op: &str, at: DateTime<Utc>, counter: u32, doc: Option<&Value>) -> Value {
        let t = at.timestamp().max(0) as u64;
        json!({
            "eventId": format!("{coll}:{id}:{}", (t << 32) | counter as u64),
            "operationType": op,
            "ns": {"db": "payments", "coll": coll},
            "documentKey": {"_id": {"$oid": id}},
            "clusterTime": {"$timestamp": {"t": t, "i": counter}},
            "wallTime": date(at),
            "fullDocument": doc,
        })
    }

    fn record(topic: &str, key: &str, value: &Value) -> CaptureRecord {
        CaptureRecord { topic: topic.into(), key: Some(key.into()), value: serde_json::to_vec(value).expect("json") }
    }

    impl Scenario {
        /// Builds the registry for `cfg` (the charge events are generated lazily by
        /// [`Scenario::charge_events`]).
        pub fn new(cfg: ScenarioConfig) -> Scenario {
            let mut rng = Rng(cfg.seed ^ 0x5EED_DE71_CE00_0001);
            let (mut devices, mut companies, mut tills) = (Vec::new(), Vec::new(), Vec::new());
            let mut counter = 0u32;
            let at = cfg.start - chrono::Duration::days(1);
            let mut previous_printer: Option<String> = None;
            while devices.len() < cfg.devices {
                let n = (2 + rng.below(6) as usize).min(cfg.devices - devices.len());
                let company = Company {
                    id: rng.hex24(),
                    merchant: MERCHANTS[rng.below(MERCHANTS.len() as u64) as usize],
                    city: CITIES[rng.below(CITIES.len() as u64) as usize],
                    pix_key: String::new(),
                };
                let company = Company { pix_key: format!("pix.{}@example.com", &company.id[..8]), ..company };
                let locale = match rng.below(10) {
                    0 => "en-US",
                    1 => "es-ES",
                    _ => "pt-BR",
                };
                let printers = if n == 1 { 1 } else { (n * 2 / 5).max(1) };
                let mut printer_ids = Vec::new();
                for p in 0..printers {
                    let id = rng.hex24();
                    let (model, width, code_page, native_qr) = PRINTERS[rng.below(PRINTERS.len() as u64) as usize];
                    let doc = json!({
                        "_id": {"$oid": id}, "company": {"$oid": company.id}, "kind": "printer",
                        "name": format!("Impressora {}", p + 1), "model": model,
                        "printer": {"paperWidthMm": width, "codePage": code_page, "nativeQr": native_qr, "transport": "mqtt"},
                        "locale": locale, "defaultForCompany": p == 0, "enabled": true, "updatedAt": date(at),
                    });
                    counter += 1;
                    devices.push(record(
                        "device.upserted",
                        &id,
                        &envelope("Device", &id, "insert", at, counter, Some(&doc)),
                    ));
                    printer_ids.push(id);
                }
                for t in 0..n - printers {
                    let id = rng.hex24();
                    let mut doc = json!({
                        "_id": {"$oid": id}, "company": {"$oid": company.id}, "kind": "terminal",
                        "name": format!("Maquininha {}", t + 1), "model": TERMINALS[rng.below(3) as usize],
                        "screen": if rng.below(4) == 0 { json!({"widthPx": 480, "heightPx": 854}) } else { json!({"widthPx": 720, "heightPx": 1280}) },
                        "locale": locale, "enabled": rng.below(40) != 0, "updatedAt": date(at),
                    });
                    match rng.below(30) {
                        0..=3 => {}
                        4 => {
                            if let Some(other) = &previous_printer {
                                doc["pairedPrinter"] = json!({"$oid": other});
                            }
                        }
                        _ => doc["pairedPrinter"] = json!({"$oid": printer_ids[t % printer_ids.len()]}),
                    }
                    if rng.below(5) == 0 {
                        doc["timeZone"] = json!("America/Manaus");
                    }
                    counter += 1;
                    devices.push(record(
                        "device.upserted",
                        &id,
                        &envelope("Device", &id, "insert", at, counter, Some(&doc)),
                    ));
                    tills.push(Till { terminal: id, company: companies.len() });
                }
                previous_printer = printer_ids.last().cloned();
                companies.push(company);
            }
            Scenario { cfg, devices, companies, tills }
        }

        /// The `device.upserted` records of the registry, one per device.
        pub fn device_records(&self) -> &[CaptureRecord] {
            &self.devices
        }

        /// The configuration it was built from.
        pub fn config(&self) -> &ScenarioConfig {
            &self.cfg
        }

        /// The `charge.upserted` events, lazily, in publishing order (lifecycles
        /// interleaved; each charge's events in order). Memory stays flat for millions.
        pub fn charge_events(&self) -> ChargeEvents<'_> {
            ChargeEvents {
                scenario: self,
                rng: Rng(self.cfg.seed ^ 0xC4A2_6E00_0000_0002),
                heap: std::collections::BinaryHeap::new(),
                next_charge: 0,
                counter: 0,
                emitted: 0,
            }
        }
    }

    /// Iterator over a [`Scenario`]'s charge events (see [`Scenario::charge_events`]).
    pub struct ChargeEvents<'a> {
        scenario: &'a Scenario,
        rng: Rng,
        /// Future events: (tick, creation counter) → record, smallest first.
        heap: std::collections::BinaryHeap<std::cmp::Reverse<(u64, u32, HeapRecord)>>,
        next_charge: u64,
        counter: u32,
        emitted: usize,
    }

    /// A record ordered only by its position in the heap key.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct HeapRecord(CaptureRecord);
    impl PartialOrd for HeapRecord {
        fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for HeapRecord {
        fn cmp(&self, _: &Self) -> std::cmp::Ordering {
            std::cmp::Ordering::Equal
        }
    }

    /// Virtual ticks between two charge creations (a tick is 10 ms of document time).
    const TICKS_PER_CHARGE: u64 = 10;

    impl ChargeEvents<'_> {
        fn push(&mut self, tick: u64, rec: CaptureRecord) {
            self.counter = self.counter.wrapping_add(1);
            self.heap.push(std::cmp::Reverse((tick, self.counter, HeapRecord(rec))));
        }

        fn at(&self, tick: u64) -> DateTime<Utc> {
            self.scenario.cfg.start + chrono::Duration::milliseconds(tick as i64 * 10)
        }

        fn event(&mut self, doc: &Value, op: &str, tick: u64) -> CaptureRecord {
            let id = doc["_id"]["$oid"].as_str().unwrap_or_default().to_string();
            let full = (op != "delete").then_some(doc);
            record(
                "charge.upserted",
                &id,
                &envelope("Charge", &id, op, self.at(tick), self.counter.wrapping_add(1), full),
            )
        }

        /// Creates charge number `self.next_charge` and queues its events.
        fn create_charge(&mut self) {
            let s = self.scenario;
            let start = s.cfg.start;
            let at = |tick: u64| start + chrono::Duration::milliseconds(tick as i64 * 10);
            let rng = &mut self.rng;
            let tick0 = self.next_charge * TICKS_PER_CHARGE;
            self.next_charge += 1;
            let kind = rng.below(100);
            let on_terminal = !(84..96).contains(&kind) && !s.tills.is_empty();
            let (company, terminal) = if on_terminal {
                let till = &s.tills[rng.below(s.tills.len() as u64) as usize];
                (&s.companies[till.company], Some(till.terminal.clone()))
            } else {
                (&s.companies[rng.below(s.companies.len() as u64) as usize], None)
            };
            let id = rng.hex24();
            let cents = match rng.below(500) {
                0 => 1,
                1 => 9_999_999,
                _ => 100 + rng.below(49_900),
            };
            let txid = format!("{:016x}{:08x}", rng.next(), rng.next() as u32);
            let created = at(tick0);
            let mut doc = json!({
                "_id": {"$oid": id},
                "company": {"$oid": company.id},
                "value": if rng.below(4) == 0 { json!({"$numberLong": cents.to_string()}) } else { json!(cents) },
                "status": "ACTIVE",
                "type": "STATIC",
                "identifier": txid,
                "transactionID": txid,
                "pixKey": company.pix_key,
                "merchant": {"name": company.merchant, "city": company.city},
                "additionalInfo": [{"key": "Pão de queijo", "value": format!("{}x", 1 + rng.below(5))}],
                "expiresDate": date(created + s.cfg.expires_in),
                "createdAt": date(created),
                "updatedAt": date(created),
                "__v": 0,
            });
            if let Some(t) = &terminal {
                doc["terminal"] = json!({"$oid": t});
            }
            if rng.below(10) < 3 || (92..96).contains(&kind) {
                let url = format!("pix.example.com/qr/v2/{:016x}{:016x}", rng.next(), rng.next());
                if let Ok(code) = render::brcode::encode_dynamic(&url, Some(cents), company.merchant, company.city) {
                    doc["type"] = json!("DYNAMIC");
                    doc["brCode"] = json!(code);
                }
            }
            let paid_at = |doc: &mut Value, at: DateTime<Utc>, rng: &mut Rng| {
                doc["status"] = json!("COMPLETED");
                doc["paidAt"] = date(at);
                doc["payer"] = json!({"name": "José da Silva"});
                doc["endToEndId"] = json!(format!("E{:031}", rng.next() as u128 * 1_000_000_007 % 10u128.pow(31)));
            };
            // Ticks after creation of the lifecycle's later events.
            let d1 = tick0 + 5 + rng.below(300);
            let d2 = d1 + 1 + rng.below(100);
            let d3 = d2 + 1 + rng.below(100);
            let mut events: Vec<(u64, Value, &str)> = vec![(tick0, doc.clone(), "insert")];
            let update = |doc: &mut Value, v: u64, tick: u64| {
                doc["__v"] = json!(v);
                doc["updatedAt"] = date(at(tick));
            };
            match kind {
                // Paid: 0..46 plain; 92..96 dynamic (forced above).
                0..=45 | 92..=95 => {
                    update(&mut doc, 1, d1);
                    paid_at(&mut doc, at(d1), rng);
                    events.push((d1, doc.clone(), "update"));
                }
                46..=59 | 96..=99 => {
                    update(&mut doc, 1, d1);
                    doc["status"] = json!("EXPIRED");
                    events.push((d1, doc.clone(), "update"));
                }
                60..=67 => {
                    update(&mut doc, 1, d1);
                    doc["comment"] = json!("mesa 7");
                    events.push((d1, doc.clone(), "update"));
                    update(&mut doc, 2, d2);
                    paid_at(&mut doc, at(d2), rng);
                    events.push((d2, doc.clone(), "update"));
                }
                68..=73 => {
                    update(&mut doc, 1, d1);
                    paid_at(&mut doc, at(d1), rng);
                    events.push((d1, doc.clone(), "update"));
                    events.push((d2, doc.clone(), "redeliver"));
                }
                74..=79 => {
                    let first = doc.clone();
                    update(&mut doc, 1, d1);
                    paid_at(&mut doc, at(d1), rng);
                    events.push((d1, doc.clone(), "update"));
                    events.push((d2, first, "replace"));
                }
                80..=83 => {
                    update(&mut doc, 1, d1);
                    doc["status"] = json!("EXPIRED");
                    events.push((d1, doc.clone(), "update"));
                    events.push((d3, doc.clone(), "delete"));
                }
                // No card machine: 84..94 paid, 94..96 expired (see on_terminal).
                _ => {
                    update(&mut doc, 1, d1);
                    if kind < 94 {
                        paid_at(&mut doc, at(d1), rng);
                    } else {
                        doc["status"] = json!("EXPIRED");
                    }
                    events.push((d1, doc.clone(), "update"));
                }
            }
            let mut last: Option<CaptureRecord> = None;
            for (tick, doc, op) in events {
                let rec = match (op, &last) {
                    // The same change delivered again: same eventId, same bytes.
                    ("redeliver", Some(prev)) => prev.clone(),
                    _ => self.event(&doc, op, tick),
                };
                last = Some(rec.clone());
                self.push(tick, rec);
            }
        }
    }

    impl Iterator for ChargeEvents<'_> {
        type Item = CaptureRecord;

        fn next(&mut self) -> Option<CaptureRecord> {
            if self.emitted >= self.scenario.cfg.charge_events {
                return None;
            }
            loop {
                let due = self
                    .heap
                    .peek()
                    .is_some_and(|std::cmp::Reverse((tick, _, _))| *tick <= self.next_charge * TICKS_PER_CHARGE);
                if due {
                    let std::cmp::Reverse((_, _, HeapRecord(rec))) = self.heap.pop().expect("peeked");
                    self.emitted += 1;
                    return Some(rec);
                }
                self.create_charge();
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn scenario_is_deterministic_and_sized_as_asked() {
            let cfg = ScenarioConfig::new(42, 57, 1_001);
            let (a, b) = (Scenario::new(cfg.clone()), Scenario::new(cfg.clone()));
            assert_eq!(a.device_records(), b.device_records());
            assert_eq!(a.device_records().len(), 57);
            let ea: Vec<CaptureRecord> = a.charge_events().collect();
            assert_eq!(ea, b.charge_events().collect::<Vec<_>>());
            assert_eq!(ea.len(), 1_001);
            let other: Vec<CaptureRecord> = Scenario::new(ScenarioConfig { seed: 43, ..cfg }).charge_events().collect();
            assert_ne!(ea, other);
            let specs = crate::registry::devices_from_records(a.device_records());
            assert_eq!(specs.len(), 57);
            assert!(
                specs.iter().any(|d| d.kind_name() == "printer") && specs.iter().any(|d| d.kind_name() == "terminal")
            );
        }

        /// Every kind of lifecycle occurs, as the model of the routing rules sees it, and
        /// nothing is dead-lettered: the scenario is a delivery proof.
        #[test]
        fn scenario_covers_every_lifecycle_and_routes_cleanly() {
            use crate::expected::{Fate, Model};
            let scenario = Scenario::new(ScenarioConfig::new(7, 200, 6_000));
            let mut model = Model::new();
            for r in scenario.device_records() {
                assert!(model.apply_device(&r.value));
            }
            let mut reasons: std::collections::BTreeMap<String, usize> = Default::default();
            let mut versions: std::collections::HashMap<String, (i64, String)> = Default::default();
            let mut effects = 0;
            for r in scenario.charge_events() {
                let v: Value = serde_json::from_slice(&r.value).unwrap();
                let doc = &v["fullDocument"];
                // Each charge's events come in order, except the deliberate late old version.
                if let Some(ver) = doc["__v"].as_i64() {
                    let prev =
                        versions.insert(r.key.clone().unwrap(), (ver, v["operationType"].as_str().unwrap().into()));
                    if let Some((p, _)) = prev {
                        assert!(ver >= p || v["operationType"] == "replace", "{v}");
                    }
                }
                match model.apply_charge(&r.value) {
                    Fate::Effects { effects: e, dead } => {
                        assert!(dead.is_empty(), "{dead:?}");
                        effects += e.len();
                        for e in e {
                            *reasons.entry(e.kind.as_str().to_string()).or_default() += 1;
                        }
                    }
                    Fate::Ignored(reason) => *reasons.entry(reason.to_string()).or_default() += 1,
                    Fate::DeadLetter(reason) => panic!("dead letter {reason}: {v}"),
                }
            }
            for want in [
                "display_qr",
                "payment_confirmed",
                "print_receipt",
                "charge_expired",
                "duplicate_event",
                "stale_version",
                "no_status_change",
                "delete_event",
                "no_device_concerned",
                "device_disabled",
            ] {
                assert!(reasons.get(want).copied().unwrap_or(0) > 0, "no {want}: {reasons:?}");
            }
            assert!(effects > 6_000, "{effects} effects for 6000 events: {reasons:?}");
        }

        #[test]
        fn lifecycles_are_deterministic_and_ordered_per_charge() {
            let ts = vec![TerminalRef { terminal: "t1".into(), company: "c1c1c1c1".into(), merchant: "Loja".into() }];
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
                assert_eq!(prev.map(|p| p + 1).unwrap_or(0), ver, "insert before update");
                assert_eq!(v["fullDocument"]["terminal"]["$oid"], "t1");
            }
        }
    }
}
