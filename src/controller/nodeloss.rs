//! Node loss: whether the node that holds a sandbox's workspace is gone for good, judged from
//! what the cluster itself says about it — the Node's `Ready` condition and the
//! `node.kubernetes.io/unreachable` / `not-ready` taints the node lifecycle controller puts on
//! it — against the operator's node-loss grace (`--node-loss-grace-seconds`). Pure: the reads
//! and writes are the sandbox controller's.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use k8s_openapi::jiff::Timestamp;

/// The taints the node lifecycle controller puts on a node whose kubelet stopped reporting
/// (`unreachable`) or reports it not ready (`not-ready`).
pub const LOSS_TAINTS: [&str; 2] = [
    "node.kubernetes.io/unreachable",
    "node.kubernetes.io/not-ready",
];

/// What the operator makes of a sandbox's node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeHealth {
    /// Ready, without a loss taint: the workspace is there.
    Alive,
    /// Not ready for less than the grace: keep the workspace's pin, look again after
    /// `remaining` (the exact time the grace runs out).
    Suspect {
        /// Since when the node has not been ready.
        since: Timestamp,
        /// Until the grace runs out.
        remaining: Duration,
    },
    /// Not ready for the grace or longer, or the Node object is gone: its workspace is lost.
    Lost {
        /// Since when the node has not been ready (`None`: the Node object is gone).
        since: Option<Timestamp>,
        /// Why, in words, for the condition and the Event.
        why: String,
    },
}

/// The node's `Ready` condition, if it reports one.
fn ready_condition(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
}

/// The loss taints on the node.
fn loss_taints(node: &Node) -> impl Iterator<Item = &Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .filter(|t| LOSS_TAINTS.contains(&t.key.as_str()))
}

/// Since when `node` has not been ready: the earliest of its `Ready` condition's last
/// transition (when that condition is not True) and the `timeAdded` of a loss taint. `None`:
/// the node is ready and untainted, or says it is not ready without saying since when.
pub fn not_ready_since(node: &Node) -> Option<Timestamp> {
    let from_condition = ready_condition(node)
        .filter(|c| c.status != "True")
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    let from_taints = loss_taints(node).filter_map(|t| t.time_added.as_ref().map(|t| t.0));
    from_condition.into_iter().chain(from_taints).min()
}

/// Whether `node` is ready and carries no loss taint: helper pods bound to it will run there.
pub fn is_serving(node: &Node) -> bool {
    ready_condition(node).is_some_and(|c| c.status == "True") && loss_taints(node).next().is_none()
}

/// Judges the node `name` (as read: `None` when the Node object does not exist) at `now`
/// against `grace`.
pub fn judge(name: &str, node: Option<&Node>, now: Timestamp, grace: Duration) -> NodeHealth {
    let Some(node) = node else {
        return NodeHealth::Lost {
            since: None,
            why: format!("node {name} no longer exists"),
        };
    };
    let Some(since) = not_ready_since(node) else {
        // Ready and untainted — or not ready without a time to measure from, which the node
        // lifecycle controller always sets: waiting is safer than a guess.
        return NodeHealth::Alive;
    };
    // A clock behind the API server's makes the span negative: count that as none yet.
    let down = Duration::try_from(now.duration_since(since)).unwrap_or_default();
    match grace.checked_sub(down) {
        Some(remaining) if !remaining.is_zero() => NodeHealth::Suspect { since, remaining },
        _ => NodeHealth::Lost {
            since: Some(since),
            why: format!(
                "node {name} has not been ready since {since} ({}s, node-loss grace {}s)",
                down.as_secs(),
                grace.as_secs()
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ready: &str, ready_since: &str, taints: &[(&str, &str)]) -> Node {
        let taints: Vec<_> = taints
            .iter()
            .map(|(k, t)| serde_json::json!({"key": k, "effect": "NoExecute", "timeAdded": t}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n2"},
            "spec": {"taints": taints},
            "status": {"conditions": [
                {"type": "Ready", "status": ready, "lastTransitionTime": ready_since},
            ]},
        }))
        .unwrap()
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const GRACE: Duration = Duration::from_secs(60);

    #[test]
    fn a_ready_node_keeps_its_workspace() {
        let n = node("True", "2026-01-01T00:00:00Z", &[]);
        assert_eq!(
            judge("n2", Some(&n), at("2026-01-01T10:00:00Z"), GRACE),
            NodeHealth::Alive
        );
        assert!(is_serving(&n));
    }

    #[test]
    fn not_ready_within_the_grace_waits_exactly_the_rest_of_it() {
        let n = node("Unknown", "2026-01-01T00:00:10Z", &[]);
        assert_eq!(
            judge("n2", Some(&n), at("2026-01-01T00:00:25Z"), GRACE),
            NodeHealth::Suspect {
                since: at("2026-01-01T00:00:10Z"),
                remaining: Duration::from_secs(45),
            }
        );
        assert!(!is_serving(&n));
    }

    #[test]
    fn the_earlier_of_condition_and_taint_counts() {
        // The taint went on before the condition's transition was recorded.
        let n = node(
            "Unknown",
            "2026-01-01T00:00:30Z",
            &[(LOSS_TAINTS[0], "2026-01-01T00:00:20Z")],
        );
        assert_eq!(not_ready_since(&n), Some(at("2026-01-01T00:00:20Z")));
        // A Ready node still tainted (the taint goes a moment later) is not serving yet, and
        // the taint alone is measured.
        let n = node(
            "True",
            "2026-01-01T00:00:30Z",
            &[(LOSS_TAINTS[1], "2026-01-01T00:00:05Z")],
        );
        assert_eq!(not_ready_since(&n), Some(at("2026-01-01T00:00:05Z")));
        assert!(!is_serving(&n));
    }

    #[test]
    fn not_ready_for_the_grace_or_longer_is_lost() {
        let n = node("False", "2026-01-01T00:00:00Z", &[]);
        match judge("n2", Some(&n), at("2026-01-01T00:01:00Z"), GRACE) {
            NodeHealth::Lost { since, why } => {
                assert_eq!(since, Some(at("2026-01-01T00:00:00Z")));
                assert!(why.contains("node n2") && why.contains("60s"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_node_that_is_gone_is_lost() {
        match judge("n2", None, at("2026-01-01T00:00:00Z"), GRACE) {
            NodeHealth::Lost { since: None, why } => assert!(why.contains("no longer exists")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_clock_behind_the_servers_waits_the_whole_grace() {
        let n = node("Unknown", "2026-01-01T00:00:10Z", &[]);
        assert_eq!(
            judge("n2", Some(&n), at("2026-01-01T00:00:00Z"), GRACE),
            NodeHealth::Suspect {
                since: at("2026-01-01T00:00:10Z"),
                remaining: GRACE,
            }
        );
    }
}
