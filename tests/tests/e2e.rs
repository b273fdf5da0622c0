//! End to end on the real services, no faults: 200,000 events, 1% of them
//! bad (every rejection reason, malformed bytes, oversize messages, PII),
//! produced to Kafka by the independent client, go through ingest; the
//! producers' unknown error code turns out to be real, so the dictionary
//! learns it and `dlq replay` recovers those events; then the compactor and
//! retention, and [`Pipeline::reconcile`]: every event in exactly one place
//! (hot, cold, or still invalid in the DLQ), the DLQ reasons right, no
//! plaintext user id or PII in any tier, aggregates equal to the input's
//! figures, a clean audit.

use inferlog_schema::{ContractConfig, ReasonCode};
use inferlog_tests::pipeline::{Pipeline, Replayed};
use inferlog_tests::{generate, produce, replay_line, write_jsonl};

/// The generator's unknown error code, and the name the dictionary gives it once it is known.
const NEW_CODE: &str = "4242";
const NEW_CODE_NAME: &str = "gpu_xid_error";

#[test]
fn bad_input_at_volume_every_event_in_exactly_one_tier_no_plaintext_and_aggregates_match() {
    let p = Pipeline::new("e2e", 4);
    let events = generate(200_000, 0.01, 606, 2);
    produce(&p.topic, &write_jsonl(p.tiers.dir.path(), &events));

    p.run_ok("inferlog-ingest", &["--exit-when-idle", "8s"], "ingest.log");

    // The generator's unknown code (4242) is real after all: the dictionary
    // learns it and the refused events come back from the DLQ.
    let unknown = events.iter().filter(|e| e.expected == Some(ReasonCode::ErrorCodeUnknown)).count() as u64;
    let config = std::fs::read_to_string(&p.tiers.config).expect("config");
    std::fs::write(&p.tiers.config, format!("{config}\n[schema.error_codes]\n\"{NEW_CODE}\" = \"{NEW_CODE_NAME}\"\n")).expect("write config");
    let out = p.output("inferlog-ingest", &["dlq", "replay", "--reason", "error_code.unknown", "--format", "json"], "replay.log");
    assert_eq!(out.status.code(), Some(0), "{}", p.tiers.log("replay.log"));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("replay summary");
    let (selected, replayed, _, still_invalid, _) = replay_line(&summary, "error_code.unknown");
    assert_eq!((selected, replayed, still_invalid), (unknown, unknown, 0), "{summary}");

    p.run_ok("inferlog-compactor", &["--once"], "compactor.log");
    // Three days on, the closed days are past the hot policy with verified archives.
    p.run_ok("inferlog-retention", &["enforce", "--now", &Pipeline::later()], "retention.log");

    let mut contract = ContractConfig::default();
    contract.error_codes.insert(NEW_CODE.into(), NEW_CODE_NAME.into());
    p.reconcile(&events, Some(&Replayed { reason: ReasonCode::ErrorCodeUnknown, contract }));
}
