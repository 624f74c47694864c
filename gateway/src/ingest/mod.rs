//! The Kafka side: one consumer in a consumer group reading `device.upserted` and
//! `charge.upserted`, turning each record into effects, and storing a record's offset only
//! when all of its effects are durably accepted: written to their devices' queues in the
//! outbox ([`crate::store::outbox`]), or parked there as dead letters for Kafka
//! ([`crate::deliver::deadletter`]) — the read position is part of the data. Delivery to
//! the devices then proceeds from the outbox, so an offline printer does not hold back the
//! partition.
//!
//! ```text
//! Kafka ─► consumer ─► plan ─► batch ─► handoff ═══════════════╗ seam
//!   ▲        (loop)   (Accept) (group   (outbox write, then    ║
//!   │                          commit)   Command::Enqueue) ────╫─► dispatcher
//!   └── offsets: stored once the batch crossed the seam        ║
//!       backpressure: pauses partitions on the bounds          ║
//! ```
//!
//! Where each part lives:
//! - [`consumer`]: the loop: waits on one event at a time and calls the others; the
//!   librdkafka settings; offset storing; shutdown.
//! - [`group_reader`]: what the loop asks of its consumer-group member, behind a trait
//!   (librdkafka's consumer, or a fake in the loop's unit tests).
//! - [`member`]: a consumer-group member's librdkafka settings.
//! - [`group_watch`]: a group that leaves partitions unread (held by nothing, or by a
//!   member that does not move them on): reported, and a dynamic member rejoins.
//! - [`kafka_metadata`]: a topic's partitions, as Kafka's metadata says.
//! - [`plan`]: one record into an [`Accept`](crate::store::Accept): decode (`cdc`),
//!   route, render, dead letters.
//! - [`batch`]: the batch being built and its timer.
//! - [`handoff`]: the seam where rendered jobs leave routing and enter the durable
//!   per-device queue: the batch's outbox write, then each stored job to the dispatcher;
//!   what it guarantees, and what it becomes with several replicas.
//! - [`retry`]: outbox writes retried until stored, given up only at shutdown.
//! - [`backpressure`]: the bounds, the pause reasons per partition, pause and resume
//!   decisions (no I/O).
//! - [`rebalance`]: the librdkafka context: rebalances noted for the loop, statistics to
//!   the health monitor.
//! - [`offsets`]: which offset may be stored: the contiguous done prefix per partition.
//! - [`replay`]: an operator's replay request, carried out between batch writes.
//! - [`prune`]: the dedupe window's and published dead letters' pruning, once a minute.
//! - [`upstream`]: the upstream as it is: tombstones, `traceparent` headers.
//! - [`registry_wait`]: charges held while the device registry is behind the device
//!   topic, and the loop's side of it ([`registry_hold`]).
//! - [`cluster_reader`]: the central shape's reader: the route and deliver groups'
//!   members, and the device topic read in full outside any group, from positions the
//!   outbox keeps.
//! - [`record_replay`]: an operator's replay of a record-level dead letter, routed again
//!   with the current registry.
//! - [`consume_error`]: a streak of Kafka consume errors, logged once and located.
//! - [`source_reader`]: single records read back from Kafka by position (also for the
//!   dead-letter publisher).
//! - [`device_jobs`]: the central shape's hand-off over Kafka (`cluster.enabled`): jobs
//!   produced to the device-jobs topic, and read back from it.
//! - [`delivery_log`]: the deliver stage's log on Kafka: each job accepted and each job's
//!   end, read back by a partition's next owner; [`ownership`]: which device-jobs
//!   partitions and devices this replica owns.
//!
//! # Group commit
//!
//! Records are planned one by one (decode, route, render) and written in batches: up to
//! `outbox.batch_max_records` records, or what arrived within `outbox.batch_max_delay_ms`,
//! in one outbox transaction (one fsync), together with the removals of the jobs finished
//! meanwhile. Their offsets are stored after that write. The write runs on a blocking
//! thread while the loop plans the next batch: one write in flight at a time, so batches
//! reach the outbox, and their jobs the dispatcher, in the order read, and at most two
//! batches are held in memory (reading stops while the next batch is full and the write
//! in flight has not returned). A write the disk refuses is retried until it succeeds
//! (reading holds meanwhile, `/readyz` names the failure), or shutdown is requested; the
//! removals of jobs finished meanwhile are written apart from it, to free pages for it
//! ([`held_removals`]).
//!
//! # Offsets
//!
//! Settings (librdkafka): `enable.auto.offset.store=false` (we decide what is stored),
//! `enable.auto.commit=true` (stored offsets are committed every second),
//! `partition.assignment.strategy` from the config (default `range`, see
//! [`crate::config::KafkaConfig::assignment_strategy`]), optional static membership
//! (`group.instance.id`), `auto.offset.reset=earliest`. Stored offsets are the contiguous
//! done prefix of each partition ([`offsets`]). A revoked partition's state is forgotten;
//! its records still in the batch are written anyway, and the new owner's copies are
//! deduplicated by message id.
//!
//! # Backpressure
//!
//! Every queue is bounded, and a full one pauses partitions rather than growing or
//! dropping: a partition is paused while it is at its pending-records bound, while it fed
//! a job to a device at its queue bound, or while the outbox is at its bound (every
//! partition), and resumed when all of those are back under half. The consumer keeps
//! polling while paused, as librdkafka requires, and pauses again after a rebalance.
//! The rules in full: [`backpressure`].
//!
//! # Shutdown
//!
//! On SIGTERM: stop fetching, write the batch (after the write in flight, with the
//! removals of the jobs finished meanwhile), commit the stored offsets, close; bounded by
//! `shutdown_timeout_ms`. A SIGKILL at any point loses nothing either: what was not
//! committed is read again and deduplicated by message id.

pub(crate) mod backoff;
pub mod backpressure;
pub mod batch;
pub mod cluster_reader;
pub mod consume_error;
pub mod consumer;
pub mod delivery_log;
pub mod device_jobs;
pub mod group_reader;
pub mod group_watch;
pub mod handoff;
pub mod held_removals;
pub mod kafka_metadata;
pub mod member;
pub mod offsets;
pub mod ownership;
pub(crate) mod partition_reader;
pub mod plan;
pub mod prune;
pub mod rebalance;
pub mod record_headers;
pub mod record_replay;
pub mod registry_hold;
pub mod registry_wait;
pub mod replay;
pub mod restores;
pub mod retry;
pub mod route_changelog;
pub mod source_reader;
pub mod upstream;
