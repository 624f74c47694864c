//! Operating the gateway: readiness rules ([`readiness`]), the `/stats` report
//! ([`report`]), `/metrics` ([`metrics`]), outbox and dead-letter inspection
//! ([`inspect`]), effect flags ([`flags`]), consumer group repositioning ([`reposition`]), the reconciliation report
//! ([`reconciliation`]), the HTTP server ([`http`]) with its admin access rule ([`admin`]), and
//! the health watch ([`probe`]), and the operator's live page ([`dashboard`]).

pub mod admin;
pub mod dashboard;
pub mod flags;
pub mod http;
pub mod inspect;
pub mod metrics;
pub mod probe;
pub mod readiness;
pub mod reconciliation;
pub mod report;
pub mod reposition;
