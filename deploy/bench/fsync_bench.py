#!/usr/bin/env python3
"""What `fsync_after_insert` costs on current ClickHouse (the embedded engine
of PyPI's `chdb`; ClickHouse 18.16, the local stack's server, has no such
setting), on this machine's disk.

Inserts ROWS rows as INSERTs of BATCH rows (ingest's batch: one part per
insert) into a MergeTree shaped like the hot table (32 columns: dates,
strings, counters, nullable latencies), with and without
`fsync_after_insert = 1, fsync_part_directory = 1`, alternating, and prints
the median time per run and per insert and their ratio as JSON.

  pip install chdb
  deploy/bench/fsync_bench.py [--rows 1000000] [--batch 100000] [--runs 5]
"""
import argparse
import json
import statistics
import tempfile
import time

from chdb import session

COLUMNS = """day Date, event_time DateTime, timestamp_ms UInt64, request_id String,
  business_line LowCardinality(String), model_name LowCardinality(String), model_version LowCardinality(String),
  input_tokens UInt32, output_tokens UInt32, total_latency_ms Float64, error_code Int32,
  error_stage Nullable(String), user_id_hash Nullable(String), tenant Nullable(String), session_id Nullable(String),
  request_type Nullable(String), queue_wait_ms Nullable(Float64), prefill_time_ms Nullable(Float64),
  decode_time_ms Nullable(Float64), ttft_ms Nullable(Float64), tpot_ms Nullable(Float64), gpu_id Nullable(UInt32),
  batch_size Nullable(UInt32), cache_hit Nullable(UInt8), cache_prefix_tokens Nullable(UInt32),
  gpu_mem_peak_mb Nullable(Float64), truncated Nullable(UInt8), schema_version UInt8, kafka_topic String,
  kafka_partition UInt16, kafka_offset UInt64, ingested_at DateTime"""

ROW = """toDate('2026-12-01'), toDateTime('2026-12-01 00:00:00') + intDiv(number, 12), 1796000000000 + number,
  concat('req-', hex(sipHash64(number))), ['search', 'ads', 'support'][number % 3 + 1], 'llama-3.1-70b', ['v1', 'v2'][number % 2 + 1],
  number % 8000, number % 900, (number % 5000) / 3.0, 0, NULL, concat('k1:', hex(sipHash64(number % 9999))), 'acme',
  concat('s-', toString(number % 777)), 'chat', (number % 50) / 7.0, (number % 400) / 3.0, (number % 3000) / 3.0,
  (number % 450) / 3.0, (number % 40) / 3.0, number % 64, number % 32 + 1, number % 2, number % 1024, 40000.0, 0, 1,
  'inference-events', number % 8, number, toDateTime('2026-12-01 00:00:00')"""


def run(sess, table, rows, batch, fsync):
    settings = "\nSETTINGS fsync_after_insert = 1, fsync_part_directory = 1" if fsync else ""
    sess.query(f"DROP TABLE IF EXISTS b.{table}")
    sess.query(f"CREATE TABLE b.{table} ({COLUMNS}) ENGINE = ReplacingMergeTree() PARTITION BY day "
               f"ORDER BY (business_line, model_name, model_version, event_time, request_id){settings}")
    started = time.perf_counter()
    for first in range(0, rows, batch):
        sess.query(f"INSERT INTO b.{table} SELECT {ROW} FROM numbers({first}, {batch})")
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
