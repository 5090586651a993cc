//! Out of memory said out loud: a command that its sandbox's memory limit kills is
//! `ExecError::OutOfMemory { container: false }` in the Rust client (one-shot exec and session)
//! and `out of memory` with exit code 137 in the CLI, not exit code 137 or a cut stream; a kill
//! of the whole container is `OutOfMemory { container: true }`, and the Sandbox gets one
//! `OOMKilled` Event and `status.lastOOMKill`. And the chart's admission warning for a small
//! memory limit under a RuntimeClass.
//!
//! Under runc the kernel's OOM killer ends the biggest process of the container's memory cgroup:
//! the command, and the container lives on. To kill the container itself, the sandbox's main
//! process (PID 1) grows its own memory when told (SIGUSR1), so that it is the biggest.
//! Under gVisor (hack/test's gVisor lane, `AGENTBOX_TEST_RUNTIME_CLASS=gvisor`) the kernel's OOM
//! killer ends the sandbox's runtime (the Sentry, which holds every process of the sandbox) when
//! a command passes the limit: the one-shot exec, the session and the CLI each say out of memory
//! of the whole container, from the kubelet's `OOMKilled` (docs/security.md, "Memory under
//! gVisor"), with the Event and `status.lastOOMKill`.
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
        // The keep-alive, and on SIGUSR1 the shell itself (PID 1) reads 200 MiB into a variable.
        "command": ["sh", "-c", "trap 'exit 0' TERM INT; trap 'x=$(head -c 209715200 /dev/zero | tr \\\\0 a)' USR1; while :; do sleep 1 & wait $!; done"],
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
    if common::matrix_runtime_class().is_some() {
        under_gvisor(&env, &mut h, &name).await;
        env.finish().await;
        return;
    }

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

    // The whole container: PID 1 grows until the kernel kills it, and every process with it,
    // the command that waits here too.
    assert!(
        oom(h
            .exec(ExecRequest::shell("kill -USR1 1; sleep 60").timeout(Duration::from_secs(90)))
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

/// Under gVisor a command over the limit takes the whole sandbox with it, whichever way it ran:
/// each is out of memory of the container, the sandbox publishes `OOMKilled` and records the
/// kill in its status, and comes back (the kubelet restarts the container) to answer again.
async fn under_gvisor(env: &TestEnv, h: &mut agentbox_client::client::SandboxHandle, name: &str) {
    let hog = || ExecRequest::shell(HOG).timeout(Duration::from_secs(60));
    // Until the sandbox answers again: the kubelet restarts the container (the Sandbox may
    // still say Ready while it does, and an exec then finds no container).
    let back = |h: &agentbox_client::client::SandboxHandle| {
        let h = h.clone();
        async move {
            env.wait_for::<Sandbox>(name, 180, phase_is("Ready")).await;
            for _ in 0..120 {
                if let Ok(out) = h.exec(ExecRequest::shell("echo back")).await
                    && out.stdout_str().trim() == "back"
                {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            panic!("the sandbox did not come back after its container was killed");
        }
    };

    // The one-shot exec.
    assert!(
        oom(h.exec(hog()).await),
        "under gVisor, the whole container"
    );
    let ev = events(env, name, "OOMKilled").await;
    assert!(!ev.is_empty(), "an OOMKilled Event");
    let note = ev[0].note.clone().unwrap_or_default();
    assert!(note.contains("limits.memory 64Mi"), "{note}");
    let sbx = env
        .wait_for::<Sandbox>(name, 120, |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref())
                .is_some_and(|st| st.last_oom_kill.is_some())
        })
        .await;
    let kill = sbx
        .status
        .and_then(|s| s.last_oom_kill)
        .expect("status.lastOOMKill");
    assert_eq!(kill.limit.as_deref(), Some("64Mi"));
    back(h).await;

    // The session.
    let session = h.session();
    match session.run(hog()).await {
        Err(ExecError::OutOfMemory { container: true }) => {}
        other => panic!("session: expected out of memory of the container, got {other:?}"),
    }
    session.close().await;
    back(h).await;

    // The CLI, with the code of a SIGKILL.
    let (code, _, err) = cli(env, &["exec", name, "--", "sh", "-c", HOG]);
    assert_eq!(code, Some(137), "{err}");
    assert!(err.contains("out of memory"), "{err}");
    back(h).await;
}

/// The chart's admission warning: a Sandbox under a RuntimeClass with a memory limit below
/// `admissionPolicy.runtimeMemoryWarning` is admitted with a warning that says the runtime's own
/// memory counts against the limit; one at or above it, or one without a RuntimeClass, is not.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn the_chart_warns_at_admission_of_a_small_memory_limit_under_a_runtime_class() {
    let env = TestEnv::new("oom-vap").await;
    // The chart's policies, named after and bound to this namespace only (watchNamespace).
    let rendered = common::helm_template(&[
        "--show-only",
        "templates/admissionpolicy.yaml",
        "--set",
        &format!("fullnameOverride={}", env.ns),
        "--set",
        &format!("watchNamespace={}", env.ns),
        "--set",
        "admissionPolicy.requiredRuntimeClass=false",
    ])
    .expect("helm template");
    assert!(rendered.contains("runtime-memory"), "{rendered}");
    let (ok, out, err) = common::kubectl(&["apply", "-f", "-"], &rendered);
    assert!(ok, "{out}{err}");
    let sandbox = |name: &str, rc: Option<&str>, memory: &str| {
        let mut spec = json!({"image": common::BASE_IMAGE, "imagePullPolicy": "Never",
            "scope": {"kind": "Agent", "agent": name},
            "resources": {"limits": {"memory": memory}}});
        if let Some(rc) = rc {
            spec["runtimeClassName"] = json!(rc);
        }
        json!({"apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": name, "namespace": env.ns}, "spec": spec})
        .to_string()
    };
    // Server-side dry runs: admitted (nothing is made), with the policy's warnings on stderr.
    // The binding takes effect once the API server has loaded it: try until it warns.
    let dry = |body: String| common::kubectl(&["create", "--dry-run=server", "-f", "-"], &body);
    let mut warned = String::new();
    for _ in 0..300 {
        let (ok, _, err) = dry(sandbox("small", Some("gvisor"), "64Mi"));
        assert!(ok, "a warning never refuses: {err}");
        if err.contains("Warning") {
            warned = err;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        warned.contains("under runtime class gvisor")
            && warned.contains("counts against resources.limits.memory 64Mi"),
        "{warned}"
    );
    for (name, rc, memory) in [("big", Some("gvisor"), "256Mi"), ("runc", None, "64Mi")] {
        let (ok, _, err) = dry(sandbox(name, rc, memory));
        assert!(ok && !err.contains("Warning"), "{name}: {err}");
    }
    let (ok, out, err) = common::kubectl(&["delete", "-f", "-", "--wait=false"], &rendered);
    assert!(ok, "{out}{err}");
    env.finish().await;
}
