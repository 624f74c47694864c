//! The reconciliation report: the counts of [`crate::store::reconcile`] added up in
//! windows of event time, as `GET /reconciliation` answers and `pixgate report` prints
//! (JSON, or a table to lay beside the upstream capture's counts).

use crate::store::reconcile::{Window, BUCKET_S};
use crate::store::{Outbox, OutboxError};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The query of `GET /reconciliation` and the options of `pixgate report`, as text.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Query {
    /// RFC 3339; the first window holding it (default: everything kept).
    pub since: Option<String>,
    /// RFC 3339, exclusive (default: no end).
    pub until: Option<String>,
    /// `10m`, `1h`, … a whole number of minutes (default `10m`).
    pub window: Option<String>,
}

/// A window length: `N` followed by `m` (minutes) or `h` (hours), in seconds.
///
/// # Errors
/// Not that shape, or zero.
pub fn parse_window(s: &str) -> Result<u64, String> {
    let bad = || format!("a window is a whole number of minutes or hours, e.g. 10m or 1h, not `{s}`");
    // Not `split_at`: a query string may end in a character of several bytes.
    let (n, unit_s) = match (s.strip_suffix('m'), s.strip_suffix('h')) {
        (Some(n), _) => (n, 60),
        (_, Some(n)) => (n, 3600),
        _ => return Err(bad()),
    };
    let n: u64 = n.parse().map_err(|_| bad())?;
    let secs = n.checked_mul(unit_s).ok_or_else(bad)?;
    if secs == 0 || secs % BUCKET_S != 0 {
        return Err(bad());
    }
    Ok(secs)
}

fn parse_time(what: &str, s: &str) -> Result<u64, String> {
    let t = chrono::DateTime::parse_from_rfc3339(s)
        .map_err(|e| format!("{what} `{s}` is not an RFC 3339 time (2026-11-27T12:00:00Z): {e}"))?;
    Ok(u64::try_from(t.timestamp()).unwrap_or(0))
}

/// The report for `q`: `{"window_s": 600, "windows": [Window, …]}`, windows by topic,
/// then start; only windows with counts.
///
/// # Errors
/// A malformed query (`Err(Ok(text))`), or the outbox cannot be read (`Err(Err(e))`).
pub fn report(outbox: &Outbox, q: &Query) -> Result<Value, Result<String, OutboxError>> {
    let window_s = q.window.as_deref().map_or(Ok(600), parse_window).map_err(Ok)?;
    let since = q.since.as_deref().map_or(Ok(0), |s| parse_time("since", s)).map_err(Ok)?;
    let until = q.until.as_deref().map_or(Ok(u64::MAX), |s| parse_time("until", s)).map_err(Ok)?;
    // Whole windows: the one holding `since` from its start.
    let since = since / window_s * window_s;
    let windows = outbox.reconcile_windows(since, until, window_s).map_err(Err)?;
    Ok(json!({ "window_s": window_s, "windows": windows }))
}

fn labels(m: &BTreeMap<String, u64>) -> String {
    if m.is_empty() {
        return "-".into();
    }
    m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" ")
}

/// The windows as text, one block per window: its topic and span, then each count.
pub fn table(windows: &[Window]) -> String {
    let mut out = String::new();
    for w in windows {
        let _ = writeln!(out, "{} {} .. {}", w.topic, w.start.format("%Y-%m-%dT%H:%M:%SZ"), w.end.format("%H:%M:%SZ"));
        let _ = writeln!(out, "  read            {}", w.read);
        let _ = writeln!(out, "  queued          {}", labels(&w.queued));
        let _ = writeln!(out, "  skipped_by_flag {}", labels(&w.skipped_by_flag));
        let _ = writeln!(out, "  delivered       {}", labels(&w.delivered));
        let _ = writeln!(out, "  superseded      {}", w.superseded);
        let _ = writeln!(out, "  expired         {}", labels(&w.expired));
        let _ = writeln!(out, "  ignored         {}", labels(&w.ignored));
        let _ = writeln!(out, "  dead_lettered   {}", labels(&w.dead_lettered));
    }
    if windows.is_empty() {
        out.push_str("no counts in that span\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_whole_minutes_or_hours() {
        assert_eq!(parse_window("10m"), Ok(600));
        assert_eq!(parse_window("1h"), Ok(3600));
        // A query ending in a character of several bytes, and one that overflows: refused.
        for bad in ["0m", "10", "10s", "m", "", "1.5h", "1€", "é", "18446744073709551615h"] {
            assert!(parse_window(bad).is_err(), "{bad}");
        }
    }
}
