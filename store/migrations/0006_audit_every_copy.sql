-- Every copy inferlog keeps is under a policy, and every deletion from it
-- is audited (issue 27): the rejects log next to the DLQ ('rejects'), the
-- DLQ topic's retention settings ('dlq'), and erasure on request ('erase'
-- actions on any tier). The tier CHECK of 0001 allowed only the three
-- data tiers, so none of these could be recorded.
ALTER TABLE retention_audit DROP CONSTRAINT IF EXISTS retention_audit_tier_check;
ALTER TABLE retention_audit ADD CONSTRAINT retention_audit_tier_check
    CHECK (tier IN ('hot', 'aggregates', 'cold', 'rejects', 'dlq'));
