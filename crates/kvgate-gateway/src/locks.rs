//! Lock helpers that shrug off poison. Every lock in the gateway guards
//! plain counters and maps that stay consistent between statements, so a
//! panic elsewhere mid-update leaves data that is still usable; answering
//! every later request with a panic would be worse.
//!
//! The fleet lock is the one every routing decision and event batch waits
//! for, so nothing under it may make a system call: [`under_fleet_lock`]
//! lets the code that reads `/proc` assert it is not there (in debug builds
//! and tests, where a planted read fails the tests that exercise it).

use std::cell::Cell;
use std::sync::{Mutex, MutexGuard};

thread_local! {
    /// Whether this thread is inside [`with_fleet_lock_marked`].
    static UNDER_FLEET_LOCK: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` marked as holding the fleet lock (the caller holds it). Only
/// debug builds read the mark, so release builds skip it: this runs on every
/// routing decision.
pub(crate) fn with_fleet_lock_marked<R>(f: impl FnOnce() -> R) -> R {
    if !cfg!(debug_assertions) {
        return f();
    }
    /// Clears the mark however `f` ends, panics included.
    struct Unmark(bool);
    impl Drop for Unmark {
        fn drop(&mut self) {
            UNDER_FLEET_LOCK.with(|m| m.set(self.0));
        }
    }
    let _unmark = Unmark(UNDER_FLEET_LOCK.with(|m| m.replace(true)));
    f()
}

/// Whether this thread holds the fleet lock.
pub(crate) fn under_fleet_lock() -> bool {
    UNDER_FLEET_LOCK.with(Cell::get)
}

/// Locks a mutex; poison only means another thread panicked mid-update of
/// plain counters, so the data is still usable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleet_lock_mark_is_set_inside_and_cleared_after_a_panic() {
        assert!(!under_fleet_lock());
        assert!(with_fleet_lock_marked(under_fleet_lock));
        assert!(!under_fleet_lock());
        let r = std::panic::catch_unwind(|| with_fleet_lock_marked(|| panic!("inside")));
        assert!(r.is_err());
        assert!(!under_fleet_lock(), "a panic under the lock left the mark set");
    }

    /// A `/proc` read planted under the fleet lock fails in tests.
    #[test]
    #[should_panic(expected = "under the fleet lock")]
    fn a_proc_read_under_the_fleet_lock_panics_in_tests() {
        with_fleet_lock_marked(crate::observe::metrics::process_cpu_seconds);
    }
}
