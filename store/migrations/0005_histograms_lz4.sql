-- The histogram arrays are compressed with LZ4 rather than Postgres'
-- default pglz where the server supports it (Postgres 14 and later, built
-- with lz4, as Debian's and the managed services' are). One day's
-- aggregates are about 14,000 arrays of hundreds of mostly small counts:
-- pglz spent about 0.3 s of the compactor's day compressing them, LZ4
-- about a fifth of that, for about 1.3 times the size on disk (measured
-- on 1,000,000 generated rows, docs/performance.md). Values written
-- before keep their compression; both read the same.
DO $$
DECLARE
    target record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' AND 'lz4' = ANY (enumvals)) THEN
        RAISE NOTICE 'lz4 is not available: the histograms stay compressed with pglz';
        RETURN;
    END IF;
    FOR target IN
        SELECT c.table_name, c.column_name FROM information_schema.columns c
        WHERE c.table_schema = current_schema() AND c.table_name IN ('daily_aggregates', 'hourly_aggregates') AND c.column_name LIKE '%\_hist'
    LOOP
        EXECUTE format('ALTER TABLE %I ALTER COLUMN %I SET COMPRESSION lz4', target.table_name, target.column_name);
    END LOOP;
END
$$;
