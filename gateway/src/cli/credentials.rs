//! `pixgate devices credentials`: a fleet CA, device certificates and secrets, revocation.
//!
//! A fleet CA folder (`--ca DIR`) holds:
//!
//! | file | what |
//! |---|---|
//! | `ca.crt`, `ca.key` | the fleet CA (ECDSA P-256); `mqtt.tls.client_ca` points at `ca.crt` |
//! | `server.crt`, `server.key` | the device listener's certificate (`mqtt.tls.cert`, `.key`) |
//! | `crl.pem` | the CA's revocation list (`mqtt.tls.crls`), re-signed at each revocation |
//! | `revoked.json` | what `crl.pem` lists: serial (hex) → device id and time |
//! | `devices/{id}.crt`, `devices/{id}.key` | a device's certificate (subject CN = id) and key |
//!
//! A secret (no `--ca`) is 256 random bits shown once; only its keyed hash is kept, in
//! `mqtt.credentials` (`store::credentials`). The gateway re-reads both the revocation
//! list and the secrets when they change: no restart.

use crate::deliver::mqtt::access;
use crate::ops::broker_config;
use crate::store::credentials::{write_atomic, Credentials};
use anyhow::{bail, Context};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, RevokedCertParams, SerialNumber,
};
use ring::rand::{SecureRandom, SystemRandom};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};

/// `pixgate devices credentials …`.
#[derive(Debug, clap::Subcommand)]
pub enum CredentialsCmd {
    /// Create a fleet CA in DIR with a server certificate for the device listener and an
    /// empty revocation list (a throwaway one for a demo, or the start of a real fleet's).
    Ca {
        /// The folder (created; an existing CA in it is kept unless --force).
        dir: PathBuf,
        /// DNS names and IP addresses devices use to reach pixgate (server certificate SANs).
        #[arg(long = "server-name", default_values = ["localhost", "127.0.0.1"])]
        server_names: Vec<String>,
        /// Replace an existing CA (every certificate it signed stops working).
        #[arg(long)]
        force: bool,
    },
    /// Issue credentials to device ID: with --ca, a certificate and key signed by the fleet
    /// CA (written to DIR/devices/; a certificate issued earlier to ID is revoked); without,
    /// a new secret (printed once; its hash is kept in `mqtt.credentials`, replacing an
    /// earlier secret).
    Issue {
        /// The device's registry id.
        id: String,
        /// The fleet CA folder.
        #[arg(long)]
        ca: Option<PathBuf>,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = 825)]
        days: i64,
        /// Also keep the secret's HTTP Digest hash: an Epson printer on Server Direct Print
        /// proves itself with Digest only (docs/operations.md, "Epson Server Direct Print").
        #[arg(long, conflicts_with = "ca")]
        digest: bool,
        /// Also write the secret's entry into this mosquitto password file (replacing the
        /// device's earlier one): a Star printer on CloudPRNT's MQTT method logs in to the
        /// central shape's broker with it (`pixgate devices broker-config mosquitto
        /// --printers-listener`, which names `passwd-printers` in its folder).
        #[arg(long, conflicts_with = "ca")]
        mosquitto_passwd: Option<PathBuf>,
    },
    /// Revoke device ID: with --ca, its certificate goes on the CA's revocation list;
    /// without, its secret is removed from `mqtt.credentials`. A device connected to
    /// pixgate's own listener is disconnected when the gateway next checks the files
    /// (`mqtt.tls.reload_ms`); an external broker refuses it once it reads them again.
    Revoke {
        /// The device's registry id.
        id: String,
        /// The fleet CA folder.
        #[arg(long)]
        ca: Option<PathBuf>,
        /// Also remove the device's entry from this mosquitto password file.
        #[arg(long, conflicts_with = "ca")]
        mosquitto_passwd: Option<PathBuf>,
    },
}

/// Runs `cmd`; `credentials` is `mqtt.credentials` from the configuration.
///
/// # Errors
/// A file cannot be read or written, the id is not a valid device id, or (for secrets)
/// `mqtt.credentials` is not configured.
pub fn run(cmd: &CredentialsCmd, credentials: Option<&Path>) -> anyhow::Result<()> {
    match cmd {
        CredentialsCmd::Ca { dir, server_names, force } => {
            create_ca(dir, server_names, *force)?;
            println!("fleet CA in {}: ca.crt, server.crt/.key, crl.pem", dir.display());
        }
        CredentialsCmd::Issue { id, ca: Some(dir), days, .. } => {
            let (cert, key) = issue_certificate(dir, id, *days)?;
            println!("{}\n{}", cert.display(), key.display());
        }
        CredentialsCmd::Issue { id, ca: None, digest, mosquitto_passwd, .. } => {
            check_id(id)?;
            let path = credentials.context("mqtt.credentials is not configured: where would the secret's hash go?")?;
            // Checked before the secret replaces the old one: a secret whose broker entry
            // cannot be written would lock the printer out.
            let passwd = match mosquitto_passwd {
                Some(file) => Some((file, writable_password_file(file)?)),
                None => None,
            };
            let mut store = Credentials::load(path, true)?;
            let secret = if *digest { store.issue_with_digest(id)? } else { store.issue(id)? };
            eprintln!(
                "secret for {id} (shown once; as a password with the user name {id}: MQTT with the client id dev-{id}, \
                 CloudPRNT{}):",
                if *digest { ", Epson Server Direct Print (HTTP Digest)" } else { "" }
            );
            println!("{secret}");
            if let Some((file, text)) = passwd {
                let line = broker_config::mosquitto_password(id, &secret).map_err(anyhow::Error::msg)?;
                let text = broker_config::with_password_line(&text, id, Some(&line));
                write_password_file(file, &text).context(
                    "the secret above is issued, but its broker entry is not written: issue it again once the file can be written",
                )?;
                eprintln!("{id}'s entry written to {} (restart mosquitto to read it)", file.display());
            }
        }
        CredentialsCmd::Revoke { id, ca: Some(dir), .. } => {
            revoke_certificate(dir, id)?;
            println!("{id}'s certificate is on {}", dir.join("crl.pem").display());
        }
        CredentialsCmd::Revoke { id, ca: None, mosquitto_passwd } => {
            let path = credentials.context("mqtt.credentials is not configured")?;
            let had = Credentials::load(path, false)?.revoke(id)?;
            if let Some(file) = mosquitto_passwd {
                let text = writable_password_file(file)?;
                write_password_file(file, &broker_config::with_password_line(&text, id, None))?;
                eprintln!("{id}'s entry removed from {} (restart mosquitto to read it)", file.display());
            }
            if !had {
                bail!("{id} has no secret in {}", path.display());
            }
            println!("{id}'s secret is revoked");
        }
    }
    Ok(())
}

/// The text of the mosquitto password file `file` (empty when it does not exist yet), once
/// it is known to be writable.
fn writable_password_file(file: &Path) -> anyhow::Result<String> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
    };
    write_password_file(file, &text)?;
    Ok(text)
}

/// Writes the mosquitto password file `file` whole (replaced at once), keeping the mode,
/// owner and group an existing one had (the broker's user must go on reading it); a new
/// one is private to this user.
fn write_password_file(file: &Path, text: &str) -> anyhow::Result<()> {
    let before = std::fs::metadata(file).ok();
    write_atomic(file, text.as_bytes(), true).with_context(|| format!("writing {}", file.display()))?;
    if let Some(m) = before {
        use std::os::unix::fs::MetadataExt;
        std::fs::set_permissions(file, m.permissions())
            .with_context(|| format!("setting the mode of {}", file.display()))?;
        std::os::unix::fs::chown(file, Some(m.uid()), Some(m.gid()))
            .with_context(|| format!("giving {} back its owner and group", file.display()))?;
    }
    Ok(())
}

fn check_id(id: &str) -> anyhow::Result<()> {
    if !access::valid_id(id) {
        bail!("`{id}` is not a device id (1 to {} letters, digits, - or _)", access::MAX_ID_LEN);
    }
    Ok(())
}

fn random_serial() -> anyhow::Result<SerialNumber> {
    let mut b = [0u8; 16];
    SystemRandom::new().fill(&mut b).map_err(|_| anyhow::anyhow!("no randomness available"))?;
    b[0] &= 0x7f; // positive (RFC 5280 §4.1.2.2)
    Ok(SerialNumber::from(b.to_vec()))
}

/// Writes `text` to `path` aside and renamed ([`write_atomic`]); a `private` file (a key)
/// is readable by its owner only.
fn write(path: &Path, text: &str, private: bool) -> anyhow::Result<()> {
    Ok(write_atomic(path, text.as_bytes(), private)?)
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// The CA of `dir` as an issuer.
fn issuer(dir: &Path) -> anyhow::Result<Issuer<'static, KeyPair>> {
    let key = KeyPair::from_pem(&read(&dir.join("ca.key"))?).context("ca.key")?;
    Issuer::from_ca_cert_pem(&read(&dir.join("ca.crt"))?, key).context("ca.crt")
}

/// Creates the fleet CA, the server certificate for `server_names` (DNS names or IP
/// addresses) and an empty revocation list in `dir`.
///
/// # Errors
/// A CA exists already (without `force`), or a file cannot be written.
pub fn create_ca(dir: &Path, server_names: &[String], force: bool) -> anyhow::Result<()> {
    if dir.join("ca.key").exists() && !force {
        bail!("{} already holds a CA (ca.key); --force replaces it", dir.display());
    }
    std::fs::create_dir_all(dir.join("devices")).with_context(|| format!("creating {}", dir.display()))?;
    let now = OffsetDateTime::now_utc();
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, "pixgate fleet CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    ca.not_before = now - Duration::hours(1);
    ca.not_after = now + Duration::days(3650);
    ca.serial_number = Some(random_serial()?);
    let ca_cert = ca.self_signed(&ca_key)?;
    write(&dir.join("ca.crt"), &ca_cert.pem(), false)?;
    write(&dir.join("ca.key"), &ca_key.serialize_pem(), true)?;
    let issuer = Issuer::new(ca, ca_key);

    let server_key = KeyPair::generate()?;
    let mut server = CertificateParams::new(server_names.to_vec())?;
    server.distinguished_name.push(DnType::CommonName, server_names.first().map_or("pixgate", String::as_str));
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server.not_before = now - Duration::hours(1);
    server.not_after = now + Duration::days(825);
    server.serial_number = Some(random_serial()?);
    let server_cert = server.signed_by(&server_key, &issuer)?;
    write(&dir.join("server.crt"), &server_cert.pem(), false)?;
    write(&dir.join("server.key"), &server_key.serialize_pem(), true)?;
    write_crl(dir, &issuer, &BTreeMap::new())
}

/// Issues `id` a certificate (subject CN = id, client authentication) signed by the CA in
/// `dir`, valid `days`; returns the certificate's and the key's paths.
///
/// # Errors
/// Not a device id, no CA in `dir`, or a file cannot be written.
pub fn issue_certificate(dir: &Path, id: &str, days: i64) -> anyhow::Result<(PathBuf, PathBuf)> {
    check_id(id)?;
    let issuer = issuer(dir)?;
    let now = OffsetDateTime::now_utc();
    let key = KeyPair::generate()?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name.push(DnType::CommonName, id);
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    p.not_before = now - Duration::hours(1);
    p.not_after = now + Duration::days(days);
    p.serial_number = Some(random_serial()?);
    let cert = p.signed_by(&key, &issuer)?;
    let devices = dir.join("devices");
    std::fs::create_dir_all(&devices).with_context(|| format!("creating {}", devices.display()))?;
    let (cp, kp) = (devices.join(format!("{id}.crt")), devices.join(format!("{id}.key")));
    // A device has one certificate: the one it replaces stops working.
    if cp.exists() {
        revoke_certificate(dir, id)?;
    }
    write(&cp, &cert.pem(), false)?;
    write(&kp, &key.serialize_pem(), true)?;
    Ok((cp, kp))
}

/// Puts `id`'s certificate (`dir/devices/{id}.crt`) on the CA's revocation list.
///
/// # Errors
/// No such certificate or CA, or a file cannot be written.
pub fn revoke_certificate(dir: &Path, id: &str) -> anyhow::Result<()> {
    check_id(id)?;
    let pem = read(&dir.join("devices").join(format!("{id}.crt")))?;
    let serial = serial_of(&pem, id)?;
    let mut revoked = read_revoked(dir)?;
    revoked.insert(serial, (id.to_string(), OffsetDateTime::now_utc().unix_timestamp()));
    write_crl(dir, &issuer(dir)?, &revoked)
}

/// The serial (hex) of the certificate `pem` of `id`.
fn serial_of(pem: &str, id: &str) -> anyhow::Result<String> {
    let der = rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes())
        .map(|c: rustls::pki_types::CertificateDer<'_>| c.to_vec())
        .map_err(|e| anyhow::anyhow!("{id}.crt: {e:?}"))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| anyhow::anyhow!("{id}.crt: {e}"))?;
    Ok(hex::encode(cert.raw_serial()))
}

type Revoked = BTreeMap<String, (String, i64)>;

fn read_revoked(dir: &Path) -> anyhow::Result<Revoked> {
    match std::fs::read(dir.join("revoked.json")) {
        Ok(b) => serde_json::from_slice(&b).context("revoked.json"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Revoked::new()),
        Err(e) => Err(e).context("revoked.json"),
    }
}

/// Writes `revoked.json` and `crl.pem` (signed by the CA, numbered by the time it is made:
/// each new list has a larger number than the one before, RFC 5280 §5.2.3).
fn write_crl(dir: &Path, issuer: &Issuer<'_, KeyPair>, revoked: &Revoked) -> anyhow::Result<()> {
    let now = OffsetDateTime::now_utc();
    let mut revoked_certs = Vec::new();
    for (serial, (_, at)) in revoked {
        revoked_certs.push(RevokedCertParams {
            serial_number: SerialNumber::from(hex::decode(serial).context("revoked.json serial")?),
            revocation_time: OffsetDateTime::from_unix_timestamp(*at).unwrap_or(now),
            reason_code: None,
            invalidity_date: None,
        });
    }
    let crl = CertificateRevocationListParams {
        this_update: now - Duration::minutes(5),
        next_update: now + Duration::days(3650),
        crl_number: SerialNumber::from(u64::try_from(now.unix_timestamp_nanos() / 1_000).unwrap_or(u64::MAX)),
        issuing_distribution_point: None,
        revoked_certs,
        key_identifier_method: KeyIdMethod::Sha256,
    }
    .signed_by(issuer)?;
    write(&dir.join("revoked.json"), &serde_json::to_string_pretty(revoked)?, false)?;
    write(&dir.join("crl.pem"), &crl.pem()?, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TlsConfig;

    fn crl_serials(dir: &Path) -> Vec<String> {
        let pem = read(&dir.join("crl.pem")).unwrap();
        let der: rustls::pki_types::CertificateRevocationListDer<'_> =
            rustls::pki_types::pem::PemObject::from_pem_slice(pem.as_bytes()).unwrap();
        let (_, crl) = x509_parser::parse_x509_crl(der.as_ref()).unwrap();
        crl.iter_revoked_certificates().map(|r| hex::encode(r.raw_serial())).collect()
    }

    #[test]
    fn a_fleet_ca_issues_reissues_and_revokes() {
        let dir = std::env::temp_dir().join(format!("pixgate-ca-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        create_ca(&dir, &["localhost".into(), "127.0.0.1".into()], false).unwrap();
        assert!(create_ca(&dir, &[], false).is_err(), "an existing CA is kept");
        assert!(crl_serials(&dir).is_empty());
        let tls = TlsConfig {
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
            client_ca: Some(dir.join("ca.crt")),
            crls: vec![dir.join("crl.pem")],
            reload_ms: 1000,
        };
        crate::deliver::mqtt::tls::server_config(&tls).expect("the listener takes what the CA wrote");

        let (cert, _) = issue_certificate(&dir, "a", 30).unwrap();
        let first = serial_of(&read(&cert).unwrap(), "a").unwrap();
        let der: rustls::pki_types::CertificateDer<'_> =
            rustls::pki_types::pem::PemObject::from_pem_slice(read(&cert).unwrap().as_bytes()).unwrap();
        assert_eq!(crate::deliver::mqtt::tls::certificate_identity(&der).map(|c| c.0).as_deref(), Some("a"));
        issue_certificate(&dir, "a", 30).unwrap();
        assert_eq!(crl_serials(&dir), std::slice::from_ref(&first), "re-issuing revokes the certificate it replaces");
        let second = serial_of(&read(&cert).unwrap(), "a").unwrap();
        revoke_certificate(&dir, "a").unwrap();
        let mut both = vec![first, second];
        both.sort();
        let mut listed = crl_serials(&dir);
        listed.sort();
        assert_eq!(listed, both);
        assert!(issue_certificate(&dir, "a/b", 30).is_err(), "not a device id");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join("ca.key")).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_broker_entry_follows_the_secret_and_keeps_the_files_mode() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = crate::test_fixtures::TempDir::new("mosquitto-passwd");
        let (store, passwd) = (tmp.path().join("credentials.json"), tmp.path().join("passwd-printers"));
        let issue = |file: &Path| CredentialsCmd::Issue {
            id: "p1".into(),
            ca: None,
            days: 1,
            digest: false,
            mosquitto_passwd: Some(file.to_path_buf()),
        };
        // A file that cannot be written: nothing is issued.
        let unwritable = tmp.path().join("a-folder");
        std::fs::create_dir_all(&unwritable).unwrap();
        assert!(run(&issue(&unwritable), Some(&store)).is_err());
        assert!(!Credentials::load(&store, true).unwrap().has("p1"), "no secret issued");
        std::fs::write(&passwd, "other:$7$101$x$y\n").unwrap();
        std::fs::set_permissions(&passwd, std::fs::Permissions::from_mode(0o640)).unwrap();
        run(&issue(&passwd), Some(&store)).unwrap();
        let text = std::fs::read_to_string(&passwd).unwrap();
        assert!(text.starts_with("other:$7$101$x$y\np1:$7$101$"), "{text}");
        assert_eq!(std::fs::metadata(&passwd).unwrap().permissions().mode() & 0o777, 0o640, "its mode kept");
        // Revoked: the entry goes, and again goes even once the secret is gone.
        let revoke = CredentialsCmd::Revoke { id: "p1".into(), ca: None, mosquitto_passwd: Some(passwd.clone()) };
        run(&revoke, Some(&store)).unwrap();
        assert_eq!(std::fs::read_to_string(&passwd).unwrap(), "other:$7$101$x$y\n");
        std::fs::write(&passwd, "p1:stale\n").unwrap();
        assert!(run(&revoke, Some(&store)).is_err(), "no secret to revoke is still said");
        assert_eq!(std::fs::read_to_string(&passwd).unwrap(), "", "but the broker entry is gone");
    }
}
