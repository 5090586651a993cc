//! The operator's metrics endpoint and structured logs against the real local cluster: after a
//! create, a snapshot, a restore and a failure of each, every series the operator registers for
//! them is scraped with values that match what happened, and each reconcile's log lines carry
//! its reconcile id and object. Snapshots go to a `file://` store.

mod common;

use std::time::Duration;

use agentbox_api::crd::{Sandbox, SandboxSnapshot, SnapshotPhase, StartBranch};
use common::{TestEnv, create_sandbox, phase_is, sh, snapshot_finished, take_snapshot};
use kube::api::PostParams;
use serde_json::json;

fn spec(user: &str) -> serde_json::Value {
    json!({
        "image": common::BASE_IMAGE,
        "imagePullPolicy": "Never",
        "scope": {"kind": "User", "agent": "metrics-tests", "user": user},
    })
}

/// The sum of the samples named `name` whose labels include every one of `labels`; `None`
/// when there is no such sample.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (n, set) = series
            .split_once('{')
            .map_or((series, ""), |(n, rest)| (n, rest.trim_end_matches('}')));
        let all = labels
            .iter()
            .all(|(k, v)| set.split(',').any(|kv| kv == format!("{k}=\"{v}\"")));
        if n == name && all {
            let v: f64 = value.parse().expect("sample value");
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

/// Scrapes the operator until `ok` holds for the text (the phase gauge follows the watch, a
/// moment behind the status writes the test waited for), or panics with the last scrape.
async fn scrape_until(env: &TestEnv, what: &str, ok: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    for _ in 0..150 {
        if let Some((200, body)) = env.operators[0].get("/metrics").await {
            if ok(&body) {
                return body;
            }
            last = body;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{what} never held; last scrape:\n{last}");
}

fn at_least(text: &str, name: &str, labels: &[(&str, &str)], min: f64) {
    let v = sample(text, name, labels);
    assert!(
        v.is_some_and(|v| v >= min),
        "{name}{labels:?} = {v:?}, want ≥ {min}:\n{text}"
    );
}

fn branch(s: &Sandbox) -> Option<StartBranch> {
    s.status
        .as_ref()
        .and_then(|st| st.workspace.as_ref())
        .and_then(|w| w.last_start_branch)
}

/// A SandboxSnapshot of a sandbox that does not exist: Failed with `SandboxNotFound`.
async fn failed_snapshot(env: &TestEnv) {
    let obj: SandboxSnapshot = serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1",
        "kind": "SandboxSnapshot",
        "metadata": {"name": "orphan"},
        "spec": {"sandboxRef": {"name": "nobody"}},
    }))
    .expect("snapshot json");
    env.api::<SandboxSnapshot>()
        .create(&PostParams::default(), &obj)
        .await
        .expect("create orphan");
    let s = env
        .wait_for::<SandboxSnapshot>("orphan", 120, snapshot_finished)
        .await;
    assert_eq!(
        s.status.as_ref().and_then(|st| st.phase),
        Some(SnapshotPhase::Failed)
    );
}

/// The reconcile spans of sandbox `name` that the operator's JSON log lines were written in.
fn reconcile_spans(env: &TestEnv, name: &str) -> Vec<(serde_json::Value, String)> {
    let text = std::fs::read_to_string(&env.operators[0].log).expect("operator log");
    let mut out = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let message = v["fields"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for span in v["spans"].as_array().into_iter().flatten() {
            if span["name"] == "reconcile"
                && span["controller"] == "sandbox"
                && span["object"] == name
            {
                out.push((span.clone(), message.clone()));
            }
        }
    }
    out
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn the_metrics_endpoint_exposes_each_series_after_create_snapshot_and_restore() {
    let mut env = TestEnv::new("metrics").await;
    let (flags, _store, dir) = common::file_store(&env.ns);
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.push("--log-json");
    env.start_operator(&args);

    // Create: a fresh start.
    create_sandbox(&env, "a", spec("alice"))
        .await
        .expect("create a");
    let a = env.wait_for::<Sandbox>("a", 300, phase_is("Ready")).await;
    assert_eq!(branch(&a), Some(StartBranch::Fresh));
    let pod_a = a
        .status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .expect("pod");
    let (code, _) = sh(
        &env,
        &pod_a,
        "head -c 1048576 /dev/urandom > /workspace/blob",
    )
    .await;
    assert_eq!(code, Some(0));

    // A snapshot, and a new sandbox of the same scope that restores it.
    let s1 = take_snapshot(&env, "s1", "a", "Delete").await;
    let size = s1.status.as_ref().and_then(|s| s.size_bytes).expect("size");
    assert!(size > 1 << 20, "{size}");
    create_sandbox(&env, "b", spec("alice"))
        .await
        .expect("create b");
    let b = env.wait_for::<Sandbox>("b", 300, phase_is("Ready")).await;
    assert_eq!(branch(&b), Some(StartBranch::Restored), "{b:#?}");

    // A failure of each: a snapshot of no sandbox, a restore of no snapshot.
    failed_snapshot(&env).await;
    let mut named = spec("carol");
    named["snapshot"] = json!({"restore": "Named", "name": "missing"});
    create_sandbox(&env, "c", named).await.expect("create c");
    env.wait_for::<Sandbox>("c", 300, phase_is("Initializing"))
        .await;

    let text = scrape_until(&env, "Ready 2, Initializing 1", |t| {
        sample(t, "agentbox_sandboxes", &[("phase", "Ready")]) == Some(2.0)
            && sample(t, "agentbox_sandboxes", &[("phase", "Initializing")]) == Some(1.0)
    })
    .await;
    assert_eq!(
        sample(&text, "agentbox_sandboxes", &[("phase", "Failed")]),
        Some(0.0)
    );
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        sample(&text, "agentbox_build_info", &[("version", version)]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, "agentbox_leader", &[]), Some(1.0), "{text}");
    let ready = "agentbox_sandbox_ready_seconds_count";
    let fresh = [("branch", "fresh"), ("start", "cold")];
    let restored = [("branch", "restored"), ("start", "cold")];
    assert_eq!(sample(&text, ready, &fresh), Some(1.0), "{text}");
    assert_eq!(sample(&text, ready, &restored), Some(1.0), "{text}");
    // Seconds since creation: more than nothing, less than the test has run.
    let secs = sample(&text, "agentbox_sandbox_ready_seconds_sum", &fresh).expect("sum");
    assert!(secs > 0.0 && secs < 300.0, "{secs}");

    // Bytes counted are the snapshot's, once; the restore read the same object.
    assert_eq!(
        sample(&text, "agentbox_snapshot_bytes_total", &[]),
        Some(size as f64),
        "{text}"
    );
    assert_eq!(
        sample(&text, "agentbox_restore_bytes_total", &[]),
        Some(size as f64),
        "{text}"
    );
    at_least(&text, "agentbox_snapshot_duration_seconds_count", &[], 1.0);
    at_least(&text, "agentbox_restore_duration_seconds_count", &[], 1.0);
    let failed = "agentbox_snapshot_failures_total";
    at_least(&text, failed, &[("reason", "SandboxNotFound")], 1.0);
    let refused = "agentbox_restore_failures_total";
    at_least(&text, refused, &[("reason", "SnapshotNotFound")], 1.0);
    let waited = "agentbox_guard_wait_seconds_count";
    at_least(
        &text,
        waited,
        &[("op", "snapshot"), ("outcome", "acquired")],
        1.0,
    );
    at_least(
        &text,
        waited,
        &[("op", "restore"), ("outcome", "acquired")],
        1.0,
    );
    // No exec failed, and the counters say so from zero.
    let errors = "agentbox_exec_errors_total";
    assert_eq!(sample(&text, errors, &[("op", "snapshot")]), Some(0.0));
    assert_eq!(
        sample(&text, errors, &[("op", "workspace"), ("kind", "connect")]),
        Some(0.0)
    );
    at_least(
        &text,
        "agentbox_reconciles_total",
        &[("controller", "sandbox")],
        1.0,
    );
    // Every name exposed is one the operator registers.
    let names = agentbox_operator::metrics::Metrics::default()
        .sample_names()
        .clone();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        assert!(names.contains(name), "{name} not registered");
    }

    // Each reconcile's log lines carry its own id, and the object's namespace and name.
    let spans = reconcile_spans(&env, "a");
    assert!(
        spans.iter().any(|(_, m)| m.starts_with("created pod")),
        "{spans:?}"
    );
    let ids: std::collections::BTreeSet<&str> = spans
        .iter()
        .filter_map(|(s, _)| s["reconcile_id"].as_str())
        .collect();
    assert!(ids.len() > 1, "one id per reconcile: {ids:?}");
    for (span, _) in &spans {
        assert_eq!(span["namespace"], env.ns.as_str(), "{span}");
        assert_eq!(span["generation"], 1, "{span}");
    }

    // A deleted sandbox leaves the count at the next scrape.
    env.api::<Sandbox>()
        .delete("c", &Default::default())
        .await
        .expect("delete c");
    env.wait_gone::<Sandbox>("c", 120).await;
    scrape_until(&env, "Initializing 0", |t| {
        sample(t, "agentbox_sandboxes", &[("phase", "Initializing")]) == Some(0.0)
    })
    .await;

    common::delete_snapshots(&env).await;
    common::finish_with_snapshots(env, Some(&dir)).await;
}
