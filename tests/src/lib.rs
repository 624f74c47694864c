//! # pixgate end-to-end harness
//!
//! Starts the real parts a newcomer (and CI) runs pixgate with: a Kafka-protocol broker
//! (tansu, via `scripts/kafka-broker.sh`), the `pixgate` binary as a child process with its
//! embedded MQTT broker, a fleet of simulated devices connected over MQTT, and the capture
//! simulator feeding a fixtures folder into Kafka. [`demo::run`] is the main job;
//! `tests/tests/end_to_end.rs` calls the same function and checks what it left. The other
//! end-to-end tests in `tests/tests/` stand on a [`harness::Rig`] (broker, pixgate, devices)
//! and read as their scenario.

pub mod broker;
pub mod browser;
pub mod central;
pub mod charges;
pub mod cloudprnt_bench;
pub mod cpu;
pub mod demo;
pub mod devices_broker;
pub mod disk_io;
pub mod gateway;
pub mod harness;
pub mod kafka;
pub mod load;
pub mod mosquitto;
pub mod net;
pub mod pki;
pub mod printer_sim;
pub mod python;
pub mod scenario;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The effects `expected.json` in `fixtures` lists, per (device, charge), in the order the
/// charge's lifecycle dictates (e.g. `display_qr` before `payment_confirmed`).
///
/// # Panics
/// The file is missing or not the documented shape (a broken fixture fails the test).
pub fn expected_effects(fixtures: &Path) -> BTreeMap<(String, String), Vec<String>> {
    let by_charge =
        simulators::expected::read_expected_json(&fixtures.join("expected.json")).unwrap_or_else(|e| panic!("{e:#}"));
    let mut want: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (charge, effects) in by_charge {
        for (device, kind) in effects {
            want.entry((device, charge.clone())).or_default().push(kind);
        }
    }
    want
}

/// The devices of `fixtures/devices.jsonl` (printers and card machines), to simulate.
///
/// # Panics
/// The file is missing or malformed (a broken fixture fails the test).
pub fn fixture_devices(fixtures: &Path) -> Vec<simulators::registry::DeviceSpec> {
    let path = fixtures.join("devices.jsonl");
    simulators::registry::devices_from_jsonl(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()))
}

/// The device `id` of `fixtures/devices.jsonl`.
///
/// # Panics
/// As [`fixture_devices`], or no device has that id.
pub fn fixture_device(fixtures: &Path, id: &str) -> simulators::registry::DeviceSpec {
    fixture_devices(fixtures)
        .into_iter()
        .find(|d| d.id() == id)
        .unwrap_or_else(|| panic!("no device {id} in {}", fixtures.join("devices.jsonl").display()))
}

/// The gateway settings that replay `fixtures` as if they were happening now: its clock set
/// back to the first charge's `wallTime` (`PIXGATE_CLOCK__OFFSET_MS`), so that the charges'
/// `expiresDate`s and the jobs' time to live mean what they meant when recorded. Compute it
/// once per run and pass the same value to every restart (time never runs backward).
///
/// Simulated devices keep the real clock, so they must not refuse jobs by `expires_at`
/// (`fleet::start_with(…, false)`): pixgate enforces the time to live by its own clock.
///
/// # Panics
/// `charges.jsonl` is missing or has no `wallTime`.
pub fn replay_clock_env(fixtures: &Path) -> Vec<(&'static str, String)> {
    let path = fixtures.join("charges.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let first = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|r| {
            r["value"]["wallTime"]["$date"].as_str().and_then(|d| chrono::DateTime::parse_from_rfc3339(d).ok())
        })
        .min()
        .unwrap_or_else(|| panic!("{}: no wallTime", path.display()));
    let offset = first.timestamp_millis() - chrono::Utc::now().timestamp_millis();
    vec![("PIXGATE_CLOCK__OFFSET_MS", offset.to_string())]
}

/// Logs of the harness's command-line tools: to stderr, filtered by `RUST_LOG` (default:
/// warnings), coloured on a terminal.
pub fn init_cli_logs() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// The repository root (this crate's parent directory).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}
