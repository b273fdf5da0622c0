-- A rollup of the daily groups: one row per day × business line × model ×
-- version, the day's input and output buckets merged (about 40 rows a day
-- at the bench's traffic, where daily_aggregates holds about 1,000). A
-- long range's percentile reads it: a year's p99 per business line merges
-- a year of these histograms in a fraction of a second, where a year of
-- groups takes seconds (docs/performance.md). The compactor writes a day's
-- series from its groups in the transaction that writes the groups
-- (inferlog_store::model::aggregates::series_rollup), a reprice rewrites
-- them, and retention deletes and audits them with their day.
CREATE TABLE daily_series (
    day                  date NOT NULL,
    business_line        text NOT NULL,
    model_name           text NOT NULL,
    model_version        text NOT NULL,
    requests             bigint NOT NULL,
    errors               bigint NOT NULL,
    input_tokens         bigint NOT NULL,
    output_tokens        bigint NOT NULL,
    cache_hits           bigint NOT NULL,
    cache_prefix_tokens  bigint NOT NULL,
    -- NULL: no price covered the model that day.
    cost_usd             double precision,
    total_latency_hist   bigint[],
    ttft_hist            bigint[],
    tpot_hist            bigint[],
    queue_wait_hist      bigint[],
    prefill_hist         bigint[],
    decode_hist          bigint[],
    cache_prefix_hist    bigint[],
    gpu_mem_hist         bigint[],
    PRIMARY KEY (day, business_line, model_name, model_version)
);

DO $$
DECLARE
    target record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        RETURN;
    END IF;
    FOR target IN
        SELECT c.column_name FROM information_schema.columns c
        WHERE c.table_schema = current_schema() AND c.table_name = 'daily_series' AND c.column_name LIKE '%\_hist'
    LOOP
        EXECUTE format('ALTER TABLE daily_series ALTER COLUMN %I SET COMPRESSION lz4', target.column_name);
    END LOOP;
END
$$;

-- The days aggregated before this migration, rolled up once.
INSERT INTO daily_series
SELECT day, business_line, model_name, model_version, sum(requests)::bigint, sum(errors)::bigint, sum(input_tokens)::bigint,
       sum(output_tokens)::bigint, sum(cache_hits)::bigint, sum(cache_prefix_tokens)::bigint, sum(cost_usd),
       inferlog_merge(total_latency_hist), inferlog_merge(ttft_hist), inferlog_merge(tpot_hist), inferlog_merge(queue_wait_hist),
       inferlog_merge(prefill_hist), inferlog_merge(decode_hist), inferlog_merge(cache_prefix_hist), inferlog_merge(gpu_mem_hist)
FROM daily_aggregates
GROUP BY day, business_line, model_name, model_version;
