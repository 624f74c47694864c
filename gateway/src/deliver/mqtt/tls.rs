//! TLS for the device listener: rustls with ring, TLS 1.2 and 1.3 only, the fleet CA's
//! client certificates (optional per device: a device may use a secret instead) with its
//! revocation lists, and the files re-read when they change.

use crate::config::TlsConfig;
use anyhow::{bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

/// The current server configuration, replaced when the files change.
#[derive(Debug)]
pub struct Tls {
    files: TlsConfig,
    current: RwLock<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    config: Arc<ServerConfig>,
    stamps: Vec<Option<SystemTime>>,
    /// Serial numbers on the revocation lists, for connections already up.
    revoked: HashSet<Vec<u8>>,
}

impl Tls {
    /// Loads the files of `cfg`.
    ///
    /// # Errors
    /// A file is missing or is not PEM of the right kind, the key does not match, or the
    /// CA is not a usable trust anchor.
    pub fn load(cfg: &TlsConfig) -> anyhow::Result<Tls> {
        let stamps = stamps(cfg);
        let config = server_config(cfg)?;
        let revoked = revoked_serials(cfg)?;
        Ok(Tls { files: cfg.clone(), current: RwLock::new(Loaded { config, stamps, revoked }) })
    }

    /// The configuration for the next handshake.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).config.clone()
    }

    /// Whether a certificate serial number is on the revocation lists as last loaded.
    pub fn is_revoked(&self, serial: &[u8]) -> bool {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).revoked.contains(serial)
    }

    /// How often the files are checked (`mqtt.tls.reload_ms`).
    pub fn reload_every(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.files.reload_ms.max(100))
    }

    /// Re-reads the files if any changed since the last load; returns whether a new
    /// configuration is in use. A change that does not load (a half-written file, a key
    /// that does not match) keeps the previous configuration and is logged; it is tried
    /// again at the next change.
    pub fn reload_if_changed(&self) -> bool {
        let now = stamps(&self.files);
        let mut current = self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if now == current.stamps {
            return false;
        }
        current.stamps = now;
        match server_config(&self.files).and_then(|c| Ok((c, revoked_serials(&self.files)?))) {
            Ok((config, revoked)) => {
                tracing::info!(cert = %self.files.cert.display(), revoked = revoked.len(), "device TLS files reloaded");
                current.config = config;
                current.revoked = revoked;
                true
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "device TLS files changed but do not load; keeping the previous ones");
                false
            }
        }
    }
}

/// The serial numbers on `cfg`'s revocation lists.
fn revoked_serials(cfg: &TlsConfig) -> anyhow::Result<HashSet<Vec<u8>>> {
    let mut serials = HashSet::new();
    for path in &cfg.crls {
        for crl in CertificateRevocationListDer::pem_slice_iter(&read(path)?) {
            let crl = crl.with_context(|| format!("{}: not a PEM CRL", path.display()))?;
            let (_, parsed) = x509_parser::parse_x509_crl(crl.as_ref())
                .map_err(|e| anyhow::anyhow!("{}: not a CRL: {e}", path.display()))?;
            serials.extend(parsed.iter_revoked_certificates().map(|r| r.raw_serial().to_vec()));
        }
    }
    Ok(serials)
}

fn files(cfg: &TlsConfig) -> Vec<&PathBuf> {
    let mut f = vec![&cfg.cert, &cfg.key];
    f.extend(cfg.client_ca.iter());
    f.extend(cfg.crls.iter());
    f
}

fn stamps(cfg: &TlsConfig) -> Vec<Option<SystemTime>> {
    files(cfg).into_iter().map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok()).collect()
}

fn read(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// Builds the rustls server configuration from `cfg`'s files.
///
/// # Errors
/// As [`Tls::load`].
pub fn server_config(cfg: &TlsConfig) -> anyhow::Result<Arc<ServerConfig>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(&cfg.cert)?)
        .collect::<Result<_, _>>()
        .with_context(|| format!("{}: not a PEM certificate chain", cfg.cert.display()))?;
    if certs.is_empty() {
        bail!("{}: no certificate", cfg.cert.display());
    }
    let key = PrivateKeyDer::from_pem_slice(&read(&cfg.key)?)
        .with_context(|| format!("{}: not a PEM private key", cfg.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS versions")?;
    let builder = match &cfg.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(&read(ca)?) {
                let c = c.with_context(|| format!("{}: not a PEM certificate", ca.display()))?;
                roots.add(c).with_context(|| format!("{}: not a usable CA certificate", ca.display()))?;
            }
            let mut crls = Vec::new();
            for path in &cfg.crls {
                for crl in CertificateRevocationListDer::pem_slice_iter(&read(path)?) {
                    crls.push(crl.with_context(|| format!("{}: not a PEM CRL", path.display()))?);
                }
            }
            // A device without a certificate may still log in with its secret: the
            // session refuses a CONNECT that has neither.
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .with_crls(crls)
                .only_check_end_entity_revocation()
                .allow_unauthenticated()
                .build()
                .context("client certificate verifier")?;
            builder.with_client_cert_verifier(verifier)
        }
        None => {
            if !cfg.crls.is_empty() {
                bail!("mqtt.tls.crls given without mqtt.tls.client_ca");
            }
            builder.with_no_client_auth()
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .with_context(|| format!("{} does not match {}", cfg.key.display(), cfg.cert.display()))?;
    Ok(Arc::new(config))
}

/// The device id a client certificate names (its subject's first CN, else its first DNS
/// subject alternative name) and its serial number. `None` when it names none or does not
/// parse (rustls already checked its signature, validity and revocation).
pub fn certificate_identity(cert: &CertificateDer<'_>) -> Option<(String, Vec<u8>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let serial = cert.raw_serial().to_vec();
    if let Some(cn) = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()) {
        return Some((cn.to_string(), serial));
    }
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|n| match n {
        x509_parser::extensions::GeneralName::DNSName(d) => Some((d.to_string(), serial.clone())),
        _ => None,
    })
}
