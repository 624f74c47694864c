//! `pixgate`'s commands besides running the gateway: outbox and dead-letter inspection
//! ([`inspect`]), effect flags ([`flags`]), consumer group repositioning ([`kafka`]), the reconciliation report ([`report`]), the BR Code tool ([`brcode`]), device credentials ([`credentials`]), the devices' broker configuration ([`broker_config`]) and a
//! raw stream sent to a printer by hand ([`print`]).

pub mod brcode;
pub mod broker_config;
pub mod credentials;
pub mod flags;
pub mod inspect;
pub mod kafka;
pub mod print;
pub mod report;
