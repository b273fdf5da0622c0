//! `inferlog-retention`: each tier kept inside its policy, provably.
//!
//! [`inventory`] (what every tier holds now, the DLQ topic through [`dlq`],
//! and what the audit table says was deleted) → [`audit`] (the policy, oldest data and every violation,
//! per tier) or [`enforce`] (delete what expired, each deletion audited);
//! [`erase`] removes one request's users from every tier, with a receipt.

pub mod audit;
pub mod config;
pub mod dlq;
pub mod enforce;
pub mod erase;
pub mod error;
pub mod inventory;
pub mod metrics;
pub mod offsets;

pub use config::Config;
pub use error::RetentionError;
