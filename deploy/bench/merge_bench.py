#!/usr/bin/env python3
"""inferlog_merge benchmark: a year of daily histograms merged in Postgres,
the p99 per business line, with the state function of migration 0002
(`before`: a new array of the union per row) and of migration 0012
(`after`: added in place), run alternately in the same minutes.

The rows are `--rows-per-day` histograms a day for `--days` days, six
business lines, each histogram `--buckets` wide at a random offset (the
width of a day's TTFT histogram of one group: about 100-300 buckets of
1%). Prints each run's seconds, the medians and their ratio, and checks
both answer the same.

usage: deploy/bench/merge_bench.py [--days 365] [--rows-per-day 1260] [--buckets 200] [--runs 3]
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
    ap.add_argument("--rows-per-day", type=int, default=1260)
    ap.add_argument("--buckets", type=int, default=200)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    schema = f"merge_bench_{os.getpid()}"
    subprocess.run(["psql", url, "-XAtq", "-c", f'CREATE SCHEMA "{schema}"'], check=True)
    try:
        quantile = re.search(r"CREATE FUNCTION inferlog_quantile\(.*?\n\$\$;",
                             open(os.path.join(repo, "store", "migrations", "0002_histograms.sql")).read(), re.S).group(0)
        psql(schema, quantile)
        for variant, path in [("before", "0002_histograms.sql"), ("after", "0012_hist_add_in_place.sql")]:
            psql(schema, function(path, f"hist_add_{variant}"))
            psql(schema, f"CREATE AGGREGATE merge_{variant}(bigint[]) (SFUNC = hist_add_{variant}, STYPE = bigint[])")
        rows = args.days * args.rows_per_day
        t0 = time.monotonic()
        psql(schema, f"""CREATE TABLE h AS SELECT n / {args.rows_per_day} AS day, 'line' || (n % 6) AS business_line,
            ARRAY[420 + (n::bigint * 7919) % 40, 0]::bigint[] || array(SELECT (random() * 30)::bigint FROM generate_series(1, {args.buckets}) WHERE n >= 0) AS hist
            FROM generate_series(0, {rows - 1}) AS n""")
        print(f"{rows} histograms ({args.days} days x {args.rows_per_day}, {args.buckets} buckets) written in {time.monotonic() - t0:.1f} s")
        times = {"before": [], "after": []}
        answers = {}
        for _ in range(args.runs):
            for variant in times:
                t0 = time.monotonic()
                answers[variant] = psql(schema, f"SELECT business_line, inferlog_quantile(merge_{variant}(hist), 0.99) FROM h GROUP BY 1 ORDER BY 1")
                times[variant].append(time.monotonic() - t0)
        assert answers["before"] == answers["after"], answers
        for variant, ts in times.items():
            print(f"{variant:6}: p99 per business line over {rows} rows: " + ", ".join(f"{t:.2f}" for t in ts) + f" s; median {statistics.median(ts):.2f} s")
        print(f"after / before: {statistics.median(times['after']) / statistics.median(times['before']):.2f}")
    finally:
        subprocess.run(["psql", url, "-XAtq", "-c", f'SET client_min_messages = warning; DROP SCHEMA "{schema}" CASCADE'], check=True)


if __name__ == "__main__":
    main()
