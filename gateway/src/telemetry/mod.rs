//! What every stage reports: counters ([`stats`]) and the observations readiness is judged
//! on ([`health`]). Neither knows the other; `ops` combines them.

pub mod health;
pub mod stats;

pub use health::Monitor;
pub use stats::{Snapshot, Stats};
