//! # pixgate end-to-end harness
//!
//! Starts the real parts a newcomer (and CI) runs pixgate with: a Kafka-protocol broker
//! (tansu, via `scripts/kafka-broker.sh`), the `pixgate` binary as a child process with its
//! embedded MQTT broker, a fleet of simulated devices connected over MQTT, and the capture
//! simulator feeding a fixtures folder into Kafka. [`demo::run`] is the main job; the
//! end-to-end tests in `tests/tests/` call the same function and check what it left.

pub mod broker;
pub mod demo;
pub mod gateway;
pub mod net;

use std::path::PathBuf;

/// The repository root (this crate's parent directory).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}
