-- A unit is a range of the hot table's sorting key (whole series, or a
-- series cut by event_time), recorded with the plan as the condition that
-- selects its rows, so every compactor reads the same rows for it.
ALTER TABLE compactor_units ADD COLUMN condition text NOT NULL DEFAULT '1';
