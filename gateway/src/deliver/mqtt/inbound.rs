//! What one device connection may send: packets per second and bytes per second, each a
//! token bucket holding one second's worth (`mqtt.max_messages_per_second`,
//! `mqtt.max_bytes_per_second`).
//!
//! A card machine sends an ack per job (one job in flight at a time) and a status now and
//! then, a few packets a minute; a device far beyond that is broken or hostile, and every
//! packet it sends costs the gateway a decode, a log line or a dispatcher message. (Its
//! MQTT-level PUBACKs of the jobs it is sent are as many as the jobs, and not counted.) A packet
//! beyond the rate is dropped unanswered (a QoS 1 PUBLISH stays in the device's own
//! in-flight window, which slows its client), and a device that has been beyond it for
//! [`SUSTAINED`] is disconnected.

use tokio::time::{Duration, Instant};

/// How long a device may go on beyond its rate, dropping packets, before it is
/// disconnected.
pub const SUSTAINED: Duration = Duration::from_secs(10);

/// A gap between dropped packets longer than this ends a burst: the next drop starts
/// [`SUSTAINED`] again.
const CALM: Duration = Duration::from_secs(1);

/// What to do with a packet ([`Inbound::admit`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the rate: handle it.
    Take,
    /// Beyond the rate: drop it, unanswered.
    Drop,
    /// Beyond the rate for [`SUSTAINED`]: drop it and disconnect the device.
    Disconnect,
}

/// One connection's buckets.
#[derive(Debug)]
pub struct Inbound {
    packets: Bucket,
    bytes: Bucket,
    /// When the current burst of drops began, and the last drop.
    over: Option<(Instant, Instant)>,
}

impl Inbound {
    /// Buckets for `packets_per_s` packets and `bytes_per_s` bytes a second (0 is taken as
    /// 1), full at `now`.
    pub fn new(packets_per_s: u32, bytes_per_s: u64, now: Instant) -> Inbound {
        Inbound {
            packets: Bucket::new(f64::from(packets_per_s), now),
            bytes: Bucket::new(bytes_per_s as f64, now),
            over: None,
        }
    }

    /// The verdict on a packet of `bytes` (a PUBLISH's topic and payload; 0 for others)
    /// arriving at `now`. A packet larger than a second's bytes passes when the bytes
    /// bucket is full, and empties it.
    pub fn admit(&mut self, bytes: usize, now: Instant) -> Verdict {
        self.packets.refill(now);
        self.bytes.refill(now);
        let cost = (bytes as f64).min(self.bytes.rate);
        if self.packets.tokens >= 1.0 && self.bytes.tokens >= cost {
            self.packets.tokens -= 1.0;
            self.bytes.tokens -= cost;
            return Verdict::Take;
        }
        let began = match self.over {
            Some((began, last)) if now.duration_since(last) <= CALM => began,
            _ => now,
        };
        self.over = Some((began, now));
        if now.duration_since(began) >= SUSTAINED {
            Verdict::Disconnect
        } else {
            Verdict::Drop
        }
    }
}

#[derive(Debug)]
struct Bucket {
    /// Tokens a second, and the most it holds.
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: f64, now: Instant) -> Bucket {
        let rate = rate.max(1.0);
        Bucket { rate, tokens: rate, last: now }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.rate);
        self.last = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_seconds_worth_passes_then_the_rate() {
        let t0 = Instant::now();
        let mut inbound = Inbound::new(10, 1_000_000, t0);
        let burst: Vec<Verdict> = (0..12).map(|_| inbound.admit(100, t0)).collect();
        assert_eq!(burst[..10], [Verdict::Take; 10], "a second's worth at once");
        assert_eq!(burst[10..], [Verdict::Drop; 2]);
        // Then one every 100 ms.
        assert_eq!(inbound.admit(100, t0 + 99 * MS), Verdict::Drop);
        assert_eq!(inbound.admit(100, t0 + 100 * MS), Verdict::Take);
        assert_eq!(inbound.admit(100, t0 + 150 * MS), Verdict::Drop);
    }

    #[test]
    fn bytes_are_limited_too_and_a_large_packet_passes_on_a_full_bucket() {
        let t0 = Instant::now();
        let mut inbound = Inbound::new(1_000, 1_000, t0);
        assert_eq!(inbound.admit(600, t0), Verdict::Take);
        assert_eq!(inbound.admit(600, t0), Verdict::Drop, "400 bytes left");
        assert_eq!(inbound.admit(400, t0), Verdict::Take);
        // 5,000 bytes: more than a second's worth, passes once the bucket is full again.
        assert_eq!(inbound.admit(5_000, t0 + 500 * MS), Verdict::Drop);
        assert_eq!(inbound.admit(5_000, t0 + 1_000 * MS), Verdict::Take);
        assert_eq!(inbound.admit(0, t0 + 1_000 * MS), Verdict::Take, "packets without bytes still pass");
    }

    #[test]
    fn a_sustained_flood_is_disconnected_and_a_pause_starts_over() {
        let t0 = Instant::now();
        let mut inbound = Inbound::new(5, 1_000_000, t0);
        // 50 packets a second, ten times the rate.
        let mut first_disconnect = None;
        for i in 0..1_000u32 {
            let now = t0 + 20 * MS * i;
            if inbound.admit(10, now) == Verdict::Disconnect {
                first_disconnect = Some(now.duration_since(t0));
                break;
            }
        }
        let at = first_disconnect.expect("disconnected");
        assert!(at >= SUSTAINED && at < SUSTAINED + Duration::from_secs(1), "after {at:?}");

        // Bursts beyond the rate with calm seconds between them are never disconnected.
        let mut inbound = Inbound::new(5, 1_000_000, t0);
        for burst in 0..30u32 {
            let start = t0 + Duration::from_millis(2_500) * burst;
            for i in 0..20u32 {
                assert_ne!(inbound.admit(10, start + MS * i), Verdict::Disconnect, "burst {burst}");
            }
        }
    }
}
