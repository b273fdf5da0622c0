#!/usr/bin/env bash
# The test command of README.md: starts the local service stack (installing
# what is missing), builds the binaries the integration tests run, checks
# what deploy/ ships (alert rules, systemd units, the parser fuzz target:
# deploy/check.sh), then runs every test of the workspace.
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/local/services.sh up
# The test build carries the INFERLOG_*_PAUSE_AFTER hooks the crash tests
# use (a build without the feature refuses those variables).
cargo build --release --locked --bins --features inferlog-store/test-hooks
deploy/check.sh
# --release: the tests reuse the dependencies the binaries were just built
# with (arrow, parquet, object_store, rdkafka) instead of a second debug build.
INFERLOG_BIN_DIR="$PWD/target/release" cargo test --release --workspace --locked --no-fail-fast -- --test-threads 2
