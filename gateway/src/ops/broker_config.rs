//! The devices' broker configured from the credentials pixgate already manages
//! (`pixgate devices broker-config mosquitto`): a mosquitto 2 configuration with two TLS
//! listeners, each requiring a client certificate whose CN becomes the username.
//!
//! - **The devices' listener** trusts the fleet CA (`pixgate devices credentials ca`) and
//!   its revocation list, and forces each client id to the certificate's CN
//!   (`use_username_as_clientid`): a device cannot take another device's client id, or
//!   pixgate's, and cut that connection off. Its ACL is patterns on the username only: a
//!   device reads its own `jobs`, writes its own `acks` and its own `status`, nothing
//!   else (`docs/operations.md`).
//! - **pixgate's listener** trusts a CA of its own (the gateway CA, which signs only
//!   pixgate's certificates), so no device certificate connects there; client ids are
//!   free (each replica has its own jobs and acks client ids). Its ACL grants pixgate's
//!   identity every device's `jobs` (write), `acks` and `status` (read).
//!
//! - **The printers' listener** (optional): Star printers on CloudPRNT's MQTT method, which
//!   connect with a user name and password, not a certificate. The user name is the device
//!   id, the password its secret, checked against a mosquitto password file that
//!   `pixgate devices credentials issue ID --mosquitto-passwd FILE` writes
//!   ([`mosquitto_password`]); the client id is forced to the user name. Its ACL gives each
//!   printer its own MAC's topics, from a list of printers: `star/cloudprnt/to-device/{mac}/#`
//!   (read) and `star/cloudprnt/to-server/{mac}/+` (write), nothing else.
//!
//! Every listener presents the fleet CA's server certificate. No persistence: pixgate keeps
//! every job until its device acknowledges it, and sends it again after a broker restart.
//! Checked on mosquitto 2.0.11 (`tests/tests/broker_security.rs`,
//! `tests/tests/cluster_cloudprnt.rs`).

use base64::Engine;
use ring::rand::{SecureRandom, SystemRandom};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

/// What the configuration is made of.
#[derive(Debug, Clone)]
pub struct MosquittoSetup {
    /// The fleet CA folder (`ca.crt`, `crl.pem`, `server.crt`, `server.key`), as
    /// `pixgate devices credentials ca` makes it. Absolute.
    pub fleet_ca: PathBuf,
    /// The gateway CA folder (`ca.crt`, `crl.pem`), the CA of pixgate's own certificates.
    /// Absolute.
    pub gateway_ca: PathBuf,
    /// The devices' listener: address and port (`0.0.0.0`, 8883).
    pub devices_listener: (String, u16),
    /// pixgate's listener: address and port (`127.0.0.1`, 8884).
    pub gateway_listener: (String, u16),
    /// The CN of pixgate's certificates (`pixgate-gateway`).
    pub gateway_identity: String,
    /// The Star printers' listener (CloudPRNT's MQTT method): address and port; `None`:
    /// none.
    pub printers_listener: Option<(String, u16)>,
    /// The Star printers it serves: (device id, MAC lower case with colons).
    pub star_printers: Vec<(String, String)>,
    /// Where the ACL files will be (the folder the files are written to). Absolute.
    pub out: PathBuf,
}

/// The ACL of the devices' listener: patterns on the username (the certificate's CN).
pub const DEVICES_ACL: &str = "pattern read pixgate/v1/devices/%u/jobs\n\
                               pattern write pixgate/v1/devices/%u/acks\n\
                               pattern readwrite pixgate/v1/devices/%u/status\n";

impl MosquittoSetup {
    /// The files to write into [`MosquittoSetup::out`]: (`mosquitto.conf`, its text),
    /// (`acl-devices`, …), (`acl-gateway`, …), and with a printers' listener
    /// (`acl-printers`, …). The printers' password file ([`PRINTERS_PASSWORD_FILE`]) is not
    /// among them: it holds what `credentials issue --mosquitto-passwd` wrote.
    pub fn files(&self) -> Vec<(&'static str, String)> {
        let mut files = vec![
            ("mosquitto.conf", self.conf()),
            ("acl-devices", DEVICES_ACL.to_string()),
            ("acl-gateway", self.gateway_acl()),
        ];
        if self.printers_listener.is_some() {
            files.push(("acl-printers", self.printers_acl()));
        }
        files
    }

    /// The ACL of the printers' listener: each Star printer (by its user name, the device
    /// id) reads its own MAC's `to-device` topics and writes its own `to-server` ones.
    pub fn printers_acl(&self) -> String {
        let mut acl = String::from("# Star printers on CloudPRNT's MQTT method: each its own MAC's topics.\n");
        for (id, mac) in &self.star_printers {
            acl.push_str(&format!(
                "\nuser {id}\n\
                 topic read star/cloudprnt/to-device/{mac}/#\n\
                 topic write star/cloudprnt/to-server/{mac}/+\n"
            ));
        }
        acl
    }

    /// The ACL of pixgate's listener: its identity publishes every device's jobs, reads
    /// every device's acks and status, writes and reads the device-jobs partitions'
    /// owner records (`deliver::broker::owners`), and writes to and reads from every Star
    /// printer on CloudPRNT's MQTT method.
    pub fn gateway_acl(&self) -> String {
        format!(
            "user {}\n\
             topic write pixgate/v1/devices/+/jobs\n\
             topic read pixgate/v1/devices/+/acks\n\
             topic read pixgate/v1/devices/+/status\n\
             topic readwrite pixgate/v1/partitions/+/owner\n\
             topic write star/cloudprnt/to-device/+/+\n\
             topic read star/cloudprnt/to-server/+/+\n",
            self.gateway_identity
        )
    }

    /// `mosquitto.conf`.
    pub fn conf(&self) -> String {
        let p = |dir: &Path, file: &str| dir.join(file).display().to_string();
        let (fleet, gateway) = (&self.fleet_ca, &self.gateway_ca);
        let listener = |(host, port): &(String, u16), ca: &Path, forced_ids: bool, acl: &str| {
            let mut s = format!(
                "listener {port} {host}\n\
                 allow_anonymous false\n\
                 cafile {}\n\
                 crlfile {}\n\
                 certfile {}\n\
                 keyfile {}\n\
                 require_certificate true\n\
                 use_identity_as_username true\n",
                p(ca, "ca.crt"),
                p(ca, "crl.pem"),
                p(fleet, "server.crt"),
                p(fleet, "server.key"),
            );
            if forced_ids {
                s.push_str("use_username_as_clientid true\n");
            }
            s.push_str(&format!("acl_file {}\n", p(&self.out, acl)));
            s
        };
        let mut conf = format!(
            "# Written by `pixgate devices broker-config mosquitto`: the devices' broker of\n\
             # pixgate's central shape (docs/operations.md). Regenerate rather than edit.\n\
             per_listener_settings true\n\
             # pixgate keeps every job until its device acknowledges it.\n\
             persistence false\n\
             \n\
             # The devices: fleet CA, client id forced to the certificate's CN.\n\
             {}\n\
             # pixgate: the gateway CA only, free client ids (a pair per replica, and one per\n\
             # device-jobs partition shared by the replicas).\n\
             {}",
            listener(&self.devices_listener, fleet, true, "acl-devices"),
            listener(&self.gateway_listener, gateway, false, "acl-gateway"),
        );
        if let Some((host, port)) = &self.printers_listener {
            conf.push_str(&format!(
                "\n# Star printers on CloudPRNT's MQTT method: a user name (the device id) and a\n\
                 # password (`pixgate devices credentials issue ID --mosquitto-passwd FILE`), client\n\
                 # id forced to the user name, each printer its own MAC's topics.\n\
                 listener {port} {host}\n\
                 allow_anonymous false\n\
                 certfile {}\n\
                 keyfile {}\n\
                 password_file {}\n\
                 use_username_as_clientid true\n\
                 acl_file {}\n",
                p(fleet, "server.crt"),
                p(fleet, "server.key"),
                p(&self.out, PRINTERS_PASSWORD_FILE),
                p(&self.out, "acl-printers"),
            ));
        }
        conf
    }
}

/// The printers' password file in the output folder.
pub const PRINTERS_PASSWORD_FILE: &str = "passwd-printers";

/// PBKDF2 rounds of a mosquitto password entry: `mosquitto_passwd`'s own default. The
/// secrets pixgate issues are 30 to 43 random characters, beyond any guessing whatever the
/// rounds.
const MOSQUITTO_ROUNDS: u32 = 101;

/// `user`'s line of a mosquitto 2 password file for `password`, as `mosquitto_passwd`
/// writes it: `user:$7$101$SALT$HASH`, HASH being PBKDF2-HMAC-SHA512 of the password with a
/// random 12-byte SALT, 101 rounds, 64 bytes, both in standard base64.
///
/// # Errors
/// No randomness for the salt.
pub fn mosquitto_password(user: &str, password: &str) -> Result<String, String> {
    let mut salt = [0u8; 12];
    SystemRandom::new().fill(&mut salt).map_err(|_| "no randomness available".to_string())?;
    Ok(mosquitto_password_with_salt(user, password, &salt))
}

fn mosquitto_password_with_salt(user: &str, password: &str, salt: &[u8]) -> String {
    let mut hash = [0u8; 64];
    let rounds = NonZeroU32::new(MOSQUITTO_ROUNDS).unwrap_or(NonZeroU32::MIN);
    ring::pbkdf2::derive(ring::pbkdf2::PBKDF2_HMAC_SHA512, rounds, salt, password.as_bytes(), &mut hash);
    let b64 = base64::engine::general_purpose::STANDARD;
    format!("{user}:$7${MOSQUITTO_ROUNDS}${}${}", b64.encode(salt), b64.encode(hash))
}

/// The password file `text` with `user`'s line replaced by `line` (added when it had
/// none), or removed when `line` is `None`; other lines are kept as they are.
pub fn with_password_line(text: &str, user: &str, line: Option<&str>) -> String {
    let prefix = format!("{user}:");
    let mut out: Vec<&str> = text.lines().filter(|l| !l.starts_with(&prefix)).collect();
    out.extend(line);
    let mut s = out.join("\n");
    if !s.is_empty() {
        s.push('\n');
    }
    s
}

/// Splits `host:port` (`0.0.0.0:8883`, `[::]:8883`).
///
/// # Errors
/// No port, or a port that is not a number.
pub fn host_port(s: &str) -> Result<(String, u16), String> {
    let (host, port) = s.rsplit_once(':').ok_or_else(|| format!("`{s}` is not HOST:PORT"))?;
    let port = port.parse().map_err(|_| format!("`{port}` in `{s}` is not a port"))?;
    Ok((host.trim_start_matches('[').trim_end_matches(']').to_string(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> MosquittoSetup {
        MosquittoSetup {
            fleet_ca: "/etc/pixgate/fleet".into(),
            gateway_ca: "/etc/pixgate/gateway-ca".into(),
            devices_listener: ("0.0.0.0".into(), 8883),
            gateway_listener: ("10.0.0.5".into(), 8884),
            gateway_identity: "pixgate-gateway".into(),
            out: "/etc/mosquitto/pixgate".into(),
            printers_listener: None,
            star_printers: Vec::new(),
        }
    }

    /// The listener block of `conf` that starts with `listener {port}`.
    fn block(conf: &str, port: u16) -> Vec<&str> {
        conf.lines()
            .skip_while(|l| !l.starts_with(&format!("listener {port} ")))
            .take_while(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    }

    #[test]
    fn each_listener_trusts_its_own_ca_and_only_the_devices_one_forces_client_ids() {
        let conf = setup().conf();
        assert!(conf.contains("per_listener_settings true\n"));
        let devices = block(&conf, 8883);
        assert_eq!(devices[0], "listener 8883 0.0.0.0");
        for line in [
            "allow_anonymous false",
            "cafile /etc/pixgate/fleet/ca.crt",
            "crlfile /etc/pixgate/fleet/crl.pem",
            "require_certificate true",
            "use_identity_as_username true",
            "use_username_as_clientid true",
            "acl_file /etc/mosquitto/pixgate/acl-devices",
        ] {
            assert!(devices.contains(&line), "devices' listener lacks `{line}`: {devices:?}");
        }
        let gateway = block(&conf, 8884);
        assert_eq!(gateway[0], "listener 8884 10.0.0.5");
        for line in [
            "allow_anonymous false",
            "cafile /etc/pixgate/gateway-ca/ca.crt",
            "crlfile /etc/pixgate/gateway-ca/crl.pem",
            "certfile /etc/pixgate/fleet/server.crt",
            "require_certificate true",
            "use_identity_as_username true",
            "acl_file /etc/mosquitto/pixgate/acl-gateway",
        ] {
            assert!(gateway.contains(&line), "pixgate's listener lacks `{line}`: {gateway:?}");
        }
        assert!(!gateway.contains(&"use_username_as_clientid true"), "replicas need their own client ids");
    }

    #[test]
    fn devices_get_patterns_on_their_own_id_and_pixgate_every_device() {
        assert!(!DEVICES_ACL.contains("user ") && !DEVICES_ACL.contains('#') && !DEVICES_ACL.contains("/+/"));
        assert_eq!(DEVICES_ACL.lines().filter(|l| l.starts_with("pattern ") && l.contains("/%u/")).count(), 3);
        let acl = setup().gateway_acl();
        assert!(acl.starts_with("user pixgate-gateway\n"));
        assert!(acl.contains("topic write pixgate/v1/devices/+/jobs\n"));
        assert!(acl.contains("topic readwrite pixgate/v1/partitions/+/owner\n"));
        assert!(!acl.contains("pattern"));
    }

    /// Written by Debian's `mosquitto_passwd -c -b pw dev1 secret1` (mosquitto 2.0.11).
    const MOSQUITTO_PASSWD_LINE: &str = "dev1:$7$101$kyYU7ARmv5FjHr2C$O4Cjv4mK0nUefX9iMvT3/3z2zUv5jOXOiKZyMYUUNhqgYVvvGAF+GM7hw0jrIafT20c/O4+p5DnqqASm4om3SQ==";

    #[test]
    fn a_password_entry_is_the_one_mosquitto_passwd_writes() {
        let salt = base64::engine::general_purpose::STANDARD.decode("kyYU7ARmv5FjHr2C").unwrap();
        assert_eq!(mosquitto_password_with_salt("dev1", "secret1", &salt), MOSQUITTO_PASSWD_LINE);
        let a = mosquitto_password("dev1", "secret1").unwrap();
        let b = mosquitto_password("dev1", "secret1").unwrap();
        assert!(a.starts_with("dev1:$7$101$") && a != b, "a fresh salt each time: {a} {b}");
        let file = with_password_line("", "a", Some("a:1"));
        let file = with_password_line(&file, "b", Some("b:2"));
        assert_eq!(with_password_line(&file, "a", Some("a:3")), "b:2\na:3\n");
        assert_eq!(with_password_line(&file, "a", None), "b:2\n");
        assert_eq!(with_password_line("ab:9\n", "a", None), "ab:9\n", "only the user's own line");
        assert_eq!(with_password_line("a:1\n", "a", None), "");
    }

    #[test]
    fn star_printers_get_their_own_macs_topics_on_a_listener_of_their_own() {
        let mut setup = setup();
        assert!(!setup.conf().contains("password_file"), "no printers' listener unless asked");
        assert!(!setup.files().iter().any(|(n, _)| *n == "acl-printers"));
        setup.printers_listener = Some(("0.0.0.0".into(), 8885));
        setup.star_printers =
            vec![("p1".into(), "00:11:62:0a:1b:2c".into()), ("p2".into(), "00:11:62:0a:1b:2d".into())];
        let conf = setup.conf();
        let printers = block(&conf, 8885);
        for line in [
            "allow_anonymous false",
            "password_file /etc/mosquitto/pixgate/passwd-printers",
            "use_username_as_clientid true",
            "acl_file /etc/mosquitto/pixgate/acl-printers",
            "certfile /etc/pixgate/fleet/server.crt",
        ] {
            assert!(printers.contains(&line), "printers' listener lacks `{line}`: {printers:?}");
        }
        assert!(!printers.iter().any(|l| l.starts_with("require_certificate") || l.starts_with("cafile")));
        let acl = setup.printers_acl();
        assert!(acl.contains(
            "user p1\ntopic read star/cloudprnt/to-device/00:11:62:0a:1b:2c/#\ntopic write star/cloudprnt/to-server/00:11:62:0a:1b:2c/+\n"
        ));
        assert!(!acl.contains("pattern") && acl.matches("user ").count() == 2);
        let gateway = setup.gateway_acl();
        assert!(gateway.contains("topic write star/cloudprnt/to-device/+/+\n"));
        assert!(gateway.contains("topic read star/cloudprnt/to-server/+/+\n"));
    }

    #[test]
    fn host_port_takes_ipv4_ipv6_and_names() {
        assert_eq!(host_port("0.0.0.0:8883"), Ok(("0.0.0.0".into(), 8883)));
        assert_eq!(host_port("[::]:8883"), Ok(("::".into(), 8883)));
        assert_eq!(host_port("broker.local:1"), Ok(("broker.local".into(), 1)));
        assert!(host_port("8883").is_err() && host_port("a:b").is_err());
    }
}
