//! Who may use the admin endpoints: the outbox and dead letters (they hold payers' names
//! and receipts), replay, and the test clock. `/healthz`, `/readyz`, `/stats` and
//! `/metrics` stay open.
//!
//! The rule:
//! - with an admin token (`http.admin_token` or `http.admin_token_file`), a request needs
//!   `Authorization: Bearer TOKEN`, whatever address it comes from;
//! - without one, the admin endpoints answer only when the HTTP listener is bound to a
//!   loopback address (whoever reaches it is on the machine, as with the outbox file); on
//!   any other address they refuse every request, and the gateway warns at start. A web
//!   page open in a browser on the machine is not "on the machine": a request whose `Host`
//!   or `Origin` names anything but a loopback address or `localhost` (a page's
//!   cross-site POST, a DNS rebinding) is refused, as a browser adds no token by itself.
//!
//! A refused request gets 401 with `WWW-Authenticate: Bearer`, is logged at warn with its
//! path and peer address (never the token it sent), and is counted
//! (`http_unauthorized`).

use crate::telemetry::log_limit::LogLimit;
use crate::telemetry::Stats;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use ring::hmac;
use std::net::SocketAddr;
use std::sync::Arc;

/// Why a request was refused, as logged (`why=…`) and answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer …` header.
    MissingToken,
    /// A bearer token that is not the admin token.
    WrongToken,
    /// No admin token is configured and the listener is not on a loopback address.
    NoTokenConfigured,
    /// No admin token is configured, and the request's `Host` or `Origin` is not this
    /// machine's loopback: a web page's.
    NotFromThisMachine,
}

impl Refusal {
    /// The reason, in words.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::MissingToken => "missing admin token (Authorization: Bearer …)",
            Refusal::WrongToken => "wrong admin token",
            Refusal::NoTokenConfigured => {
                "no admin token is configured (http.admin_token) and http.listen is not a loopback address"
            }
            Refusal::NotFromThisMachine => {
                "no admin token is configured (http.admin_token) and the request's Host or Origin is not a loopback address or localhost"
            }
        }
    }
}

/// The admin access rule of one HTTP listener.
pub struct AdminAccess {
    /// The token's HMAC under a key made at start: [`hmac::verify`] then compares a
    /// presented token in constant time, whatever its length.
    token: Option<(hmac::Key, hmac::Tag)>,
    loopback: bool,
}

impl AdminAccess {
    /// The rule for a listener bound to `listen`, with the admin `token` if one is set.
    ///
    /// # Errors
    /// The system's random source fails (for the key of the token's HMAC).
    pub fn new(token: Option<&str>, listen: SocketAddr) -> anyhow::Result<AdminAccess> {
        let token = match token {
            Some(t) => {
                let rng = ring::rand::SystemRandom::new();
                let key = hmac::Key::generate(hmac::HMAC_SHA256, &rng)
                    .map_err(|_| anyhow::anyhow!("the system's random source failed"))?;
                let tag = hmac::sign(&key, t.as_bytes());
                Some((key, tag))
            }
            None => None,
        };
        Ok(AdminAccess { token, loopback: listen.ip().is_loopback() })
    }

    /// Whether the admin endpoints are closed to everyone: no token and a listener that is
    /// not loopback.
    pub fn closed(&self) -> bool {
        self.token.is_none() && !self.loopback
    }

    /// Judges a request by its `Authorization` header value.
    ///
    /// # Errors
    /// Why it is refused.
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<(), Refusal> {
        let Some((key, tag)) = &self.token else {
            return if self.loopback { Ok(()) } else { Err(Refusal::NoTokenConfigured) };
        };
        let Some(value) = authorization else { return Err(Refusal::MissingToken) };
        // The scheme is case-insensitive (RFC 9110, 11.1).
        let presented = match value.get(..7) {
            Some(scheme) if scheme.eq_ignore_ascii_case(b"bearer ") => &value[7..],
            _ => return Err(Refusal::MissingToken),
        };
        hmac::verify(key, presented, tag.as_ref()).map_err(|_| Refusal::WrongToken)
    }

    /// Judges a request by its `Host` and `Origin` header values: with no token configured,
    /// each one present must name a loopback address or `localhost` (module docs). With a
    /// token, the token is the proof, and these are not read.
    ///
    /// # Errors
    /// [`Refusal::NotFromThisMachine`].
    pub fn check_site(&self, host: Option<&[u8]>, origin: Option<&[u8]>) -> Result<(), Refusal> {
        if self.token.is_some() {
            return Ok(());
        }
        let origin_host = |o: &[u8]| {
            let o = std::str::from_utf8(o).ok()?;
            o.strip_prefix("http://").or_else(|| o.strip_prefix("https://")).map(str::to_string)
        };
        let host_ok = host.is_none_or(|h| std::str::from_utf8(h).is_ok_and(is_loopback_host));
        let origin_ok = origin.is_none_or(|o| origin_host(o).is_some_and(|h| is_loopback_host(&h)));
        if host_ok && origin_ok {
            Ok(())
        } else {
            Err(Refusal::NotFromThisMachine)
        }
    }
}

/// Whether `host` (a `Host` header's `name[:port]`, an IPv6 address in brackets) is a
/// loopback address or `localhost`.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((ip, port)) if port.is_empty() || port.strip_prefix(':').is_some_and(is_port) => ip,
            _ => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return false,
            None => host,
        },
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn is_port(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// What [`require_admin`] needs.
#[derive(Clone)]
pub struct Guard {
    /// The rule.
    pub access: Arc<AdminAccess>,
    /// Where refusals are counted.
    pub stats: Arc<Stats>,
    /// Bounds the refusals' log lines (rule `http_unauthorized`, by the peer's address): a
    /// scanner or a client with a stale token would otherwise write a line per request.
    pub log: Arc<LogLimit>,
}

/// Middleware in front of the admin routes: passes the request on, or answers 401.
pub async fn require_admin(State(guard): State<Guard>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let value = |name| headers.get(name).map(|v: &header::HeaderValue| v.as_bytes());
    let verdict = guard
        .access
        .check(value(header::AUTHORIZATION))
        .and_then(|()| guard.access.check_site(value(header::HOST), value(header::ORIGIN)));
    match verdict {
        Ok(()) => next.run(req).await,
        Err(refusal) => {
            let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(a)| *a);
            if guard.log.admit("http_unauthorized", &peer.map_or_else(|| "-".to_string(), |a| a.ip().to_string())) {
                let peer = peer.map_or_else(|| "-".to_string(), |a| a.to_string());
                tracing::warn!(path = %req.uri().path(), method = %req.method(), peer = %peer, why = refusal.as_str(), "HTTP request refused");
            }
            guard.stats.update(|s| s.http_unauthorized += 1);
            let body = Json(serde_json::json!({ "error": format!("unauthorized: {}", refusal.as_str()) }));
            (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, "Bearer")], body).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().expect("address")
    }

    #[test]
    fn a_token_is_required_once_configured_even_on_loopback() {
        let a = AdminAccess::new(Some("s3cret"), addr("127.0.0.1:8080")).expect("access");
        assert_eq!(a.check(None), Err(Refusal::MissingToken));
        assert_eq!(a.check(Some(b"Basic czNjcmV0")), Err(Refusal::MissingToken));
        assert_eq!(a.check(Some(b"Bearer s3cre")), Err(Refusal::WrongToken));
        assert_eq!(a.check(Some(b"Bearer s3cret2")), Err(Refusal::WrongToken));
        assert_eq!(a.check(Some(b"Bearer ")), Err(Refusal::WrongToken));
        assert_eq!(a.check(Some(b"Bearer s3cret")), Ok(()));
        assert_eq!(a.check(Some(b"bearer s3cret")), Ok(()));
        assert!(!a.closed());
    }

    #[test]
    fn without_a_token_only_a_loopback_listener_answers() {
        let local = AdminAccess::new(None, addr("127.0.0.1:8080")).expect("access");
        assert_eq!(local.check(None), Ok(()));
        let local6 = AdminAccess::new(None, addr("[::1]:8080")).expect("access");
        assert_eq!(local6.check(Some(b"Bearer anything")), Ok(()));
        let open = AdminAccess::new(None, addr("0.0.0.0:8080")).expect("access");
        assert!(open.closed());
        assert_eq!(open.check(None), Err(Refusal::NoTokenConfigured));
        assert_eq!(open.check(Some(b"Bearer anything")), Err(Refusal::NoTokenConfigured));
        let tokened = AdminAccess::new(Some("t"), addr("0.0.0.0:8080")).expect("access");
        assert_eq!(tokened.check(Some(b"Bearer t")), Ok(()));
    }

    /// Without a token, a loopback listener answers the machine's own clients (the CLI,
    /// curl, the dashboard opened at 127.0.0.1 or localhost), not a web page elsewhere that
    /// a browser on the machine runs: a cross-site request carries its page's `Origin`, a
    /// DNS rebinding its own name as `Host`.
    #[test]
    fn without_a_token_a_web_page_elsewhere_is_refused() {
        let local = AdminAccess::new(None, addr("127.0.0.1:8080")).expect("access");
        let ok = |host: Option<&str>, origin: Option<&str>| {
            local.check_site(host.map(str::as_bytes), origin.map(str::as_bytes)).is_ok()
        };
        for host in ["127.0.0.1:8080", "localhost:8080", "LOCALHOST", "localhost.:80", "[::1]:8080", "127.0.0.2"] {
            assert!(ok(Some(host), None), "{host}");
            assert!(ok(Some(host), Some("http://127.0.0.1:8080")), "{host}");
        }
        assert!(ok(None, None), "no Host at all (HTTP/1.0): not a browser");
        assert!(ok(Some("localhost:8080"), Some("https://localhost:8443")));
        for host in
            ["evil.example:8080", "127.0.0.1.evil.example", "localhost:80x", "[::1]x", "[::2]:80", "0.0.0.0:8080"]
        {
            assert!(!ok(Some(host), None), "{host}");
        }
        for origin in ["https://evil.example", "null", "http://evil.example:8080", "file://", "http://localhost.evil"] {
            assert!(!ok(Some("127.0.0.1:8080"), Some(origin)), "{origin}");
        }
        let tokened = AdminAccess::new(Some("t"), addr("127.0.0.1:8080")).expect("access");
        assert_eq!(tokened.check_site(Some(b"evil.example"), Some(b"null")), Ok(()), "the token is the proof");
    }
}
