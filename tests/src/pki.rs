//! Throwaway certificates for TLS tests, made by pixgate's own provisioning
//! (`gateway::cli::credentials`, what `pixgate devices credentials` runs), into one folder:
//!
//! - `ca.crt`, `ca.key`, `crl.pem`: the fleet CA and its (empty) revocation list;
//! - `server.crt`, `server.key`: the broker, for `localhost` and IP `127.0.0.1`;
//! - `devices/{id}.crt`, `devices/{id}.key` per device id: a client certificate with
//!   subject CN = id;
//! - `other-ca/`: a second, unrelated CA with the same layout and the same device ids, for
//!   "a certificate from another CA" tests.
//!
//! [`Fleet::devices_dir`] is laid out as `simulators::device::DeviceIdentity::Certificate`
//! expects (`{dir}/{id}.crt`, `{dir}/{id}.key`). Keys are PKCS#8 PEM, which OpenSSL
//! (mosquitto) and rustls both read.

use anyhow::Result;
use gateway::cli::credentials::{create_ca, issue_certificate};
use std::path::{Path, PathBuf};

/// A generated PKI in a folder (see the module documentation for its files).
#[derive(Debug, Clone)]
pub struct Fleet {
    dir: PathBuf,
    devices: Vec<String>,
}

impl Fleet {
    /// Creates `dir` (and `dir/other-ca/`), replacing any CA there, and writes the fleet
    /// CA, the server certificate and one client certificate per id of `devices`, from
    /// each CA.
    ///
    /// # Errors
    /// An id that is not a device id, or a file that cannot be written.
    pub fn create(dir: &Path, devices: &[&str]) -> Result<Fleet> {
        let fleet = Fleet::create_without_other(dir, devices)?;
        Fleet::create_without_other(&dir.join("other-ca"), devices)?;
        Ok(fleet)
    }

    /// [`Fleet::create`] without `other-ca/`.
    ///
    /// # Errors
    /// As [`Fleet::create`].
    pub fn create_without_other(dir: &Path, devices: &[&str]) -> Result<Fleet> {
        create_ca(dir, &["localhost".to_string(), "127.0.0.1".to_string()], true)?;
        for id in devices {
            issue_certificate(dir, id, 30)?;
        }
        Ok(Fleet { dir: dir.to_path_buf(), devices: devices.iter().map(|d| d.to_string()).collect() })
    }

    /// A fleet CA folder made elsewhere (e.g. by `pixgate devices credentials ca DIR`).
    pub fn open(dir: &Path) -> Fleet {
        Fleet { dir: dir.to_path_buf(), devices: Vec::new() }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The fleet CA's device certificates and keys: `{id}.crt`, `{id}.key`.
    pub fn devices_dir(&self) -> PathBuf {
        self.dir.join("devices")
    }

    /// The device ids that have certificates.
    pub fn devices(&self) -> &[String] {
        &self.devices
    }

    /// The fleet CA certificate (PEM): what the broker and the devices trust.
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// The fleet CA's private key (PEM).
    pub fn ca_key(&self) -> PathBuf {
        self.dir.join("ca.key")
    }

    /// The broker's certificate (PEM; `localhost` and `127.0.0.1`).
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    /// The broker's private key (PEM).
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// Device `id`'s certificate from the fleet CA (PEM, subject CN = `id`).
    pub fn device_cert(&self, id: &str) -> PathBuf {
        self.devices_dir().join(format!("{id}.crt"))
    }

    /// Device `id`'s private key (PEM).
    pub fn device_key(&self, id: &str) -> PathBuf {
        self.devices_dir().join(format!("{id}.key"))
    }

    /// The unrelated CA's device certificates and keys (`{id}.crt`, `{id}.key`, CN = id):
    /// certificates the fleet CA does not vouch for.
    pub fn other_ca_dir(&self) -> PathBuf {
        self.dir.join("other-ca").join("devices")
    }

    /// The `PIXGATE_MQTT__*` settings for pixgate's device listener on TLS with this
    /// fleet: its server certificate, client certificates from the fleet CA, the CA's
    /// revocation list, and only devices the registry has enabled.
    pub fn gateway_env(&self) -> Vec<(&'static str, String)> {
        let p = |f: &str| self.dir.join(f).display().to_string();
        vec![
            ("PIXGATE_MQTT__PLAIN", "false".into()),
            ("PIXGATE_MQTT__ANONYMOUS", "false".into()),
            ("PIXGATE_MQTT__REQUIRE_REGISTERED", "true".into()),
            ("PIXGATE_MQTT__TLS__CERT", p("server.crt")),
            ("PIXGATE_MQTT__TLS__KEY", p("server.key")),
            ("PIXGATE_MQTT__TLS__CLIENT_CA", p("ca.crt")),
            ("PIXGATE_MQTT__TLS__CRLS", format!("[\"{}\"]", p("crl.pem"))),
        ]
    }
}
