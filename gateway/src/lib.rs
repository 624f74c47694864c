//! # pixgate gateway
//!
//! Reads the upstream capture job's change events from Kafka (`device.upserted`,
//! `charge.upserted`), decides which device must show or print what, renders it, queues it
//! durably in its device's outbox, and delivers it over the embedded MQTT broker, or
//! straight to a printer on raw TCP 9100, a serial line or USB, one job at a time per
//! device. A Kafka offset is stored only once every effect of its record is
//! durably accepted: in the outbox, or dead-lettered with a reason.
//!
//! The modules are layered; each imports only from the layers below it:
//!
//! | layer | modules | what |
//! |---|---|---|
//! | 6 | [`app`] | the wiring of the binary `pixgate` |
//! | 5 | [`cli`] | `pixgate outbox|deadletter|brcode` |
//! | 4 | [`ops`] | readiness rules, `/stats`, `/metrics`, HTTP, the health watch |
//! | 3 | [`deliver`] | the dispatcher, its transport and the dead-letter publisher |
//! | 2 | [`ingest`] | the Kafka consumer loop; records read back by position |
//! | 1 | [`route`] | device registry, router (which effect for which device), render (effect → job) |
//! | 0 | [`store`] | the durable per-device outbox (redb) |
//! | base | [`config`], [`clock`], [`kafka_client`], [`model`], [`telemetry`], [`shutdown`] | settings, the wall clock, the settings every Kafka client shares, shared records, counters and health observations, the shutdown request and the tasks it ends |
//!
//! Change events are decoded by the `cdc` crate; the device protocol (topics, jobs, acks)
//! is the `device-protocol` crate; rendering (BR Code, QR, ESC/POS, screens) is `render`.

pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod deliver;
pub mod ingest;
pub mod kafka_client;
pub mod model;
pub mod ops;
pub mod route;
pub mod shutdown;
pub mod store;
pub mod telemetry;
#[cfg(test)]
mod test_fixtures;
