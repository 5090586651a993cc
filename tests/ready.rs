//! Ready means a command runs (issue 42): a harness that waits for its sandbox to be Ready and
//! then runs a command must never be told that the container cannot be reached. Each trial
//! deletes the sandbox's pod (force, grace 0, or gracefully), watches the Sandbox from before
//! the delete, and at the first status that says Ready for a new pod runs a command in the pod
//! that status names, at once. A trial fails when the command does not run, or when the pod of
//! that name is not, at that moment, the one the status says the workspace was initialised in,
//! Running and ready.
//!
//! The trial with the node's containerd restarted as well stops and starts a shared component
//! of the cluster: hack/test runs it alone, after the lanes (like tests/chaos.rs's API-server
//! restart).

mod common;

use std::time::{Duration, Instant};

use agentbox_api::crd::{Sandbox, SandboxPhase};
use agentbox_api::exec::{self, ExecRequest, SANDBOX_CONTAINER};
use common::{TestEnv, create_sandbox, phase_is};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

/// Trials of each kind (`AGENTBOX_READY_TRIALS` overrides it for a quicker look by hand).
fn trials() -> usize {
    std::env::var("AGENTBOX_READY_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50)
}

/// How the pod is deleted.
#[derive(Clone, Copy, Debug)]
enum Delete {
    /// `--grace-period=0 --force`: the object goes at once, the kubelet stops the container
    /// after.
    Forced,
    /// The pod's own grace: the object goes once the kubelet has stopped it.
    Graceful,
}

/// The pod the workspace was initialised in, as the status says.
fn initialised_in(s: &Sandbox) -> Option<String> {
    s.status
        .as_ref()?
        .workspace
        .as_ref()?
        .initialized_pod_uid
        .clone()
}

/// Whether `pod` has UID `uid`, is Running, its container running and ready, and is not
/// being deleted.
fn runs_as(pod: &Pod, uid: &str) -> bool {
    let status = pod.status.as_ref();
    let container = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == SANDBOX_CONTAINER));
    pod.metadata.uid.as_deref() == Some(uid)
        && pod.metadata.deletion_timestamp.is_none()
        && status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && container
            .is_some_and(|c| c.ready && c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

/// A sandbox `name` of its own scope, Ready.
async fn ready_sandbox(env: &TestEnv, name: &str) -> Sandbox {
    let spec = json!({"image": common::BASE_IMAGE, "scope": {"kind": "Agent", "agent": name},
        "workspace": {"files": [{"path": "hello.txt", "content": "hi\n"}]}});
    create_sandbox(env, name, spec).await.expect("create");
    env.wait_for::<Sandbox>(name, 120, phase_is("Ready")).await
}

/// One trial: deletes the pod the Ready sandbox `name` names (`how`), and `also` beside it
/// (a containerd restart); at the first status that says Ready for another pod, runs a
/// command in the pod it names. `Err` says what went wrong.
async fn trial<F>(env: &TestEnv, name: &str, how: Delete, also: F) -> Result<Duration, String>
where
    F: std::future::Future<Output = Result<(), String>>,
{
    let sandboxes = env.api::<Sandbox>();
    let pods = env.api::<Pod>();
    let sbx = sandboxes.get(name).await.map_err(|e| e.to_string())?;
    let old = initialised_in(&sbx).ok_or("Ready without an initialised pod")?;
    let pod = sbx
        .status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .ok_or("Ready without a pod name")?;
    // Every version of the Sandbox from before the delete on.
    let wc = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut versions = watcher(sandboxes.clone(), wc).applied_objects().boxed();
    let first = versions.try_next().await.map_err(|e| e.to_string())?;
    if first.is_none() {
        return Err("the watch ended at once".into());
    }
    let dp = match how {
        Delete::Forced => DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        },
        Delete::Graceful => DeleteParams::default(),
    };
    let t0 = Instant::now();
    pods.delete(&pod, &dp).await.map_err(|e| e.to_string())?;
    also.await?;
    let ready = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(s) = versions.try_next().await.map_err(|e| e.to_string())? {
            let st = s.status.as_ref();
            let uid = initialised_in(&s);
            if st.and_then(|s| s.phase) == Some(SandboxPhase::Ready)
                && uid.as_ref().is_some_and(|u| *u != old)
            {
                return Ok(s);
            }
        }
        Err("the watch ended".to_string())
    })
    .await
    .map_err(|_| "not Ready again within 120 s".to_string())??;
    let took = t0.elapsed();
    let uid = initialised_in(&ready).unwrap_or_default();
    let named = ready
        .status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .unwrap_or_default();
    // The command, at once: what a harness does when its wait for Ready returns.
    let out = exec::run(
        &pods,
        &named,
        SANDBOX_CONTAINER,
        ExecRequest::argv(["sh", "-c", "cat /workspace/hello.txt"])
            .timeout(Duration::from_secs(30)),
    )
    .await;
    let seen = pods.get_opt(&named).await.map_err(|e| e.to_string())?;
    match out {
        Ok(o) if o.status.success() && o.stdout_str() == "hi\n" => {}
        Ok(o) => {
            return Err(format!(
                "the command at Ready failed ({}): {:?} {:?}",
                o.status,
                o.stdout_str(),
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        Err(e) => return Err(format!("the command at Ready did not run: {e}")),
    }
    // The pod read after the command: it can only have moved on, never back.
    if !seen.as_ref().is_some_and(|p| runs_as(p, &uid)) {
        let p = seen
            .as_ref()
            .map(|p| (p.metadata.uid.clone(), p.status.clone()));
        return Err(format!(
            "Ready names {named} initialised in {uid}, but that pod is {p:?}"
        ));
    }
    Ok(took)
}

/// Runs `n` trials of `how` on one sandbox; returns the failures and the times to Ready.
async fn trials_of<F, Fut>(
    env: &TestEnv,
    name: &str,
    how: Delete,
    n: usize,
    also: F,
) -> (Vec<String>, Vec<Duration>)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let (mut failed, mut took) = (Vec::new(), Vec::new());
    for i in 0..n {
        match trial(env, name, how, also()).await {
            Ok(d) => took.push(d),
            Err(e) => failed.push(format!("{how:?} #{i}: {e}")),
        }
        // The next trial starts from a Ready sandbox.
        env.wait_for::<Sandbox>(name, 120, phase_is("Ready")).await;
    }
    (failed, took)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// `trials()` deletes of the pod of one sandbox, each `how`, with nothing else going on.
async fn deletes(tag: &str, how: Delete) {
    let mut env = TestEnv::new(tag).await;
    env.start_operator(&[]);
    ready_sandbox(&env, "r").await;
    let n = trials();
    let (failures, took) = trials_of(&env, "r", how, n, || async { Ok(()) }).await;
    eprintln!(
        "[ready] {how:?}: {} of {n} trials failed; delete → Ready median {:?}",
        failures.len(),
        median(took)
    );
    let logs = env.operator_logs();
    env.finish().await;
    assert!(failures.is_empty(), "{failures:#?}\n{logs}");
}

// The two kinds of delete are two tests, so the harness runs them side by side (each with its
// own namespace and operator): one after the other they were the longest binary of CI's lanes.

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_command_runs_at_the_first_ready_after_a_forced_pod_delete() {
    deletes("ready-forced", Delete::Forced).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_command_runs_at_the_first_ready_after_a_graceful_pod_delete() {
    deletes("ready-graceful", Delete::Graceful).await;
}

/// Restarts the node's containerd (hack/cluster restart-containerd).
async fn restart_containerd() -> Result<(), String> {
    let status = tokio::task::spawn_blocking(|| {
        std::process::Command::new(common::repo_root().join("hack/cluster"))
            .arg("restart-containerd")
            .stdout(std::process::Stdio::null())
            .status()
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("hack/cluster restart-containerd: {status}"))
    }
}

/// Restarts the node's containerd: hack/test runs it alone (see the module's documentation).
#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_command_runs_at_the_first_ready_after_the_pod_is_deleted_and_containerd_restarts() {
    let mut env = TestEnv::new("ready-ctrd").await;
    env.start_operator(&[]);
    ready_sandbox(&env, "r").await;
    let n = trials();
    let (failures, took) = trials_of(&env, "r", Delete::Forced, n, restart_containerd).await;
    eprintln!(
        "[ready] forced delete + containerd restart: {} of {n} trials failed; delete → Ready median {:?}",
        failures.len(),
        median(took)
    );
    let logs = env.operator_logs();
    env.finish().await;
    assert!(failures.is_empty(), "{failures:#?}\n{logs}");
}
