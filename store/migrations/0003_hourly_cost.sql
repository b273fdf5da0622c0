-- Hourly rollups, token cost and the cost audit.
--
-- Cost (USD) comes from the price table of the config ([cost] prices): the
-- newest entry of the most specific model pattern whose effective_from is
-- not after the row's day. NULL when no entry prices the row's model: its
-- tokens still count, and cost_audit says how many requests went unpriced.
-- `inferlog-compactor reprice --from D --to D` recomputes it from the stored
-- token sums after a price correction.

ALTER TABLE daily_aggregates ADD COLUMN cost_usd double precision;

-- Per UTC hour x business line x model x version: capacity planning and the
-- busiest minute of each hour. Kept under the aggregates policy, deleted and
-- audited with the daily rows of its day.
CREATE TABLE hourly_aggregates (
    hour                 timestamptz NOT NULL,
    -- The UTC day of `hour`, the unit of the retention policy.
    day                  date NOT NULL,
    business_line        text NOT NULL,
    model_name           text NOT NULL,
    model_version        text NOT NULL,
    requests             bigint NOT NULL,
    errors               bigint NOT NULL,
    input_tokens         bigint NOT NULL,
    output_tokens        bigint NOT NULL,
    cache_prefix_tokens  bigint NOT NULL,
    cost_usd             double precision,
    -- The minute of the hour with the most requests (the earliest of equals),
    -- its requests, and its input plus output tokens.
    peak_minute          timestamptz NOT NULL,
    peak_minute_requests bigint NOT NULL,
    peak_minute_tokens   bigint NOT NULL,
    total_latency_hist   bigint[],
    ttft_hist            bigint[],
    tpot_hist            bigint[],
    queue_wait_hist      bigint[],
    prefill_hist         bigint[],
    decode_hist          bigint[],
    computed_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (hour, business_line, model_name, model_version),
    CHECK (date_trunc('hour', hour) = hour),
    CHECK (peak_minute >= hour AND peak_minute < hour + interval '1 hour')
);
CREATE INDEX hourly_aggregates_day ON hourly_aggregates (day);

-- What priced (or failed to price) the aggregates: one row per day a pass
-- left requests unpriced, and one per day a reprice changed.
CREATE TABLE cost_audit (
    id          bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    day         date NOT NULL,
    action      text NOT NULL CHECK (action IN ('unpriced', 'reprice')),
    -- Requests without a price ('unpriced'); aggregate rows rewritten ('reprice').
    rows        bigint NOT NULL,
    unpriced_requests bigint NOT NULL,
    cost_before double precision,
    cost_after  double precision,
    -- sha256 of the price table in force, so a figure can be traced to its prices.
    prices      text NOT NULL,
    actor       text NOT NULL,
    detail      text
);
CREATE INDEX cost_audit_day ON cost_audit (day);
