-- Error counts per input-length bucket as well, so that "the share of
-- context_length_exceeded among 8k-32k prompts" can be answered from the
-- aggregates tier after the hot rows are gone. Rows aggregated before this
-- migration cover every input length: '*'. Re-running such a day
-- (inferlog-compactor --day) while it is still hot replaces them.
ALTER TABLE daily_errors
    ADD COLUMN input_bucket text NOT NULL DEFAULT '*'
        CHECK (input_bucket IN ('0-1k', '1k-2k', '2k-4k', '4k-8k', '8k-32k', '32k+', '*'));
ALTER TABLE daily_errors ALTER COLUMN input_bucket DROP DEFAULT;
ALTER TABLE daily_errors DROP CONSTRAINT daily_errors_pkey;
ALTER TABLE daily_errors ADD PRIMARY KEY (day, business_line, model_name, model_version, error_code, error_stage, input_bucket);
