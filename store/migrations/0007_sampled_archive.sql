-- The sampled archive (issue 29). An object of a sampled day holds fewer
-- rows than it stands for: represented_rows is the sum of its rows'
-- sample_weight (NULL in rows written before: as many as it holds), and the
-- day's release checks the manifest's represented rows against the hot
-- rows. The rule each sampled day was archived with is kept with the day,
-- so its archive can be derived again and checked: the parameters, and the
-- thresholds of every group that had history (the others used the static
-- ones in sampling_days).
ALTER TABLE cold_manifest ADD COLUMN represented_rows bigint;

CREATE TABLE sampling_days (
    day                   date PRIMARY KEY,
    base_rate             double precision NOT NULL,
    min_per_stratum       bigint NOT NULL,
    quantile              double precision NOT NULL,
    history_days          integer NOT NULL,
    min_history_rows      bigint NOT NULL,
    seed                  bigint NOT NULL,
    slow_total_latency_ms double precision NOT NULL,
    slow_ttft_ms          double precision NOT NULL,
    long_output_tokens    bigint NOT NULL,
    long_input_tokens     bigint NOT NULL,
    derived_at            timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sampling_thresholds (
    day                   date NOT NULL REFERENCES sampling_days (day) ON DELETE CASCADE,
    business_line         text NOT NULL,
    model_name            text NOT NULL,
    model_version         text NOT NULL,
    input_bucket          text NOT NULL,
    slow_total_latency_ms double precision NOT NULL,
    slow_ttft_ms          double precision NOT NULL,
    history_rows          bigint NOT NULL,
    PRIMARY KEY (day, business_line, model_name, model_version, input_bucket)
);
