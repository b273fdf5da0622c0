-- The user's [[sampling.keep]] rules a sampled day was archived with, as
-- JSON (the config's own shape), so the day's archive is derived again
-- with the same rules whatever the config says later. Days recorded before
-- had none.
ALTER TABLE sampling_days ADD COLUMN keep_rules text NOT NULL DEFAULT '[]';
