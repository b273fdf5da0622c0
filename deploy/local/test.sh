#!/usr/bin/env bash
# The test command of README.md: builds the binaries the integration tests
# run while it starts the local service stack (installing what is
# missing), then runs every test of the workspace beside the checks of the
# code and of what deploy/ ships (clippy, alert rules, systemd units, the
# parser fuzz target: deploy/check.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
# One build for the binaries and the tests, with one feature set: the
# INFERLOG_*_PAUSE_AFTER hooks the crash tests use (a build without the
# feature refuses those variables), and the dev-dependencies' features,
# which a `--bins` build alone would leave out, so `cargo test` would
# build every dependency a second time.
# The `ci` profile (Cargo.toml) is release without LTO: optimised binaries
# for the million-event tests at about half the build time.
FEATURES=(--profile ci --locked --workspace --features inferlog-store/test-hooks)
# On CI (a fresh clone, CI=true) cargo's build directory lives outside the
# clone and outlasts it, as CI caches of Rust builds commonly do: the
# crates.io dependencies (about half of a cold build's 15 minutes) are
# built once, inferlog's own crates again each run (their files are new).
# INFERLOG_BUILD_CACHE names the directory; set it empty to build cold.
cache=${INFERLOG_BUILD_CACHE-$HOME/.cache/inferlog/target}
if [ "${CI:-}" = true ] && [ -n "$cache" ]; then
  # The workspace's, and the parser fuzz target's (deploy/check.sh).
  [ -e target ] || { mkdir -p "$cache" && ln -s "$cache" target; }
  [ -e schema/fuzz/target ] || { mkdir -p "$cache-fuzz" && ln -s "$cache-fuzz" schema/fuzz/target; }
fi
# The build runs while the services start (on a fresh machine: install);
# its log is .inferlog/build.log, with --timings' report beside the build.
mkdir -p .inferlog
# The crates download while Debian's build packages install.
cargo fetch --locked --target "$(rustc -vV | sed -n "s/^host: //p")" > .inferlog/fetch.log 2>&1 &
fetch=$!
deploy/local/services.sh build-deps
wait "$fetch" || { cat .inferlog/fetch.log >&2; echo "test.sh: cargo fetch failed" >&2; exit 75; }
cargo build "${FEATURES[@]}" --bins --tests --timings > .inferlog/build.log 2>&1 &
build=$!
trap 'kill "$build" 2>/dev/null || true' EXIT
# --otel: the OpenTelemetry Collector (built once) and its Python SDK, for
# tests/tests/otlp.rs; --tests: Chromium for the report page's browser test;
# --cluster: ZooKeeper and the local ClickHouse cluster, for tests/tests/cluster.rs.
deploy/local/services.sh up --otel --tests --cluster
if ! wait "$build"; then
  cat .inferlog/build.log
  echo "test.sh: the build failed" >&2
  exit 1
fi
grep -E "^\s*(Finished|Timing report)" .inferlog/build.log || true
export INFERLOG_BIN_DIR="$PWD/target/ci"
# Each test makes its own Postgres schema and leaves it for a look after a
# failure; the machine's Postgres outlives clones, so the tests' database
# starts empty each run.
psql -X -q -h 127.0.0.1 -U postgres -d postgres -v ON_ERROR_STOP=1 \
  -c "DROP DATABASE IF EXISTS inferlog_test WITH (FORCE)" -c "CREATE DATABASE inferlog_test"
# deploy/check.sh (clippy, the fuzz target's 60 s, the alert rules' and
# units' checks: about 4 minutes, mostly one core) runs beside the tests,
# which mostly wait on servers; its output comes after theirs
# (.inferlog/check.log).
deploy/check.sh > .inferlog/check.log 2>&1 &
check=$!
trap 'kill "$build" "$check" 2>/dev/null || true' EXIT
# Every test binary of that build, two at a time, never one that stops a
# server beside one that needs it, then the doc tests
# (deploy/local/run_tests.py).
tests=0
deploy/local/run_tests.py "${FEATURES[@]}" -- --test-threads 2 || tests=$?
checks=0
wait "$check" || checks=$?
cat .inferlog/check.log
[ "$checks" -eq 0 ] || echo "test.sh: deploy/check.sh failed (exit $checks)" >&2
[ "$tests" -eq 0 ] || echo "test.sh: tests failed (exit $tests)" >&2
[ "$tests" -eq 0 ] && [ "$checks" -eq 0 ]
