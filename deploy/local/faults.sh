#!/usr/bin/env bash
# The fault matrix (tests/tests/fault_matrix.rs), whole: every input
# (json, otlp_proto, otlp_json) × writer (the ingest daemon with two members,
# `dlq replay`) × fault (kill -9 at a seeded moment, a ClickHouse outage past
# max.poll.interval.ms with a rebalance, one of two concurrent day inserts
# refused, an insert's answer lost, a day released while the writer adds
# rows to it) × hot tier (the single server, the local cluster), on the
# local services. Prints one line per cell:
# stored, duplicates, missing, DLQ, seconds.
#
#   deploy/local/faults.sh [--seed N] [--cells otlp_proto/ingest,kill9]
#
# --seed replays a run (each cell prints the seed it drew); --cells keeps
# the cells whose input/writer/fault name contains one of the words.
# Exit 0 when every cell held, 1 when one did not.
set -euo pipefail
cd "$(dirname "$0")/../.."
seed=""
cells=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) seed=$2; shift 2 ;;
    --cells) cells=$2; shift 2 ;;
    *) echo "usage: $0 [--seed N] [--cells WORD,...]" >&2; exit 2 ;;
  esac
done
FEATURES=(--profile ci --locked --workspace --features inferlog-store/test-hooks)
mkdir -p .inferlog
deploy/local/services.sh up --cluster
cargo build "${FEATURES[@]}" --bins --tests > .inferlog/faults-build.log 2>&1 || { cat .inferlog/faults-build.log; exit 2; }
report=$(mktemp)
trap 'rm -f "$report"' EXIT
export INFERLOG_BIN_DIR="$PWD/target/ci" INFERLOG_MATRIX_REPORT="$report" INFERLOG_MATRIX_CELLS="$cells"
[ -n "$seed" ] && export INFERLOG_TEST_SEED="$seed"
status=0
cargo test "${FEATURES[@]}" -p inferlog-tests --test fault_matrix -- --ignored --exact the_whole_matrix --nocapture \
  > .inferlog/faults.log 2>&1 || status=1
cat "$report"
if [ "$status" -ne 0 ]; then
  echo "faults.sh: a cell failed; its assertion and logs: .inferlog/faults.log" >&2
  grep -m1 -A3 "panicked at" .inferlog/faults.log >&2 || true
fi
exit "$status"
