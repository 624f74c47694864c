//! The Debian package installs and runs: `cargo deb` packages the `pixgate` binary that
//! the tests already built (debug profile, `--no-build`: a release build would cost CI ten
//! minutes), the package's contents and control fields are checked, it is installed on
//! this machine with `dpkg -i`, and then:
//!
//! - the packaged unit passes `systemd-analyze verify` without a warning, and `systemd-analyze
//!   security --offline` rates its sandbox OK (systemd is not PID 1 in the test
//!   machine, so the unit is never started with `systemctl`: what is proven is the unit as
//!   systemd reads it, and the binary as the unit runs it);
//! - `/usr/bin/pixgate` with the packaged `/etc/pixgate/pixgate.toml`, as the `pixgate`
//!   user the package made, refuses to start while the device TLS files it names are
//!   missing, saying which;
//! - the same, with only the Kafka address of the test broker, loopback ports, a scratch
//!   data folder and a test fleet CA's TLS files given through `PIXGATE_*`, becomes ready
//!   (`/readyz` 200) with its device listener on TLS (`mosquitto_pub` with a fleet
//!   certificate passes the handshake and is refused as unknown to the registry; in plain
//!   TCP it fails the handshake), and exits cleanly on SIGTERM;
//! - `dpkg --purge` removes it all again (also when the test fails, by a guard).
//!
//! Needs root (it installs a package), `cargo deb` (`scripts/ensure-cargo-deb.sh`), dpkg
//! and systemd-analyze: without them it fails, saying what is missing.

use pixgate_tests::broker::KafkaBroker;
use pixgate_tests::gateway::{find_binary, StatsReport};
use pixgate_tests::mosquitto::{self, ClientAuth};
use pixgate_tests::net::{free_port, http_get};
use pixgate_tests::pki::Fleet;
use simulators::capture;
use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const PACKAGE: &str = "pixgate";
const CONFIG: &str = "/etc/pixgate/pixgate.toml";
const UNIT: &str = "/usr/lib/systemd/system/pixgate.service";
/// A card machine's id, with a certificate of the test fleet but not in the registry.
const DEVICE: &str = "7f80e222f828767efc2f9162";

/// Runs `cmd` to completion; panics with its output unless it succeeded.
fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether dpkg knows the package as installed (or half-installed).
fn installed() -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", PACKAGE])
        .output()
        .is_ok_and(|o| o.status.success() && !String::from_utf8_lossy(&o.stdout).contains("not-installed"))
}

/// Purges the package when dropped, so that a failing test leaves the machine as it was
/// (but for the `pixgate` system user, which Debian keeps).
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        if installed() {
            let _ = Command::new("dpkg").args(["--purge", PACKAGE]).status();
        }
    }
}

/// `/usr/bin/pixgate --config /etc/pixgate/pixgate.toml run` as the `pixgate` user
/// (`setpriv`, which execs: the child is pixgate itself and gets the signals), with `env`
/// on top of a clean environment, logging to `log`.
fn spawn_installed(env: &[(&str, String)], log: &Path) -> Child {
    let out = File::create(log).expect("creating the log file");
    Command::new("setpriv")
        .args(["--reuid=pixgate", "--regid=pixgate", "--init-groups", "--"])
        .args(["/usr/bin/pixgate", "--config", CONFIG, "run"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info,librdkafka=warn")
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("the log file again"))
        .stderr(out)
        .spawn()
        .expect("spawning /usr/bin/pixgate through setpriv")
}

/// Kills the process when dropped (a failing test leaves nothing running).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Every value of `file` is in `effective` at the same key: no key of the packaged
/// configuration is unknown to pixgate (figment would ignore it silently) or not applied.
fn assert_applied(file: &toml::Table, effective: &toml::Table, at: &str) {
    for (key, value) in file {
        let here = format!("{at}{key}");
        match (value, effective.get(key)) {
            (toml::Value::Table(f), Some(toml::Value::Table(e))) => assert_applied(f, e, &format!("{here}.")),
            (v, Some(e)) => assert_eq!(v, e, "{here}: the packaged value is not the effective one"),
            (_, None) => panic!("{here} is in the packaged configuration but not in `pixgate config`: unknown key"),
        }
    }
}

/// Every key of `effective` is in `file`.
fn assert_listed(effective: &toml::Table, file: &toml::Table, at: &str) {
    for (key, value) in effective {
        let here = format!("{at}{key}");
        match (value, file.get(key)) {
            (toml::Value::Table(e), Some(toml::Value::Table(f))) => assert_listed(e, f, &format!("{here}.")),
            (_, Some(_)) => {}
            // An empty map (`health.topics`) has no setting to write out.
            (toml::Value::Table(e), None) if e.is_empty() => {}
            (_, None) => panic!("{here} (from `pixgate config`) is missing in gateway/debian/pixgate.toml"),
        }
    }
}

/// Gives `path` (recursively) to the `pixgate` user: the installed binary runs as it.
fn give_to_pixgate(path: &Path) {
    run(Command::new("chown").args(["-R", "pixgate:pixgate"]).arg(path));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn package_builds_installs_and_runs() {
    let uid = stdout(&run(Command::new("id").arg("-u")));
    assert_eq!(uid.trim(), "0", "this test installs a Debian package: run it as root");
    mosquitto::require_clients().unwrap_or_else(|e| panic!("{e:#}"));
    for (tool, args) in
        [("cargo", &["deb", "--version"][..]), ("dpkg", &["--version"][..]), ("systemd-analyze", &["--version"][..])]
    {
        let ok = Command::new(tool).args(args).output().is_ok_and(|o| o.status.success());
        assert!(ok, "`{tool} {}` does not run: install it (scripts/ensure-cargo-deb.sh for cargo deb)", args.join(" "));
    }
    assert!(
        !installed(),
        "the {PACKAGE} package is already installed here; this test installs and purges its own \
         (remove it first: dpkg --purge {PACKAGE})"
    );

    let dir = std::env::temp_dir().join(format!("pixgate-debian-package-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();

    // Package the binary the tests run (target/debug/pixgate).
    let bin = find_binary().unwrap_or_else(|e| panic!("{e:#}"));
    let target_dir = bin.parent().and_then(Path::parent).expect("target/<profile>/pixgate");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let deb = dir.join("pixgate.deb");
    run(Command::new("cargo")
        .args(["deb", "-p", "gateway", "--profile", "dev", "--no-build", "--strip", "--fast", "--output"])
        .arg(&deb)
        .env("CARGO_TARGET_DIR", target_dir)
        .current_dir(workspace));

    // Control fields and contents, as dpkg reads them.
    let info = stdout(&run(Command::new("dpkg-deb").arg("-f").arg(&deb)));
    assert!(info.contains("Package: pixgate\n"), "{info}");
    assert!(info.contains(&format!("Version: {}", env!("CARGO_PKG_VERSION"))), "{info}");
    assert!(info.lines().any(|l| l.starts_with("Depends:") && l.contains("libc6")), "no libc6 dependency:\n{info}");
    let conffiles = stdout(&run(Command::new("dpkg-deb").arg("-I").arg(&deb).arg("conffiles")));
    assert_eq!(conffiles.trim(), CONFIG, "the configuration must be a conffile (kept across upgrades)");
    let listing = stdout(&run(Command::new("dpkg-deb").arg("-c").arg(&deb)));
    for (path, mode) in [
        ("./usr/bin/pixgate", "-rwxr-xr-x"),
        ("./etc/pixgate/pixgate.toml", "-rw-r-----"),
        ("./usr/lib/systemd/system/pixgate.service", "-rw-r--r--"),
        ("./usr/lib/sysusers.d/pixgate.conf", "-rw-r--r--"),
    ] {
        let line = listing.lines().find(|l| l.ends_with(&format!(" {path}")));
        let line = line.unwrap_or_else(|| panic!("{path} is not in the package:\n{listing}"));
        assert!(line.starts_with(mode), "{path} should be {mode}: {line}");
    }
    let postinst = stdout(&run(Command::new("dpkg-deb").arg("-I").arg(&deb).arg("postinst")));
    assert!(postinst.contains("systemd-sysusers") && !postinst.contains("#DEBHELPER#"), "{postinst}");

    // Install.
    let guard = Installed;
    run(Command::new("dpkg").arg("-i").arg(&deb));
    assert!(installed());
    let user = stdout(&run(Command::new("getent").args(["passwd", "pixgate"])));
    assert!(user.contains(":/var/lib/pixgate:"), "the pixgate user's home: {user}");
    let data = std::fs::metadata("/var/lib/pixgate").expect("/var/lib/pixgate");
    let pixgate_uid: u32 = user.split(':').nth(2).unwrap().parse().unwrap();
    assert!(data.is_dir());
    assert_eq!((data.uid(), data.permissions().mode() & 0o777), (pixgate_uid, 0o750), "/var/lib/pixgate");
    let config = std::fs::metadata(CONFIG).unwrap();
    let pixgate_gid: u32 = user.split(':').nth(3).unwrap().parse().unwrap();
    assert_eq!((config.uid(), config.gid(), config.permissions().mode() & 0o777), (0, pixgate_gid, 0o640), "{CONFIG}");
    assert_eq!(
        std::fs::read_to_string(CONFIG).unwrap(),
        std::fs::read_to_string(workspace.join("gateway/debian/pixgate.toml")).unwrap(),
        "the installed configuration is the packaged one"
    );
    let version = stdout(&run(Command::new("/usr/bin/pixgate").arg("--version")));
    assert!(version.starts_with(&format!("pixgate {} (", env!("CARGO_PKG_VERSION"))), "{version}");

    // The unit as systemd reads it: no warning at all (verify prints them and still exits 0
    // for some, so its output must be empty too).
    let verify = Command::new("systemd-analyze").args(["verify", UNIT]).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&verify.stdout), String::from_utf8_lossy(&verify.stderr));
    assert!(verify.status.success() && said.trim().is_empty(), "systemd-analyze verify {UNIT}:\n{said}");
    // The sandbox as systemd rates it (offline: no running systemd needed), from 0 (safe)
    // to 10 (unsafe): "OK" or better.
    let security = stdout(&run(Command::new("systemd-analyze").args(["security", "--offline=yes", UNIT])));
    let overall =
        security.lines().find(|l| l.contains("Overall exposure level")).unwrap_or_else(|| panic!("{security}"));
    assert!(overall.contains(" OK") || overall.contains(" SAFE"), "{security}");
    let unit = std::fs::read_to_string(UNIT).unwrap();
    for line in [
        "User=pixgate",
        "ExecStart=/usr/bin/pixgate --config /etc/pixgate/pixgate.toml run",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/pixgate",
        "NoNewPrivileges=yes",
        "Restart=on-failure",
        "KillSignal=SIGTERM",
    ] {
        assert!(unit.lines().any(|l| l == line), "{UNIT} lacks `{line}`");
    }
    // The packaged configuration is what pixgate runs with, key for key.
    let printed = stdout(&run(Command::new("/usr/bin/pixgate").args(["--config", CONFIG, "config"])));
    let file: toml::Table = std::fs::read_to_string(CONFIG).unwrap().parse().expect("the packaged TOML");
    let effective: toml::Table = printed.parse().expect("`pixgate config` prints TOML");
    assert_applied(&file, &effective, "");
    // And the other way: every setting pixgate prints is written out (and commented) in
    // the packaged file, so that a new setting does not go unmentioned there.
    assert_listed(&effective, &file, "");
    // systemd must wait longer for a stop than pixgate takes to finish one.
    let shutdown_ms: u64 = printed
        .lines()
        .find_map(|l| l.strip_prefix("shutdown_timeout_ms = "))
        .unwrap_or_else(|| panic!("pixgate config:\n{printed}"))
        .parse()
        .unwrap();
    let stop_s: u64 = unit
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.strip_suffix('s'))
        .expect("TimeoutStopSec=Ns")
        .parse()
        .unwrap();
    assert!(stop_s * 1000 > shutdown_ms, "TimeoutStopSec={stop_s}s is not above shutdown_timeout_ms={shutdown_ms}");

    // The test broker, and a scratch data folder for the installed binary.
    let broker = KafkaBroker::start(&dir.join("kafka")).unwrap_or_else(|e| panic!("starting the broker: {e:#}"));
    capture::ensure_topics(broker.addr(), &capture::PIXGATE_TOPICS).await.expect("creating the topics");
    let data_dir = dir.join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    give_to_pixgate(&data_dir);
    let http_port = free_port();
    let mqtt_port = free_port();
    let mut env = vec![
        ("PIXGATE_KAFKA__BROKERS", broker.addr().to_string()),
        ("PIXGATE_MQTT__LISTEN", format!("127.0.0.1:{mqtt_port}")),
        ("PIXGATE_HTTP__LISTEN", format!("127.0.0.1:{http_port}")),
        ("PIXGATE_OUTBOX__PATH", data_dir.join("outbox.redb").display().to_string()),
        ("PIXGATE_MQTT__CREDENTIALS", data_dir.join("device-secrets.json").display().to_string()),
    ];

    // The packaged configuration as it is: no TLS files yet, so no start, and it says why.
    let log = dir.join("pixgate-no-tls.log");
    let status = spawn_installed(&env, &log).wait().unwrap();
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success(), "pixgate started without its TLS files:\n{said}");
    assert!(said.contains("mqtt.tls") && said.contains("/etc/pixgate/fleet/server.crt"), "{said}");

    // With a fleet CA's files (what `pixgate devices credentials ca` makes), it runs.
    let fleet = Fleet::create_without_other(&dir.join("fleet"), &[DEVICE]).expect("making a fleet CA");
    // Readable by the service as docs/operations.md says: root's files, the server key by
    // group; the CA key stays root's alone.
    run(Command::new("chgrp").arg("pixgate").arg(fleet.dir()).arg(fleet.server_key()));
    run(Command::new("chmod").arg("0750").arg(fleet.dir()));
    run(Command::new("chmod").arg("0640").arg(fleet.server_key()));
    let ca_key = std::fs::metadata(fleet.ca_key()).unwrap();
    assert_eq!((ca_key.uid(), ca_key.permissions().mode() & 0o777), (0, 0o600), "ca.key");
    let tls = |f: &str| fleet.dir().join(f).display().to_string();
    env.extend([
        ("PIXGATE_MQTT__TLS__CERT", tls("server.crt")),
        ("PIXGATE_MQTT__TLS__KEY", tls("server.key")),
        ("PIXGATE_MQTT__TLS__CLIENT_CA", tls("ca.crt")),
        ("PIXGATE_MQTT__TLS__CRLS", format!("[\"{}\"]", tls("crl.pem"))),
    ]);
    let log = dir.join("pixgate.log");
    let mut running = Running(spawn_installed(&env, &log));
    let child = &mut running.0;
    let deadline = Instant::now() + Duration::from_secs(120);
    let ready = loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the installed pixgate exited with {status}:\n{}", std::fs::read_to_string(&log).unwrap());
        }
        match http_get(&format!("127.0.0.1:{http_port}"), "/readyz") {
            Ok((200, body)) => break body,
            _ if Instant::now() > deadline => {
                panic!("not ready within 120 s:\n{}", std::fs::read_to_string(&log).unwrap());
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    };
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(said.contains("device listener up") && said.contains("tls=true"), "{ready}\n{said}");

    // Devices meet TLS and the packaged access rules: a device with a certificate of the
    // fleet completes the handshake and is refused at CONNECT as unknown to the registry
    // (`mqtt.require_registered`); a plain TCP client fails the handshake.
    let refusals = |rule: &'static str| {
        let http = format!("127.0.0.1:{http_port}");
        move || -> u64 {
            let (_, body) = http_get(&http, "/stats").expect("GET /stats");
            let stats: StatsReport = serde_json::from_str(&body).expect("/stats is a StatsReport");
            stats.counters.mqtt_refusals.get(rule).copied().unwrap_or(0)
        }
    };
    let wait_for = |what: &str, count: &dyn Fn() -> u64| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while count() == 0 {
            assert!(Instant::now() < deadline, "no {what} refusal counted on /stats");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let (unknown, handshake) = (refusals("unknown_device"), refusals("tls_handshake"));
    let device = ClientAuth::certificate(&fleet.ca_cert(), &fleet.device_cert(DEVICE), &fleet.device_key(DEVICE));
    let topic = format!("devices/{DEVICE}/status");
    let refused = mosquitto::publish_as(mqtt_port, &device, &format!("dev-{DEVICE}"), &topic, "{}", 1, false).await;
    assert!(refused.is_err(), "a device unknown to the registry got in");
    wait_for("unknown_device", &unknown);
    assert_eq!(handshake(), 0, "the fleet's device failed the TLS handshake: {refused:?}");
    let plain = mosquitto::publish(mqtt_port, &format!("dev-{DEVICE}"), &topic, "{}", 1, false).await;
    assert!(plain.is_err(), "a plain TCP client got in");
    wait_for("tls_handshake", &handshake);

    // SIGTERM, as the unit stops it: a clean exit.
    run(Command::new("kill").args(["-TERM", &child.id().to_string()]));
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            panic!("no exit within 60 s of SIGTERM:\n{}", std::fs::read_to_string(&log).unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "exit after SIGTERM: {status}\n{}", std::fs::read_to_string(&log).unwrap());
    broker.stop();

    // Purge: the binary, the configuration, the unit and the data folder go.
    drop(guard);
    assert!(!installed(), "still installed after dpkg --purge");
    for path in ["/usr/bin/pixgate", CONFIG, UNIT, "/var/lib/pixgate", "/usr/lib/sysusers.d/pixgate.conf"] {
        assert!(!PathBuf::from(path).exists(), "{path} is left after dpkg --purge");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
