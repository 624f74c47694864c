//! A panic ends with one log line that names the component it came from and where to read
//! what led to it, in the log's own format (JSON included), before Rust's own message.
//!
//! A panic inside a library (redb, rustls) says only where in the library it happened; the
//! component is the first frame of pixgate's own code on the stack, so the line names it
//! even then. A panic in a spawned task ends that task only; the line is written either
//! way.

/// Installs the hook: the log line ([`panic_line`]), then the default hook's message.
/// Call once, after the logs are set up.
pub fn install() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = message(info.payload()).unwrap_or_else(|| "(no message)".into());
        let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        let thread = std::thread::current().name().unwrap_or("unnamed").to_string();
        let component = component(&std::backtrace::Backtrace::force_capture().to_string());
        tracing::error!(
            component = component.as_deref().unwrap_or("unknown"),
            thread,
            at,
            "{}",
            panic_line(&message, component.as_deref())
        );
        default(info);
    }));
}

/// A panic's message: its payload when that is text (`panic!` with a literal or a format),
/// `None` otherwise.
pub fn message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    payload.downcast_ref::<&str>().map(|s| (*s).to_string()).or_else(|| payload.downcast_ref::<String>().cloned())
}

/// The line logged: what panicked and where to look.
pub fn panic_line(message: &str, component: Option<&str>) -> String {
    format!(
        "pixgate panicked in {}: {message}. This is a bug: the lines before this one in the same log (stderr, `journalctl -u pixgate` for the Debian package) show what led to it; keep them for the report",
        component.unwrap_or("an unknown component")
    )
}

/// The first frame of pixgate's own code in a rendered backtrace (`std::backtrace`'s
/// `N: symbol` lines), skipping this module and the panic machinery: e.g.
/// `gateway::store::outbox::queue::<impl gateway::store::outbox::Outbox>::pending_headers`.
/// `None` when no frame is pixgate's (or the binary has no symbols).
pub fn component(backtrace: &str) -> Option<String> {
    backtrace
        .lines()
        .filter_map(|l| {
            let (n, symbol) = l.trim_start().split_once(": ")?;
            n.parse::<u32>().ok()?;
            Some(symbol.trim())
        })
        .find(|s| {
            (s.starts_with("gateway::") || s.starts_with("<gateway::")) && !s.contains("telemetry::panic::install")
        })
        .map(|s| s.strip_suffix("::{{closure}}").unwrap_or(s).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_component_is_pixgates_first_frame_under_a_librarys_panic() {
        // The shape of the panic the issue saw: redb's cursor, reached from the outbox.
        let bt = "   0: std::backtrace::Backtrace::force_capture
             at /rustc/library/std/src/backtrace.rs:312:13
   1: gateway::telemetry::panic::install::{{closure}}
             at ./gateway/src/telemetry/panic.rs:21:25
   2: std::panicking::rust_panic_with_hook
   3: redb::tree_store::btree_iters::RangeIterState::next
             at /root/.cargo/registry/src/redb-4.6.0/src/tree_store/btree_iters.rs:120:9
   4: gateway::store::outbox::queue::<impl gateway::store::outbox::Outbox>::pending_headers::{{closure}}
             at ./gateway/src/store/outbox/queue.rs:303:9
   5: gateway::app::run::{{closure}}
";
        assert_eq!(
            component(bt).as_deref(),
            Some("gateway::store::outbox::queue::<impl gateway::store::outbox::Outbox>::pending_headers")
        );
        assert_eq!(component("   0: std::rt::lang_start\n   1: main\n"), None);
        let line = panic_line("internal error: entered unreachable code", component(bt).as_deref());
        assert!(line.starts_with("pixgate panicked in gateway::store::outbox::queue::"), "{line}");
        assert!(line.contains("journalctl -u pixgate"), "{line}");
    }

    #[test]
    fn a_real_backtrace_names_the_function_it_was_taken_in() {
        // This binary's own symbols, as the hook reads them.
        let here = component(&std::backtrace::Backtrace::force_capture().to_string());
        assert!(
            here.as_deref().is_some_and(|c| c.ends_with("tests::a_real_backtrace_names_the_function_it_was_taken_in")),
            "{here:?}"
        );
    }
}
