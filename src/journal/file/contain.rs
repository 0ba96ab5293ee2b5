//! Containing panics at the boundary where runjournal calls redb.
//!
//! redb trusts the bytes of its file: a flipped bit in a page can make it index out of bounds,
//! unwrap a UTF-8 error or fail an assertion instead of returning an error. Every call into
//! redb that reads the file — opening, beginning and reading transactions, writing and
//! committing — is made through [`contain`], which catches such a panic, keeps its message and
//! where it happened, and hands it back as a [`StoragePanic`] for the caller to report as
//! damage ([`crate::journal::Damaged`]). A process that meets a damaged journal then says so and
//! goes on (or ends cleanly), rather than printing a backtrace and exiting 101 — or, in a
//! thread of its own, dying while others wait on it.
//!
//! The panic hook stays quiet for panics caught here: the first [`contain`] installs a hook
//! that records the message of a panic on a thread inside [`contain`] and passes every other
//! panic to the hook that was there before. A host that installs its own hook afterwards
//! replaces this one; panics are still caught, only no longer silenced.
//!
//! Containment needs unwinding: a build with `panic = "abort"` cannot catch anything.
//!
//! Invariant: a panic inside [`contain`] never escapes it, and never prints; a panic outside it
//! is reported by the hook that was installed before.

use std::cell::{Cell, RefCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;

use crate::journal::format::error::StoragePanic;

thread_local! {
    /// How many [`contain`] calls this thread is inside.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// What the hook saw of the last panic caught on this thread.
    static CAUGHT: RefCell<Option<String>> = const { RefCell::new(None) };
}

static HOOK: Once = Once::new();

/// The longest panic message kept: a panic's text comes from redb's formatting of bytes it
/// read, so it is bounded before it goes into an error.
const MAX_MESSAGE_BYTES: usize = 1024;

/// Runs `call`, catching a panic inside it. The panic prints nothing; its message and
/// location come back as the error.
pub(crate) fn contain<T>(call: impl FnOnce() -> T) -> Result<T, StoragePanic> {
    install_hook();
    DEPTH.with(|depth| depth.set(depth.get() + 1));
    let outcome = panic::catch_unwind(AssertUnwindSafe(call));
    DEPTH.with(|depth| depth.set(depth.get() - 1));
    outcome.map_err(|payload| {
        let seen = CAUGHT.with(|caught| caught.borrow_mut().take());
        StoragePanic {
            message: seen.unwrap_or_else(|| bounded(payload_text(payload.as_ref()))),
        }
    })
}

/// Whether this thread is inside [`contain`] (for tests).
#[cfg(test)]
pub(crate) fn is_containing() -> bool {
    DEPTH.with(Cell::get) > 0
}

fn install_hook() {
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if DEPTH.with(Cell::get) == 0 {
                previous(info);
                return;
            }
            let message = payload_text(info.payload());
            let text = match info.location() {
                Some(location) => format!(
                    "{message} (at {}:{})",
                    short_source_path(location.file()),
                    location.line()
                ),
                None => message,
            };
            CAUGHT.with(|caught| *caught.borrow_mut() = Some(bounded(text)));
        }));
    });
}

/// The text of a panic's payload: the `&str` or `String` of `panic!`, else a word saying it
/// had none.
fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// A source path from its crate's directory on (`redb-5.0.0/src/types.rs`), so a message names
/// the crate and file without the build machine's paths.
fn short_source_path(file: &str) -> &str {
    match file.rfind("/src/") {
        Some(at) => &file[file[..at].rfind('/').map_or(0, |slash| slash + 1)..],
        None => file,
    }
}

fn bounded(mut text: String) -> String {
    if text.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_inside_is_caught_with_its_message_and_place() {
        let caught = contain(|| -> u32 { panic!("index {} out of range", 7) })
            .expect_err("the panic is caught");
        assert!(
            caught.message.starts_with("index 7 out of range (at "),
            "{caught:?}"
        );
        assert!(caught.message.contains("contain.rs:"), "{caught:?}");
        assert_eq!(contain(|| 5), Ok(5));
        assert!(!is_containing(), "the depth is back to zero after a panic");
    }

    #[test]
    fn a_nested_panic_is_caught_by_the_innermost_contain() {
        let outer = contain(|| {
            let inner = contain(|| -> () { panic!("inner") });
            assert!(is_containing(), "still inside the outer contain");
            inner.map_err(|caught| caught.message)
        });
        let inner = outer.expect("the outer call returned").expect_err("inner");
        assert!(inner.starts_with("inner"), "{inner}");
    }

    #[test]
    fn a_long_message_is_bounded() {
        let caught = contain(|| -> () { panic!("{}", "x".repeat(10_000)) }).expect_err("caught");
        assert!(caught.message.len() <= MAX_MESSAGE_BYTES + '…'.len_utf8());
    }

    #[test]
    fn a_source_path_keeps_its_crate_and_file() {
        assert_eq!(
            short_source_path("/home/someone/.cargo/registry/src/index/redb-5.0.0/src/types.rs"),
            "redb-5.0.0/src/types.rs"
        );
        assert_eq!(
            short_source_path("src/journal/file/contain.rs"),
            "src/journal/file/contain.rs"
        );
    }
}
