//! # pixgate gateway
//!
//! Reads the upstream capture job's change events from Kafka (`device.upserted`,
//! `charge.upserted`), decides which device must show or print what ([`router`]), renders
//! it ([`jobs`]), queues it durably in its device's outbox ([`outbox`]), and delivers it over
//! the embedded MQTT broker ([`mqtt`]) one job at a time per device ([`dispatch`]). A Kafka
//! offset is stored only once every effect of its record is durably accepted: in the outbox,
//! or dead-lettered with a reason ([`offsets`]).
//!
//! Data flow, one concept per module:
//!
//! ```text
//! Kafka ──► consumer ──► cdc (decode) ──► registry / router ──► jobs (render)
//!              ▲                                                   │
//!              │ store offset once durably accepted                ▼
//!           offsets ◄───────────────────────────────────────── outbox (redb)
//!                                                                  │
//!                          deadletter (Kafka) ◄── dispatch ◄──► mqtt (rumqttd) ◄──► devices
//! ```
//!
//! `charge.upserted` records take [`charge_record`], a typed decoder that gives what
//! [`cdc`]'s `Value` decoders give, at about 0.6 of the cost.
//!
//! Around it: [`clock`] (the injectable wall clock for expiry), [`config`], [`stats`],
//! [`health`] (readiness rules, throughput per topic), [`http`] (health, stats, metrics,
//! inspection) and [`inspect`] (`pixgate outbox|deadletter`).

pub mod cdc;
pub mod charge_record;
pub mod clock;
pub mod config;
pub mod consumer;
pub mod deadletter;
pub mod dispatch;
pub mod health;
pub mod http;
pub mod inspect;
pub mod jobs;
pub mod mqtt;
pub mod offsets;
pub mod outbox;
pub mod registry;
pub mod router;
pub mod stats;
#[cfg(test)]
mod test_fixtures;
