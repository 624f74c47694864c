//! `pixgate flags` and `pixgate flags set KIND on|off`: the effect flags of a cutover
//! ([`crate::model::flags`]). Like `pixgate outbox`, they ask the running gateway at
//! `http.listen` (switching needs the admin token, [`crate::ops::admin`]), or change the
//! outbox file at `outbox.path` when none runs: the next start reads them from there.

use crate::cli::inspect::{self, Target};
use crate::config::Config;
use crate::ops::flags;
use clap::{Subcommand, ValueEnum};

/// `pixgate flags …`
#[derive(Debug, Subcommand)]
pub enum FlagsCmd {
    /// Every effect kind's flag (the default).
    List,
    /// Switches an effect kind on or off. Off: its effects are decided and counted
    /// (`skipped_by_flag`) but neither queued nor dead-lettered, and offsets move on.
    Set {
        /// `display_qr`, `payment_confirmed`, `print_receipt` or `charge_expired`.
        kind: String,
        /// `on` or `off`.
        state: State,
    },
}

/// A flag's state on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum State {
    /// Carried out.
    On,
    /// Skipped.
    Off,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::On => "on",
            State::Off => "off",
        }
    }
}

/// Runs a `flags` command; prints the flags as JSON after it, exits 1 when it was refused
/// (the reason on stderr).
///
/// # Errors
/// Neither the gateway nor the outbox file could be reached.
pub fn command(cfg: &Config, cmd: Option<FlagsCmd>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let token = cfg.http.admin_token()?;
    let target = Target { http_listen: &cfg.http.listen, admin_token: token.as_deref(), path: &cfg.outbox.path };
    let ok = rt.block_on(async {
        match cmd.unwrap_or(FlagsCmd::List) {
            FlagsCmd::List => {
                inspect::run(&target, "/flags".into(), false, |o| Ok(flags::listing(&flags::load(o)?))).await
            }
            FlagsCmd::Set { kind, state } => {
                let (kind, on) = match flags::parse(&kind, state.as_str()) {
                    Ok(parsed) => parsed,
                    Err(e) => anyhow::bail!(e),
                };
                let path = format!("/flags/{}/{}", kind.as_str(), state.as_str());
                inspect::run(&target, path, true, |o| Ok(flags::set(o, &flags::load(o)?, kind, on)?)).await
            }
        }
    })?;
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
