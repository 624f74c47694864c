//! # device-protocol
//!
//! What pixgate and its devices (card machines and receipt printers) say to each other over
//! MQTT. Both sides depend on this crate, so a change here is a protocol change: the topic
//! root carries the version (`pixgate/v1/...`), and a breaking change gets a new version.
//! The crate's README shows every message with an example.
//!
//! The delivery contract, in short:
//! - the gateway publishes one [`Job`] at a time per device (per-device FIFO by [`Job::seq`]);
//! - the device answers every job with an [`Ack`] carrying the job's [`Job::message_id`];
//! - a job can arrive more than once (gateway retry after a lost ack, MQTT QoS 1
//!   redelivery): the device must carry out a message id at most once and ack it again;
//! - devices publish their [`Status`] retained, with an MQTT last will saying `offline`.

pub mod ids;
pub mod messages;
pub mod topics;

pub use ids::message_id;
pub use messages::{Ack, AckResult, EffectKind, Job, PrinterState, ScreenContent, ScreenKind, Status};
pub use topics::Topic;
