//! Throwaway certificates for TLS tests, made with rcgen (ECDSA P-256, ring) into one folder:
//!
//! - `ca.crt`, `ca.key`: the fleet CA;
//! - `server.crt`, `server.key`: the broker, for `localhost` and IP `127.0.0.1`, signed by
//!   the fleet CA (extended key usage: server authentication);
//! - `{id}.crt`, `{id}.key` per device id: a client certificate with subject CN = id,
//!   signed by the fleet CA (extended key usage: client authentication);
//! - `other-ca/`: a second, unrelated CA (`ca.crt`, `ca.key`) and the same device
//!   certificates (`{id}.crt`, `{id}.key`) signed by it, for "a certificate from another CA"
//!   tests.
//!
//! The folder is laid out as `simulators::device::DeviceIdentity::Certificate` expects
//! (`{dir}/{id}.crt`, `{dir}/{id}.key`): [`Fleet::dir`] for the good certificates,
//! [`Fleet::other_ca_dir`] for the foreign ones. Keys are PKCS#8 PEM, which OpenSSL
//! (mosquitto) and rustls both read. Nothing here is fit for production.

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A generated PKI in a folder (see the module documentation for its files).
#[derive(Debug, Clone)]
pub struct Fleet {
    dir: PathBuf,
    devices: Vec<String>,
}

impl Fleet {
    /// Creates `dir` (and `dir/other-ca/`) and writes the fleet CA, the server certificate
    /// and one client certificate per id of `devices`, from each CA. Files already there are
    /// overwritten.
    ///
    /// # Errors
    /// An id that cannot be a file name, a folder or file that cannot be written, or rcgen
    /// failing.
    pub fn create(dir: &Path, devices: &[&str]) -> Result<Fleet> {
        for id in devices {
            anyhow::ensure!(
                !id.is_empty() && !id.contains(['/', '\\']) && *id != "." && *id != "..",
                "device id {id:?} cannot be a file name"
            );
            anyhow::ensure!(!["ca", "server"].contains(id), "device id {id:?} would overwrite {id}.crt");
        }
        let other = dir.join("other-ca");
        std::fs::create_dir_all(&other).with_context(|| format!("creating {}", other.display()))?;

        let ca = new_ca("pixgate test fleet CA")?;
        write_pair(dir, "ca", &ca.pem(), ca.key())?;
        let server = leaf(&ca, "localhost", &["localhost", "127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth)?;
        write_pair(dir, "server", &server.0, &server.1)?;
        for id in devices {
            let (crt, key) = leaf(&ca, id, &[], ExtendedKeyUsagePurpose::ClientAuth)?;
            write_pair(dir, id, &crt, &key)?;
        }

        let foreign = new_ca("unrelated CA")?;
        write_pair(&other, "ca", &foreign.pem(), foreign.key())?;
        for id in devices {
            let (crt, key) = leaf(&foreign, id, &[], ExtendedKeyUsagePurpose::ClientAuth)?;
            write_pair(&other, id, &crt, &key)?;
        }
        Ok(Fleet { dir: dir.to_path_buf(), devices: devices.iter().map(|d| d.to_string()).collect() })
    }

    /// The folder: `ca.*`, `server.*` and the fleet CA's `{id}.crt`/`{id}.key`.
    pub fn dir(&self) -> &Path {
        &self.dir
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
        self.dir.join(format!("{id}.crt"))
    }

    /// Device `id`'s private key (PEM).
    pub fn device_key(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.key"))
    }

    /// The unrelated CA's folder: its `ca.crt`/`ca.key` and a `{id}.crt`/`{id}.key` per
    /// device, signed by it (CN = id too): certificates the fleet CA does not vouch for.
    pub fn other_ca_dir(&self) -> PathBuf {
        self.dir.join("other-ca")
    }
}

/// A self-signed CA certificate named `name`.
fn new_ca(name: &str) -> Result<CertifiedIssuer<'static, KeyPair>> {
    let mut params = CertificateParams::default();
    params.distinguished_name = common_name(name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate().context("generating a CA key")?;
    CertifiedIssuer::self_signed(params, key).with_context(|| format!("self-signing {name}"))
}

/// An end-entity certificate with subject CN `cn` and the given SANs (DNS names or IPs),
/// signed by `ca`; returns its PEM and its key's PEM.
fn leaf(
    ca: &CertifiedIssuer<'static, KeyPair>,
    cn: &str,
    sans: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> Result<(String, KeyPair)> {
    let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .with_context(|| format!("certificate parameters for {cn}"))?;
    params.distinguished_name = common_name(cn);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().context("generating a key")?;
    let cert = params.signed_by(&key, &**ca).with_context(|| format!("signing the certificate of {cn}"))?;
    Ok((cert.pem(), key))
}

fn common_name(cn: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn
}

/// Writes `{dir}/{name}.crt` and `{dir}/{name}.key`.
fn write_pair(dir: &Path, name: &str, cert_pem: &str, key: &KeyPair) -> Result<()> {
    let (crt, key_path) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&crt, cert_pem).with_context(|| format!("writing {}", crt.display()))?;
    std::fs::write(&key_path, key.serialize_pem()).with_context(|| format!("writing {}", key_path.display()))?;
    Ok(())
}
