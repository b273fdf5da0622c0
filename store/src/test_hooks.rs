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
}
