//! Health and stats over HTTP.
//!
//! - `GET /healthz`: the process serves requests (liveness).
//! - `GET /readyz`: 200 only when the consumer loop runs and has polled within the last
//!   10 s; otherwise 503 with the reason. A dead consumer makes readiness fail.
//! - `GET /stats`: the counters of [`crate::stats::Snapshot`] as JSON.

use crate::stats::Stats;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use std::sync::Arc;

/// Longest gap between consumer loop runs that still counts as ready, ms.
pub const MAX_CONSUMER_IDLE_MS: u64 = 10_000;

/// The HTTP routes.
pub fn routes(stats: Arc<Stats>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/stats", get(|State(s): State<Arc<Stats>>| async move { Json(s.snapshot()) }))
        .with_state(stats)
}

async fn ready(State(stats): State<Arc<Stats>>) -> (StatusCode, String) {
    let s = stats.snapshot();
    if !s.consumer_running {
        return (StatusCode::SERVICE_UNAVAILABLE, "consumer not running\n".into());
    }
    if s.consumer_idle_ms > MAX_CONSUMER_IDLE_MS {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("consumer idle for {} ms\n", s.consumer_idle_ms));
    }
    (StatusCode::OK, "ready\n".into())
}

/// Serves the routes on `listen` until `shutdown` resolves.
///
/// # Errors
/// The address cannot be bound.
pub async fn serve(listen: String, stats: Arc<Stats>, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    tracing::info!(%listen, "HTTP health/stats listening");
    axum::serve(listener, routes(stats)).with_graceful_shutdown(shutdown).await?;
    Ok(())
}
