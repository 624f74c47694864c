//! The rumqttc options of pixgate's connections to the external broker: address, client
//! id, session, keep alive, packet sizes and TLS (rustls with the ring provider, the same
//! as the device listener's).

use crate::config::BrokerConfig;
use anyhow::{bail, ensure, Context};
use rumqttc::{MqttOptions, TlsConfiguration, Transport};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A TLS client (ring) trusting only the certificates of the PEM file `ca`, not yet told
/// whether it presents a certificate of its own.
///
/// # Errors
/// `ca` does not read, holds no certificate or one rustls cannot use.
pub fn client_builder(
    ca: &Path,
) -> anyhow::Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).with_context(|| format!("reading {}", ca.display()))? {
        roots
            .add(cert.with_context(|| format!("{}", ca.display()))?)
            .with_context(|| format!("{}: unusable certificate", ca.display()))?;
    }
    ensure!(!roots.is_empty(), "{} holds no certificate", ca.display());
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots))
}

/// The client side of TLS to the broker from `cfg.tls`: its CA, and pixgate's client
/// certificate when given. `None` for `broker.plain`.
///
/// # Errors
/// Neither `tls` nor `plain`, or both; `cert` without `key` or the other way round; a file
/// that cannot be read or holds no certificate or key.
pub fn tls(cfg: &BrokerConfig) -> anyhow::Result<Option<Arc<rustls::ClientConfig>>> {
    let t = match (&cfg.tls, cfg.plain) {
        (Some(_), true) => bail!("broker.plain and broker.tls are both set: choose one"),
        (None, false) => bail!("broker.tls is not configured: give broker.tls.ca (and cert, key), or set broker.plain = true for a loopback demo"),
        (None, true) => return Ok(None),
        (Some(t), false) => t,
    };
    let builder = client_builder(&t.ca)?;
    let config = match (&t.cert, &t.key) {
        (None, None) => builder.with_no_client_auth(),
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .with_context(|| format!("reading {}", cert.display()))?;
            ensure!(!chain.is_empty(), "{} holds no certificate", cert.display());
            let key = PrivateKeyDer::from_pem_file(key).with_context(|| format!("reading {}", key.display()))?;
            builder.with_client_auth_cert(chain, key).context("pixgate's client certificate")?
        }
        _ => bail!("broker.tls.cert and broker.tls.key go together"),
    };
    Ok(Some(Arc::new(config)))
}

/// One connection's options: `client_id`, a clean or persistent session
/// (`clean_session`), and `tls` (`None`: plain TCP).
pub fn mqtt_options(
    cfg: &BrokerConfig,
    client_id: &str,
    clean_session: bool,
    tls: Option<Arc<rustls::ClientConfig>>,
) -> MqttOptions {
    let mut o = MqttOptions::new(client_id, cfg.host.clone(), cfg.port);
    o.set_clean_session(clean_session)
        .set_keep_alive(Duration::from_secs(cfg.keep_alive_s.max(5)))
        .set_inflight(cfg.max_in_flight.max(1))
        .set_max_packet_size(cfg.max_packet_bytes, cfg.max_packet_bytes);
    if let Some(tls) = tls {
        o.set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(tls)));
    }
    o
}
