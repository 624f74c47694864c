//! HTTP Digest authentication, the server's side (RFC 7616, `algorithm=MD5`, `qop=auth`):
//! the one way an Epson printer on Server Direct Print proves who it is.
//!
//! A request without credentials is answered `401` with a challenge ([`Digest::challenge`]);
//! the printer sends the request again with `Authorization: Digest username=…, realm=…,
//! nonce=…, uri=…, qop=auth, nc=…, cnonce=…, response=…`, where `response` is
//! `MD5(HA1:nonce:nc:cnonce:qop:MD5(method:uri))` and HA1 `MD5(username:realm:secret)`
//! (kept by `pixgate devices credentials issue --digest`).
//!
//! Nonces are stateless: the time they were made and an HMAC of it under a key of this
//! process, valid for [`NONCE_TTL`]; an older one is answered with a new challenge marked
//! `stale=true`, so the printer retries without asking anyone for a password. A nonce's
//! count (`nc`) is not tracked: the requests travel over TLS, and replaying one gets the
//! same answer (a poll, or a result already recorded).

use crate::deliver::http_auth::auth_params;
use crate::store::credentials::DIGEST_REALM;
use md5::{Digest as _, Md5};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long a nonce is taken.
pub const NONCE_TTL: Duration = Duration::from_secs(300);

/// Why credentials were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    /// No `Authorization: Digest …` header.
    #[error("no HTTP Digest credentials")]
    Missing,
    /// The header does not parse, lacks a field, or names another realm, algorithm or URI.
    #[error("HTTP Digest credentials do not parse: {0}")]
    Malformed(String),
    /// The nonce is not one of this server's, or is older than [`NONCE_TTL`].
    #[error("stale nonce")]
    Stale,
    /// No HA1 for the user (named), or the response does not match it.
    #[error("wrong secret, or none issued with --digest")]
    Wrong(String),
}

/// The challenges and checks of one server.
pub struct Digest {
    key: hmac::Key,
}

impl Default for Digest {
    fn default() -> Self {
        let mut k = [0u8; 32];
        // ring's generator fails only without an OS source; the nonces are then still
        // bound to this process's start (a weaker key, never a crash).
        let _ = SystemRandom::new().fill(&mut k);
        Digest { key: hmac::Key::new(hmac::HMAC_SHA256, &k) }
    }
}

impl Digest {
    /// The `WWW-Authenticate` value of a `401`: a fresh nonce, `stale=true` when the
    /// client's was only too old.
    pub fn challenge(&self, stale: bool) -> String {
        let nonce = self.nonce(now_s());
        let stale = if stale { ", stale=true" } else { "" };
        format!("Digest realm=\"{DIGEST_REALM}\", qop=\"auth\", algorithm=MD5, nonce=\"{nonce}\"{stale}")
    }

    fn nonce(&self, at_s: u64) -> String {
        let tag = hmac::sign(&self.key, at_s.to_string().as_bytes());
        format!("{at_s:x}.{}", hex::encode(&tag.as_ref()[..16]))
    }

    /// The user `authorization` (the header's value) proves for a request of `method` to
    /// `uri` (its request target, as sent), given each user's HA1 by `ha1`.
    ///
    /// # Errors
    /// [`DigestError`].
    pub fn verify(
        &self,
        authorization: Option<&str>,
        method: &str,
        uri: &str,
        ha1: impl FnOnce(&str) -> Option<String>,
    ) -> Result<String, DigestError> {
        let header = authorization.ok_or(DigestError::Missing)?;
        let rest = header
            .trim_start()
            .strip_prefix("Digest ")
            .or_else(|| header.trim_start().strip_prefix("digest "))
            .ok_or(DigestError::Missing)?;
        let p = auth_params(rest).ok_or_else(|| DigestError::Malformed("unreadable parameters".into()))?;
        let field = |k: &str| p.get(k).map(String::as_str).ok_or_else(|| DigestError::Malformed(format!("no {k}")));
        let (user, realm, nonce, given_uri, response) =
            (field("username")?, field("realm")?, field("nonce")?, field("uri")?, field("response")?);
        if realm != DIGEST_REALM {
            return Err(DigestError::Malformed(format!("realm {realm:?}")));
        }
        if p.get("algorithm").is_some_and(|a| !a.eq_ignore_ascii_case("MD5")) {
            return Err(DigestError::Malformed(format!("algorithm {:?}", p["algorithm"])));
        }
        if given_uri != uri {
            return Err(DigestError::Malformed(format!("uri {given_uri:?} is not the request's {uri:?}")));
        }
        if !self.fresh(nonce) {
            return Err(DigestError::Stale);
        }
        let Some(ha1) = ha1(user) else { return Err(DigestError::Wrong(user.to_string())) };
        let ha2 = md5_hex(&format!("{method}:{given_uri}"));
        let expected = match p.get("qop").map(String::as_str) {
            Some("auth") => {
                let (nc, cnonce) = (field("nc")?, field("cnonce")?);
                md5_hex(&format!("{ha1}:{nonce}:{nc}:{cnonce}:auth:{ha2}"))
            }
            None => md5_hex(&format!("{ha1}:{nonce}:{ha2}")),
            Some(other) => return Err(DigestError::Malformed(format!("qop {other:?}"))),
        };
        // Constant time: compared as HMACs under this server's key.
        let tag = hmac::sign(&self.key, response.to_ascii_lowercase().as_bytes());
        hmac::verify(&self.key, expected.as_bytes(), tag.as_ref()).map_err(|_| DigestError::Wrong(user.to_string()))?;
        Ok(user.to_string())
    }

    fn fresh(&self, nonce: &str) -> bool {
        let Some((at, _)) = nonce.split_once('.') else { return false };
        let Ok(at_s) = u64::from_str_radix(at, 16) else { return false };
        let now = now_s();
        at_s <= now && now - at_s <= NONCE_TTL.as_secs() && self.nonce(at_s) == nonce
    }
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// `MD5(text)` in lower-case hex.
pub fn md5_hex(text: &str) -> String {
    hex::encode(Md5::digest(text.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7616 §3.9.1's example, MD5, with its realm changed to pixgate's: the response a
    /// client computes from the secret is accepted, any other is not.
    fn answer(d: &Digest, nonce: &str, user: &str, secret: &str, uri: &str, qop: bool) -> String {
        let ha1 = md5_hex(&format!("{user}:{DIGEST_REALM}:{secret}"));
        let ha2 = md5_hex(&format!("POST:{uri}"));
        let _ = d;
        if qop {
            let response = md5_hex(&format!("{ha1}:{nonce}:00000001:0a4f113b:auth:{ha2}"));
            format!(
                r#"Digest username="{user}", realm="{DIGEST_REALM}", nonce="{nonce}", uri="{uri}", algorithm=MD5, qop=auth, nc=00000001, cnonce="0a4f113b", response="{response}""#
            )
        } else {
            let response = md5_hex(&format!("{ha1}:{nonce}:{ha2}"));
            format!(
                r#"Digest username="{user}", realm="{DIGEST_REALM}", nonce="{nonce}", uri="{uri}", response="{response}""#
            )
        }
    }

    fn nonce_of(challenge: &str) -> String {
        auth_params(challenge.strip_prefix("Digest ").unwrap()).unwrap()["nonce"].clone()
    }

    #[test]
    fn md5_is_rfc_1321s() {
        assert_eq!(md5_hex(""), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(md5_hex("abc"), "900150983cd24fb0d6963f7d28e17f72");
    }

    #[test]
    fn the_secrets_holder_passes_and_nobody_else() {
        let d = Digest::default();
        let challenge = d.challenge(false);
        assert!(challenge.contains(r#"realm="pixgate""#) && challenge.contains(r#"qop="auth""#), "{challenge}");
        let nonce = nonce_of(&challenge);
        let ha1 = |user: &str| (user == "p").then(|| md5_hex(&format!("p:{DIGEST_REALM}:s3cret")));
        for qop in [true, false] {
            let good = answer(&d, &nonce, "p", "s3cret", "/sdp", qop);
            assert_eq!(d.verify(Some(&good), "POST", "/sdp", ha1), Ok("p".to_string()), "qop {qop}");
            assert_eq!(
                d.verify(Some(&good), "GET", "/sdp", ha1),
                Err(DigestError::Wrong("p".into())),
                "another method"
            );
            assert!(matches!(d.verify(Some(&good), "POST", "/other", ha1), Err(DigestError::Malformed(_))));
        }
        let wrong = answer(&d, &nonce, "p", "guess", "/sdp", true);
        assert_eq!(d.verify(Some(&wrong), "POST", "/sdp", ha1), Err(DigestError::Wrong("p".into())));
        let stranger = answer(&d, &nonce, "q", "s3cret", "/sdp", true);
        assert_eq!(d.verify(Some(&stranger), "POST", "/sdp", ha1), Err(DigestError::Wrong("q".into())));
        assert_eq!(d.verify(None, "POST", "/sdp", ha1), Err(DigestError::Missing));
        assert_eq!(d.verify(Some("Basic cDpz"), "POST", "/sdp", ha1), Err(DigestError::Missing));
    }

    #[test]
    fn a_nonce_not_ours_or_too_old_is_stale() {
        let d = Digest::default();
        let ha1 = |_: &str| Some(md5_hex(&format!("p:{DIGEST_REALM}:s")));
        let other = Digest::default();
        let theirs = nonce_of(&other.challenge(false));
        let forged = answer(&d, &theirs, "p", "s", "/sdp", true);
        assert_eq!(d.verify(Some(&forged), "POST", "/sdp", ha1), Err(DigestError::Stale));
        let old = d.nonce(now_s() - NONCE_TTL.as_secs() - 1);
        let late = answer(&d, &old, "p", "s", "/sdp", true);
        assert_eq!(d.verify(Some(&late), "POST", "/sdp", ha1), Err(DigestError::Stale));
        assert!(d.challenge(true).ends_with("stale=true"));
    }
}
