//! `inferlog-report`: the questions users bring, answered from the tier
//! that holds the days asked about. In: the config file's store tables,
//! a range of days, a filter and the view asked for. Out: the view as
//! text, CSV or JSON on stdout, optionally the HTML page, and an exit code
//! a cron job or CI step can act on (0 fine, 1 a threshold crossed, 2
//! usage or store errors).
//!
//! The flow: [`range`] → [`source`] (each day from ClickHouse or Postgres)
//! → [`facts`] → [`views`] → [`document`] → [`render`]; [`threshold`]
//! checks `--fail-if`; [`budget`] is the `budget` view; [`significance`]
//! says which differences the counts cannot explain.

pub mod budget;
pub mod config;
pub mod document;
pub mod error;
pub mod facts;
pub mod range;
pub mod render;
pub mod significance;
pub mod source;
pub mod threshold;
pub mod views;

pub use config::Config;
pub use error::ReportError;
