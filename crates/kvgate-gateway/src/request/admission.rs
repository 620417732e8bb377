//! First-come admission for requests that find every replica busy.
//!
//! Waiters stand in one queue, because waiters that each polled the router
//! on their own timer would take a freed replica in poll order, not arrival
//! order, and every poll of every waiter would write a `Wait` entry that
//! pushes real decisions out of the decision log. Only the head asks the
//! router (at `router.queue_poll_ms`), a
//! request that arrives while anyone waits queues behind them instead of
//! deciding first, and the next in line is woken the moment the head is
//! routed, rejected or gives up (its [`Ticket`] dropped). The head itself
//! sleeps at most `router.queue_poll_ms` between decisions, and is woken
//! early when load changes ([`Admission::load_changed`], the router's load
//! listener: a booking's first token or its release by any path, which is
//! when a busy replica can stop being busy).
//!
//! A pool with tenants (`[tenants]`) orders its waiters by the tenant queue
//! instead (`tenant_queue.rs`: bands, then VTC between tenants, then
//! arrival); this queue then holds only requests already dispatched from it
//! that must place again (a retry after a failed replica found every other
//! one busy).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::locks::lock;
use crate::request::tenant_queue::TenantQueue;

/// The queue of waiting requests.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    inner: Mutex<Inner>,
    turn: Notify,
    /// Woken by [`Admission::load_changed`].
    load: Notify,
    /// `inner.queue.len()`, readable without the lock on the request path
    /// (written under it).
    waiting: AtomicUsize,
    /// The pool's tenant queue, with `[tenants]`.
    tenants: Option<Arc<TenantQueue>>,
}

#[derive(Debug, Default)]
struct Inner {
    queue: VecDeque<u64>,
    next_id: u64,
}

/// A place in the queue; dropping it leaves the queue and wakes the next.
#[derive(Debug)]
pub(crate) struct Ticket {
    admission: Arc<Admission>,
    id: u64,
}

impl Admission {
    /// A pool's admission with its tenant queue.
    pub(crate) fn with_tenants(tenants: Option<Arc<TenantQueue>>) -> Admission {
        Admission { tenants, ..Admission::default() }
    }

    /// The pool's tenant queue, if it has tenants.
    pub(crate) fn tenants(&self) -> Option<&Arc<TenantQueue>> {
        self.tenants.as_ref()
    }

    /// Whether anyone is waiting here (the tenant queue apart).
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many are waiting, here and in the tenant queue.
    pub(crate) fn waiting(&self) -> usize {
        self.len() + self.tenants.as_ref().map_or(0, |t| t.len())
    }

    /// How many are waiting here (the tenant queue apart).
    pub(crate) fn len(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Joins the back of the queue.
    pub(crate) fn join(self: &Arc<Self>) -> Ticket {
        let mut inner = lock(&self.inner);
        let id = inner.next_id;
        inner.next_id += 1;
        inner.queue.push_back(id);
        self.waiting.store(inner.queue.len(), Ordering::Relaxed);
        Ticket { admission: Arc::clone(self), id }
    }

    /// A request's load on its replica changed (first token, end): wakes
    /// the head if it is between decisions. Costs one atomic load when
    /// nobody waits.
    pub(crate) fn load_changed(&self) {
        if !self.is_empty() {
            self.load.notify_waiters();
        }
        if let Some(t) = &self.tenants {
            t.load_changed();
        }
    }

    /// The head's pause between decisions: `poll`, or less if load changes.
    pub(crate) async fn pause(&self, poll: Duration) {
        let changed = self.load.notified();
        tokio::select! {
            () = tokio::time::sleep(poll) => {}
            () = changed => {}
        }
    }

    /// Returns once `ticket` is at the head of the queue.
    pub(crate) async fn turn(&self, ticket: &Ticket) {
        loop {
            // Registered before the check, so a wake between the check and
            // the await is not lost.
            let notified = self.turn.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if lock(&self.inner).queue.front() == Some(&ticket.id) {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut inner = lock(&self.admission.inner);
        let was_head = inner.queue.front() == Some(&self.id);
        inner.queue.retain(|&id| id != self.id);
        self.admission.waiting.store(inner.queue.len(), Ordering::Relaxed);
        drop(inner);
        if was_head {
            self.admission.turn.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Three waiters are served in the order they joined, each as soon as
    /// the one before it leaves; one that gives up in the middle of the
    /// queue neither blocks nor wakes anyone.
    #[tokio::test(start_paused = true)]
    async fn waiters_are_served_first_come() {
        let adm = Arc::new(Admission::default());
        let order: Arc<Mutex<Vec<u32>>> = Arc::default();
        let tickets: Vec<Ticket> = (0..4).map(|_| adm.join()).collect();
        assert_eq!(adm.len(), 4);
        let mut tasks = Vec::new();
        for (n, t) in tickets.into_iter().enumerate() {
            let (adm, order) = (Arc::clone(&adm), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                if n == 2 {
                    // Gives up while two are ahead of it.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    drop(t);
                    return;
                }
                adm.turn(&t).await;
                order.lock().unwrap().push(n as u32);
                // Holds the head for a while, as a routed request would
                // not: the next must wait for this drop.
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(t);
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 3]);
        assert!(adm.is_empty());
    }

    /// The head's pause ends when load changes, not only at the poll.
    #[tokio::test(start_paused = true)]
    async fn a_load_change_ends_the_heads_pause() {
        let adm = Arc::new(Admission::default());
        let head = adm.join();
        let t0 = tokio::time::Instant::now();
        let a = Arc::clone(&adm);
        let waker = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(3)).await;
            a.load_changed();
        });
        adm.pause(Duration::from_secs(10)).await;
        assert_eq!(t0.elapsed(), Duration::from_millis(3));
        waker.await.unwrap();
        // With nobody waiting, a load change is not even a notification.
        drop(head);
        adm.load_changed();
        let t1 = tokio::time::Instant::now();
        adm.pause(Duration::from_millis(50)).await;
        assert_eq!(t1.elapsed(), Duration::from_millis(50));
    }

    /// The head's turn is immediate; a later ticket waits until then.
    #[tokio::test(start_paused = true)]
    async fn only_the_head_has_its_turn() {
        let adm = Arc::new(Admission::default());
        let first = adm.join();
        let second = adm.join();
        adm.turn(&first).await;
        let waiting = tokio::time::timeout(Duration::from_secs(1), adm.turn(&second)).await;
        assert!(waiting.is_err(), "the second got a turn while the first was at the head");
        drop(first);
        tokio::time::timeout(Duration::from_millis(1), adm.turn(&second)).await.unwrap();
    }
}
