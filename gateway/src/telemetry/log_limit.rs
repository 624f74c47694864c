//! Log lines that a device or a stranger can provoke, limited: in each window, the first
//! lines of a rule are written in full and the rest are summed up in one line per rule when
//! the window ends, with who provoked them most.
//!
//! A refused socket, a malformed message or a message over a device's rate each wrote a
//! WARN line; a device sending 5,000 malformed acks wrote 5,000 lines, and on an edge box
//! with an SD card a noisy device could fill the disk and bury what matters. The counters
//! (`mqtt_refusals` on `/stats` and `/metrics`) stay exact: only the log is limited.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// How long a window lasts.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Lines of one rule written in full per window.
pub const BURST: u32 = 20;
/// Distinct sources (devices or addresses) kept per rule and window for the summary; the
/// rest are summed as `others`, so a spray from many addresses is bounded too.
const MAX_SOURCES: usize = 1_000;
/// Sources named in a summary line.
const TOP: usize = 5;
/// Characters of a source kept: a client id refused before its device is known is the
/// stranger's own string, up to 64 KiB.
const SOURCE_CHARS: usize = 80;

/// The rules' tallies in the current window (see the module docs).
#[derive(Debug)]
pub struct LogLimit {
    window: Duration,
    burst: u32,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    started: Instant,
    rules: BTreeMap<&'static str, Tally>,
}

#[derive(Debug, Default)]
struct Tally {
    written: u32,
    held_back: u64,
    sources: HashMap<String, u64>,
    others: u64,
}

/// What one rule's lines held back in a window came to: logged as one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The rule (`mqtt_refusals`' label).
    pub rule: &'static str,
    /// Lines not written.
    pub held_back: u64,
    /// The sources with the most lines held back, most first (ties by name), with their
    /// counts; `others` counts those beyond the sources kept.
    pub top: Vec<(String, u64)>,
    /// Lines held back from sources not kept.
    pub others: u64,
}

impl Default for LogLimit {
    fn default() -> Self {
        LogLimit::new(WINDOW, BURST)
    }
}

impl LogLimit {
    /// `burst` lines per rule written in full per `window`.
    pub fn new(window: Duration, burst: u32) -> LogLimit {
        LogLimit { window, burst, state: Mutex::new(State { started: Instant::now(), rules: BTreeMap::new() }) }
    }

    /// Whether a line of `rule` provoked by `source` (a device id or an address) may be
    /// written now; if not, it is tallied for the window's summary. A window that has run
    /// out is summed up first ([`LogLimit::log_due`]).
    pub fn admit(&self, rule: &'static str, source: &str) -> bool {
        self.log_due();
        let mut state = self.lock();
        let tally = state.rules.entry(rule).or_default();
        if tally.written < self.burst {
            tally.written += 1;
            return true;
        }
        tally.held_back += 1;
        let source = source.char_indices().nth(SOURCE_CHARS).map_or(source, |(cut, _)| &source[..cut]);
        if let Some(n) = tally.sources.get_mut(source) {
            *n += 1;
        } else if tally.sources.len() < MAX_SOURCES {
            tally.sources.insert(source.to_string(), 1);
        } else {
            tally.others += 1;
        }
        false
    }

    /// Ends the window if it has run out, returning what each rule held back in it (empty
    /// when nothing was, or the window is still open).
    pub fn due(&self) -> Vec<Summary> {
        let mut state = self.lock();
        let now = Instant::now();
        if now.duration_since(state.started) < self.window {
            return Vec::new();
        }
        state.started = now;
        std::mem::take(&mut state.rules)
            .into_iter()
            .filter(|(_, t)| t.held_back > 0)
            .map(|(rule, t)| {
                let mut top: Vec<(String, u64)> = t.sources.into_iter().collect();
                top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                top.truncate(TOP);
                Summary { rule, held_back: t.held_back, top, others: t.others }
            })
            .collect()
    }

    /// Logs [`LogLimit::due`]'s summaries, one WARN line per rule. Called on each
    /// [`LogLimit::admit`] and by a periodic tick, so the last window of a burst is summed
    /// up even when nothing follows it.
    pub fn log_due(&self) {
        for s in self.due() {
            let top = s.top.iter().map(|(who, n)| format!("{who}×{n}")).collect::<Vec<_>>().join(", ");
            tracing::warn!(
                rule = s.rule,
                held_back = s.held_back,
                top = %top,
                others = s.others,
                window_s = self.window.as_secs(),
                "device log lines held back: the first {} of each rule per window are written in full",
                self.burst
            );
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_first_lines_are_written_and_the_rest_summed_up_per_window() {
        let limit = LogLimit::new(Duration::from_secs(60), 3);
        let admitted: Vec<bool> = (0..5).map(|_| limit.admit("malformed_message", "dev-a")).collect();
        assert_eq!(admitted, [true, true, true, false, false]);
        // Another rule has its own lines; other sources are tallied apart.
        assert!(limit.admit("per_address", "10.0.0.7"));
        for _ in 0..4 {
            limit.admit("malformed_message", "dev-b");
        }
        assert_eq!(limit.due(), [], "the window is still open");
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(
            limit.due(),
            [Summary {
                rule: "malformed_message",
                held_back: 6,
                top: vec![("dev-b".into(), 4), ("dev-a".into(), 2)],
                others: 0
            }],
            "one summary, for the rule that held lines back"
        );
        // A new window: written in full again.
        assert!(limit.admit("malformed_message", "dev-a"));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(limit.due(), [], "nothing held back");
    }

    #[tokio::test(start_paused = true)]
    async fn sources_beyond_the_kept_ones_are_counted_as_others() {
        let limit = LogLimit::new(Duration::from_secs(60), 0);
        for i in 0..MAX_SOURCES + 10 {
            assert!(!limit.admit("per_address", &format!("10.0.{}.{}", i / 256, i % 256)));
        }
        limit.admit("per_address", "10.0.0.0");
        tokio::time::advance(Duration::from_secs(60)).await;
        let due = limit.due();
        assert_eq!(due.len(), 1);
        assert_eq!((due[0].held_back, due[0].others, due[0].top.len()), ((MAX_SOURCES + 11) as u64, 10, TOP));
        assert_eq!(due[0].top[0], ("10.0.0.0".into(), 2), "the most first");
    }

    #[tokio::test(start_paused = true)]
    async fn a_strangers_long_client_id_is_kept_cut_short() {
        let limit = LogLimit::new(Duration::from_secs(60), 0);
        limit.admit("client_id", &"é".repeat(70_000));
        tokio::time::advance(Duration::from_secs(60)).await;
        let due = limit.due();
        assert_eq!(due[0].top, [("é".repeat(SOURCE_CHARS), 1)]);
    }
}
