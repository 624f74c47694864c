//! `pixgate`'s commands besides running the gateway: outbox and dead-letter inspection
//! ([`inspect`]) and the BR Code tool ([`brcode`]).

pub mod brcode;
pub mod inspect;
