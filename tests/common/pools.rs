//! SandboxPools in the integration tests: a template, a pool of it, and its warm pods as the
//! API and the node show them (tests/pools.rs and tests/claim.rs).

use std::collections::BTreeSet;
use std::time::Duration;

use agentbox_api::crd::{SandboxPool, SandboxTemplate};
use agentbox_api::labels;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{ListParams, PostParams};
use serde_json::json;

use super::TestEnv;

pub async fn create_template(env: &TestEnv, name: &str, mode: &str) {
    let t: SandboxTemplate = serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxTemplate",
        "metadata": {"name": name},
        "spec": {
            "image": super::BASE_IMAGE,
            "imagePullPolicy": "Never",
            "env": [{"name": "MODE", "value": mode}],
            "workspace": {"files": [{"path": "AGENTS.md", "content": "rules\n"}]},
        }
    }))
    .expect("template json");
    env.api::<SandboxTemplate>()
        .create(&PostParams::default(), &t)
        .await
        .expect("create template");
}

pub fn pool_json(name: &str, template: &str, replicas: i64, strategy: &str) -> serde_json::Value {
    json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxPool",
        "metadata": {"name": name},
        "spec": {"templateRef": {"name": template}, "replicas": replicas, "updateStrategy": strategy},
    })
}

pub async fn create_pool(
    env: &TestEnv,
    name: &str,
    template: &str,
    replicas: i64,
    strategy: &str,
) -> Result<SandboxPool, kube::Error> {
    let p: SandboxPool =
        serde_json::from_value(pool_json(name, template, replicas, strategy)).expect("pool json");
    env.api::<SandboxPool>()
        .create(&PostParams::default(), &p)
        .await
}

/// Waits until the pool's status shows `n` warm pods, all ready, for its current generation.
pub async fn wait_ready(env: &TestEnv, pool: &str, n: i32) -> SandboxPool {
    env.wait_for::<SandboxPool>(pool, 120, move |p: Option<&SandboxPool>| {
        p.is_some_and(|p| {
            p.status.as_ref().is_some_and(|s| {
                s.replicas == n
                    && s.ready_replicas == n
                    && s.observed_generation == p.metadata.generation
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
            })
        })
    })
    .await
}

/// The pool's warm pods (by label), not being deleted.
pub async fn warm_pods(env: &TestEnv, pool: &str) -> Vec<Pod> {
    let lp =
        ListParams::default().labels(&format!("{}={pool},{}=true", labels::POOL, labels::WARM));
    env.api::<Pod>()
        .list(&lp)
        .await
        .expect("list pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// Waits until the pool has exactly `n` warm pods, all ready to be claimed, none of them
/// named in `not` (the pool's status may still count a pod that just left it).
pub async fn wait_claimable(env: &TestEnv, pool: &str, n: usize, not: &[String]) -> Vec<Pod> {
    let mut pods = Vec::new();
    for _ in 0..1200 {
        pods = warm_pods(env, pool).await;
        if pods.len() == n
            && pods
                .iter()
                .all(agentbox_operator::controller::pool::is_claimable)
            && !pods.iter().any(|p| not.contains(&p.name_any()))
        {
            return pods;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{pool}: not {n} claimable warm pods: {:?}\n{}",
        names(&pods),
        env.operator_logs()
    );
}

pub fn names(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter().map(|p| p.name_any()).collect()
}

pub fn host_dir(p: &Pod) -> String {
    p.annotations()
        .get(labels::WORKSPACE_HOST_DIR)
        .cloned()
        .expect("workspace host dir annotation")
}

/// Top-level entries of a host directory.
pub fn entries(dir: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}
