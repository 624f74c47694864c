//! The Kafka side: the consumer loop ([`consumer`]), offsets stored only as a contiguous
//! done prefix ([`offsets`]), and operators' replays carried out between batch writes
//! ([`replay`]).

pub mod consumer;
pub mod offsets;
pub mod replay;
