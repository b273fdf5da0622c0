#!/usr/bin/env python3
"""What `fsync_after_insert` costs on current ClickHouse (the embedded engine
of PyPI's `chdb`; ClickHouse 18.16, the local stack's server, has no such
setting), on this machine's disk.

Inserts ROWS rows as INSERTs of BATCH rows (ingest's batch: one part per
insert) into the hot table as `inferlog-ingest --print-ddl` creates it, with and without
`fsync_after_insert = 1, fsync_part_directory = 1`, alternating, and prints
the median time per run and per insert and their ratio as JSON.

  pip install chdb; cargo build --release --bins
  deploy/bench/fsync_bench.py [--rows 1000000] [--batch 100000] [--runs 5]
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

from chdb import session

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The build whose DDL the bench creates (cargo build --release --bins), or INFERLOG_BIN_DIR.
BIN = os.environ.get("INFERLOG_BIN_DIR", os.path.join(REPO, "target/release"))

# The values the bench fills, by column; every other column of the hot table
# takes its default. The table itself is inferlog's own DDL.
ROW = {
    "day": "toDate('2026-12-01')",
    "event_time": "toDateTime('2026-12-01 00:00:00') + intDiv(number, 12)",
    "timestamp_ms": "1796000000000 + number",
    "request_id": "concat('req-', hex(sipHash64(number)))",
    "business_line": "['search', 'ads', 'support'][number % 3 + 1]",
    "model_name": "'llama-3.1-70b'",
    "model_version": "['v1', 'v2'][number % 2 + 1]",
    "input_tokens": "number % 8000",
    "output_tokens": "number % 900",
    "total_latency_ms": "(number % 5000) / 3.0",
    "error_code": "0",
    "user_id_hash": "concat('k1:', hex(sipHash64(number % 9999)))",
    "tenant": "'acme'",
    "session_id": "concat('s-', toString(number % 777))",
    "request_type": "'chat'",
    "queue_wait_ms": "(number % 50) / 7.0",
    "prefill_time_ms": "(number % 400) / 3.0",
    "decode_time_ms": "(number % 3000) / 3.0",
    "ttft_ms": "(number % 450) / 3.0",
    "tpot_ms": "(number % 40) / 3.0",
    "gpu_id": "number % 64",
    "batch_size": "number % 32 + 1",
    "cache_hit": "number % 2",
    "cache_prefix_tokens": "number % 1024",
    "gpu_mem_peak_mb": "40000.0",
    "truncated": "0",
    "schema_version": "1",
    "kafka_topic": "'inference-events'",
    "kafka_partition": "number % 8",
    "kafka_offset": "number",
    "ingested_at": "toDateTime('2026-12-01 00:00:00')",
}


def hot_ddl(table):
    """The hot table's CREATE TABLE as inferlog creates it on a current server."""
    return subprocess.run([os.path.join(BIN, "inferlog-ingest"), "--print-ddl", f"b.{table}", "--server-version", "24.8"],
                          check=True, capture_output=True, text=True).stdout


def run(sess, table, rows, batch, fsync):
    settings = "\nSETTINGS fsync_after_insert = 1, fsync_part_directory = 1" if fsync else ""
    sess.query(f"DROP TABLE IF EXISTS b.{table}")
    sess.query(hot_ddl(table) + settings)
    columns, values = ", ".join(ROW), ", ".join(ROW.values())
    started = time.perf_counter()
    for first in range(0, rows, batch):
        sess.query(f"INSERT INTO b.{table} ({columns}) SELECT {values} FROM numbers({first}, {batch})")
    elapsed = time.perf_counter() - started
    sess.query(f"DROP TABLE b.{table}")
    return elapsed


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=100_000)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    sess = session.Session(tempfile.mkdtemp(prefix="fsync-bench-"))
    sess.query("CREATE DATABASE IF NOT EXISTS b")
    version = str(sess.query("SELECT version()", "CSV")).strip().strip('"')
    times = {False: [], True: []}
    for i in range(args.runs):
        for fsync in (False, True):
            times[fsync].append(run(sess, f"t{i}_{int(fsync)}", args.rows, args.batch, fsync))
    inserts = args.rows // args.batch
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(json.dumps({
        "clickhouse": version, "rows": args.rows, "rows_per_insert": args.batch,
        "without_fsync_s": [round(t, 3) for t in times[False]], "with_fsync_s": [round(t, 3) for t in times[True]],
        "median_without_s": round(off, 3), "median_with_s": round(on, 3),
        "ms_per_insert_added": round((on - off) / inserts * 1000, 1), "ratio": round(on / off, 3),
    }, indent=2))


if __name__ == "__main__":
    main()
