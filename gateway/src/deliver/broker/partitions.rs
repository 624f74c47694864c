//! The central shape's jobs connections: one per device-jobs partition this replica owns,
//! each with the partition's own client id (`{broker.partition_client_id_prefix}-{p}`, the
//! same on every replica), opened when the partition is taken and closed when it is given
//! up. This is the fence on sends (`docs/cluster.md`, "Fencing"): the broker lets one
//! connection hold a client id, so the new owner's CONNECT closes the old owner's
//! connection ([MQTT-3.1.4-2]) and orders the two owners' sends one after the other. A
//! connection that drops asks the delivery log before it reconnects ([`OwnerCheck`]):
//! when a newer claim of its partition exists it stands down for good, so a replica that
//! was stopped past its session timeout never takes the client id back.

use super::link::{Backoff, Links, Which};
use super::owners::{owner_topic, OwnerRecord};
use super::REQUESTS;
use crate::config::BrokerConfig;
use crate::model::device_partition::partition_of;
use crate::shutdown::Shutdown;
use rumqttc::{AsyncClient, ConnectReturnCode, Event, EventLoop, Packet, QoS};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Asked by a partition connection that dropped, before it reconnects: is this replica's
/// claim on the partition still the last one? (The delivery log answers,
/// [`crate::ingest::delivery_log::DeliveryLog`].)
pub trait OwnerCheck: Send + Sync + 'static {
    /// `Ok(false)`: another replica has claimed `partition` since; an error: unknown yet.
    fn still_owner(self: Arc<Self>, partition: i32) -> Pin<Box<dyn Future<Output = anyhow::Result<bool>> + Send>>;
}

/// One partition's connection.
struct PartitionLink {
    client: AsyncClient,
    /// CONNACK accepted, not failed since.
    up: AtomicBool,
    /// When that CONNACK came.
    up_at: Mutex<Option<Instant>>,
    /// Closed by this replica (given up) or stood down (taken over): sends refused, no
    /// reconnect.
    closed: AtomicBool,
    /// The last error while down.
    error: Mutex<Option<String>>,
    /// Wakes its event loop when closed, to drop the connection at once.
    closing: tokio::sync::Notify,
}

impl PartitionLink {
    /// Up and not closed: the partition is this replica's now.
    fn held(&self) -> bool {
        self.up.load(Ordering::Acquire) && !self.closed.load(Ordering::Acquire)
    }
}

/// The partition connections of one replica.
pub struct PartitionLinks {
    cfg: BrokerConfig,
    tls: Option<Arc<rustls::ClientConfig>>,
    prefix: String,
    partitions: i32,
    links: Arc<Links>,
    shutdown: Shutdown,
    check: Mutex<Option<Arc<dyn OwnerCheck>>>,
    open: Mutex<HashMap<i32, Arc<PartitionLink>>>,
    /// Published, retained, to each partition's owner topic at each CONNACK.
    announce: Mutex<Option<Vec<u8>>>,
}

impl PartitionLinks {
    /// No connection open yet; `partitions` is the device-jobs topic's partition count.
    pub(super) fn new(
        cfg: &BrokerConfig,
        tls: Option<Arc<rustls::ClientConfig>>,
        partitions: i32,
        links: Arc<Links>,
        shutdown: Shutdown,
    ) -> PartitionLinks {
        // Nothing owned yet is nothing down.
        links.up(Which::Jobs);
        PartitionLinks {
            cfg: cfg.clone(),
            tls,
            prefix: cfg.partition_client_id_prefix.clone(),
            partitions,
            links,
            shutdown,
            check: Mutex::default(),
            open: Mutex::default(),
            announce: Mutex::default(),
        }
    }

    /// Who answers the connections' question before they reconnect. Until set, a
    /// connection that drops does not reconnect.
    pub fn set_owner_check(&self, check: Arc<dyn OwnerCheck>) {
        *self.check.lock().unwrap_or_else(PoisonError::into_inner) = Some(check);
    }

    /// Makes each partition connection publish `record`, retained, to its partition's
    /// owner topic at each CONNACK ([`super::owners`]), before any job is sent on it.
    pub fn set_announce(&self, record: &OwnerRecord) {
        let payload = serde_json::to_vec(record).unwrap_or_default();
        *self.announce.lock().unwrap_or_else(PoisonError::into_inner) = Some(payload);
    }

    /// The device-jobs topic's partition count.
    pub fn partitions(&self) -> i32 {
        self.partitions
    }

    /// Whether this replica holds `partition` now: its connection is open, up (CONNACK
    /// accepted, not dropped since) and not closed. The broker closes a connection whose
    /// client id a newer owner has taken, so this is as fenced as the sends are.
    pub fn owns(&self, partition: i32) -> bool {
        self.open.lock().unwrap_or_else(PoisonError::into_inner).get(&partition).is_some_and(|l| l.held())
    }

    /// The partitions held now ([`PartitionLinks::owns`]), each with how long its
    /// connection has been up.
    pub fn held_for(&self) -> Vec<(i32, Duration)> {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.iter()
            .filter(|(_, l)| l.held())
            .filter_map(|(p, l)| Some((*p, (*l.up_at.lock().unwrap_or_else(PoisonError::into_inner))?.elapsed())))
            .collect()
    }

    /// The client id of `partition`'s connection.
    pub fn client_id(&self, partition: i32) -> String {
        format!("{}-{partition}", self.prefix)
    }

    /// Opens `partition`'s connection (its claim has just won); one already open is closed
    /// first.
    pub fn open(self: &Arc<Self>, partition: i32) {
        self.close(partition);
        let options = super::options::mqtt_options(&self.cfg, &self.client_id(partition), true, self.tls.clone());
        let (client, eventloop) = AsyncClient::new(options, REQUESTS);
        let link = Arc::new(PartitionLink {
            client,
            up: AtomicBool::new(false),
            up_at: Mutex::default(),
            closed: AtomicBool::new(false),
            error: Mutex::new(Some("not connected yet".into())),
            closing: tokio::sync::Notify::new(),
        });
        self.open.lock().unwrap_or_else(PoisonError::into_inner).insert(partition, link.clone());
        self.report();
        self.shutdown.spawn(drive(partition, link, eventloop, self.clone()));
    }

    /// Closes `partition`'s connection (given up): sends to its devices are refused at
    /// once, and its event loop drops the TCP connection without sending what is still
    /// queued on it (no DISCONNECT either: a job sent after the revoke is one the new owner
    /// sends again). Never waits: librdkafka's rebalance hook calls it.
    pub fn close(&self, partition: i32) {
        let link = self.open.lock().unwrap_or_else(PoisonError::into_inner).remove(&partition);
        if let Some(link) = link {
            link.closed.store(true, Ordering::Release);
            link.up.store(false, Ordering::Release);
            link.closing.notify_one();
            tracing::info!(partition, client_id = %self.client_id(partition), "partition connection to the devices' broker closed: partition given up");
            self.report();
        }
    }

    /// Waits up to `timeout` for `partition`'s connection to be up; whether it is.
    pub async fn wait_up(&self, partition: i32, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        loop {
            let up = self
                .open
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .get(&partition)
                .is_some_and(|l| l.up.load(Ordering::Acquire));
            if up || Instant::now() >= until {
                return up;
            }
            if self.shutdown.sleep(Duration::from_millis(10)).await {
                return false;
            }
        }
    }

    /// Publishes `payload` to `topic` on the connection of `device`'s partition. `false`:
    /// not sent (no connection for it here, or it is down, or its queue is full).
    pub fn publish(&self, device: &str, topic: String, payload: Vec<u8>) -> bool {
        let p = partition_of(device, self.partitions);
        let link = self.open.lock().unwrap_or_else(PoisonError::into_inner).get(&p).cloned();
        match link {
            Some(l) if l.up.load(Ordering::Acquire) && !l.closed.load(Ordering::Acquire) => {
                l.client.try_publish(topic, QoS::AtLeastOnce, false, payload).is_ok()
            }
            _ => false,
        }
    }

    /// Health hears of the jobs connections as down while any open one is down.
    fn report(&self) {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let down = open.iter().filter(|(_, l)| !l.up.load(Ordering::Acquire)).min_by_key(|(p, _)| **p);
        match down {
            None => self.links.up(Which::Jobs),
            Some((p, l)) => {
                let error = l.error.lock().unwrap_or_else(PoisonError::into_inner).clone().unwrap_or_default();
                self.links.down(Which::Jobs, format!("partition {p} ({}): {error}", self.client_id(*p)));
            }
        }
    }

    /// Forgets `partition`'s connection if it is still `link` (stood down).
    fn remove_if(&self, partition: i32, link: &Arc<PartitionLink>) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.get(&partition).is_some_and(|l| Arc::ptr_eq(l, link)) {
            open.remove(&partition);
        }
    }

    fn owner_check(&self) -> Option<Arc<dyn OwnerCheck>> {
        self.check.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

/// One partition connection's event loop: connects, sends, and after a failure reconnects
/// only while the delivery log says the partition is still this replica's.
async fn drive(partition: i32, link: Arc<PartitionLink>, mut eventloop: EventLoop, links: Arc<PartitionLinks>) {
    let shutdown = links.shutdown.clone();
    let mut backoff = Backoff::default();
    loop {
        if link.closed.load(Ordering::Acquire) {
            return;
        }
        let event = tokio::select! {
            _ = shutdown.requested() => return,
            () = link.closing.notified() => return,
            event = eventloop.poll() => event,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(c))) if c.code == ConnectReturnCode::Success => {
                backoff.reset();
                if link.closed.load(Ordering::Acquire) {
                    continue;
                }
                let announce = links.announce.lock().unwrap_or_else(PoisonError::into_inner).clone();
                if let Some(payload) = announce {
                    // Queued before any job: the owner is known as soon as it can send.
                    if let Err(e) = link.client.try_publish(owner_topic(partition), QoS::AtLeastOnce, true, payload) {
                        tracing::warn!(partition, error = %e, "the partition's owner record was not queued: other replicas cannot pass its printers' requests on until this connection reconnects");
                    }
                }
                *link.up_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
                link.up.store(true, Ordering::Release);
                *link.error.lock().unwrap_or_else(PoisonError::into_inner) = None;
                tracing::info!(partition, client_id = %links.client_id(partition), "partition connection to the devices' broker up");
                links.report();
            }
            Ok(_) => {}
            Err(e) => {
                let was_up = link.up.swap(false, Ordering::AcqRel);
                if link.closed.load(Ordering::Acquire) {
                    return;
                }
                *link.error.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.to_string());
                links.report();
                if was_up {
                    tracing::warn!(partition, client_id = %links.client_id(partition), error = %e, "a partition connection to the devices' broker dropped; asking the delivery log whether the partition is still ours before reconnecting");
                } else {
                    tracing::debug!(partition, error = %e, "a partition connection to the devices' broker failed");
                }
                loop {
                    let answer = match links.owner_check() {
                        Some(check) => check.still_owner(partition).await,
                        None => Err(anyhow::anyhow!("no owner check yet")),
                    };
                    if link.closed.load(Ordering::Acquire) {
                        return;
                    }
                    match answer {
                        Ok(true) => break,
                        Ok(false) => {
                            link.closed.store(true, Ordering::Release);
                            links.remove_if(partition, &link);
                            links.report();
                            tracing::warn!(partition, client_id = %links.client_id(partition), "partition connection taken over: another replica has claimed the partition since, so this one stands down and does not reconnect");
                            return;
                        }
                        Err(e) => {
                            let pause = backoff.pause();
                            tracing::warn!(partition, error = %format!("{e:#}"), retry_ms = pause.as_millis() as u64, "cannot tell whether a partition is still ours; not reconnecting its connection yet");
                            if shutdown.sleep(pause).await {
                                return;
                            }
                        }
                    }
                }
                if shutdown.sleep(backoff.pause()).await {
                    return;
                }
            }
        }
    }
}
