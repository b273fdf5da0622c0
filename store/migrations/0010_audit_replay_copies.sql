-- Retention covers ingest's replay log (ClickHouse `<table>_offsets`, by
-- the day its entries were written) and the DLQ replay ledger
-- (`dlq_replayed`): their deletions are audited under their own tiers.
ALTER TABLE retention_audit DROP CONSTRAINT IF EXISTS retention_audit_tier_check;
ALTER TABLE retention_audit ADD CONSTRAINT retention_audit_tier_check
    CHECK (tier IN ('hot', 'aggregates', 'cold', 'rejects', 'dlq', 'replay_log', 'dlq_ledger'));
