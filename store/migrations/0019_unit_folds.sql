-- A verified unit's fold (the daily groups, hours, errors and waste of its
-- rows, as store/src/model/fold_record.rs writes it), recorded with the
-- unit; the day's aggregates are the units' folds merged, so no compactor
-- reads the whole day again for them.
ALTER TABLE compactor_units ADD COLUMN fold bytea;
