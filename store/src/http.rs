//! `/metrics` (Prometheus text format) and `/healthz` for every daemon.
//! In: a registry and a health flag the daemon keeps current. Out: the
//! answers to scrapes, until shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use prometheus::{Encoder, Registry, TextEncoder};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// Serves until `shutdown` changes. `/healthz` answers 503 with
/// `unhealthy` while `healthy` is false.
pub async fn serve(
    addr: String,
    registry: Registry,
    healthy: Arc<AtomicBool>,
    unhealthy: &'static str,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), StoreError> {
    let listener = TcpListener::bind(&addr).await.map_err(|source| StoreError::Metrics { addr: addr.clone(), source })?;
    tracing::info!(%addr, "serving /metrics and /healthz");
    loop {
        tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            accepted = listener.accept() => {
                let Ok((mut stream, _)) = accepted else { continue };
                let registry = registry.clone();
                let healthy = healthy.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let n = stream.read(&mut buf).await.unwrap_or(0);
                    let request = String::from_utf8_lossy(&buf[..n]);
                    let path = request.split_whitespace().nth(1).unwrap_or("/");
                    let (status, body) = match path {
                        "/metrics" => ("200 OK", render(&registry)),
                        "/healthz" if healthy.load(Ordering::Relaxed) => ("200 OK", "ok\n".to_owned()),
                        "/healthz" => ("503 Service Unavailable", format!("{unhealthy}\n")),
                        _ => ("404 Not Found", "not found\n".to_owned()),
                    };
                    let response = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                });
            }
        }
    }
}
