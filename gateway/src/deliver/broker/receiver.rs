//! The acks connection (`broker.acks_client_id`): every device's acks and status, read
//! once per replica.
//!
//! A persistent session (`clean_session = false`) subscribed at QoS 1 to
//! `pixgate/v1/devices/+/acks` and `pixgate/v1/devices/+/status`: acks a device sends
//! while this connection is away wait in the broker's session instead of turning into
//! resends. The subscription is made again after every CONNACK (a broker that lost its
//! sessions, such as a restarted mosquitto without persistence, has forgotten it), which
//! also brings every device's retained status again.

use super::link::{Backoff, Links, Which};
use super::owners::{Owners, OWNER_FILTER};
use super::status_board::StatusBoard;
use super::Extras;
use super::REQUESTS;
use crate::deliver::mqtt::star::{self, StarPrinters, CLIENT_WILL};
use crate::model::Incoming;
use crate::shutdown::Shutdown;
use crate::telemetry::log_limit::LogLimit;
use crate::telemetry::Stats;
use device_protocol::topics::{ALL_ACKS, ALL_STATUS};
use device_protocol::Topic;
use rumqttc::{
    AsyncClient, ConnectReturnCode, Event, EventLoop, MqttOptions, Packet, QoS, SubscribeFilter, SubscribeReasonCode,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// The refusal label of a device message that is not what its topic carries (as the
/// device listener's `malformed_message` rule).
const MALFORMED_MESSAGE: &str = "malformed_message";

/// The refusal label of a Star printer's message whose MAC no registered printer on
/// CloudPRNT's MQTT method has (as the device listener's `unknown_device` rule).
const UNKNOWN_DEVICE: &str = "unknown_device";

/// Starts the acks connection with `options` and its event loop (tracked by `shutdown`,
/// ending when it is requested, or when `incoming` is closed).
pub fn start(
    options: MqttOptions,
    links: Arc<Links>,
    board: Arc<StatusBoard>,
    extras: Extras,
    stats: Arc<Stats>,
    incoming: mpsc::Sender<Incoming>,
    shutdown: Shutdown,
) {
    let (client, eventloop) = AsyncClient::new(options, REQUESTS);
    let Extras { owners, star } = extras;
    let read = Read { links, board, owners, star, stats, incoming };
    shutdown.spawn(drive(client, eventloop, read, shutdown.clone()));
}

/// Where what the acks connection reads goes.
struct Read {
    links: Arc<Links>,
    board: Arc<StatusBoard>,
    /// With CloudPRNT served in the central shape: the partitions' owner records.
    owners: Option<Arc<Owners>>,
    /// Star printers on CloudPRNT's MQTT method: what they publish.
    star: Option<Arc<dyn StarPrinters>>,
    stats: Arc<Stats>,
    incoming: mpsc::Sender<Incoming>,
}

/// How often the acks connection sums up the log lines its [`LogLimit`] held back.
const SUMMARY_EVERY: Duration = Duration::from_secs(5);

/// The acks connection's event loop: subscribes at each CONNACK, checks the SUBACK,
/// forwards each device message to `incoming` (waiting while it is full, so the broker's
/// further messages wait in the socket and the broker) and records statuses on `board`; a
/// malformed one is counted (`mqtt_refusals{rule="malformed_message"}`), logged within
/// [`LogLimit`]'s bounds and dropped; what the limit held back is summed up every
/// [`SUMMARY_EVERY`] by a task of its own, even when no message follows (the event loop's
/// `poll` is never cancelled for it).
/// rumqttc acknowledges a message (PUBACK) as it reads it, so an ack read and not yet
/// forwarded when pixgate dies is lost: its job is sent again after the ack timeout, and
/// the device dedupes and acks it again.
async fn drive(client: AsyncClient, mut eventloop: EventLoop, read: Read, shutdown: Shutdown) {
    let Read { links, board, owners, star, stats, incoming } = read;
    // Star printers told up to the CloudPRNT side, each at its first message through the
    // broker, until its will or until the registry no longer gives it the MAC alone:
    // device → the MAC it is heard under, and back.
    let mut star_up: HashMap<String, String> = HashMap::new();
    let mut star_macs: HashMap<String, String> = HashMap::new();
    let mut subscribed = vec![ALL_ACKS, ALL_STATUS];
    subscribed.extend(owners.is_some().then_some(OWNER_FILTER));
    subscribed.extend(star.is_some().then_some(star::ALL_TO_SERVER));
    let mut backoff = Backoff::default();
    let log_limit = Arc::new(LogLimit::default());
    let (summing, stop) = (log_limit.clone(), shutdown.clone());
    shutdown.spawn(async move {
        while !stop.sleep(SUMMARY_EVERY).await {
            summing.log_due();
        }
    });
    loop {
        let event = tokio::select! {
            _ = shutdown.requested() => return,
            event = eventloop.poll() => event,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(c))) if c.code == ConnectReturnCode::Success => {
                backoff.reset();
                let filters = subscribed.iter().map(|f| SubscribeFilter::new(f.to_string(), QoS::AtLeastOnce));
                // Queued to the event loop, which this task polls: never waits long.
                if client.subscribe_many(filters).await.is_err() {
                    return;
                }
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                if ack.return_codes.iter().all(|c| matches!(c, SubscribeReasonCode::Success(_))) {
                    tracing::info!(client_id = %eventloop.mqtt_options.client_id(), "acks connection to the devices' broker up, subscribed to every device's acks and status");
                    links.up(Which::Acks);
                } else {
                    let error = format!(
                        "the broker refused a subscription of {} (SUBACK {:?}): its ACL must let this client read them",
                        subscribed.join(", "),
                        ack.return_codes
                    );
                    tracing::error!("{error}");
                    links.down(Which::Acks, error);
                }
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if let Some(owners) = owners.as_ref().filter(|_| p.topic.starts_with("pixgate/v1/partitions/")) {
                    if let Err(e) = owners.record(&p.topic, &p.payload) {
                        stats.mqtt_refused(MALFORMED_MESSAGE);
                        tracing::warn!(rule = MALFORMED_MESSAGE, topic = %p.topic, error = %e, "a partition owner record dropped: not one");
                    }
                    continue;
                }
                if let Some((printers, (mac, method))) = star.as_ref().zip(star::to_server(&p.topic)) {
                    let found = printers.device_of(mac);
                    if let Some(was) = star_macs.get(mac).filter(|was| found.as_ref() != Some(*was)).cloned() {
                        // The registry took this MAC from it (or gave it to another too):
                        // its messages, its will included, no longer reach it.
                        star_macs.remove(mac);
                        star_up.remove(&was);
                        if printers.mac_of(&was).is_some() {
                            tracing::warn!(device = %was, mac, "a Star printer's MAC no longer names it alone in the registry: taken as offline");
                            printers.session(&was, false);
                        }
                    }
                    let Some(device) = found else {
                        stats.mqtt_refused(UNKNOWN_DEVICE);
                        if log_limit.admit(UNKNOWN_DEVICE, mac) {
                            tracing::warn!(rule = UNKNOWN_DEVICE, mac, topic = %p.topic, "message of a Star printer dropped: no printer on CloudPRNT's MQTT method has that MAC in the registry, or several have it");
                        }
                        continue;
                    };
                    if method != CLIENT_WILL {
                        match star_up.insert(device.clone(), mac.to_string()) {
                            None => printers.session(&device, true),
                            // The registry gave it a new MAC: the same session goes on.
                            Some(old) if old != mac => drop(star_macs.remove(&old)),
                            Some(_) => {}
                        }
                        star_macs.insert(mac.to_string(), device.clone());
                    }
                    if let Err(e) = printers.published(&device, method, &p.payload).await {
                        stats.mqtt_refused(MALFORMED_MESSAGE);
                        if log_limit.admit(MALFORMED_MESSAGE, &device) {
                            tracing::warn!(rule = MALFORMED_MESSAGE, %device, topic = %p.topic, error = %e, "Star printer message dropped: not what its topic carries");
                        }
                    }
                    if method == CLIENT_WILL && star_up.get(&device).is_some_and(|m| m == mac) {
                        star_up.remove(&device);
                        star_macs.remove(mac);
                        printers.session(&device, false);
                    }
                    continue;
                }
                let msg = match Incoming::parse(&p.topic, &p.payload) {
                    Ok(Some(msg)) => msg,
                    Ok(None) => continue,
                    Err(e) => {
                        stats.mqtt_refused(MALFORMED_MESSAGE);
                        let device = match Topic::parse(&p.topic) {
                            Some(Topic::Acks(d) | Topic::Status(d) | Topic::Jobs(d)) => d,
                            None => String::new(),
                        };
                        if log_limit.admit(MALFORMED_MESSAGE, &device) {
                            tracing::warn!(rule = MALFORMED_MESSAGE, %device, topic = %p.topic, error = %e, "device message dropped: not what its topic carries");
                        }
                        continue;
                    }
                };
                if let Incoming::Status { device, status } = &msg {
                    board.record(device, status);
                }
                if incoming.send(msg).await.is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(e) => {
                if links.failed(Which::Acks, e.to_string(), &mut backoff, &shutdown).await {
                    return;
                }
            }
        }
    }
}
