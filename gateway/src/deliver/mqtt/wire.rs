//! The two MQTT versions a device may speak, behind one packet model: MQTT 3.1.1 (level 4,
//! rumqttc's `mqttbytes::v4`) and MQTT 5 (level 5, rumqttc's `v5::mqttbytes::v5`),
//! negotiated per connection by the CONNECT's protocol level.
//!
//! What MQTT 5 adds for a device, and what pixgate does with it:
//! - reason codes: on CONNACK (MQTT 5 §3.2.2.2), SUBACK (§3.9.3), PUBACK (§3.4.2.1: 0x99
//!   "Payload format invalid" for an ack or status that is not the device protocol's), and a
//!   DISCONNECT from the server before it closes a connection for a reason
//!   (§3.14.2.1, [`Out::Disconnect`]);
//! - a job's `expires_at` as its PUBLISH's Message Expiry Interval (§3.3.2.3.3), and its
//!   message id, seq and kind as user properties (§3.3.2.3.7), with content type
//!   `application/json`;
//! - the CONNACK announces what the server takes: Maximum Packet Size
//!   (`mqtt.max_payload_bytes`), Receive Maximum, no retain, no wildcard, shared or
//!   identified subscriptions, no topic aliases, at most QoS 1 (§3.2.2.3);
//! - the device's own Maximum Packet Size is kept to: a job larger than it is not sent.

use bytes::{Bytes, BytesMut};
use rumqttc::mqttbytes::v4;
use rumqttc::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5;

/// The protocol a connection speaks, from its CONNECT's protocol level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// MQTT 3.1.1 (protocol level 4).
    V311,
    /// MQTT 5 (protocol level 5).
    V5,
}

/// How many QoS 1 and 2 PUBLISHes a device may have unacknowledged towards pixgate (the
/// CONNACK's Receive Maximum, MQTT 5 §3.2.2.3.3). Each is answered as it arrives.
pub const RECEIVE_MAXIMUM: u16 = 32;

/// The longest session a device may ask to be kept after it disconnects (the CONNECT's
/// Session Expiry Interval, MQTT 5 §3.1.2.11.2): a day, in seconds.
pub const MAX_SESSION_EXPIRY_S: u32 = 86_400;

/// The MQTT 5 CONNECT user property by which a device asks for its jobs' payloads as raw
/// bytes ([`RAW_PAYLOADS`] as its value): a pixgate extension.
pub const PAYLOAD_FORMAT_PROPERTY: &str = "pixgate-payload";

/// The value of [`PAYLOAD_FORMAT_PROPERTY`] that asks for raw payloads.
pub const RAW_PAYLOADS: &str = "raw";

/// A CONNECT, of either version.
#[derive(Debug)]
pub struct Connect {
    /// The client id.
    pub client_id: String,
    /// Username and password, if any.
    pub login: Option<v4::Login>,
    /// Seconds; 0: none.
    pub keep_alive: u16,
    /// Drop any earlier session of the client id (3.1.1's clean session, 5's clean start).
    pub clean_start: bool,
    /// How long the session outlives the connection, seconds, at most
    /// [`MAX_SESSION_EXPIRY_S`]: 3.1.1's clean session 0 keeps it that long, 1 not at all.
    pub session_expiry_s: u32,
    /// The will's topic and payload; the payload is a copy, so the session's read buffer
    /// it came in is not kept for the connection's life.
    pub will: Option<(String, Bytes)>,
    /// The largest packet the device takes (MQTT 5 §3.1.2.11.4); `None`: no limit.
    pub max_packet_size: Option<u32>,
    /// How many QoS 1 PUBLISHes the device takes unacknowledged (MQTT 5 §3.1.2.11.3);
    /// `None`: no limit stated (65,535 on MQTT 5, none on 3.1.1).
    pub receive_maximum: Option<u16>,
    /// The device asked for raw job payloads (MQTT 5 only: [`PAYLOAD_FORMAT_PROPERTY`]).
    pub raw_payloads: bool,
}

/// A packet a device sent.
#[derive(Debug)]
pub enum Packet {
    /// CONNECT.
    Connect(Connect),
    /// PUBLISH: topic, QoS, packet id, payload.
    Publish { topic: String, qos: QoS, pkid: u16, payload: Bytes },
    /// PUBACK, PUBREC, PUBCOMP: the device's answers to the jobs sent to it.
    Answer,
    /// PUBREL of a QoS 2 PUBLISH, by packet id.
    PubRel(u16),
    /// SUBSCRIBE: packet id, (filter, QoS) pairs.
    Subscribe { pkid: u16, filters: Vec<(String, QoS)> },
    /// UNSUBSCRIBE: packet id, filters.
    Unsubscribe { pkid: u16, filters: Vec<String> },
    /// PINGREQ.
    PingReq,
    /// DISCONNECT.
    Disconnect,
    /// A packet a client does not send to a server (CONNACK, SUBACK, UNSUBACK, PINGRESP),
    /// or MQTT 5's AUTH, which pixgate does not take: named.
    Unexpected(String),
}

/// Why a packet could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// More bytes are needed.
    Incomplete,
    /// Larger than the bound given.
    TooLarge(String),
    /// Not a valid packet of its version.
    Malformed(String),
}

/// A packet pixgate sends to a device.
#[derive(Debug)]
pub enum Out {
    /// CONNACK: the answer (3.1.1's codes; MQTT 5's counterpart is sent on a level-5
    /// connection) and whether a session was resumed.
    ConnAck { code: v4::ConnectReturnCode, session_present: bool, session_expiry_s: u32, max_packet: u32 },
    /// A job on `topic` ([`job_publish`] builds it).
    Job(Box<Job>),
    /// PUBACK; `payload_invalid`: on MQTT 5 with reason 0x99.
    PubAck { pkid: u16, payload_invalid: bool },
    /// PUBREC (QoS 2 received).
    PubRec(u16),
    /// PUBCOMP (QoS 2 released).
    PubComp(u16),
    /// SUBACK: the QoS granted per filter, `None` where refused (0x80; MQTT 5: 0x87 "Not
    /// authorized").
    SubAck { pkid: u16, granted: Vec<Option<QoS>> },
    /// UNSUBACK for `filters` filters.
    UnsubAck { pkid: u16, filters: usize },
    /// PINGRESP.
    PingResp,
    /// DISCONNECT with a reason code and a reason string (MQTT 5 only; nothing is written
    /// on 3.1.1). The reason string is also what makes clients that read a reason code only
    /// when properties follow it (paho-mqtt 2.1) see the code.
    Disconnect { reason: v5::DisconnectReasonCode, why: &'static str },
}

/// A job's PUBLISH.
#[derive(Debug, Clone)]
pub struct Job {
    /// `pixgate/v1/devices/{id}/jobs`.
    pub topic: String,
    /// At most [`QoS::AtLeastOnce`].
    pub qos: QoS,
    /// 0 at QoS 0.
    pub pkid: u16,
    /// The job's JSON, as stored.
    pub payload: Bytes,
    /// Sent as raw bytes with the job's fields as properties ([`Connect::raw_payloads`];
    /// MQTT 5 only, ignored on 3.1.1).
    pub raw: bool,
}

impl Version {
    /// Reads the next packet from `buf` (consumed only when whole), of at most `max` bytes.
    ///
    /// # Errors
    /// [`ReadError`].
    pub fn read(self, buf: &mut BytesMut, max: usize) -> Result<Packet, ReadError> {
        match self {
            Version::V311 => read_v4(buf, max),
            Version::V5 => read_v5(buf, max),
        }
    }

    /// Appends `out` to `buf` (nothing for a DISCONNECT on 3.1.1).
    ///
    /// # Errors
    /// The codec refused the packet (a field over its size).
    pub fn write(self, out: &Out, buf: &mut BytesMut) -> Result<(), String> {
        let written = match self {
            Version::V311 => v4_packet(out).map(|p| p.write(buf, usize::MAX).map(drop).map_err(|e| e.to_string())),
            Version::V5 => Some(v5_packet(out).write(buf, None).map(drop).map_err(|e| e.to_string())),
        };
        written.unwrap_or(Ok(()))
    }
}

fn read_v4(buf: &mut BytesMut, max: usize) -> Result<Packet, ReadError> {
    use v4::Packet as P;
    let p = v4::Packet::read(buf, max).map_err(|e| match e {
        rumqttc::mqttbytes::Error::InsufficientBytes(_) => ReadError::Incomplete,
        e @ rumqttc::mqttbytes::Error::PayloadSizeLimitExceeded(_) => ReadError::TooLarge(e.to_string()),
        e => ReadError::Malformed(e.to_string()),
    })?;
    Ok(match p {
        P::Connect(c) => Packet::Connect(Connect {
            session_expiry_s: if c.clean_session { 0 } else { MAX_SESSION_EXPIRY_S },
            clean_start: c.clean_session,
            client_id: c.client_id,
            login: c.login,
            keep_alive: c.keep_alive,
            will: c.last_will.map(|w| (w.topic, Bytes::copy_from_slice(&w.message))),
            max_packet_size: None,
            receive_maximum: None,
            raw_payloads: false,
        }),
        P::Publish(p) => Packet::Publish { topic: p.topic, qos: p.qos, pkid: p.pkid, payload: p.payload },
        P::PubAck(_) | P::PubRec(_) | P::PubComp(_) => Packet::Answer,
        P::PubRel(r) => Packet::PubRel(r.pkid),
        P::Subscribe(s) => {
            Packet::Subscribe { pkid: s.pkid, filters: s.filters.into_iter().map(|f| (f.path, f.qos)).collect() }
        }
        P::Unsubscribe(u) => Packet::Unsubscribe { pkid: u.pkid, filters: u.topics },
        P::PingReq => Packet::PingReq,
        P::Disconnect => Packet::Disconnect,
        other @ (P::ConnAck(_) | P::SubAck(_) | P::UnsubAck(_) | P::PingResp) => {
            Packet::Unexpected(format!("{other:?}"))
        }
    })
}

fn read_v5(buf: &mut BytesMut, max: usize) -> Result<Packet, ReadError> {
    use v5::Packet as P;
    // A DISCONNECT of remaining length 0 is reason 0x00 with no properties (MQTT 5
    // §3.14.2.1), which rumqttc 0.25's codec refuses.
    if buf.starts_with(&[0xE0, 0x00]) {
        let _ = buf.split_to(2);
        return Ok(Packet::Disconnect);
    }
    let p = v5::Packet::read(buf, Some(u32::try_from(max).unwrap_or(u32::MAX))).map_err(|e| match e {
        rumqttc::v5::mqttbytes::Error::InsufficientBytes(_) => ReadError::Incomplete,
        e @ rumqttc::v5::mqttbytes::Error::PayloadSizeLimitExceeded { .. } => ReadError::TooLarge(e.to_string()),
        e => ReadError::Malformed(e.to_string()),
    })?;
    Ok(match p {
        P::Connect(c, will, login) => {
            let props = c.properties.unwrap_or_default();
            Packet::Connect(Connect {
                client_id: c.client_id,
                login: login.map(|l| v4::Login { username: l.username, password: l.password }),
                keep_alive: c.keep_alive,
                clean_start: c.clean_start,
                session_expiry_s: props.session_expiry_interval.unwrap_or(0).min(MAX_SESSION_EXPIRY_S),
                will: will
                    .map(|w| (String::from_utf8_lossy(&w.topic).into_owned(), Bytes::copy_from_slice(&w.message))),
                max_packet_size: props.max_packet_size,
                receive_maximum: props.receive_maximum,
                raw_payloads: props
                    .user_properties
                    .iter()
                    .any(|(k, v)| k == PAYLOAD_FORMAT_PROPERTY && v == RAW_PAYLOADS),
            })
        }
        P::Publish(p) => Packet::Publish {
            topic: String::from_utf8_lossy(&p.topic).into_owned(),
            qos: from_v5(p.qos),
            pkid: p.pkid,
            payload: p.payload,
        },
        P::PubAck(_) | P::PubRec(_) | P::PubComp(_) => Packet::Answer,
        P::PubRel(r) => Packet::PubRel(r.pkid),
        P::Subscribe(s) => Packet::Subscribe {
            pkid: s.pkid,
            filters: s.filters.into_iter().map(|f| (f.path, from_v5(f.qos))).collect(),
        },
        P::Unsubscribe(u) => Packet::Unsubscribe { pkid: u.pkid, filters: u.filters },
        P::PingReq(_) => Packet::PingReq,
        P::Disconnect(_) => Packet::Disconnect,
        other @ (P::Auth(_) | P::ConnAck(_) | P::SubAck(_) | P::UnsubAck(_) | P::PingResp(_)) => {
            Packet::Unexpected(format!("{other:?}"))
        }
    })
}

fn v4_packet(out: &Out) -> Option<v4::Packet> {
    use v4::Packet as P;
    Some(match out {
        Out::ConnAck { code, session_present, .. } => {
            P::ConnAck(v4::ConnAck { session_present: *session_present, code: *code })
        }
        Out::Job(j) => {
            let mut p = v4::Publish::from_bytes(j.topic.clone(), j.qos, j.payload.clone());
            p.pkid = j.pkid;
            P::Publish(p)
        }
        Out::PubAck { pkid, .. } => P::PubAck(v4::PubAck::new(*pkid)),
        Out::PubRec(pkid) => P::PubRec(v4::PubRec::new(*pkid)),
        Out::PubComp(pkid) => P::PubComp(v4::PubComp::new(*pkid)),
        Out::SubAck { pkid, granted } => P::SubAck(v4::SubAck::new(
            *pkid,
            granted
                .iter()
                .map(|g| g.map_or(v4::SubscribeReasonCode::Failure, v4::SubscribeReasonCode::Success))
                .collect(),
        )),
        Out::UnsubAck { pkid, .. } => P::UnsubAck(v4::UnsubAck::new(*pkid)),
        Out::PingResp => P::PingResp,
        Out::Disconnect { .. } => return None,
    })
}

fn v5_packet(out: &Out) -> v5::Packet {
    use v5::Packet as P;
    match out {
        Out::ConnAck { code, session_present, session_expiry_s, max_packet } => P::ConnAck(v5::ConnAck {
            session_present: *session_present,
            code: v5_code(*code),
            properties: (*code == v4::ConnectReturnCode::Success).then(|| v5::ConnAckProperties {
                session_expiry_interval: Some(*session_expiry_s),
                receive_max: Some(RECEIVE_MAXIMUM),
                max_qos: Some(1),
                retain_available: Some(0),
                max_packet_size: Some(*max_packet),
                assigned_client_identifier: None,
                topic_alias_max: Some(0),
                reason_string: None,
                user_properties: Vec::new(),
                wildcard_subscription_available: Some(0),
                subscription_identifiers_available: Some(0),
                shared_subscription_available: Some(0),
                server_keep_alive: None,
                response_information: None,
                server_reference: None,
                authentication_method: None,
                authentication_data: None,
            }),
        }),
        Out::Job(j) => {
            let (payload, props) = match j.raw.then(|| raw_job(&j.payload)).flatten() {
                Some(raw) => raw,
                None => (j.payload.clone(), job_properties(&j.payload)),
            };
            let mut p = v5::Publish::new(j.topic.as_str(), to_v5(j.qos), payload, Some(props));
            p.pkid = j.pkid;
            P::Publish(p)
        }
        Out::PubAck { pkid, payload_invalid } => {
            let mut ack = v5::PubAck::new(*pkid, None);
            if *payload_invalid {
                ack.reason = v5::PubAckReason::PayloadFormatInvalid;
            }
            P::PubAck(ack)
        }
        Out::PubRec(pkid) => P::PubRec(v5::PubRec::new(*pkid, None)),
        Out::PubComp(pkid) => P::PubComp(v5::PubComp::new(*pkid, None)),
        Out::SubAck { pkid, granted } => P::SubAck(v5::SubAck {
            pkid: *pkid,
            return_codes: granted
                .iter()
                .map(|g| {
                    g.map_or(v5::SubscribeReasonCode::NotAuthorized, |q| v5::SubscribeReasonCode::Success(to_v5(q)))
                })
                .collect(),
            properties: None,
        }),
        Out::UnsubAck { pkid, filters } => P::UnsubAck(v5::UnsubAck {
            pkid: *pkid,
            reasons: vec![v5::UnsubAckReason::Success; *filters],
            properties: None,
        }),
        Out::PingResp => P::PingResp(v5::PingResp),
        Out::Disconnect { reason, why } => P::Disconnect(v5::Disconnect {
            reason_code: *reason,
            properties: Some(v5::DisconnectProperties {
                session_expiry_interval: None,
                reason_string: Some((*why).to_string()),
                user_properties: Vec::new(),
                server_reference: None,
            }),
        }),
    }
}

fn from_v5(q: rumqttc::v5::mqttbytes::QoS) -> QoS {
    match q {
        rumqttc::v5::mqttbytes::QoS::AtMostOnce => QoS::AtMostOnce,
        rumqttc::v5::mqttbytes::QoS::AtLeastOnce => QoS::AtLeastOnce,
        rumqttc::v5::mqttbytes::QoS::ExactlyOnce => QoS::ExactlyOnce,
    }
}

fn to_v5(q: QoS) -> rumqttc::v5::mqttbytes::QoS {
    match q {
        QoS::AtMostOnce => rumqttc::v5::mqttbytes::QoS::AtMostOnce,
        QoS::AtLeastOnce => rumqttc::v5::mqttbytes::QoS::AtLeastOnce,
        QoS::ExactlyOnce => rumqttc::v5::mqttbytes::QoS::ExactlyOnce,
    }
}

/// MQTT 5's reason code for a 3.1.1 CONNACK return code (MQTT 5 §3.2.2.2).
fn v5_code(code: v4::ConnectReturnCode) -> v5::ConnectReturnCode {
    use v4::ConnectReturnCode as C;
    use v5::ConnectReturnCode as R;
    match code {
        C::Success => R::Success,
        C::RefusedProtocolVersion => R::UnsupportedProtocolVersion,
        C::BadClientId => R::ClientIdentifierNotValid,
        C::ServiceUnavailable => R::ServerUnavailable,
        C::BadUserNamePassword => R::BadUserNamePassword,
        C::NotAuthorized => R::NotAuthorized,
    }
}

/// The fields of a job's JSON its MQTT 5 properties come from.
#[derive(serde::Deserialize)]
struct JobHeader {
    message_id: String,
    seq: u64,
    kind: String,
    #[serde(default)]
    expires_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// A job's PUBLISH properties: content type, its time to live as the Message Expiry
/// Interval (whole seconds, at least 1), and its message id, seq and kind as user
/// properties. Empty but for the content type if the job cannot be read.
fn job_properties(payload: &[u8]) -> v5::PublishProperties {
    let mut props = v5::PublishProperties {
        content_type: Some("application/json".into()),
        payload_format_indicator: Some(1),
        ..v5::PublishProperties::default()
    };
    if let Ok(h) = serde_json::from_slice::<JobHeader>(payload) {
        props.message_expiry_interval = h.expires_at.map(expiry_s);
        props.user_properties =
            vec![("message_id".into(), h.message_id), ("seq".into(), h.seq.to_string()), ("kind".into(), h.kind)];
    }
    props
}

/// A job as raw bytes for a device that asked for them: its decoded payload, its content
/// type as the Content Type property, payload format indicator 0 (bytes), its time to live
/// as the Message Expiry Interval, and `v`, `message_id`, `seq`, `kind`, `event_id`,
/// `charge_id` and `expires_at` (RFC 3339, when it has one) as user properties. `None` if
/// the stored JSON is not a job or its payload is not base64 (it is then sent as JSON).
fn raw_job(json: &[u8]) -> Option<(Bytes, v5::PublishProperties)> {
    let job: device_protocol::Job = serde_json::from_slice(json).ok()?;
    let payload = Bytes::from(job.payload_bytes().ok()?);
    let mut user_properties = vec![
        ("v".to_string(), job.v.to_string()),
        ("message_id".into(), job.message_id),
        ("seq".into(), job.seq.to_string()),
        ("kind".into(), job.kind.as_str().to_string()),
        ("event_id".into(), job.event_id),
        ("charge_id".into(), job.charge_id),
    ];
    if let Some(at) = job.expires_at {
        user_properties.push(("expires_at".into(), at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)));
    }
    let props = v5::PublishProperties {
        content_type: Some(job.content_type),
        payload_format_indicator: Some(0),
        message_expiry_interval: job.expires_at.map(expiry_s),
        user_properties,
        ..v5::PublishProperties::default()
    };
    Some((payload, props))
}

/// Seconds from now to `at`, rounded up, at least 1 (MQTT 5 §3.3.2.3.3: 0 is not "expired").
fn expiry_s(at: chrono::DateTime<chrono::Utc>) -> u32 {
    let ms = (at - chrono::Utc::now()).num_milliseconds().max(1);
    u32::try_from((ms + 999) / 1000).unwrap_or(u32::MAX)
}

/// The size of `out` on the wire in `version`.
pub fn size(version: Version, out: &Out) -> usize {
    let mut buf = BytesMut::new();
    let _ = version.write(out, &mut buf);
    buf.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job written for MQTT 5 reads back with its properties, through rumqttc's own
    /// decoder: what the device's client library sees.
    #[test]
    fn a_v5_job_carries_its_expiry_and_ids() {
        let at = chrono::Utc::now() + chrono::Duration::seconds(90);
        let json = format!(
            r#"{{"v":1,"message_id":"m1","seq":7,"kind":"display_qr","event_id":"e","charge_id":"c","content_type":"x","payload":"","expires_at":"{}"}}"#,
            at.to_rfc3339()
        );
        let job = Out::Job(Box::new(Job {
            topic: "pixgate/v1/devices/d/jobs".into(),
            qos: QoS::AtLeastOnce,
            pkid: 3,
            payload: Bytes::from(json),
            raw: false,
        }));
        let mut buf = BytesMut::new();
        Version::V5.write(&job, &mut buf).unwrap();
        let v5::Packet::Publish(p) = v5::Packet::read(&mut buf, None).unwrap() else { panic!("a PUBLISH") };
        assert_eq!((p.pkid, from_v5(p.qos)), (3, QoS::AtLeastOnce));
        let props = p.properties.unwrap();
        let expiry = props.message_expiry_interval.unwrap();
        assert!((89..=90).contains(&expiry), "{expiry}");
        assert_eq!(props.content_type.as_deref(), Some("application/json"));
        assert!(props.user_properties.contains(&("message_id".into(), "m1".into())));
        assert!(props.user_properties.contains(&("seq".into(), "7".into())));
    }

    /// A job for a device that asked for raw payloads: the payload's bytes as they are, the
    /// job's fields as properties, read back through rumqttc's decoder. On 3.1.1 the same
    /// job stays JSON, and a stored row that is not a job goes out as it is.
    #[test]
    fn a_raw_job_is_its_bytes_with_its_fields_as_properties() {
        let receipt: Vec<u8> = [b"\x1b@".as_slice(), &[0x1d, 0x76, 0x30, 0], &(0u8..=255).collect::<Vec<_>>()].concat();
        let job = device_protocol::Job {
            v: 1,
            message_id: "m1".into(),
            seq: 7,
            kind: device_protocol::EffectKind::PrintReceipt,
            event_id: "e".into(),
            charge_id: "c".into(),
            content_type: "application/vnd.escpos".into(),
            payload: device_protocol::Job::encode_payload(&receipt),
            expires_at: Some(chrono::Utc::now() + chrono::Duration::seconds(90)),
        };
        let json = Bytes::from(job.to_json());
        let out = |payload: Bytes| {
            Out::Job(Box::new(Job {
                topic: "pixgate/v1/devices/d/jobs".into(),
                qos: QoS::AtLeastOnce,
                pkid: 3,
                payload,
                raw: true,
            }))
        };
        let mut buf = BytesMut::new();
        Version::V5.write(&out(json.clone()), &mut buf).unwrap();
        let v5::Packet::Publish(p) = v5::Packet::read(&mut buf, None).unwrap() else { panic!("a PUBLISH") };
        assert_eq!(p.payload.as_ref(), receipt.as_slice(), "the receipt's bytes, not base64");
        let props = p.properties.unwrap();
        assert_eq!(props.content_type.as_deref(), Some("application/vnd.escpos"));
        assert_eq!(props.payload_format_indicator, Some(0));
        assert!((89..=90).contains(&props.message_expiry_interval.unwrap()));
        let user: std::collections::HashMap<_, _> = props.user_properties.into_iter().collect();
        for (k, v) in [
            ("v", "1"),
            ("message_id", "m1"),
            ("seq", "7"),
            ("kind", "print_receipt"),
            ("event_id", "e"),
            ("charge_id", "c"),
        ] {
            assert_eq!(user.get(k).map(String::as_str), Some(v), "{k}");
        }
        let at = chrono::DateTime::parse_from_rfc3339(&user["expires_at"]).unwrap();
        assert!((at.timestamp_millis() - job.expires_at.unwrap().timestamp_millis()).abs() <= 1);

        let mut buf = BytesMut::new();
        Version::V311.write(&out(json.clone()), &mut buf).unwrap();
        let v4::Packet::Publish(p) = v4::Packet::read(&mut buf, usize::MAX).unwrap() else { panic!("a PUBLISH") };
        assert_eq!(p.payload, json, "3.1.1 has no properties: JSON");
        let mut buf = BytesMut::new();
        Version::V5.write(&out(Bytes::from_static(b"not a job")), &mut buf).unwrap();
        let v5::Packet::Publish(p) = v5::Packet::read(&mut buf, None).unwrap() else { panic!("a PUBLISH") };
        assert_eq!(p.payload.as_ref(), b"not a job");
    }

    /// A refused CONNACK and SUBACK carry MQTT 5's reason codes on a level-5 connection;
    /// a DISCONNECT is written on MQTT 5 alone.
    #[test]
    fn reason_codes_follow_the_version() {
        let refused = Out::ConnAck {
            code: v4::ConnectReturnCode::NotAuthorized,
            session_present: false,
            session_expiry_s: 0,
            max_packet: 1,
        };
        let mut buf = BytesMut::new();
        Version::V5.write(&refused, &mut buf).unwrap();
        assert_eq!(&buf[..], &[0x20, 0x03, 0x00, 0x87, 0x00], "CONNACK 0x87 Not authorized, no properties");
        let mut buf = BytesMut::new();
        Version::V311.write(&refused, &mut buf).unwrap();
        assert_eq!(&buf[..], &[0x20, 0x02, 0x00, 0x05]);
        let suback = Out::SubAck { pkid: 9, granted: vec![Some(QoS::AtLeastOnce), None] };
        let mut buf = BytesMut::new();
        Version::V5.write(&suback, &mut buf).unwrap();
        assert_eq!(&buf[..], &[0x90, 0x05, 0x00, 0x09, 0x00, 0x01, 0x87]);
        let bye = Out::Disconnect { reason: v5::DisconnectReasonCode::MessageRateTooHigh, why: "rate" };
        let mut buf = BytesMut::new();
        Version::V311.write(&bye, &mut buf).unwrap();
        assert!(buf.is_empty());
        Version::V5.write(&bye, &mut buf).unwrap();
        // Reason 0x96, then properties (7 bytes): Reason String (0x1F), length 4, "rate".
        assert_eq!(&buf[..], &[0xE0, 0x09, 0x96, 0x07, 0x1F, 0x00, 0x04, b'r', b'a', b't', b'e']);
    }

    /// A bare DISCONNECT (remaining length 0) is MQTT 5's normal disconnection.
    #[test]
    fn a_bare_v5_disconnect_reads() {
        let mut buf = BytesMut::from(&[0xE0u8, 0x00, 0xC0][..]);
        assert!(matches!(Version::V5.read(&mut buf, 1024), Ok(Packet::Disconnect)));
        assert!(matches!(Version::V5.read(&mut buf, 1024), Err(ReadError::Incomplete)));
    }
}
