//! Delivery: the per-device dispatcher ([`dispatcher`]), the seam through which it reaches
//! devices ([`transport`]) and its implementations: the embedded MQTT broker ([`mqtt`]), an
//! external MQTT broker ([`broker`]), one of the two chosen at start ([`device_link`]); the
//! publisher of parked dead letters to Kafka ([`deadletter`]); printers driven directly over
//! TCP 9100, serial or USB ([`direct`]); printers that poll pixgate over Star CloudPRNT
//! ([`cloudprnt`]) or Epson Server Direct Print ([`sdp`]), and who their requests name
//! ([`http_auth`]); what a shutdown waits for on those printers ([`settle`]).

pub mod broker;
pub mod cloudprnt;
pub mod deadletter;
pub mod device_link;
pub mod direct;
pub mod dispatcher;
pub mod http_auth;
pub mod mqtt;
pub mod sdp;
pub mod settle;
pub mod transport;

pub use dispatcher::Dispatcher;
pub use transport::{Transport, TransportError};
