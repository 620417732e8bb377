//! A fixed pool of tokenizer threads, so that rendering and tokenizing (pure
//! CPU work, up to milliseconds for long prompts) never blocks the async
//! runtime. Sized to the cores by default; jobs queue FIFO on one channel
//! and each answers on its own oneshot.
//!
//! A job that panics is caught: its caller gets [`PoolError::Panicked`] and
//! the worker keeps serving.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;

use tokio::sync::oneshot;

type Job<S> = Box<dyn FnOnce(&S) + Send>;

/// Why a job produced no result.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PoolError {
    /// The job panicked; the message is the panic payload when it is text.
    #[error("tokenizer job panicked: {0}")]
    Panicked(String),
    /// The pool is shutting down.
    #[error("tokenizer pool is shut down")]
    ShutDown,
}

/// A pool of threads sharing one state `S` (e.g. a tokenizer and its cache).
#[derive(Debug)]
pub struct Pool<S: Send + Sync + 'static> {
    tx: Mutex<Option<mpsc::Sender<Job<S>>>>,
    workers: Vec<JoinHandle<()>>,
    queued: Arc<AtomicUsize>,
}

impl<S: Send + Sync + 'static> Pool<S> {
    /// Starts `threads` workers (0 means one per available core).
    pub fn new(threads: usize, state: Arc<S>) -> std::io::Result<Pool<S>> {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let (tx, rx) = mpsc::channel::<Job<S>>();
        let rx = Arc::new(Mutex::new(rx));
        let queued = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let rx = Arc::clone(&rx);
            let state = Arc::clone(&state);
            let queued = Arc::clone(&queued);
            let handle = std::thread::Builder::new().name(format!("kvgate-tokenize-{i}")).spawn(
                move || loop {
                    // Hold the receiver lock only while taking a job.
                    let job = match rx.lock() {
                        Ok(guard) => guard.recv(),
                        Err(poisoned) => poisoned.into_inner().recv(),
                    };
                    let Ok(job) = job else { return };
                    queued.fetch_sub(1, Ordering::Relaxed);
                    job(&state);
                },
            )?;
            workers.push(handle);
        }
        Ok(Pool { tx: Mutex::new(Some(tx)), workers, queued })
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Jobs waiting for a worker.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    /// Runs `f` on a worker and waits for its result without blocking the
    /// async runtime.
    pub async fn run<R, F>(&self, f: F) -> Result<R, PoolError>
    where
        R: Send + 'static,
        F: FnOnce(&S) -> R + Send + 'static,
    {
        let (done_tx, done_rx) = oneshot::channel();
        let job: Job<S> = Box::new(move |state: &S| {
            let result = catch_unwind(AssertUnwindSafe(|| f(state))).map_err(|payload| {
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-text panic payload".to_owned());
                PoolError::Panicked(msg)
            });
            // The caller may have gone away (request cancelled); that is fine.
            let _ = done_tx.send(result);
        });
        {
            let guard = self.tx.lock().unwrap_or_else(|p| p.into_inner());
            let tx = guard.as_ref().ok_or(PoolError::ShutDown)?;
            self.queued.fetch_add(1, Ordering::Relaxed);
            tx.send(job).map_err(|_| PoolError::ShutDown)?;
        }
        done_rx.await.map_err(|_| PoolError::ShutDown)?
    }
}

impl<S: Send + Sync + 'static> Drop for Pool<S> {
    fn drop(&mut self) {
        // Closing the channel ends every worker once the queue is drained.
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn runs_jobs_off_the_runtime_and_survives_panics() {
        let pool = Pool::new(2, Arc::new(10u32)).unwrap();
        assert_eq!(pool.threads(), 2);
        let main_thread = std::thread::current().id();
        let (value, thread) =
            pool.run(move |s: &u32| (*s * 2, std::thread::current().id())).await.unwrap();
        assert_eq!(value, 20);
        assert_ne!(thread, main_thread);
        let err = pool.run(|_: &u32| -> u32 { panic!("boom") }).await.unwrap_err();
        assert_eq!(err, PoolError::Panicked("boom".to_owned()));
        // Still serving after the panic, concurrently.
        let jobs: Vec<_> = (0..50u32).map(|i| pool.run(move |s: &u32| s + i)).collect();
        let mut sum = 0;
        for j in jobs {
            sum += j.await.unwrap();
        }
        assert_eq!(sum, 50 * 10 + (0..50).sum::<u32>());
    }
}
