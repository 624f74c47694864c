//! `fleet-mosquitto`: the reference half of `scripts/fleet-bench.sh`. The same simulated
//! fleet as `pixgate-load --tls secret` (same registry seed, every device with its own
//! secret over TLS) against Debian's `mosquitto` with the equivalent TLS listener, password
//! file and ACL (`pattern … pixgate/v1/devices/%u/…`), and a client playing the gateway's
//! part: it publishes jobs (QoS 1, per-device seq) and counts the devices' acks.
//!
//! Prints the connect phase every 5 s and a `FLEET broker=mosquitto …` line with connections
//! held, resident memory, connections/s, messages/s and mosquitto's CPU per message.

use anyhow::{bail, Context};
use clap::Parser;
use device_protocol::messages::{CONTENT_ESCPOS, CONTENT_SCREEN};
use device_protocol::{EffectKind, Job, ScreenContent, ScreenKind, Topic};
use pixgate_tests::net::free_port;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS, TlsConfiguration, Transport};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use simulators::capture::generate::{Scenario, ScenarioConfig};
use simulators::device::{DeviceIdentity, MqttSecurity, Rendering, Stats};
use simulators::fleet::{self, FleetConfig, FleetOptions};
use simulators::registry::{devices_from_records, DeviceSpec};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The same fleet as `pixgate-load --tls secret` against mosquitto over TLS.
#[derive(Parser)]
struct Args {
    /// Devices (printers and card machines), all simulated in this process.
    #[arg(long, default_value_t = 1_000)]
    devices: usize,
    /// Jobs published in all, spread over the devices in turn.
    #[arg(long, default_value_t = 20_000)]
    jobs: usize,
    /// Jobs published and not yet acked at most.
    #[arg(long, default_value_t = 1_000)]
    window: usize,
    /// Scenario seed (the registry; as `pixgate-load --seed`).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Working folder (CA, password file, ACL, broker log); removed at the end.
    #[arg(long)]
    work: Option<PathBuf>,
    /// Longest wait for the whole fleet to connect, seconds.
    #[arg(long, default_value_t = 600)]
    connect_timeout_s: u64,
}

const GATEWAY_USER: &str = "pixgate-gateway";

fn say(msg: impl AsRef<str>) {
    println!("[fleet-mosquitto] {}", msg.as_ref());
}

/// `(VmRSS, VmHWM)` of `pid`, KiB.
fn memory_kib(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn job_for(spec: &DeviceSpec, seq: u64, n: usize) -> Job {
    let (kind, content_type, payload) = match spec {
        DeviceSpec::Printer { .. } => {
            // A receipt-sized ESC/POS job: ESC @, then text lines.
            let mut bytes = b"\x1b@".to_vec();
            while bytes.len() < 2_000 {
                bytes.extend_from_slice(format!("Loja Exemplo  recibo {n:>8}  R$ 12,34\n").as_bytes());
            }
            (EffectKind::PrintReceipt, CONTENT_ESCPOS, bytes)
        }
        DeviceSpec::Terminal { .. } => {
            let screen = ScreenContent {
                screen: ScreenKind::Paid,
                merchant_name: "Loja Exemplo".into(),
                amount_cents: 1234,
                brcode: None,
                expires_at: None,
                payer_name: Some("Fulano".into()),
                paid_at: None,
                locale: "pt-BR".into(),
                time_zone: "America/Sao_Paulo".into(),
            };
            (EffectKind::PaymentConfirmed, CONTENT_SCREEN, serde_json::to_vec(&screen).expect("screen"))
        }
    };
    Job {
        v: 1,
        message_id: format!("{n:032x}"),
        seq,
        kind,
        event_id: format!("Charge:bench-{n}:1"),
        charge_id: format!("bench-{n}"),
        content_type: content_type.into(),
        payload: Job::encode_payload(&payload),
        expires_at: None,
    }
}

fn client_tls(ca: &Path) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)? {
        roots.add(cert?)?;
    }
    Ok(Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth(),
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "error".into()))
        .with_writer(std::io::stderr)
        .init();
    let work =
        a.work.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("fleet-mosquitto-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let r = run(&a, &work).await;
    let _ = std::fs::remove_dir_all(&work);
    r
}

async fn run(a: &Args, work: &Path) -> anyhow::Result<()> {
    let scenario = Scenario::new(ScenarioConfig::new(a.seed, a.devices, 0));
    let devices = devices_from_records(scenario.device_records());
    let ids: Vec<String> = devices.iter().map(|d| d.id().to_string()).collect();

    // Credentials: the same throwaway CA as pixgate-load, a secret per device.
    let setup = Instant::now();
    let pki = work.join("pki");
    gateway::cli::credentials::create_ca(&pki, &["localhost".into(), "127.0.0.1".into()], true)?;
    // mosquitto started as root reads its files as the `mosquitto` user: the throwaway
    // server key (written 0600) must be readable.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(pki.join("server.key"), std::fs::Permissions::from_mode(0o644))?;
    }
    let mut creds = gateway::store::credentials::Credentials::load(&work.join("throwaway.json"), true)?;
    let mut issued = creds.issue_many(ids.iter().map(String::as_str).chain([GATEWAY_USER]))?;
    let gateway_secret = issued.pop().context("gateway secret")?.1;
    let passwd = work.join("passwd");
    let mut text: String = issued.iter().map(|(id, s)| format!("{id}:{s}\n")).collect();
    text.push_str(&format!("{GATEWAY_USER}:{gateway_secret}\n"));
    std::fs::write(&passwd, text)?;
    let out = std::process::Command::new("mosquitto_passwd").arg("-U").arg(&passwd).stdin(Stdio::null()).output()?;
    if !out.status.success() {
        bail!("mosquitto_passwd -U: {}", String::from_utf8_lossy(&out.stderr));
    }
    // The ACL equivalent of pixgate's access rules: a device reads its jobs, writes its acks
    // and its status (retained, and its will); the gateway reads and writes everything.
    let acl = work.join("acl");
    let pattern = |t: Topic| t.path().replace("{id}", "%u");
    std::fs::write(
        &acl,
        format!(
            "user {GATEWAY_USER}\ntopic readwrite pixgate/v1/#\n\npattern read {}\npattern write {}\npattern write {}\n",
            pattern(Topic::Jobs("{id}".into())),
            pattern(Topic::Acks("{id}".into())),
            pattern(Topic::Status("{id}".into())),
        ),
    )?;
    let secrets = Arc::new(issued.into_iter().collect());
    say(format!(
        "tls: throwaway CA, {} secrets and the password file in {:.1} s",
        ids.len(),
        setup.elapsed().as_secs_f64()
    ));

    let port = free_port();
    let p = |f: &str| pki.join(f).display().to_string();
    let conf = format!(
        "per_listener_settings false\nallow_anonymous false\npassword_file {}\nacl_file {}\npersistence false\nlog_dest stderr\nlog_type error\nlog_type warning\nmax_queued_messages 1000\n\nlistener {port} 127.0.0.1\nmax_connections -1\ncafile {}\ncertfile {}\nkeyfile {}\nrequire_certificate false\n",
        passwd.display(),
        acl.display(),
        p("ca.crt"),
        p("server.crt"),
        p("server.key"),
    );
    let broker =
        pixgate_tests::mosquitto::Broker::start_logging(work, &conf, port, Duration::from_secs(10), false).await?;
    let pid = broker.pid().context("mosquitto pid")?;
    let result = drive(a, work, port, pid, devices, secrets, &gateway_secret).await;
    broker.stop().await;
    result
}

#[allow(clippy::too_many_arguments)]
async fn drive(
    a: &Args,
    work: &Path,
    port: u16,
    pid: u32,
    devices: Vec<DeviceSpec>,
    secrets: Arc<std::collections::BTreeMap<String, String>>,
    gateway_secret: &str,
) -> anyhow::Result<()> {
    let ca = work.join("pki/ca.crt");
    let cpu = || pixgate_tests::cpu::process(pid).unwrap_or_default();
    let stats = Arc::new(Stats::counting_only(None));
    let t0 = Instant::now();
    let fleet = fleet::start_with_options(
        FleetConfig {
            mqtt_host: "127.0.0.1".into(),
            mqtt_port: port,
            out_dir: work.join("devices"),
            devices: devices.clone(),
            security: MqttSecurity::Tls { ca: ca.clone(), identity: DeviceIdentity::Secret { secrets } },
        },
        FleetOptions { rendering: Rendering::Verify, stats: stats.clone(), ..FleetOptions::default() },
    )
    .await?;
    let n = devices.len();
    let deadline = t0 + Duration::from_secs(a.connect_timeout_s);
    let mut last = (Instant::now(), 0u64);
    let mut next_print = Instant::now() + Duration::from_secs(5);
    let mut peak_rate = 0.0f64;
    loop {
        let connected = fleet.connected();
        let done = connected == n;
        if done || Instant::now() >= next_print || Instant::now() > deadline {
            next_print += Duration::from_secs(5);
            let connects = fleet.connects();
            let rate = (connects - last.1) as f64 / last.0.elapsed().as_secs_f64().max(1e-3);
            peak_rate = peak_rate.max(rate);
            last = (Instant::now(), connects);
            say(format!(
                "connect: t={:.0} s devices connected {connected}/{n}, {rate:.0} connections/s, {} failed attempts, mosquitto rss {} MiB",
                t0.elapsed().as_secs_f64(),
                fleet.connection_failures(),
                memory_kib(pid).0 / 1024
            ));
            if done {
                break;
            }
            if Instant::now() > deadline {
                bail!("{} of {n} devices not connected; last errors {:?}", n - connected, fleet.last_errors(5));
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let connect_s = t0.elapsed().as_secs_f64();
    let (connects, failures) = (fleet.connects(), fleet.connection_failures());
    let rss_connected = memory_kib(pid).0;
    say(format!("connect: all {n} connected after {connect_s:.1} s; {connects} connections accepted, {failures} failed attempts"));

    // The gateway's part: publish jobs, count acks.
    let mut mo = MqttOptions::new("pixgate-gateway", "127.0.0.1", port);
    mo.set_keep_alive(Duration::from_secs(30))
        .set_clean_session(true)
        .set_inflight(u16::try_from(a.window.min(65_000)).unwrap_or(1000))
        .set_max_packet_size(4 << 20, 4 << 20)
        .set_credentials(GATEWAY_USER, gateway_secret)
        .set_transport(Transport::tls_with_config(TlsConfiguration::Rustls(client_tls(&ca)?)));
    let (client, mut eventloop) = AsyncClient::new(mo, 1024);
    let acks = Arc::new(AtomicU64::new(0));
    let subscribed = Arc::new(tokio::sync::Notify::new());
    let poll = {
        let (acks, subscribed) = (acks.clone(), subscribed.clone());
        tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(_))) => subscribed.notify_one(),
                    Ok(Event::Incoming(Packet::Publish(p))) if p.topic.ends_with("/acks") => {
                        acks.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        eprintln!("gateway client: {e}");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
        })
    };
    client.subscribe("pixgate/v1/devices/+/acks", QoS::AtLeastOnce).await?;
    tokio::time::timeout(Duration::from_secs(30), subscribed.notified()).await.context("gateway SUBACK")?;
    let jobs: Vec<(String, Vec<u8>)> = (0..a.jobs)
        .map(|i| {
            let spec = &devices[i % n];
            let seq = (i / n) as u64 + 1;
            (Topic::Jobs(spec.id().to_string()).path(), serde_json::to_vec(&job_for(spec, seq, i)).expect("job"))
        })
        .collect();
    let job_bytes: usize = jobs.iter().map(|j| j.1.len()).sum();
    let cpu0 = cpu();
    let start = Instant::now();
    let mut min_held = n;
    let mut last_print = Instant::now();
    for (i, (topic, payload)) in jobs.into_iter().enumerate() {
        while i as u64 >= acks.load(Ordering::Relaxed) + a.window as u64 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        client.publish(topic, QoS::AtLeastOnce, false, payload).await?;
        if last_print.elapsed() > Duration::from_secs(5) {
            last_print = Instant::now();
            min_held = min_held.min(fleet.connected());
            say(format!(
                "jobs: {i} published, {} acked, {} devices connected",
                acks.load(Ordering::Relaxed),
                fleet.connected()
            ));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(300);
    while acks.load(Ordering::Relaxed) < a.jobs as u64 {
        if Instant::now() > deadline {
            bail!("only {} of {} jobs acked", acks.load(Ordering::Relaxed), a.jobs);
        }
        min_held = min_held.min(fleet.connected());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu_msg = cpu().saturating_sub(cpu0).as_secs_f64() * 1e6 / a.jobs as f64;
    let (_, hwm) = memory_kib(pid);
    let carried = stats.carried_out();
    say(format!(
        "jobs: {} acked in {secs:.1} s ({:.0}/s), {carried} carried out by the devices, {:.0} bytes per job",
        a.jobs,
        a.jobs as f64 / secs,
        job_bytes as f64 / a.jobs.max(1) as f64
    ));
    println!(
        "\nFLEET broker=mosquitto tls=Secret devices={n} held={min_held} connect_s={connect_s:.1} handshakes_per_s={:.0} peak_handshakes_per_s={peak_rate:.0} failed_attempts={failures} rss_connected_mib={:.0} rss_peak_mib={:.0} messages={} messages_per_s={:.0} cpu_us_per_msg={cpu_msg:.0}",
        connects as f64 / connect_s,
        rss_connected as f64 / 1024.0,
        hwm as f64 / 1024.0,
        a.jobs,
        a.jobs as f64 / secs,
    );
    poll.abort();
    let _ = fleet.shutdown().await;
    Ok(())
}
