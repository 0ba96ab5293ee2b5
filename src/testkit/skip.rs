//! Tests that cannot run everywhere — they need root, FUSE, a loop device, PostgreSQL's server,
//! node and npm, a platform that records something — say so: each skip prints one line on
//! stderr, `skipped TEST: WHY`, written past the test harness's capture so that it shows in
//! the run's output. Where the environment promises that everything is there (CI, which runs
//! as root and installs every tool), [`REQUIRE_ENV`]`=1` turns every skip into a failure, so a
//! test that silently stopped running cannot pass unseen.
//!
//! Every test that may skip goes through [`skip`] (or [`needs_root`]); the lazy disk's own
//! tests, in a crate that does not depend on this one, follow the same rule with the same
//! variable.

use std::io::Write as _;

/// Set to `1` where every test must run (`.ci/run` sets it): a test that would skip fails
/// instead. Named after root, the first thing tests needed; it covers every skip.
pub const REQUIRE_ENV: &str = "RUNJOURNAL_REQUIRE_ROOT_TESTS";

/// Whether every test must run here ([`REQUIRE_ENV`]).
pub fn is_required() -> bool {
    std::env::var(REQUIRE_ENV).as_deref() == Ok("1")
}

/// Skips `test`, which cannot run here because of `why`: prints `skipped TEST: WHY`, or, where
/// every test must run, panics saying so. The caller returns right after.
pub fn skip(test: &str, why: &str) {
    assert!(
        !is_required(),
        "{test} cannot run ({why}), and {REQUIRE_ENV}=1 says every test must run here"
    );
    // A closed or full stderr must not fail the test that skips.
    let _ = writeln!(std::io::stderr(), "skipped {test}: {why}");
}

/// Whether `test` may run as it needs root (to do `what`); skips it ([`skip`]) otherwise.
pub fn needs_root(test: &str, what: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    skip(test, &format!("needs root to {what}"));
    false
}
