//! Out of memory said out loud: a command that its sandbox's memory limit kills is
//! `ExecError::OutOfMemory` in the Rust client (one-shot exec and session) and the CLI, not exit
//! code 137 or a cut stream; a kill of the whole container is `OutOfMemory { container: true }`,
//! and the Sandbox gets an `OOMKilled` Event and `status.lastOOMKill`.
//!
//! Under runc the kernel's OOM killer ends the biggest process of the container's memory cgroup,
//! the command; the container lives on. To kill the container itself the test raises the
//! keep-alive's (PID 1's) `oom_score_adj` first. Under gVisor (hack/test's gVisor lane) the
//! sandbox's own runtime counts against the limit, and running out kills the whole sandbox.
//!
//! Memory hogs bound themselves: `head -c 200 MiB /dev/zero | tail` (busybox's `tail` keeps the
//! one endless line whole) allocates at most 200 MiB, and every command has a timeout.

mod common;

use std::time::Duration;

use agentbox_api::crd::{Sandbox, SandboxSpec, Scope, ScopeKind};
use agentbox_api::exec::{ExecError, ExecRequest};
use agentbox_client::client::{ClientError, Sandboxes};
use common::{TestEnv, cli, events, phase_is};
use serde_json::json;

/// 200 MiB of zeros into `tail`, which holds them as one line: far past a 64 MiB limit.
const HOG: &str = "head -c 209715200 /dev/zero | tail";

fn spec(scope: &Scope) -> SandboxSpec {
    serde_json::from_value(json!({
        "image": common::BASE_IMAGE,
        "imagePullPolicy": "Never",
        "scope": scope,
        "resources": {"limits": {"memory": "64Mi"}, "requests": {"memory": "64Mi"}},
    }))
    .expect("spec")
}

fn oom(r: Result<agentbox_api::exec::ExecOutput, ClientError>) -> bool {
    match r {
        Err(ClientError::Exec(ExecError::OutOfMemory { container })) => container,
        other => panic!("expected out of memory, got {other:?}"),
    }
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_command_killed_for_memory_is_out_of_memory_and_a_container_kill_an_oomkilled_event() {
    let mut env = TestEnv::new("oom").await;
    env.start_operator(&[]);
    let gvisor = common::matrix_runtime_class().is_some();
    let sbxs = Sandboxes::new(env.client.clone(), env.ns.clone());
    let scope = Scope {
        kind: ScopeKind::Agent,
        agent: Some("oom-tests".into()),
        user: None,
        session: None,
    };
    let mut h = sbxs
        .get_or_create(&scope, spec(&scope))
        .await
        .expect("create");
    h.wait_ready(Duration::from_secs(180)).await.expect("ready");
    let name = h.name().to_string();
    let hog = || ExecRequest::shell(HOG).timeout(Duration::from_secs(60));

    if !gvisor {
        // The command alone: the container lives on, and the sandbox answers as before.
        assert!(!oom(h.exec(hog()).await), "the command, not the container");
        let out = h
            .exec(ExecRequest::shell("echo alive"))
            .await
            .expect("exec");
        assert_eq!(out.stdout_str().trim(), "alive");
        let session = h.session();
        match session.run(hog()).await {
            Err(ExecError::OutOfMemory { container: false }) => {}
            other => panic!("session: expected out of memory, got {other:?}"),
        }
        let out = session
            .run(ExecRequest::shell("echo still"))
            .await
            .expect("session after");
        assert_eq!(out.stdout_str().trim(), "still");
        session.close().await;
        // The CLI says it too, with the code of a SIGKILL.
        let (code, _, err) = cli(&env, &["exec", &name, "--", "sh", "-c", HOG]);
        assert_eq!(code, Some(137), "{err}");
        assert!(err.contains("out of memory"), "{err}");
        assert!(
            events(&env, &name, "OOMKilled").await.is_empty(),
            "a command killed alone is the client's to report"
        );
    }

    // The whole container: under runc its PID 1 made the OOM killer's first choice; under gVisor
    // the sandbox dies of the hog anyway.
    let script = if gvisor {
        HOG.to_string()
    } else {
        format!("echo 1000 > /proc/1/oom_score_adj && {HOG}")
    };
    assert!(
        oom(h
            .exec(ExecRequest::shell(script).timeout(Duration::from_secs(60)))
            .await),
        "the whole container"
    );
    let ev = events(&env, &name, "OOMKilled").await;
    assert_eq!(ev.len(), 1, "one OOMKilled Event: {ev:?}");
    let note = ev[0].note.clone().unwrap_or_default();
    assert!(note.contains("limits.memory 64Mi"), "{note}");
    // The sandbox comes back (the kubelet restarts the container; the workspace is kept), its
    // status says when it was killed, and the Event is not repeated.
    let sbx = env
        .wait_for::<Sandbox>(&name, 120, |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref())
                .is_some_and(|st| st.last_oom_kill.is_some())
        })
        .await;
    let kill = sbx
        .status
        .and_then(|s| s.last_oom_kill)
        .expect("status.lastOOMKill");
    assert_eq!(kill.limit.as_deref(), Some("64Mi"));
    env.wait_for::<Sandbox>(&name, 120, phase_is("Ready")).await;
    let out = h
        .exec(ExecRequest::shell("echo back"))
        .await
        .expect("exec after");
    assert_eq!(out.stdout_str().trim(), "back");
    let ev = events(&env, &name, "OOMKilled").await;
    assert!(
        ev.len() == 1 && ev[0].series.as_ref().is_none_or(|s| s.count <= 1),
        "announced once: {ev:?}"
    );
    env.finish().await;
}
