//! What every stage reports: counters ([`stats`]), the observations readiness is judged
//! on ([`health`]) and the last jobs of each device ([`recent`]). None knows the others;
//! `ops` combines them.

pub mod health;
pub mod recent;
pub mod stats;

pub use health::Monitor;
pub use stats::{Snapshot, Stats};
