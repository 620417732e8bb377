//! The process allocator, and memory given back when the process is quiet.
//!
//! kvgate allocates through mimalloc (glibc's malloc cost ~10% of gateway
//! CPU in arena locking). mimalloc returns freed pages to the OS only after a
//! delay (1 s), and it checks for expired delays only while the process
//! allocates. A gateway goes quiet exactly when memory should go back: after
//! loading a tokenizer (its JSON parse frees ~200 MB of temporaries), and
//! after an overload. Without a nudge those pages stay resident until the
//! next burst of traffic: an idle `kvgate serve` sat at 325 MB instead of
//! ~110 MB.
//!
//! [`Releaser`] is that nudge: a thread that asks mimalloc every so often to
//! purge what has been free for longer than its delay. Under traffic
//! mimalloc does the same check itself, so the thread changes nothing there;
//! it only matters when nothing else allocates.
//!
//! Architecture Invariant: this is the only crate with `unsafe` code, one
//! foreign call with no arguments that point anywhere.

use std::time::Duration;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Give back to the OS the memory mimalloc holds free.
///
/// `force` purges everything free now, not only what has been free for
/// longer than mimalloc's delay; use it once, after a known burst of
/// temporaries (a tokenizer load), not on a timer.
pub fn release_free_memory(force: bool) {
    // SAFETY: mi_collect takes a plain bool, touches only mimalloc's own
    // state for the calling thread and the process-wide arenas (with its own
    // synchronisation), and is documented as callable at any time from any
    // thread that uses mimalloc, which every thread here does.
    #[allow(unsafe_code)]
    unsafe {
        libmimalloc_sys::mi_collect(force)
    }
}

/// Runs `f` on a thread of its own that exits when `f` returns, for work
/// that leaves many temporaries behind (a tokenizer load parses a JSON tree
/// several times the size of what it keeps). They are freed on that thread,
/// and an exiting thread hands its allocator pages back, where a long-lived
/// thread would keep them as its own cache (~35 MB more idle RSS, measured
/// on `kvgate serve`). A panic in `f` comes back as an error.
pub fn on_exiting_thread<T: Send>(name: &str, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    std::thread::scope(|s| {
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn_scoped(s, f)?
            .join()
            .map_err(|_| std::io::Error::other(format!("thread {name} panicked")))
    })
}

/// A background thread that calls [`release_free_memory`] every `period`.
///
/// The thread stops when this value is dropped (within one period).
#[derive(Debug)]
pub struct Releaser {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Releaser {
    /// Start the thread. `period` of zero disables it (no thread).
    pub fn start(period: Duration) -> std::io::Result<Releaser> {
        if period.is_zero() {
            return Ok(Releaser { stop: None, thread: None });
        }
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new().name("kvgate-mem".into()).spawn(move || {
            // A timeout means "time to collect"; a message or a hang-up
            // means stop.
            while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(period)
            {
                release_free_memory(false);
            }
        })?;
        Ok(Releaser { stop: Some(stop), thread: Some(thread) })
    }
}

impl Drop for Releaser {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            // A panic in the thread is impossible to act on here; the
            // process is shutting this down anyway.
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Freed memory goes back: allocate and touch 256 MiB in 1 MiB pieces,
    /// free it, release, and resident memory falls by most of it. Linux
    /// only (reads /proc).
    #[test]
    #[cfg(target_os = "linux")]
    fn released_memory_leaves_the_resident_set() {
        fn rss_mib() -> Option<f64> {
            let s = std::fs::read_to_string("/proc/self/status").ok()?;
            let kb: f64 = s
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()?;
            Some(kb / 1024.0)
        }
        let Some(before) = rss_mib() else { return };
        let mut blocks: Vec<Vec<u8>> = (0..256).map(|i| vec![i as u8 | 1; 1 << 20]).collect();
        let sum: u64 = blocks.iter().map(|b| u64::from(b[b.len() / 2])).sum();
        assert!(sum > 0);
        let peak = rss_mib().unwrap_or(0.0);
        assert!(peak - before > 200.0, "the test did not grow the heap: {before} -> {peak} MiB");
        blocks.clear();
        blocks.shrink_to_fit();
        release_free_memory(true);
        let after = rss_mib().unwrap_or(f64::MAX);
        assert!(
            after - before < 64.0,
            "freed memory stayed resident: {before:.0} -> peak {peak:.0} -> {after:.0} MiB"
        );
    }

    #[test]
    fn work_on_an_exiting_thread_returns_its_value_or_its_panic() {
        let name =
            on_exiting_thread("kvgate-test", || std::thread::current().name().map(str::to_owned));
        assert_eq!(name.unwrap().as_deref(), Some("kvgate-test"));
        let panicked = on_exiting_thread("kvgate-test", || -> u8 { panic!("boom") });
        assert!(panicked.unwrap_err().to_string().contains("panicked"));
    }

    #[test]
    fn a_releaser_stops_when_dropped() {
        let r = Releaser::start(Duration::from_millis(5)).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        drop(r);
        let none = Releaser::start(Duration::ZERO).unwrap();
        assert!(none.thread.is_none());
    }
}
