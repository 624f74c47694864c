//! Who is connecting: the CONNECT checked against the TLS client certificate, the device
//! secrets and the registry, before the device gets a session.

use super::access::{self, Rule};
use crate::model::{Directory, Standing};
use crate::store::credentials::{key_path, Credentials};
use rumqttc::mqttbytes::v4::{ConnectReturnCode, Login};
use std::path::PathBuf;
use std::sync::RwLock;
use std::time::SystemTime;

/// What the socket says of the peer before its CONNECT.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Its address.
    pub addr: std::net::SocketAddr,
    /// Whether the connection is TLS.
    pub tls: bool,
    /// The device id its verified client certificate names, if it presented one.
    pub certificate: Option<String>,
    /// That certificate's serial number.
    pub serial: Option<Vec<u8>>,
}

/// What a device proved its identity with, kept for as long as it is connected so that a
/// revocation reaches connections already up.
#[derive(Clone)]
pub enum Credential {
    /// A client certificate with this serial number.
    Certificate(Vec<u8>),
    /// The secret it sent as its password.
    Secret(String),
    /// None (`mqtt.anonymous`).
    Anonymous,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Certificate(serial) => write!(f, "Certificate({})", hex::encode(serial)),
            Credential::Secret(_) => write!(f, "Secret(…)"),
            Credential::Anonymous => write!(f, "Anonymous"),
        }
    }
}

/// A refusal: the rule broken and the CONNACK code to answer with.
pub type Refusal = (Rule, ConnectReturnCode);

/// The device secrets file, re-read when it or its key changes (checked at each CONNECT
/// that uses a secret: one `stat` of two files).
#[derive(Debug)]
pub struct Secrets {
    path: PathBuf,
    /// The files' modification times when loaded, and what loaded.
    loaded: RwLock<(Option<Stamp>, Option<Credentials>)>,
}

/// Modification times of the secrets file and of its key.
type Stamp = (Option<SystemTime>, Option<SystemTime>);

impl Secrets {
    /// The secrets in `path` (read on first use).
    pub fn new(path: PathBuf) -> Secrets {
        Secrets { path, loaded: RwLock::new((None, None)) }
    }

    fn stamp(&self) -> Stamp {
        let m = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        (m(&self.path), m(&key_path(&self.path)))
    }

    /// Whether the files changed since they were last read (the next [`Secrets::verify`]
    /// reads them again).
    pub fn changed(&self) -> bool {
        let stamp = self.stamp();
        self.loaded.read().unwrap_or_else(std::sync::PoisonError::into_inner).0 != Some(stamp)
    }

    /// Whether `secret` is `id`'s. A file that does not load verifies nothing (logged).
    pub fn verify(&self, id: &str, secret: &[u8]) -> bool {
        self.with(|c| c.verify(id, secret))
    }

    /// `id`'s HTTP Digest HA1, if its secret was issued with `--digest`.
    pub fn digest_ha1(&self, id: &str) -> Option<String> {
        self.with(|c| c.digest_ha1(id).map(String::from))
    }

    /// `f` on the secrets, read again first if their files changed.
    fn with<T: Default>(&self, f: impl Fn(&Credentials) -> T) -> T {
        let stamp = self.stamp();
        {
            let loaded = self.loaded.read().unwrap_or_else(std::sync::PoisonError::into_inner);
            if loaded.0 == Some(stamp) {
                return loaded.1.as_ref().map(&f).unwrap_or_default();
            }
        }
        let mut loaded = self.loaded.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        let creds = Credentials::load(&self.path, false)
            .map_err(|e| tracing::error!(error = %e, "device secrets do not load; no secret verifies until they do"))
            .ok();
        *loaded = (Some(stamp), creds);
        loaded.1.as_ref().map(f).unwrap_or_default()
    }
}

/// How CONNECTs are judged.
#[derive(Debug)]
pub struct Authenticator {
    /// Device secrets, if configured.
    pub secrets: Option<Secrets>,
    /// Plain TCP, no credentials: the client id is the identity (`mqtt.anonymous`).
    pub anonymous: bool,
    /// Only devices the registry has enabled (`mqtt.require_registered`).
    pub require_registered: bool,
}

impl Authenticator {
    /// The device that `client_id` with `login` from `peer` is, or why it is refused.
    /// Identity comes from the certificate when there is one, else from the secret (TLS
    /// only), else from the client id when anonymous access is on; the client id must name
    /// that same device; then the registry must have it enabled.
    pub fn authenticate(
        &self,
        client_id: &str,
        login: Option<&Login>,
        peer: &Peer,
        directory: &Directory,
    ) -> Result<(String, Credential), Refusal> {
        use ConnectReturnCode::{BadClientId, NotAuthorized};
        let Some(device) = access::device_of_client_id(client_id) else {
            return Err((Rule::ClientId, BadClientId));
        };
        let credential;
        if let Some(cert) = &peer.certificate {
            if cert != device {
                return Err((Rule::IdentityMismatch, NotAuthorized));
            }
            credential = Credential::Certificate(peer.serial.clone().unwrap_or_default());
        } else if let Some(login) = login.filter(|l| !l.password.is_empty()) {
            // A secret never travels in clear: refused even when it would verify.
            let Some(secrets) = self.secrets.as_ref().filter(|_| peer.tls) else {
                return Err((Rule::BadCredentials, NotAuthorized));
            };
            if login.username != device {
                return Err((Rule::IdentityMismatch, NotAuthorized));
            }
            if !secrets.verify(device, login.password.as_bytes()) {
                return Err((Rule::BadCredentials, NotAuthorized));
            }
            credential = Credential::Secret(login.password.clone());
        } else if !self.anonymous || peer.tls {
            return Err((Rule::NoCredentials, NotAuthorized));
        } else {
            credential = Credential::Anonymous;
        }
        if let Some(rule) = self.registry_refusal(device, directory) {
            return Err((rule, NotAuthorized));
        }
        Ok((device.to_string(), credential))
    }

    /// Why the registry keeps `device` out (with `mqtt.require_registered`): unknown or
    /// disabled. Asked at CONNECT and again whenever the registry changes.
    pub fn registry_refusal(&self, device: &str, directory: &Directory) -> Option<Rule> {
        if !self.require_registered {
            return None;
        }
        match directory.standing(device) {
            Standing::Enabled => None,
            Standing::Disabled => Some(Rule::DisabledDevice),
            Standing::Unknown => Some(Rule::UnknownDevice),
        }
    }

    /// Whether `credential` still proves `device`: its certificate is not on `tls`'s
    /// revocation lists, its secret still verifies.
    pub fn still_valid(&self, device: &str, credential: &Credential, tls: Option<&super::tls::Tls>) -> bool {
        match credential {
            Credential::Certificate(serial) => !tls.is_some_and(|t| t.is_revoked(serial)),
            Credential::Secret(secret) => self.secrets.as_ref().is_some_and(|s| s.verify(device, secret.as_bytes())),
            Credential::Anonymous => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(tls: bool, certificate: Option<&str>) -> Peer {
        Peer { addr: "127.0.0.1:5000".parse().unwrap(), tls, certificate: certificate.map(String::from), serial: None }
    }

    fn login(user: &str, pass: &str) -> Login {
        Login { username: user.into(), password: pass.into() }
    }

    #[test]
    fn identity_comes_from_the_certificate_or_the_secret_and_the_client_id_must_match() {
        let dir = std::env::temp_dir().join(format!("pixgate-auth-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("credentials.json");
        let secret = Credentials::load(&path, true).unwrap().issue("a").unwrap();
        let directory = Directory::default();
        directory.set("a", Some(true));
        directory.set("b", Some(true));
        directory.set("off", Some(false));
        let auth = Authenticator { secrets: Some(Secrets::new(path)), anonymous: false, require_registered: true };
        let check = |id: &str, l: Option<&Login>, p: &Peer| {
            auth.authenticate(id, l, p, &directory).map(|d| d.0).map_err(|e| e.0)
        };

        assert_eq!(check("dev-a", None, &peer(true, Some("a"))), Ok("a".into()));
        assert_eq!(check("dev-b", None, &peer(true, Some("a"))), Err(Rule::IdentityMismatch));
        assert_eq!(check("pixgate-gateway", None, &peer(true, Some("a"))), Err(Rule::ClientId));
        assert_eq!(check("dev-a", Some(&login("a", &secret)), &peer(true, None)), Ok("a".into()));
        assert_eq!(check("dev-a", Some(&login("a", "guess")), &peer(true, None)), Err(Rule::BadCredentials));
        assert_eq!(check("dev-b", Some(&login("a", &secret)), &peer(true, None)), Err(Rule::IdentityMismatch));
        assert_eq!(check("dev-a", Some(&login("a", &secret)), &peer(false, None)), Err(Rule::BadCredentials));
        assert_eq!(check("dev-a", None, &peer(true, None)), Err(Rule::NoCredentials));
        assert_eq!(check("dev-a", None, &peer(false, None)), Err(Rule::NoCredentials), "not anonymous");
        assert_eq!(check("dev-off", None, &peer(true, Some("off"))), Err(Rule::DisabledDevice));
        assert_eq!(check("dev-gone", None, &peer(true, Some("gone"))), Err(Rule::UnknownDevice));

        let open = Authenticator { secrets: None, anonymous: true, require_registered: false };
        assert_eq!(
            open.authenticate("dev-x", None, &peer(false, None), &directory).map(|d| d.0).map_err(|e| e.0),
            Ok("x".into())
        );
        assert_eq!(
            open.authenticate("dev-x", None, &peer(true, None), &directory).map(|d| d.0).map_err(|e| e.0),
            Err(Rule::NoCredentials),
            "anonymous is for plain TCP only"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
