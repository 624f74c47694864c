//! `pixgate`'s commands besides running the gateway: outbox and dead-letter inspection
//! ([`inspect`]), the BR Code tool ([`brcode`]) and device credentials ([`credentials`]).

pub mod brcode;
pub mod credentials;
pub mod inspect;
