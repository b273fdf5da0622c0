-- On a cluster a unit holds one shard's rows, read from that shard's local
-- table on a replica that confirmed them (0-based; NULL: the table as the
-- server or the Distributed table reads it).
ALTER TABLE compactor_units ADD COLUMN shard integer;

-- A sampled day's plan: its units are cut at whole hours, so no stratum
-- (group × hour) spans two units and each unit's weights add up to its
-- strata's rows. A plan made with the other setting is replaced.
ALTER TABLE compactor_units ADD COLUMN sampled boolean NOT NULL DEFAULT false;
