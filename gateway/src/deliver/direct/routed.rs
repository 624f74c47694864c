//! The transport the gateway runs: jobs for a printer pixgate drives itself go to that
//! printer's task ([`super::printer`], started at its first job), every other device's to
//! the next transport (MQTT).

use super::printer::{self, Shared};
use crate::deliver::transport::{Transport, TransportError};
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::mpsc;

/// Jobs a printer task holds beyond the one it is writing: the dispatcher has one job in
/// flight per device, so these are only its resends.
const PRINTER_QUEUE: usize = 8;

/// Direct printers first, `T` for the rest.
pub struct Routed<T> {
    shared: Shared,
    tasks: Mutex<HashMap<String, mpsc::Sender<Bytes>>>,
    other: T,
}

impl<T: Transport> Routed<T> {
    /// Sends to the direct printers `shared.printers` names, each through a task of its
    /// own, and to every other device through `other`.
    pub fn new(shared: Shared, other: T) -> Routed<T> {
        Routed { shared, tasks: Mutex::default(), other }
    }

    /// Hands `wire` to `device`'s printer task, starting it if needed. Never waits: a full
    /// task queue drops this send (the job it repeats is queued already).
    fn to_printer(&self, device: &str, wire: Bytes) -> Result<(), TransportError> {
        let mut tasks = self.tasks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let tx = match tasks.get(device) {
            Some(tx) if !tx.is_closed() => tx,
            _ => {
                let (tx, rx) = mpsc::channel(PRINTER_QUEUE);
                printer::spawn(device.to_string(), self.shared.clone(), rx)
                    .map_err(|_| TransportError::Closed("direct printer task"))?;
                tasks.entry(device.to_string()).insert_entry(tx).into_mut()
            }
        };
        tx.try_send(wire).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => TransportError::Full(device.to_string()),
            mpsc::error::TrySendError::Closed(_) => TransportError::Closed("direct printer task"),
        })
    }
}

impl<T: Transport> Transport for Routed<T> {
    async fn send(&self, device: &str, wire: Bytes) -> Result<(), TransportError> {
        if self.shared.printers.get(device).is_some() {
            return self.to_printer(device, wire);
        }
        self.other.send(device, wire).await
    }

    /// A direct printer's task checks `expires_at` before it prints; the rest are
    /// `other`'s.
    fn withdraw(&self, device: &str, message_id: &str) {
        if self.shared.printers.get(device).is_none() {
            self.other.withdraw(device, message_id);
        }
    }
}
