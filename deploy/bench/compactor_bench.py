#!/usr/bin/env python3
"""Compactor benchmark: one UTC day of N generated rows in ClickHouse to
verified Parquet on the S3 server (plus aggregates in Postgres), timed by
stage from the compactor's own log, with peak RSS and the Parquet size
against the same events as JSON lines. Medians of several runs; each run
archives the same day into a fresh prefix and Postgres schema.

Every run also times the reference: ClickHouse's own export of the same
day, `SELECT * ... WHERE day = D FORMAT RowBinary` through clickhouse-client
into a local file (no Parquet, no S3, no verification).
`archive_verify_of_export` is (archive + verify) / export: the issue's
goal is at most 1.25.

usage: deploy/bench/compactor_bench.py [--rows 1000000] [--runs 3] [--sampling] [--workers N [--units U]]
--sampling archives with [sampling] enabled (its defaults): the day has no
history, so the static thresholds apply. --workers N (N >= 1 with --units)
archives the day in units of at most rows / U rows (U default 8; whole
series and pieces of series, so at least U units) with N
compactors: the first plans the day, N - 1 more start once it has, and each
prints how many units it verified and its time in them; the serial part
(settle, planning, the day's fold and aggregates) is the planner's. Needs `deploy/local/services.sh up` and release binaries (cargo build --release --bins).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
bindir = os.environ.get("INFERLOG_BIN_DIR", os.path.join(repo, "target", "release"))


def clickhouse(sql):
    return subprocess.run(["curl", "-sS", "--fail-with-body", "http://127.0.0.1:8123/", "--data-binary", sql],
                          check=True, capture_output=True, text=True).stdout.strip()


def psql(schema, sql):
    return subprocess.run(["psql", "postgres://postgres@127.0.0.1:5432/inferlog", "-XAtq", "-c",
                           f'SET search_path TO "{schema}"; {sql}'], check=True, capture_output=True, text=True).stdout.strip()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sampling", action="store_true", help="archive with [sampling] enabled")
    parser.add_argument("--workers", type=int, default=0, help="compactors sharing the day's units (0: the day whole, one compactor)")
    parser.add_argument("--units", type=int, default=8, help="units the day is planned in with --workers")
    args = parser.parse_args()
    stamp = int(time.time())
    table = f"bench_compactor_{stamp}"
    day_number = int(time.time() // 86400) - 2  # closed, and inside the hot retention: nothing is released
    day = time.strftime("%Y-%m-%d", time.gmtime(day_number * 86400))
    print(f"seeding {args.rows} rows of {day} into inferlog_test.{table} ...", file=sys.stderr)
    seeded = subprocess.run([os.path.join(bindir, "inferlog-seed-hot"), "--database", "inferlog_test", "--table", table,
                             "--count", str(args.rows), "--days", "1", "--end-day", day, "--seed", "7"],
                            check=True, capture_output=True, text=True).stdout
    json_bytes = int(re.search(r"json_bytes=(\d+)", seeded).group(1))
    runs = []
    for i in range(args.runs):
        schema = f"bench_{stamp}_{i}"
        with tempfile.TemporaryDirectory() as tmp:
            config = os.path.join(tmp, "c.toml")
            with open(config, "w") as f:
                f.write(f'[clickhouse]\ndatabase = "inferlog_test"\ntable = "{table}"\n'
                        f'[postgres]\nschema = "{schema}"\n'
                        f'[cold]\nurl = "s3://inferlog-cold/bench-{stamp}-{i}/"\nendpoint = "http://127.0.0.1:9303"\n'
                        f'allow_http = true\naccess_key_id = "inferlog"\n'
                        f'[compactor]\nmetrics_addr = ""\n')
            env = dict(os.environ, AWS_SECRET_ACCESS_KEY="inferlog-local", RUST_LOG="info")
            if args.sampling:
                env["INFERLOG_SAMPLING__ENABLED"] = "true"
            if os.environ.get("BENCH_ZSTD_LEVEL"):
                env["INFERLOG_COLD__ZSTD_LEVEL"] = os.environ["BENCH_ZSTD_LEVEL"]
            if args.workers:
                env["INFERLOG_COMPACTOR__UNIT_MAX_ROWS"] = str(-(-args.rows // args.units))
            command = ["/usr/bin/time", "-f", "maxrss_kb=%M cpu_s=%U+%S", os.path.join(bindir, "inferlog-compactor"), "--config", config, "--day", day]
            started = time.monotonic()
            planner = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            helpers = []
            if args.workers > 1:
                deadline = time.monotonic() + 300
                def planned():  # the schema and its tables appear with the planner's migrations
                    try:
                        return psql(schema, "SELECT count(*) FROM compactor_units") not in ("", "0")
                    except subprocess.CalledProcessError:
                        return False
                while not planned() and planner.poll() is None:
                    if time.monotonic() > deadline:
                        sys.exit("the day was not planned in units within 300 s")
                    time.sleep(0.05)
                helpers = [subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                           for _ in range(args.workers - 1)]
            _, err = planner.communicate()
            wall = time.monotonic() - started
            out = subprocess.CompletedProcess(command, planner.returncode, "", err)
            if out.returncode != 0:
                sys.exit(f"compactor failed:\n{out.stderr[-3000:]}")
            per_worker = []
            for p in [out] + [subprocess.CompletedProcess(command, h.wait(), "", h.communicate()[1]) for h in helpers]:
                units = [int(m.group(1)) for m in re.finditer(r'stage="unit".*?elapsed_ms=(\d+)', p.stderr)]
                per_worker.append({"units": len(units), "unit_s": round(sum(units) / 1000, 2),
                                   "cpu_s": round(sum(map(float, re.search(r"cpu_s=([\d.]+)\+([\d.]+)", p.stderr).groups())), 2)})
            stage = {m.group(1): int(m.group(2)) for m in re.finditer(r'stage="(\w+)".*?elapsed_ms=(\d+)', out.stderr)}
            rss = int(re.search(r"maxrss_kb=(\d+)", out.stderr).group(1)) / 1024
            user, system = map(float, re.search(r"cpu_s=([\d.]+)\+([\d.]+)", out.stderr).groups())
            parquet_bytes = int(psql(schema, "SELECT sum(bytes) FROM cold_manifest"))
            rows, kept = map(int, psql(schema, "SELECT sum(represented_rows), sum(rows) FROM cold_manifest").split("|"))
            assert rows == args.rows, (rows, args.rows)
            to_verified = (stage["archive"] + stage.get("verify", 0)) / 1000
            # A day in units: ClickHouse's count of the day's repeated prompts (part of its archive stage).
            repeats = re.search(r"repeated prompts counted over the day.*?elapsed_ms=(\d+)|elapsed_ms=(\d+).*?repeated prompts counted", out.stderr)
            repeats_s = int(next(g for g in repeats.groups() if g)) / 1000 if repeats else 0
            runs.append({"wall_s": round(wall, 2), "settle_s": stage.get("settle", 0) / 1000, "archive_s": stage["archive"] / 1000, "verify_s": stage.get("verify", 0) / 1000,
                         "repeats_s": repeats_s,
                         "aggregate_s": stage["aggregate"] / 1000, "rows_per_s_to_verified": round(args.rows / to_verified),
                         "peak_rss_mb": round(rss, 1), "compactor_cpu_s": round(user + system, 2), "parquet_bytes": parquet_bytes, "rows_archived": kept,
                         "workers": per_worker})
            with tempfile.TemporaryFile() as sink:
                started = time.monotonic()
                subprocess.run(["clickhouse-client", "--query",
                                f"SELECT * FROM inferlog_test.{table} WHERE day = '{day}' FORMAT RowBinary"],
                               stdout=sink, check=True)
                runs[-1]["export_s"] = round(time.monotonic() - started, 2)
            runs[-1]["archive_verify_of_export"] = round(to_verified / runs[-1]["export_s"], 2)
            print(json.dumps(runs[-1]), file=sys.stderr)
    median = lambda k: statistics.median(r[k] for r in runs)
    report = {
        "rows": args.rows, "runs": len(runs), "sampling": args.sampling, "workers": args.workers,
        "units": args.units if args.workers else 1, "rows_archived": runs[0]["rows_archived"],
        "median_rows_per_s_to_verified_parquet": median("rows_per_s_to_verified"),
        "median_settle_s": median("settle_s"), "median_archive_s": median("archive_s"), "median_verify_s": median("verify_s"),
        "median_aggregate_s": median("aggregate_s"), "median_wall_s": median("wall_s"),
        "median_export_s": median("export_s"), "median_archive_verify_of_export": median("archive_verify_of_export"),
        "median_compactor_cpu_s": median("compactor_cpu_s"),
        "max_peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
        "parquet_bytes": runs[0]["parquet_bytes"], "json_lines_bytes": json_bytes,
        "json_to_parquet_ratio": round(json_bytes / runs[0]["parquet_bytes"], 2),
    }
    # The seeded table and the rejects log and replay log created beside it:
    # tables left behind cost ClickHouse idle CPU in every later run.
    for name in (table, f"{table}_rejects", f"{table}_offsets"):
        clickhouse(f"DROP TABLE IF EXISTS inferlog_test.{name}")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
