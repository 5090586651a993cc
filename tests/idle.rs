//! `spec.lifecycle.idleTimeout` against the real local cluster: an idle sandbox suspends itself
//! (with and without its on-stop snapshot) and says why, a harness that takes the scope's guard
//! keeps it alive, `get_or_create` brings a suspended one back Ready with its workspace, a
//! suspended sandbox costs no writes, and admission refuses bad timeouts.

mod common;

use std::time::Duration;

use agentbox_api::crd::{
    LifecycleMode, Sandbox, SandboxPhase, SandboxSnapshot, SandboxSpec, Scope, ScopeKind,
    SnapshotPhase, StartBranch,
};
use agentbox_api::exec::ExecRequest;
use agentbox_api::labels;
use agentbox_client::client::{SandboxHandle, Sandboxes};
use common::{TestEnv, create_sandbox, phase_is};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::ListParams;
use serde_json::json;

/// The shortest idle timeout admission takes: keeps these tests short.
const IDLE: &str = "10s";

fn agent(name: &str) -> Scope {
    Scope {
        kind: ScopeKind::Agent,
        agent: Some(name.into()),
        user: None,
        session: None,
    }
}

fn spec(extra: serde_json::Value) -> SandboxSpec {
    let mut s = json!({
        "image": common::BASE_IMAGE,
        "imagePullPolicy": "Never",
        "scope": {"kind": "Global"},
        "lifecycle": {"idleTimeout": IDLE},
    });
    for (k, v) in extra.as_object().expect("object") {
        s[k] = v.clone();
    }
    serde_json::from_value(s).expect("spec")
}

/// Condition: suspended by the spec and the status, the pod gone from the status.
fn suspended(s: Option<&Sandbox>) -> bool {
    s.is_some_and(|s| {
        s.spec.lifecycle.mode == LifecycleMode::Suspended
            && s.status.as_ref().is_some_and(|st| {
                st.phase == Some(SandboxPhase::Suspended) && st.pod_name.is_none()
            })
    })
}

fn condition<'a>(
    s: &'a Sandbox,
    type_: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    s.status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("no {type_} condition: {s:#?}"))
}

/// The CRDs are cluster-wide and other branches' tests apply theirs: a Sandbox CRD without
/// `idleTimeout` prunes it from the object, and nothing could go idle.
fn assert_kept_idle_timeout(s: &Sandbox) {
    assert!(
        s.spec.lifecycle.idle_timeout.is_some(),
        "the API server dropped spec.lifecycle.idleTimeout: another branch's tests applied a Sandbox CRD without it during this test"
    );
}

/// Writes (create, update, patch, delete) the operator made in the namespace at or after
/// `since`, from the API server's audit log, as `verb resource/name` lines. The renewals of
/// its leader-election Lease (the test operators keep theirs in the test namespace) are the
/// operator's own heartbeat, not a cost of any sandbox, and are left out.
fn operator_writes_since(env: &TestEnv, since: Timestamp) -> Vec<String> {
    common::audit_log_text()
        .lines()
        .filter(|l| l.contains(&env.ns))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && e["objectRef"]["namespace"] == env.ns.as_str()
                && ["create", "update", "patch", "delete"]
                    .contains(&e["verb"].as_str().unwrap_or_default())
                && e["userAgent"]
                    .as_str()
                    .is_some_and(|u| u.starts_with("agentbox-operator"))
                && e["objectRef"]["name"] != "agentbox-operator-leader"
                && e["requestReceivedTimestamp"]
                    .as_str()
                    .and_then(|t| t.parse::<Timestamp>().ok())
                    .is_some_and(|t| t >= since)
        })
        .map(|e| {
            format!(
                "{} {}{}/{}",
                e["verb"].as_str().unwrap_or_default(),
                e["objectRef"]["resource"].as_str().unwrap_or_default(),
                e["objectRef"]["subresource"]
                    .as_str()
                    .map(|s| format!("/{s}"))
                    .unwrap_or_default(),
                e["objectRef"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect()
}

/// A namespace with an operator, and the Ready sandbox of Agent scope `agent` that a harness
/// got with `get_or_create`.
async fn started(prefix: &str, agent_id: &str) -> (TestEnv, Sandboxes, Scope, SandboxHandle) {
    let mut env = TestEnv::new(prefix).await;
    env.start_operator(&[]);
    let sandboxes = Sandboxes::new(env.client.clone(), &env.ns);
    let scope = agent(agent_id);
    let mut sbx = sandboxes
        .get_or_create(&scope, spec(json!({})))
        .await
        .expect("create");
    sbx.wait_ready(Duration::from_secs(120))
        .await
        .expect("Ready");
    assert_kept_idle_timeout(sbx.sandbox());
    (env, sandboxes, scope, sbx)
}

/// The operator's `agentbox_idle_suspensions_total`.
async fn idle_suspensions(env: &TestEnv) -> f64 {
    env.counter(0, "agentbox_idle_suspensions_total").await
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn an_idle_sandbox_suspends_itself_costs_nothing_and_get_or_create_brings_it_back() {
    let (env, sandboxes, scope, sbx) = started("idle", "idler").await;
    let name = sbx.name().to_string();
    let first_pod = sbx.pod_name();
    // A call, under the guard as a harness makes it: the clock starts at its release.
    let g = sandboxes
        .guard(&scope, Some(Duration::from_secs(30)))
        .await
        .expect("guard");
    sbx.write_file("kept.txt", "still here\n")
        .await
        .expect("write");
    g.release().await.expect("release");

    let s = env.wait_for::<Sandbox>(&name, 90, suspended).await;
    let st = s.status.clone().expect("status");
    let idle_since = st.idle_since.clone().expect("status.idleSince").0;
    let ready = condition(&s, "Ready");
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason, "IdleTimeout", "{ready:?}");
    assert!(
        ready.message.contains("idleTimeout (10s)")
            && ready.message.contains(&idle_since.to_string()),
        "{}",
        ready.message
    );
    assert_eq!(condition(&s, "PodReady").reason, "IdleTimeout");
    // It went idle no earlier than the call's end and was suspended no earlier than the
    // timeout after (the status's own clock readings, not this test's).
    assert!(
        ready.last_transition_time.0 >= idle_since + Duration::from_secs(10),
        "suspended at {} though idle only since {idle_since}",
        ready.last_transition_time.0
    );
    assert_eq!(
        common::events(&env, &name, "IdleTimeout").await.len(),
        1,
        "one Event per idle suspension"
    );
    assert!(
        common::events_now(&env, &name, "Suspended")
            .await
            .is_empty(),
        "and no plain Suspended one"
    );
    env.wait_gone::<Pod>(&first_pod, 60).await;
    assert_eq!(idle_suspensions(&env).await, 1.0);

    // The suspension's own last writes (its guard released, the Guarded condition that
    // follows) can land after the pod is gone: later under gVisor, where a pod takes longer to
    // stop (seen in CI's gVisor lane). The quiet window starts once three seconds pass
    // without an operator write, waiting at most a minute for that.
    for _ in 0..20 {
        let mark = Timestamp::now();
        tokio::time::sleep(Duration::from_secs(3)).await;
        if operator_writes_since(&env, mark).is_empty() {
            break;
        }
    }
    // Suspended, nothing changes: no writes at all.
    let quiet_from = Timestamp::now();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let writes = operator_writes_since(&env, quiet_from);
    assert!(
        writes.is_empty(),
        "a suspended sandbox cost writes: {writes:?}"
    );

    // The harness's next call: get_or_create resumes it and it is Ready on its old workspace.
    let mut back = sandboxes
        .get_or_create(&scope, spec(json!({})))
        .await
        .expect("get_or_create");
    back.wait_ready(Duration::from_secs(120))
        .await
        .expect("Ready again");
    let st = back.sandbox().status.clone().expect("status");
    assert_eq!(back.sandbox().spec.lifecycle.mode, LifecycleMode::Running);
    assert_eq!(
        st.workspace.and_then(|w| w.last_start_branch),
        Some(StartBranch::Reattached),
        "the workspace was kept"
    );
    assert_eq!(condition(back.sandbox(), "Ready").reason, "Ready");
    // A call as harnesses make it: Ready, then the guard, held over the call.
    let g = back
        .ready_guard(Duration::from_secs(120), Some(Duration::from_secs(30)))
        .await
        .expect("ready and guarded");
    let text = back.read_file("kept.txt").await.expect("read");
    assert_eq!(text, b"still here\n");
    g.release().await.expect("release");
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_harness_taking_the_guard_keeps_its_sandbox_alive() {
    let (env, sandboxes, scope, mut sbx) = started("idle-busy", "busy").await;
    let name = sbx.name().to_string();
    let pod_uid = |s: &Sandbox| {
        s.status
            .as_ref()
            .and_then(|st| st.workspace.as_ref())
            .and_then(|w| w.initialized_pod_uid.clone())
    };
    let first = pod_uid(sbx.sandbox());

    // Short calls, 4 s apart, for three times the timeout: each take restarts the clock.
    for i in 0..8 {
        let g = sandboxes
            .guard(&scope, Some(Duration::from_secs(30)))
            .await
            .expect("guard");
        let out = sbx
            .exec(ExecRequest::shell(format!("echo call {i}")))
            .await
            .expect("exec under the guard");
        assert_eq!(out.stdout_str().trim(), format!("call {i}"));
        g.release().await.expect("release");
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    // One long call, held (and renewed) for twice the timeout.
    let g = sandboxes
        .guard(&scope, Some(Duration::from_secs(30)))
        .await
        .expect("guard");
    tokio::time::sleep(Duration::from_secs(20)).await;
    let out = sbx
        .exec(ExecRequest::shell("echo still"))
        .await
        .expect("exec after a long hold");
    assert_eq!(out.stdout_str().trim(), "still");
    assert!(!g.is_lost());
    let s = sbx.refresh().await.expect("refresh").clone();
    assert_eq!(s.spec.lifecycle.mode, LifecycleMode::Running, "{s:#?}");
    assert_eq!(
        s.status.as_ref().and_then(|st| st.phase),
        Some(SandboxPhase::Ready)
    );
    assert_eq!(pod_uid(&s), first, "the same pod all along");
    assert!(
        common::events_now(&env, &name, "IdleTimeout")
            .await
            .is_empty()
    );
    g.release().await.expect("release");

    // Left alone after that, it goes idle.
    env.wait_for::<Sandbox>(&name, 90, suspended).await;
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn an_idle_suspension_takes_the_on_stop_snapshot_first() {
    let mut env = TestEnv::new("idle-snap").await;
    let (flags, _store, dir) = common::file_store(&env.ns);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    env.start_operator(&flags);
    create_sandbox(
        &env,
        "keeper",
        json!({
            "image": common::BASE_IMAGE,
            "imagePullPolicy": "Never",
            "scope": {"kind": "Agent", "agent": "keeper"},
            "snapshot": {"onStop": true},
            "lifecycle": {"idleTimeout": IDLE},
        }),
    )
    .await
    .expect("create");
    let s = env
        .wait_for::<Sandbox>("keeper", 120, phase_is("Ready"))
        .await;
    assert_kept_idle_timeout(&s);
    let pod = s
        .status
        .as_ref()
        .and_then(|st| st.pod_name.clone())
        .unwrap();
    common::sh(&env, &pod, "echo saved > /workspace/saved.txt").await;

    let s = env.wait_for::<Sandbox>("keeper", 120, suspended).await;
    assert_eq!(condition(&s, "Ready").reason, "IdleTimeout");
    let snaps = env
        .api::<SandboxSnapshot>()
        .list(&ListParams::default().labels(&labels::scope_selector(&s.spec.scope)))
        .await
        .expect("list snapshots")
        .items;
    assert_eq!(snaps.len(), 1, "{snaps:#?}");
    let snap = &snaps[0];
    assert_eq!(
        snap.status.as_ref().and_then(|st| st.phase),
        Some(SnapshotPhase::Ready),
        "the pod went only after its snapshot: {snap:#?}"
    );
    let last = s
        .status
        .as_ref()
        .and_then(|st| st.last_snapshot.clone())
        .expect("status.lastSnapshot");
    assert_eq!(last.name, snap.name_any());
    assert_eq!(common::events(&env, "keeper", "IdleTimeout").await.len(), 1);
    common::finish_with_snapshots(env, Some(&dir)).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn bad_idle_timeouts_are_refused_at_admission() {
    let env = TestEnv::new("idle-adm").await;
    // Through kubectl, as a user would apply them (the typed client could not even send a
    // malformed duration).
    for (value, message) in [
        ("5s", "idleTimeout must be at least 10s"),
        (
            "2 minutes",
            "idleTimeout must be a duration such as 90s, 15m or 1h30m",
        ),
        (
            "60",
            "idleTimeout must be a duration such as 90s, 15m or 1h30m",
        ),
    ] {
        let obj = json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "bad", "namespace": env.ns},
            "spec": {
                "image": common::BASE_IMAGE,
                "scope": {"kind": "Global"},
                "lifecycle": {"idleTimeout": value},
            },
        });
        let (ok, _, stderr) = common::kubectl(&["create", "-f", "-"], &obj.to_string());
        assert!(!ok, "{value} was accepted");
        assert!(stderr.contains(message), "{value}: {stderr}");
    }
    let ok = create_sandbox(
        &env,
        "ok",
        json!({
            "image": common::BASE_IMAGE,
            "scope": {"kind": "Global"},
            "lifecycle": {"mode": "Suspended", "idleTimeout": "1h30m"},
        }),
    )
    .await
    .expect("a good one is taken");
    assert_kept_idle_timeout(&ok);
    env.finish().await;
}
