//! Delivery: the per-device dispatcher ([`dispatcher`]), the seam through which it reaches
//! devices ([`transport`]) and its implementation on the embedded MQTT broker ([`mqtt`]), and the
//! publisher of parked dead letters to Kafka ([`deadletter`]).

pub mod deadletter;
pub mod dispatcher;
pub mod mqtt;
pub mod transport;

pub use dispatcher::Dispatcher;
pub use transport::{Transport, TransportError};
