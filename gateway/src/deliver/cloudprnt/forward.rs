//! The central shape's CloudPRNT and Server Direct Print requests: any replica takes a
//! printer's request, and the replica holding the printer's queue answers it
//! (`docs/cluster.md`, "CloudPRNT and Server Direct Print printers"), as Eclipse Hono
//! routes a command to the adapter instance holding the device.
//!
//! A printer's queue is where its device-jobs partition is owned (`murmur2` of its device
//! id, [`partition_of`]); only that replica's board has its offer. A request is served here
//! while this replica holds the partition ([`PartitionLinks::owns`]: its connection is up
//! on the devices' broker, which closes it once another replica has taken the partition).
//! Otherwise it is passed on unchanged (method, path, query, `Authorization`,
//! `Content-Type`, `Host`, body) to the owner's CloudPRNT server, named by the owner's record on
//! the broker ([`Owners`]), over TLS checked against `cloudprnt.peer_ca`, and the owner's
//! answer goes back as it is. The owner authenticates the printer itself, with the
//! printer's own credentials: passing a request on grants nothing.
//!
//! A request passed on carries `x-pixgate-forwarded-by`; a replica that gets one for a
//! partition it does not hold (the partition moved meanwhile) answers `503` with
//! `Retry-After` instead of passing it on again, as it does when no owner is known or the
//! owner does not answer: the printer asks again at its next poll. A request that names
//! no user (an Epson printer's first, unauthenticated one) is answered here: it only gets
//! a challenge.

use crate::deliver::broker::{Owners, PartitionLinks};
use crate::deliver::http_auth;
use crate::model::device_partition::partition_of;
use crate::shutdown::Shutdown;
use crate::telemetry::{Monitor, Stats};
use anyhow::Context;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Marks a request passed on by a replica (its name as the value).
pub const FORWARDED_BY: &str = "x-pixgate-forwarded-by";

/// Seconds a printer is told to wait (`Retry-After`) when its queue's owner is not
/// reachable now: about a Star printer's poll interval.
const RETRY_AFTER_S: &str = "5";

/// The headers of a request passed on to the owner, and of its answer passed back. `Host`
/// goes along: the owner builds the job URL it gives a printer on the MQTT method from the
/// host the printer reached.
const REQUEST_HEADERS: [HeaderName; 3] = [header::AUTHORIZATION, header::CONTENT_TYPE, header::HOST];
const ANSWER_HEADERS: [HeaderName; 4] =
    [header::CONTENT_TYPE, header::CACHE_CONTROL, header::WWW_AUTHENTICATE, header::RETRY_AFTER];

/// How long a partition connection may be up before its owner record is expected back
/// from the broker ([`Forward::watch`]).
const RECORD_GRACE: Duration = Duration::from_secs(10);

/// What passing requests on needs.
pub struct Forward {
    links: Arc<PartitionLinks>,
    owners: Arc<Owners>,
    replica: String,
    client: reqwest::Client,
    max_body_bytes: usize,
    stats: Arc<Stats>,
}

impl Forward {
    /// Passes requests for partitions `links` does not hold to their owners in `owners`,
    /// as `replica`, with bodies of at most `max_body_bytes` and `timeout` for the owner's
    /// whole answer; over TLS trusting only `peer_ca` (PEM), or plain HTTP without it.
    ///
    /// # Errors
    /// `peer_ca` does not read or holds no usable certificate; the client cannot be built.
    pub fn new(
        links: Arc<PartitionLinks>,
        owners: Arc<Owners>,
        replica: String,
        peer_ca: Option<&Path>,
        max_body_bytes: usize,
        timeout: Duration,
        stats: Arc<Stats>,
    ) -> anyhow::Result<Forward> {
        let mut builder = reqwest::Client::builder().timeout(timeout).redirect(reqwest::redirect::Policy::none());
        if let Some(ca) = peer_ca {
            let tls = crate::deliver::broker::options::client_builder(ca)?.with_no_client_auth();
            builder = builder.use_preconfigured_tls(tls);
        }
        let client = builder.build().context("the HTTP client to the other replicas")?;
        Ok(Forward { links, owners, replica, client, max_body_bytes, stats })
    }

    /// Every 5 s until `shutdown`: tells `health` which partitions this replica has held
    /// for [`RECORD_GRACE`] without its own owner record coming back from the broker. A
    /// broker whose ACL lacks `pixgate/v1/partitions/+/owner` (mosquitto 2.0 with an ACL
    /// file grants the SUBSCRIBE and drops the PUBLISH) would otherwise fail every request
    /// passed on to this replica with readiness green.
    pub async fn watch(self: Arc<Self>, health: Arc<Monitor>, shutdown: Shutdown) {
        while !shutdown.sleep(Duration::from_secs(5)).await {
            let mut missing: Vec<i32> = self
                .links
                .held_for()
                .into_iter()
                .filter(|(p, up)| *up >= RECORD_GRACE && self.owners.get(*p).is_none_or(|r| r.replica != self.replica))
                .map(|(p, _)| p)
                .collect();
            missing.sort_unstable();
            health.owner_records_missing((!missing.is_empty()).then(|| {
                format!("partitions {missing:?}, published on each partition's connection; the broker's ACL must let pixgate write and read pixgate/v1/partitions/+/owner")
            }));
        }
    }

    /// The partition of `device` when another replica holds it.
    fn elsewhere(&self, device: &str) -> Option<i32> {
        let p = partition_of(device, self.links.partitions());
        (!self.links.owns(p)).then_some(p)
    }

    fn unavailable(&self, outcome: &'static str, device: &str, detail: &str) -> Response {
        self.stats.cloudprnt_forwarded(outcome);
        tracing::debug!(outcome, device, detail, "a printer's request not served: its queue is not held here");
        let mut r =
            (StatusCode::SERVICE_UNAVAILABLE, "the printer's queue is moving between replicas\n").into_response();
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_S));
        r
    }
}

/// The middleware on the CloudPRNT server's routes (see the module docs).
pub async fn route(State(f): State<Arc<Forward>>, req: Request, next: Next) -> Response {
    let Some(device) = http_auth::user(req.headers()) else { return next.run(req).await };
    let Some(partition) = f.elsewhere(&device) else { return next.run(req).await };
    if req.headers().contains_key(FORWARDED_BY) {
        return f.unavailable("not_owner", &device, "passed on by a replica that took this one for the owner");
    }
    let Some(owner) = f.owners.get(partition) else {
        return f.unavailable("no_owner", &device, "no owner record for its partition yet");
    };
    if owner.replica == f.replica {
        return f.unavailable("no_owner", &device, "the owner record names this replica, whose connection is down");
    }
    let (parts, body) = req.into_parts();
    let Ok(body) = axum::body::to_bytes(body, f.max_body_bytes).await else {
        return (StatusCode::PAYLOAD_TOO_LARGE, "request body too large\n").into_response();
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let url = format!("{}{path}", owner.cloudprnt.trim_end_matches('/'));
    let mut request = f.client.request(parts.method.clone(), &url).header(FORWARDED_BY, &f.replica).body(body);
    for name in REQUEST_HEADERS {
        if let Some(v) = parts.headers.get(&name) {
            request = request.header(name, v);
        }
    }
    let answer = match request.send().await {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(device, partition, owner = %owner.replica, url, error = %e, "a printer's request could not be passed on to its queue's owner");
            return f.unavailable("failed", &device, "the owner did not answer");
        }
    };
    let status = answer.status();
    let headers: Vec<(HeaderName, HeaderValue)> =
        ANSWER_HEADERS.iter().filter_map(|n| answer.headers().get(n).map(|v| (n.clone(), v.clone()))).collect();
    let Ok(bytes) = answer.bytes().await else {
        return f.unavailable("failed", &device, "the owner's answer broke off");
    };
    f.stats.cloudprnt_forwarded("forwarded");
    let mut r = Response::new(Body::from(bytes));
    *r.status_mut() = status;
    r.headers_mut().extend(headers);
    r
}

/// Wraps `routes` with [`route`] when `forward` is given.
pub fn layer(routes: axum::Router, forward: Option<Arc<Forward>>) -> axum::Router {
    match forward {
        Some(f) => routes.layer(axum::middleware::from_fn_with_state(f, route)),
        None => routes,
    }
}
