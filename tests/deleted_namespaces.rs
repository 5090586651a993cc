//! The sweep of an operator that watches every namespace also finds what deleted namespaces
//! left on the node: the directory of a namespace deleted while no operator ran (no Sandbox
//! points there any more, so no other pass would look) is swept and then removed, and nothing
//! else is touched. Run alone by `hack/test`: an operator of every namespace would act on the
//! other tests' sandboxes.
//!
//! `eval "$(hack/cluster env)"; cargo test --test deleted_namespaces`

mod common;

use std::path::Path;
use std::time::Duration;

use agentbox_api::crd::Sandbox;
use common::{NODE_ROOT, TestEnv, create_sandbox, phase_is};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

/// Removes a directory tree made by the test when the test ends, also when it fails.
struct RemoveOnDrop(String);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A directory laid out like a workspace (`<nodeRoot>/<ns>/<name>`) with a file in it.
fn planted(ns: &str, name: &str) -> String {
    let dir = format!("{NODE_ROOT}/{ns}/{name}");
    std::fs::create_dir_all(&dir).expect("plant a directory");
    std::fs::write(Path::new(&dir).join("left.txt"), "left").expect("plant a file");
    dir
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn directories_of_namespaces_deleted_while_no_operator_ran_are_swept_and_nothing_else() {
    // A tenant's sandbox, then its namespace deleted while no operator runs: the finalizer
    // dropped by hand (what a kill right after the operator's own removal of it leaves).
    let mut tenant = TestEnv::new("gone-ns-tenant").await;
    tenant.start_operator(&[]);
    let spec = json!({
        "image": common::BASE_IMAGE,
        "scope": {"kind": "Session", "agent": "gone-ns", "session": "s"},
        "workspace": {"files": [{"path": "notes.md", "content": "tenant"}]},
    });
    create_sandbox(&tenant, "s", spec).await.expect("create");
    let s = tenant
        .wait_for::<Sandbox>("s", 120, phase_is("Ready"))
        .await;
    let tenant_ns_dir = format!("{NODE_ROOT}/{}", tenant.ns);
    let tenant_dir = agentbox_operator::controller::pod::workspace_host_path(
        NODE_ROOT,
        &tenant.ns,
        &s.uid().expect("uid"),
    );
    assert!(Path::new(&tenant_dir).join("notes.md").exists());
    tenant.operators[0].kill();
    tenant
        .api::<Sandbox>()
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("drop the finalizer");
    common::delete_namespace_and_wait(&tenant).await;
    assert!(
        Path::new(&tenant_dir).join("notes.md").exists(),
        "orphaned: no operator ran"
    );

    // The operator's own namespace (its helper pods and leader Lease), and around it what the
    // sweep must leave: a namespace that still exists (without any Sandbox), and a deleted
    // namespace's directory holding something not laid out like a workspace.
    let mut env = TestEnv::new("gone-ns").await;
    let kept = TestEnv::new("gone-ns-kept").await;
    let kept_dir = planted(&kept.ns, "2b6c1f4e-8f3a-4c2d-9e1f-123456789abc");
    let _kept_guard = RemoveOnDrop(format!("{NODE_ROOT}/{}", kept.ns));
    let odd = format!("{}-odd", env.ns);
    let odd_workspace = planted(&odd, "3b6c1f4e-8f3a-4c2d-9e1f-123456789abc");
    let odd_warm = planted(&odd, "warm-ab12c");
    let odd_foreign = planted(&odd, "not-a-workspace");
    let _odd_guard = RemoveOnDrop(format!("{NODE_ROOT}/{odd}"));

    let helpers = env.ns.clone();
    let op = env.start_operator(&[
        "--namespace=",
        &format!("--helper-namespace={helpers}"),
        &format!("--leader-election-namespace={helpers}"),
    ]);
    // The startup pass: the tenant's workspace and then its namespace's directory go.
    common::wait_removed(&env, &tenant_dir, 120).await;
    common::wait_removed(&env, &tenant_ns_dir, 60).await;
    common::wait_removed(&env, &odd_workspace, 60).await;
    common::wait_removed(&env, &odd_warm, 60).await;
    // Counted once the helper pod's report is read, just after the directories went.
    let mut swept = 0.0;
    for _ in 0..100 {
        swept = env.counter(op, "agentbox_workspaces_swept_total").await;
        if swept >= 3.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(swept >= 3.0, "swept {swept}\n{}", env.operator_logs());
    // Untouched: what is not named like a workspace (and so its namespace's directory), and
    // everything of a namespace that exists.
    assert!(Path::new(&odd_foreign).join("left.txt").exists());
    assert!(
        Path::new(&kept_dir).join("left.txt").exists(),
        "a namespace that exists is not this path's"
    );
    // No helper pod left in the operator's namespace.
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), &helpers);
    let lp = ListParams::default().labels(agentbox_operator::controller::helper_pod::HELPER_LABEL);
    let mut left = Vec::new();
    for _ in 0..300 {
        left = pods.list(&lp).await.expect("list").items;
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        left.is_empty(),
        "helper pods left: {:?}",
        left.iter().map(|p| p.name_any()).collect::<Vec<_>>()
    );
    env.finish().await;
    kept.finish().await;
    tenant.finish().await;
}
