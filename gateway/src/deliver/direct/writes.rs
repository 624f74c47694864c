//! Which direct printers are writing a job now, so that a shutdown lets those writes
//! finish: a job cut short by the process's exit would be printed again after the restart
//! under the reprint header, or, on a printer set to `interruptedJob = hold`, handed to an
//! operator as a dead letter, for nothing more than a routine restart.
//!
//! A printer's task takes a [`Writing`] before it marks a job as being written
//! ([`crate::store::Outbox::mark_direct`]) and holds it until the job is recorded written
//! whole and acknowledged. At shutdown the consumer closes the gate ([`Writes::close`]):
//! no write starts any more, and those under way are waited for ([`Writes::settle`]).

use crate::deliver::settle::{self, PendingJob};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The direct printers' writes under way.
#[derive(Debug, Default)]
pub struct Writes {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    closed: bool,
    /// Device → (seq, message id) of the job it is writing.
    writing: BTreeMap<String, (u64, String)>,
}

impl Writes {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `device` is about to write job `seq` (`message_id`): the write it may start, until
    /// the returned [`Writing`] drops. `None` once closed: the job is not started (it stays
    /// queued for the next start).
    pub fn begin(self: &Arc<Self>, device: &str, seq: u64, message_id: &str) -> Option<Writing> {
        let mut state = self.lock();
        if state.closed {
            return None;
        }
        state.writing.insert(device.to_string(), (seq, message_id.to_string()));
        Some(Writing { writes: self.clone(), device: device.to_string() })
    }

    /// Lets no write start any more (shutdown). Returns the writes under way, for
    /// [`Writes::settle`].
    pub fn close(&self) -> Vec<PendingJob> {
        self.lock().closed = true;
        self.unfinished()
    }

    /// The writes under way, by device.
    pub fn unfinished(&self) -> Vec<PendingJob> {
        let state = self.lock();
        let jobs = state.writing.iter();
        jobs.map(|(device, (seq, id))| PendingJob { device: device.clone(), seq: *seq, message_id: id.clone() })
            .collect()
    }

    /// Waits, until `deadline` at most, for the writes of `waiting` (what
    /// [`Writes::close`] returned) to end: written whole, with the job's ack on the
    /// dispatcher's channel by then, or cut short by the printer (a reprint after the
    /// restart, as without the wait). Returns those still under way.
    pub async fn settle(&self, waiting: Vec<PendingJob>, deadline: tokio::time::Instant) -> Vec<PendingJob> {
        settle::settle(waiting, deadline, |u| self.lock().writing.get(&u.device).is_some_and(|(seq, _)| *seq == u.seq))
            .await
    }
}

/// One printer's write under way: it ends when this drops (after the job's ack is sent).
#[derive(Debug)]
pub struct Writing {
    writes: Arc<Writes>,
    device: String,
}

impl Drop for Writing {
    fn drop(&mut self) {
        self.writes.lock().writing.remove(&self.device);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A write begun before the close is waited for until it drops; none begins after.
    #[tokio::test]
    async fn writes_under_way_are_waited_for_and_none_starts_once_closed() {
        let writes = Arc::new(Writes::default());
        let a = writes.begin("a", 7, "m7").expect("open");
        drop(writes.begin("b", 1, "m1").expect("open"));
        assert_eq!(writes.unfinished(), [PendingJob { device: "a".into(), seq: 7, message_id: "m7".into() }]);
        let waiting = writes.close();
        assert_eq!(waiting.len(), 1);
        assert!(writes.begin("b", 2, "m2").is_none(), "closed: not started");
        let soon = tokio::time::Instant::now() + Duration::from_millis(50);
        assert_eq!(writes.settle(waiting.clone(), soon).await.len(), 1, "a is still writing");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let (left, ()) = tokio::join!(writes.settle(waiting, deadline), async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(a);
        });
        assert!(left.is_empty(), "{left:?}");
    }
}
