//! Presence on the central shape: the latest retained `status` of every device, as the
//! acks connection reads it from the broker.

use crate::telemetry::presence::{Connections, Presence};
use device_protocol::Status;
use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

/// Devices whose latest status says online. The broker knows each device's connections;
/// pixgate sees one per online device (its last will turns it offline when it drops).
#[derive(Debug, Default)]
pub struct StatusBoard {
    online: Mutex<HashSet<String>>,
}

impl StatusBoard {
    /// `device` reported `status` (retained, live, or its last will).
    pub fn record(&self, device: &str, status: &Status) {
        let mut online = self.online.lock().unwrap_or_else(PoisonError::into_inner);
        if status.online {
            online.insert(device.to_string());
        } else {
            online.remove(device);
        }
    }
}

impl Presence for StatusBoard {
    /// Each device whose status says online, as one connection subscribed to its jobs
    /// (the broker does not say more).
    fn online(&self) -> std::collections::HashMap<String, Connections> {
        let online = self.online.lock().unwrap_or_else(PoisonError::into_inner);
        online.iter().map(|d| (d.clone(), (1, 1))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn online_follows_the_latest_status() {
        let board = StatusBoard::default();
        let status = |online| Status { v: 1, online, printer: None };
        board.record("a", &status(true));
        board.record("b", &status(true));
        board.record("a", &status(false));
        let online = board.online();
        assert_eq!(online.len(), 1, "{online:?}");
        assert_eq!(online.get("b"), Some(&(1, 1)));
    }
}
