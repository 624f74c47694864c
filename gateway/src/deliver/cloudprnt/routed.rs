//! The transport seam for CloudPRNT printers: a job for a printer that polls pixgate is
//! offered on the [`Board`] for its next poll; every other device's goes to the next
//! transport.

use super::board::Board;
use crate::deliver::transport::{Transport, TransportError};
use bytes::Bytes;
use std::sync::Arc;

/// CloudPRNT printers first, `T` for the rest.
pub struct CloudRouted<T> {
    board: Arc<Board>,
    other: T,
}

impl<T: Transport> CloudRouted<T> {
    /// Offers the jobs of the printers `board` serves, sends the rest through `other`.
    pub fn new(board: Arc<Board>, other: T) -> CloudRouted<T> {
        CloudRouted { board, other }
    }
}

impl<T: Transport> Transport for CloudRouted<T> {
    async fn send(&self, device: &str, wire: Bytes) -> Result<(), TransportError> {
        if self.board.serves(device) {
            self.board.offer(device, wire);
            return Ok(());
        }
        self.other.send(device, wire).await
    }
}
