#!/usr/bin/env bash
# The test command of README.md: starts the local service stack (installing
# what is missing), builds the binaries the integration tests run, checks
# what deploy/ ships (alert rules, systemd units, the parser fuzz target:
# deploy/check.sh), then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/local/services.sh up
# One build for the binaries and the tests, with one feature set: the
# INFERLOG_*_PAUSE_AFTER hooks the crash tests use (a build without the
# feature refuses those variables), and the dev-dependencies' features,
# which a `--bins` build alone would leave out, so `cargo test` would
# build every dependency a second time.
# The `ci` profile (Cargo.toml) is release without LTO: optimised binaries
# for the million-event tests at about half the build time.
FEATURES=(--profile ci --locked --workspace --features inferlog-store/test-hooks)
cargo build "${FEATURES[@]}" --bins --tests
export INFERLOG_BIN_DIR="$PWD/target/ci"
deploy/check.sh
# Every test binary of that build, two at a time (those that stop a server
# alone, after the others), then the doc tests (deploy/local/run_tests.py).
deploy/local/run_tests.py "${FEATURES[@]}" -- --test-threads 2
