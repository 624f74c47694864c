//! What every stage reports: counters ([`stats`]) with latency by stage ([`latency`]),
//! the observations readiness is judged on ([`health`]), the last jobs of each device ([`recent`]) and who is connected
//! ([`presence`]). None knows the others;
//! `ops` combines them.

pub mod health;
pub mod latency;
pub mod log_limit;
pub mod panic;
pub mod presence;
pub mod recent;
pub mod stats;

pub use health::Monitor;
pub use presence::Presence;
pub use stats::{Snapshot, Stats};
