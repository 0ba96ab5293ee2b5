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

/// Waits on `condvar`, recovering from poisoning as [`lock`] does.
pub(crate) fn wait<'a, T>(condvar: &Condvar, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
    condvar
        .wait(guard)
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
