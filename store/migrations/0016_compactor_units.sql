-- A closed day archived in units (inferlog_store::model::unit) by any
-- number of compactors. The day's planner (the compactor holding the day's
-- advisory lock) writes one row per unit for the day's fingerprint; a
-- compactor claims a pending unit with SELECT … FOR UPDATE SKIP LOCKED and
-- keeps the row locked while it archives and verifies the unit, so a
-- compactor that dies frees its unit with its connection, for another to
-- take. A verified unit's objects wait in compactor_unit_objects until
-- every unit is verified and the planner moves them into cold_manifest
-- with the day's state, in one transaction.
CREATE TABLE compactor_units (
    day          date NOT NULL,
    unit         integer NOT NULL,
    units        integer NOT NULL,
    -- The day's fingerprint the plan is for: rows that change replan it.
    fingerprint  text NOT NULL,
    -- How the rows are read ('one_part' or 'final'), as the planner settled the day.
    read_mode    text NOT NULL,
    -- 'pending' or 'verified'.
    state        text NOT NULL DEFAULT 'pending',
    worker       text,
    rows         bigint,
    verified_at  timestamptz,
    PRIMARY KEY (day, unit)
);

CREATE TABLE compactor_unit_objects (
    day             date NOT NULL,
    unit            integer NOT NULL,
    object_key      text NOT NULL PRIMARY KEY,
    rows            bigint NOT NULL,
    represented_rows bigint NOT NULL,
    bytes           bigint NOT NULL,
    sha256          text NOT NULL,
    schema_version  integer NOT NULL,
    FOREIGN KEY (day, unit) REFERENCES compactor_units (day, unit) ON DELETE CASCADE
);
