//! A replica's background tasks (its event feed and its monitor) must not
//! end quietly. Before this, a feed task that panicked or whose subscriber
//! gave up left its replica "synced" forever on a view that no longer
//! changed, and routing kept trusting it.
//!
//! [`spawn_replica_task`] runs a task under [`spawn`], which watches it. When it ends while the replica is
//! not being removed, the end is logged and counted
//! (`kvgate_replica_task_restarts_total{task}`), the replica is put in the
//! state that is safe without the task ([`Task::Feed`]: its KV view is
//! cleared and ignored until rebuilt), and the task starts again after a
//! backoff that doubles from 100 ms to 30 s, and resets once a run has lasted
//! a minute.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::observe::metrics::Metrics;
use crate::replicas::fleet_handle::FleetHandle;
use crate::replicas::replica::Replica;

/// The first wait before a restart.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// The longest wait between restarts.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A run this long counts as healthy: the next failure waits `BACKOFF_MIN`.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Which task of a replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Task {
    /// The KV-event subscriber feeding the index.
    Feed,
    /// Health probes and metrics scrapes.
    Monitor,
}

impl Task {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Task::Feed => "feed",
            Task::Monitor => "monitor",
        }
    }
}

/// The wait before restart number `n` (1-based) of a task that keeps failing.
fn backoff(n: u32) -> Duration {
    BACKOFF_MIN.saturating_mul(1u32 << n.saturating_sub(1).min(16)).min(BACKOFF_MAX)
}

/// Runs `make()`'s future, and again after each unexpected end (it
/// returned, with or without an error, or panicked), until `stop` turns
/// true. `on_end(why, wait)` hears of each such end before the wait.
pub(crate) fn spawn<F, Fut, E>(
    mut stop: watch::Receiver<bool>,
    on_end: E,
    make: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
    E: Fn(&str, Duration) + Send + 'static,
{
    tokio::spawn(async move {
        let mut failures = 0u32;
        loop {
            let started = tokio::time::Instant::now();
            let outcome = tokio::spawn(make()).await;
            if *stop.borrow() {
                return;
            }
            let why = match outcome {
                Ok(Ok(())) => "ended".to_owned(),
                Ok(Err(e)) => e,
                Err(e) if e.is_panic() => format!("panicked: {}", panic_text(e.into_panic())),
                Err(e) => e.to_string(),
            };
            failures = if started.elapsed() >= HEALTHY_RUN { 1 } else { failures + 1 };
            let wait = backoff(failures);
            on_end(&why, wait);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|v| *v) => return,
            }
        }
    })
}

/// Starts `task` for `replica` under [`spawn`]: each unexpected end is
/// logged, counted, and makes the replica safe without the task.
pub(crate) fn spawn_replica_task<F, Fut>(
    fleet: &Arc<FleetHandle>,
    metrics: &Arc<Metrics>,
    replica: &Arc<Replica>,
    task: Task,
    make: F,
) where
    F: Fn(Arc<Replica>) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let (fleet, metrics, r) = (Arc::clone(fleet), Arc::clone(metrics), Arc::clone(replica));
    let on_end = move |why: &str, wait: Duration| {
        metrics.task_restarted(task.label());
        tracing::warn!(
            replica = %r.name,
            task = task.label(),
            %why,
            restart_in_ms = wait.as_millis() as u64,
            "replica task ended unexpectedly; restarting"
        );
        safe_without(&fleet, &r, task, why);
    };
    let r = Arc::clone(replica);
    drop(spawn(replica.stop.subscribe(), on_end, move || make(Arc::clone(&r))));
}

/// Puts `replica` in the state that is safe while `task` is not running.
fn safe_without(fleet: &FleetHandle, replica: &Replica, task: Task, why: &str) {
    match task {
        Task::Feed => {
            // Events were lost between the end and the restart; a lost
            // removal would leave ghost blocks. Clear, and ignore the view
            // until the new subscriber has rebuilt it.
            let now = crate::clock::now();
            // Stepwise: upkeep finishes it.
            let why = format!("event feed restarted ({why})");
            let cleared = fleet.with(|f| f.view_lost(replica.id, why, now));
            tracing::info!(replica = %replica.name, cleared, "KV view cleared until the feed rebuilds it");
        }
        // A restarted monitor probes at once; until then the last verdict
        // stands, as it would between two probes.
        Task::Monitor => {}
    }
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task that panics twice, then fails with an error, then runs: each
    /// end is reported with its cause and followed by the backoff; stopping
    /// ends the supervisor without another report.
    #[tokio::test(start_paused = true)]
    async fn a_killed_task_is_reported_and_restarted_until_stopped() {
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::sync::Mutex;
        let runs = Arc::new(AtomicU32::new(0));
        let ends: Arc<Mutex<Vec<(String, Duration)>>> = Arc::default();
        let (stop_tx, stop_rx) = watch::channel(false);
        let r = Arc::clone(&runs);
        let e = Arc::clone(&ends);
        let handle = spawn(
            stop_rx,
            move |why: &str, wait| e.lock().unwrap().push((why.to_owned(), wait)),
            move || {
                let n = r.fetch_add(1, Ordering::SeqCst);
                async move {
                    match n {
                        0 | 1 => panic!("boom {n}"),
                        2 => Err("subscriber gave up".to_owned()),
                        _ => {
                            std::future::pending::<()>().await;
                            Ok(())
                        }
                    }
                }
            },
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 4, "three ends, three restarts");
        let got = ends.lock().unwrap().clone();
        assert_eq!(
            got,
            [
                ("panicked: boom 0".to_owned(), Duration::from_millis(100)),
                ("panicked: boom 1".to_owned(), Duration::from_millis(200)),
                ("subscriber gave up".to_owned(), Duration::from_millis(400)),
            ]
        );
        stop_tx.send(true).unwrap();
        // The running task is not aborted by the supervisor; it ends when
        // the replica's own stop reaches it. Here it never does, so the
        // supervisor stays parked on it, and reports nothing more.
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(ends.lock().unwrap().len(), 3);
        handle.abort();
    }

    /// A stop during the backoff wait ends the supervisor: no restart.
    #[tokio::test(start_paused = true)]
    async fn a_stop_during_the_backoff_ends_it() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let runs = Arc::new(AtomicU32::new(0));
        let (stop_tx, stop_rx) = watch::channel(false);
        let r = Arc::clone(&runs);
        let handle = spawn(
            stop_rx,
            |_: &str, _| {},
            move || {
                r.fetch_add(1, Ordering::SeqCst);
                async { Err("gone".to_owned()) }
            },
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop_tx.send(true).unwrap();
        handle.await.unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn backoff_doubles_to_a_cap() {
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(5), Duration::from_millis(1600));
        assert_eq!(backoff(10), BACKOFF_MAX);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }

    #[test]
    fn panic_payloads_become_text() {
        assert_eq!(panic_text(Box::new("boom")), "boom");
        assert_eq!(panic_text(Box::new(String::from("bang"))), "bang");
        assert_eq!(panic_text(Box::new(7u8)), "(no message)");
    }
}
