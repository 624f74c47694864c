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
//! Both listeners present the fleet CA's server certificate. No persistence: pixgate keeps
//! every job until its device acknowledges it, and sends it again after a broker restart.
//! Checked on mosquitto 2.0.11 (`tests/tests/broker_security.rs`).

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
    /// Where the ACL files will be (the folder the files are written to). Absolute.
    pub out: PathBuf,
}

/// The ACL of the devices' listener: patterns on the username (the certificate's CN).
pub const DEVICES_ACL: &str = "pattern read pixgate/v1/devices/%u/jobs\n\
                               pattern write pixgate/v1/devices/%u/acks\n\
                               pattern readwrite pixgate/v1/devices/%u/status\n";

impl MosquittoSetup {
    /// The files to write into [`MosquittoSetup::out`]: (`mosquitto.conf`, its text),
    /// (`acl-devices`, …), (`acl-gateway`, …).
    pub fn files(&self) -> Vec<(&'static str, String)> {
        vec![
            ("mosquitto.conf", self.conf()),
            ("acl-devices", DEVICES_ACL.to_string()),
            ("acl-gateway", self.gateway_acl()),
        ]
    }

    /// The ACL of pixgate's listener: its identity publishes every device's jobs, reads
    /// every device's acks and status, and writes and reads the device-jobs partitions'
    /// owner records (`deliver::broker::owners`).
    pub fn gateway_acl(&self) -> String {
        format!(
            "user {}\n\
             topic write pixgate/v1/devices/+/jobs\n\
             topic read pixgate/v1/devices/+/acks\n\
             topic read pixgate/v1/devices/+/status\n\
             topic readwrite pixgate/v1/partitions/+/owner\n",
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
        format!(
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
        )
    }
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

    #[test]
    fn host_port_takes_ipv4_ipv6_and_names() {
        assert_eq!(host_port("0.0.0.0:8883"), Ok(("0.0.0.0".into(), 8883)));
        assert_eq!(host_port("[::]:8883"), Ok(("::".into(), 8883)));
        assert_eq!(host_port("broker.local:1"), Ok(("broker.local".into(), 1)));
        assert!(host_port("8883").is_err() && host_port("a:b").is_err());
    }
}
