-- DLQ replay (issue 33): the rejected events a replay stored, by their
-- source coordinates (topic, partition, offset, index in the message).
-- A replay run twice, killed, or racing another looks here first, so each
-- event is stored once whatever tier its row has reached since. 'pending'
-- is written before the row's INSERT and 'stored' after it; a pending
-- entry left by a killed replay is resolved by the next from the hot table,
-- and a day with pending entries is not released until then.
CREATE TABLE dlq_replayed (
    kafka_topic     text    NOT NULL,
    kafka_partition integer NOT NULL,
    kafka_offset    bigint  NOT NULL,
    kafka_index     bigint  NOT NULL,
    day             integer NOT NULL,
    state           text    NOT NULL CHECK (state IN ('pending', 'stored')),
    run             text    NOT NULL,
    at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kafka_topic, kafka_partition, kafka_offset, kafka_index)
);
CREATE INDEX dlq_replayed_pending ON dlq_replayed (day) WHERE state = 'pending';
