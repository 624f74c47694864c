//! Shutdown, as tokio's mini-redis does it: one [`Shutdown`] handle, cloned into every
//! long-running task. SIGTERM or Ctrl-C requests it ([`Shutdown::request`]); each task then
//! finishes what it must (the consumer its last outbox write and the final commit; a
//! device session closes its socket) and returns. Tasks spawned through
//! [`Shutdown::spawn`] are tracked, and the wiring waits for them, bounded
//! ([`Shutdown::wait`]), before the process exits.

use std::future::Future;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The shutdown request and the tasks that must end before the process does. Cheap to
/// clone: every clone shares the request and the tracker.
#[derive(Clone, Default)]
pub struct Shutdown {
    token: CancellationToken,
    tasks: TaskTracker,
}

impl Shutdown {
    /// Not requested; no task tracked yet.
    pub fn new() -> Shutdown {
        Shutdown::default()
    }

    /// Asks every holder to stop. Idempotent.
    pub fn request(&self) {
        self.token.cancel();
    }

    /// Whether shutdown has been requested.
    pub fn is_requested(&self) -> bool {
        self.token.is_cancelled()
    }

    /// Completes once shutdown is requested, at once if it already was. Cancel safe: a
    /// `select!` branch.
    pub async fn requested(&self) {
        self.token.cancelled().await;
    }

    /// Sleeps `delay`, or less if shutdown is requested meanwhile (then at once if it
    /// already was). Returns whether shutdown is requested.
    pub async fn sleep(&self, delay: Duration) -> bool {
        tokio::select! {
            () = self.requested() => true,
            () = tokio::time::sleep(delay) => self.is_requested(),
        }
    }

    /// Spawns `task` on the current runtime, tracked: [`Shutdown::wait`] waits for it.
    pub fn spawn<F>(&self, task: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tasks.spawn(task)
    }

    /// Waits until every tracked task has returned, at most `bound`; from now on the
    /// tracker counts as closed. True when they all returned in time.
    pub async fn wait(&self, bound: Duration) -> bool {
        self.tasks.close();
        tokio::time::timeout(bound, self.tasks.wait()).await.is_ok()
    }

    /// How many tracked tasks are still running.
    pub fn running(&self) -> usize {
        self.tasks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tasks that watch the request end on it and are waited for; one that ignores it
    /// is waited for only up to the bound, and reported.
    #[tokio::test(start_paused = true)]
    async fn tracked_tasks_end_on_request_and_the_wait_is_bounded() {
        let shutdown = Shutdown::new();
        for _ in 0..3 {
            let s = shutdown.clone();
            shutdown.spawn(async move { s.requested().await });
        }
        let s = shutdown.clone();
        let slept = shutdown.spawn(async move { s.sleep(Duration::from_secs(3600)).await });
        assert!(!shutdown.is_requested());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(shutdown.running(), 4, "nothing ends before the request");
        shutdown.request();
        assert!(shutdown.wait(Duration::from_secs(1)).await, "all four end on the request");
        assert!(slept.await.unwrap(), "the sleep was cut short by the request");

        let stubborn = Shutdown::new();
        stubborn.spawn(std::future::pending::<()>());
        stubborn.request();
        let started = tokio::time::Instant::now();
        assert!(!stubborn.wait(Duration::from_secs(10)).await, "a task that ignores the request is reported");
        assert_eq!(started.elapsed(), Duration::from_secs(10), "after exactly the bound");
        assert!(stubborn.sleep(Duration::from_secs(3600)).await, "a sleep after the request returns at once");
    }
}
