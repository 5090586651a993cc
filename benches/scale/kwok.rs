//! The scale bench's kwok mode (`BENCH_SCALE_KWOK=1`, issue 44): Sandboxes that are not
//! suspended, placed on the simulated nodes `hack/cluster kwok up N` keeps (hack/cluster.d/kwok.sh),
//! so the operator has a pod for each. kwok reports every pod Running and Ready, but no
//! container runs and no exec reaches one: the workspace of each is never initialised (its
//! probe's exec is refused), so each sandbox stays `Initializing`, which stands for one whose
//! workspace is being initialised. What this shows is the controller's own cost with thousands of
//! pods and nodes (memory, API writes, queueing); not exec, workspaces, a kubelet's or a
//! runtime's costs, nor real scheduling latency.
//!
//! Kept free of the cluster so `tests/bench_report.rs` tests it (`#[path]`).

/// The label and taint key of the simulated nodes (hack/cluster.d/kwok.sh, `KWOK_LABEL_KEY`).
pub const LABEL_KEY: &str = "agentbox.dev/simulated";
/// Its value (`KWOK_LABEL_VALUE`).
pub const LABEL_VALUE: &str = "kwok";

/// The placement a bench sandbox asks for: the simulated nodes alone (their label), tolerating
/// their taint, which keeps every other pod off them.
pub fn placement() -> serde_json::Value {
    serde_json::json!({
        "nodeSelector": {LABEL_KEY: LABEL_VALUE},
        "tolerations": [{"key": LABEL_KEY, "operator": "Equal", "value": LABEL_VALUE,
            "effect": "NoSchedule"}],
    })
}

/// The label selector of the simulated nodes.
pub fn selector() -> String {
    format!("{LABEL_KEY}={LABEL_VALUE}")
}

/// Whether `n` sandboxes fit on the Ready simulated nodes, each taking `pods` pods (the sum of
/// their `allocatable.pods`), with room for one helper pod per node: the bench's pod count stays
/// within what it was given, or it stops before creating anything and says why.
pub fn fits(n: usize, nodes: usize, pods: u64) -> Result<(), String> {
    if nodes == 0 {
        return Err(format!(
            "no Ready node labelled {} (hack/cluster kwok up N)",
            selector()
        ));
    }
    let room = pods.saturating_sub(nodes as u64);
    if n as u64 > room {
        return Err(format!(
            "{n} sandboxes do not fit on {nodes} simulated nodes ({pods} pods allocatable, {nodes} kept for helper pods): hack/cluster kwok up with more nodes"
        ));
    }
    Ok(())
}

/// Whether a sandbox of the kwok mode has settled: its pod is on a node (`node`), and its
/// status, written for its current generation, says `Initializing` (the workspace cannot be
/// initialised: nothing runs in a simulated pod).
pub fn settled(
    phase: Option<&str>,
    node: Option<&str>,
    observed: Option<i64>,
    generation: Option<i64>,
) -> bool {
    phase == Some("Initializing")
        && node.is_some_and(|n| !n.is_empty())
        && observed.is_some()
        && observed == generation
}
