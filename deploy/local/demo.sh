#!/usr/bin/env bash
# The README's demo: installs what is missing, builds, starts the local
# services, generates 14 days of traffic (2% invalid; a slow canary, a
# queueing regression and a knee planted for the report to find), produces
# it to Kafka, runs ingest until the topic is drained, then the compactor (daily and
# hourly aggregates with their cost into Postgres, a sampled Parquet
# archive on S3: the tail whole, weights that keep the totals exact),
# the budget report, retention (days past the 7-day hot policy leave
# ClickHouse) and its audit, shows what landed where, reconciled across
# the tiers, then answers the users' questions with inferlog-report (every
# view, over days of both tiers) and writes the HTML page.
# Safe to re-run (each run uses its own topic and table). Stop the services
# with `deploy/local/services.sh down`.
#
# With --otel, the traffic goes the way a vLLM fleet's does: each event
# becomes the span vLLM's tracing emits for that request (OpenTelemetry
# Python SDK, deploy/local/events_to_spans.py), sent to the local
# OpenTelemetry Collector (built once by `services.sh up --otel`), whose
# Kafka exporter writes OTLP protobuf to the run's topic, which ingest reads
# as `otlp_proto`. Spans carry only valid events (nothing is refused).
set -euo pipefail
cd "$(dirname "$0")/../.."
otel=""
case "${1:-}" in
  --otel) otel=1 ;;
  "") ;;
  *) echo "usage: $0 [--otel]" >&2; exit 2 ;;
esac
run=demo_$(date +%s)
work=.inferlog/$run
mkdir -p "$work"
step() { printf '\n==> %s\n' "$*" >&2; }
ch() { curl -sS --fail-with-body --data-binary "$1" "http://127.0.0.1:8123/?default_format=PrettyCompactMonoBlock"; }

# The build runs while the services install and start: the first `up` is
# mostly downloads, the first build mostly CPU. The `ci` profile (release
# without LTO, Cargo.toml) is the tests' profile: optimised, in about half
# the release build's time.
step "building inferlog (the ci profile) in the background: $work/build.log"
# The crates download while Debian's build packages install (network and
# dpkg, not CPU); the build starts when both are there.
cargo fetch --locked --target "$(rustc -vV | sed -n "s/^host: //p")" > "$work/fetch.log" 2>&1 &
fetch=$!
deploy/local/services.sh build-deps
wait "$fetch" || { cat "$work/fetch.log" >&2; echo "demo: cargo fetch failed" >&2; exit 75; }
cargo build --profile ci --locked --bins > "$work/build.log" 2>&1 &
build=$!
trap 'kill "$build" 2>/dev/null || true' EXIT
step "starting the local services (first time: installs ClickHouse, Postgres, Kafka, Python clients, builds SeaweedFS ~5 min)"
deploy/local/services.sh up ${otel:+--otel}

step "waiting for the build"
if ! wait "$build"; then
  tail -n 30 "$work/build.log" >&2
  echo "demo: the build failed (the whole log: $work/build.log)" >&2
  exit 2
fi
tail -n 1 "$work/build.log"
bin=target/ci

produced=280000
invalid=0.02
[ -z "$otel" ] || invalid=0
step "generating 14 days of traffic: $produced events, $invalid invalid on purpose"
"$bin/inferlog-schema" generate --count $produced --days 14 --seed 7 --invalid-ratio $invalid > "$work/events.jsonl"
"$bin/inferlog-schema" check --format json "$work/events.jsonl" | tail -n 1 || true
spike_hour=$(date -u -d '1 hour ago' +%Y-%m-%dT%H)
step "planting a slow canary (llama 2024-09-25 on long inputs), queueing on 8k-32k inputs this week, a knee at peak load, repeated prompts and answers cut at max_tokens, and a runaway caller at ${spike_hour}:00, for compare, diagnose, capacity, waste and spikes to find"
SPIKE_HOUR=$spike_hour python3 deploy/local/plant.py < "$work/events.jsonl" > "$work/planted.jsonl"
mv "$work/planted.jsonl" "$work/events.jsonl"

python3 deploy/local/kafkatool.py create-topics --partitions 8 --config retention.ms=518400000 --config segment.ms=86400000 "$run-dlq"
ingest_config=deploy/local/inferlog.toml
if [ -n "$otel" ]; then
  topic=$run-spans
  step "sending each event as vLLM's span through the OpenTelemetry Collector (OTLP/HTTP on 127.0.0.1:4318) to Kafka topic $topic"
  python3 deploy/local/kafkatool.py create-topics --partitions 8 "$topic"
  sent=$(python3 deploy/local/events_to_spans.py http://127.0.0.1:4318/v1/traces "$topic" < "$work/events.jsonl")
  echo "  $sent spans sent" >&2
  # The shipped config, plus the topic's encoding and the attributes vLLM
  # does not define, mapped to the contract's fields.
  ingest_config=$work/inferlog-otel.toml
  cat deploy/local/inferlog.toml - > "$ingest_config" <<TOML

[kafka.encodings]
"$topic" = "otlp_proto"

[otlp.attributes]
"inferlog.gpu_id" = "gpu_id"
"inferlog.batch_size" = "batch_size"
"inferlog.cache_hit" = "cache_hit"
"inferlog.gpu_mem_peak_mb" = "gpu_mem_peak_mb"
"inferlog.truncated" = "truncated"
"inferlog.tpot_ms" = "tpot_ms"
TOML
else
  topic=$run-events
  step "producing to Kafka topic $topic (the independent client: confluent-kafka)"
  python3 deploy/local/kafkatool.py create-topics --partitions 8 "$topic"
  python3 deploy/local/kafkatool.py produce --topic "$topic" "$work/events.jsonl"
fi

# A two-week backfill: ingest and the compactor accept events up to 15 days
# old for this run (the shipped config keeps max_event_age = hot_days = 7d);
# retention below then applies the normal 7-day hot policy.
backfill=(INFERLOG_SCHEMA__MAX_EVENT_AGE=15d INFERLOG_RETENTION__HOT_DAYS=15)
step "ingesting until the topic is drained (metrics on http://127.0.0.1:9464/metrics meanwhile)"
env "${backfill[@]}" INFERLOG_HASH_KEY_FILE=.inferlog/local/hash.key \
INFERLOG_KAFKA__TOPICS="[\"$topic\"]" INFERLOG_KAFKA__DLQ_TOPIC="$run-dlq" \
INFERLOG_KAFKA__GROUP_ID="$run" INFERLOG_CLICKHOUSE__TABLE="${run}_logs" \
INFERLOG_CLICKHOUSE__REJECTS_TABLE="${run}_rejects" \
  "$bin/inferlog-ingest" --config "$ingest_config" --exit-when-idle 5s 2>&1 | grep -E "started|assign|stopped|WARN|ERROR" >&2

t=inferlog.${run}_logs
step "hot tier: rows per UTC day (ClickHouse $t)"
ch "SELECT day, count() AS rows, uniqExact(request_id) AS requests FROM $t GROUP BY day ORDER BY day"
step "why was p99 slow? total latency and TTFT by business line and input bucket (yesterday)"
ch "SELECT business_line,
        multiIf(input_tokens < 1024, '0-1k', input_tokens < 2048, '1k-2k', input_tokens < 4096, '2k-4k',
                input_tokens < 8192, '4k-8k', input_tokens < 32768, '8k-32k', '32k+') AS bucket,
        count() AS requests, round(quantileExact(0.5)(total_latency_ms)) AS p50_ms,
        round(quantileExact(0.99)(total_latency_ms)) AS p99_ms, round(quantileExact(0.99)(ifNull(ttft_ms, 0))) AS p99_ttft_ms
     FROM $t WHERE day = yesterday() GROUP BY business_line, bucket ORDER BY business_line, bucket LIMIT 20"
step "who burned the token budget? tokens by business line (two weeks)"
ch "SELECT business_line, sum(input_tokens) AS tokens_in, sum(output_tokens) AS tokens_out,
        round(100 * countIf(cache_hit = 1) / count(), 1) AS cache_hit_pct, countIf(error_code != 0) AS errors
     FROM $t GROUP BY business_line ORDER BY tokens_in + tokens_out DESC"
step "rejected events by reason (also in the DLQ topic $run-dlq, redacted: no plaintext personal data)"
ch "SELECT reason, count() AS events FROM inferlog.${run}_rejects GROUP BY reason ORDER BY events DESC"
step "reconciliation after ingest: produced = hot rows + rejects"
ch "SELECT $produced AS produced, (SELECT count() FROM $t) AS hot_rows, (SELECT count() FROM inferlog.${run}_rejects) AS rejected"
step "live service metrics, scraped by Prometheus (http://127.0.0.1:9490) while ingest ran, beside ClickHouse's exact figures"
deploy/local/service_metrics_summary.py http://127.0.0.1:9490 http://127.0.0.1:8123 "$t" >&2 || echo "  (Prometheus did not answer)" >&2

# The DLQ is recoverable: the generator's unknown error code 4242 was a
# real code the dictionary lacked. Inspect, fix the config (here by an
# override), dry-run, replay; each event is stored once under its original
# Kafka coordinates, and the rest of the DLQ stays as it was.
dlq_env=(env "${backfill[@]}" INFERLOG_HASH_KEY_FILE=.inferlog/local/hash.key INFERLOG_KAFKA__TOPICS="[\"$topic\"]"
  INFERLOG_KAFKA__DLQ_TOPIC="$run-dlq" INFERLOG_KAFKA__GROUP_ID="$run" INFERLOG_CLICKHOUSE__TABLE="${run}_logs"
  INFERLOG_CLICKHOUSE__REJECTS_TABLE="${run}_rejects" INFERLOG_POSTGRES__SCHEMA="$run")
step "the DLQ, inspected: what was refused, by reason, field and source topic"
"${dlq_env[@]}" "$bin/inferlog-ingest" --config "$ingest_config" dlq inspect 2>/dev/null | sed -n '1,14p' >&2 || true
fixed=(INFERLOG_SCHEMA__ERROR_CODES='{ "4242" = "upstream_timeout" }')
step "error code 4242 is real: added under [schema.error_codes]; dry run, then replay (the other reasons stay in the DLQ, untouched)"
"${dlq_env[@]}" "${fixed[@]}" "$bin/inferlog-ingest" --config "$ingest_config" dlq replay --reason error_code.unknown --dry-run 2>/dev/null | sed -n '1,6p' >&2 || true
"${dlq_env[@]}" "${fixed[@]}" "$bin/inferlog-ingest" --config "$ingest_config" dlq replay --reason error_code.unknown 2>/dev/null | sed -n '1,6p' >&2 || true
replayed=$(psql "postgres://postgres@127.0.0.1:5432/inferlog" -X -qtA -c "SELECT count(*) FROM $run.dlq_replayed WHERE state = 'stored'")
step "reconciliation after the replay: produced = hot rows + rejects still invalid (rejects - replayed)"
ch "SELECT $produced AS produced, (SELECT count() FROM $t) AS hot_rows, (SELECT count() FROM inferlog.${run}_rejects) - $replayed AS still_invalid, $replayed AS replayed"

# The compactor and retention read the same config; this run gets its own Postgres schema and S3 prefix.
# Sampling is off by default (deploy/local/inferlog.toml too); the demo turns
# it on. Its days are small (about 20,000 rows over some 7,000 strata of
# line x model x version x input bucket x hour), so it keeps 2 ordinary rows
# per stratum at least instead of the default 20, which would keep nearly all.
export INFERLOG_CLICKHOUSE__TABLE="${run}_logs" INFERLOG_POSTGRES__SCHEMA="$run" \
  INFERLOG_COLD__URL="s3://inferlog-cold/$run/" INFERLOG_KAFKA__DLQ_TOPIC="$run-dlq" INFERLOG_COMPACTOR__METRICS_ADDR="" \
  INFERLOG_SAMPLING__ENABLED=true INFERLOG_SAMPLING__MIN_PER_STRATUM=2
pg() { psql "postgres://postgres@127.0.0.1:5432/inferlog" -X -q -P pager=off -c "SET search_path TO $run; $1"; }
step "compactor: every closed day archived to Parquet on S3, verified, aggregated into Postgres"
env "${backfill[@]}" "$bin/inferlog-compactor" --config deploy/local/inferlog.toml --once 2>&1 | grep -E "stage finished|pass finished|ERROR" >&2
pg "SELECT day, state, hot_rows, objects, pg_size_pretty(bytes) AS parquet FROM compactor_days ORDER BY day"
step "cold tier: the Parquet objects (manifest: key, rows kept, rows they stand for, bytes, sha256)"
pg "SELECT object_key, rows, represented_rows, pg_size_pretty(bytes) AS size, left(sha256, 16) AS sha256 FROM cold_manifest ORDER BY object_key"
step "sampled archive, read back from Parquet: rows kept per business line and reason; the weights give each line's exact requests"
deploy/local/archive_summary.py http://127.0.0.1:9303 inferlog-cold "$run/" < .inferlog/local/s3.secret > "$work/sampled.tsv"
printf '  %-18s %9s %12s %12s  %s\n' business_line kept represented aggregates "kept by reason" >&2
while IFS=$'\t' read -r line kept represented reasons; do
  exact=$(psql "postgres://postgres@127.0.0.1:5432/inferlog" -X -qtA -c "SELECT sum(requests) FROM $run.daily_aggregates WHERE business_line = '$line'")
  printf '  %-18s %9s %12s %12s  %s\n' "$line" "$kept" "$represented" "$exact" "$reasons" >&2
done < "$work/sampled.tsv"
step "aggregates tier: per-day latency percentiles and tokens for two business lines (Postgres daily_aggregates)"
pg "SELECT day, business_line, sum(requests) AS requests, sum(errors) AS errors, sum(input_tokens) AS tokens_in,
           sum(output_tokens) AS tokens_out, round(max(total_latency_p50_ms)) AS worst_bucket_p50_ms,
           round(max(total_latency_p95_ms)) AS worst_bucket_p95_ms, round(max(total_latency_p99_ms)) AS worst_bucket_p99_ms
      FROM daily_aggregates WHERE business_line IN ('search', 'code-copilot') GROUP BY day, business_line ORDER BY day, business_line"
step "any range from the aggregates: 30-day p50 / p99 total latency and p99 TTFT per business line (merged histograms, within 1%)"
pg "SELECT business_line, sum(requests) AS requests,
           round(inferlog_quantile(inferlog_merge(total_latency_hist), 0.5)::numeric, 1) AS p50_ms,
           round(inferlog_quantile(inferlog_merge(total_latency_hist), 0.99)::numeric, 1) AS p99_ms,
           round(inferlog_quantile(inferlog_merge(ttft_hist), 0.99)::numeric, 1) AS p99_ttft_ms
      FROM daily_aggregates WHERE day >= current_date - 30 GROUP BY business_line ORDER BY p99_ms DESC"
step "which business line burned the budget? cost by business line over 30 days (priced from [[cost.prices]])"
pg "SELECT business_line, sum(requests) AS requests, sum(input_tokens) AS tokens_in, sum(cache_prefix_tokens) AS tokens_cached,
           sum(output_tokens) AS tokens_out, round(sum(cost_usd)::numeric, 2) AS cost_usd,
           coalesce(sum(requests) FILTER (WHERE cost_usd IS NULL), 0) AS unpriced_requests
      FROM daily_aggregates WHERE day >= current_date - 30 GROUP BY business_line ORDER BY cost_usd DESC"
step "capacity: the five busiest hours, and the busiest minute in each (Postgres hourly_aggregates)"
pg "WITH h AS (SELECT hour, sum(requests) AS requests, sum(input_tokens + output_tokens) AS tokens,
                      round(sum(cost_usd)::numeric, 2) AS cost_usd FROM hourly_aggregates GROUP BY hour),
          p AS (SELECT DISTINCT ON (hour) hour, peak_minute, peak_minute_requests FROM hourly_aggregates
                ORDER BY hour, peak_minute_requests DESC, peak_minute)
      SELECT h.hour, h.requests, h.tokens, h.cost_usd, p.peak_minute AS busiest_line_minute, p.peak_minute_requests
      FROM h JOIN p USING (hour) ORDER BY h.requests DESC LIMIT 5"
step "budgets: spend, budget, used share and month-end forecast per business line (inferlog-report budget; exit 1 at 90%)"
"$bin/inferlog-report" --config deploy/local/inferlog.toml budget 2>/dev/null || echo "  (a business line is at 90% of its budget or more: the command exits 1 for cron and CI)" >&2
step "errors by code and stage (Postgres daily_errors, whole period)"
pg "SELECT error_name, error_stage, sum(errors) AS errors FROM daily_errors GROUP BY error_name, error_stage ORDER BY errors DESC LIMIT 10"
step "retention: days past the 7-day hot policy leave ClickHouse (each has a verified archive), every deletion audited"
"$bin/inferlog-retention" --config deploy/local/inferlog.toml enforce 2>/dev/null | sed 's/^/  /' >&2
pg "SELECT tier, unit, action, rows, policy, actor FROM retention_audit ORDER BY unit"
step "reconciliation across the tiers: produced = hot rows + cold rows represented (released days) + rejected still invalid"
hot=$(curl -sS --data-binary "SELECT count() FROM $t" http://127.0.0.1:8123/)
cold=$(psql "postgres://postgres@127.0.0.1:5432/inferlog" -X -qtA -c "SELECT coalesce(sum(m.represented_rows), 0) FROM $run.cold_manifest m JOIN $run.compactor_days d USING (day) WHERE d.state = 'released'")
rejected=$(curl -sS --data-binary "SELECT count() FROM inferlog.${run}_rejects" http://127.0.0.1:8123/)
rejected=$((rejected - replayed))
echo "  produced $produced = hot $hot + cold $cold + still invalid $rejected ($replayed replayed from the DLQ): $([ $((hot + cold + rejected)) -eq $produced ] && echo holds || echo 'DOES NOT HOLD')" >&2
step "retention audit: policy, oldest data and violations per tier"
"$bin/inferlog-retention" --config deploy/local/inferlog.toml audit 2>/dev/null || true

# The questions users bring, answered by inferlog-report: this week against
# the week before, each day from the tier that holds it (the released days
# from the Postgres aggregates, the rest from ClickHouse). Exit 1 means a
# threshold was crossed (a budget at 90%, a --fail-if), not a failure.
report() { "$bin/inferlog-report" --config deploy/local/inferlog.toml "$@" 2>/dev/null || [ $? -eq 1 ]; }
week=(--from "$(date -u -d '6 days ago' +%F)" --to "$(date -u +%F)")
step "inferlog-report overview: this week against the week before, largest changes first"
report "${week[@]}" overview
step "inferlog-report latency: why was p99 slow? percentiles by input and output bucket, the dominant stage (search only)"
report "${week[@]}" --business-line search latency
step "inferlog-report cost: tokens and cost by business line, model and version; top hashed users (hot days); budgets"
report "${week[@]}" cost
step "inferlog-report cache: hit ratio and cached-prefix length by model version"
report "${week[@]}" cache
step "inferlog-report errors: which error shares moved, by code, stage, business line and input bucket (top 12)"
report "${week[@]}" errors | head -n 16
step "inferlog-report capacity --forecast: load by hour and weekday, the exact per-minute load, the knee (p99 TTFT 7 s), the next week's peak (two weeks)"
report --from "$(date -u -d '13 days ago' +%F)" --to "$(date -u +%F)" capacity --forecast --knee-ttft-ms 7000 | sed -n '/minute_load\|load per minute/,$p'

step "inferlog-report diagnose: success rate, then TTFT, TPOT and tokens against last week; where it stops, what explains it"
report "${week[@]}" diagnose
step "inferlog-report compare: is llama-3.1-70b-instruct 2024-09-25 better than 2024-07-23? (by input bucket)"
report "${week[@]}" compare --model llama-3.1-70b-instruct --a 2024-07-23 --b 2024-09-25 | awk 'NR <= 6 || $2 == "all"'
step "inferlog-report waste: repeated prompts by line and what a prompt cache would save, the top prompts and their hashed callers, long answers and answers cut at max_tokens"
report "${week[@]}" waste --top 5
step "inferlog-report spikes: who burned tokens at ${spike_hour}:00 against the same hour before (--fail-if exits 1 for cron)"
report --top-users 5 --fail-if 'spiking_callers>0' spikes --hour "$spike_hour"
step "the HTML page (overview, diagnosis, performance, version comparison, capacity, cost, spikes, waste, cache, errors; one self-contained file)"
report "${week[@]}" --format json --html "$work/report.html" page > "$work/report.json"
echo "  page: $PWD/$work/report.html (its figures: $PWD/$work/report.json)" >&2
echo "  Grafana: import deploy/grafana/dashboards/*.json (Service, Pipeline, History) with deploy/grafana/provisioning/; Prometheus is on http://127.0.0.1:9490 (deploy/grafana/README.md lists every panel)" >&2
echo "stop the services with: deploy/local/services.sh down" >&2
