#!/usr/bin/env python3
"""inferlog_merge benchmark: a year's p99 per business line in Postgres,
merged from a year of daily groups (`daily_aggregates`: a row per day ×
line × model × version × input × output bucket) and from a year of
their rollup (`daily_series`: a row per day × line × model × version,
migration 0014), run alternately in the same minutes, with the merge of
the current migrations (0012's in-place state function).

The groups are `--rows-per-day` histograms a day for `--days` days, six
business lines × `--series-per-line` series, each histogram `--buckets`
wide at a random offset (the width of a day's TTFT histogram of one
group: about 100-300 buckets of 1%). The series are those groups merged
per day and series, by the statement's own merge, as the compactor rolls
them up. Prints each run's seconds, the medians and their ratio, and
checks both answer the same.

usage: deploy/bench/merge_bench.py [--days 365] [--rows-per-day 1000] [--buckets 150] [--runs 3]
Needs `deploy/local/services.sh up` (Postgres on 127.0.0.1:5432).
"""
import argparse
import os
import re
import statistics
import subprocess
import time

repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
url = "postgres://postgres@127.0.0.1:5432/inferlog"


def psql(schema, sql):
    out = subprocess.run(["psql", url, "-XAtq", "-v", "ON_ERROR_STOP=1", "-c", f'SET search_path TO "{schema}"; {sql}'],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"merge_bench: psql failed: {out.stderr.strip()}")
    return out.stdout.strip()


def function(path, name):
    """The CREATE [OR REPLACE] FUNCTION inferlog_hist_add … $$; of a migration, renamed to `name`."""
    text = open(os.path.join(repo, "store", "migrations", path)).read()
    body = re.search(r"CREATE (?:OR REPLACE )?FUNCTION inferlog_hist_add\(.*?\n\$\$;", text, re.S).group(0)
    return body.replace("FUNCTION inferlog_hist_add(", f"FUNCTION {name}(")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--days", type=int, default=365)
    ap.add_argument("--rows-per-day", type=int, default=1000)
    ap.add_argument("--series-per-line", type=int, default=7)
    ap.add_argument("--buckets", type=int, default=150)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    schema = f"merge_bench_{os.getpid()}"
    subprocess.run(["psql", url, "-XAtq", "-c", f'CREATE SCHEMA "{schema}"'], check=True)
    try:
        quantile = re.search(r"CREATE FUNCTION inferlog_quantile\(.*?\n\$\$;",
                             open(os.path.join(repo, "store", "migrations", "0002_histograms.sql")).read(), re.S).group(0)
        psql(schema, quantile)
        psql(schema, function("0012_hist_add_in_place.sql", "hist_add"))
        psql(schema, "CREATE AGGREGATE merge(bigint[]) (SFUNC = hist_add, STYPE = bigint[])")
        rows = args.days * args.rows_per_day
        t0 = time.monotonic()
        psql(schema, f"""CREATE TABLE groups AS SELECT n / {args.rows_per_day} AS day, 'line' || (n % 6) AS business_line,
            (n / 6) % {args.series_per_line} AS series,
            ARRAY[420 + (n::bigint * 7919) % 40, 0]::bigint[] || array(SELECT (random() * 30)::bigint FROM generate_series(1, {args.buckets}) WHERE n >= 0) AS hist
            FROM generate_series(0, {rows - 1}) AS n""")
        psql(schema, "CREATE TABLE series AS SELECT day, business_line, series, merge(hist) AS hist FROM groups GROUP BY 1, 2, 3")
        series_rows, width = psql(schema, "SELECT count(*), round(avg(cardinality(hist) - 2)) FROM series").split("|")
        print(f"{rows} group histograms ({args.days} days x {args.rows_per_day}, {args.buckets} buckets) and their "
              f"{series_rows} series ({width} buckets on average) written in {time.monotonic() - t0:.1f} s")
        times = {"groups": [], "series": []}
        answers = {}
        for _ in range(args.runs):
            for table in times:
                t0 = time.monotonic()
                answers[table] = psql(schema, f"SELECT business_line, inferlog_quantile(merge(hist), 0.99) FROM {table} GROUP BY 1 ORDER BY 1")
                times[table].append(time.monotonic() - t0)
        assert answers["groups"] == answers["series"], answers
        for table, ts in times.items():
            print(f"{table:6}: p99 per business line over a year of {table}: " + ", ".join(f"{t:.3f}" for t in ts) +
                  f" s; median {statistics.median(ts):.3f} s")
        print(f"series / groups: {statistics.median(times['series']) / statistics.median(times['groups']):.3f}")
    finally:
        subprocess.run(["psql", url, "-XAtq", "-c", f'SET client_min_messages = warning; DROP SCHEMA "{schema}" CASCADE'], check=True)


if __name__ == "__main__":
    main()
