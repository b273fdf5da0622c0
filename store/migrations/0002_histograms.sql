-- Mergeable histograms (latencies, cached prefix, GPU memory) and the
-- output-length bucket.
--
-- A histogram is a bigint[]: {first bucket index, zero count, count of the
-- first bucket, count of the next, ...}. Bucket i holds the durations (ms) in
-- (g^(i-1), g^i] with g = (1 + a) / (1 - a), a = 0.01, and answers
-- 2 * g^i / (g + 1): within 1% of every value in it (DDSketch's mapping;
-- inferlog_schema::histogram is the reference implementation). NULL when no
-- request of the group carried the duration.
--
-- Any range is one query:
--   SELECT business_line, inferlog_quantile(inferlog_merge(total_latency_hist), 0.99)
--   FROM daily_aggregates WHERE day >= current_date - 30 GROUP BY 1;

-- Rows aggregated before this migration cover every output length: '*'.
-- Re-running such a day (inferlog-compactor --day) while it is still hot
-- replaces them with per-bucket rows and histograms.
ALTER TABLE daily_aggregates
    ADD COLUMN output_bucket text NOT NULL DEFAULT '*'
        CHECK (output_bucket IN ('0-128', '128-512', '512-2k', '2k-8k', '8k+', '*')),
    ADD COLUMN total_latency_hist bigint[],
    ADD COLUMN ttft_hist bigint[],
    ADD COLUMN tpot_hist bigint[],
    ADD COLUMN queue_wait_hist bigint[],
    ADD COLUMN prefill_hist bigint[],
    ADD COLUMN decode_hist bigint[],
    -- How much of each prompt the cache served (tokens) and the peak GPU
    -- memory (MB), on the same logarithmic buckets.
    ADD COLUMN cache_prefix_hist bigint[],
    ADD COLUMN gpu_mem_hist bigint[],
    -- Exact, like the latency percentiles; NULL when no request reported it.
    ADD COLUMN gpu_mem_p50_mb double precision,
    ADD COLUMN gpu_mem_p99_mb double precision,
    ADD COLUMN gpu_mem_max_mb double precision;
ALTER TABLE daily_aggregates ALTER COLUMN output_bucket DROP DEFAULT;
ALTER TABLE daily_aggregates DROP CONSTRAINT daily_aggregates_pkey;
ALTER TABLE daily_aggregates ADD PRIMARY KEY (day, business_line, model_name, model_version, input_bucket, output_bucket);

-- The sum of two histograms (NULL is the empty histogram).
CREATE FUNCTION inferlog_hist_add(a bigint[], b bigint[]) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    a_len int;
    b_len int;
    lo int;
    hi int;
    sum bigint[];
BEGIN
    IF a IS NULL THEN RETURN b; END IF;
    IF b IS NULL THEN RETURN a; END IF;
    a_len := cardinality(a) - 2;
    b_len := cardinality(b) - 2;
    IF a_len < 0 OR b_len < 0 THEN
        RAISE EXCEPTION 'inferlog_hist_add: not a histogram: % or %', a, b;
    END IF;
    IF a_len = 0 THEN RETURN b[1:1] || (a[2] + b[2]) || b[3:]; END IF;
    IF b_len = 0 THEN RETURN a[1:1] || (a[2] + b[2]) || a[3:]; END IF;
    lo := least(a[1], b[1]);
    hi := greatest(a[1] + a_len, b[1] + b_len);
    sum := array_fill(0::bigint, ARRAY[hi - lo + 2]);
    sum[1] := lo;
    sum[2] := a[2] + b[2];
    FOR i IN 1..a_len LOOP
        sum[a[1] - lo + i + 2] := sum[a[1] - lo + i + 2] + a[i + 2];
    END LOOP;
    FOR i IN 1..b_len LOOP
        sum[b[1] - lo + i + 2] := sum[b[1] - lo + i + 2] + b[i + 2];
    END LOOP;
    RETURN sum;
END
$$;

-- inferlog_merge(hist): the histogram of every row aggregated.
CREATE AGGREGATE inferlog_merge(bigint[]) (
    SFUNC = inferlog_hist_add,
    STYPE = bigint[],
    COMBINEFUNC = inferlog_hist_add,
    PARALLEL = SAFE
);

-- inferlog_quantile(hist, q): the nearest-rank q-quantile (the value at
-- 0-based position floor(q * n)) within 1%; 0 for zeros, NULL when empty.
CREATE FUNCTION inferlog_quantile(h bigint[], q double precision) RETURNS double precision
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    gamma constant double precision := (1 + 0.01) / (1 - 0.01);
    n bigint := 0;
    rank bigint;
    seen bigint;
BEGIN
    IF q < 0 OR q > 1 THEN
        RAISE EXCEPTION 'inferlog_quantile: q must be within [0, 1], got %', q;
    END IF;
    IF cardinality(h) < 2 THEN
        RAISE EXCEPTION 'inferlog_quantile: not a histogram: %', h;
    END IF;
    FOR i IN 2..cardinality(h) LOOP
        n := n + h[i];
    END LOOP;
    IF n = 0 THEN RETURN NULL; END IF;
    rank := least(floor(q * n)::bigint, n - 1);
    seen := h[2];
    IF rank < seen THEN RETURN 0; END IF;
    FOR i IN 3..cardinality(h) LOOP
        seen := seen + h[i];
        IF rank < seen THEN
            RETURN 2 * power(gamma, h[1] + i - 3) / (gamma + 1);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;

-- inferlog_count(hist): how many durations the histogram holds.
CREATE FUNCTION inferlog_count(h bigint[]) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(sum(c), 0)::bigint FROM unnest(h[2:]) AS c
$$;
