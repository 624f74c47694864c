//! The dashboard's feed: one task builds a [`View`] every [`FEED_MS`] while at least one
//! page is watching (none is built otherwise), and every watcher gets the latest one. A
//! slow watcher skips views instead of queueing them (a `watch` channel holds one), so the
//! feed's memory does not grow with its watchers' speed.

use super::view::{self, DeadLetterRow, FleetInputs, View};
use super::Dashboard;
use crate::ops::report;
use crate::shutdown::Shutdown;
use crate::store::OutboxError;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How often a view is built while watched, ms.
pub const FEED_MS: u64 = 1_000;

/// How often the registry's devices are read again from the outbox, ms: they change
/// rarely, and decoding a large fleet every second would cost more than the rest.
const ROSTER_MS: u64 = 5_000;

/// Dead letters a view lists.
const DEADLETTERS_SHOWN: usize = 20;

/// What the feed holds: what a watcher gets next.
#[derive(Debug, Clone, Default)]
pub enum FeedState {
    /// No view built yet.
    #[default]
    Waiting,
    /// The latest view, as JSON.
    View(Arc<String>),
    /// The gateway is stopping: watchers end their streams.
    Closed,
}

/// What [`run`] keeps between views.
#[derive(Default)]
struct Between {
    roster: Vec<cdc::Device>,
    roster_at_ms: Option<u64>,
    positions: HashMap<(String, i32), (i64, u64)>,
}

/// Builds views into `tx` until `shutdown` is requested; then says [`FeedState::Closed`], which
/// ends every watcher's stream (so open pages do not hold the HTTP server's graceful
/// shutdown).
pub async fn run(dashboard: Arc<Dashboard>, tx: &watch::Sender<FeedState>, shutdown: Shutdown) {
    let mut tick = tokio::time::interval(Duration::from_millis(FEED_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut between = Between::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.requested() => {}
        }
        if shutdown.is_requested() {
            tx.send_replace(FeedState::Closed);
            return;
        }
        if tx.receiver_count() == 0 {
            continue;
        }
        let d = dashboard.clone();
        // Outbox reads and a JSON encoding: off the async threads.
        let built = tokio::task::spawn_blocking(move || {
            let view = build(&d, &mut between);
            (view, between)
        })
        .await;
        match built {
            Ok((view, b)) => {
                between = b;
                match view.and_then(|v| serde_json::to_string(&v).map_err(OutboxError::from)) {
                    Ok(json) => {
                        tx.send_replace(FeedState::View(Arc::new(json)));
                    }
                    Err(e) => tracing::warn!(error = %e, "dashboard view not built; trying again"),
                }
            }
            Err(e) => {
                // Tried again at the next tick: ended here, the page would show a frozen
                // view as live, and a shutdown would never close its streams.
                tracing::error!(error = %e, "dashboard view task failed; trying again");
                between = Between::default();
            }
        }
    }
}

fn build(d: &Dashboard, between: &mut Between) -> Result<View, OutboxError> {
    let now_ms = d.health.now_ms();
    if between.roster_at_ms.is_none_or(|at| now_ms.saturating_sub(at) >= ROSTER_MS) {
        between.roster = d
            .outbox
            .devices()?
            .into_iter()
            .filter_map(|(id, _, doc)| match cdc::decode_device(&doc?) {
                Ok(device) => Some(device),
                Err(e) => {
                    tracing::debug!(device = %id, error = %e, "stored registry entry no longer decodes");
                    None
                }
            })
            .collect();
        between.roster_at_ms = Some(now_ms);
    }
    let (mut stats, _) = report::report(&d.stats, &d.health, &d.flags);
    let window_s = d.reconcile.window_minutes.max(1) * 60;
    stats.reconciliation = d.outbox.reconcile_latest(d.reconcile.stats_windows, window_s)?;
    let online = d.presence.as_ref().map(|p| p.online()).unwrap_or_default();
    let held = d.stats.held_all();
    let queued = d.outbox.queue_depths()?;
    let recent = |device: &str| d.recent.of_device(device);
    let inputs = FleetInputs {
        roster: &between.roster,
        printers: &d.printers,
        online: &online,
        held: &held,
        queued: &queued,
        recent: &recent,
        shown: d.cfg.devices_shown,
    };
    let (fleet, devices) = view::fleet(&inputs);
    let partitions = view::partition_rows(d.health.partitions(), &between.positions, now_ms);
    between.positions = partitions
        .iter()
        .filter_map(|p| Some(((p.offsets.topic.clone(), p.offsets.partition), (p.offsets.position?, now_ms))))
        .collect();
    let deadletters = d.outbox.latest_deadletters(DEADLETTERS_SHOWN)?.iter().map(DeadLetterRow::of).collect();
    Ok(View { at: d.clock.now().to_rfc3339(), stats, fleet, devices, partitions, deadletters })
}
