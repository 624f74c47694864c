//! Device secrets, kept only as keyed hashes.
//!
//! A device that does not present a client certificate proves who it is, over TLS, with a
//! random secret of 256 bits issued once (`pixgate devices credentials issue ID`) and sent as
//! its MQTT password. pixgate keeps `HMAC-SHA256(key, secret)` only, in a JSON file
//! (`mqtt.credentials`), with the key in a second file beside it (`{file}.key`, 32 random
//! bytes, mode 0600): the hashes alone do not let anyone test guesses offline. A fast keyed
//! hash suits a random secret (no dictionary to slow down); a slow password hash would make
//! a fleet of 10,000 devices reconnecting after a restart cost minutes of CPU. Verification
//! compares in constant time (`ring::hmac::verify`).
//!
//! A printer on Epson Server Direct Print can only prove itself with HTTP Digest (RFC 7616,
//! MD5), which needs the server to hold `MD5(id:realm:secret)` ("HA1"): a secret issued
//! with `--digest` (30 characters, [`DIGEST_SECRET_BYTES`]) also keeps its HA1 for
//! [`DIGEST_REALM`]. An HA1 opens that realm to
//! whoever reads it, as an htdigest file does: only such printers have one, and the file is
//! its owner's alone.
//!
//! File shape: `{"devices": {"<id>": {"hmac_sha256": "<64 hex>", "issued_at": "<RFC 3339>",
//! "digest_md5": "<32 hex, only with --digest>"}}}`.

use base64::Engine;
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Bytes of a secret (256 bits; the issue asks at least 128).
pub const SECRET_BYTES: usize = 32;

/// Bytes of a secret issued with `--digest` (176 bits): 30 base64url characters, the longest
/// password an Epson printer's WebConfig takes.
pub const DIGEST_SECRET_BYTES: usize = 22;

/// The HTTP Digest realm of the HA1s kept (`--digest`), and of the challenges pixgate sends.
pub const DIGEST_REALM: &str = "pixgate";

/// What can go wrong reading or writing the credentials.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The file or its key cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not the expected JSON.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// The key file does not hold 32 bytes.
    #[error("{0}: the key must be 32 bytes")]
    BadKey(PathBuf),
    /// The system random generator failed.
    #[error("no randomness available")]
    Random,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    devices: BTreeMap<String, Entry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    hmac_sha256: String,
    issued_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    digest_md5: Option<String>,
}

/// The secrets of a fleet, loaded from `path` and its key.
#[derive(Debug)]
pub struct Credentials {
    path: PathBuf,
    key: hmac::Key,
    devices: BTreeMap<String, Vec<u8>>,
    /// HA1s (hex) of the secrets issued with `--digest`.
    digests: BTreeMap<String, String>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CredentialsError + '_ {
    move |source| CredentialsError::Io { path: path.to_path_buf(), source }
}

/// The key file of the credentials `path`: `{path}.key`.
pub fn key_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".key");
    PathBuf::from(p)
}

impl Credentials {
    /// Loads `path` (absent: no device has a secret yet) and its key (absent: created when
    /// `create_key`, for issuing; otherwise no secret can verify).
    ///
    /// # Errors
    /// A file cannot be read or parsed, or the key cannot be created.
    pub fn load(path: &Path, create_key: bool) -> Result<Credentials, CredentialsError> {
        let kp = key_path(path);
        let key = match std::fs::read(&kp) {
            Ok(k) if k.len() == 32 => k,
            Ok(_) => return Err(CredentialsError::BadKey(kp)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create_key => {
                let mut k = vec![0u8; 32];
                SystemRandom::new().fill(&mut k).map_err(|_| CredentialsError::Random)?;
                write_atomic(&kp, &k, true)?;
                k
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io(&kp)(e)),
        };
        let file: File = match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|source| CredentialsError::Json { path: path.to_path_buf(), source })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => File::default(),
            Err(e) => return Err(io(path)(e)),
        };
        let digests = file.devices.iter().filter_map(|(id, e)| Some((id.clone(), e.digest_md5.clone()?))).collect();
        let devices =
            file.devices.into_iter().filter_map(|(id, e)| Some((id, hex::decode(e.hmac_sha256).ok()?))).collect();
        Ok(Credentials { path: path.to_path_buf(), key: hmac::Key::new(hmac::HMAC_SHA256, &key), devices, digests })
    }

    /// Whether `secret` is the one issued to `id` (constant time in the secret).
    pub fn verify(&self, id: &str, secret: &[u8]) -> bool {
        self.devices.get(id).is_some_and(|tag| hmac::verify(&self.key, secret, tag).is_ok())
    }

    /// `id`'s HA1 for [`DIGEST_REALM`] (32 lower-case hex), if its secret was issued with
    /// `--digest`.
    pub fn digest_ha1(&self, id: &str) -> Option<&str> {
        self.digests.get(id).map(String::as_str)
    }

    /// Whether `id` has a secret.
    pub fn has(&self, id: &str) -> bool {
        self.devices.contains_key(id)
    }

    /// Issues a new secret to `id` (replacing any earlier one), saves the file and returns
    /// the secret (base64url, 43 characters) to show once.
    ///
    /// # Errors
    /// No randomness, or the file cannot be written.
    pub fn issue(&mut self, id: &str) -> Result<String, CredentialsError> {
        let secret = self.issue_unsaved(id)?;
        self.save()?;
        Ok(secret)
    }

    /// [`Credentials::issue`], also keeping the secret's HA1 for HTTP Digest (module docs).
    ///
    /// # Errors
    /// As [`Credentials::issue`].
    pub fn issue_with_digest(&mut self, id: &str) -> Result<String, CredentialsError> {
        let secret = self.issue_unsaved_of(id, DIGEST_SECRET_BYTES)?;
        self.digests.insert(id.to_string(), ha1(id, &secret));
        self.save()?;
        Ok(secret)
    }

    /// [`Credentials::issue`] for many devices, saving the file once (issuing one by one
    /// rewrites the whole file each time: minutes for a fleet of 10,000). Returns
    /// `(id, secret)` in the order given.
    ///
    /// # Errors
    /// As [`Credentials::issue`]; nothing is saved then.
    pub fn issue_many<'a>(
        &mut self,
        ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<Vec<(String, String)>, CredentialsError> {
        self.issue_many_as(ids, false)
    }

    /// [`Credentials::issue_with_digest`] for many devices, saving the file once.
    ///
    /// # Errors
    /// As [`Credentials::issue`]; nothing is saved then.
    pub fn issue_many_with_digest<'a>(
        &mut self,
        ids: impl IntoIterator<Item = &'a str>,
    ) -> Result<Vec<(String, String)>, CredentialsError> {
        self.issue_many_as(ids, true)
    }

    fn issue_many_as<'a>(
        &mut self,
        ids: impl IntoIterator<Item = &'a str>,
        digest: bool,
    ) -> Result<Vec<(String, String)>, CredentialsError> {
        let issued = ids
            .into_iter()
            .map(|id| {
                let secret = if digest {
                    let secret = self.issue_unsaved_of(id, DIGEST_SECRET_BYTES)?;
                    self.digests.insert(id.to_string(), ha1(id, &secret));
                    secret
                } else {
                    self.issue_unsaved(id)?
                };
                Ok((id.to_string(), secret))
            })
            .collect::<Result<Vec<_>, CredentialsError>>()?;
        self.save()?;
        Ok(issued)
    }

    fn issue_unsaved(&mut self, id: &str) -> Result<String, CredentialsError> {
        self.issue_unsaved_of(id, SECRET_BYTES)
    }

    /// A new secret of `bytes` random bytes for `id`, not saved.
    fn issue_unsaved_of(&mut self, id: &str, bytes: usize) -> Result<String, CredentialsError> {
        let mut raw = vec![0u8; bytes];
        SystemRandom::new().fill(&mut raw).map_err(|_| CredentialsError::Random)?;
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        let tag = hmac::sign(&self.key, secret.as_bytes());
        self.devices.insert(id.to_string(), tag.as_ref().to_vec());
        self.digests.remove(id);
        Ok(secret)
    }

    /// Removes `id`'s secret and saves; returns whether it had one.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn revoke(&mut self, id: &str) -> Result<bool, CredentialsError> {
        let had = self.devices.remove(id).is_some();
        self.digests.remove(id);
        if had {
            self.save()?;
        }
        Ok(had)
    }

    fn save(&self) -> Result<(), CredentialsError> {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let previous: File =
            std::fs::read(&self.path).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
        let devices = self
            .devices
            .iter()
            .map(|(id, tag)| {
                let hash = hex::encode(tag);
                let issued_at = previous
                    .devices
                    .get(id)
                    .filter(|e| e.hmac_sha256 == hash)
                    .map_or_else(|| now.clone(), |e| e.issued_at.clone());
                let digest_md5 = self.digests.get(id).cloned();
                (id.clone(), Entry { hmac_sha256: hash, issued_at, digest_md5 })
            })
            .collect();
        let json = serde_json::to_vec_pretty(&File { devices })
            .map_err(|source| CredentialsError::Json { path: self.path.clone(), source })?;
        write_atomic(&self.path, &json, true)
    }
}

/// `MD5(id:realm:secret)` in lower-case hex, the HA1 of RFC 7616 §3.4.2 for
/// [`DIGEST_REALM`].
pub fn ha1(id: &str, secret: &str) -> String {
    use md5::Digest;
    hex::encode(md5::Md5::digest(format!("{id}:{DIGEST_REALM}:{secret}").as_bytes()))
}

/// Writes `bytes` to `path` through a temporary file renamed over it (a reader, the
/// gateway among them, never sees half a file), creating the folder if needed. A `private`
/// file (a key, the secrets) is readable by its owner only, whatever stood there before.
///
/// # Errors
/// [`CredentialsError::Io`] naming the file that could not be written.
pub fn write_atomic(path: &Path, bytes: &[u8], private: bool) -> Result<(), CredentialsError> {
    use std::io::Write;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let _ = std::fs::remove_file(&tmp);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, if private { 0o600 } else { 0o644 });
    #[cfg(not(unix))]
    let _ = private;
    let mut f = opts.open(&tmp).map_err(io(&tmp))?;
    f.write_all(bytes).and_then(|()| f.sync_all()).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_secrets_verify_wrong_ones_do_not_and_revoked_ones_stop() {
        let dir = std::env::temp_dir().join(format!("pixgate-credentials-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("credentials.json");
        let mut c = Credentials::load(&path, true).unwrap();
        let a = c.issue("a").unwrap();
        let b = c.issue("b").unwrap();
        assert_eq!(a.len(), 43);
        assert_ne!(a, b);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains(&a) && !text.contains(&b), "only hashes are stored: {text}");
        let c = Credentials::load(&path, false).unwrap();
        assert!(c.verify("a", a.as_bytes()));
        assert!(!c.verify("a", b.as_bytes()), "b's secret is not a's");
        assert!(!c.verify("c", a.as_bytes()), "no secret issued");
        let mut c = Credentials::load(&path, false).unwrap();
        assert!(c.revoke("a").unwrap());
        assert!(!Credentials::load(&path, false).unwrap().verify("a", a.as_bytes()));
        assert!(Credentials::load(&path, false).unwrap().verify("b", b.as_bytes()));
        // Another key (the file copied elsewhere without it): nothing verifies.
        std::fs::remove_file(key_path(&path)).unwrap();
        assert!(!Credentials::load(&path, false).unwrap().verify("b", b.as_bytes()));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A secret issued with its Digest hash keeps `MD5(id:pixgate:secret)` across a reload;
    /// issuing again without `--digest`, or revoking, drops it.
    #[test]
    fn a_digest_hash_is_kept_only_when_asked_for() {
        let dir = std::env::temp_dir().join(format!("pixgate-credentials-digest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("credentials.json");
        let mut c = Credentials::load(&path, true).unwrap();
        let secret = c.issue_with_digest("e").unwrap();
        assert_eq!(secret.len(), 30, "what an Epson printer's password field takes");
        c.issue("m").unwrap();
        let c = Credentials::load(&path, false).unwrap();
        let want = hex::encode(<md5::Md5 as md5::Digest>::digest(format!("e:pixgate:{secret}").as_bytes()));
        assert_eq!(c.digest_ha1("e"), Some(want.as_str()));
        assert!(c.verify("e", secret.as_bytes()), "still an ordinary secret too");
        assert_eq!(c.digest_ha1("m"), None, "not asked for");
        let mut c = c;
        c.issue("e").unwrap();
        assert_eq!(Credentials::load(&path, false).unwrap().digest_ha1("e"), None, "issued again without it");
        let mut c = Credentials::load(&path, false).unwrap();
        c.issue_with_digest("e").unwrap();
        c.revoke("e").unwrap();
        assert_eq!(Credentials::load(&path, false).unwrap().digest_ha1("e"), None);
        let many = c.issue_many_with_digest(["x", "y"]).unwrap();
        let c = Credentials::load(&path, false).unwrap();
        for (id, secret) in &many {
            let want = hex::encode(<md5::Md5 as md5::Digest>::digest(format!("{id}:pixgate:{secret}").as_bytes()));
            assert_eq!((secret.len(), c.digest_ha1(id)), (30, Some(want.as_str())), "{id}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn issuing_many_saves_every_secret_once() {
        let dir = std::env::temp_dir().join(format!("pixgate-credentials-many-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("credentials.json");
        let mut c = Credentials::load(&path, true).unwrap();
        let ids: Vec<String> = (0..50).map(|i| format!("d{i}")).collect();
        let issued = c.issue_many(ids.iter().map(String::as_str)).unwrap();
        assert_eq!(issued.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(), ids);
        let c = Credentials::load(&path, false).unwrap();
        for (id, secret) in &issued {
            assert!(c.verify(id, secret.as_bytes()), "{id}");
        }
        assert!(!c.verify("d0", issued[1].1.as_bytes()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
