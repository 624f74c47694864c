//! A fleet of simulated devices (every printer and card machine of a registry) sharing one
//! set of counters and one effect list, started and stopped together.

use crate::device::{
    spawn_device_sharing, ClientTls, DeviceHandle, DeviceOptions, MqttSecurity, Rendering, Stats, StatsSnapshot,
};
use crate::effect::EffectRecord;
use crate::mqtt_link::Protocol;
use crate::registry::DeviceSpec;
use anyhow::Result;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What to simulate and where.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// MQTT broker host.
    pub mqtt_host: String,
    /// MQTT broker port.
    pub mqtt_port: u16,
    /// Output root: each device writes into `{out_dir}/{id}/`.
    pub out_dir: PathBuf,
    /// The devices (see [`crate::registry::devices_from_jsonl`]).
    pub devices: Vec<DeviceSpec>,
    /// How every device connects: plain TCP, or TLS with its certificate or secret.
    pub security: MqttSecurity,
}

/// How the devices of a fleet behave (see [`start_with_options`]).
#[derive(Debug, Clone)]
pub struct FleetOptions {
    /// Refuse jobs whose `expires_at` has passed (the protocol's rule).
    pub honor_expiry: bool,
    /// Draw every job to a PNG, or only check its payload.
    pub rendering: Rendering,
    /// The counters the devices share (e.g. [`Stats::counting_only`] for long runs).
    pub stats: Arc<Stats>,
    /// The MQTT version every device speaks.
    pub protocol: Protocol,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            honor_expiry: true,
            rendering: Rendering::Full,
            stats: Arc::new(Stats::default()),
            protocol: Protocol::V311,
        }
    }
}

/// What a fleet did, written by `fleet-sim` as `effects.json`.
#[derive(Debug, Clone, Serialize)]
pub struct FleetReport {
    /// Number of devices simulated.
    pub devices: usize,
    /// Counters summed over all devices.
    pub stats: StatsSnapshot,
    /// Every job carried out, in the order carried out.
    pub effects: Vec<EffectRecord>,
}

/// A running fleet.
pub struct FleetHandle {
    devices: Vec<DeviceHandle>,
    stats: Arc<Stats>,
}

/// Starts one simulated device per spec (they connect in the background). Jobs whose
/// `expires_at` has passed are refused, as the protocol requires; use [`start_with`] to
/// replay old fixtures.
///
/// # Errors
/// The output directory cannot be created, or a device cannot start: its TLS material
/// cannot be read or it has no secret (see [`crate::device::spawn_device`]).
pub async fn start(cfg: FleetConfig) -> Result<FleetHandle> {
    start_with(cfg, true).await
}

/// [`start`], choosing whether devices refuse expired jobs.
///
/// # Errors
/// As [`start`].
pub async fn start_with(cfg: FleetConfig, honor_expiry: bool) -> Result<FleetHandle> {
    start_with_options(cfg, FleetOptions { honor_expiry, ..FleetOptions::default() }).await
}

/// [`start`] with every device option.
///
/// # Errors
/// As [`start`] (no device is left running then).
pub async fn start_with_options(cfg: FleetConfig, options: FleetOptions) -> Result<FleetHandle> {
    tokio::fs::create_dir_all(&cfg.out_dir).await?;
    let FleetOptions { honor_expiry, rendering, stats, protocol } = options;
    let opts = DeviceOptions {
        mqtt_host: cfg.mqtt_host.clone(),
        mqtt_port: cfg.mqtt_port,
        out_dir: cfg.out_dir.clone(),
        honor_expiry,
        security: cfg.security.clone(),
        protocol,
    };
    let tls = ClientTls::new(&opts.security)?;
    let mut devices = Vec::with_capacity(cfg.devices.len());
    for spec in &cfg.devices {
        match spawn_device_sharing(spec, &opts, rendering, stats.clone(), tls.as_ref()) {
            Ok(d) => devices.push(d),
            Err(e) => {
                for d in devices {
                    d.shutdown().await;
                }
                return Err(e);
            }
        }
    }
    Ok(FleetHandle { devices, stats })
}

impl FleetHandle {
    /// Waits until every device is connected and subscribed to its jobs topic.
    ///
    /// # Errors
    /// Some device is not ready within `timeout` (the error names them).
    pub async fn wait_connected(&self, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        for d in &self.devices {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if d.wait_ready(left).await.is_err() {
                let missing: Vec<&str> = self.devices.iter().filter(|d| !d.is_ready()).map(|d| d.id()).collect();
                anyhow::bail!(
                    "{} of {} devices not connected after {timeout:?}: {}",
                    missing.len(),
                    self.devices.len(),
                    missing.join(", ")
                );
            }
        }
        Ok(())
    }

    /// Devices connected and subscribed right now.
    pub fn connected(&self) -> usize {
        self.devices.iter().filter(|d| d.is_ready()).count()
    }

    /// Connections the broker accepted, summed over the devices (reconnects included).
    pub fn connects(&self) -> u64 {
        self.devices.iter().map(DeviceHandle::connects).sum()
    }

    /// Connection attempts or connections that ended in an error, summed over the devices.
    pub fn connection_failures(&self) -> u64 {
        self.devices.iter().map(DeviceHandle::connection_failures).sum()
    }

    /// The last connection error of up to `n` devices that are not connected now.
    pub fn last_errors(&self, n: usize) -> Vec<(String, String)> {
        self.devices
            .iter()
            .filter(|d| !d.is_ready())
            .filter_map(|d| Some((d.id().to_string(), d.last_connection_error()?)))
            .take(n)
            .collect()
    }

    /// Cuts the connection of one connected device, picked with `seed` (an xorshift state,
    /// advanced), as a network failure would; it reconnects by itself. Returns its id, or
    /// `None` when no device is connected. Called at a steady rate, this is the churn of a
    /// real fleet (`fleet-sim --churn-per-minute`, `pixgate-load --churn-per-minute`).
    pub fn drop_random_connection(&self, seed: &mut u64) -> Option<&str> {
        let connected: Vec<&DeviceHandle> = self.devices.iter().filter(|d| d.is_ready()).collect();
        if connected.is_empty() {
            return None;
        }
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        let d = connected[(*seed % connected.len() as u64) as usize];
        d.drop_connection();
        Some(d.id())
    }

    /// Connections cut by [`FleetHandle::drop_random_connection`], summed over the devices.
    pub fn dropped_connections(&self) -> u64 {
        self.devices.iter().map(DeviceHandle::dropped_connections).sum()
    }

    /// Ids of the simulated devices.
    pub fn device_ids(&self) -> Vec<String> {
        self.devices.iter().map(|d| d.id().to_string()).collect()
    }

    /// The simulated device with registry id `id`.
    pub fn device(&self, id: &str) -> Option<&DeviceHandle> {
        self.devices.iter().find(|d| d.id() == id)
    }

    /// Every job carried out so far, in order.
    pub fn effects(&self) -> Vec<EffectRecord> {
        self.stats.effects()
    }

    /// The jobs carried out from index `from` of [`FleetHandle::effects`] on.
    pub fn effects_since(&self, from: usize) -> Vec<EffectRecord> {
        self.stats.effects_since(from)
    }

    /// How many jobs were carried out (also when the effect list is not kept).
    pub fn carried_out(&self) -> u64 {
        self.stats.carried_out()
    }

    /// Job publishes received, redeliveries included.
    pub fn raw_jobs(&self) -> u64 {
        self.stats.raw_jobs()
    }

    /// Jobs whose message id had already been carried out.
    pub fn duplicates(&self) -> u64 {
        self.stats.duplicates()
    }

    /// New jobs that arrived with a seq not larger than the device's previous one.
    pub fn order_violations(&self) -> u64 {
        self.stats.order_violations()
    }

    /// The fleet's ack latency (median, 99th percentile): see
    /// [`crate::device::Stats::ack_latency`].
    pub fn ack_latency(&self) -> Option<(Duration, Duration)> {
        self.stats.ack_latency()
    }

    /// All counters now.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    /// Stops every device: each finishes its current job, publishes `{"v":1,"online":false}`
    /// retained and disconnects cleanly (so its last will does not fire). Returns the report.
    pub async fn shutdown(self) -> FleetReport {
        let n = self.devices.len();
        let mut set = tokio::task::JoinSet::new();
        for d in self.devices {
            set.spawn(d.shutdown());
        }
        while set.join_next().await.is_some() {}
        FleetReport { devices: n, stats: self.stats.snapshot(), effects: self.stats.effects() }
    }
}
