-- Each hour's load minute by minute: requests and input plus output tokens
-- in minutes 0..59 of the hour (array positions 1..60). Summed over the
-- series of an hour they give the fleet's load of every minute exactly, so
-- the fleet's busiest minute is a minute's sum, never a sum of the series'
-- own busiest minutes (inferlog-report capacity --forecast). NULL for the
-- hours aggregated before this migration: the report says when it falls
-- back to their busiest minutes.
ALTER TABLE hourly_aggregates
    ADD COLUMN minute_requests bigint[] CHECK (minute_requests IS NULL OR cardinality(minute_requests) = 60),
    ADD COLUMN minute_tokens bigint[] CHECK (minute_tokens IS NULL OR cardinality(minute_tokens) = 60);
