//! Where the devices connect, chosen at start: pixgate's own listener (the edge box) or an
//! external MQTT broker (`broker`, the central shape's transport). The dispatcher sends
//! through either the same way.

use crate::deliver::broker::BrokerPublisher;
use crate::deliver::mqtt::Publisher;
use crate::deliver::transport::{Transport, TransportError};
use bytes::Bytes;

/// The devices' MQTT side.
#[derive(Clone)]
pub enum DeviceLink {
    /// pixgate's own listener, sessions and hub.
    Listener(Publisher),
    /// An external broker pixgate is a client of.
    Broker(BrokerPublisher),
}

impl Transport for DeviceLink {
    async fn send(&self, device: &str, wire: Bytes) -> Result<(), TransportError> {
        match self {
            DeviceLink::Listener(p) => p.send(device, wire).await,
            DeviceLink::Broker(p) => p.send(device, wire).await,
        }
    }
}
