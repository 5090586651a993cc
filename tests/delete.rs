//! Deleting sandboxes on the real cluster: the object goes without waiting for its pod or its
//! workspace directory, and both follow — also when the operator is killed in between, where
//! the restarted operator's sweep removes the orphaned directory and nothing else.
//!
//! `eval "$(hack/cluster env)"; cargo test --test delete`

mod common;

use std::path::Path;
use std::time::Duration;

use agentbox_api::crd::Sandbox;
use common::{NODE_ROOT, TestEnv, create_sandbox, phase_is, sh};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

fn spec(session: &str) -> serde_json::Value {
    json!({
        "image": common::BASE_IMAGE,
        "scope": {"kind": "Session", "agent": "delete-test", "session": session},
        "workspace": {"files": [{"path": "notes.md", "content": session}]},
    })
}

fn dir_of(env: &TestEnv, s: &Sandbox) -> String {
    agentbox_operator::controller::pod::workspace_host_path(
        NODE_ROOT,
        &env.ns,
        &s.uid().expect("uid"),
    )
}

/// The operator's `agentbox_workspaces_swept_total` once it reaches `at_least` (it counts a
/// removal when it has read the helper pod's report, just after the directory went), or
/// whatever it is after ten seconds.
async fn swept(env: &TestEnv, op: usize, at_least: f64) -> f64 {
    let mut count = 0.0;
    for _ in 0..100 {
        count = env.counter(op, "agentbox_workspaces_swept_total").await;
        if count >= at_least {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    count
}

/// Waits (up to 30 s) until `pods` has no pod `lp` selects; panics naming those left.
async fn no_pods_left(pods: &kube::Api<Pod>, lp: &ListParams) {
    let mut left = Vec::new();
    for _ in 0..300 {
        left = pods.list(lp).await.expect("list").items;
        if left.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "helper pods left: {:?}",
        left.iter().map(|p| p.name_any()).collect::<Vec<_>>()
    );
}

async fn ready(env: &TestEnv, name: &str) -> Sandbox {
    create_sandbox(env, name, spec(name)).await.expect("create");
    env.wait_for::<Sandbox>(name, 120, phase_is("Ready")).await
}

async fn delete(env: &TestEnv, name: &str) {
    env.api::<Sandbox>()
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete");
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn deleted_sandboxes_go_at_once_and_their_pods_and_directories_follow() {
    let mut env = TestEnv::new("delete").await;
    env.start_operator(&[]);
    let mut dirs = Vec::new();
    for name in ["a", "b", "c"] {
        let s = ready(&env, name).await;
        let dir = dir_of(&env, &s);
        assert!(Path::new(&dir).join("notes.md").exists(), "{dir}");
        dirs.push((name, dir));
    }
    // Deleted one after the other without waiting in between: each object goes on its own
    // (the finalizer waits neither for the pod nor for the directory).
    for (name, _) in &dirs {
        delete(&env, name).await;
        env.wait_gone::<Sandbox>(name, 30).await;
    }
    // Then every pod (the sandboxes' and the sweep's helpers) and every directory.
    common::wait_no_pods(&env, 60).await;
    for (_, dir) in &dirs {
        common::wait_removed(&env, dir, 60).await;
    }
    assert!(
        common::workspace_names(&format!("{NODE_ROOT}/{}", env.ns)).is_empty(),
        "no workspace directory left in the namespace"
    );
    assert_eq!(
        swept(&env, 0, 3.0).await,
        3.0,
        "each directory counted once"
    );
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_restarted_operator_sweeps_what_a_killed_one_left_and_nothing_else() {
    let mut env = TestEnv::new("delete-kill").await;
    env.start_operator(&[]);
    let live = ready(&env, "live").await;
    let sleeper = ready(&env, "sleeper").await;
    let raced = ready(&env, "raced").await;
    let doomed = ready(&env, "doomed").await;
    let live_pod = live
        .status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .expect("pod");
    sh(&env, &live_pod, "echo kept > kept.txt").await;
    env.api::<Sandbox>()
        .patch(
            "sleeper",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"lifecycle": {"mode": "Suspended"}}})),
        )
        .await
        .expect("suspend");
    env.wait_for::<Sandbox>("sleeper", 60, phase_is("Suspended"))
        .await;
    // Not laid out like a workspace: never the sweep's to remove.
    let ns_dir = format!("{NODE_ROOT}/{}", env.ns);
    let foreign = format!("{ns_dir}/not-a-workspace");
    std::fs::create_dir_all(&foreign).expect("foreign dir");
    // Removed at the end, also when the test fails.
    struct RemoveOnDrop(String);
    impl Drop for RemoveOnDrop {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _foreign_guard = RemoveOnDrop(foreign.clone());

    // The race: the operator killed as soon as the object is gone, before the directory is.
    delete(&env, "raced").await;
    env.wait_gone::<Sandbox>("raced", 30).await;
    env.operators[0].kill();
    // And a directory orphaned for certain: with no operator running, the finalizer is
    // dropped by hand (what a kill right after the operator's own removal of it leaves) and
    // the garbage collector takes the pod.
    let doomed_pod = doomed
        .status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .expect("pod");
    env.api::<Sandbox>()
        .patch(
            "doomed",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("drop finalizer");
    delete(&env, "doomed").await;
    env.wait_gone::<Sandbox>("doomed", 30).await;
    let doomed_dir = dir_of(&env, &doomed);
    assert!(
        Path::new(&doomed_dir).join("notes.md").exists(),
        "orphaned: no operator ran"
    );
    // The startup pass removes what no pod mounts; a pod still stopping is waited for, a pod
    // not yet told to stop is left to a later pass: wait until the collector has told it.
    for _ in 0..300 {
        let p = env
            .api::<Pod>()
            .get_opt(&doomed_pod)
            .await
            .expect("get pod");
        if p.is_none_or(|p| p.metadata.deletion_timestamp.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let op = env.start_operator(&[]);
    common::wait_removed(&env, &doomed_dir, 60).await;
    common::wait_removed(&env, &dir_of(&env, &raced), 60).await;
    let count = swept(&env, op, 1.0).await;
    assert!(
        count >= 1.0,
        "the restarted operator's sweep removed the orphan: {count}"
    );

    // Untouched: the live sandbox (and its files), the Suspended one's directory, and the
    // directory that is not a workspace.
    assert_eq!(
        std::fs::read_to_string(Path::new(&dir_of(&env, &live)).join("kept.txt")).expect("kept"),
        "kept\n"
    );
    assert!(Path::new(&dir_of(&env, &sleeper)).join("notes.md").exists());
    assert!(Path::new(&foreign).exists());
    let (code, out) = sh(&env, &live_pod, "cat notes.md").await;
    assert_eq!((code, out.as_str()), (Some(0), "live"));
    // No sweep pod left behind by either operator.
    let helpers = ListParams::default().labels(&format!(
        "{} in (list,sweep)",
        agentbox_operator::controller::helper_pod::HELPER_LABEL
    ));
    no_pods_left(&env.api::<Pod>(), &helpers).await;
    env.finish().await;
}

/// Deletes a namespace the test made when the test ends, also when it fails.
struct NamespaceGone(String);

impl Drop for NamespaceGone {
    fn drop(&mut self) {
        let _ = common::kubectl(&["delete", "namespace", &self.0, "--wait=false"], "");
    }
}

/// Deleting a tenant's namespace deletes its Sandboxes while the namespace takes no new pods:
/// the sweep's helper pod runs in `--helper-namespace` instead, and the directories go.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn deleting_a_namespace_removes_its_workspace_directories() {
    use k8s_openapi::api::core::v1::Namespace;
    let mut env = TestEnv::new("delete-ns").await;
    let nss: kube::Api<Namespace> = kube::Api::all(env.client.clone());
    let helpers = format!("{}-helpers", env.ns);
    let ns_obj: Namespace =
        serde_json::from_value(json!({"metadata": {"name": helpers}})).expect("namespace");
    nss.create(&Default::default(), &ns_obj)
        .await
        .expect("create the helper namespace");
    let _cleanup = NamespaceGone(helpers.clone());
    // The operator's own namespace holds its leader Lease too (as the chart has it): one in
    // the deleted namespace would go with it, and the operator with its leadership.
    env.start_operator(&[
        &format!("--helper-namespace={helpers}"),
        &format!("--leader-election-namespace={helpers}"),
    ]);
    let mut dirs = Vec::new();
    for name in ["a", "b"] {
        let s = ready(&env, name).await;
        let dir = dir_of(&env, &s);
        assert!(Path::new(&dir).join("notes.md").exists(), "{dir}");
        dirs.push(dir);
    }
    common::delete_namespace_and_wait(&env).await;
    for dir in &dirs {
        common::wait_removed(&env, dir, 60).await;
    }
    // The helper pod went too.
    let pods: kube::Api<Pod> = kube::Api::namespaced(env.client.clone(), &helpers);
    // (The network check's beacon lives there too, as the operator's namespace: not a helper.)
    no_pods_left(&pods, &common::not_the_beacon()).await;
    env.finish().await;
}
