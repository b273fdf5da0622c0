//! Test hooks. In: an `INFERLOG_*_PAUSE_AFTER=<step>` variable. Out: the
//! daemon stops dead right after that step is recorded, so a test can
//! `kill -9` it at a precise point.
//!
//! Compiled in only with the `test-hooks` feature, which the test build
//! enables (`deploy/local/test.sh`). A binary built without it refuses to
//! start when such a variable is set ([`refuse_unless_built_in`]), so a
//! production daemon can never be told to hang.

/// Whether this build carries the hooks.
pub const BUILT_IN: bool = cfg!(feature = "test-hooks");

/// With the hooks built in and `env` set to `step`: waits here for ever.
pub async fn pause_point(env: &str, step: &str) {
    if BUILT_IN && std::env::var(env).is_ok_and(|v| v == step) {
        tracing::warn!(step, "{env}: pausing here until killed");
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        }
    }
}

/// The file whose creation lets a [`hold_point`] go on.
pub const RESUME_FILE_ENV: &str = "INFERLOG_TEST_RESUME_FILE";

/// With the hooks built in and `env` set to `step`: waits here until the
/// file named by `INFERLOG_TEST_RESUME_FILE` exists, then goes on, so a
/// test can change the stores between two steps of a running command.
pub async fn hold_point(env: &str, step: &str) {
    if !(BUILT_IN && std::env::var(env).is_ok_and(|v| v == step)) {
        return;
    }
    let Some(file) = std::env::var_os(RESUME_FILE_ENV) else {
        return pause_point(env, step).await;
    };
    tracing::warn!(step, "{env}: held here until {} exists", std::path::Path::new(&file).display());
    while !std::path::Path::new(&file).exists() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    tracing::warn!(step, "{env}: resumed");
}

/// The instant, RFC 3339, a binary takes for "now" instead of the wall
/// clock ([`now_ms`]): a test that compares scenarios run minutes apart
/// pins it so that UTC midnight cannot pass between them.
pub const NOW_ENV: &str = "INFERLOG_TEST_NOW";

/// Milliseconds since the epoch: the wall clock, or, with the hooks built
/// in and [`NOW_ENV`] set, that instant (an unreadable one is the wall
/// clock, logged).
pub fn now_ms() -> i64 {
    if BUILT_IN {
        if let Ok(text) = std::env::var(NOW_ENV) {
            match inferlog_schema::timestamp::parse_rfc3339_ms(&text) {
                Ok(ms) => return ms,
                Err(e) => tracing::warn!(value = %text, error = ?e, "{NOW_ENV}: not an RFC 3339 instant, using the wall clock"),
            }
        }
    }
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// An error message when `env` is set but this build has no hooks.
pub fn refuse_unless_built_in(env: &str) -> Result<(), String> {
    if BUILT_IN || std::env::var_os(env).is_none() {
        return Ok(());
    }
    Err(format!("{env} is a test hook; this binary was built without the test-hooks feature and refuses it"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unit tests build without the feature, like a release binary.
    #[test]
    fn a_build_without_hooks_refuses_a_hook_variable() {
        let env = "INFERLOG_TEST_HOOKS_PROBE_PAUSE_AFTER";
        assert!(refuse_unless_built_in(env).is_ok(), "unset: nothing to refuse");
        // No other test reads or writes this variable.
        std::env::set_var(env, "archived");
        let refused = refuse_unless_built_in(env);
        std::env::remove_var(env);
        if BUILT_IN {
            assert!(refused.is_ok());
        } else {
            assert!(refused.expect_err("refused").contains(env));
        }
    }

    /// Without the hooks the pinned clock is ignored: a release binary
    /// always reads the wall clock.
    #[test]
    fn the_clock_is_pinned_only_with_the_hooks() {
        let wall = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_millis() as i64;
        // No other test reads or writes this variable.
        std::env::set_var(NOW_ENV, "2001-02-03T04:05:06Z");
        let (before, got, after) = (wall(), now_ms(), wall());
        std::env::remove_var(NOW_ENV);
        if BUILT_IN {
            assert_eq!(got, 981_173_106_000);
        } else {
            assert!((before..=after).contains(&got), "{got} not in {before}..={after}");
        }
    }
}
