-- The catalog: what each tier holds and what was deleted from it.
-- Every table is created in the schema named by [postgres] schema.

-- The compactor's progress through one UTC day of the hot tier. States, in
-- order: archiving -> archived -> verified -> aggregated -> releasing ->
-- released. A kill at any point leaves a state a re-run can finish from.
CREATE TABLE compactor_days (
    day          date PRIMARY KEY,
    state        text NOT NULL CHECK (state IN ('archiving', 'archived', 'verified', 'aggregated', 'releasing', 'released')),
    -- The hot rows the archive and aggregates were made from (after FINAL).
    hot_rows     bigint NOT NULL,
    -- DayFingerprint::encode of those rows: a change means late rows arrived.
    fingerprint  text NOT NULL,
    objects      integer NOT NULL DEFAULT 0,
    bytes        bigint NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    -- The last failure of this day's work, cleared by the next success.
    last_error   text
);

-- One row per verified Parquet object of the cold tier.
CREATE TABLE cold_manifest (
    object_key     text PRIMARY KEY,
    day            date NOT NULL,
    rows           bigint NOT NULL,
    bytes          bigint NOT NULL,
    sha256         text NOT NULL,
    schema_version integer NOT NULL,
    verified_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX cold_manifest_day ON cold_manifest (day);

-- The aggregates tier. Percentiles are exact: quantileExact's nearest rank,
-- the value at 0-based position floor(q * n) of the n sorted values; NULL
-- when no request of the group carried the field.
CREATE TABLE daily_aggregates (
    day                  date NOT NULL,
    business_line        text NOT NULL,
    model_name           text NOT NULL,
    model_version        text NOT NULL,
    input_bucket         text NOT NULL CHECK (input_bucket IN ('0-1k', '1k-2k', '2k-4k', '4k-8k', '8k-32k', '32k+')),
    requests             bigint NOT NULL,
    errors               bigint NOT NULL,
    input_tokens         bigint NOT NULL,
    output_tokens        bigint NOT NULL,
    cache_hits           bigint NOT NULL,
    cache_prefix_tokens  bigint NOT NULL,
    total_latency_p50_ms double precision NOT NULL,
    total_latency_p95_ms double precision NOT NULL,
    total_latency_p99_ms double precision NOT NULL,
    ttft_p50_ms          double precision,
    ttft_p95_ms          double precision,
    ttft_p99_ms          double precision,
    tpot_p50_ms          double precision,
    tpot_p95_ms          double precision,
    tpot_p99_ms          double precision,
    queue_wait_p50_ms    double precision,
    queue_wait_p95_ms    double precision,
    queue_wait_p99_ms    double precision,
    prefill_p50_ms       double precision,
    prefill_p95_ms       double precision,
    prefill_p99_ms       double precision,
    decode_p50_ms        double precision,
    decode_p95_ms        double precision,
    decode_p99_ms        double precision,
    computed_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (day, business_line, model_name, model_version, input_bucket)
);

CREATE TABLE daily_errors (
    day           date NOT NULL,
    business_line text NOT NULL,
    model_name    text NOT NULL,
    model_version text NOT NULL,
    error_code    integer NOT NULL,
    error_name    text NOT NULL,
    error_stage   text NOT NULL,
    errors        bigint NOT NULL,
    computed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (day, business_line, model_name, model_version, error_code, error_stage)
);

-- Every deletion from any tier, by the compactor (releasing a hot day) or
-- retention (enforcing a policy); dry runs are recorded too, marked.
CREATE TABLE retention_audit (
    id       bigserial PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    tier     text NOT NULL CHECK (tier IN ('hot', 'aggregates', 'cold')),
    -- A day (YYYY-MM-DD) or an object key.
    unit     text NOT NULL,
    action   text NOT NULL,
    rows     bigint,
    bytes    bigint,
    policy   text NOT NULL,
    dry_run  boolean NOT NULL,
    actor    text NOT NULL,
    detail   text
);
CREATE INDEX retention_audit_unit ON retention_audit (tier, unit);
