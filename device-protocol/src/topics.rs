//! The MQTT topic layout, version 1.
//!
//! | topic | direction | QoS | retained | payload |
//! |---|---|---|---|---|
//! | `pixgate/v1/devices/{id}/jobs` | gateway → device | 1 | no | [`crate::Job`] |
//! | `pixgate/v1/devices/{id}/acks` | device → gateway | 1 | no | [`crate::Ack`] |
//! | `pixgate/v1/devices/{id}/status` | device → gateway | 1 | yes (and last will) | [`crate::Status`] |
//!
//! `{id}` is the device's registry id (24 lowercase hex characters, the MongoDB `_id`).

/// The version prefix every topic starts with.
pub const ROOT: &str = "pixgate/v1/devices";

/// Filter the gateway subscribes to for all device acks: `pixgate/v1/devices/+/acks`.
pub const ALL_ACKS: &str = "pixgate/v1/devices/+/acks";

/// Filter the gateway subscribes to for all device status: `pixgate/v1/devices/+/status`.
pub const ALL_STATUS: &str = "pixgate/v1/devices/+/status";

/// One of a device's three topics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topic {
    /// `pixgate/v1/devices/{id}/jobs`
    Jobs(String),
    /// `pixgate/v1/devices/{id}/acks`
    Acks(String),
    /// `pixgate/v1/devices/{id}/status`
    Status(String),
}

impl Topic {
    /// The topic string.
    pub fn path(&self) -> String {
        match self {
            Topic::Jobs(id) => format!("{ROOT}/{id}/jobs"),
            Topic::Acks(id) => format!("{ROOT}/{id}/acks"),
            Topic::Status(id) => format!("{ROOT}/{id}/status"),
        }
    }

    /// Parses a topic string; `None` for anything outside the v1 layout (including an empty
    /// or wildcard device id).
    pub fn parse(topic: &str) -> Option<Topic> {
        let rest = topic.strip_prefix(ROOT)?.strip_prefix('/')?;
        let (id, leaf) = rest.split_once('/')?;
        if id.is_empty() || id.contains(['+', '#', '/']) {
            return None;
        }
        let id = id.to_string();
        match leaf {
            "jobs" => Some(Topic::Jobs(id)),
            "acks" => Some(Topic::Acks(id)),
            "status" => Some(Topic::Status(id)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        for t in [Topic::Jobs("ab".into()), Topic::Acks("ab".into()), Topic::Status("ab".into())] {
            assert_eq!(Topic::parse(&t.path()), Some(t));
        }
        assert_eq!(Topic::Jobs("0fb2".into()).path(), "pixgate/v1/devices/0fb2/jobs");
        assert_eq!(Topic::parse("pixgate/v1/devices/+/acks"), None);
        assert_eq!(Topic::parse("pixgate/v2/devices/a/acks"), None);
        assert_eq!(Topic::parse("pixgate/v1/devices/a/other"), None);
        assert_eq!(Topic::parse("pixgate/v1/devices//acks"), None);
    }
}
