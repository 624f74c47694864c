//! Who an HTTP request says it is: the user of its `Authorization` header, HTTP Basic
//! (RFC 7617, Star CloudPRNT) or HTTP Digest (RFC 7616, Epson Server Direct Print). Only
//! parsing: whether the credentials are right is for the endpoint that serves the request.

use axum::http::{header, HeaderMap};
use base64::Engine;
use std::collections::HashMap;

/// A request's HTTP Basic user and password: `None` without the header, `Some(None)` when
/// it does not decode.
pub fn basic(headers: &HeaderMap) -> Option<Option<(String, String)>> {
    let value = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic ").or_else(|| v.strip_prefix("basic ")))?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(value.trim()).ok();
    let pair = decoded.as_deref().and_then(|d| std::str::from_utf8(d).ok()).and_then(|d| d.split_once(':'));
    Some(pair.map(|(user, password)| (user.to_string(), password.to_string())))
}

/// The user a request names: HTTP Basic's user, or HTTP Digest's `username`; `None` without
/// credentials or when they do not parse.
pub fn user(headers: &HeaderMap) -> Option<String> {
    if let Some(pair) = basic(headers) {
        return pair.map(|(user, _)| user);
    }
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim_start();
    let rest = value.strip_prefix("Digest ").or_else(|| value.strip_prefix("digest "))?;
    auth_params(rest)?.remove("username")
}

/// `k=v, k="v, with commas", …` (RFC 7235 auth-params; `\` escapes inside quotes); keys
/// lower-cased. `None` when it does not parse.
pub fn auth_params(text: &str) -> Option<HashMap<String, String>> {
    let mut out = HashMap::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(out);
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect::<String>().trim().to_ascii_lowercase();
        if key.is_empty() {
            return None;
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '\\' => value.push(chars.next()?),
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek().copied().filter(|c| *c != ',') {
                value.push(c);
                chars.next();
            }
            value = value.trim().to_string();
        }
        out.insert(key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn parameters_parse_with_quotes_commas_and_escapes() {
        let p = auth_params(r#"username="a\"b", realm="x, y",nc=00000001 , qop=auth"#).unwrap();
        assert_eq!(p["username"], "a\"b");
        assert_eq!(p["realm"], "x, y");
        assert_eq!(p["nc"], "00000001");
        assert_eq!(p["qop"], "auth");
        assert!(auth_params(r#"username="unterminated"#).is_none());
    }

    #[test]
    fn the_user_is_basics_or_digests() {
        let mut h = HeaderMap::new();
        assert_eq!(user(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic cDE6c2VjcmV0")); // p1:secret
        assert_eq!(user(&h), Some("p1".into()));
        assert_eq!(basic(&h), Some(Some(("p1".into(), "secret".into()))));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic !!"));
        assert_eq!(user(&h), None);
        assert_eq!(basic(&h), Some(None));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static(r#"Digest username="p2", realm="pixgate", nonce="n", uri="/sdp", response="r""#),
        );
        assert_eq!(user(&h), Some("p2".into()));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        assert_eq!(user(&h), None);
    }
}
