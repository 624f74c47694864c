//! The jobs connection (`broker.client_id`), or in the central shape one connection per
//! device-jobs partition owned ([`super::partitions`]): jobs go to the devices at QoS 1.

use super::link::{Backoff, Links, Which};
use super::partitions::PartitionLinks;
use super::REQUESTS;
use crate::deliver::mqtt::star::{self, StarPrinters};
use crate::deliver::transport::{Transport, TransportError};
use crate::shutdown::Shutdown;
use bytes::Bytes;
use device_protocol::Topic;
use rumqttc::{AsyncClient, ConnectReturnCode, Event, EventLoop, MqttOptions, Packet, QoS};
use std::sync::Arc;

/// What [`TransportError`] names this transport.
const LINK: &str = "external MQTT broker";

/// Publishes each job to `pixgate/v1/devices/{id}/jobs` at QoS 1, not retained, on the
/// jobs connection. Cheap to share: a send is a hand-off to the connection's event loop.
#[derive(Clone)]
pub struct BrokerPublisher {
    jobs: Jobs,
    links: Arc<Links>,
    star: Option<Arc<dyn StarPrinters>>,
}

/// Which connections carry the jobs.
#[derive(Clone)]
enum Jobs {
    /// One connection (`broker.client_id`).
    One(AsyncClient),
    /// The connection of each device's device-jobs partition (the central shape).
    Partitions(Arc<PartitionLinks>),
}

impl BrokerPublisher {
    /// The partition connections, in the central shape.
    pub fn partitions(&self) -> Option<Arc<PartitionLinks>> {
        match &self.jobs {
            Jobs::One(_) => None,
            Jobs::Partitions(p) => Some(p.clone()),
        }
    }

    /// This publisher, sending the messages of the Star printers `star` knows to their own
    /// topics (`star/cloudprnt/to-device/{mac}/{title}`) instead of `…/devices/{id}/jobs`.
    pub fn with_star(mut self, star: Option<Arc<dyn StarPrinters>>) -> BrokerPublisher {
        self.star = star;
        self
    }
}

/// Starts the jobs connection with `options` and its event loop (tracked by `shutdown`,
/// ending when it is requested); returns its publisher.
pub fn start(options: MqttOptions, links: Arc<Links>, shutdown: Shutdown) -> BrokerPublisher {
    let (client, eventloop) = AsyncClient::new(options, REQUESTS);
    shutdown.spawn(drive(eventloop, links.clone(), shutdown.clone()));
    BrokerPublisher { jobs: Jobs::One(client), links, star: None }
}

/// A publisher that sends each job on its device's partition connection (opened and
/// closed by the consumer as partitions move).
pub fn partitioned(partitions: Arc<PartitionLinks>, links: Arc<Links>) -> BrokerPublisher {
    BrokerPublisher { jobs: Jobs::Partitions(partitions), links, star: None }
}

/// The jobs connection's event loop: polls it (which connects, sends the queued jobs and
/// takes the broker's PUBACKs), records its state in `links`, and pauses between failed
/// attempts.
async fn drive(mut eventloop: EventLoop, links: Arc<Links>, shutdown: Shutdown) {
    let mut backoff = Backoff::default();
    loop {
        let event = tokio::select! {
            _ = shutdown.requested() => return,
            event = eventloop.poll() => event,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(c))) if c.code == ConnectReturnCode::Success => {
                backoff.reset();
                tracing::info!(client_id = %eventloop.mqtt_options.client_id(), "jobs connection to the devices' broker up");
                links.up(Which::Jobs);
            }
            Ok(_) => {}
            Err(e) => {
                if links.failed(Which::Jobs, e.to_string(), &mut backoff, &shutdown).await {
                    return;
                }
            }
        }
    }
}

/// A job goes to the broker as a QoS 1 PUBLISH on the device's jobs topic; the broker hands
/// it to the device's session (kept while the device is away, on a persistent session).
/// `Ok` means the connection's event loop took it, not that the broker or the device has
/// it: the device's ack says that, on the acks connection.
///
/// Never waits: while the connection is down, or its queue is full (a slow broker, or a
/// half-open connection until the keep alive finds it out), the send is refused
/// ([`TransportError::Down`]) and the job's ack timeout sends it again, so the dispatcher
/// goes on with acks, timeouts and direct printers meanwhile.
impl Transport for BrokerPublisher {
    async fn send(&self, device: &str, wire: Bytes) -> Result<(), TransportError> {
        // A Star printer's message (made by the CloudPRNT side) goes to its own topics.
        let topic = match self.star.as_ref().and_then(|s| s.mac_of(device)) {
            Some(mac) => star::to_device_topic(&mac, &wire),
            None => Topic::Jobs(device.to_string()).path(),
        };
        match &self.jobs {
            Jobs::One(client) => {
                if !self.links.is_up(Which::Jobs) {
                    return Err(TransportError::Down(LINK));
                }
                client
                    .try_publish(topic, QoS::AtLeastOnce, false, wire.to_vec())
                    .map_err(|_| TransportError::Down(LINK))
            }
            Jobs::Partitions(p) => {
                if p.publish(device, topic, wire.to_vec()) {
                    Ok(())
                } else {
                    Err(TransportError::Down(LINK))
                }
            }
        }
    }
}
