//! Lock helpers that shrug off poison. Every lock in the gateway guards
//! plain counters and maps that stay consistent between statements, so a
//! panic elsewhere mid-update leaves data that is still usable; answering
//! every later request with a panic would be worse.

use std::sync::{Mutex, MutexGuard};

/// Locks a mutex; poison only means another thread panicked mid-update of
/// plain counters, so the data is still usable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
