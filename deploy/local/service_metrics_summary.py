#!/usr/bin/env python3
"""The live service metrics a run of inferlog-ingest exported, as the local
Prometheus scraped them, beside the same figures from ClickHouse's rows:
per business line, requests (the counter against count()) and p99 TTFT
(histogram_quantile over the scraped buckets against quantileExact). Used
by deploy/local/demo.sh right after ingest exits (the last minute of
scrapes holds its final counters).

usage: service_metrics_summary.py PROMETHEUS_URL CLICKHOUSE_URL TABLE
"""
import json
import sys
import urllib.parse
import urllib.request

prometheus, clickhouse, table = sys.argv[1:4]


def promql(expr):
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as r:
        data = json.load(r)["data"]["result"]
    return {s["metric"].get("business_line", ""): float(s["value"][1]) for s in data}


def ch(sql):
    req = urllib.request.Request(clickhouse, data=sql.encode())
    with urllib.request.urlopen(req, timeout=60) as r:
        return [line.split("\t") for line in r.read().decode().splitlines()]


sel = '{component="ingest",stack="local"}'
requests = promql(f"sum by (business_line) (last_over_time(inferlog_service_requests_total{sel}[1m]))")
ttft = promql("histogram_quantile(0.99, sum by (business_line, le) "
              f"(last_over_time(inferlog_service_time_to_first_token_seconds_bucket{sel}[1m])))")
exact = {r[0]: (int(r[1]), float(r[2])) for r in ch(
    f"SELECT business_line, count(), quantileExact(0.99)(ttft_ms) FROM {table} GROUP BY business_line FORMAT TSV")}
print(f"  {'business line':<16}{'requests (Prometheus)':>23}{'requests (ClickHouse)':>23}{'p99 TTFT (histogram)':>22}{'p99 TTFT (exact)':>18}")
for line in sorted(exact):
    n, p99 = exact[line]
    scraped = requests.get(line)
    q = ttft.get(line)
    print(f"  {line:<16}{'-' if scraped is None else int(scraped):>23}{n:>23}"
          f"{'-' if q is None else f'{q * 1000:.0f} ms':>22}{p99:>15.0f} ms")
if not requests:
    print("  (Prometheus holds no scrape of this run: is it up? deploy/local/services.sh status)")
