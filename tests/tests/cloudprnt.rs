//! Printers that fetch their jobs from pixgate over their makers' protocols: a fixture
//! printer whose registry document says `printer.transport: cloudprnt-http` (Star
//! CloudPRNT: it polls) or `cloudprnt-mqtt` (it is told of its jobs on pixgate's MQTT
//! listener) with its `printer.mac`, or `epson-sdp` (Epson Server Direct Print), played by
//! `printer-sim cloudprnt` and `printer-sim sdp` (clients written from the makers'
//! documents) over real TLS with certificates the test makes, authenticated with a secret
//! pixgate issued; `mosquitto_sub` as a stranger on the MQTT listener.
//! Real tansu broker, pixgate as a child process. What the printer printed is read back
//! from its `jobs.jsonl` (each PNG and its job token) and its PNGs, decoded.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::harness::{wait_for, Rig};
use pixgate_tests::printer_sim::CloudSim;
use serde_json::Value;
use simulators::capture::{self, CaptureRecord};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A card machine of the fixtures and the printer it is paired with (58 mm, CP850).
const TERMINAL: &str = "7f80e222f828767efc2f9162";
const PRINTER: &str = "8baa7196b50ac2f86702824c";
/// The MAC the registry gives the printer, and one it does not.
const MAC: &str = "00:11:62:0a:1b:2c";
const OTHER_MAC: &str = "00:11:62:0a:1b:2d";
const WAIT: Duration = Duration::from_secs(90);

/// A fresh folder for a test's files outside its rig (the PKI, secrets): `name` and the
/// process id under the system's temporary folder.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pixgate-{name}-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Stops the gateway and the rig, and removes `scratch`.
fn finish(mut rig: Rig, scratch: &Path) {
    rig.kill_gateway();
    rig.shutdown();
    let _ = std::fs::remove_dir_all(scratch);
}

/// The CloudPRNT server's TLS files, the printer's secret, and where it listens.
struct Setup {
    url: String,
    ca: PathBuf,
    secret_file: PathBuf,
    env: Vec<(&'static str, String)>,
    /// The settings of pixgate's MQTT listener on TLS with the same fleet CA (the printer
    /// on the MQTT method connects there).
    mqtt_env: Vec<(&'static str, String)>,
}

impl Setup {
    /// `printer-sim cloudprnt` arguments for printer `user` as [`MAC`] on the HTTP method:
    /// this server, its secret, the fleet CA, a poll every 300 ms, paper `paper_mm` wide.
    fn printer_args(&self, user: &str, paper_mm: &str) -> Vec<String> {
        let (secret, ca) = (self.secret_file.display().to_string(), self.ca.display().to_string());
        ["--url", &self.url, "--mac", MAC, "--user", user, "--password-file", &secret, "--ca", &ca]
            .into_iter()
            .chain(["--poll-ms", "300", "--paper", paper_mm])
            .map(String::from)
            .collect()
    }
}

/// A fleet CA (its server certificate for 127.0.0.1), a secret issued to `printer`, and the
/// gateway's settings for a CloudPRNT server on TLS at a free port.
fn setup(dir: &Path, printer: &str) -> Setup {
    let bin = pixgate_tests::gateway::find_binary().unwrap();
    let pki = pixgate_tests::pki::Fleet::create(&dir.join("pki"), &[]).unwrap();
    let secrets = dir.join("credentials.json");
    let secrets_s = secrets.display().to_string();
    let issue = ["devices", "credentials", "issue", printer];
    let (ok, secret, err) = pixgate_tests::gateway::cli(&bin, 0, &issue, &[("PIXGATE_MQTT__CREDENTIALS", &secrets_s)]);
    assert!(ok, "pixgate {issue:?}: {err}");
    let secret_file = dir.join("printer.secret");
    std::fs::write(&secret_file, secret.trim()).unwrap();
    let listen = format!("127.0.0.1:{}", pixgate_tests::net::free_port());
    let env = vec![
        ("PIXGATE_MQTT__CREDENTIALS", secrets_s),
        ("PIXGATE_CLOUDPRNT__LISTEN", listen.clone()),
        ("PIXGATE_CLOUDPRNT__TLS_CERT", pki.server_cert().display().to_string()),
        ("PIXGATE_CLOUDPRNT__TLS_KEY", pki.server_key().display().to_string()),
        ("PIXGATE_CLOUDPRNT__OFFLINE_AFTER_MS", "3000".into()),
        ("PIXGATE_CLOUDPRNT__MAX_POLLS_PER_SECOND", "20".into()),
        // A lost confirmation is offered again soon.
        ("PIXGATE_DELIVERY__ACK_TIMEOUT_MS", "2000".into()),
        ("PIXGATE_DELIVERY__BACKOFF_INITIAL_MS", "200".into()),
    ];
    Setup {
        url: format!("https://{listen}/cloudprnt"),
        ca: pki.ca_cert(),
        secret_file,
        env,
        mqtt_env: pki.gateway_env(),
    }
}

/// Publishes the fixture registry with `printer` polling over CloudPRNT as [`MAC`],
/// printing the pay-with-Pix slip too when `slip` (a QR to decode from its picture).
/// Returns the records published.
async fn publish_registry(rig: &Rig, printer: &str, slip: bool) -> u64 {
    publish_registry_as(rig, printer, "cloudprnt-http", slip).await
}

/// [`publish_registry`] with the printer on `transport`.
async fn publish_registry_as(rig: &Rig, printer: &str, transport: &str, slip: bool) -> u64 {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let text = std::fs::read_to_string(fixtures.join("devices.jsonl")).unwrap();
    let mut found = 0;
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            let mut rec: Value = serde_json::from_str(l).unwrap();
            if rec["key"] == printer {
                let p = &mut rec["value"]["fullDocument"]["printer"];
                p["transport"] = transport.into();
                if transport.starts_with("cloudprnt") {
                    p["mac"] = MAC.to_ascii_uppercase().into();
                }
                p["printPixSlip"] = slip.into();
                found += 1;
            }
            rec.to_string()
        })
        .collect();
    assert_eq!(found, 1, "the printer is a fixture device record");
    let file = rig.dir().join("devices.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    rig.publish_registry_file(&file).await
}

/// Charge `id` created on the card machine (`ACTIVE`: a slip with its QR on a printer set
/// to print one) and paid (`COMPLETED`: the receipt).
fn charge(id: &str, t: u64) -> [CaptureRecord; 2] {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let template = pixgate_tests::charges::template(&fixtures);
    let rec = |status, v| pixgate_tests::charges::charge_record(&template, TERMINAL, id, status, v, 60, t);
    [rec("ACTIVE", 0), rec("COMPLETED", 1)]
}

/// Publishes the charges `ids`, one record at a time (each read before the next is sent:
/// the jobs are queued in this order).
async fn publish_charges(rig: &Rig, ids: &[String]) {
    let t = chrono::Utc::now().timestamp() as u64;
    let records: Vec<CaptureRecord> = ids.iter().flat_map(|id| charge(id, t)).collect();
    rig.publish_charges_in_order(&records).await;
}

/// The printer's queued jobs, in seq order: (message id, kind).
fn queued(rig: &Rig) -> Vec<(String, String)> {
    let (status, body) = rig.gateway().get(&format!("/outbox/{PRINTER}")).unwrap();
    assert_eq!(status, 200, "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    let mut jobs: Vec<(u64, String, String)> = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (j["seq"].as_u64().unwrap(), j["message_id"].as_str().unwrap().into(), j["kind"].as_str().unwrap().into())
        })
        .collect();
    jobs.sort();
    jobs.into_iter().map(|(_, m, k)| (m, k)).collect()
}

/// Publishes a paid charge per id and waits until their receipts are queued and held
/// because the printer `sim` reported paper out: nothing prints for 2 s. Returns the
/// queued jobs.
async fn receipts_held_by_paper_out(rig: &Rig, sim: &CloudSim, ids: &[String]) -> Vec<(String, String)> {
    publish_charges(rig, ids).await;
    rig.wait_stats(WAIT, |s| s.counters.outbox_jobs >= ids.len() as u64 && s.counters.pending_records == 0).await;
    let jobs = queued(rig);
    // A slip still queued when its charge is paid is superseded by the receipt.
    assert!(
        jobs.len() == ids.len() && jobs.iter().all(|(_, k)| k == "print_receipt"),
        "a receipt per charge: {jobs:?}"
    );
    rig.wait_stats(WAIT, |s| s.counters.held_devices.get("paper_out") == Some(&1)).await;
    let (_, body) = rig.gateway().get(&format!("/outbox/{PRINTER}")).unwrap();
    assert!(body.contains(r#""held":"paper_out""#), "{body}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(sim.printed().is_empty(), "printed while out of paper");
    jobs
}

/// After a restart, the one job `sim` printed is not offered again: the new process polled
/// at least ten times (the printer was online, and a queued job would have been offered),
/// the printer said no `duplicate TOKEN`, printed one page, and nothing is queued.
async fn printed_once_and_not_offered_again(rig: &Rig, sim: &CloudSim) {
    rig.wait_stats(WAIT, |s| s.counters.cloudprnt_polls >= 10).await;
    let lines = sim.lines_now();
    assert!(!lines.iter().any(|l| l.starts_with("duplicate ")), "the printed job was offered again: {lines:?}");
    assert_eq!(sim.printed().len(), 1, "printed once: {lines:?}");
    assert!(queued(rig).is_empty(), "nothing queued after the restart");
}

fn refusals(rig: &Rig, rule: &str) -> u64 {
    rig.gateway().stats().unwrap().counters.cloudprnt_refusals.get(rule).copied().unwrap_or(0)
}

/// Proofs 1 to 4 on one printer: out of paper, its jobs are held and the poll reports it;
/// a printer with a wrong password or another MAC gets nothing and is counted; paper back,
/// every job prints once and in queue order, the first one after a lost confirmation (the
/// same token offered again, not printed twice); the pictures are as wide as the head, and
/// a pay-with-Pix slip's QR decodes to the charge's BR Code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloudprnt_printer_prints_each_job_once_in_order_and_only_its_own() {
    let scratch = scratch("cloudprnt");
    let s = setup(&scratch, PRINTER);
    let rig = Rig::builder("cloudprnt").envs(s.env.clone()).start().await;
    publish_registry(&rig, PRINTER, true).await;
    let ca = s.ca.display().to_string();
    let secret = s.secret_file.display().to_string();
    let printer_args = |mac: &'static str, secret: String| {
        vec![
            "--url".to_string(),
            s.url.clone(),
            "--mac".into(),
            mac.into(),
            "--user".into(),
            PRINTER.into(),
            "--password-file".into(),
            secret,
            "--ca".into(),
            ca.clone(),
            "--poll-ms".into(),
            "300".into(),
            "--paper".into(),
            "58".into(),
        ]
    };
    let out = rig.dir().join("printer");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("state"), "paper-out").unwrap();
    let mut args = printer_args(MAC, secret.clone());
    args.extend(["--skip-confirm".to_string(), "1".into()]);
    let sim = CloudSim::start(&out, &args.iter().map(String::as_str).collect::<Vec<_>>());
    sim.line("polling");

    // Strangers: a wrong password, and the right one from a printer with another MAC.
    let wrong = scratch.join("wrong.secret");
    std::fs::write(&wrong, "not-the-secret").unwrap();
    let stranger_args = printer_args(MAC, wrong.display().to_string());
    let stranger =
        CloudSim::start(&rig.dir().join("stranger"), &stranger_args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(stranger.line("refused"), "401");
    let other_args = printer_args(OTHER_MAC, secret.clone());
    let other = CloudSim::start(&rig.dir().join("other"), &other_args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(other.line("refused"), "403");

    let ids: Vec<String> = "abc".chars().map(|c| c.to_string().repeat(24)).collect();
    let jobs = receipts_held_by_paper_out(&rig, &sim, &ids).await;
    assert!(refusals(&rig, "bad_credentials") >= 1, "the wrong password is counted");
    assert!(refusals(&rig, "mac_mismatch") >= 1, "the other MAC is counted");

    // Paper back: every job once, in the queue's order.
    sim.set_state("ready");
    let lines = sim.wait_printed(jobs.len());
    // (The card machine is not connected: its screens stay queued.)
    let receipts = ids.len() as u64;
    rig.wait_stats(WAIT, |s| s.counters.effects_done.get("print_receipt") == Some(&receipts)).await;
    wait_for("the printer's queue to empty", WAIT, || queued(&rig).is_empty()).await;
    let printed = sim.printed();
    let tokens: Vec<String> = printed.iter().map(|(_, t)| t.clone()).collect();
    let want: Vec<String> = jobs.iter().map(|(m, _)| m.clone()).collect();
    assert_eq!(tokens, want, "each job once, in order (the job token is its message id)");
    // The first job's confirmation was lost: it was still offered at the next poll (before
    // the second job, one in flight) and not printed again.
    let first = &want[0];
    assert!(lines.iter().any(|l| l == &format!("duplicate {first}")), "the unconfirmed job came again: {lines:?}");
    let stats = rig.gateway().stats().unwrap().counters;
    assert_eq!(stats.deadletters_parked + stats.deadletters_published, 0, "nothing dead-lettered");
    assert!(stats.cloudprnt_polls > jobs.len() as u64, "polls counted: {}", stats.cloudprnt_polls);

    // A charge left unpaid: its slip prints. The pictures are 384 dots wide (58 mm), and
    // the slip's QR decodes to the charge's BR Code.
    let t = chrono::Utc::now().timestamp() as u64;
    let [active, _] = charge(&"e".repeat(24), t);
    capture::publish_records(&rig.producer(), &[active]).await.unwrap();
    sim.wait_printed(jobs.len() + 1);
    let printed = sim.printed();
    assert_eq!(printed.len(), jobs.len() + 1);
    for (png, _) in &printed {
        let img = image::open(png).unwrap().to_luma8();
        assert_eq!(img.width(), 384, "{}", png.display());
    }
    let template = pixgate_tests::charges::template(&pixgate_tests::demo::default_fixtures());
    let brcode = template["value"]["fullDocument"]["brCode"].as_str().unwrap().to_string();
    let slip = image::open(&printed[jobs.len()].0).unwrap().to_luma8();
    let mut grid = rqrr::PreparedImage::prepare(slip);
    let found = grid.detect_grids();
    assert_eq!(found.len(), 1, "one QR on the slip");
    let (_, text) = found[0].decode().unwrap();
    assert_eq!(text, brcode);
    let receipt = image::open(&printed[0].0).unwrap().to_luma8();
    assert!(rqrr::PreparedImage::prepare(receipt).detect_grids().is_empty(), "never a QR on a paid receipt");
    assert!(stranger.printed().is_empty() && other.printed().is_empty(), "strangers printed nothing");
    drop((sim, stranger, other));
    finish(rig, &scratch);
}

/// The same proofs on the MQTT method: the printer asks its settings, connects to
/// pixgate's MQTT listener with them, and is told of each job there; out of paper its
/// jobs are held; a stranger (a wrong password, the printer's own credentials on another
/// MAC's or pixgate's topics) gets nothing and is counted; paper back, every job once and
/// in order, the first after a lost `print-result` sent again and reported a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cloudprnt_printer_on_mqtt_prints_each_job_once_in_order_and_only_its_own() {
    use pixgate_tests::mosquitto::{self, ClientAuth, Subscriber};
    mosquitto::require_clients().unwrap();
    let scratch = scratch("cloudprnt-mqtt");
    let s = setup(&scratch, PRINTER);
    let rig = Rig::builder("cloudprnt-mqtt").envs(s.env.clone()).envs(s.mqtt_env.clone()).start().await;
    publish_registry_as(&rig, PRINTER, "cloudprnt-mqtt", false).await;
    let out = rig.dir().join("printer");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("state"), "paper-out").unwrap();
    let secret_path = s.secret_file.display().to_string();
    let ca = s.ca.display().to_string();
    let args = [
        "--url",
        &s.url,
        "--mac",
        MAC,
        "--user",
        PRINTER,
        "--password-file",
        &secret_path,
        "--ca",
        &ca,
        "--poll-ms",
        "300",
        "--paper",
        "58",
        "--skip-confirm",
        "1",
    ];
    let sim = CloudSim::start(&out, &args);
    sim.line("polling");
    let port = rig.settings().mqtt_port;
    wait_for("the printer's MQTT session", WAIT, || {
        rig.gateway()
            .stats()
            .is_ok_and(|s| s.counters.held_devices.get("paper_out") == Some(&1) || s.counters.mqtt_connected >= 1)
    })
    .await;

    // Strangers on the MQTT listener: a wrong password is refused at CONNECT; the printer's
    // own credentials get neither another MAC's topics nor pixgate's device topics.
    let secret = std::fs::read_to_string(&s.secret_file).unwrap();
    let wrong = ClientAuth::password(&s.ca, PRINTER, "not-the-secret");
    let other = format!("star/cloudprnt/to-device/{OTHER_MAC}/#");
    let refused = Subscriber::start_granted(port, &wrong, &format!("dev-{PRINTER}.x"), &[&other], 1, false, WAIT).await;
    assert!(refused.is_err(), "a wrong password subscribes to nothing");
    let own = ClientAuth::password(&s.ca, PRINTER, secret.trim());
    let jobs = format!("pixgate/v1/devices/{PRINTER}/jobs");
    let (spy, granted) =
        Subscriber::start_granted(port, &own, &format!("dev-{PRINTER}.spy"), &[&other, &jobs], 1, false, WAIT)
            .await
            .unwrap();
    assert_eq!(granted, [128, 128], "another MAC's and pixgate's topics are not the printer's");
    spy.stop().await;

    let ids: Vec<String> = "fgh".chars().map(|c| c.to_string().repeat(24)).collect();
    let jobs = receipts_held_by_paper_out(&rig, &sim, &ids).await;
    let counters = rig.gateway().stats().unwrap().counters;
    let refused = |rule: &str| counters.mqtt_refusals.get(rule).copied().unwrap_or(0);
    assert!(refused("bad_credentials") >= 1 && refused("subscribe") >= 2, "{:?}", counters.mqtt_refusals);

    // Paper back: told at once over MQTT, every job once and in order.
    sim.set_state("ready");
    let lines = sim.wait_printed(jobs.len());
    let receipts = ids.len() as u64;
    rig.wait_stats(WAIT, |s| s.counters.effects_done.get("print_receipt") == Some(&receipts)).await;
    wait_for("the printer's queue to empty", WAIT, || queued(&rig).is_empty()).await;
    let tokens: Vec<String> = sim.printed().iter().map(|(_, t)| t.clone()).collect();
    let want: Vec<String> = jobs.iter().map(|(m, _)| m.clone()).collect();
    assert_eq!(tokens, want, "each job once, in order (the job token is its message id)");
    let first = &want[0];
    assert!(
        lines.iter().any(|l| l == &format!("duplicate {first}")),
        "the job whose result was lost came again: {lines:?}"
    );
    let stats = rig.gateway().stats().unwrap().counters;
    assert_eq!(stats.deadletters_parked + stats.deadletters_published, 0, "nothing dead-lettered");
    assert_eq!(stats.cloudprnt_polls, 0, "told over MQTT: it never polled");
    for (png, _) in &sim.printed() {
        assert_eq!(image::open(png).unwrap().to_luma8().width(), 384, "{}", png.display());
    }

    // Switched off: its connection drops without DISCONNECT, and the next receipt waits
    // held as offline; switched on, it asks its settings again, reconnects and prints it.
    sim.set_state("offline");
    wait_for("the printer's session to end", WAIT, || {
        rig.gateway().stats().is_ok_and(|s| s.counters.mqtt_connected == 0)
    })
    .await;
    let late = vec!["i".repeat(24)];
    publish_charges(&rig, &late).await;
    rig.wait_stats(WAIT, |s| s.counters.held_devices.get("offline") == Some(&1)).await;
    assert_eq!(sim.printed().len(), jobs.len(), "nothing printed while switched off");
    sim.set_state("ready");
    sim.wait_printed(jobs.len() + 1);
    rig.wait_stats(WAIT, |s| s.counters.effects_done.get("print_receipt") == Some(&(receipts + 1))).await;
    drop(sim);
    finish(rig, &scratch);
}

/// An Epson printer on Server Direct Print, on a listener of its own (`sdp.listen`), with
/// CloudPRNT's certificate: its secret issued again with its Digest hash kept, the gateway
/// started as `name` and the registry published with the printer on `epson-sdp`. Returns
/// the rig and `printer-sim sdp`'s arguments for a secret in a file, polling every
/// `poll_ms`.
async fn sdp_rig(name: &str, s: &Setup) -> (Rig, impl Fn(&str, &str) -> Vec<String>) {
    let bin = pixgate_tests::gateway::find_binary().unwrap();
    let credentials = s.env.iter().find(|(k, _)| *k == "PIXGATE_MQTT__CREDENTIALS").unwrap().1.clone();
    let issue = ["devices", "credentials", "issue", PRINTER, "--digest"];
    let (ok, secret, err) =
        pixgate_tests::gateway::cli(&bin, 0, &issue, &[("PIXGATE_MQTT__CREDENTIALS", credentials.as_str())]);
    assert!(ok, "pixgate {issue:?}: {err}");
    std::fs::write(&s.secret_file, secret.trim()).unwrap();
    let sdp_listen = format!("127.0.0.1:{}", pixgate_tests::net::free_port());
    let rig = Rig::builder(name).envs(s.env.clone()).env("PIXGATE_SDP__LISTEN", sdp_listen.clone()).start().await;
    publish_registry_as(&rig, PRINTER, "epson-sdp", false).await;
    let (url, ca) = (format!("https://{sdp_listen}/sdp"), s.ca.display().to_string());
    let printer_args = move |secret: &str, poll_ms: &str| {
        [
            "--url",
            &url,
            "--id",
            PRINTER,
            "--user",
            PRINTER,
            "--password-file",
            secret,
            "--ca",
            &ca,
            "--poll-ms",
            poll_ms,
            "--paper",
            "58",
            "--status-ms",
            "500",
        ]
        .map(String::from)
        .to_vec()
    };
    (rig, printer_args)
}

/// The reprint header the direct printers' interrupted jobs and Epson's jobs handed out
/// twice are printed under.
const REPRINT_HEADER: &[u8] = b"VIA / REIMPRESS";

/// Whether the printed job whose PNG is `png` (its ESC/POS beside it) carries the reprint
/// header.
fn is_reprint(png: &Path) -> bool {
    let bytes = std::fs::read(png.with_extension("bin")).unwrap();
    bytes.windows(REPRINT_HEADER.len()).any(|w| w == REPRINT_HEADER)
}

/// Epson Server Direct Print, on a listener of its own (`sdp.listen`): the printer proves
/// itself with HTTP Digest (its secret issued with `--digest`); out of paper (its status notification says so) its jobs are held; a
/// wrong password gets nothing and is counted; paper back, every job prints in order, the
/// first twice: its result was lost, and an Epson printer keeps no memory of job ids, so
/// the second copy is printed under the reprint header. The job is the ESC/POS pixgate
/// rendered, as an ePOS-Print `<command>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epson_printer_on_server_direct_print_prints_each_job_in_order() {
    let scratch = scratch("sdp");
    let s = setup(&scratch, PRINTER);
    let (rig, printer_args) = sdp_rig("sdp", &s).await;
    let out = rig.dir().join("printer");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("state"), "paper-out").unwrap();
    let mut args = printer_args(&s.secret_file.display().to_string(), "300");
    args.extend(["--skip-confirm".to_string(), "1".into()]);
    let sim = CloudSim::start_sdp(&out, &args.iter().map(String::as_str).collect::<Vec<_>>());
    sim.line("polling");

    let wrong = scratch.join("wrong.secret");
    std::fs::write(&wrong, "not-the-secret").unwrap();
    let stranger_args = printer_args(&wrong.display().to_string(), "300");
    let stranger =
        CloudSim::start_sdp(&rig.dir().join("stranger"), &stranger_args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(stranger.line("refused"), "401");

    let ids: Vec<String> = "jkl".chars().map(|c| c.to_string().repeat(24)).collect();
    let jobs = receipts_held_by_paper_out(&rig, &sim, &ids).await;
    assert!(refusals(&rig, "bad_credentials") >= 1, "the wrong password is counted");

    sim.set_state("ready");
    sim.wait_printed(jobs.len() + 1);
    let receipts = ids.len() as u64;
    rig.wait_stats(WAIT, |s| s.counters.effects_done.get("print_receipt") == Some(&receipts)).await;
    wait_for("the printer's queue to empty", WAIT, || queued(&rig).is_empty()).await;
    let printed = sim.printed();
    let job_ids: Vec<String> = printed.iter().map(|(_, t)| t.clone()).collect();
    let id = |m: &String| m[..30].to_string();
    let want: Vec<String> = [id(&jobs[0].0)].into_iter().chain(jobs.iter().map(|(m, _)| id(m))).collect();
    assert_eq!(job_ids, want, "in order, the first twice (its result was lost)");
    assert!(!is_reprint(&printed[0].0), "the first copy is an original");
    assert!(is_reprint(&printed[1].0), "the second copy carries the reprint header");
    assert!(printed[2..].iter().all(|(p, _)| !is_reprint(p)));
    assert_eq!(image::open(&printed[2].0).unwrap().to_luma8().width(), 384);
    let stats = rig.gateway().stats().unwrap().counters;
    assert_eq!(stats.deadletters_parked + stats.deadletters_published, 0, "nothing dead-lettered");
    assert!(stranger.printed().is_empty());
    drop((sim, stranger));
    finish(rig, &scratch);
}

/// A job handed to an Epson printer whose result never came is printed again under the
/// reprint header also when pixgate was killed in between (SIGKILL): the job was recorded
/// as handed out, synced, before the answer that carried it. The printer polls every 4 s,
/// so the kill comes before it could ask the first process again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epson_job_handed_out_before_a_sigkill_is_a_reprint_after_it() {
    let scratch = scratch("sdp-kill");
    let s = setup(&scratch, PRINTER);
    let (mut rig, printer_args) = sdp_rig("sdp-kill", &s).await;
    let mut args = printer_args(&s.secret_file.display().to_string(), "4000");
    args.extend(["--skip-confirm", "1"].map(String::from));
    let sim = CloudSim::start_sdp(&rig.dir().join("printer"), &args.iter().map(String::as_str).collect::<Vec<_>>());
    sim.line("polling");

    let ids = vec!["d".repeat(24)];
    publish_charges(&rig, &ids).await;
    sim.wait_printed(1);
    rig.kill_gateway();
    rig.start_gateway();
    sim.wait_printed(2);
    rig.wait_stats(WAIT, |s| s.counters.effects_done.get("print_receipt") == Some(&1)).await;
    let printed = sim.printed();
    assert_eq!(printed[0].1, printed[1].1, "the same job twice: {printed:?}");
    assert!(!is_reprint(&printed[0].0), "the first copy is an original");
    assert!(is_reprint(&printed[1].0), "the copy after the restart carries the reprint header");
    // Each copy from its own process: the second from the mark on disk, not from the
    // first process's count of copies.
    let asked_again = "Epson printer asks again before the job's result";
    let log = |name: &str| std::fs::read_to_string(rig.dir().join(name)).unwrap();
    assert!(!log("pixgate.log").contains(asked_again), "the first process handed out one copy");
    assert!(log("pixgate-1.log").contains(asked_again), "the restarted one handed out the reprint");
    drop(sim);
    finish(rig, &scratch);
}

/// Proof 5: a printer that never polls holds its queue as offline, and its receipt expires
/// by its time to live instead of being dead-lettered for running out of deliveries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_for_a_printer_that_never_polls_expires_by_its_ttl() {
    let scratch = scratch("cloudprnt-ttl");
    let s = setup(&scratch, PRINTER);
    let mut env = s.env.clone();
    env.extend([
        ("PIXGATE_DELIVERY__TTL__PRINT_RECEIPT_S", "8".to_string()),
        ("PIXGATE_DELIVERY__MAX_DELIVERIES", "2".into()),
    ]);
    let rig = Rig::builder("cloudprnt-ttl").envs(env).start().await;
    publish_registry(&rig, PRINTER, false).await;
    let ids = vec!["d".repeat(24)];
    publish_charges(&rig, &ids).await;
    rig.wait_stats(WAIT, |s| s.counters.held_devices.get("offline") == Some(&1)).await;
    rig.wait_stats(WAIT, |s| s.counters.expired.get("print_receipt") == Some(&1)).await;
    let stats = rig.gateway().stats().unwrap().counters;
    assert!(!stats.effects_done.contains_key("print_receipt"), "never printed");
    finish(rig, &scratch);
}

/// A job the printer confirmed is never offered again, however soon pixgate is killed after:
/// a printer on the HTTP method (or Epson's) need not remember its job tokens, so an offer
/// after the restart would print the receipt twice. The simulated one does remember them
/// and says `duplicate TOKEN` when offered one again: the test fails on that offer, not
/// only on a second page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confirmed_job_is_not_offered_again_after_a_sigkill() {
    let scratch = scratch("cloudprnt-kill");
    let s = setup(&scratch, PRINTER);
    // No other synced write may land between the confirmation and the kill: it would sync
    // the removal too and hide an unsynced one. The card machine is not connected, so its
    // QR stays in flight (its paid screen queued behind), resent without being written,
    // and here never runs out of deliveries (nor out of its hour to live) to be
    // dead-lettered.
    let mut env = s.env.clone();
    env.push(("PIXGATE_DELIVERY__MAX_DELIVERIES", "1000".into()));
    let mut rig = Rig::builder("cloudprnt-kill").envs(env).start().await;
    publish_registry(&rig, PRINTER, false).await;
    let args = s.printer_args(PRINTER, "58");
    let sim = CloudSim::start(&rig.dir().join("printer"), &args.iter().map(String::as_str).collect::<Vec<_>>());
    sim.line("polling");

    let ids = vec!["f".repeat(24)];
    publish_charges(&rig, &ids).await;
    sim.wait_printed(1);
    rig.wait_stats(WAIT, |s| s.counters.effects_done.get("print_receipt") == Some(&1)).await;
    // Out of the outbox's queue (a committed removal; `/outbox` reads the file): kill at once.
    wait_for("the printer's queue to empty", WAIT, || queued(&rig).is_empty()).await;
    rig.kill_gateway();
    rig.start_gateway();
    printed_once_and_not_offered_again(&rig, &sim).await;
    drop(sim);
    finish(rig, &scratch);
}

/// A job a printer is printing when pixgate is stopped (SIGTERM) is waited for: its
/// confirmation, a few seconds later, still reaches the last outbox write, so the receipt
/// is not offered again after the restart (a printer on the HTTP method need not remember
/// its job tokens, and would print it twice). The simulated printer confirms 3 s after it
/// prints, and says `duplicate TOKEN` when offered a token it knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_printing_at_sigterm_is_confirmed_before_the_exit() {
    let scratch = scratch("cloudprnt-term");
    let s = setup(&scratch, PRINTER);
    let mut rig = Rig::builder("cloudprnt-term").envs(s.env.clone()).start().await;
    publish_registry(&rig, PRINTER, false).await;
    let mut args = s.printer_args(PRINTER, "58");
    args.extend(["--confirm-delay-ms".to_string(), "3000".to_string()]);
    let sim = CloudSim::start(&rig.dir().join("printer"), &args.iter().map(String::as_str).collect::<Vec<_>>());
    sim.line("polling");

    let ids = vec!["e".repeat(24)];
    publish_charges(&rig, &ids).await;
    sim.wait_printed(1);
    // Printed, its confirmation 3 s away: stop now.
    assert!(rig.stop_gateway(Duration::from_secs(30)), "a clean exit");
    let log = std::fs::read_to_string(rig.dir().join("pixgate.log")).unwrap();
    assert!(
        log.contains("waiting for cloud printers to confirm the jobs they were told of"),
        "stopped while the job was out and unconfirmed"
    );
    assert!(!log.contains("did not confirm it before shutdown"), "confirmed in time");
    // Restarted once the confirmation's moment has passed: a new process up by then would
    // take it (its job offered again, the token the same) and hide a lost one.
    tokio::time::sleep(Duration::from_secs(4)).await;
    rig.start_gateway();
    printed_once_and_not_offered_again(&rig, &sim).await;
    drop(sim);
    finish(rig, &scratch);
}

/// Proof 1 on the bundled fixtures: one 80 mm printer polls over CloudPRNT, every other
/// device is on MQTT: every effect of `expected.json` is carried out once, on its device.
/// The CloudPRNT printer's job tokens are its receipts' message ids, computed here from the
/// records' event ids (`device_protocol::ids::message_id`): each of its receipts is printed
/// once, on a page as wide as its head. (Order across charges is not the records' order
/// here: they are read from three partitions; the first test proves queue order.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fixtures_with_a_cloudprnt_printer_give_every_expected_effect() {
    const CLOUD: &str = "8940f1f836f99eee3692f09e"; // 80 mm
    let fixtures = pixgate_tests::demo::default_fixtures();
    let scratch = scratch("cloudprnt-fixtures");
    let s = setup(&scratch, CLOUD);
    let rig = Rig::builder("cloudprnt-fixtures")
        .envs(s.env.clone())
        .envs(pixgate_tests::replay_clock_env(&fixtures))
        .start()
        .await;
    let mqtt_devices: Vec<_> =
        pixgate_tests::fixture_devices(&fixtures).into_iter().filter(|d| d.id() != CLOUD).collect();
    let fleet = rig.start_fleet(mqtt_devices, pixgate_tests::harness::replay_devices()).await;
    let published = publish_registry(&rig, CLOUD, false).await;
    let args = s.printer_args(CLOUD, "80");
    let sim = CloudSim::start(&rig.dir().join("printer"), &args.iter().map(String::as_str).collect::<Vec<_>>());
    sim.line("polling");

    // Keeping up, as the demo does: a batch without a repeated charge, then everything done.
    let charges = capture::read_records(&fixtures.join("charges.jsonl")).unwrap();
    rig.replay_charges_keeping_up(charges.clone(), published, WAIT).await;

    // Each record's receipt on CLOUD, by message id: its charge.
    let mut receipt_of: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    for r in &charges {
        let v: Value = serde_json::from_slice(&r.value).unwrap();
        let event = v["eventId"].as_str().unwrap();
        let id = device_protocol::ids::message_id(event, CLOUD, device_protocol::EffectKind::PrintReceipt);
        receipt_of.insert(id, r.key.clone().unwrap());
    }
    let want_order = pixgate_tests::expected_effects(&fixtures);
    let mut got: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for e in fleet.effects() {
        got.entry((e.device.clone(), e.charge.clone())).or_default().push(e.kind.as_str().to_string());
    }
    let printed = sim.printed();
    let mine = want_order.keys().filter(|(d, _)| d == CLOUD).count();
    assert!(mine >= 10, "{mine} receipts expected on {CLOUD}");
    assert_eq!(printed.len(), mine, "one page per receipt");
    for (png, token) in &printed {
        let charge = receipt_of.get(token).unwrap_or_else(|| panic!("token {token} is no receipt's"));
        got.entry((CLOUD.to_string(), charge.clone())).or_default().push("print_receipt".into());
        let img = image::open(png).unwrap().to_luma8();
        assert_eq!(img.width(), 576, "{}: 80 mm at 203 dpi", png.display());
        assert!(img.height() > 300 && img.pixels().any(|p| p.0[0] < 128), "{}", png.display());
    }
    assert_eq!(got, want_order, "effects carried out differ from expected.json");
    fleet.shutdown().await;
    drop(sim);
    finish(rig, &scratch);
}
