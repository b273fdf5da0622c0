//! Live service metrics, computed from every stored event before any
//! sampling: what an SRE's dashboards and alerts read (latency, TTFT,
//! TPOT and stage histograms; requests by status and error code; tokens
//! by type), labelled by model, version, business line and request type,
//! each label capped. In: the hot rows the normalizing threads build.
//! Out: Prometheus families on `/metrics`. Stages: [`labels`] (a row's
//! capped series and its figures) → [`tally`] (per partition of the batch
//! filling) → [`exporter`] (totals of the durable batches).

pub mod exporter;
pub mod labels;
pub mod tally;

pub use exporter::ServiceMetrics;
pub use labels::{Cache, Interner};
pub use tally::{Observation, Tally};
