//! Prometheus metrics of the operator: reconcile counts, durations and errors by kind.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels naming a controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `sandbox` or `snapshot`.
    pub controller: String,
}

/// Labels of an error count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The controller.
    pub controller: String,
    /// The error's kind (see `controller::Error::kind`).
    pub kind: String,
}

/// The operator's metrics, registered once.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ControllerLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    durations: Family<ControllerLabels, Histogram>,
    /// 1 while this replica leads.
    pub leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("agentbox");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let errors = Family::<ErrorLabels, Counter>::default();
        let durations = Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.005, 2.0, 14))
        });
        let leader = Gauge::default();
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciles that failed, by error kind",
            errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            durations.clone(),
        );
        registry.register(
            "leader",
            "Whether this replica is the leader",
            leader.clone(),
        );
        Metrics {
            registry,
            reconciles,
            errors,
            durations,
            leader,
        }
    }
}

impl Metrics {
    /// Counts a finished reconcile and its duration.
    pub fn reconciled(&self, controller: &str, took: Duration) {
        let l = ControllerLabels {
            controller: controller.to_string(),
        };
        self.reconciles.get_or_create(&l).inc();
        self.durations.get_or_create(&l).observe(took.as_secs_f64());
    }

    /// Counts a failed reconcile by error kind.
    pub fn failed(&self, controller: &str, kind: &str) {
        let l = ErrorLabels {
            controller: controller.to_string(),
            kind: kind.to_string(),
        };
        self.errors.get_or_create(&l).inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counts_by_label() {
        let m = Metrics::default();
        m.reconciled("sandbox", Duration::from_millis(12));
        m.reconciled("sandbox", Duration::from_millis(30));
        m.failed("sandbox", "kube");
        let text = m.render();
        assert!(
            text.contains(r#"agentbox_reconciles_total{controller="sandbox"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"agentbox_reconcile_errors_total{controller="sandbox",kind="kube"} 1"#),
            "{text}"
        );
        assert!(
            text.contains("agentbox_reconcile_duration_seconds_count"),
            "{text}"
        );
    }
}
