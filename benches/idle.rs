//! Idle suspension: many Ready sandboxes with `lifecycle.idleTimeout` against one operator.
//!
//! `eval "$(hack/cluster env)"; cargo bench --bench idle` (release build). It starts the operator
//! (the release binary, leader election on as deployed) for a temporary namespace, creates
//! `BENCH_IDLE_N` (default 100) Running sandboxes with an idle timeout of
//! `BENCH_IDLE_TIMEOUT_SECS` (default 60), 8 creates in flight, nobody ever taking their guard,
//! and measures from one watch:
//! - when each became Ready and when it was Suspended (mode Suspended, phase Suspended, no pod
//!   in status): Ready → Suspended per sandbox (the timeout plus the operator's lag), and the
//!   time from the last Ready to the last suspension (target: all Suspended within 90 s of a
//!   60 s timeout);
//! - the operator's writes per sandbox from its create to its suspension (start, idle clock,
//!   suspension), by kind, from the API server's audit log;
//! - `BENCH_IDLE_REST_SECS` (default 60) at rest afterwards: the operator's writes per minute
//!   (target 0), leader-election Lease renewals counted apart.
//!
//! With `BENCH_RESULTS` set, each figure is also appended to that file as a JSON line.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use agentbox_api::crd::{LifecycleMode, Sandbox, SandboxPhase};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use serde_json::json;

mod common;

use common::{
    DeleteAll, LEADER_LEASE, OPERATOR_UA, audit_log, emit, env_num, leading_operator, namespace,
    p50_p95, read_audit,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const IDENTITY: &str = "bench-idle";

fn sandbox(i: usize, timeout: u64) -> Res<Sandbox> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": format!("i-{i:04}")},
        "spec": {"image": "docker.io/library/busybox:1.37", "imagePullPolicy": "Never",
            "scope": {"kind": "Session", "agent": "bench", "session": format!("i-{i}")},
            "lifecycle": {"idleTimeout": format!("{timeout}s")}},
    }))?)
}

fn is_ready(s: &Sandbox) -> bool {
    let st = s.status.as_ref();
    s.spec.lifecycle.mode == LifecycleMode::Running
        && st.and_then(|st| st.phase) == Some(SandboxPhase::Ready)
}

fn is_suspended(s: &Sandbox) -> bool {
    let st = s.status.as_ref();
    s.spec.lifecycle.mode == LifecycleMode::Suspended
        && st.and_then(|st| st.phase) == Some(SandboxPhase::Suspended)
        && st.is_some_and(|st| st.pod_name.is_none())
}

#[tokio::main]
async fn main() -> Res<()> {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return Ok(()); // `cargo test --benches` / `--list`: nothing to list.
    }
    let n = env_num("BENCH_IDLE_N", 100) as usize;
    let timeout = env_num("BENCH_IDLE_TIMEOUT_SECS", 60);
    let rest = env_num("BENCH_IDLE_REST_SECS", 60);
    let audit = audit_log()?;
    let client = agentbox_api::kube_client().await?;
    let cleanup = namespace(&client, "bench-idle").await?;
    let ns = cleanup.1.clone();
    let (_op, log) = leading_operator(&client, &ns, IDENTITY).await?;
    eprintln!(
        "operator leads in {ns}; creating {n} sandboxes with idleTimeout {timeout}s (log {})",
        log.display()
    );

    let sbxs: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let _delete_all = DeleteAll::of(&client, &ns);
    let mut events = watcher::watcher(sbxs.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let (t0, start_ts) = (Instant::now(), Timestamp::now());
    let creates = futures::stream::iter(0..n)
        .map(|i| {
            let sbxs = &sbxs;
            async move {
                sbxs.create(&PostParams::default(), &sandbox(i, timeout)?)
                    .await?;
                Ok::<_, Box<dyn std::error::Error>>(())
            }
        })
        .buffer_unordered(8)
        .try_collect::<Vec<()>>();
    let mut ready: HashMap<String, Instant> = HashMap::new();
    let mut suspended: HashMap<String, Instant> = HashMap::new();
    let watch = async {
        while suspended.len() < n {
            let next = tokio::time::timeout(Duration::from_secs(300), events.next())
                .await
                .map_err(|_| {
                    format!(
                        "{} Ready, {} Suspended of {n} after 300 s quiet",
                        ready.len(),
                        suspended.len()
                    )
                })?
                .ok_or("watch ended")?;
            // A watch the loaded API server expired (410) is listed again by the watcher on
            // the next poll: a state missed meanwhile is seen late, never lost.
            let s = match next {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("watch: {e}; the watcher lists again");
                    continue;
                }
            };
            let name = s.name_any();
            if is_ready(&s) {
                ready.entry(name.clone()).or_insert_with(Instant::now);
            }
            if is_suspended(&s) && ready.contains_key(&name) {
                suspended.entry(name).or_insert_with(Instant::now);
            }
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    };
    let check = async {
        // The CRDs are cluster-wide: one without idleTimeout (an older install) prunes it, and
        // nothing would ever go idle. Say so instead of waiting out the timeout.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let first = sbxs.get("i-0000").await?;
        if first.spec.lifecycle.idle_timeout.is_none() {
            return Err::<(), Box<dyn std::error::Error>>(
                "the cluster's Sandbox CRD dropped spec.lifecycle.idleTimeout: apply crds/agentbox.yaml".into(),
            );
        }
        futures::future::pending().await
    };
    let (created, watched) = tokio::select! {
        r = async { futures::join!(creates, watch) } => r,
        Err(e) = check => return Err(e),
    };
    created?;
    watched?;
    let all_suspended = Timestamp::now();
    let last_ready = ready.values().max().copied().unwrap_or(t0);
    let last_suspended = suspended.values().max().copied().unwrap_or(t0);
    let lag: Vec<f64> = suspended
        .iter()
        .filter_map(|(k, t)| Some(t.duration_since(*ready.get(k)?).as_secs_f64()))
        .collect();
    let lag_max = lag.iter().copied().fold(0.0, f64::max);
    let (lag_p50, lag_p95) = p50_p95(lag);
    let tail = last_suspended.duration_since(last_ready).as_secs_f64();
    let ready_all = last_ready.duration_since(t0).as_secs_f64();

    // Let the last writes land before the window at rest opens.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rest_from = Timestamp::now();
    eprintln!("all {n} suspended; {rest} s at rest");
    tokio::time::sleep(Duration::from_secs(rest)).await;
    let rest_to = Timestamp::now();
    let writes = read_audit(&audit, &ns);
    let ours = |w: &&common::Write| w.user_agent.starts_with(OPERATOR_UA) && w.name != LEADER_LEASE;
    let mut by_kind: BTreeMap<String, usize> = BTreeMap::new();
    let lifetime_writes = writes
        .iter()
        .filter(ours)
        .filter(|w| w.at >= start_ts && w.at <= all_suspended)
        .inspect(|w| *by_kind.entry(w.kind()).or_default() += 1)
        .count();
    let at_rest: Vec<String> = writes
        .iter()
        .filter(ours)
        .filter(|w| w.at >= rest_from && w.at <= rest_to)
        .map(|w| format!("{} {}", w.kind(), w.name))
        .collect();
    let leader = writes
        .iter()
        .filter(|w| w.name == LEADER_LEASE && w.at >= rest_from && w.at <= rest_to)
        .count();
    let per_min = |k: usize| k as f64 * 60.0 / rest as f64;

    println!("idle suspension: {n} Ready sandboxes, idleTimeout {timeout}s, one operator");
    println!("  all Ready {ready_all:.1} s after the first create");
    println!(
        "  Ready → Suspended: p50 {lag_p50:.1} s, p95 {lag_p95:.1} s, max {lag_max:.1} s (timeout {timeout} s)"
    );
    println!("  last Ready → all Suspended: {tail:.1} s");
    println!(
        "  operator writes from the first create to the last suspension: {lifetime_writes} ({:.1} per sandbox: start, idle clock, suspension) {by_kind:?}",
        lifetime_writes as f64 / n as f64
    );
    println!(
        "  at rest ({rest} s): {} writes ({:.1}/min) {at_rest:?}; leader-election renewals {leader} ({:.1}/min)",
        at_rest.len(),
        per_min(at_rest.len()),
        per_min(leader)
    );
    let n64 = n as u64;
    emit("idle", "ready_to_suspended_p50", lag_p50, "s", n64);
    emit("idle", "ready_to_suspended_max", lag_max, "s", n64);
    emit("idle", "last_ready_to_all_suspended", tail, "s", n64);
    emit(
        "idle",
        "writes_per_sandbox_create_to_suspended",
        lifetime_writes as f64 / n as f64,
        "writes",
        n64,
    );
    emit(
        "idle",
        "rest_writes_per_min",
        per_min(at_rest.len()),
        "writes/min",
        rest,
    );
    Ok(())
}
