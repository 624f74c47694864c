//! The device registry: every printer and card machine pixgate knows, from
//! `device.upserted` events. An event older (by oplog position) than what is already applied
//! for that device is ignored, so a redelivered old event cannot undo a newer change.

use crate::model::{CloudSettings, DirectPrinters, DirectSettings, Directory};
use cdc::{Device, DeviceKind};
use std::collections::HashMap;
use std::sync::Arc;

/// Devices by id, with the oplog position each entry was applied at.
#[derive(Debug, Default)]
pub struct Registry {
    devices: HashMap<String, (u64, Option<Device>)>,
    /// Told of every change, for the device listener.
    directory: Option<Arc<Directory>>,
    /// Told of every printer's transport, for the delivery transport.
    printers: Option<Arc<DirectPrinters>>,
}

/// What applying a device event did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The entry was inserted or replaced.
    Upserted,
    /// The entry was removed (a delete event).
    Removed,
    /// The event is not newer than the entry: nothing changed.
    Stale,
}

impl Registry {
    /// An empty registry that tells `directory` of every change.
    pub fn with_directory(directory: Arc<Directory>) -> Registry {
        Registry { devices: HashMap::new(), directory: Some(directory), printers: None }
    }

    /// Also tells `printers` which printers are driven directly, and where they are.
    pub fn with_direct_printers(mut self, printers: Arc<DirectPrinters>) -> Registry {
        self.printers = Some(printers);
        self
    }

    /// Applies an upsert (`Some(device)`) or a delete (`None`) of `id` at oplog position
    /// `cluster_time`. A delete leaves a tombstone so an older upsert cannot resurrect it.
    pub fn apply(&mut self, id: &str, cluster_time: u64, device: Option<Device>) -> Applied {
        if let Some((at, _)) = self.devices.get(id) {
            if *at >= cluster_time {
                return Applied::Stale;
            }
        }
        let removed = device.is_none();
        if let Some(dir) = &self.directory {
            dir.set(id, device.as_ref().map(|d| d.enabled));
        }
        if let Some(printers) = &self.printers {
            // The planner dead-letters a device event whose endpoint does not parse before it
            // is applied; a stored entry that no longer parses is logged and counts as MQTT.
            let direct = device.as_ref().map(DirectSettings::of_device).transpose().unwrap_or_else(|e| {
                tracing::error!(device = id, error = %e, "registry entry's printer endpoint does not parse");
                None
            });
            printers.set(id, direct.flatten());
            printers.set_cloud(id, device.as_ref().and_then(CloudSettings::of_device));
        }
        self.devices.insert(id.to_string(), (cluster_time, device));
        if removed {
            Applied::Removed
        } else {
            Applied::Upserted
        }
    }

    /// Whether `id` is a printer that fetches its jobs over its maker's cloud protocol
    /// ([`DirectPrinters::is_cloud`]: a local printers-file entry overrides it); `false`
    /// without the printers told.
    pub fn is_cloud_printer(&self, id: &str) -> bool {
        self.printers.as_ref().is_some_and(|p| p.is_cloud(id))
    }

    /// The device with this id, if registered and not deleted.
    pub fn get(&self, id: &str) -> Option<&Device> {
        self.devices.get(id).and_then(|(_, d)| d.as_ref())
    }

    /// The enabled printer marked `defaultForCompany` for `company`.
    pub fn default_printer(&self, company: &str) -> Option<&Device> {
        self.devices.values().filter_map(|(_, d)| d.as_ref()).find(|d| {
            d.company == company && d.enabled && d.default_for_company && matches!(d.kind, DeviceKind::Printer { .. })
        })
    }

    /// Number of registered (not deleted) devices.
    pub fn len(&self) -> usize {
        self.devices.values().filter(|(_, d)| d.is_some()).count()
    }

    /// Whether no device is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
