-- Waste on the days the aggregates answer (inferlog-report waste): what
-- the compactor's fold counts of a day's repeated prompts and output
-- lengths (inferlog_store::model::waste), without the prompts or callers
-- themselves, which stay on the tiers that hold rows. Both tables are
-- written with the day's groups and deleted and audited with its day.
-- Days aggregated before this migration have no rows here: the report
-- names them and leaves them out of `waste`, as before.

-- Per business line: requests, their input plus output tokens and input
-- tokens; the requests that carried a prompt hash; the repeats (requests
-- whose line sent the same prompt earlier the same UTC day), their tokens,
-- and their input not served from the prefix cache.
CREATE TABLE daily_waste (
    day                    date NOT NULL,
    business_line          text NOT NULL,
    requests               bigint NOT NULL,
    tokens                 bigint NOT NULL,
    input_tokens           bigint NOT NULL,
    hashed                 bigint NOT NULL,
    repeats                bigint NOT NULL,
    repeat_tokens          bigint NOT NULL,
    repeat_uncached_input  bigint NOT NULL,
    PRIMARY KEY (day, business_line)
);

-- Per business line × request type ('-': none named): requests, output
-- tokens and their histogram (the mergeable format of the latencies, in
-- tokens), the requests that set max_tokens, and of those the ones whose
-- output reached it, with their output tokens.
CREATE TABLE daily_outputs (
    day              date NOT NULL,
    business_line    text NOT NULL,
    request_type     text NOT NULL,
    requests         bigint NOT NULL,
    output_tokens    bigint NOT NULL,
    output_hist      bigint[] NOT NULL,
    limited          bigint NOT NULL,
    at_limit         bigint NOT NULL,
    at_limit_tokens  bigint NOT NULL,
    PRIMARY KEY (day, business_line, request_type)
);
