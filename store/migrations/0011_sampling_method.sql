-- How a sampled day's ordinary rows were picked: 1, the top byte of the
-- hash against a cut of base_rate rounded up to 1/256, raised until the
-- stratum kept max(ceil(base_rate x n), min_per_stratum) of its n ordinary
-- rows (the days recorded before this column); 2, the whole 64-bit hash
-- against base_rate x 2^64, raised only to min_per_stratum. A day is
-- derived again with the method it was recorded with.
ALTER TABLE sampling_days ADD COLUMN method smallint NOT NULL DEFAULT 1 CHECK (method IN (1, 2));
