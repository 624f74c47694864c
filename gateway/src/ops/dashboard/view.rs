//! One update of the dashboard: the `/stats` report, the fleet (each device's connection,
//! printer status, queue depth and last jobs), every assigned partition with its lag and
//! read rate, and the newest dead letters. Built from what the stages report; nothing here
//! does I/O ([`super::feed`] gathers the inputs).

use crate::model::DirectPrinters;
use crate::ops::report::StatsReport;
use crate::store::ParkedDeadLetter;
use crate::telemetry::health::PartitionView;
use crate::telemetry::recent::RecentJob;
use cdc::{Device, DeviceKind};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// What one server-sent `view` event carries, as JSON.
#[derive(Debug, Clone, Serialize)]
pub struct View {
    /// When it was built, RFC 3339 on the gateway's clock.
    pub at: String,
    /// The `/stats` report (counters, topics, readiness reasons, effect flags,
    /// reconciliation windows).
    pub stats: StatsReport,
    /// Totals over the whole registry.
    pub fleet: FleetTotals,
    /// At most `dashboard.devices_shown` devices, those that need a look first.
    pub devices: Vec<DeviceRow>,
    /// Every partition this consumer holds, by topic then partition.
    pub partitions: Vec<PartitionRow>,
    /// The newest dead letters, newest first.
    pub deadletters: Vec<DeadLetterRow>,
}

/// The fleet's totals.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FleetTotals {
    /// Devices in the registry.
    pub devices: usize,
    /// Of those, printers.
    pub printers: usize,
    /// Of those, card machines.
    pub terminals: usize,
    /// Devices reaching pixgate over MQTT with a connection now.
    pub connected: usize,
    /// Devices whose queue is held, by why (`offline`, `paper_out`, `cover_open`).
    pub held: BTreeMap<String, usize>,
    /// Devices with jobs queued.
    pub with_queue: usize,
    /// Jobs queued in all.
    pub queued: u64,
    /// Devices listed in [`View::devices`].
    pub shown: usize,
}

/// One device as the dashboard lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceRow {
    /// Device id.
    pub id: String,
    /// `printer` or `terminal`.
    pub kind: &'static str,
    /// The registry's `model`.
    pub model: String,
    /// The registry's `company`.
    pub company: String,
    /// The registry's `enabled`.
    pub enabled: bool,
    /// How pixgate reaches it now (a local printers-file entry over the registry's):
    /// `mqtt`, a direct printer's endpoint scheme (`tcp`, `serial`, `usb`), or a cloud
    /// printer's method (`cloudprnt-http`, `cloudprnt-mqtt`, `epson-sdp`).
    pub transport: &'static str,
    /// Paper width, mm (printers).
    pub paper_mm: Option<u8>,
    /// Screen size, px (card machines).
    pub screen: Option<(u32, u32)>,
    /// MQTT connections now; `None` for a direct printer (pixgate connects to it) or a
    /// cloud printer whose sessions the presence does not show (one that polls, or one
    /// on CloudPRNT's MQTT method through an external broker): see `held`, its queue held
    /// `offline` while it is away.
    pub connections: Option<usize>,
    /// Of those, subscribed to the jobs topic.
    pub subscribed: Option<usize>,
    /// Why its queue is held (`offline`, `paper_out`, `cover_open`), `None` when it can
    /// take jobs.
    pub held: Option<&'static str>,
    /// Jobs queued in the outbox (the first may be in flight).
    pub queued: u64,
    /// Its last jobs, newest first.
    pub recent: Vec<RecentJob>,
}

/// One partition with its read rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartitionRow {
    /// Offsets, lag and pause ([`PartitionView`]).
    #[serde(flatten)]
    pub offsets: PartitionView,
    /// Records the position moved per second since the previous update.
    pub rate_per_s: f64,
}

/// One dead letter as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetterRow {
    /// Outbox id (what `POST /deadletters/{id}/replay` takes).
    pub id: u64,
    /// `parked`, `published` or `replayed`.
    pub state: &'static str,
    /// The reason, as on the dead-letter topic.
    pub reason: String,
    /// The reason's details.
    pub detail: String,
    /// The device, for an effect's dead letter.
    pub device: Option<String>,
    /// The effect kind, for an effect's dead letter.
    pub effect: Option<String>,
    /// `topic/partition@offset` of the record.
    pub source: String,
    /// Whether a replay can do something now.
    pub replayable: bool,
    /// When it was parked, ms since the Unix epoch.
    pub parked_at_ms: u64,
}

impl DeadLetterRow {
    /// The row of a kept dead letter.
    pub fn of(p: &ParkedDeadLetter) -> DeadLetterRow {
        let d = &p.dead_letter;
        DeadLetterRow {
            id: p.id,
            state: match (p.replayed_at_ms, p.published_at_ms) {
                (Some(_), _) => "replayed",
                (None, Some(_)) => "published",
                (None, None) => "parked",
            },
            reason: d.reason.to_string(),
            detail: d.detail.clone(),
            device: d.device.clone(),
            effect: d.effect.clone(),
            source: format!("{}/{}@{}", d.source_topic, d.source_partition, d.source_offset),
            replayable: (p.job.is_some() || d.reason.routes_again()) && p.replayed_at_ms.is_none(),
            parked_at_ms: p.parked_at_ms,
        }
    }
}

/// What the fleet part of a view is made from.
pub struct FleetInputs<'a> {
    /// The registry's devices.
    pub roster: &'a [Device],
    /// How each is reached now: direct and cloud printers, the local printers file's
    /// entries included.
    pub printers: &'a DirectPrinters,
    /// MQTT device id → (connections, subscribed ones) ([`crate::telemetry::Presence::online`]).
    pub online: &'a HashMap<String, (usize, usize)>,
    /// Device → why its queue is held ([`crate::telemetry::Stats::held_all`]).
    pub held: &'a BTreeMap<String, &'static str>,
    /// Device → jobs queued ([`crate::store::Outbox::queue_depths`]).
    pub queued: &'a BTreeMap<String, u64>,
    /// A device's last jobs, newest first ([`crate::telemetry::recent::Recent::of_device`]).
    pub recent: &'a dyn Fn(&str) -> Vec<RecentJob>,
    /// Devices listed at most.
    pub shown: usize,
}

/// The fleet's totals and the devices to list: held first, then away (MQTT devices without
/// a connection), then those with a queue, then the rest; within each, the most recently
/// active first, then by id.
pub fn fleet(i: &FleetInputs<'_>) -> (FleetTotals, Vec<DeviceRow>) {
    let mut totals = FleetTotals { devices: i.roster.len(), ..FleetTotals::default() };
    let mut rows: Vec<(u8, i64, DeviceRow)> = Vec::with_capacity(i.roster.len());
    for d in i.roster {
        let (kind, paper_mm, screen) = match &d.kind {
            DeviceKind::Printer { paper_width_mm, .. } => {
                totals.printers += 1;
                ("printer", Some(*paper_width_mm), None)
            }
            DeviceKind::Terminal { width_px, height_px, .. } => {
                totals.terminals += 1;
                ("terminal", None, Some((*width_px, *height_px)))
            }
        };
        let transport = i.printers.transport(&d.id);
        let (connections, subscribed) = match (transport, i.online.get(&d.id)) {
            ("mqtt" | "cloudprnt-mqtt", Some(&(c, s))) => (Some(c), Some(s)),
            ("mqtt", None) => (Some(0), Some(0)),
            _ => (None, None),
        };
        if connections.is_some_and(|c| c > 0) {
            totals.connected += 1;
        }
        let held = i.held.get(&d.id).copied();
        if let Some(why) = held {
            *totals.held.entry(why.to_string()).or_default() += 1;
        }
        let queued = i.queued.get(&d.id).copied().unwrap_or(0);
        if queued > 0 {
            totals.with_queue += 1;
            totals.queued += queued;
        }
        let recent = (i.recent)(&d.id);
        let last = recent.iter().map(|j| j.at_ms).max().unwrap_or(i64::MIN);
        let rank = if held.is_some() {
            0
        } else if connections == Some(0) {
            1
        } else if queued > 0 {
            2
        } else {
            3
        };
        let row = DeviceRow {
            id: d.id.clone(),
            kind,
            model: d.model.clone(),
            company: d.company.clone(),
            enabled: d.enabled,
            transport,
            paper_mm,
            screen,
            connections,
            subscribed,
            held,
            queued,
            recent,
        };
        rows.push((rank, last, row));
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then_with(|| a.2.id.cmp(&b.2.id)));
    rows.truncate(i.shown);
    totals.shown = rows.len();
    (totals, rows.into_iter().map(|(_, _, r)| r).collect())
}

/// Read rates per partition: the position's move since `before` (position, at ms) over the
/// time between, records/s; 0 for a partition seen for the first time.
pub fn partition_rows(
    parts: Vec<PartitionView>,
    before: &HashMap<(String, i32), (i64, u64)>,
    now_ms: u64,
) -> Vec<PartitionRow> {
    parts
        .into_iter()
        .map(|p| {
            let rate_per_s = match (p.position, before.get(&(p.topic.clone(), p.partition))) {
                (Some(pos), Some(&(was, at))) if now_ms > at && pos >= was => {
                    (pos - was) as f64 * 1000.0 / (now_ms - at) as f64
                }
                _ => 0.0,
            };
            PartitionRow { offsets: p, rate_per_s }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::endpoint::Endpoint;
    use crate::model::{CloudSettings, DirectSettings};
    use crate::telemetry::recent::RecentState;
    use device_protocol::EffectKind;

    fn devices() -> Vec<Device> {
        let doc = |id: &str, kind: &str| {
            let sub = if kind == "printer" {
                r#""printer":{"paperWidthMm":80,"codePage":"CP860"}"#
            } else {
                r#""screen":{"widthPx":720,"heightPx":1280}"#
            };
            let text = format!(r#"{{"_id":"{id}","company":"co","kind":"{kind}","model":"M",{sub}}}"#);
            cdc::decode_device(&serde_json::from_str(&text).expect("json")).expect("device")
        };
        vec![doc("p-quiet", "printer"), doc("p-paper", "printer"), doc("t-away", "terminal"), doc("t-busy", "terminal")]
    }

    fn job(seq: u64, at_ms: i64) -> RecentJob {
        RecentJob {
            seq,
            message_id: format!("m{seq}"),
            kind: Some(EffectKind::DisplayQr),
            charge_id: "c".into(),
            state: RecentState::Done,
            attempts: 1,
            at_ms,
            kept: true,
        }
    }

    #[test]
    fn devices_that_need_a_look_come_first_and_the_totals_cover_all() {
        let roster = devices();
        let online: HashMap<String, (usize, usize)> =
            [("p-quiet".to_string(), (1, 1)), ("p-paper".to_string(), (1, 1)), ("t-busy".to_string(), (2, 1))].into();
        let held: BTreeMap<String, &'static str> = [("p-paper".to_string(), "paper_out")].into();
        let queued: BTreeMap<String, u64> = [("t-busy".to_string(), 3), ("p-paper".to_string(), 1)].into();
        let recent = |d: &str| if d == "p-quiet" { vec![job(2, 20), job(1, 10)] } else { Vec::new() };
        let printers = DirectPrinters::with_local(HashMap::new());
        let inputs = FleetInputs {
            roster: &roster,
            printers: &printers,
            online: &online,
            held: &held,
            queued: &queued,
            recent: &recent,
            shown: 3,
        };
        let (totals, rows) = fleet(&inputs);
        let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["p-paper", "t-away", "t-busy"], "held, away, queued; the quiet one is cut by `shown`");
        assert_eq!(totals.devices, 4);
        assert_eq!((totals.printers, totals.terminals, totals.connected), (2, 2, 3));
        assert_eq!(totals.held.get("paper_out"), Some(&1));
        assert_eq!((totals.with_queue, totals.queued, totals.shown), (2, 4, 3));
        assert_eq!(rows[1].connections, Some(0));
        assert_eq!(rows[2].screen, Some((720, 1280)));
        assert_eq!((rows[2].connections, rows[2].subscribed), (Some(2), Some(1)));
        let all = FleetInputs { shown: 10, ..inputs };
        let (_, rows) = fleet(&all);
        assert_eq!(rows[3].id, "p-quiet");
        assert_eq!(rows[3].recent.iter().map(|j| j.seq).collect::<Vec<_>>(), [2, 1]);
        assert_eq!(rows[3].paper_mm, Some(80));
    }

    /// Each printer shows how it is reached now. One that pixgate connects to or that
    /// fetches its own jobs has no MQTT connections to count: it is never listed as away,
    /// its `held` says when it is.
    #[test]
    fn direct_and_cloud_printers_show_their_transport_and_are_not_away() {
        let printer = |id: &str, printer: &str| {
            let text = format!(
                r#"{{"_id":"{id}","company":"co","kind":"printer","model":"TSP143IV","printer":{{"paperWidthMm":80,{printer}}}}}"#
            );
            cdc::decode_device(&serde_json::from_str(&text).expect("json")).expect("device")
        };
        let roster = vec![
            printer("cloud-http", r#""transport":"cloudprnt-http","mac":"00:11:62:0a:1b:2c""#),
            printer("cloud-mqtt", r#""transport":"cloudprnt-mqtt","mac":"00:11:62:0a:1b:2d""#),
            printer("epson", r#""transport":"epson-sdp""#),
            printer("serial", r#""transport":"serial","endpoint":"serial:///dev/ttyUSB0?baud=19200""#),
            printer("local", r#""transport":"cloudprnt-http","mac":"00:11:62:0a:1b:2e""#),
            printer("mqtt", r#""transport":"mqtt""#),
        ];
        let local = DirectSettings {
            endpoint: Endpoint::parse("tcp://192.0.2.7:9100").expect("endpoint"),
            interrupted: cdc::Interrupted::Hold,
            code_page: render::codepage::CodePage::Cp860,
        };
        let printers = DirectPrinters::with_local([("local".to_string(), local)].into());
        for d in &roster {
            printers.set(&d.id, DirectSettings::of_device(d).expect("endpoint"));
            printers.set_cloud(&d.id, CloudSettings::of_device(d));
        }
        let online: HashMap<String, (usize, usize)> = [("cloud-mqtt".to_string(), (1, 0))].into();
        let held: BTreeMap<String, &'static str> = [("epson".to_string(), "offline")].into();
        let inputs = FleetInputs {
            roster: &roster,
            printers: &printers,
            online: &online,
            held: &held,
            queued: &BTreeMap::new(),
            recent: &|_: &str| Vec::new(),
            shown: 10,
        };
        let (totals, rows) = fleet(&inputs);
        let shown: Vec<(&str, &str, Option<usize>)> =
            rows.iter().map(|r| (r.id.as_str(), r.transport, r.connections)).collect();
        assert_eq!(
            shown,
            [
                ("epson", "epson-sdp", None),
                ("mqtt", "mqtt", Some(0)),
                ("cloud-http", "cloudprnt-http", None),
                ("cloud-mqtt", "cloudprnt-mqtt", Some(1)),
                ("local", "tcp", None),
                ("serial", "serial", None),
            ],
            "held, then the one MQTT printer away; the local file's entry wins over the registry's"
        );
        assert_eq!(totals.connected, 1);
    }

    #[test]
    fn partition_rates_come_from_the_position_moving() {
        let view = |partition, position| PartitionView {
            topic: "charge.upserted".into(),
            partition,
            position,
            end: Some(100),
            lag: None,
            paused: false,
        };
        let before: HashMap<(String, i32), (i64, u64)> = [(("charge.upserted".to_string(), 0), (10, 1_000))].into();
        let rows = partition_rows(vec![view(0, Some(60)), view(1, Some(5))], &before, 3_000);
        assert!((rows[0].rate_per_s - 25.0).abs() < 1e-9, "50 records in 2 s");
        assert_eq!(rows[1].rate_per_s, 0.0, "first seen");
    }
}
