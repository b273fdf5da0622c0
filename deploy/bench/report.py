#!/usr/bin/env python3
"""The whole pipeline's performance report, on a fixed generated workload.

Runs, one after another on the local stack (`deploy/local/services.sh up`,
release binaries built):

  ingest     deploy/bench/ingest_bench.py: Kafka -> ClickHouse, inferlog-ingest
             vs the Python glue baseline, alternating, medians of --runs
  compactor  deploy/bench/compactor_bench.py: one day of --rows rows from
             ClickHouse to verified Parquet on S3, medians of --runs; Parquet
             size vs the same events as JSON lines
  retention  inferlog-retention audit and enforce --dry-run over a scenario of
             --days compacted days (inferlog-seed-hot + inferlog-compactor),
             wall time and peak RSS, medians of --runs

and prints a short Markdown report (also written to --out, default
.inferlog/bench/report.md) with the raw JSON of each part after it.

  deploy/bench/report.py [--events 200000] [--rows 1000000] [--days 30] [--runs 3]
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.join(ROOT, "target", "release")
BENCH = os.path.join(ROOT, "deploy", "bench")


def run_json(cmd):
    print(f"running {' '.join(os.path.relpath(c, ROOT) if c.startswith(ROOT) else c for c in cmd)}", file=sys.stderr)
    out = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, text=True, cwd=ROOT)
    return json.loads(out.stdout)


def timed(cmd, env):
    """Wall seconds and peak RSS (MB) of one run of cmd; its exit code."""
    started = time.monotonic()
    out = subprocess.run(["/usr/bin/time", "-f", "maxrss_kb=%M"] + cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.monotonic() - started
    rss = int(re.search(r"maxrss_kb=(\d+)", out.stderr).group(1)) / 1024
    return wall, rss, out.returncode, out.stderr


def retention_bench(days, runs):
    """Seeds `days` days of 20,000 rows, compacts them, then times retention."""
    run = f"bench_ret_{uuid.uuid4().hex[:8]}"
    today = datetime.datetime.now(datetime.timezone.utc).date()
    end = today - datetime.timedelta(days=2)
    config = os.path.join(ROOT, "deploy", "local", "inferlog.toml")
    env = dict(os.environ, INFERLOG_CLICKHOUSE__DATABASE="inferlog_test", INFERLOG_CLICKHOUSE__TABLE=f"{run}_logs",
               INFERLOG_POSTGRES__SCHEMA=run, INFERLOG_COLD__URL=f"s3://inferlog-cold/{run}/",
               INFERLOG_COMPACTOR__METRICS_ADDR="", INFERLOG_COMPACTOR__LATENESS="1s",
               INFERLOG_RETENTION__METRICS_ADDR="", RUST_LOG="warn")
    secret = os.path.join(ROOT, ".inferlog", "local", "s3.secret")
    if os.path.exists(secret):
        env["AWS_SECRET_ACCESS_KEY"] = open(secret).read().strip()
    subprocess.run(["curl", "-sS", "--data-binary", "CREATE DATABASE IF NOT EXISTS inferlog_test", "http://127.0.0.1:8123/"], check=True,
                   stdout=subprocess.DEVNULL)
    print(f"seeding {days} days x 20000 rows and compacting them ...", file=sys.stderr)
    subprocess.run([os.path.join(BIN, "inferlog-seed-hot"), "--table", f"{run}_logs", "--count", str(days * 20000), "--days", str(days),
                    "--end-day", end.isoformat(), "--database", "inferlog_test"], check=True, stdout=subprocess.DEVNULL, env=env)
    subprocess.run([os.path.join(BIN, "inferlog-compactor"), "--config", config, "--once"], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = {"days": days, "rows": days * 20000, "audit_s": [], "audit_rss_mb": [], "dry_run_s": [], "dry_run_rss_mb": []}
    for _ in range(runs):
        wall, rss, _, _ = timed([os.path.join(BIN, "inferlog-retention"), "--config", config, "audit"], env)
        results["audit_s"].append(round(wall, 2))
        results["audit_rss_mb"].append(round(rss, 1))
        wall, rss, rc, err = timed([os.path.join(BIN, "inferlog-retention"), "--config", config, "enforce", "--dry-run"], env)
        if rc not in (0, 1):
            sys.exit(f"retention enforce --dry-run failed ({rc}):\n{err[-2000:]}")
        results["dry_run_s"].append(round(wall, 2))
        results["dry_run_rss_mb"].append(round(rss, 1))
    for table in (f"{run}_logs", f"{run}_logs_rejects", f"{run}_logs_offsets"):
        subprocess.run(["curl", "-sS", "--data-binary", f"DROP TABLE IF EXISTS inferlog_test.{table}", "http://127.0.0.1:8123/"], check=True)
    subprocess.run(["psql", "postgres://postgres@127.0.0.1:5432/inferlog", "-qc", f"DROP SCHEMA IF EXISTS {run} CASCADE"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--days", type=int, default=30)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--out", default=os.path.join(ROOT, ".inferlog", "bench", "report.md"))
    args = p.parse_args()
    for b in ("inferlog-ingest", "inferlog-compactor", "inferlog-retention", "inferlog-schema", "inferlog-seed-hot"):
        if not os.path.exists(os.path.join(BIN, b)):
            sys.exit(f"{b} is missing: cargo build --release --bins")

    ingest = run_json([sys.executable, os.path.join(BENCH, "ingest_bench.py"), "--events", str(args.events), "--runs", str(args.runs)])
    compactor = run_json([sys.executable, os.path.join(BENCH, "compactor_bench.py"), "--rows", str(args.rows), "--runs", str(args.runs)])
    retention = retention_bench(args.days, args.runs)

    med = statistics.median
    lines = [
        f"# inferlog performance report ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {os.cpu_count()} cores)",
        "",
        f"Medians of {args.runs} runs; command: `deploy/bench/report.py --events {args.events} --rows {args.rows} --days {args.days} --runs {args.runs}`.",
        "",
        "| stage | figure | baseline / goal |",
        "|---|---|---|",
        f"| ingest, Kafka -> ClickHouse ({args.events:,} events) | {ingest['inferlog_events_per_s']:,} events/s, peak RSS {ingest['inferlog_peak_rss_mb']} MB "
        f"| Python glue {ingest['glue_events_per_s']:,} events/s: **{ingest['ratio']}x** (goal 2x) |",
        f"| compactor, ClickHouse -> verified Parquet on S3 ({args.rows:,} rows, one day) | {compactor['median_rows_per_s_to_verified_parquet']:,} rows/s "
        f"(archive {compactor['median_archive_s']} s, verify {compactor['median_verify_s']} s), whole day {compactor['median_wall_s']} s, "
        f"peak RSS {compactor['max_peak_rss_mb']} MB | goal 500k rows/s, RSS < 300 MB |",
        f"| Parquet size | {compactor['parquet_bytes'] / 1e6:.1f} MB vs {compactor['json_lines_bytes'] / 1e6:.1f} MB JSON lines: "
        f"**1/{compactor['json_to_parquet_ratio']}** | goal <= 1/8 |",
        f"| retention audit ({args.days} compacted days) | {med(retention['audit_s'])} s, peak RSS {max(retention['audit_rss_mb'])} MB | |",
        f"| retention enforce --dry-run ({args.days} days) | {med(retention['dry_run_s'])} s, peak RSS {max(retention['dry_run_rss_mb'])} MB | |",
        "",
        "## raw",
        "",
        "```json",
        json.dumps({"ingest": ingest, "compactor": compactor, "retention": retention}, indent=2),
        "```",
    ]
    report = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(report)
    sys.stdout.write(report)


if __name__ == "__main__":
    main()
