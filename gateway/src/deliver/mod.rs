//! Delivery: the per-device dispatcher ([`dispatcher`]), the seam through which it reaches
//! devices ([`transport`]) and its implementation on the embedded MQTT broker ([`mqtt`]), and the
//! publisher of parked dead letters to Kafka ([`deadletter`]); printers driven directly over
//! TCP 9100, serial or USB ([`direct`]).

pub mod deadletter;
pub mod direct;
pub mod dispatcher;
pub mod mqtt;
pub mod transport;

pub use dispatcher::Dispatcher;
pub use transport::{Transport, TransportError};
