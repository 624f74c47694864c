//! Printers that fetch their own jobs over Star CloudPRNT's HTTP method: a stock Star
//! network printer pointed at pixgate (its web settings: server URL, user name, password)
//! prints pixgate's receipts with no firmware of pixgate's and no box beside it.
//!
//! The printer polls; the job the dispatcher has in flight for it is offered to the poll,
//! fetched as a picture and confirmed when printed ([`board`]); the queue, order, one job
//! in flight, resends, time to live and dead letters are the dispatcher's, as for every
//! device. Parts: the poll's condition ([`status`]), the picture ([`media`]), the
//! endpoint and who may use it ([`server`]), its sockets ([`listener`]), the seam
//! ([`routed`]); in the central shape, requests passed to the replica holding the
//! printer's queue ([`forward`]).
//!
//! The job token is the job's message id: a printer that printed a job but whose
//! confirmation was lost is offered the same token again, and a printer that remembers
//! its last tokens (as Star's MQTT method requires) does not print it twice.

pub mod board;
pub mod forward;
pub mod listener;
pub mod media;
pub mod mqtt;
pub mod routed;
pub mod server;
pub mod status;

pub use board::Board;
pub use routed::CloudRouted;

use crate::config::{CloudPrntConfig, TlsConfig};
use crate::deliver::mqtt::auth::Secrets;
use crate::model::Directory;
use crate::shutdown::Shutdown;
use crate::telemetry::Stats;
use anyhow::Context;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Starts the server on `cfg.listen` (and the board's offline check, whether or not it
/// listens), until `shutdown`. `secrets` is `mqtt.credentials`; `mqtt` where printers on
/// the MQTT method are told to connect (`None`: they are told to poll);
/// `more` makes the routes served beside CloudPRNT's from its server (Epson Server Direct
/// Print's, `deliver::sdp`), on `cfg.listen` and, when given, on `more_listen` too (with
/// the same TLS and bounds); `forward`, in the central shape, passes requests for queues other
/// replicas hold on to them ([`forward`]). Returns where CloudPRNT listens.
///
/// # Errors
/// A listener cannot be bound, `secrets` is not given, or neither `cfg.plain` nor a usable
/// `tls_cert`/`tls_key` is given.
#[allow(clippy::too_many_arguments)]
pub async fn start(
    cfg: &CloudPrntConfig,
    board: Arc<Board>,
    directory: Arc<Directory>,
    secrets: Option<PathBuf>,
    mqtt: Option<server::MqttListener>,
    (more, more_listen): (impl FnOnce(&server::Server) -> axum::Router, Option<&str>),
    forward: Option<Arc<forward::Forward>>,
    stats: Arc<Stats>,
    shutdown: Shutdown,
) -> anyhow::Result<Option<SocketAddr>> {
    shutdown.spawn(board.clone().watch(shutdown.clone()));
    if cfg.listen.is_none() && more_listen.is_none() {
        return Ok(None);
    }
    let Some(secrets) = secrets else {
        anyhow::bail!("cloudprnt.listen and sdp.listen need mqtt.credentials: the printers' secrets are checked there");
    };
    let tls = if cfg.plain {
        tracing::warn!("cloudprnt.plain: printers' passwords cross the network readable");
        None
    } else {
        let (Some(cert), Some(key)) = (&cfg.tls_cert, &cfg.tls_key) else {
            anyhow::bail!("cloudprnt.listen and sdp.listen need cloudprnt.tls_cert and cloudprnt.tls_key (or cloudprnt.plain for a loopback test)");
        };
        let tls = TlsConfig { cert: cert.clone(), key: key.clone(), client_ca: None, crls: Vec::new(), reload_ms: 0 };
        let config = crate::deliver::mqtt::tls::server_config(&tls).context("cloudprnt TLS")?;
        Some(tokio_rustls::TlsAcceptor::from(config))
    };
    let server = server::Server {
        printers: board.printers(),
        board,
        directory,
        secrets: Some(Arc::new(Secrets::new(secrets))),
        stats,
        log: Arc::default(),
        drawing: Arc::new(tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(2, |n| n.get()))),
        mqtt,
        scheme: if cfg.plain { "http" } else { "https" },
    };
    // On CloudPRNT's listener in any case: in the central shape a replica passes a
    // printer's request to the owner's `cloudprnt.advertise`, whatever its path.
    let more = more(&server);
    let cloud = server::routes(server.clone(), cfg.max_body_bytes).merge(more.clone());
    let serve = |name: &'static str, listen: &str, routes: axum::Router| {
        let (tls, server, forward, shutdown) = (tls.clone(), server.clone(), forward.clone(), shutdown.clone());
        let listen = listen.to_string();
        async move {
            let tcp = tokio::net::TcpListener::bind(&listen)
                .await
                .with_context(|| format!("binding {name}.listen `{listen}`"))?;
            let handshake = Duration::from_millis(cfg.request_timeout_ms.max(1));
            let listener = listener::CloudListener::start(tcp, tls, cfg.max_connections, handshake, server)?;
            let local = axum::serve::Listener::local_addr(&listener)?;
            tracing::info!(listen = %local, tls = !cfg.plain, "{name} server listening");
            let routes = forward::layer(routes, forward);
            let until = shutdown.clone();
            shutdown.spawn(async move {
                if let Err(e) =
                    axum::serve(listener, routes).with_graceful_shutdown(async move { until.requested().await }).await
                {
                    tracing::error!(error = %e, "{name} server failed");
                }
            });
            anyhow::Ok(local)
        }
    };
    if let Some(listen) = more_listen {
        serve("sdp", listen, more).await?;
    }
    match &cfg.listen {
        Some(listen) => Ok(Some(serve("cloudprnt", listen, cloud).await?)),
        None => Ok(None),
    }
}
