//! The operator's live page, served by pixgate's HTTP listener:
//!
//! - `GET /dashboard`: the page (HTML with a little JavaScript, no build step, no assets
//!   from elsewhere). It holds no data: what it shows comes from the two routes below, with
//!   the admin token the operator types in (kept in the tab's `sessionStorage`).
//! - `GET /dashboard/events` (admin): server-sent events, one `view` event a second
//!   ([`view::View`] as JSON: devices with their connection, printer status, queue depth and
//!   last jobs; consumer lag and read rate per topic and partition; the effect flags; the
//!   reconciliation windows; the newest dead letters). Built only while a page watches
//!   ([`feed`]).
//! - `GET /dashboard/preview/{device}/{seq}` (admin): the picture of one of a device's
//!   recent or queued jobs as the device shows it, PNG ([`preview`]).
//!
//! The page switches flags (`POST /flags/{kind}/{on|off}`) and replays dead letters
//! (`POST /deadletters/{id}/replay`) through the admin routes that exist for them. Device
//! data, receipts and dead letters hold payers' names: only the page itself is open.

pub mod feed;
pub mod preview;
pub mod view;

use crate::clock::Clock;
use crate::config::{DashboardConfig, ReconcileConfig};
use crate::model::{DirectPrinters, EffectFlags};
use crate::shutdown::Shutdown;
use crate::store::Outbox;
use crate::telemetry::recent::Recent;
use crate::telemetry::{Monitor, Presence, Stats};
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Semaphore};

/// The page.
const PAGE: &str = include_str!("page.html");

/// How long a picture request waits for the one drawing before it, ms.
const PREVIEW_WAIT_MS: u64 = 10_000;

/// What the dashboard reads: the stages' reports, and its own feed and pictures.
pub struct Dashboard {
    /// Counters.
    pub stats: Arc<Stats>,
    /// Health observations (topics, partitions).
    pub health: Arc<Monitor>,
    /// Queues, the registry, dead letters, reconciliation counts.
    pub outbox: Arc<Outbox>,
    /// The effect flags.
    pub flags: Arc<EffectFlags>,
    /// The gateway's clock.
    pub clock: Clock,
    /// Which reconciliation windows a view shows.
    pub reconcile: ReconcileConfig,
    /// `dashboard.*`.
    pub cfg: DashboardConfig,
    /// The last jobs per device, written by the dispatcher.
    pub recent: Arc<Recent>,
    /// Who is connected (`None`: no device listener, as in some tests).
    pub presence: Option<Arc<dyn Presence>>,
    /// How each printer is reached now (direct, cloud, or MQTT).
    pub printers: Arc<DirectPrinters>,
    /// The time zone for a screen job that names none (`delivery.default_time_zone`).
    pub default_time_zone: String,
    feed: watch::Sender<feed::FeedState>,
    drawing: Semaphore,
    pictures: preview::Cache,
}

impl Dashboard {
    /// A dashboard over these parts; [`Dashboard::run_feed`] must run for its events to come.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        stats: Arc<Stats>,
        health: Arc<Monitor>,
        outbox: Arc<Outbox>,
        flags: Arc<EffectFlags>,
        clock: Clock,
        reconcile: ReconcileConfig,
        cfg: DashboardConfig,
        recent: Arc<Recent>,
        presence: Option<Arc<dyn Presence>>,
        printers: Arc<DirectPrinters>,
        default_time_zone: String,
    ) -> Dashboard {
        Dashboard {
            stats,
            health,
            outbox,
            flags,
            clock,
            reconcile,
            cfg,
            recent,
            presence,
            printers,
            default_time_zone,
            feed: watch::channel(feed::FeedState::Waiting).0,
            drawing: Semaphore::new(1),
            pictures: preview::Cache::default(),
        }
    }

    /// Builds views while pages watch, until `shutdown` is requested; then every open
    /// events stream ends.
    pub async fn run_feed(self: Arc<Self>, shutdown: Shutdown) {
        feed::run(self.clone(), &self.feed, shutdown).await;
    }
}

/// The open route: the page.
pub fn page_routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/dashboard", get(|| async { Html(PAGE) }))
}

/// The routes that need the admin token: the events and the pictures.
pub fn admin_routes<S: Clone + Send + Sync + 'static>(dashboard: Arc<Dashboard>) -> Router<S> {
    Router::new()
        .route("/dashboard/events", get(events))
        .route("/dashboard/preview/{device}/{seq}", get(picture))
        .with_state(dashboard)
}

async fn events(State(d): State<Arc<Dashboard>>) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let mut rx = d.feed.subscribe();
    rx.mark_changed();
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        loop {
            rx.changed().await.ok()?;
            let state = rx.borrow_and_update().clone();
            match state {
                feed::FeedState::Waiting => continue,
                feed::FeedState::View(json) => {
                    return Some((Ok(Event::default().event("view").data(json.as_str())), rx))
                }
                feed::FeedState::Closed => return None,
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

/// A job's picture: from the cache, or drawn from its kept bytes (or the outbox, for a
/// queued job) once the one drawing before it is done. 404 when neither has the job, 503
/// when drawing is busy for longer than [`PREVIEW_WAIT_MS`].
async fn picture(State(d): State<Arc<Dashboard>>, Path((device, seq)): Path<(String, u64)>) -> Response {
    let png = |png: Arc<Vec<u8>>| {
        ([(header::CONTENT_TYPE, "image/png"), (header::CACHE_CONTROL, "private, max-age=3600")], png.to_vec())
            .into_response()
    };
    if let Some(cached) = d.pictures.get(&device, seq) {
        return png(cached);
    }
    let Ok(Ok(_permit)) = tokio::time::timeout(Duration::from_millis(PREVIEW_WAIT_MS), d.drawing.acquire()).await
    else {
        return (StatusCode::SERVICE_UNAVAILABLE, "pictures are busy: try again\n").into_response();
    };
    if let Some(cached) = d.pictures.get(&device, seq) {
        return png(cached);
    }
    let dash = d.clone();
    let (dev, s) = (device.clone(), seq);
    let drawn = tokio::task::spawn_blocking(move || -> Result<Option<Vec<u8>>, String> {
        let wire = match dash.recent.wire(&dev, s) {
            Some(w) => w,
            None => match dash.outbox.wire(&dev, s).map_err(|e| e.to_string())? {
                Some(w) => w,
                None => return Ok(None),
            },
        };
        let doc = dash
            .outbox
            .device(&dev)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| preview::PreviewError::UnknownDevice(dev.clone()).to_string())?;
        let registered = cdc::decode_device(&doc).map_err(|e| e.to_string())?;
        preview::draw(&registered, &wire, &dash.default_time_zone).map(Some).map_err(|e| e.to_string())
    })
    .await;
    match drawn {
        Ok(Ok(Some(bytes))) => {
            let bytes = Arc::new(bytes);
            d.pictures.put(&device, seq, bytes.clone());
            png(bytes)
        }
        Ok(Ok(None)) => {
            (StatusCode::NOT_FOUND, format!("job {seq} of {device} is neither recent nor queued\n")).into_response()
        }
        Ok(Err(e)) => {
            tracing::warn!(device = %device, seq, error = %e, "dashboard picture not drawn");
            (StatusCode::UNPROCESSABLE_ENTITY, format!("{e}\n")).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}
