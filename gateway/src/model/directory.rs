//! Which devices may connect: the registry's view that the device listener reads.
//!
//! The registry (`route::registry`) writes every change here; the MQTT listener
//! (`deliver::mqtt`) asks at CONNECT and watches [`Directory::changes`] to disconnect a
//! device that is removed or disabled while connected. It holds one flag per device, so
//! 10,000 devices cost a few hundred KiB.

use std::collections::HashMap;
use std::sync::RwLock;
use tokio::sync::watch;

/// What the registry says of a device id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Registered and enabled.
    Enabled,
    /// Registered with `enabled: false`.
    Disabled,
    /// Never registered, or deleted.
    Unknown,
}

impl Standing {
    /// `enabled`, `disabled`, `unknown` (log field and refusal rule).
    pub fn as_str(self) -> &'static str {
        match self {
            Standing::Enabled => "enabled",
            Standing::Disabled => "disabled",
            Standing::Unknown => "unknown",
        }
    }
}

/// Device id → enabled, shared between the registry and the device listener.
#[derive(Debug)]
pub struct Directory {
    devices: RwLock<HashMap<String, bool>>,
    changes: watch::Sender<u64>,
}

impl Default for Directory {
    fn default() -> Self {
        Directory { devices: RwLock::default(), changes: watch::channel(0).0 }
    }
}

impl Directory {
    /// Records `id` as registered (`Some(enabled)`) or removed (`None`), and tells the
    /// watchers when that changes its standing.
    pub fn set(&self, id: &str, enabled: Option<bool>) {
        let before = self.standing(id);
        {
            let mut devices = self.devices.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            match enabled {
                Some(e) => devices.insert(id.to_string(), e),
                None => devices.remove(id),
            };
        }
        if self.standing(id) != before {
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// The standing of `id` now.
    pub fn standing(&self, id: &str) -> Standing {
        match self.devices.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(id) {
            Some(true) => Standing::Enabled,
            Some(false) => Standing::Disabled,
            None => Standing::Unknown,
        }
    }

    /// Changes to any device's standing: a watcher re-reads its own device on each.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standing_follows_the_registry_and_watchers_hear_of_changes() {
        let d = Directory::default();
        let mut rx = d.changes();
        assert_eq!(d.standing("a"), Standing::Unknown);
        d.set("a", Some(true));
        assert_eq!(d.standing("a"), Standing::Enabled);
        assert!(rx.has_changed().unwrap());
        rx.mark_unchanged();
        d.set("a", Some(true));
        assert!(!rx.has_changed().unwrap(), "no change of standing, no wake-up");
        d.set("a", Some(false));
        assert_eq!(d.standing("a"), Standing::Disabled);
        d.set("a", None);
        assert_eq!(d.standing("a"), Standing::Unknown);
        assert!(rx.has_changed().unwrap());
    }
}
