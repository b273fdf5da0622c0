//! End to end on the real services, no faults: 200,000 events, 1% of them
//! bad (every rejection reason, malformed bytes, oversize messages, PII),
//! produced to Kafka by the independent client, go through ingest, the
//! compactor and retention; then [`Pipeline::reconcile`]: every event in
//! exactly one tier, the DLQ reasons right, no plaintext user id or PII in
//! any tier, aggregates equal to the input's figures, a clean audit.

use inferlog_tests::pipeline::Pipeline;
use inferlog_tests::{generate, produce, write_jsonl};

#[test]
fn bad_input_at_volume_every_event_in_exactly_one_tier_no_plaintext_and_aggregates_match() {
    let p = Pipeline::new("e2e", 4);
    let events = generate(200_000, 0.01, 606, 2);
    produce(&p.topic, &write_jsonl(p.tiers.dir.path(), &events));

    p.run_ok("inferlog-ingest", &["--exit-when-idle", "8s"], "ingest.log");
    p.run_ok("inferlog-compactor", &["--once"], "compactor.log");
    // Three days on, the closed days are past the hot policy with verified archives.
    p.run_ok("inferlog-retention", &["enforce", "--now", &Pipeline::later()], "retention.log");

    p.reconcile(&events);
}
