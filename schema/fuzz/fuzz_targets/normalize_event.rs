//! Fuzz target for the event parser. In: arbitrary bytes as one Kafka
//! message. Out: nothing; it fails when the contract breaks a promise:
//! - parsing never panics, whatever the bytes;
//! - `check` (no key, producers' CI) and `normalize` (with key) agree on
//!   accept / reject and on the reason;
//! - a rejection names a reason code and says why;
//! - an accepted event stores the user id only as a digest of this key,
//!   never in clear.
#![no_main]

use std::sync::OnceLock;

use inferlog_schema::{Contract, ContractConfig, UserIdHasher};
use libfuzzer_sys::fuzz_target;

/// 2026-11-30T00:00:00Z: the time bounds are exercised at a fixed instant.
const NOW_MS: i64 = 1_796_083_200_000;

fn fixture() -> &'static (Contract, UserIdHasher) {
    static FIXTURE: OnceLock<(Contract, UserIdHasher)> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let contract = Contract::new(&ContractConfig::default()).expect("default contract");
        let hasher = UserIdHasher::new(b"fuzz-key-0123456789abcdef", None, "fuzz").expect("hasher");
        (contract, hasher)
    })
}

fuzz_target!(|bytes: &[u8]| {
    let (contract, hasher) = fixture();
    for now in [None, Some(NOW_MS)] {
        let checked = contract.check(bytes, now);
        let normalized = contract.normalize(bytes, now, hasher);
        match (&checked, &normalized) {
            (Ok(dropped), Ok(n)) => {
                assert_eq!(dropped, &n.dropped_fields, "check and normalize drop different fields");
                if let Some(digest) = &n.event.user_id_hash {
                    assert!(hasher.is_own_digest(digest), "user_id_hash {digest:?} is not a digest under the key");
                }
                assert!(!n.event.request_id.is_empty(), "accepted an empty request_id");
            }
            (Err(a), Err(b)) => {
                assert_eq!(a.reason, b.reason, "check and normalize reject for different reasons");
                assert!(!a.message.is_empty(), "rejection {:?} without a message", a.reason);
            }
            _ => panic!("check {checked:?} and normalize {normalized:?} disagree"),
        }
    }
});
