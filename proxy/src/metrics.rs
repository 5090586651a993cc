//! The proxy's metrics (Prometheus text), served on their own listener.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of a refused connection.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// The sandbox's namespace (empty when the source is no sandbox).
    pub namespace: String,
    /// The sandbox's name (empty when the source is no sandbox).
    pub sandbox: String,
    /// Why (see `Refusal::reason`).
    pub reason: String,
}

/// The proxy's counters.
pub struct Metrics {
    registry: Registry,
    refused: Family<RefusedLabels, Counter>,
    /// Tunnels and requests passed on.
    pub accepted: Counter,
    /// Connections open now.
    pub open: Gauge,
    /// Sandboxes in the table.
    pub sandboxes: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers the metrics under the prefix `agentbox_proxy`.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("agentbox_proxy");
        let refused = Family::<RefusedLabels, Counter>::default();
        let accepted = Counter::default();
        let open = Gauge::default();
        let sandboxes = Gauge::default();
        registry.register(
            "refused",
            "Connections refused, by sandbox and reason",
            refused.clone(),
        );
        registry.register(
            "accepted",
            "Connections passed on to their destination",
            accepted.clone(),
        );
        registry.register("open_connections", "Connections open now", open.clone());
        registry.register(
            "sandboxes",
            "Sandboxes in the proxy's table",
            sandboxes.clone(),
        );
        Metrics {
            registry,
            refused,
            accepted,
            open,
            sandboxes,
        }
    }

    /// Counts one refusal.
    pub fn refused(&self, namespace: &str, sandbox: &str, reason: &str) {
        self.refused
            .get_or_create(&RefusedLabels {
                namespace: namespace.to_string(),
                sandbox: sandbox.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The metrics in Prometheus' text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
