//! Stock printers on the central shape: two pixgate replicas (`cluster.enabled`, tansu,
//! Debian's `mosquitto` as the devices' broker with the ACL `pixgate devices broker-config`
//! writes, with its Star printers' listener), each serving CloudPRNT and Server Direct
//! Print on TLS, and three printers of the fixtures each pointed at the replica that does
//! **not** hold its queue: a Star printer on CloudPRNT's HTTP method (`printer-sim
//! cloudprnt`), an Epson printer on Server Direct Print (`printer-sim sdp`, HTTP Digest),
//! and a Star printer on CloudPRNT's MQTT method, which takes its settings from that
//! replica and is told of its jobs through mosquitto (user name and password from the
//! password file `pixgate devices credentials issue --mosquitto-passwd` writes).
//!
//! Each device-jobs partition's owner publishes its record (its CloudPRNT URL), retained,
//! on the broker; a replica passes a printer's request on to the owner of the printer's
//! partition, and the owner answers it with its own checks. At the end of the steady part:
//! out of paper, each printer's receipts are held on its owner (the condition travelled
//! with the poll passed on); a wrong password through the other replica is refused by the
//! owner and counted there; a request passed on already is not passed on again; paper back, every receipt prints once and in queue order, and
//! the Epson printer's Digest nonce from the replica it asked first is renewed by the owner
//! (`stale=true`), never refused; on mosquitto, a wrong password is refused, and another
//! printer's password gets none of the MQTT printer's messages.
//!
//! Then the node's death: the Star printers' queue owner (both are on one partition) is
//! stopped (SIGTERM) while more receipts are held on it; the partition moves to the
//! replica the printers reach, which restores the queues from the delivery log; every
//! receipt prints once, in order (the MQTT printer is told again where its jobs are).
//! Last, that replica is restarted: started afresh, it has heard nothing of the MQTT
//! printer, asks it its settings, and its next receipt prints.
//!
//! Real tansu, real mosquitto, real TLS with certificates the test makes, the `pixgate`
//! binary twice, the printer simulators as child processes.

// Helpers of a test are test steps too: a panic is a failed test.
#![allow(clippy::unwrap_used)]

use pixgate_tests::devices_broker::{central_topics, DevicesBroker};
use pixgate_tests::gateway::{GatewayProcess, GatewaySettings};
use pixgate_tests::harness::{wait_for, Rig};
use pixgate_tests::kafka::java_partition;
use pixgate_tests::mosquitto::{self, Subscriber};
use pixgate_tests::net::free_port;
use pixgate_tests::printer_sim::CloudSim;
use serde_json::Value;
use simulators::capture::CaptureRecord;
use std::path::{Path, PathBuf};
use std::time::Duration;

const DEVICE_JOBS: (&str, i32) = ("pixgate.device-jobs", 2);
/// Two card machines of one company of the fixtures (the charge template's) and the
/// printers paired with them: a Star on CloudPRNT, an Epson on Server Direct Print.
const STAR_TERMINAL: &str = "7f80e222f828767efc2f9162";
const STAR: &str = "8baa7196b50ac2f86702824c";
const EPSON_TERMINAL: &str = "724caf4941d4072014b3ce10";
const EPSON: &str = "c967a64cb14028d512c9791e";
const STAR_MAC: &str = "00:11:62:0a:1b:2c";
/// The default printer of another company (its charges name no terminal), on CloudPRNT's
/// MQTT method.
const STAR_MQTT: &str = "0fb23c6f5da2cec255404e4f";
const STAR_MQTT_COMPANY: &str = "a4c123b1612dd272d1371c17";
const STAR_MQTT_MAC: &str = "00:11:62:0a:1b:2e";
const WAIT: Duration = Duration::from_secs(120);

/// One replica's CloudPRNT settings: a listener of its own, advertised to the others;
/// printers on the MQTT method are sent to the broker's printers' listener.
fn cloud_env(
    listen: &str,
    (cert, key): &(PathBuf, PathBuf),
    ca: &Path,
    credentials: &Path,
    printers_port: u16,
) -> Vec<(&'static str, String)> {
    vec![
        ("PIXGATE_CLOUDPRNT__MQTT_HOST", "127.0.0.1".into()),
        ("PIXGATE_CLOUDPRNT__MQTT_PORT", printers_port.to_string()),
        ("PIXGATE_MQTT__CREDENTIALS", credentials.display().to_string()),
        ("PIXGATE_CLOUDPRNT__LISTEN", listen.to_string()),
        ("PIXGATE_CLOUDPRNT__ADVERTISE", format!("https://{listen}")),
        ("PIXGATE_CLOUDPRNT__TLS_CERT", cert.display().to_string()),
        ("PIXGATE_CLOUDPRNT__TLS_KEY", key.display().to_string()),
        ("PIXGATE_CLOUDPRNT__PEER_CA", ca.display().to_string()),
        ("PIXGATE_CLOUDPRNT__OFFLINE_AFTER_MS", "5000".into()),
        ("PIXGATE_CLOUDPRNT__MAX_POLLS_PER_SECOND", "20".into()),
        ("PIXGATE_DELIVERY__BACKOFF_INITIAL_MS", "200".into()),
    ]
}

/// Replica `r`'s settings beyond the rig's: the central shape on the broker
/// ([`DevicesBroker::replica_env`]), dynamic group membership (a stopped replica's
/// partitions move at once: it leaves the group).
fn replica_env(mosquitto: &DevicesBroker, r: usize) -> Vec<(&'static str, String)> {
    let mut env = mosquitto.replica_env(r, DEVICE_JOBS);
    env.push(("PIXGATE_KAFKA__INSTANCE_ID", String::new()));
    env
}

/// The fixture registry with the Star printers on `cloudprnt-http` and `cloudprnt-mqtt`
/// (their MACs) and the Epson one on `epson-sdp`.
fn registry(to: &Path) {
    let text = std::fs::read_to_string(pixgate_tests::demo::default_fixtures().join("devices.jsonl")).unwrap();
    let mut found = 0;
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            let mut rec: Value = serde_json::from_str(l).unwrap();
            let key = rec["key"].as_str().unwrap_or_default().to_string();
            let p = &mut rec["value"]["fullDocument"]["printer"];
            if key == STAR {
                p["transport"] = "cloudprnt-http".into();
                p["mac"] = STAR_MAC.to_ascii_uppercase().into();
                found += 1;
            } else if key == EPSON {
                p["transport"] = "epson-sdp".into();
                found += 1;
            } else if key == STAR_MQTT {
                p["transport"] = "cloudprnt-mqtt".into();
                p["mac"] = STAR_MQTT_MAC.to_ascii_uppercase().into();
                found += 1;
            }
            rec.to_string()
        })
        .collect();
    assert_eq!(found, 3, "the printers are fixture device records");
    std::fs::write(to, lines.join("\n") + "\n").unwrap();
}

/// A paid charge per id on `terminal` (its receipt goes to the terminal's printer).
fn paid(terminal: &str, ids: &[String]) -> Vec<CaptureRecord> {
    let fixtures = pixgate_tests::demo::default_fixtures();
    let template = pixgate_tests::charges::template(&fixtures);
    let t = chrono::Utc::now().timestamp() as u64;
    ids.iter().map(|id| pixgate_tests::charges::charge_record(&template, terminal, id, "COMPLETED", 1, 60, t)).collect()
}

/// A paid charge per id for company [`STAR_MQTT_COMPANY`], naming no terminal: its receipt
/// goes to the company's default printer.
fn paid_without_terminal(ids: &[String]) -> Vec<CaptureRecord> {
    paid(STAR_TERMINAL, ids)
        .into_iter()
        .map(|mut rec| {
            let mut value: Value = serde_json::from_slice(&rec.value).unwrap();
            value["fullDocument"]["company"] = serde_json::json!({ "$oid": STAR_MQTT_COMPANY });
            value["fullDocument"].as_object_mut().unwrap().remove("terminal");
            rec.value = value.to_string().into_bytes();
            rec
        })
        .collect()
}

/// `printer`'s queued jobs on `gw`, in seq order: (message id, kind, held).
fn queued(gw: &GatewayProcess, printer: &str) -> (Vec<(String, String)>, Option<String>) {
    let (status, body) = gw.get(&format!("/outbox/{printer}")).unwrap();
    assert_eq!(status, 200, "{body}");
    let listed: Value = serde_json::from_str(&body).unwrap();
    let mut jobs: Vec<(u64, String, String)> = listed["jobs"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|j| {
                    let text = |k: &str| j[k].as_str().unwrap().to_string();
                    (j["seq"].as_u64().unwrap(), text("message_id"), text("kind"))
                })
                .collect()
        })
        .unwrap_or_default();
    jobs.sort();
    let held = listed["held"].as_str().map(str::to_string);
    (jobs.into_iter().map(|(_, m, k)| (m, k)).collect(), held)
}

/// Waits until `gw` holds `n` receipts for `printer`, held because it is out of paper;
/// returns their message ids in queue order.
async fn held_receipts(gw: &GatewayProcess, printer: &str, n: usize) -> Vec<String> {
    let what = format!("{n} receipts for {printer} held as paper_out on {}", gw.log().display());
    wait_for(&what, WAIT, || {
        let (jobs, held) = queued(gw, printer);
        jobs.len() == n && held.as_deref() == Some("paper_out")
    })
    .await;
    let (jobs, _) = queued(gw, printer);
    assert!(jobs.iter().all(|(_, k)| k == "print_receipt"), "{jobs:?}");
    jobs.into_iter().map(|(m, _)| m).collect()
}

/// `args` as string slices, as a simulator takes them.
fn as_strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// `device-jobs` partitions `gw` holds.
fn assigned(gw: &GatewayProcess) -> u64 {
    gw.stats().ok().and_then(|s| s.topics.get(DEVICE_JOBS.0).map(|t| t.assigned_partitions)).unwrap_or(0)
}

fn forwards(gw: &GatewayProcess, outcome: &str) -> u64 {
    gw.stats().unwrap().counters.cloudprnt_forwards.get(outcome).copied().unwrap_or(0)
}

/// The replica (0 or 1) whose record the broker keeps for `partition`, read as a new
/// subscriber gets it (retained), with pixgate's certificate.
async fn owner_of(mosquitto: &DevicesBroker, partition: i32, urls: &[String; 2]) -> usize {
    let topic = format!("pixgate/v1/partitions/{partition}/owner");
    let id = format!("test-owner-{partition}");
    let mut sub =
        Subscriber::start_as(mosquitto.gateway_port(), &mosquitto.gateway_client_auth(), &id, &topic, 1, false, WAIT)
            .await
            .unwrap();
    let record = sub.next_message(WAIT).await.unwrap().expect("a retained owner record");
    sub.stop().await;
    let record: Value = serde_json::from_str(&record).unwrap();
    let url = record["cloudprnt"].as_str().unwrap();
    urls.iter().position(|u| u == url).unwrap_or_else(|| panic!("{record} names neither replica"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printers_polling_any_replica_are_served_by_their_queues_owner_through_a_hand_over() {
    mosquitto::require_clients().unwrap();
    assert_ne!(
        java_partition(STAR.as_bytes(), DEVICE_JOBS.1),
        java_partition(EPSON.as_bytes(), DEVICE_JOBS.1),
        "the printers' queues are on different partitions"
    );
    let scratch = std::env::temp_dir().join(format!("pixgate-cluster-cloudprnt-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    let mut mosquitto =
        DevicesBroker::prepare_with_printers(&scratch.join("mosquitto"), &[], &[(STAR_MQTT, STAR_MQTT_MAC)]);
    let credentials = scratch.join("credentials.json");
    let bin = pixgate_tests::gateway::find_binary().unwrap();
    let passwd = mosquitto.printers_password_file().display().to_string();
    let mut secrets: Vec<PathBuf> = Vec::new();
    // The HTTP Star printer gets a broker password too: a stranger on the printers' listener.
    for (printer, extra) in [
        (STAR, vec!["--mosquitto-passwd", &passwd]),
        (EPSON, vec!["--digest"]),
        (STAR_MQTT, vec!["--mosquitto-passwd", &passwd]),
    ] {
        let mut issue = vec!["devices", "credentials", "issue", printer];
        issue.extend(extra);
        let env = [("PIXGATE_MQTT__CREDENTIALS", credentials.to_str().unwrap())];
        let (ok, secret, err) = pixgate_tests::gateway::cli(&bin, 0, &issue, &env);
        assert!(ok, "pixgate {issue:?}: {err}");
        let file = scratch.join(format!("{printer}.secret"));
        std::fs::write(&file, secret.trim()).unwrap();
        secrets.push(file);
    }
    let listens = [format!("127.0.0.1:{}", free_port()), format!("127.0.0.1:{}", free_port())];
    let urls = [format!("https://{}", listens[0]), format!("https://{}", listens[1])];
    let (tls, ca_path, printers_port) =
        (mosquitto.server_cert_and_key(), mosquitto.ca_cert(), mosquitto.printers_port().unwrap());
    let cloud = |r: usize| cloud_env(&listens[r], &tls, &ca_path, &credentials, printers_port);

    let broker = mosquitto.start().await;
    let mut rig = Rig::builder("cluster-cloudprnt")
        .topics(&central_topics(DEVICE_JOBS))
        .envs(replica_env(&mosquitto, 0))
        .envs(cloud(0))
        .start()
        .await;
    let file = rig.dir().join("devices.jsonl");
    registry(&file);
    rig.publish_registry_file(&file).await;
    let settings = GatewaySettings {
        http_port: free_port(),
        mqtt_port: free_port(),
        outbox_path: rig.dir().join("data-r1/outbox.redb"),
        ..rig.settings().clone()
    };
    let env: Vec<(&str, String)> = replica_env(&mosquitto, 1).into_iter().chain(cloud(1)).collect();
    let dir = rig.dir().to_path_buf();
    let start_r1 = |n: usize| {
        let (bin, settings, env) = (bin.clone(), settings.clone(), env.clone());
        let log = dir.join(format!("pixgate-r1-{n}.log"));
        tokio::task::spawn_blocking(move || {
            GatewayProcess::spawn_with_env(&bin, settings, &env, &log, Duration::from_secs(60)).unwrap()
        })
    };
    let r1 = start_r1(0).await.unwrap();
    wait_for("each replica to hold one device-jobs partition", WAIT, || {
        assigned(rig.gateway()) == 1 && assigned(&r1) == 1
    })
    .await;
    // r0 owned both partitions until r1 joined: the record of the one that moved changes
    // once r1's connection of it is up.
    let until = std::time::Instant::now() + WAIT;
    let (star_owner, epson_owner) = loop {
        let star_owner = owner_of(&mosquitto, java_partition(STAR.as_bytes(), DEVICE_JOBS.1), &urls).await;
        let epson_owner = owner_of(&mosquitto, java_partition(EPSON.as_bytes(), DEVICE_JOBS.1), &urls).await;
        if star_owner != epson_owner {
            break (star_owner, epson_owner);
        }
        assert!(std::time::Instant::now() < until, "the owner records never named both replicas");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let settled = std::time::Instant::now();
    let mut r1 = Some(r1);
    let replicas = |r: usize| if r == 0 { rig.gateway() } else { r1.as_ref().unwrap() };
    println!("cluster cloudprnt: r{star_owner} holds the Star printer's queue, r{epson_owner} the Epson's");

    // Each printer reaches the replica that does not hold its queue, out of paper.
    let (star_out, epson_out, mqtt_out) =
        (rig.dir().join("star"), rig.dir().join("epson"), rig.dir().join("star-mqtt"));
    for out in [&star_out, &epson_out, &mqtt_out] {
        std::fs::create_dir_all(out).unwrap();
        std::fs::write(out.join("state"), "paper-out").unwrap();
    }
    let ca = ca_path.display().to_string();
    let star_url = format!("{}/cloudprnt", urls[1 - star_owner]);
    let star_args = |secret: &Path| {
        let secret = secret.display().to_string();
        let args = ["--url", &star_url, "--mac", STAR_MAC, "--user", STAR, "--password-file", &secret];
        let rest = ["--ca", &ca, "--poll-ms", "300", "--paper", "58"];
        args.iter().chain(rest.iter()).map(|s| s.to_string()).collect::<Vec<String>>()
    };
    let star_argv = star_args(&secrets[0]);
    let star = CloudSim::start(&star_out, &as_strs(&star_argv));
    star.line("polling");
    let epson_url = format!("{}/sdp", urls[1 - epson_owner]);
    let epson_secret = secrets[1].display().to_string();
    let epson_args = [
        "--url",
        &epson_url,
        "--id",
        EPSON,
        "--user",
        EPSON,
        "--password-file",
        &epson_secret,
        "--ca",
        &ca,
        "--poll-ms",
        "300",
        "--status-ms",
        "300",
        "--paper",
        "80",
    ];
    let epson = CloudSim::start_sdp(&epson_out, &epson_args);
    let mqtt_secret = secrets[2].display().to_string();
    let mqtt_args =
        ["--url", &star_url, "--mac", STAR_MQTT_MAC, "--user", STAR_MQTT, "--password-file", &mqtt_secret, "--ca", &ca];
    let star_mqtt = CloudSim::start(&mqtt_out, &[&mqtt_args[..], &["--poll-ms", "300", "--paper", "80"]].concat());

    // On the broker's printers' listener: a wrong password connects nowhere, and another
    // printer's password gets none of this printer's messages (mosquitto grants the
    // SUBSCRIBE and delivers nothing the ACL does not give).
    use pixgate_tests::mosquitto::ClientAuth;
    let to_mqtt_printer = format!("star/cloudprnt/to-device/{STAR_MQTT_MAC}/#");
    let wrong_password = ClientAuth::password(&ca_path, STAR_MQTT, "not-the-secret");
    let refused =
        Subscriber::start_granted(printers_port, &wrong_password, "x", &[&to_mqtt_printer], 1, false, WAIT).await;
    assert!(refused.is_err(), "a wrong password subscribes to nothing");
    let star_secret = std::fs::read_to_string(&secrets[0]).unwrap();
    let other_printer = ClientAuth::password(&ca_path, STAR, star_secret.trim());
    let (mut spy, _) =
        Subscriber::start_granted(printers_port, &other_printer, "spy", &[&to_mqtt_printer], 1, false, WAIT)
            .await
            .unwrap();

    // A wrong password through the replica that does not hold the queue: the owner refuses
    // it and counts it.
    let wrong = scratch.join("wrong.secret");
    std::fs::write(&wrong, "not-the-secret").unwrap();
    let stranger_argv = star_args(&wrong);
    let stranger = CloudSim::start(&rig.dir().join("stranger"), &as_strs(&stranger_argv));
    assert_eq!(stranger.line("refused"), "401");
    let refused = replicas(star_owner).stats().unwrap().counters.cloudprnt_refusals;
    assert!(refused.get("bad_credentials").copied().unwrap_or(0) >= 1, "counted by the owner: {refused:?}");
    drop(stranger);
    // A request a replica has passed on already is not passed on again: a replica that
    // does not hold the queue answers it 503, to be asked again.
    let pem = std::fs::read(&ca_path).unwrap();
    let client =
        reqwest::Client::builder().add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap()).build().unwrap();
    let secret = std::fs::read_to_string(&secrets[0]).unwrap();
    let poll =
        serde_json::json!({"printerMAC": STAR_MAC, "statusCode": "200%20OK", "status": "23 86 00 00 00 00 00 00 00"});
    let resp = client
        .post(&star_url)
        .basic_auth(STAR, Some(secret.trim()))
        .header("x-pixgate-forwarded-by", "a-replica")
        .json(&poll)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.headers()["retry-after"], "5");
    assert_eq!(forwards(replicas(1 - star_owner), "not_owner"), 1);

    let ids = |c: char, n: usize| (0..n).map(|i| format!("{c}{i}").repeat(12)).collect::<Vec<String>>();
    let mut records = paid(STAR_TERMINAL, &ids('a', 3));
    records.extend(paid(EPSON_TERMINAL, &ids('b', 3)));
    records.extend(paid_without_terminal(&ids('f', 3)));
    simulators::capture::publish_records(&rig.producer(), &records).await.unwrap();
    let star_jobs = held_receipts(replicas(star_owner), STAR, 3).await;
    let epson_jobs = held_receipts(replicas(epson_owner), EPSON, 3).await;
    // Its condition travelled through mosquitto (`client-status`).
    let mqtt_jobs = held_receipts(replicas(star_owner), STAR_MQTT, 3).await;
    for (printer, owner) in [(STAR, star_owner), (EPSON, epson_owner), (STAR_MQTT, star_owner)] {
        let (elsewhere, _) = queued(replicas(1 - owner), printer);
        assert!(elsewhere.is_empty(), "{printer}'s jobs queued on the replica that does not own it: {elsewhere:?}");
    }

    // Paper back: every receipt once, in queue order.
    star.set_state("ready");
    epson.set_state("ready");
    star_mqtt.set_state("ready");
    star.wait_printed(3);
    star_mqtt.wait_printed(3);
    let epson_lines = epson.wait_printed(3);
    // Its first nonce was the other replica's: the owner renewed it (`stale=true`).
    assert!(!epson_lines.iter().any(|l| l.starts_with("refused")), "{epson_lines:?}");
    let tokens = |sim: &CloudSim| sim.printed().into_iter().map(|(_, t)| t).collect::<Vec<String>>();
    assert_eq!(tokens(&star), star_jobs, "the Star printer: each receipt once, in order");
    // An Epson printer's job id is the message id's first 30 characters.
    let short: Vec<String> = epson_jobs.iter().map(|m| m[..30].to_string()).collect();
    assert_eq!(tokens(&epson), short, "the Epson printer: each receipt once, in order");
    assert_eq!(tokens(&star_mqtt), mqtt_jobs, "the Star printer on MQTT: each receipt once, in order");
    let connected = format!("as {STAR_MQTT} (");
    assert!(
        broker.log_text().lines().any(|l| l.contains("New client connected") && l.contains(&connected)),
        "the MQTT printer logged in to mosquitto, its client id its user name: {}",
        broker.log_text()
    );
    for (printer, owner) in [(STAR, star_owner), (EPSON, epson_owner), (STAR_MQTT, star_owner)] {
        wait_for(&format!("{printer}'s queue to empty"), WAIT, || queued(replicas(owner), printer).0.is_empty()).await;
        assert!(forwards(replicas(1 - owner), "forwarded") > 0, "{printer}'s requests were passed on");
    }
    for r in [0, 1] {
        let c = replicas(r).stats().unwrap().counters;
        assert_eq!(c.deadletters_parked + c.deadletters_published, 0, "r{r}: nothing dead-lettered");
    }
    assert_eq!(spy.next_message(Duration::from_secs(1)).await.unwrap(), None, "another printer read nothing");
    // Each replica's own owner records came back from the broker: ready, once each has
    // held its partition past the 10 s it is given.
    tokio::time::sleep((settled + Duration::from_secs(16)).saturating_duration_since(std::time::Instant::now())).await;
    for r in [0, 1] {
        wait_for(&format!("r{r} ready"), WAIT, || replicas(r).stats().is_ok_and(|s| s.not_ready.is_empty())).await;
    }
    spy.stop().await;
    drop(epson);

    // The Star printers' queue owner leaves while more receipts are held on it; the
    // replica they reach takes the partition, restores the queues and prints them.
    assert_eq!(java_partition(STAR.as_bytes(), DEVICE_JOBS.1), java_partition(STAR_MQTT.as_bytes(), DEVICE_JOBS.1));
    star.set_state("paper-out");
    star_mqtt.set_state("paper-out");
    let mut records = paid(STAR_TERMINAL, &ids('c', 3));
    records.extend(paid_without_terminal(&ids('g', 2)));
    simulators::capture::publish_records(&rig.producer(), &records).await.unwrap();
    let star_more = held_receipts(replicas(star_owner), STAR, 3).await;
    let mqtt_more = held_receipts(replicas(star_owner), STAR_MQTT, 2).await;
    let stopped = if star_owner == 0 {
        rig.stop_gateway(Duration::from_secs(30))
    } else {
        r1.take().unwrap().stop(Duration::from_secs(30))
    };
    assert!(stopped, "the owner stopped on SIGTERM");
    let gw = if star_owner == 1 { rig.gateway() } else { r1.as_ref().unwrap() };
    wait_for("the survivor to hold both partitions", WAIT, || assigned(gw) == 2).await;
    assert_eq!(held_receipts(gw, STAR, 3).await, star_more, "the queue restored from the delivery log, in order");
    assert_eq!(held_receipts(gw, STAR_MQTT, 2).await, mqtt_more, "the MQTT printer's too");
    star.set_state("ready");
    star_mqtt.set_state("ready");
    star.wait_printed(6);
    star_mqtt.wait_printed(5);
    let printed = tokens(&star);
    assert_eq!(printed[3..], star_more[..], "each once, in order, after the hand-over: {printed:?}");
    let printed = tokens(&star_mqtt);
    assert_eq!(printed[3..], mqtt_more[..], "each once, in order, after the hand-over: {printed:?}");
    println!("cluster cloudprnt: the survivor's forwards {:?}", gw.stats().unwrap().counters.cloudprnt_forwards);

    // The survivor restarted: a replica that has heard nothing of the MQTT printer since its
    // start still reaches it (the printer is asked its settings again, and answers).
    if star_owner == 1 {
        assert!(rig.stop_gateway(Duration::from_secs(30)), "stopped on SIGTERM");
        rig.start_gateway();
    } else {
        assert!(r1.take().unwrap().stop(Duration::from_secs(30)), "stopped on SIGTERM");
        r1 = Some(start_r1(1).await.unwrap());
    }
    let gw = if star_owner == 1 { rig.gateway() } else { r1.as_ref().unwrap() };
    wait_for("the restarted replica to hold both partitions", WAIT, || assigned(gw) == 2).await;
    let mut records = paid(STAR_TERMINAL, &ids('h', 1));
    records.extend(paid_without_terminal(&ids('i', 1)));
    simulators::capture::publish_records(&rig.producer(), &records).await.unwrap();
    star.wait_printed(7);
    star_mqtt.wait_printed(6);
    for (sim, n) in [(&star, 7), (&star_mqtt, 6)] {
        let all = tokens(sim);
        assert_eq!(all.iter().collect::<std::collections::HashSet<_>>().len(), n, "each once: {all:?}");
    }
    println!("cluster cloudprnt: 16 receipts printed once and in order");
    drop((star, star_mqtt));
    drop(r1);
    if star_owner == 1 {
        rig.kill_gateway();
    }
    broker.stop().await;
    rig.shutdown();
    mosquitto.remove();
    let _ = std::fs::remove_dir_all(&scratch);
}
