//! Health, stats and inspection over HTTP.
//!
//! - `GET /healthz`: the process serves requests (liveness only).
//! - `GET /readyz`: 200 `ready` when none of the rules of [`crate::ops::readiness`] fails;
//!   otherwise 503 with every reason, one per line, plain text (a dead or idle consumer,
//!   Kafka unreachable, a topic unassigned, stalled, slow or quiet). Either way, one more
//!   line names the effect kinds switched off, if any ([`crate::ops::flags`]).
//! - `GET /stats`: [`crate::ops::report::StatsReport`] as JSON: the counters, with per-topic
//!   throughput, lag and alarms (`topics`) and the readiness reasons (`not_ready`).
//! - `GET /metrics`: the same in the Prometheus text format
//!   ([`crate::ops::metrics::prometheus_text`]).
//! - `GET /outbox`, `GET /outbox/{device}`, `GET /outbox/{device}/{seq}`,
//!   `GET /deadletters`, `GET /deadletters/{id}`, `POST /deadletters/{id}/replay`: what
//!   `pixgate outbox|deadletter` show while the gateway runs ([`crate::ops::inspect`]).
//! - `GET /reconciliation?since=T&until=T&window=10m`: the reconciliation counts in windows
//!   of event time ([`crate::ops::reconciliation`]).
//! - `GET /flags`, `POST /flags/{kind}/{on|off}`: the effect flags, and switching one
//!   ([`crate::ops::flags`]).
//! - `POST /clock/advance?ms=N`: only with `clock.control = true` (tests): moves the
//!   gateway's clock forward ([`crate::clock`]).
//! - `GET /dashboard`, `GET /dashboard/events`, `GET /dashboard/preview/{device}/{seq}`: the
//!   operator's live page, its feed and job pictures ([`crate::ops::dashboard`]).
//!
//! The outbox, dead-letter, flag-switching, clock and dashboard data routes are admin routes:
//! they need the admin token, or a loopback listener when none is configured
//! ([`crate::ops::admin`]). The dashboard page itself is open; it holds no data.

use crate::clock::Clock;
use crate::config::ReconcileConfig;
use crate::ingest::replay::Replay;
use crate::model::EffectFlags;
use crate::ops::admin::{self, AdminAccess};
use crate::ops::dashboard::{self, Dashboard};
use crate::ops::{flags, inspect, reconciliation};
use crate::ops::{metrics, report};
use crate::store::Outbox;
use crate::telemetry::log_limit::LogLimit;
use crate::telemetry::{Monitor, Stats};
use anyhow::Context;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::Value;
use std::sync::Arc;
use tokio::sync::mpsc;

/// What the handlers read and act on.
#[derive(Clone)]
pub struct AppState {
    /// Counters.
    pub stats: Arc<Stats>,
    /// Health observations, judged by the readiness rules.
    pub health: Arc<Monitor>,
    /// The outbox, for inspection and replay.
    pub outbox: Arc<Outbox>,
    /// The gateway's clock.
    pub clock: Clock,
    /// Whether `POST /clock/advance` is served.
    pub clock_control: bool,
    /// The consumer, which carries out replays between its batch writes
    /// ([`Replay`]).
    pub replays: mpsc::Sender<Replay>,
    /// Who may use the admin routes.
    pub admin: Arc<AdminAccess>,
    /// The effect flags the planner reads.
    pub flags: Arc<EffectFlags>,
    /// Which reconciliation windows `/stats` shows.
    pub reconcile: ReconcileConfig,
    /// The live page's feed and pictures.
    pub dashboard: Arc<Dashboard>,
}

type Reply = (StatusCode, Json<Value>);

fn reply(r: Result<Value, inspect::InspectError>) -> Reply {
    match r {
        Ok(v) => (StatusCode::OK, Json(v)),
        Err(e) => (e.status(), Json(serde_json::json!({ "error": e.to_string() }))),
    }
}

/// The HTTP routes: the open ones, and the admin ones behind [`admin::require_admin`],
/// which logs its refusals through `refusals`.
pub fn routes(state: AppState, refusals: Arc<LogLimit>) -> Router {
    let guard = admin::Guard { access: state.admin.clone(), stats: state.stats.clone(), log: refusals };
    let open = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/stats", get(stats))
        .route("/reconciliation", get(reconciliation_report))
        .route("/metrics", get(metrics))
        .route("/flags", get(|State(s): State<AppState>| async move { Json(flags::listing(&s.flags)) }))
        .merge(dashboard::page_routes());
    let admin_routes = Router::new()
        .route("/outbox", get(|State(s): State<AppState>| async move { reply(inspect::outbox_devices(&s.outbox)) }))
        .route(
            "/outbox/{device}",
            get(|State(s): State<AppState>, Path(d): Path<String>| async move {
                reply(inspect::outbox_list(&s.outbox, &d, s.stats.held(&d)))
            }),
        )
        .route(
            "/outbox/{device}/{seq}",
            get(|State(s): State<AppState>, Path((d, seq)): Path<(String, u64)>| async move {
                reply(inspect::outbox_show(&s.outbox, &d, seq))
            }),
        )
        .route(
            "/deadletters",
            get(|State(s): State<AppState>| async move { reply(inspect::deadletter_list(&s.outbox)) }),
        )
        .route(
            "/deadletters/{id}",
            get(|State(s): State<AppState>, Path(id): Path<u64>| async move {
                reply(inspect::deadletter_show(&s.outbox, id))
            }),
        )
        .route("/deadletters/{id}/replay", post(replay))
        .route("/flags/{kind}/{state}", post(switch_flag))
        .route("/clock/advance", post(advance_clock))
        .merge(dashboard::admin_routes(state.dashboard.clone()))
        .route_layer(axum::middleware::from_fn_with_state(guard, admin::require_admin));
    open.merge(admin_routes).with_state(state)
}

async fn ready(State(state): State<AppState>) -> (StatusCode, String) {
    let reasons = report::not_ready(&state.stats, &state.health);
    let off = flags::readiness_line(&state.flags).map(|l| format!("{l}\n")).unwrap_or_default();
    if reasons.is_empty() {
        return (StatusCode::OK, format!("ready\n{off}"));
    }
    (StatusCode::SERVICE_UNAVAILABLE, reasons.iter().map(|r| format!("{r}\n")).chain([off]).collect())
}

/// `/stats`: the report, with the latest reconciliation windows read from the outbox (off
/// the async threads, which the consumer and the devices' sessions share).
async fn stats(State(s): State<AppState>) -> Reply {
    let (mut r, _) = report::report(&s.stats, &s.health, &s.flags);
    let window_s = s.reconcile.window_minutes.max(1) * 60;
    let (outbox, windows) = (s.outbox.clone(), s.reconcile.stats_windows);
    match tokio::task::spawn_blocking(move || outbox.reconcile_latest(windows, window_s)).await {
        Ok(Ok(w)) => r.reconciliation = w,
        Ok(Err(e)) => return reply(Err(e.into())),
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, Json(serde_json::json!({ "error": e.to_string() }))),
    }
    match serde_json::to_value(r) {
        Ok(v) => (StatusCode::OK, Json(v)),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Json(serde_json::json!({ "error": e.to_string() }))),
    }
}

/// Reconciliation reports built at once: each scans the outbox's counts over the span asked
/// (up to the whole retention, in windows as short as a minute: megabytes of JSON), and the
/// route is open, so more callers wait rather than hold memory and threads each.
static RECONCILIATION_REPORTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// The reconciliation counts in windows: 400 for a malformed query. Built off the async
/// threads, two at a time.
async fn reconciliation_report(State(s): State<AppState>, Query(q): Query<reconciliation::Query>) -> Reply {
    let Ok(_permit) = RECONCILIATION_REPORTS.acquire().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, Json(serde_json::json!({ "error": "reports closed" })));
    };
    match tokio::task::spawn_blocking(move || reconciliation::report(&s.outbox, &q)).await {
        Ok(Ok(v)) => (StatusCode::OK, Json(v)),
        Ok(Err(Ok(e))) => (StatusCode::BAD_REQUEST, Json(serde_json::json!({ "error": e }))),
        Ok(Err(Err(e))) => reply(Err(e.into())),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Json(serde_json::json!({ "error": e.to_string() }))),
    }
}

/// Switches an effect kind on or off: stored in the outbox, then applied to the records
/// planned next. 400 for an unknown kind or state.
async fn switch_flag(State(s): State<AppState>, Path((kind, state)): Path<(String, String)>) -> Reply {
    let (kind, on) = match flags::parse(&kind, &state) {
        Ok(parsed) => parsed,
        Err(e) => return (StatusCode::BAD_REQUEST, Json(serde_json::json!({ "error": e }))),
    };
    // A synced redb write: off the async threads.
    let result = tokio::task::spawn_blocking(move || flags::set(&s.outbox, &s.flags, kind, on)).await;
    match result {
        Ok(r) => reply(r.map_err(inspect::InspectError::from)),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, Json(serde_json::json!({ "error": e.to_string() }))),
    }
}

async fn metrics(
    State(state): State<AppState>,
) -> (StatusCode, [(axum::http::header::HeaderName, &'static str); 1], String) {
    let (snapshot, reasons) = report::report(&state.stats, &state.health, &state.flags);
    match metrics::prometheus_text(&snapshot, &reasons) {
        Ok(text) => (StatusCode::OK, [(axum::http::header::CONTENT_TYPE, metrics::PROMETHEUS_CONTENT_TYPE)], text),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(axum::http::header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("encoding the metrics: {e}\n"),
        ),
    }
}

/// Replays into the running gateway: the consumer stores the job in the outbox between two
/// batch writes (so it keeps its place in the device's order), then queues it. 503 when the
/// consumer has stopped: nothing was replayed.
async fn replay(State(s): State<AppState>, Path(id): Path<u64>) -> Reply {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stopped = || {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(
                serde_json::json!({ "error": "the gateway's consumer has stopped: nothing was replayed; try again once it runs" }),
            ),
        )
    };
    if s.replays.send(Replay { id, reply: tx }).await.is_err() {
        return stopped();
    }
    match rx.await {
        Ok(Ok(stored)) => (StatusCode::OK, Json(inspect::replayed(&stored))),
        Ok(Err(e)) => reply(Err(e.into())),
        Err(_) => stopped(),
    }
}

#[derive(serde::Deserialize)]
struct Advance {
    ms: i64,
}

async fn advance_clock(State(s): State<AppState>, Query(q): Query<Advance>) -> Reply {
    if !s.clock_control {
        return (
            StatusCode::FORBIDDEN,
            Json(serde_json::json!({"error": "clock control is off (clock.control = false)"})),
        );
    }
    let offset = s.clock.advance(q.ms);
    tracing::warn!(advanced_ms = q.ms, offset_ms = offset, "clock moved forward (testing)");
    (StatusCode::OK, Json(serde_json::json!({"offset_ms": offset, "now": s.clock.now().to_rfc3339()})))
}

/// Binds the HTTP listener on `listen` (`HOST:PORT`, `http.listen`). Done before anything
/// else starts, so that a port in use stops the gateway at once instead of leaving it
/// running without health endpoints.
///
/// # Errors
/// The address cannot be bound (in use, not local, no permission).
pub async fn bind(listen: &str) -> anyhow::Result<tokio::net::TcpListener> {
    let listener =
        tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding http.listen `{listen}`"))?;
    tracing::info!(%listen, "HTTP health/stats listening");
    Ok(listener)
}

/// Serves the routes on `listener` (from [`bind`]) until `shutdown` resolves.
///
/// # Errors
/// The server fails.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let refusals = Arc::new(LogLimit::default());
    // The peer's address goes into the log line of a refused admin request.
    let app = routes(state, refusals.clone()).into_make_service_with_connect_info::<std::net::SocketAddr>();
    let served = axum::serve(listener, app).with_graceful_shutdown(shutdown);
    // The last window of a burst of refusals is summed up even when none follows it.
    let summaries = async {
        let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
        loop {
            tick.tick().await;
            refusals.log_due();
        }
    };
    tokio::select! {
        served = served => served?,
        () = summaries => {}
    }
    Ok(())
}
