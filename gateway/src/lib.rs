//! # pixgate gateway
//!
//! Reads the upstream capture job's change events from Kafka (`device.upserted`,
//! `charge.upserted`), decides which device must show or print what ([`router`]), renders
//! it ([`jobs`]), and delivers it over the embedded MQTT broker ([`mqtt`]) one job at a time
//! per device ([`dispatch`]). A Kafka offset is stored only once every effect of its record
//! is finished: acknowledged by the device, or dead-lettered with a reason ([`offsets`]).
//!
//! Data flow, one concept per module:
//!
//! ```text
//! Kafka ──► consumer ──► cdc (decode) ──► registry / router ──► jobs (render)
//!              ▲                                                   │
//!              │ store offset when record done                     ▼
//!           offsets ◄── record finished ◄── dispatch ◄──► mqtt (rumqttd) ◄──► devices
//!                                              │
//!                                              └──► deadletter (Kafka topic)
//! ```

pub mod cdc;
pub mod config;
pub mod consumer;
pub mod deadletter;
pub mod dispatch;
pub mod http;
pub mod jobs;
pub mod mqtt;
pub mod offsets;
pub mod registry;
pub mod router;
pub mod stats;
