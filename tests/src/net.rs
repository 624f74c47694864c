//! Small network helpers: free loopback ports and a minimal HTTP GET for `/stats`.

use anyhow::{bail, Context};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// A loopback port that was free a moment ago, and never handed out before by this process:
/// the kernel may give the same ephemeral port to two `bind(0)` calls in a row once the
/// first is closed, and a gateway whose MQTT and HTTP ports were the same could not start.
///
/// # Panics
/// No loopback port can be bound.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("bind a loopback port");
        if given.insert(port) {
            return port;
        }
    }
}

/// `GET path` on `addr` (HTTP/1.0, no keep-alive); returns status code and body.
///
/// # Errors
/// Connection refused, timeout (2 s), or a response that is not HTTP.
pub fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    http_request(addr, "GET", path)
}

/// `POST path` with an empty body on `addr`; as [`http_get`].
///
/// # Errors
/// As [`http_get`].
pub fn http_post(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    http_request(addr, "POST", path)
}

fn http_request(addr: &str, method: &str, path: &str) -> anyhow::Result<(u16, String)> {
    http_request_with(addr, method, path, &[])
}

/// `method path` with an empty body and the extra `headers` (name, value) on `addr`, e.g.
/// `("Authorization", "Bearer …")`; as [`http_get`].
///
/// # Errors
/// As [`http_get`].
pub fn http_request_with(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<(u16, String)> {
    let (code, body) = http_request_bytes(addr, method, path, headers)?;
    Ok((code, String::from_utf8(body).context("the response body is not UTF-8")?))
}

/// [`http_request_with`] for a body that need not be text (a PNG).
///
/// # Errors
/// As [`http_get`].
pub fn http_request_bytes(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> anyhow::Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connect {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let extra: String = headers.iter().map(|(k, v)| format!("{k}: {v}\r\n")).collect();
    write!(s, "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{extra}Content-Length: 0\r\n\r\n")?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let Some(split) = resp.windows(4).position(|w| w == b"\r\n\r\n") else { bail!("malformed HTTP response") };
    let head = std::str::from_utf8(&resp[..split]).context("HTTP head is not UTF-8")?;
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("status code")?;
    Ok((code, resp[split + 4..].to_vec()))
}
