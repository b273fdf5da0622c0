#!/usr/bin/env bash
# The README's demo: builds inferlog and walks generated traffic through
# every stage that exists, on this machine. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/../.."
work=.inferlog/demo
mkdir -p "$work"

step() { printf '\n==> %s\n' "$*" >&2; }

step "building (release; the first build takes a few minutes)"
cargo build --release --locked -p inferlog-schema
bin=target/release

step "generating 14 days of traffic: 50,000 events, 2% invalid"
"$bin/inferlog-schema" generate --count 50000 --days 14 --seed 7 --invalid-ratio 0.02 > "$work/events.jsonl"
ls -lh "$work/events.jsonl" >&2

step "checking the events as a producer's CI would (exit 1: some are invalid on purpose)"
"$bin/inferlog-schema" check --format json "$work/events.jsonl" | tail -n 1 | python3 -m json.tool >&2 || true

step "normalizing with a demo hash key (from a file, never the command line)"
key_file="$work/hash.key"
[ -s "$key_file" ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$key_file"
INFERLOG_HASH_KEY_FILE="$key_file" "$bin/inferlog-schema" normalize "$work/events.jsonl" \
  > "$work/normalized.jsonl" 2> "$work/normalize.log" || true
tail -n 2 "$work/normalize.log" >&2
echo "first stored event:" >&2
head -n 1 "$work/normalized.jsonl" | python3 -m json.tool >&2
