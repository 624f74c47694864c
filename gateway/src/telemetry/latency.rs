//! Latency by stage: how long a record and its jobs spend in each part of pixgate, as
//! fixed-bucket histograms served on `/stats` and, as Prometheus histograms
//! (`pixgate_stage_latency_seconds{stage}`), on `/metrics`.
//!
//! A charge event's way to the device's ack, stage by stage ([`Stage`]):
//!
//! ```text
//!  record timestamp ──kafka──► planned ──accept──► durable ──queue──► sent ──device──► done ack
//! ```
//!
//! Observed per record (`kafka`, `accept`) and per job (`queue`, `device`). Jobs reloaded
//! at start-up, restored from the delivery log or replayed from the dead letters have no
//! `queue` figure. With `cluster.enabled` a job record read back from the device-jobs
//! topic is a record too: `kafka` and `accept` then count both hops.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Upper bounds of the buckets, seconds: 1-2-5 per decade from 0.1 ms to 20 s, then 60 s
/// and 300 s, and an implicit last bucket beyond (Prometheus' `+Inf`).
pub const BUCKET_BOUNDS_S: [f64; 19] = [
    0.000_1, 0.000_2, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0,
    300.0,
];

/// A part of a record's way through pixgate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    /// The record's Kafka timestamp (`CreateTime`: the producer's clock;
    /// `LogAppendTime`: the broker's) to its planning: the broker, its fetch wait
    /// (`kafka.fetch_wait_max_ms`), the read-ahead queue, and any lag (a paused
    /// partition, a backlog, a record held for the device registry). Two hosts' clocks
    /// when the producer stamps it; a timestamp later than the planning is not counted.
    Kafka,
    /// Planned to durably accepted: batched (`outbox.batch_max_delay_ms`) and written to
    /// the outbox with one fsync (with `cluster.enabled`, also produced to the device-jobs
    /// topic or logged in the delivery log). Records whose jobs were queued (past the
    /// dedupe window) or produced only.
    Accept,
    /// Durably accepted to the job's first send to its device: the dispatcher's queue,
    /// behind the device's earlier jobs, and while its device cannot take it.
    Queue,
    /// First send to the device's `done` ack: the network both ways and the device's own
    /// work (a printer printing), resends included.
    Device,
}

impl Stage {
    /// Every stage, in the order a record meets them.
    pub const ALL: [Stage; 4] = [Stage::Kafka, Stage::Accept, Stage::Queue, Stage::Device];

    /// Its name: the `stage` label on `/metrics`, the key on `/stats`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Kafka => "kafka",
            Stage::Accept => "accept",
            Stage::Queue => "queue",
            Stage::Device => "device",
        }
    }
}

/// A latency histogram with the buckets of [`BUCKET_BOUNDS_S`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Observations.
    pub count: u64,
    /// Their sum, seconds.
    pub sum_s: f64,
    /// Observations per bucket (not cumulative): `counts[i]` fell in
    /// `(BUCKET_BOUNDS_S[i-1], BUCKET_BOUNDS_S[i]]`, the last one beyond the last bound.
    /// Empty until the first observation.
    pub counts: Vec<u64>,
}

impl Histogram {
    /// Counts `d`.
    pub fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        if self.counts.is_empty() {
            self.counts = vec![0; BUCKET_BOUNDS_S.len() + 1];
        }
        let i = BUCKET_BOUNDS_S.partition_point(|&bound| bound < s);
        self.counts[i] += 1;
        self.count += 1;
        self.sum_s += s;
    }

    /// What was observed since `earlier`, a snapshot of the same histogram (of the same
    /// process: counts never go down).
    pub fn since(&self, earlier: &Histogram) -> Histogram {
        let counts =
            self.counts.iter().enumerate().map(|(i, c)| c.saturating_sub(earlier.counts.get(i).copied().unwrap_or(0)));
        Histogram {
            count: self.count.saturating_sub(earlier.count),
            sum_s: self.sum_s - earlier.sum_s,
            counts: counts.collect(),
        }
    }

    /// `(upper bound s, count)` per bucket, not cumulative, the last bound `f64::INFINITY`:
    /// the shape `prometheus_client`'s histogram encoder takes.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        let bounds = BUCKET_BOUNDS_S.iter().copied().chain([f64::INFINITY]);
        bounds.enumerate().map(|(i, b)| (b, self.counts.get(i).copied().unwrap_or(0))).collect()
    }

    /// The `q`-quantile (0..=1), seconds, interpolated linearly within its bucket as
    /// Prometheus' `histogram_quantile` does; the last bound when it falls beyond it.
    /// `None` without observations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * self.count as f64;
        let mut below = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            if c > 0 && (below + c) as f64 >= rank {
                let Some(&upper) = BUCKET_BOUNDS_S.get(i) else { break };
                let lower = if i == 0 { 0.0 } else { BUCKET_BOUNDS_S[i - 1] };
                return Some(lower + (upper - lower) * ((rank - below as f64) / c as f64).max(0.0));
            }
            below += c;
        }
        BUCKET_BOUNDS_S.last().copied()
    }

    /// Mean, seconds; `None` without observations.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum_s / self.count as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1000.0)
    }

    #[test]
    fn observations_fall_in_the_bucket_whose_bound_they_do_not_exceed() {
        let mut h = Histogram::default();
        for v in [0.05, 0.1, 0.11, 3.0, 10.0, 400_000.0] {
            h.observe(ms(v));
        }
        let b = h.buckets();
        assert_eq!(b.len(), BUCKET_BOUNDS_S.len() + 1);
        assert_eq!(b[0], (0.000_1, 2), "0.05 ms and 0.1 ms: a bound is inclusive, as Prometheus' le");
        assert_eq!(b[1], (0.000_2, 1));
        assert_eq!(b[5], (0.005, 1), "3 ms");
        assert_eq!(b[6], (0.01, 1), "10 ms");
        assert_eq!(b[19], (f64::INFINITY, 1), "beyond 5 minutes");
        assert_eq!(h.count, 6);
        assert!((h.sum_s - 400.013_26).abs() < 1e-9, "{}", h.sum_s);
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket() {
        let mut h = Histogram::default();
        // 100 observations: 50 in (2, 5] ms, 49 in (10, 20] ms, 1 in (50, 100] ms.
        (0..50).for_each(|_| h.observe(ms(3.0)));
        (0..49).for_each(|_| h.observe(ms(15.0)));
        h.observe(ms(70.0));
        let p = |q| h.quantile(q).map(|s| (s * 1e6).round() / 1e3);
        assert_eq!(p(0.5), Some(5.0), "the 50th of 100 is the last of its bucket");
        assert_eq!(p(0.25), Some(3.5), "halfway into (2, 5]");
        assert_eq!(p(0.99), Some(20.0));
        assert_eq!(p(1.0), Some(100.0));
        assert_eq!(Histogram::default().quantile(0.5), None);
        let mut far = Histogram::default();
        far.observe(Duration::from_secs(600));
        assert_eq!(far.quantile(0.5), Some(300.0), "beyond the last bound: the last bound");
    }

    #[test]
    fn since_subtracts_an_earlier_snapshot() {
        let mut h = Histogram::default();
        h.observe(ms(1.0));
        let before = h.clone();
        h.observe(ms(1.0));
        h.observe(ms(40.0));
        let d = h.since(&before);
        assert_eq!((d.count, d.buckets()[3].1, d.buckets()[8].1), (2, 1, 1));
        assert!((d.sum_s - 0.041).abs() < 1e-12);
        assert_eq!(h.since(&Histogram::default()), h, "since nothing: all of it");
    }
}
