//! `/metrics` (Prometheus text format) and `/healthz` for every daemon.
//! In: a registry and a health flag the daemon keeps current. Out: the
//! answers to scrapes, until shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::routing::get;
use axum::Router;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::error::StoreError;

/// Unwraps the creation or registration of a metric. Every daemon's metric
/// names and labels are constants, so this fails only on a programming
/// error, at start-up (each daemon's `Metrics::new` runs in its tests).
pub fn metric<T>(r: prometheus::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("metric registration: {e}"))
}

/// A metric, created (`collector`) and registered in `registry` in one step.
pub fn registered<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, collector: prometheus::Result<C>) -> C {
    let collector = metric(collector);
    metric(registry.register(Box::new(collector.clone())));
    collector
}

/// Renders every metric of `registry`.
pub fn render(registry: &Registry) -> String {
    let mut buffer = Vec::new();
    let _ = TextEncoder::new().encode(&registry.gather(), &mut buffer);
    String::from_utf8_lossy(&buffer).into_owned()
}

/// What the two routes read.
#[derive(Clone, Debug)]
struct Scraped {
    registry: Registry,
    healthy: Arc<AtomicBool>,
    unhealthy: &'static str,
}

async fn metrics(State(s): State<Scraped>) -> ([(header::HeaderName, &'static str); 1], String) {
    ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], render(&s.registry))
}

async fn healthz(State(s): State<Scraped>) -> (StatusCode, String) {
    if s.healthy.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok\n".to_owned())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("{}\n", s.unhealthy))
    }
}

/// Serves until `shutdown` changes. `/healthz` answers 503 with
/// `unhealthy` while `healthy` is false; any other path 404.
pub async fn serve(
    addr: String,
    registry: Registry,
    healthy: Arc<AtomicBool>,
    unhealthy: &'static str,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), StoreError> {
    let listener = TcpListener::bind(&addr).await.map_err(|source| StoreError::Metrics { addr: addr.clone(), source })?;
    tracing::info!(%addr, "serving /metrics and /healthz");
    let routes = Router::new().route("/metrics", get(metrics)).route("/healthz", get(healthz)).with_state(Scraped { registry, healthy, unhealthy });
    axum::serve(listener, routes)
        .with_graceful_shutdown(async move {
            let _ = shutdown.changed().await;
        })
        .await
        .map_err(|source| StoreError::Metrics { addr, source })
}
