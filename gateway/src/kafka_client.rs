//! The librdkafka settings every Kafka client of pixgate shares.

use rdkafka::ClientConfig;

/// librdkafka `reconnect.backoff.max.ms`: the longest wait between two connection attempts
/// to one broker, ms (librdkafka adds -25% to +50% jitter).
///
/// librdkafka doubles the wait after each failed attempt up to its default of 10,000 ms, so
/// after a Kafka outage of a few seconds a client can wait up to 15 s before it connects to
/// the partition leader again: the consumer fetches nothing and a card machine waits that
/// long for its QR after Kafka is back. At 1,000 ms the delay is at most 1.5 s, for one
/// connection attempt per second per broker while Kafka is away.
pub const RECONNECT_BACKOFF_MAX_MS: u32 = 1_000;

/// A librdkafka configuration for `brokers` (`bootstrap.servers`, `host:port,…`) with the
/// settings every pixgate client shares ([`RECONNECT_BACKOFF_MAX_MS`]); each client adds
/// its own.
pub fn client(brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers).set("reconnect.backoff.max.ms", RECONNECT_BACKOFF_MAX_MS.to_string());
    c
}

/// [`client`] for a producer whose records must land once and in order per partition,
/// however long Kafka is away: idempotent (`enable.idempotence`, `acks=all`), no message
/// timeout (`message.timeout.ms = 0`: librdkafka retries until Kafka has the record),
/// `linger.ms = 1`. The delivery log and the route changelog write this way.
pub fn ordered_producer(brokers: &str) -> ClientConfig {
    let mut c = client(brokers);
    c.set("enable.idempotence", "true").set("acks", "all").set("linger.ms", "1").set("message.timeout.ms", "0");
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_client_gets_the_short_reconnect_backoff() {
        let c = client("127.0.0.1:9092");
        assert_eq!(c.get("bootstrap.servers"), Some("127.0.0.1:9092"));
        assert_eq!(c.get("reconnect.backoff.max.ms"), Some("1000"));
        // librdkafka accepts the value (it rejects what is out of its range).
        c.create_native_config().expect("librdkafka accepts the settings");
    }
}
