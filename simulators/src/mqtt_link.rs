//! A simulated device's MQTT connection in either version the gateway speaks: MQTT 3.1.1
//! (rumqttc's client) or MQTT 5 (rumqttc's `v5` client), as [`Protocol`] says. The device
//! ([`crate::device`]) sees one [`Client`] and one stream of [`LinkEvent`]s.
//!
//! Both keep a session across connections: 3.1.1's clean session 0; MQTT 5's clean start 0
//! with a Session Expiry Interval of a day (what the gateway keeps at most). Publishes and
//! the jobs subscription are QoS 1, and the device acks the jobs it receives itself
//! (manual acks).

use rumqttc::v5 as r5;
use rumqttc::v5::mqttbytes::v5 as p5;
use rumqttc::{Outgoing, Transport};
use std::time::Duration;

/// The MQTT version a simulated device speaks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protocol {
    /// MQTT 3.1.1 (protocol level 4).
    #[default]
    V311,
    /// MQTT 5 (protocol level 5).
    V5,
}

impl std::str::FromStr for Protocol {
    type Err = String;

    /// `3.1.1` (or `4`), `5`.
    fn from_str(s: &str) -> Result<Protocol, String> {
        match s {
            "3.1.1" | "4" => Ok(Protocol::V311),
            "5" => Ok(Protocol::V5),
            other => Err(format!("MQTT version `{other}`: 3.1.1 or 5")),
        }
    }
}

/// The session a device's MQTT 5 connection asks to be kept for, seconds: a day.
pub const SESSION_EXPIRY_S: u32 = 86_400;

/// What a connection is made with.
pub struct Settings {
    /// `dev-{id}`.
    pub client_id: String,
    /// Broker host.
    pub host: String,
    /// Broker port.
    pub port: u16,
    /// Keep-alive.
    pub keep_alive: Duration,
    /// The will's topic and payload (QoS 1, retained).
    pub will: (String, Vec<u8>),
    /// Largest packet, both ways, bytes.
    pub max_packet: usize,
    /// TLS, or plain TCP (`None`).
    pub transport: Option<Transport>,
    /// MQTT username and password, if any.
    pub credentials: Option<(String, String)>,
    /// Seconds to wait for the TCP and TLS connection.
    pub connection_timeout_s: u64,
}

/// The client half: requests to the connection.
#[derive(Clone)]
pub enum Client {
    /// MQTT 3.1.1.
    V311(rumqttc::AsyncClient),
    /// MQTT 5.
    V5(r5::AsyncClient),
}

/// The connection half, polled by the device's poll task.
pub enum Link {
    /// MQTT 3.1.1.
    V311(Box<rumqttc::EventLoop>),
    /// MQTT 5.
    V5(Box<r5::EventLoop>),
}

/// A PUBLISH received (kept whole, to be acked).
#[derive(Debug, Clone)]
pub enum Incoming {
    /// MQTT 3.1.1.
    V311(rumqttc::Publish),
    /// MQTT 5.
    V5(p5::Publish),
}

/// What the connection did.
#[derive(Debug)]
pub enum LinkEvent {
    /// CONNACK.
    ConnAck {
        /// The connection was accepted.
        accepted: bool,
        /// The return or reason code, as the version names it.
        code: String,
        /// The session was resumed.
        session_present: bool,
    },
    /// SUBACK.
    SubAck,
    /// A PUBLISH to the device.
    Publish(Incoming),
    /// A PUBACK of the device's own QoS 1 PUBLISH.
    PubAck,
    /// The device's DISCONNECT went out.
    Disconnected,
    /// Anything else.
    Other,
}

/// A request the connection can no longer take (it stopped).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Closed(String);

/// Makes the client and the connection (the connection is opened by the first poll);
/// requests queue up to `cap`.
pub fn new(protocol: Protocol, s: Settings, cap: usize) -> (Client, Link) {
    match protocol {
        Protocol::V311 => {
            let mut mo = rumqttc::MqttOptions::new(s.client_id, s.host, s.port);
            mo.set_clean_session(false)
                .set_keep_alive(s.keep_alive)
                .set_last_will(rumqttc::LastWill::new(s.will.0, s.will.1, rumqttc::QoS::AtLeastOnce, true))
                .set_max_packet_size(s.max_packet, s.max_packet)
                .set_manual_acks(true);
            if let Some(t) = s.transport {
                mo.set_transport(t);
            }
            if let Some((user, pass)) = s.credentials {
                mo.set_credentials(user, pass);
            }
            let (client, mut eventloop) = rumqttc::AsyncClient::new(mo, cap);
            let mut net = eventloop.network_options();
            net.set_connection_timeout(s.connection_timeout_s);
            eventloop.set_network_options(net);
            (Client::V311(client), Link::V311(Box::new(eventloop)))
        }
        Protocol::V5 => {
            let mut mo = r5::MqttOptions::new(s.client_id, s.host, s.port);
            let max = u32::try_from(s.max_packet).unwrap_or(u32::MAX);
            mo.set_clean_start(false)
                .set_session_expiry_interval(Some(SESSION_EXPIRY_S))
                .set_keep_alive(s.keep_alive)
                .set_last_will(p5::LastWill::new(s.will.0, s.will.1, qos5(), true, None))
                .set_max_packet_size(Some(max))
                .set_manual_acks(true)
                .set_connection_timeout(s.connection_timeout_s);
            if let Some(t) = s.transport {
                mo.set_transport(t);
            }
            if let Some((user, pass)) = s.credentials {
                mo.set_credentials(user, pass);
            }
            let (client, eventloop) = r5::AsyncClient::new(mo, cap);
            (Client::V5(client), Link::V5(Box::new(eventloop)))
        }
    }
}

fn qos5() -> rumqttc::v5::mqttbytes::QoS {
    rumqttc::v5::mqttbytes::QoS::AtLeastOnce
}

impl Client {
    /// Queues a QoS 1 PUBLISH.
    ///
    /// # Errors
    /// The connection stopped.
    pub async fn publish(&self, topic: String, retain: bool, payload: Vec<u8>) -> Result<(), Closed> {
        match self {
            Client::V311(c) => c.publish(topic, rumqttc::QoS::AtLeastOnce, retain, payload).await.map_err(closed),
            Client::V5(c) => c.publish(topic, qos5(), retain, payload).await.map_err(closed),
        }
    }

    /// Queues a SUBSCRIBE to `topic` at QoS 1.
    ///
    /// # Errors
    /// The connection stopped.
    pub async fn subscribe(&self, topic: String) -> Result<(), Closed> {
        match self {
            Client::V311(c) => c.subscribe(topic, rumqttc::QoS::AtLeastOnce).await.map_err(closed),
            Client::V5(c) => c.subscribe(topic, qos5()).await.map_err(closed),
        }
    }

    /// Acks `publish` (PUBACK).
    ///
    /// # Errors
    /// The connection stopped.
    pub async fn ack(&self, publish: &Incoming) -> Result<(), Closed> {
        match (self, publish) {
            (Client::V311(c), Incoming::V311(p)) => c.ack(p).await.map_err(closed),
            (Client::V5(c), Incoming::V5(p)) => c.ack(p).await.map_err(closed),
            _ => Ok(()),
        }
    }

    /// [`Client::ack`] without waiting for room in the request queue (dropped if full).
    pub fn try_ack(&self, publish: &Incoming) {
        let _ = match (self, publish) {
            (Client::V311(c), Incoming::V311(p)) => c.try_ack(p).map_err(closed),
            (Client::V5(c), Incoming::V5(p)) => c.try_ack(p).map_err(closed),
            _ => Ok(()),
        };
    }

    /// Queues a DISCONNECT.
    ///
    /// # Errors
    /// The connection stopped.
    pub async fn disconnect(&self) -> Result<(), Closed> {
        match self {
            Client::V311(c) => c.disconnect().await.map_err(closed),
            Client::V5(c) => c.disconnect().await.map_err(closed),
        }
    }
}

fn closed(e: impl std::fmt::Display) -> Closed {
    Closed(e.to_string())
}

impl Incoming {
    /// The topic.
    pub fn topic(&self) -> String {
        match self {
            Incoming::V311(p) => p.topic.clone(),
            Incoming::V5(p) => String::from_utf8_lossy(&p.topic).into_owned(),
        }
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        match self {
            Incoming::V311(p) => &p.payload,
            Incoming::V5(p) => &p.payload,
        }
    }
}

impl Link {
    /// The next event (connecting first when not connected).
    ///
    /// # Errors
    /// The connection failed or was refused (rumqttc's words); the next poll reconnects.
    pub async fn poll(&mut self) -> Result<LinkEvent, String> {
        match self {
            Link::V311(l) => {
                use rumqttc::{Event, Packet};
                Ok(match l.poll().await.map_err(|e| e.to_string())? {
                    Event::Incoming(Packet::ConnAck(a)) => LinkEvent::ConnAck {
                        accepted: a.code == rumqttc::ConnectReturnCode::Success,
                        code: format!("{:?}", a.code),
                        session_present: a.session_present,
                    },
                    Event::Incoming(Packet::SubAck(_)) => LinkEvent::SubAck,
                    Event::Incoming(Packet::Publish(p)) => LinkEvent::Publish(Incoming::V311(p)),
                    Event::Incoming(Packet::PubAck(_)) => LinkEvent::PubAck,
                    Event::Outgoing(Outgoing::Disconnect) => LinkEvent::Disconnected,
                    _ => LinkEvent::Other,
                })
            }
            Link::V5(l) => {
                use p5::Packet;
                use r5::Event;
                Ok(match l.poll().await.map_err(|e| e.to_string())? {
                    Event::Incoming(Packet::ConnAck(a)) => LinkEvent::ConnAck {
                        accepted: a.code == p5::ConnectReturnCode::Success,
                        code: format!("{:?}", a.code),
                        session_present: a.session_present,
                    },
                    Event::Incoming(Packet::SubAck(_)) => LinkEvent::SubAck,
                    Event::Incoming(Packet::Publish(p)) => LinkEvent::Publish(Incoming::V5(p)),
                    Event::Incoming(Packet::PubAck(_)) => LinkEvent::PubAck,
                    Event::Outgoing(Outgoing::Disconnect) => LinkEvent::Disconnected,
                    _ => LinkEvent::Other,
                })
            }
        }
    }

    /// Drops the connection without DISCONNECT; the next poll connects again.
    pub fn clean(&mut self) {
        match self {
            Link::V311(l) => l.clean(),
            Link::V5(l) => l.clean(),
        }
    }
}
