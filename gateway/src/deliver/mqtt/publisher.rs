//! The gateway's side of the hub: jobs go to devices through [`Publisher`].

use super::hub::Hub;
use crate::deliver::transport::{Transport, TransportError};
use bytes::Bytes;
use device_protocol::Topic;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Sends jobs to devices' sessions. Cloneable and cheap: a send is a map lookup and a
/// bounded, non-blocking hand-off to each subscribed session.
#[derive(Debug, Clone)]
pub struct Publisher {
    route: Route,
}

#[derive(Debug, Clone)]
enum Route {
    Hub(Arc<Hub>),
    /// Tests and tools that stand in for the devices.
    Channel(mpsc::Sender<(String, Bytes)>),
}

impl Publisher {
    /// The publisher of the device listener's hub.
    pub fn new(hub: Arc<Hub>) -> Publisher {
        Publisher { route: Route::Hub(hub) }
    }

    /// The hub behind it (`None` for [`Publisher::channel`]'s): who is connected.
    pub fn hub(&self) -> Option<Arc<Hub>> {
        match &self.route {
            Route::Hub(hub) => Some(hub.clone()),
            Route::Channel(_) => None,
        }
    }

    /// A publisher with no devices behind it: each job arrives on the returned receiver as
    /// `(jobs topic, bytes)`. For tests and tools that stand in for the devices.
    pub fn channel(capacity: usize) -> (Publisher, mpsc::Receiver<(String, Bytes)>) {
        let (tx, rx) = mpsc::channel(capacity);
        (Publisher { route: Route::Channel(tx) }, rx)
    }
}

/// A job goes to the device's sessions subscribed to `pixgate/v1/devices/{device}/jobs`,
/// at the QoS each subscribed at (1 for pixgate's devices); acks and status come back on
/// [`super::start`]'s `incoming`. A device that is away does not get it now: the
/// dispatcher sends it again after its ack timeout (or its session keeps it, see
/// [`Hub`]).
impl Transport for Publisher {
    async fn send(&self, device: &str, wire: Bytes) -> Result<(), TransportError> {
        match &self.route {
            Route::Hub(hub) => {
                let taken = hub.send(device, wire);
                if taken == 0 {
                    tracing::debug!(device, "no session of the device took the job");
                }
                Ok(())
            }
            Route::Channel(tx) => {
                let topic = Topic::Jobs(device.to_string()).path();
                tx.send((topic, wire)).await.map_err(|_| TransportError::Closed("test publisher"))
            }
        }
    }
}
