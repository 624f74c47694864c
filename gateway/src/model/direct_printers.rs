//! Which printers pixgate drives itself, and where they are: the local printers file
//! (`direct.printers_file`), whose entries win, and the registry's view (`printer.transport`
//! `tcp`, `serial` or `usb` with its `printer.endpoint`). The registry writes here (`route::registry`); the delivery
//! transport reads it for every job it hands on (`deliver::direct`).
//!
//! It also keeps the printers that poll pixgate over their maker's cloud protocol
//! (`printer.transport` `cloudprnt-http`, [`CloudSettings`]), which the registry alone
//! names: the other printers that are not on pixgate's MQTT device protocol.

use crate::model::cloud_printer::CloudSettings;
use crate::model::endpoint::{BadEndpoint, Endpoint};
use cdc::Interrupted;
use render::codepage::CodePage;
use serde::Deserialize;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::sync::RwLock;

/// How pixgate reaches one direct printer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirectSettings {
    /// Where it is.
    pub endpoint: Endpoint,
    /// What happens to a job whose writing was cut short.
    pub interrupted: Interrupted,
    /// The code page its receipts are rendered in (the reprint header is written in it).
    pub code_page: CodePage,
}

impl DirectSettings {
    /// The settings of `device` if its registry document names a direct transport.
    ///
    /// # Errors
    /// Its `printer.endpoint` does not parse ([`Endpoint::parse`]): the device event is a
    /// dead letter `invalid_field:printer.endpoint`.
    pub fn of_device(device: &cdc::Device) -> Result<Option<DirectSettings>, BadEndpoint> {
        let cdc::DeviceKind::Printer { direct: Some(d), code_page, .. } = &device.kind else { return Ok(None) };
        Ok(Some(DirectSettings {
            endpoint: Endpoint::parse(&d.endpoint)?,
            interrupted: d.interrupted,
            code_page: *code_page,
        }))
    }
}

/// One entry of the local printers file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEntry {
    endpoint: String,
    #[serde(default)]
    interrupted_job: Option<String>,
    #[serde(default)]
    code_page: Option<String>,
}

/// The local printers file: `[printers.<device id>]` tables.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrintersFile {
    #[serde(default)]
    printers: HashMap<String, FileEntry>,
}

/// Why the local printers file cannot be used (the text names the file and the printer).
#[derive(Debug, thiserror::Error)]
pub enum BadPrintersFile {
    /// Unreadable, or not the TOML shape of [`DirectPrinters::load_file`].
    #[error("printers file {path}: {why}")]
    Unreadable {
        /// The file.
        path: String,
        /// Why.
        why: String,
    },
    /// One printer's settings are wrong.
    #[error("printers file {path}: printer {device}: {why}")]
    Printer {
        /// The file.
        path: String,
        /// The device id.
        device: String,
        /// Why.
        why: String,
    },
}

/// Device id → direct settings, from the registry and the local file. An entry of the local
/// file wins over the registry (the owner's rule: the box's own file is what its operator
/// wired); the registry covers the rest.
#[derive(Debug, Default)]
pub struct DirectPrinters {
    registry: RwLock<HashMap<String, DirectSettings>>,
    local: HashMap<String, DirectSettings>,
    cloud: RwLock<CloudPrinters>,
}

/// The cloud printers the registry names, by id and by MAC.
#[derive(Debug, Default)]
struct CloudPrinters {
    by_id: HashMap<String, CloudSettings>,
    /// MAC (normalized) → the printers the registry gives it: one, unless the registry
    /// is wrong.
    by_mac: HashMap<String, BTreeSet<String>>,
}

impl DirectPrinters {
    /// Printers from the local file only (the registry adds its own as it is applied).
    pub fn with_local(local: HashMap<String, DirectSettings>) -> DirectPrinters {
        DirectPrinters { registry: RwLock::default(), local, cloud: RwLock::default() }
    }

    /// Reads the local printers file:
    ///
    /// ```toml
    /// [printers.0fb23c6f5da2cec255404e4f]
    /// endpoint = "tcp://192.168.0.50:9100"   # or serial:///dev/ttyUSB0?baud=19200, usb:///dev/usb/lp0
    /// interrupted_job = "reprint"            # or "hold"; default reprint
    /// code_page = "CP860"                    # the receipts' code page; default CP860
    /// ```
    ///
    /// # Errors
    /// The file cannot be read or parsed, or a printer's endpoint, `interrupted_job` or
    /// `code_page` is wrong.
    pub fn load_file(path: &Path) -> Result<HashMap<String, DirectSettings>, BadPrintersFile> {
        let name = path.display().to_string();
        let unreadable = |why: String| BadPrintersFile::Unreadable { path: name.clone(), why };
        let text = std::fs::read_to_string(path).map_err(|e| unreadable(e.to_string()))?;
        let file: PrintersFile = toml::from_str(&text).map_err(|e| unreadable(e.to_string()))?;
        let mut out = HashMap::new();
        for (device, e) in file.printers {
            let bad = |why: String| BadPrintersFile::Printer { path: name.clone(), device: device.clone(), why };
            let endpoint = Endpoint::parse(&e.endpoint).map_err(|x| bad(x.to_string()))?;
            let interrupted = match e.interrupted_job.as_deref() {
                None => Interrupted::Reprint,
                Some(name) => Interrupted::from_name(name)
                    .ok_or_else(|| bad(format!("interrupted_job `{name}` is not reprint or hold")))?,
            };
            let code_page = match e.code_page.as_deref() {
                None => CodePage::Cp860,
                Some(n) => CodePage::from_name(n).ok_or_else(|| bad(format!("unknown code page `{n}`")))?,
            };
            out.insert(device, DirectSettings { endpoint, interrupted, code_page });
        }
        Ok(out)
    }

    /// Records what the registry says of `id`: direct (`Some`) or not (`None`: MQTT, or
    /// removed).
    pub fn set(&self, id: &str, direct: Option<DirectSettings>) {
        let mut r = self.registry.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        match direct {
            Some(d) => r.insert(id.to_string(), d),
            None => r.remove(id),
        };
    }

    /// How to reach `id` directly now; `None`: over MQTT, or a cloud printer. An entry
    /// of the local file wins over whatever the registry says of `id`.
    pub fn get(&self, id: &str) -> Option<DirectSettings> {
        if let Some(local) = self.local.get(id) {
            return Some(local.clone());
        }
        if self.is_cloud(id) {
            return None;
        }
        self.registry.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(id).cloned()
    }

    /// Records what the registry says of `id`: a cloud printer (`Some`) or not. A MAC the
    /// registry gives to several printers is logged: none of them can then be told apart
    /// by it ([`DirectPrinters::cloud_by_mac`]).
    pub fn set_cloud(&self, id: &str, cloud: Option<CloudSettings>) {
        let mut c = self.cloud.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(mac) = c.by_id.remove(id).and_then(|old| old.mac) {
            if let Some(ids) = c.by_mac.get_mut(&mac) {
                ids.remove(id);
                if ids.is_empty() {
                    c.by_mac.remove(&mac);
                }
            }
        }
        let Some(settings) = cloud else { return };
        let (mac, method) = (settings.mac.clone(), settings.method);
        c.by_id.insert(id.to_string(), settings);
        let Some(mac) = mac else { return };
        c.by_mac.entry(mac.clone()).or_default().insert(id.to_string());
        let sharing: Vec<&String> = self.holders(&c, &mac, method).collect();
        // Only the MQTT method's messages are found by MAC alone.
        if method == cdc::CloudMethod::Mqtt && sharing.len() > 1 {
            tracing::warn!(mac = %mac, devices = ?sharing, "the registry gives this MAC to several printers on CloudPRNT's MQTT method: their messages through an external broker are refused until only one has it");
        }
    }

    /// `id`'s settings if it polls pixgate over a cloud protocol now (the registry says so
    /// and the local file does not list it).
    pub fn cloud(&self, id: &str) -> Option<CloudSettings> {
        if self.local.contains_key(id) {
            return None;
        }
        self.cloud.read().unwrap_or_else(std::sync::PoisonError::into_inner).by_id.get(id).cloned()
    }

    /// The cloud printer on `method` whose MAC is `mac` (lower case with colons), if
    /// exactly one has it (asked once per message a Star printer sends through an external
    /// broker). `None` as well when the registry gives it to several: a message cannot say
    /// which of them sent it.
    pub fn cloud_by_mac(&self, mac: &str, method: cdc::CloudMethod) -> Option<String> {
        let cloud = self.cloud.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut ids = self.holders(&cloud, mac, method);
        match (ids.next(), ids.next()) {
            (Some(id), None) => Some(id.clone()),
            _ => None,
        }
    }

    /// The ids of the cloud printers in `cloud` on `method` whose MAC is `mac`, in id
    /// order; a printer the local printers file lists is none of them, as its entry wins
    /// over the registry's.
    fn holders<'a>(
        &'a self,
        cloud: &'a CloudPrinters,
        mac: &str,
        method: cdc::CloudMethod,
    ) -> impl Iterator<Item = &'a String> + 'a {
        let ids = cloud.by_mac.get(mac).into_iter().flatten();
        ids.filter(move |id| {
            !self.local.contains_key(id.as_str()) && cloud.by_id.get(id.as_str()).is_some_and(|c| c.method == method)
        })
    }

    /// How `id` is reached now, by its `printer.transport` name: the local file's endpoint
    /// scheme, else a cloud method, else the registry's endpoint scheme, else `mqtt` (the
    /// precedence of [`DirectPrinters::get`] and [`DirectPrinters::cloud`], without their
    /// copies: asked for every device at each dashboard update).
    pub fn transport(&self, id: &str) -> &'static str {
        if let Some(local) = self.local.get(id) {
            return local.endpoint.scheme();
        }
        if let Some(cloud) = self.cloud.read().unwrap_or_else(std::sync::PoisonError::into_inner).by_id.get(id) {
            return cloud.method.transport();
        }
        let registry = self.registry.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        registry.get(id).map_or("mqtt", |d| d.endpoint.scheme())
    }

    /// Whether `id` polls pixgate over a cloud protocol now ([`DirectPrinters::cloud`]
    /// without the copy: asked for every job sent).
    pub fn is_cloud(&self, id: &str) -> bool {
        !self.local.contains_key(id)
            && self.cloud.read().unwrap_or_else(std::sync::PoisonError::into_inner).by_id.contains_key(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_local_file_wins_and_the_registry_covers_the_rest() {
        let dir = std::env::temp_dir().join(format!("pixgate-printers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("printers.toml");
        std::fs::write(
            &path,
            "[printers.a]\nendpoint = \"tcp://10.0.0.5\"\n[printers.b]\nendpoint = \"usb:///dev/usb/lp0\"\ninterrupted_job = \"hold\"\ncode_page = \"CP850\"\n",
        )
        .unwrap();
        let printers = DirectPrinters::with_local(DirectPrinters::load_file(&path).unwrap());
        let a = printers.get("a").unwrap();
        assert_eq!(
            (a.endpoint.to_string(), a.interrupted, a.code_page),
            ("tcp://10.0.0.5:9100".into(), Interrupted::Reprint, CodePage::Cp860)
        );
        assert_eq!(printers.get("b").unwrap().interrupted, Interrupted::Hold);
        assert!(printers.get("c").is_none(), "MQTT");
        let from_registry = DirectSettings { endpoint: Endpoint::parse("tcp://10.0.0.9").unwrap(), ..a };
        printers.set("a", Some(from_registry.clone()));
        assert_eq!(printers.get("a").unwrap().endpoint.to_string(), "tcp://10.0.0.5:9100", "the local file wins");
        printers.set("c", Some(from_registry.clone()));
        assert_eq!(printers.get("c"), Some(from_registry), "the registry covers the rest");
        printers.set("c", None);
        assert!(printers.get("c").is_none());
        let cloud = CloudSettings {
            mac: Some("00:11:62:00:00:01".into()),
            method: cdc::CloudMethod::Http,
            width_dots: 576,
            code_page: CodePage::Cp860,
            model: String::new(),
        };
        printers.set_cloud("b", Some(cloud.clone()));
        printers.set_cloud("d", Some(cloud.clone()));
        assert!(printers.cloud("b").is_none() && printers.get("b").is_some(), "the local file wins over CloudPRNT too");
        assert_eq!((printers.cloud("d"), printers.get("d")), (Some(cloud.clone()), None));

        let (mac, http, mqtt) = ("00:11:62:00:00:01", cdc::CloudMethod::Http, cdc::CloudMethod::Mqtt);
        assert_eq!(printers.cloud_by_mac(mac, http).as_deref(), Some("d"), "b is the local file's");
        assert_eq!(printers.cloud_by_mac(mac, mqtt), None, "another method");
        printers.set_cloud("e", Some(cloud.clone()));
        assert_eq!(printers.cloud_by_mac(mac, http), None, "d and e both have it: neither is told apart");
        let other = CloudSettings { mac: Some("00:11:62:00:00:02".into()), ..cloud.clone() };
        printers.set_cloud("e", Some(other));
        assert_eq!(printers.cloud_by_mac(mac, http).as_deref(), Some("d"), "e moved to another MAC");
        assert_eq!(printers.cloud_by_mac("00:11:62:00:00:02", http).as_deref(), Some("e"));
        printers.set_cloud("d", None);
        assert_eq!(printers.cloud_by_mac(mac, http), None, "d is no longer a cloud printer");

        for (text, why) in [
            ("[printers.x]\nendpoint = \"lpt://1\"\n", "printer x: printer endpoint `lpt://1`: unknown scheme"),
            ("[printers.x]\nendpoint = \"tcp://h\"\ninterrupted_job = \"twice\"\n", "interrupted_job `twice`"),
            ("[printers.x]\nendpoint = \"tcp://h\"\ncode_page = \"CP999\"\n", "unknown code page"),
            ("[printers.x]\nendpont = \"tcp://h\"\n", "unknown field"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = DirectPrinters::load_file(&path).unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
