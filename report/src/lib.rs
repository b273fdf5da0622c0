//! `inferlog-report`: the questions users bring, answered from the tier
//! that holds the days asked about. In: the config file's store tables and
//! the view asked for. Out: the view as text or JSON on stdout, and an exit
//! code a cron job or CI step can act on (0 fine, 1 a threshold crossed,
//! 2 usage or store errors).
//!
//! - [`config`]: the tables the report reads, validated once.
//! - [`budget`]: the `budget` view (spend, budget, used share and forecast per business line).

pub mod budget;
pub mod config;
pub mod error;

pub use config::Config;
pub use error::ReportError;
