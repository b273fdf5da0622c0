#!/usr/bin/env python3
"""Generates inferlog's Grafana dashboards and their panel list.

In: nothing (the panels are defined here, built with the Grafana
Foundation SDK, `grafana-foundation-sdk` on PyPI, pinned in
deploy/grafana/requirements.txt). Out: `dashboards/service.json`,
`dashboards/pipeline.json`, `dashboards/history.json` (the dashboard
schema of Grafana 11.6, ready for file provisioning) and the panel table
of `README.md`.

    python3 deploy/grafana/dashboards.py          # writes the files
    python3 deploy/grafana/dashboards.py --check  # exits 1 if they differ

Every board is round-tripped through the SDK's own dashboard model
(`Dashboard.from_json`) before it is written: a field the schema does not
know fails the generation. The boards' queries are run on the real
services by tests/tests/service_metrics.rs (PromQL) and
tests/tests/report.rs (SQL).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.common import BigValueGraphMode

HERE = Path(__file__).resolve().parent

# The datasources deploy/grafana/provisioning/datasources/inferlog.yml
# provisions, by uid.
PROMETHEUS = model.DataSourceRef(type_val="prometheus", uid="inferlog-prometheus")
CLICKHOUSE = model.DataSourceRef(type_val="grafana-clickhouse-datasource", uid="inferlog-clickhouse")
POSTGRES = model.DataSourceRef(type_val="grafana-postgresql-datasource", uid="inferlog-postgres")

# The hot table as deploy/inferlog.example.toml names it
# ([clickhouse] database and table).
HOT = "inferlog.inference_logs"

# The input and output buckets of inferlog-schema (InputBucket and
# OutputBucket in schema/src/event.rs): (lower bound, name). The tests
# check these against the schema's.
INPUT_BUCKETS = [(0, "0-1k"), (1024, "1k-2k"), (2048, "2k-4k"), (4096, "4k-8k"), (8192, "8k-32k"), (32768, "32k+")]
OUTPUT_BUCKETS = [(0, "0-128"), (128, "128-512"), (512, "512-2k"), (2048, "2k-8k"), (8192, "8k+")]


def bucket_sql(column: str, buckets: list[tuple[int, str]]) -> str:
    """A bucket's name from its lower bounds, as multiIf (ClickHouse 18.16 and current)."""
    arms = ", ".join(f"{column} < {upper}, '{name}'" for (_, name), (upper, _) in zip(buckets, buckets[1:]))
    return f"multiIf({arms}, '{buckets[-1][1]}')"


class SqlQuery(cogbuilder.Builder[cogvariants.Dataquery]):
    """A raw SQL target of the ClickHouse or the PostgreSQL datasource
    (the SDK has builders for neither): what both plugins store."""

    class _Query(cogvariants.Dataquery):
        def __init__(self, payload: dict[str, object]) -> None:
            self.payload = payload

        def to_json(self) -> dict[str, object]:
            return self.payload

    def __init__(self, source: model.DataSourceRef, sql: str, ref_id: str = "A", time_series: bool = False) -> None:
        if source is CLICKHOUSE:
            self.payload: dict[str, object] = {
                "datasource": source.to_json(),
                "editorType": "sql",
                "format": 0 if time_series else 1,
                "queryType": "timeseries" if time_series else "table",
                "rawSql": sql,
                "refId": ref_id,
            }
        else:
            self.payload = {
                "datasource": source.to_json(),
                "editorMode": "code",
                "format": "time_series" if time_series else "table",
                "rawQuery": True,
                "rawSql": sql,
                "refId": ref_id,
            }

    def build(self) -> cogvariants.Dataquery:
        return SqlQuery._Query(self.payload)


def promql(expr: str, legend: str, ref_id: str = "A") -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id).datasource(PROMETHEUS)


# The service metrics' labels the boards filter on.
SEL = 'business_line=~"$business_line",model_version=~"$model_version"'


def quantiles(metric: str) -> list[prometheus.Dataquery]:
    return [
        promql(
            f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{{{SEL}}}[$__rate_interval])))",
            f"p{int(q * 100)}",
            ref,
        )
        for q, ref in ((0.5, "A"), (0.95, "B"), (0.99, "C"))
    ]


def with_targets(panel, title: str, description: str, targets: list, height: int, width: int):
    """`panel` with its title, description, size and queries."""
    panel = panel.title(title).description(description).height(height).span(width)
    for t in targets:
        panel = panel.with_target(t)
    return panel


def ts(title: str, description: str, targets: list, unit: str, width: int = 12) -> timeseries.Panel:
    return with_targets(timeseries.Panel().unit(unit), title, description, targets, 8, width)


def tab(title: str, description: str, targets: list, width: int = 12) -> table.Panel:
    return with_targets(table.Panel(), title, description, targets, 8, width)


def single(title: str, description: str, targets: list, unit: str, width: int = 6) -> stat.Panel:
    return with_targets(stat.Panel().unit(unit).graph_mode(BigValueGraphMode.NONE), title, description, targets, 4, width)


def variable(name: str, label: str) -> db.QueryVariable:
    return (
        db.QueryVariable(name)
        .label(label)
        .datasource(PROMETHEUS)
        .query(f"label_values(inferlog_service_requests_total, {name})")
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
    )


def service() -> db.Dashboard:
    """The live service metrics (ingest's `[service_metrics]`), per business line and version."""
    rows = [
        (
            "Traffic",
            [
                ts(
                    "Requests per second by business line",
                    "Stored requests per second, by business line: is traffic where it should be?",
                    [promql(f"sum by (business_line) (rate(inferlog_service_requests_total{{{SEL}}}[$__rate_interval]))", "{{business_line}}")],
                    "reqps",
                ),
                ts(
                    "Success rate by business line",
                    "Share of requests with error code 0: which line is failing?",
                    [
                        promql(
                            f'sum by (business_line) (rate(inferlog_service_requests_total{{status="ok",{SEL}}}[$__rate_interval])) '
                            f"/ sum by (business_line) (rate(inferlog_service_requests_total{{{SEL}}}[$__rate_interval]))",
                            "{{business_line}}",
                        )
                    ],
                    "percentunit",
                ),
                tab(
                    "Requests in the range by business line",
                    "Requests over the whole time range, per line (the hot table's count for the same range).",
                    [promql(f"sum by (business_line) (increase(inferlog_service_requests_total{{{SEL}}}[$__range]))", "{{business_line}}").instant()],
                ),
                ts(
                    "Tokens per second, input and output",
                    "Input tokens (and their cached prefix) and output tokens per second: what the fleet serves.",
                    [promql(f"sum by (type) (rate(inferlog_service_tokens_total{{{SEL}}}[$__rate_interval]))", "{{type}}")],
                    "short",
                ),
            ],
        ),
        (
            "Latency",
            [
                ts("Time to first token", "TTFT percentiles from the histogram: what a user waits before text.", quantiles("inferlog_service_time_to_first_token_seconds"), "s", 8),
                ts("Time per output token", "TPOT percentiles: decode speed as a user reads it.", quantiles("inferlog_service_time_per_output_token_seconds"), "s", 8),
                ts("Request duration", "Total latency percentiles.", quantiles("inferlog_service_request_duration_seconds"), "s", 8),
                ts("Queue wait", "Time requests waited for a batch slot: capacity running out shows here first.", quantiles("inferlog_service_queue_seconds"), "s", 12),
                ts(
                    "GPU memory peak by model (hot tier)",
                    "Highest GPU memory a request of each model reported, per hour, from the hot table (ingest exports no GPU gauge).",
                    [
                        SqlQuery(
                            CLICKHOUSE,
                            f"SELECT toStartOfHour(event_time) AS time, model_name, max(gpu_mem_peak_mb) AS peak_mb FROM {HOT} "
                            "WHERE $__dateFilter(day) AND $__timeFilter(event_time) AND isNotNull(gpu_mem_peak_mb) "
                            "GROUP BY time, model_name ORDER BY time, model_name",
                            time_series=True,
                        )
                    ],
                    "decmbytes",
                ),
            ],
        ),
        (
            "Errors and objectives",
            [
                ts(
                    "Errors per second by code",
                    "Failed requests by error code (the names are in inferlog-report errors).",
                    [promql(f'sum by (error_code) (rate(inferlog_service_requests_total{{status="error",{SEL}}}[$__rate_interval]))', "{{error_code}}")],
                    "reqps",
                ),
                ts(
                    "Success budget burn rate (1 h)",
                    "Error share over the last hour against the budget (1 - objective): 14.4 pages (P0 InferenceSuccessBudgetBurnFast).",
                    [promql('business_line:inferlog_slo_errors:ratio_rate1h{business_line=~"$business_line"} / on() group_left() (1 - inferlog:slo_objective:success)', "{{business_line}}")],
                    "short",
                    6,
                ),
                ts(
                    "TTFT budget burn rate (1 h)",
                    "Share over the TTFT bound in the last hour against its budget: 14.4 pages (P1 InferenceTTFTBudgetBurnFast).",
                    [promql('business_line:inferlog_slo_ttft_slow:ratio_rate1h{business_line=~"$business_line"} / on() group_left() (1 - inferlog:slo_objective:ttft)', "{{business_line}}")],
                    "short",
                    6,
                ),
                tab(
                    "SLO alerts firing (P0, P1)",
                    "The burn-rate alerts of deploy/prometheus/slo.rules.yml now firing, by line.",
                    [promql('ALERTS{alertstate="firing",severity=~"P0|P1",slo=~"success|ttft"}', "{{alertname}} {{business_line}}").instant()],
                ),
            ],
        ),
    ]
    return board("inferlog-service", "inferlog / Service", "Live service metrics: traffic, latency, tokens, errors and SLO burn, per business line and version.", rows, variables=True)


def pipeline() -> db.Dashboard:
    """The daemons' own metrics: is inferlog keeping up, losing nothing, deleting on time?"""
    rows = [
        (
            "Ingest",
            [
                ts("Consumer lag per partition", "Messages behind each partition's high watermark.", [promql("sum by (topic, partition) (inferlog_ingest_consumer_lag)", "{{topic}}/{{partition}}")], "short"),
                ts(
                    "Messages and rows per second",
                    "Messages consumed and rows inserted into the hot table.",
                    [
                        promql("sum by (topic) (rate(inferlog_ingest_messages_total[$__rate_interval]))", "consumed {{topic}}"),
                        promql("sum(rate(inferlog_ingest_rows_inserted_total[$__rate_interval]))", "inserted", "B"),
                    ],
                    "short",
                ),
                ts(
                    "Rejects by reason and DLQ rate",
                    "Messages rejected per second, by reason code, and what reached the DLQ.",
                    [
                        promql("sum by (reason) (rate(inferlog_ingest_rejects_total[$__rate_interval]))", "{{reason}}"),
                        promql("sum(rate(inferlog_ingest_dlq_produced_total[$__rate_interval]))", "to the DLQ", "B"),
                    ],
                    "short",
                ),
                ts(
                    "Insert latency and errors",
                    "p99 of a batch's flush (insert, log, commit) and failed insert attempts per second (each is retried).",
                    [
                        promql("histogram_quantile(0.99, sum by (le) (rate(inferlog_ingest_flush_seconds_bucket[$__rate_interval])))", "flush p99"),
                        promql("sum(rate(inferlog_ingest_insert_errors_total[$__rate_interval]))", "insert errors/s", "B"),
                    ],
                    "s",
                ),
                ts(
                    "Replay-filter skips",
                    "Offsets skipped as already stored after a restart or rebalance, by kind: the exactly-once filter at work.",
                    [promql("sum by (kind) (rate(inferlog_ingest_duplicates_total[$__rate_interval]))", "{{kind}}")],
                    "short",
                ),
            ],
        ),
        (
            "Compactor and retention",
            [
                ts(
                    "Compactor days pending and their states",
                    "Closed days not yet archived, and days reaching each state per hour.",
                    [
                        promql("max(inferlog_compactor_days_pending)", "pending"),
                        promql("sum by (state) (increase(inferlog_compactor_days_total[1h]))", "{{state}}", "B"),
                    ],
                    "short",
                ),
                single(
                    "Archive verification failures",
                    "Archives whose read-back did not match the hot day (never released while this grows).",
                    [promql("sum(inferlog_compactor_verification_failures_total)", "failures")],
                    "short",
                ),
                single(
                    "Retention audit violations",
                    "What the last audit found past its policy, by cause (0 when clean).",
                    [promql("sum by (cause) (inferlog_retention_audit_violations)", "{{cause}}")],
                    "short",
                ),
                single(
                    "Since retention last succeeded",
                    "Time since the last clean enforcement pass.",
                    [promql("time() - max(inferlog_retention_last_success_timestamp_seconds)", "since")],
                    "s",
                ),
                ts(
                    "Budget use by business line",
                    "Share of the month's budget spent through the last closed day, and the month-end forecast.",
                    [
                        promql("max by (business_line) (inferlog_budget_used_ratio)", "used {{business_line}}"),
                        promql("max by (business_line) (inferlog_budget_forecast_ratio)", "forecast {{business_line}}", "B"),
                    ],
                    "percentunit",
                ),
            ],
        ),
    ]
    return board("inferlog-pipeline", "inferlog / Pipeline", "The daemons' own metrics: lag, rejects, inserts, the replay filter, the compactor, retention and budgets.", rows)


# The history board's SQL: the hot days from ClickHouse, the aggregates
# from Postgres, over the dashboard's range (whole UTC days).
SLOW_GROUPS = (
    f"SELECT business_line, {bucket_sql('input_tokens', INPUT_BUCKETS)} AS input_bucket, "
    f"{bucket_sql('output_tokens', OUTPUT_BUCKETS)} AS output_bucket, count() AS requests, "
    f"quantileExact(0.99)(total_latency_ms) AS total_p99_ms FROM {HOT} FINAL WHERE $__dateFilter(day) "
    "GROUP BY business_line, input_bucket, output_bucket ORDER BY total_p99_ms DESC"
)
ERRORS = (
    f"SELECT error_code, ifNull(error_stage, '') AS error_stage, count() AS requests FROM {HOT} FINAL "
    "WHERE $__dateFilter(day) AND error_code != 0 GROUP BY error_code, error_stage ORDER BY requests DESC, error_code, error_stage"
)
COST = (
    "SELECT business_line, sum(requests) AS requests, sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens, "
    "sum(cost_usd) AS cost_usd FROM daily_aggregates WHERE $__timeFilter(day) GROUP BY business_line ORDER BY cost_usd DESC, business_line"
)
HOURS = (
    "SELECT hour AS time, sum(requests) AS requests, sum(input_tokens + output_tokens) AS tokens FROM hourly_aggregates "
    "WHERE $__timeFilter(hour) GROUP BY hour ORDER BY hour"
)


def history() -> db.Dashboard:
    """inferlog-report's questions over ranges longer than Prometheus keeps."""
    rows = [
        (
            "Hot days (ClickHouse)",
            [
                tab(
                    "Slow groups: p99 by input × output bucket",
                    "Requests and p99 total latency per business line, input and output bucket (inferlog-report latency), slowest first.",
                    [SqlQuery(CLICKHOUSE, SLOW_GROUPS)],
                    24,
                ),
                tab("Errors by code and stage", "Failed requests by error code and the stage that failed (inferlog-report errors).", [SqlQuery(CLICKHOUSE, ERRORS)]),
            ],
        ),
        (
            "Aggregates (Postgres)",
            [
                tab(
                    "Cost and tokens by business line",
                    "Requests, tokens and cost per line from the daily aggregates, highest cost first (inferlog-report cost).",
                    [SqlQuery(POSTGRES, COST)],
                ),
                ts(
                    "Requests and tokens per hour",
                    "Hourly load from the hourly aggregates (inferlog-report capacity).",
                    [SqlQuery(POSTGRES, HOURS, time_series=True)],
                    "short",
                    24,
                ),
            ],
        ),
    ]
    return board("inferlog-history", "inferlog / History", "The report's questions for ranges longer than Prometheus keeps: hot days from ClickHouse, aggregates from Postgres.", rows, time=("now-7d", "now"))


def board(uid: str, title: str, description: str, rows: list, variables: bool = False, time: tuple[str, str] = ("now-6h", "now")) -> db.Dashboard:
    d = db.Dashboard(title).uid(uid).description(description).tags(["inferlog"]).timezone("utc").time(*time).refresh("1m" if time[0] == "now-6h" else "")
    if variables:
        d = d.with_variable(variable("business_line", "Business line")).with_variable(variable("model_version", "Model version"))
    for name, panels in rows:
        d = d.with_row(db.Row(name))
        for p in panels:
            d = d.with_panel(p)
    return d


BOARDS = {"service": service, "pipeline": pipeline, "history": history}


def render(builder: db.Dashboard) -> str:
    built = builder.build()
    data = json.loads(json.dumps(built, cls=JSONEncoder))
    # The schema check: the SDK's model reads the board back field for field.
    again = json.loads(json.dumps(model.Dashboard.from_json(data), cls=JSONEncoder))
    if again != data:
        raise SystemExit(f"{data.get('uid')}: the dashboard model does not read its own JSON back")
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def readme(boards: dict[str, str]) -> str:
    lines = [
        "# Grafana dashboards",
        "",
        "Generated by `deploy/grafana/dashboards.py` (the Grafana Foundation SDK); do not edit",
        "the JSON or the table below by hand: change the script and run it. Import the boards",
        "with `provisioning/` (docs/operations.md, 'Grafana dashboards'): the datasources have the",
        "uids the boards name (`inferlog-prometheus`, `inferlog-clickhouse`, `inferlog-postgres`).",
        "The tests run every query below on the real services: the PromQL in",
        "tests/tests/service_metrics.rs, the SQL in tests/tests/report.rs (on ClickHouse 18.16,",
        "current ClickHouse through chdb, and Postgres).",
        "",
    ]
    for name, text in boards.items():
        data = json.loads(text)
        lines += [f"## {data['title']} (`dashboards/{name}.json`)", "", data["description"], "", "| panel | what it answers | query |", "|---|---|---|"]
        for panel in data["panels"]:
            if panel.get("type") == "row":
                continue
            queries = "<br>".join(f"`{(t.get('expr') or t.get('rawSql')).replace('|', '&#124;')}`" for t in panel.get("targets", []))
            lines.append(f"| {panel['title']} | {panel['description']} | {queries} |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    check = "--check" in sys.argv[1:]
    outputs: dict[Path, str] = {}
    boards = {name: render(build()) for name, build in BOARDS.items()}
    for name, text in boards.items():
        outputs[HERE / "dashboards" / f"{name}.json"] = text
    outputs[HERE / "README.md"] = readme(boards)
    stale = [p for p, text in outputs.items() if not p.exists() or p.read_text() != text]
    if check:
        for p in stale:
            print(f"{p.relative_to(HERE.parent.parent)} is not what deploy/grafana/dashboards.py generates", file=sys.stderr)
        return 1 if stale else 0
    for p, text in outputs.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
