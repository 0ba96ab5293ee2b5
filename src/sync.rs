//! The synchronization primitives of the crate's shared cores, swapped for loom's under
//! `--cfg runjournal_loom` so the loom tests explore every interleaving of the same code (tokio's
//! pattern).

#[cfg(runjournal_loom)]
pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};

#[cfg(not(runjournal_loom))]
pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Locks, recovering the data of a mutex poisoned by a panic elsewhere: every structure
/// guarded here is left consistent between statements, so the data is still good.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Locks when nobody holds the lock now (`None` when someone does), recovering from poisoning
/// as [`lock`] does.
pub(crate) fn try_lock<T>(mutex: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Waits on `condvar` for at most `timeout`, recovering from poisoning as [`lock`] does. Under
/// loom, which explores orders rather than times, it waits as [`wait`] does.
#[cfg(not(runjournal_loom))]
pub(crate) fn wait_timeout<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    timeout: std::time::Duration,
) -> MutexGuard<'a, T> {
    condvar
        .wait_timeout(guard, timeout)
        .map_or_else(|poisoned| poisoned.into_inner().0, |(guard, _)| guard)
}

#[cfg(runjournal_loom)]
pub(crate) fn wait_timeout<'a, T>(
    condvar: &Condvar,
    guard: MutexGuard<'a, T>,
    _timeout: std::time::Duration,
) -> MutexGuard<'a, T> {
    wait(condvar, guard)
}

/// Waits on `condvar`, recovering from poisoning as [`lock`] does.
pub(crate) fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    condvar
        .wait(guard)
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
