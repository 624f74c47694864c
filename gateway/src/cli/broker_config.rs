//! `pixgate devices broker-config mosquitto`: writes the devices' broker configuration
//! from the fleet CA and the gateway CA ([`crate::ops::broker_config`]).

use crate::ops::broker_config::{host_port, MosquittoSetup, PRINTERS_PASSWORD_FILE};
use crate::store::credentials::write_atomic;
use anyhow::{bail, Context};
use std::path::{Path, PathBuf};

/// `pixgate devices broker-config …`.
#[derive(Debug, clap::Subcommand)]
pub enum BrokerConfigCmd {
    /// mosquitto 2: `mosquitto.conf`, `acl-devices` and `acl-gateway` in OUT. Devices connect
    /// to one listener with fleet-CA certificates (client id forced to the CN), pixgate's
    /// replicas to another with gateway-CA certificates; with `--printers-listener`, Star
    /// printers to a third with passwords (`acl-printers`, and `passwd-printers` created
    /// empty if missing).
    Mosquitto {
        /// The fleet CA folder (`pixgate devices credentials ca`): the devices' certificates,
        /// the revocation list, and the broker's server certificate.
        #[arg(long)]
        ca: PathBuf,
        /// The gateway CA folder: a second CA that signs only pixgate's certificates
        /// (`pixgate devices credentials ca DIR`, then `… issue pixgate-gateway --ca DIR`).
        #[arg(long)]
        gateway_ca: PathBuf,
        /// The folder to write into (created).
        #[arg(long)]
        out: PathBuf,
        /// The devices' listener.
        #[arg(long, default_value = "0.0.0.0:8883")]
        devices_listener: String,
        /// pixgate's listener (reachable by the replicas; devices cannot connect to it
        /// without a gateway-CA certificate).
        #[arg(long, default_value = "127.0.0.1:8884")]
        gateway_listener: String,
        /// The CN of pixgate's certificates.
        #[arg(long, default_value = "pixgate-gateway")]
        gateway_identity: String,
        /// The Star printers' listener (CloudPRNT's MQTT method: user name and password);
        /// unset: none.
        #[arg(long, requires = "star_printers")]
        printers_listener: Option<String>,
        /// The Star printers on that listener: one `DEVICE-ID MAC` per line (`#` starts a
        /// comment), each given its own MAC's topics. Their passwords go to
        /// `OUT/passwd-printers` with `pixgate devices credentials issue ID --mosquitto-passwd`.
        #[arg(long, requires = "printers_listener")]
        star_printers: Option<PathBuf>,
    },
}

/// Runs `cmd`.
///
/// # Errors
/// A CA folder lacks a file the configuration names, the two CAs are one, a listener is not
/// HOST:PORT, or a file cannot be written.
pub fn run(cmd: &BrokerConfigCmd) -> anyhow::Result<()> {
    let BrokerConfigCmd::Mosquitto {
        ca,
        gateway_ca,
        out,
        devices_listener,
        gateway_listener,
        gateway_identity,
        printers_listener,
        star_printers,
    } = cmd;
    let star_printers = match star_printers {
        Some(path) => read_star_printers(path)?,
        None => Vec::new(),
    };
    let fleet_ca = absolute(ca, &["ca.crt", "crl.pem", "server.crt", "server.key"])?;
    let gateway_ca = absolute(gateway_ca, &["ca.crt", "crl.pem"])?;
    let same = std::fs::read(fleet_ca.join("ca.crt"))? == std::fs::read(gateway_ca.join("ca.crt"))?;
    if same {
        bail!("--gateway-ca is the fleet CA: every device's certificate would then connect on pixgate's listener, where client ids are free; make a CA of its own for pixgate (`pixgate devices credentials ca DIR`)");
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let setup = MosquittoSetup {
        fleet_ca,
        gateway_ca,
        devices_listener: host_port(devices_listener).map_err(anyhow::Error::msg)?,
        gateway_listener: host_port(gateway_listener).map_err(anyhow::Error::msg)?,
        gateway_identity: gateway_identity.clone(),
        out: std::fs::canonicalize(out).with_context(|| format!("resolving {}", out.display()))?,
        printers_listener: printers_listener.as_deref().map(host_port).transpose().map_err(anyhow::Error::msg)?,
        star_printers,
    };
    let mut written = Vec::new();
    for (name, text) in setup.files() {
        let path = setup.out.join(name);
        write_atomic(&path, text.as_bytes(), false).with_context(|| format!("writing {}", path.display()))?;
        written.push(name);
    }
    if setup.printers_listener.is_some() {
        // Kept as it is: it holds the hashes `credentials issue --mosquitto-passwd` wrote.
        let passwd = setup.out.join(PRINTERS_PASSWORD_FILE);
        if !passwd.exists() {
            write_atomic(&passwd, b"", true).with_context(|| format!("writing {}", passwd.display()))?;
        }
    }
    let (host, port) = &setup.gateway_listener;
    println!("wrote {} in {}", written.join(", "), setup.out.display());
    println!(
        "pixgate's settings: broker.host = \"{host}\", broker.port = {port}, broker.tls.ca = \"{}\", broker.tls.cert and broker.tls.key from the gateway CA ({gateway_identity})",
        setup.fleet_ca.join("ca.crt").display()
    );
    Ok(())
}

/// The `DEVICE-ID MAC` lines of `path`: (id, MAC lower case with colons).
fn read_star_printers(path: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut printers = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), n + 1);
        let mut words = line.split_whitespace();
        let (Some(id), Some(mac), None) = (words.next(), words.next(), words.next()) else {
            bail!("{}: `{line}` is not `DEVICE-ID MAC`", at());
        };
        if !crate::deliver::mqtt::access::valid_id(id) {
            bail!("{}: `{id}` is not a device id", at());
        }
        let Some(mac) = cdc::value::normalize_mac(mac) else { bail!("{}: `{mac}` is not a MAC", at()) };
        printers.push((id.to_string(), mac));
    }
    Ok(printers)
}

/// `dir` made absolute, checked to hold `files`.
fn absolute(dir: &Path, files: &[&str]) -> anyhow::Result<PathBuf> {
    let dir = std::fs::canonicalize(dir).with_context(|| format!("no CA folder {}", dir.display()))?;
    for f in files {
        if !dir.join(f).is_file() {
            bail!("{} has no {f}: not a CA folder made by `pixgate devices credentials ca`", dir.display());
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::credentials::{self, CredentialsCmd};

    fn ca(dir: &Path) {
        let cmd = CredentialsCmd::Ca { dir: dir.to_path_buf(), server_names: vec!["localhost".into()], force: false };
        credentials::run(&cmd, None).unwrap();
    }

    fn mosquitto(fleet: &Path, gateway: &Path, out: &Path) -> BrokerConfigCmd {
        BrokerConfigCmd::Mosquitto {
            ca: fleet.to_path_buf(),
            gateway_ca: gateway.to_path_buf(),
            out: out.to_path_buf(),
            devices_listener: "127.0.0.1:8883".into(),
            gateway_listener: "127.0.0.1:8884".into(),
            gateway_identity: "pixgate-gateway".into(),
            printers_listener: None,
            star_printers: None,
        }
    }

    #[test]
    fn writes_the_three_files_and_refuses_the_fleet_ca_as_the_gateway_ca() {
        let tmp = crate::test_fixtures::TempDir::new("broker-config");
        let (fleet, gateway, out) = (tmp.path().join("fleet"), tmp.path().join("gateway"), tmp.path().join("out"));
        ca(&fleet);
        ca(&gateway);
        let err = run(&mosquitto(&fleet, &fleet, &out)).unwrap_err().to_string();
        assert!(err.contains("--gateway-ca is the fleet CA"), "{err}");
        assert!(!out.exists(), "nothing written on a refusal");
        let err = run(&mosquitto(&fleet, &out, &out)).unwrap_err().to_string();
        assert!(err.contains("no CA folder"), "{err}");
        run(&mosquitto(&fleet, &gateway, &out)).unwrap();
        let conf = std::fs::read_to_string(out.join("mosquitto.conf")).unwrap();
        let fleet = std::fs::canonicalize(&fleet).unwrap();
        assert!(conf.contains(&format!("cafile {}\n", fleet.join("ca.crt").display())), "{conf}");
        assert!(out.join("acl-devices").is_file() && out.join("acl-gateway").is_file());
    }
}
