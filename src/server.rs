//! HTTP endpoints of the operator: `/metrics`, `/healthz` (the process serves), `/readyz` (the
//! operator reached the API server and runs as leader or standby).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::Metrics;

/// What the endpoints report on.
#[derive(Clone)]
pub struct Health {
    /// Metrics to render.
    pub metrics: Arc<Metrics>,
    /// Set once the operator has talked to the API server.
    pub ready: Arc<AtomicBool>,
}

/// The router, separate from binding so it can be tested without a socket.
pub fn router(health: Health) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(health)
}

async fn metrics(State(h): State<Health>) -> impl IntoResponse {
    (
        [(
            "content-type",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        h.metrics.render(),
    )
}

async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    if h.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}
