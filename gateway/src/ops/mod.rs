//! Operating the gateway: readiness rules ([`readiness`]), the `/stats` report
//! ([`report`]), `/metrics` ([`metrics`]), outbox and dead-letter inspection
//! ([`inspect`]), effect flags ([`flags`]), consumer group repositioning ([`reposition`]), the reconciliation report
//! ([`reconciliation`]), the HTTP server ([`http`]) with its admin access rule ([`admin`]), and
//! the health watch ([`probe`]), the operator's live page ([`dashboard`]), and the devices'
//! broker configuration of the central shape ([`broker_config`]).

pub mod admin;
pub mod broker_config;
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
