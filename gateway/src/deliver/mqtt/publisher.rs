//! The gateway's in-process link to the broker's router.
//!
//! The gateway talks to the router over a local link, not TCP: it subscribes to every device's acks
//! and status, and publishes jobs. `LinkTx::publish` is QoS 0 from the link, but the broker
//! forwards at the *subscriber's* QoS, so a device subscribed at QoS 1 gets QoS 1 with
//! PUBACK and session redelivery (rumqttd's router forwards at the subscriber's QoS). The broker keeps
//! nothing on disk: end-to-end delivery is the gateway's job (acks per job, retries).
//!
//! `LinkTx`/`LinkRx` calls block the calling thread, so each side runs on a dedicated
//! thread and talks to tokio through bounded channels.

use crate::deliver::transport::{Transport, TransportError};
use crate::model::Incoming;
use anyhow::Context;
use bytes::Bytes;
use device_protocol::{topics, Topic};
use rumqttd::local::{LinkRx, LinkTx};
use rumqttd::Notification;
use tokio::sync::mpsc;

/// Sends jobs into the broker. Cloneable; bounded (a full channel makes the caller wait).
#[derive(Debug, Clone)]
pub struct Publisher {
    tx: mpsc::Sender<(String, Bytes)>,
}

impl Publisher {
    /// A publisher not backed by a broker: what it publishes arrives on the returned
    /// receiver. For tests and tools that stand in for the broker.
    pub fn channel(capacity: usize) -> (Publisher, mpsc::Receiver<(String, Bytes)>) {
        let (tx, rx) = mpsc::channel(capacity);
        (Publisher { tx }, rx)
    }

    /// Publishes `payload` on `topic` (shared bytes: handed to the broker without a copy).
    ///
    /// # Errors
    /// The broker link is gone.
    pub async fn publish(&self, topic: String, payload: Bytes) -> anyhow::Result<()> {
        self.tx.send((topic, payload)).await.context("MQTT publisher thread is gone")
    }
}

/// Jobs go to a device's jobs topic, `pixgate/v1/devices/{device}/jobs`, where the device
/// is subscribed at QoS 1; acks and status come back through [`start`]'s `incoming`.
impl Transport for Publisher {
    async fn send(&self, device: &str, wire: Bytes) -> Result<(), TransportError> {
        let topic = Topic::Jobs(device.to_string()).path();
        self.tx.send((topic, wire)).await.map_err(|_| TransportError::Closed("MQTT publisher"))
    }
}

/// Subscribes the gateway's link to every device's acks and status, and starts the two
/// threads that carry jobs into it and device messages out of it (into `incoming`,
/// bounded: a slow gateway slows the link).
///
/// # Errors
/// The router refused the subscriptions, or a thread could not start.
pub fn attach(mut link_tx: LinkTx, mut link_rx: LinkRx, incoming: mpsc::Sender<Incoming>) -> anyhow::Result<Publisher> {
    link_tx.subscribe(topics::ALL_ACKS).context("subscribe acks")?;
    link_tx.subscribe(topics::ALL_STATUS).context("subscribe status")?;

    let (tx, mut rx) = mpsc::channel::<(String, Bytes)>(1024);
    std::thread::Builder::new().name("mqtt-publish".into()).spawn(move || {
        while let Some((topic, payload)) = rx.blocking_recv() {
            if let Err(e) = link_tx.publish(topic.clone(), payload) {
                tracing::error!(%topic, error = %e, "MQTT publish failed; the ack timeout will resend");
            }
        }
    })?;
    std::thread::Builder::new().name("mqtt-receive".into()).spawn(move || loop {
        match link_rx.recv() {
            Ok(Some(Notification::Forward(f))) => {
                let topic = String::from_utf8_lossy(&f.publish.topic).to_string();
                if let Some(msg) = parse_incoming(&topic, &f.publish.payload) {
                    if incoming.blocking_send(msg).is_err() {
                        return; // gateway shutting down
                    }
                }
            }
            // The router parks a link whose buffer reached its capacity (200 notifications,
            // `rumqttd::router::MAX_CHANNEL_CAPACITY`) and forwards nothing more to it until
            // the link says it is ready again, as rumqttd's own network links do after
            // writing. Without this, a burst of acks (a fleet reconnecting, a backlog
            // draining) silenced every device's acks for good.
            Ok(Some(Notification::Unschedule)) => {
                if let Err(e) = link_rx.ready() {
                    tracing::error!(error = %e, "MQTT link closed");
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "MQTT link closed");
                return;
            }
        }
    })?;
    Ok(Publisher { tx })
}

/// Decodes a device message; malformed ones are logged and dropped here because they are
/// not events pixgate owns (a device bug, visible in the log with its topic).
fn parse_incoming(topic: &str, payload: &[u8]) -> Option<Incoming> {
    let parsed = match Topic::parse(topic)? {
        Topic::Acks(device) => serde_json::from_slice(payload).map(|ack| Incoming::Ack { device, ack }),
        Topic::Status(device) => serde_json::from_slice(payload).map(|status| Incoming::Status { device, status }),
        Topic::Jobs(_) => return None,
    };
    parsed.map_err(|e| tracing::warn!(%topic, error = %e, "malformed device message")).ok()
}
