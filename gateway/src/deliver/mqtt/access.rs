//! The per-device access policy: a device reaches only its own topics.
//!
//! Like AWS IoT Core's `${iot:ClientId}` policies or mosquitto's `pattern readwrite
//! pixgate/v1/devices/%c/...`, everything follows from the authenticated device id:
//!
//! | what | allowed | anything else |
//! |---|---|---|
//! | client id | `dev-{id}`, or `dev-{id}.{tag}` for a device's second connection | CONNACK 2 (identifier rejected) |
//! | SUBSCRIBE filter | `pixgate/v1/devices/{id}/jobs`, exactly (no wildcard) | SUBACK 0x80 for that filter |
//! | PUBLISH topic | `pixgate/v1/devices/{id}/acks`, `.../{id}/status` | dropped, connection closed |
//! | will topic | `pixgate/v1/devices/{id}/status` | CONNACK 5 (not authorized) |
//!
//! The rules are pure functions so that they are tested on their own; the session
//! (`super::session`) applies them to every packet, and [`Rule`] names each refusal in
//! the log and on `/metrics` (`pixgate_mqtt_refusals_total{rule}`).

use device_protocol::Topic;

/// The prefix of every device's MQTT client id (`dev-{id}`).
pub const CLIENT_ID_PREFIX: &str = "dev-";

/// Longest device id accepted, characters (registry ids are 24 hex characters).
pub const MAX_ID_LEN: usize = 64;

/// The device id a client id names, if it is `dev-{id}` with an id of 1 to
/// [`MAX_ID_LEN`] ASCII letters, digits, `-` or `_` (no topic separators or wildcards),
/// or `dev-{id}.{tag}` with a tag of the same kind: a second connection of the same
/// device (a tool that can only publish or only subscribe, such as mosquitto's clients),
/// with a session of its own and the same access as the device.
pub fn device_of_client_id(client_id: &str) -> Option<&str> {
    let rest = client_id.strip_prefix(CLIENT_ID_PREFIX)?;
    let (id, tag) = match rest.split_once('.') {
        Some((id, tag)) => (id, Some(tag)),
        None => (rest, None),
    };
    (valid_id(id) && tag.is_none_or(valid_id)).then_some(id)
}

/// Whether `id` can be a device id (see [`device_of_client_id`]).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Whether `device` may subscribe to `filter`: its own jobs topic only.
pub fn may_subscribe(device: &str, filter: &str) -> bool {
    Topic::parse(filter) == Some(Topic::Jobs(device.to_string()))
}

/// Whether `device` may publish on `topic`: its own acks and status only.
pub fn may_publish(device: &str, topic: &[u8]) -> bool {
    let Ok(topic) = std::str::from_utf8(topic) else { return false };
    matches!(Topic::parse(topic), Some(Topic::Acks(d) | Topic::Status(d)) if d == device)
}

/// Whether `device` may leave a will on `topic`: its own status only.
pub fn may_will(device: &str, topic: &[u8]) -> bool {
    let Ok(topic) = std::str::from_utf8(topic) else { return false };
    Topic::parse(topic) == Some(Topic::Status(device.to_string()))
}

/// Why a device or a socket was refused: the `rule` field of the log line and the label on
/// `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// The first packet was not a valid CONNECT (a protocol name other than `MQTT` or
    /// MQTT 3.1's `MQIsdp` included): closed without a CONNACK.
    Malformed,
    /// A CONNECT of a protocol level pixgate does not speak (it speaks 4, MQTT 3.1.1, and
    /// 5): CONNACK 1 below them (MQTT 3.1.1 §3.1.2.2), a CONNACK in MQTT 5's layout with
    /// reason code 0x84 "Unsupported Protocol Version" above (MQTT 5 §3.1.2.2), then closed.
    ProtocolVersion,
    /// No CONNECT (or no TLS handshake) within `mqtt.connect_timeout_ms`.
    ConnectTimeout,
    /// The TLS handshake failed: a certificate the fleet CA did not sign, revoked or
    /// expired, or no TLS at all. (No certificate is not a failure: the device may use its
    /// secret; without one it is refused at CONNECT, [`Rule::NoCredentials`].)
    TlsHandshake,
    /// `mqtt.max_handshakes_per_address` sockets from this address were already being set
    /// up.
    HandshakesPerAddress,
    /// `mqtt.max_per_address` connections from this address already.
    PerAddress,
    /// `mqtt.max_connections` devices connected already: CONNACK 3.
    Capacity,
    /// The client id is not `dev-{id}`: CONNACK 2.
    ClientId,
    /// No credential: neither a client certificate nor a password (CONNACK 5).
    NoCredentials,
    /// A wrong secret, or a secret over plain TCP: CONNACK 5.
    BadCredentials,
    /// The client id names another device than the certificate or username: CONNACK 5.
    IdentityMismatch,
    /// The registry does not know the device (or it was removed): CONNACK 5, or
    /// disconnected.
    UnknownDevice,
    /// The registry has the device disabled: CONNACK 5, or disconnected.
    DisabledDevice,
    /// A will on a topic that is not the device's status: CONNACK 5.
    Will,
    /// A SUBSCRIBE filter other than the device's jobs topic: SUBACK 0x80.
    Subscribe,
    /// A PUBLISH on a topic other than the device's acks or status: connection closed.
    Publish,
    /// A packet larger than `mqtt.max_payload_bytes`: connection closed.
    TooLarge,
    /// An ack or status whose payload is not a device-protocol `Ack` or `Status` (or a
    /// will that is not a `Status`): dropped, and acknowledged at the MQTT level; the
    /// connection stays.
    MalformedMessage,
    /// A packet beyond `mqtt.max_messages_per_second` or `mqtt.max_bytes_per_second`:
    /// dropped unanswered.
    MessageRate,
    /// A device beyond its rate for 10 s on end: disconnected.
    RateDisconnect,
    /// The certificate or secret a connected device proved itself with was revoked:
    /// disconnected.
    Revoked,
}

impl Rule {
    /// The label: `malformed`, `protocol_version`, `connect_timeout`, `tls_handshake`,
    /// `handshakes_per_address`, `per_address`, `capacity`, `client_id`, `no_credentials`, `bad_credentials`,
    /// `identity_mismatch`, `unknown_device`, `disabled_device`, `will`, `subscribe`,
    /// `publish`, `too_large`, `malformed_message`, `message_rate`,
    /// `rate_disconnect`, `revoked`.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Malformed => "malformed",
            Rule::ProtocolVersion => "protocol_version",
            Rule::ConnectTimeout => "connect_timeout",
            Rule::TlsHandshake => "tls_handshake",
            Rule::HandshakesPerAddress => "handshakes_per_address",
            Rule::PerAddress => "per_address",
            Rule::Capacity => "capacity",
            Rule::ClientId => "client_id",
            Rule::NoCredentials => "no_credentials",
            Rule::BadCredentials => "bad_credentials",
            Rule::IdentityMismatch => "identity_mismatch",
            Rule::UnknownDevice => "unknown_device",
            Rule::DisabledDevice => "disabled_device",
            Rule::Will => "will",
            Rule::Subscribe => "subscribe",
            Rule::Publish => "publish",
            Rule::TooLarge => "too_large",
            Rule::MalformedMessage => "malformed_message",
            Rule::MessageRate => "message_rate",
            Rule::RateDisconnect => "rate_disconnect",
            Rule::Revoked => "revoked",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "7f80e222f828767efc2f9162";
    const B: &str = "0fb2aa11bb22cc33dd44ee55";

    #[test]
    fn client_ids_name_one_device_without_separators_or_wildcards() {
        assert_eq!(device_of_client_id(&format!("dev-{A}")), Some(A));
        assert_eq!(device_of_client_id(&format!("dev-{A}.acks")), Some(A));
        for bad in [
            "pixgate-gateway",
            "dev-",
            "dev-a/b",
            "dev-+",
            "dev-#",
            "A",
            "dev- a",
            "dev-é",
            "dev-a.",
            "dev-a.b.c",
            "dev-.a",
        ] {
            assert_eq!(device_of_client_id(bad), None, "{bad}");
        }
        assert_eq!(device_of_client_id(&format!("dev-{}", "a".repeat(MAX_ID_LEN + 1))), None);
    }

    #[test]
    fn a_device_subscribes_to_its_own_jobs_only() {
        assert!(may_subscribe(A, &format!("pixgate/v1/devices/{A}/jobs")));
        for f in [
            "#".to_string(),
            "pixgate/#".into(),
            "pixgate/v1/devices/+/jobs".into(),
            format!("pixgate/v1/devices/{B}/jobs"),
            format!("pixgate/v1/devices/{A}/#"),
            format!("pixgate/v1/devices/{A}/+"),
            format!("pixgate/v1/devices/{A}/acks"),
            format!("pixgate/v1/devices/{A}/status"),
            format!("$share/g/pixgate/v1/devices/{A}/jobs"),
            "+/+/+/+/jobs".into(),
        ] {
            assert!(!may_subscribe(A, &f), "{f}");
        }
    }

    #[test]
    fn a_device_publishes_its_own_acks_and_status_and_wills_its_own_status() {
        assert!(may_publish(A, format!("pixgate/v1/devices/{A}/acks").as_bytes()));
        assert!(may_publish(A, format!("pixgate/v1/devices/{A}/status").as_bytes()));
        for t in [
            format!("pixgate/v1/devices/{B}/acks"),
            format!("pixgate/v1/devices/{B}/status"),
            format!("pixgate/v1/devices/{A}/jobs"),
            format!("pixgate/v1/devices/{B}/jobs"),
            "pixgate/v1/devices/+/acks".into(),
            format!("/tenants/{A}/pixgate/v1/devices/{B}/acks"),
        ] {
            assert!(!may_publish(A, t.as_bytes()), "{t}");
        }
        assert!(!may_publish(A, b"\xff\xfe"));
        assert!(may_will(A, format!("pixgate/v1/devices/{A}/status").as_bytes()));
        assert!(!may_will(A, format!("pixgate/v1/devices/{B}/status").as_bytes()));
        assert!(!may_will(A, format!("pixgate/v1/devices/{A}/acks").as_bytes()));
    }
}
