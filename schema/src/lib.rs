//! The inferlog event contract (docs/contract.md §1) as code.
//!
//! Data flow: raw Kafka payload bytes → [`Contract::normalize`] →
//! [`InferenceEvent`] (stored by ingest, archived by the compactor) or a
//! [`Rejection`] (sent to the DLQ with its [`ReasonCode`]).
//!
//! - [`normalize`]: parsing, validation and normalization of one event.
//! - [`event`]: the normalized event and the enums later stages share.
//! - [`hash`]: keyed hashing of user ids.
//! - [`contract`]: the field table, its JSON Schema and the compatibility check.
//! - [`generate`]: realistic synthetic traffic for demos, tests and benchmarks.
//! - [`histogram`]: the aggregates' mergeable latency histograms (α = 1%).

pub mod config;
pub mod contract;
pub mod error;
pub mod event;
pub mod generate;
pub mod hash;
pub mod histogram;
pub mod normalize;
pub mod pii;
pub mod reason;
pub mod timestamp;

pub use config::{ContractConfig, ErrorDictionary};
pub use error::{Classified, ErrorClass, SchemaError};
pub use event::{ErrorStage, InferenceEvent, InputBucket, OutputBucket, SCHEMA_VERSION};
pub use hash::UserIdHasher;
pub use normalize::{Contract, FieldKey, FieldValue, Fields, Normalized};
pub use reason::{ReasonCode, Rejection};
