//! `pixgate report --window 10m --since T [--until T] [--json]`: the reconciliation counts
//! per topic in windows of event time ([`crate::ops::reconciliation`]), from the running
//! gateway (`GET /reconciliation`) or, when none runs, from the outbox file.

use crate::cli::inspect::{self, Target};
use crate::config::Config;
use crate::ops::inspect::InspectError;
use crate::ops::reconciliation::{self, Query};
use crate::store::reconcile::Window;
use clap::Args;

/// `pixgate report`
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Window length: whole minutes or hours (`10m`, `1h`).
    #[arg(long, default_value = "10m")]
    window: String,
    /// From the window holding this time (RFC 3339); default: everything kept.
    #[arg(long)]
    since: Option<String>,
    /// Up to this time, exclusive (RFC 3339); default: no end.
    #[arg(long)]
    until: Option<String>,
    /// JSON (`{"window_s", "windows": […]}`) instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `pixgate report`; exits 1 with the reason on stderr when refused.
///
/// # Errors
/// Neither the gateway nor the outbox file could be reached.
pub fn command(cfg: &Config, args: &ReportArgs) -> anyhow::Result<()> {
    let q = Query { since: args.since.clone(), until: args.until.clone(), window: Some(args.window.clone()) };
    if let Err(e) = reconciliation::parse_window(&args.window) {
        anyhow::bail!(e);
    }
    let mut path = format!("/reconciliation?window={}", args.window);
    for (name, v) in [("since", &q.since), ("until", &q.until)] {
        if let Some(v) = v {
            // RFC 3339 has `+` in offsets: encoded for the query string.
            path.push_str(&format!("&{name}={}", v.replace('+', "%2B")));
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let token = cfg.http.admin_token()?;
    let target = Target { http_listen: &cfg.http.listen, admin_token: token.as_deref(), path: &cfg.outbox.path };
    let (ok, body) = rt.block_on(inspect::fetch(&target, path, false, |o| {
        reconciliation::report(o, &q).map_err(|e| match e {
            Ok(text) => InspectError::NotFound(text),
            Err(e) => InspectError::Outbox(e),
        })
    }))?;
    if !ok || args.json {
        inspect::print_result(ok, &body);
        if !ok {
            std::process::exit(1);
        }
        return Ok(());
    }
    let windows: Vec<Window> = serde_json::from_value(body["windows"].clone())?;
    print!("{}", reconciliation::table(&windows));
    Ok(())
}
