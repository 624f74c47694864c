//! `pixgate`'s commands besides running the gateway: outbox and dead-letter inspection
//! ([`inspect`]), the BR Code tool ([`brcode`]), device credentials ([`credentials`]) and a
//! raw stream sent to a printer by hand ([`print`]).

pub mod brcode;
pub mod credentials;
pub mod inspect;
pub mod print;
