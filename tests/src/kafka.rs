//! Reading Kafka from the outside, as an operator would: a topic's records from the
//! beginning, a consumer group's committed offsets, and a bare consumer's read rate (the
//! baseline the load harness compares pixgate with).

use anyhow::{bail, Context};
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// One record read back.
#[derive(Debug, Clone)]
pub struct ReadRecord {
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Key bytes (empty when none).
    pub key: Vec<u8>,
    /// Value bytes.
    pub value: Vec<u8>,
}

/// Reads `topic` partitions `0..partitions` from the beginning (assigned, no group
/// membership) until `expected` records arrived, then keeps reading until no record came
/// for `quiet` (so extra records show up too). Returns them in arrival order.
///
/// # Errors
/// Fewer than `expected` records within `timeout`, or a consumer error.
pub async fn read_topic(
    brokers: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
    quiet: Duration,
    timeout: Duration,
) -> anyhow::Result<Vec<ReadRecord>> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("pixgate-tests-reader-{}-{}", std::process::id(), unique()))
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    loop {
        let wait = if out.len() >= expected { quiet } else { deadline.saturating_duration_since(Instant::now()) };
        match tokio::time::timeout(wait, consumer.recv()).await {
            Ok(Ok(m)) => out.push(ReadRecord {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().unwrap_or_default().to_vec(),
                value: m.payload().unwrap_or_default().to_vec(),
            }),
            Ok(Err(e)) => return Err(e).context(format!("reading {topic}")),
            Err(_) if out.len() >= expected => return Ok(out),
            Err(_) => bail!("only {} of {expected} records on {topic} within {timeout:?}", out.len()),
        }
    }
}

/// The offsets `group` has committed for `topic` partitions `0..partitions` (OffsetFetch;
/// the caller does not join the group). A partition with no commit gives `-1`.
///
/// # Errors
/// The broker did not answer within 10 s.
pub fn committed_offsets(brokers: &str, group: &str, topic: &str, partitions: i32) -> anyhow::Result<Vec<i64>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = consumer.committed_offsets(tpl, Duration::from_secs(10)).context("OffsetFetch")?;
    Ok((0..partitions)
        .map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            _ => -1,
        })
        .collect())
}

/// Waits until the offsets `group` has committed for `topic` partitions `0..partitions`
/// satisfy `done`, asking every 200 ms; returns them. pixgate commits what it stored every
/// second (`auto.commit.interval.ms`), so a test that asserts a commit waits for it.
///
/// # Errors
/// `done` did not hold before `deadline` (the last offsets seen are in the error), or
/// OffsetFetch failed.
pub async fn wait_committed(
    brokers: &str,
    group: &str,
    topic: &str,
    partitions: i32,
    deadline: Instant,
    done: impl Fn(&[i64]) -> bool,
) -> anyhow::Result<Vec<i64>> {
    loop {
        let c = tokio::task::spawn_blocking({
            let (b, g, t) = (brokers.to_string(), group.to_string(), topic.to_string());
            move || committed_offsets(&b, &g, &t, partitions)
        })
        .await??;
        if done(&c) {
            return Ok(c);
        }
        if Instant::now() >= deadline {
            bail!("group {group} on {topic}: committed {c:?}, not yet what was awaited");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The read rate of a bare consumer: a `StreamConsumer` with a fresh group id subscribed to
/// `topics` from the earliest offset, doing nothing with each record. Returns how many it
/// read and how long it took from its creation to the `expected`-th record.
///
/// # Errors
/// Fewer than `expected` records, or a gap of 30 s without one.
pub async fn bare_consume(brokers: &str, topics: &[&str], expected: u64) -> anyhow::Result<(u64, Duration)> {
    let start = Instant::now();
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("pixgate-bare-{}-{}", std::process::id(), unique()))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("queued.max.messages.kbytes", "16384")
        .create()?;
    consumer.subscribe(topics)?;
    let mut n = 0u64;
    while n < expected {
        match tokio::time::timeout(Duration::from_secs(30), consumer.recv()).await {
            Ok(Ok(_)) => n += 1,
            Ok(Err(e)) => return Err(e).context("bare consumer"),
            Err(_) => bail!("bare consumer: {n} of {expected} records, then nothing for 30 s"),
        }
    }
    Ok((n, start.elapsed()))
}

/// A bare consumer of `topic` from its end: every partition assigned (no group) at its
/// high watermark, fetches held at most `fetch_wait_ms` (`fetch.wait.max.ms`). Each record
/// it reads was readable on the broker by then, which makes it the reference the load
/// harness times pixgate's added latency from.
///
/// # Errors
/// The topic's metadata or watermarks could not be read within 10 s.
pub fn tail_from_end(brokers: &str, topic: &str, fetch_wait_ms: u32) -> anyhow::Result<StreamConsumer> {
    let consumer: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("pixgate-tail-{}-{}", std::process::id(), unique()))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", fetch_wait_ms.to_string())
        .create()?;
    let timeout = Duration::from_secs(10);
    let metadata = consumer.fetch_metadata(Some(topic), timeout).context("topic metadata")?;
    let partitions: Vec<i32> = metadata.topics().iter().flat_map(|t| t.partitions().iter().map(|p| p.id())).collect();
    if partitions.is_empty() {
        bail!("{topic} has no partitions");
    }
    let mut tpl = TopicPartitionList::new();
    for p in partitions {
        let (_, high) = consumer.fetch_watermarks(topic, p, timeout).context("watermarks")?;
        tpl.add_partition_offset(topic, p, Offset::Offset(high))?;
    }
    consumer.assign(&tpl)?;
    Ok(consumer)
}

fn unique() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default()
}

/// The partition Kafka's Java producer picks for `key` among `partitions`
/// (`DefaultPartitioner`, `BuiltInPartitioner.partitionForKey`: murmur2 of the key bytes,
/// made positive, modulo the count), computed here independently of librdkafka.
pub fn java_partition(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions
}

/// Kafka's `Utils.murmur2`: MurmurHash2, 32 bits, seed `0x9747b28c`.
pub fn murmur2(data: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own values, as other ports check them (e.g. Akka's `Murmur2Spec`).
    #[test]
    fn murmur2_gives_kafkas_values() {
        let want = [
            ("1", -1_993_445_489),
            ("12", 126_087_238),
            ("123", -267_702_483),
            ("1234", -1_614_185_708),
            ("12345", -1_188_365_604),
        ];
        for (s, h) in want {
            assert_eq!(murmur2(s.as_bytes()), h, "{s}");
        }
        assert!((0..4).contains(&java_partition(b"12345", 4)));
    }
}
