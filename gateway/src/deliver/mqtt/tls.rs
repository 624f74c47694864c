//! TLS for the device listener: rustls with ring, TLS 1.2 and 1.3 only, the fleet CA's
//! client certificates (optional per device: a device may use a secret instead) with its
//! revocation lists, and the files re-read when they change.

use crate::config::TlsConfig;
use anyhow::{bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

/// The current server configuration, replaced when the files change.
#[derive(Debug)]
pub struct Tls {
    files: TlsConfig,
    current: RwLock<(Arc<ServerConfig>, Vec<Option<SystemTime>>)>,
}

impl Tls {
    /// Loads the files of `cfg`.
    ///
    /// # Errors
    /// A file is missing or is not PEM of the right kind, the key does not match, or the
    /// CA is not a usable trust anchor.
    pub fn load(cfg: &TlsConfig) -> anyhow::Result<Tls> {
        let config = server_config(cfg)?;
        let stamps = stamps(cfg);
        Ok(Tls { files: cfg.clone(), current: RwLock::new((config, stamps)) })
    }

    /// The configuration for the next handshake.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).0.clone()
    }

    /// Re-reads the files if any changed since the last load. A change that does not load
    /// (a half-written file, a key that does not match) keeps the previous configuration
    /// and is logged; it is tried again at the next change.
    pub fn reload_if_changed(&self) {
        let now = stamps(&self.files);
        let mut current = self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if now == current.1 {
            return;
        }
        match server_config(&self.files) {
            Ok(config) => {
                tracing::info!(cert = %self.files.cert.display(), crls = self.files.crls.len(), "device TLS files reloaded");
                *current = (config, now);
            }
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "device TLS files changed but do not load; keeping the previous ones");
                current.1 = now;
            }
        }
    }

    /// Checks the files every `reload_ms` until the process ends.
    pub fn watch(self: Arc<Self>) {
        let period = Duration::from_millis(self.files.reload_ms.max(100));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let tls = self.clone();
                let _ = tokio::task::spawn_blocking(move || tls.reload_if_changed()).await;
            }
        });
    }
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

/// The device id a client certificate names: its subject's first CN, else its first DNS
/// subject alternative name. `None` when it has neither or does not parse (rustls already
/// checked its signature, validity and revocation).
pub fn certificate_identity(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    if let Some(cn) = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()) {
        return Some(cn.to_string());
    }
    let san = cert.subject_alternative_name().ok()??;
    san.value.general_names.iter().find_map(|n| match n {
        x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
        _ => None,
    })
}
