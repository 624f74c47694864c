//! A printer reports over MQTT that it is out of paper, then that its cover is open
//! (`{"v":1,"online":true,"printer":"paper_out"}` on its retained status topic, as
//! device-protocol v1 says): pixgate must send it nothing while it says so, hold its jobs
//! (the Kafka partitions keep flowing, every other device keeps getting its effects), and
//! deliver the held jobs in order once it reports `ready`. A second printer reports
//! `paper_near_end`, which still prints: its receipts must keep flowing.
//!
//! Real tansu broker, pixgate as a child process, devices as MQTT clients in-process.

use device_protocol::{EffectKind, PrinterState};
use pixgate_tests::gateway::stats_json;
use pixgate_tests::harness::{verifying_devices, Rig};
use pixgate_tests::scenario::{self, Plan};
use simulators::capture::generate::ScenarioConfig;
use simulators::device::Stats;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paper_out_holds_only_that_printer_and_delivers_in_order_after_ready() {
    let plan = Arc::new(Plan::new(ScenarioConfig::new(4242, 24, 700)));
    // The printers with the most receipts: P goes out of paper, Q near its end.
    let mut receipts: BTreeMap<String, usize> = BTreeMap::new();
    for e in plan.expected().filter(|e| e.kind == EffectKind::PrintReceipt) {
        *receipts.entry(e.device.clone()).or_default() += 1;
    }
    let mut ranked: Vec<(String, usize)> = receipts.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let (p, p_jobs) = ranked[0].clone();
    let (q, q_jobs) = ranked[1].clone();
    let others = plan.expected().filter(|e| e.device != p).count();
    assert!(p_jobs >= 10 && q_jobs >= 5 && others > 200, "scenario too small: {ranked:?}");
    println!("printer hold: {} effects; printer {p} holds {p_jobs} receipts, {q} (paper near end) {q_jobs}; {others} on other devices", plan.expected_count());

    let rig = Rig::builder("printer-hold").start().await;
    let stats = Arc::new(Stats::default());
    let fleet = rig.start_fleet(plan.devices.clone(), verifying_devices(&stats)).await;
    let producer = rig.producer();
    let device_positions = scenario::publish_registry(&producer, &plan, rig.gateway()).await.unwrap();

    // The status change is routed by the broker (the printer sees its own status echoed)
    // before any charge event exists, so every job for P is created while P is out of paper.
    let printer = fleet.device(&p).expect("P simulated");
    printer.set_printer_state(PrinterState::PaperOut).await.unwrap();
    fleet.device(&q).expect("Q simulated").set_printer_state(PrinterState::PaperNearEnd).await.unwrap();

    let deadline = Instant::now() + Duration::from_secs(300);
    let feeder = {
        let (plan, stats) = (plan.clone(), stats.clone());
        tokio::spawn(async move { scenario::feed_keeping_up(&producer, &plan, stats, deadline).await })
    };

    // Every other device gets all its effects while P is held; halfway through, P's cover
    // is opened too (still held).
    let not_p: HashSet<String> = plan.expected().filter(|e| e.device != p).map(|e| e.message_id.clone()).collect();
    let mut cover_opened = false;
    loop {
        let done = stats.effects().iter().filter(|e| not_p.contains(&e.message_id)).count();
        if !cover_opened && done >= not_p.len() / 2 {
            printer.set_printer_state(PrinterState::CoverOpen).await.unwrap();
            cover_opened = true;
        }
        let s = rig.gateway().stats().unwrap();
        // All of P's receipts are in the outbox and nothing else is: the partitions flowed on.
        let held_only = s.counters.queued_jobs == p_jobs as u64
            && s.counters.outbox_jobs == p_jobs as u64
            && s.counters.pending_records == 0;
        if done == not_p.len() && held_only && cover_opened {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "other devices starved: {done} of {} effects; stats {}",
            not_p.len(),
            stats_json(&s)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = printer.counters();
    assert_eq!(held.raw_jobs, 0, "pixgate sent {} job(s) to a printer reporting paper_out/cover_open", held.raw_jobs);
    assert_eq!(held.received_while_held, 0);
    let q_done = stats.effects().iter().filter(|e| e.device == q).count();
    assert_eq!(q_done, q_jobs, "a printer at paper_near_end still prints");
    println!("printer hold: {} effects on other devices, {p_jobs} receipts held for {p} with 0 sent", not_p.len());

    // Paper loaded, cover closed: the held receipts go out, in order.
    printer.set_printer_state(PrinterState::Ready).await.unwrap();
    let positions = feeder.await.unwrap().expect("feeding the charge events");
    let (charge_ends, device_ends) = (scenario::end_offsets(&positions), scenario::end_offsets(&device_positions));
    scenario::wait_all_delivered(rig.gateway(), &plan, &charge_ends, &device_ends, &stats, deadline).await.unwrap();
    let report = fleet.shutdown().await;

    scenario::check_delivery(&plan, &positions, &report.effects).unwrap();
    let p_seqs: Vec<u64> = report.effects.iter().filter(|e| e.device == p).map(|e| e.seq).collect();
    assert_eq!(p_seqs, (1..=p_jobs as u64).collect::<Vec<_>>(), "held receipts in their queue order, none lost");
    println!("printer hold: after ready, {p} printed its {p_jobs} receipts in seq order 1..={p_jobs}; {} raw jobs fleet-wide", report.stats.raw_jobs);
    rig.shutdown();
}
