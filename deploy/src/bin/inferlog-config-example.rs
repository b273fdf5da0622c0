//! `inferlog-config-example`: prints the example config, generated from the
//! config types, to stdout. `deploy/inferlog.example.toml` is its output.

use std::io::Write as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    match std::io::stdout().write_all(inferlog_deploy::example_config().as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("inferlog-config-example: writing stdout: {e}");
            }
            ExitCode::from(2)
        }
    }
}
