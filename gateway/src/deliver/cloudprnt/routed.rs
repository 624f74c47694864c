//! The transport seam for CloudPRNT printers: a job for a printer that fetches its jobs
//! from pixgate is offered on the [`Board`] for its next poll or GET, and a printer on the
//! MQTT method is told of it by a `print-job` message sent through the next transport
//! (pixgate's MQTT listener, or an external broker's); every other device's job goes to
//! the next transport.

use super::board::Board;
use crate::deliver::transport::{Transport, TransportError};
use bytes::Bytes;
use std::sync::Arc;

/// CloudPRNT printers first, `T` for the rest.
pub struct CloudRouted<T> {
    board: Arc<Board>,
    other: T,
    /// Whether printers on the MQTT method are served (and so told of their jobs).
    mqtt_method: bool,
}

impl<T: Transport> CloudRouted<T> {
    /// Offers the jobs of the printers `board` serves, sends the rest through `other`;
    /// with `mqtt_method`, also tells printers on CloudPRNT's MQTT method of each job
    /// through `other` (without, they are told to poll, and only offered).
    pub fn new(board: Arc<Board>, other: T, mqtt_method: bool) -> CloudRouted<T> {
        CloudRouted { board, other, mqtt_method }
    }
}

impl<T: Transport> Transport for CloudRouted<T> {
    async fn send(&self, device: &str, wire: Bytes) -> Result<(), TransportError> {
        if self.board.serves(device) {
            let offered = self.board.offer(device, wire);
            let told = offered.filter(|_| self.mqtt_method).and_then(|id| self.board.print_job(device, &id));
            if let Some(message) = told {
                return self.other.send(device, message).await;
            }
            return Ok(());
        }
        self.other.send(device, wire).await
    }

    fn withdraw(&self, device: &str, message_id: &str) {
        if self.board.serves(device) {
            self.board.withdraw(device, message_id);
        } else {
            self.other.withdraw(device, message_id);
        }
    }
}
