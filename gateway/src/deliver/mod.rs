//! Delivery: the per-device dispatcher ([`dispatcher`]), the transport it reaches devices
//! through (the embedded MQTT broker, [`mqtt`]), and the publisher of parked dead letters
//! to Kafka ([`deadletter`]).

pub mod deadletter;
pub mod dispatcher;
pub mod mqtt;

pub use dispatcher::Dispatcher;
