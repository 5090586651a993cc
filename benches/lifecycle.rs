//! Sandbox create → Ready next to a bare pod's create → Running, the API writes a sandbox
//! costs, counted from the API server's audit log (not from the operator's own counters), and
//! delete → gone (seen on a watch) of the same cold sandboxes next to the bare pods', with the
//! time until the workspace directory is off the node (this host).
//!
//! `eval "$(hack/cluster env)"; cargo bench --bench lifecycle` (release build). It starts the
//! operator (the release binary) for a temporary namespace and measures `BENCH_N` (default 10)
//! of each, one after another, then watches 60 s of steady state (`BENCH_IDLE_SECS`), then
//! times the same create → Ready from the Python SDK (`benches/sdk_python.py` with `$PYTHON`).
//! The audit log is `$AGENTBOX_AUDIT_LOG` (set by `hack/cluster env`).
//!
//! With `BENCH_RUNTIME_CLASS=gvisor` the bare pods and the sandboxes (the operator's
//! `--default-runtime-class`) run under that RuntimeClass, only create → Ready and the bare
//! pod's → Running are measured, and the figures go under the bench name `lifecycle_gvisor`.

use std::time::{Duration, Instant};

use agentbox_api::crd::{Sandbox, SandboxPhase};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

mod common;

use common::{
    LEADER_LEASE, OPERATOR_UA, audit_log, bench_name, delete_until_gone, emit, env_num, p50_p95,
    python_samples, read_audit, runtime_class,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Waits on a watch until `done` holds for the named object.
async fn watch_until<K>(api: &Api<K>, name: &str, done: impl Fn(&K) -> bool) -> Res<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let wp = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(120);
    let mut stream = api.watch(&wp, "0").await?.boxed();
    while let Some(ev) = stream.next().await {
        match ev? {
            WatchEvent::Added(o) | WatchEvent::Modified(o) if done(&o) => return Ok(()),
            WatchEvent::Error(e) => return Err(format!("watch: {e:?}").into()),
            _ => {}
        }
    }
    Err(format!("{name}: watch ended before the condition held").into())
}

/// Milliseconds until `dir` is gone from this host (polled every 10 ms, up to two minutes).
async fn until_removed(dir: &std::path::Path) -> Res<f64> {
    let t = Instant::now();
    while dir.exists() {
        if t.elapsed() > Duration::from_secs(120) {
            return Err(format!("{} still there after 120 s", dir.display()).into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(t.elapsed().as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() -> Res<()> {
    let n = env_num("BENCH_N", 10) as usize;
    let idle = env_num("BENCH_IDLE_SECS", 60);
    let audit = audit_log()?;
    let client = Client::try_default().await?;
    let rc = runtime_class();
    let (cleanup, _op) = common::namespace_with_operator_args(&client, "bench-life", |_| {
        rc.iter()
            .flat_map(|rc| ["--default-runtime-class".to_string(), rc.clone()])
            .collect()
    })
    .await?;
    let ns = cleanup.1.clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let sbxs: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let _delete_all = common::DeleteAll::of(&client, &ns);

    let mut bare = Vec::new();
    let mut bare_delete = Vec::new();
    for i in 0..n {
        let name = format!("bare-{i}");
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "sandbox", "image": "docker.io/library/busybox:1.37", "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", agentbox_operator::controller::pod::KEEP_ALIVE]}]}
        }))?;
        if let Some(spec) = pod.spec.as_mut() {
            spec.runtime_class_name = rc.clone();
        }
        let t = Instant::now();
        pods.create(&PostParams::default(), &pod).await?;
        watch_until(&pods, &name, |p: &Pod| {
            p.status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .is_some_and(|cs| cs.iter().all(|c| c.ready))
        })
        .await?;
        bare.push(t.elapsed().as_secs_f64() * 1000.0);
        bare_delete.push(delete_until_gone(&pods, &name).await?);
    }

    let mut sandbox = Vec::new();
    let mut windows = Vec::new();
    for i in 0..n {
        let name = format!("sbx-{i}");
        let sbx: Sandbox = serde_json::from_value(json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": name},
            "spec": {"image": "docker.io/library/busybox:1.37", "scope": {"kind": "Session", "agent": "bench", "session": name},
                "workspace": {"files": [{"path": "README.md", "content": "hello\n"}]}}
        }))?;
        let start = Timestamp::now();
        let t = Instant::now();
        sbxs.create(&PostParams::default(), &sbx).await?;
        watch_until(&sbxs, &name, |s: &Sandbox| {
            s.status.as_ref().and_then(|s| s.phase) == Some(SandboxPhase::Ready)
        })
        .await?;
        sandbox.push(t.elapsed().as_secs_f64() * 1000.0);
        // Let in-flight writes of this start land before the next window opens.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        windows.push((start, Timestamp::now()));
    }
    if rc.is_some() {
        // Under another runtime: create → Ready beside the bare pod's, and nothing else.
        let name = bench_name("lifecycle");
        let (bp50, bp95) = p50_p95(bare);
        let (sp50, sp95) = p50_p95(sandbox);
        println!(
            "| measure under {} (n={n}) | p50 | p95 |",
            rc.as_deref().unwrap_or_default()
        );
        println!("|---|---|---|");
        println!("| bare pod create → Running (ms) | {bp50:.0} | {bp95:.0} |");
        println!("| Sandbox create → Ready (ms) | {sp50:.0} | {sp95:.0} |");
        let n64 = n as u64;
        emit(&name, "bare_ready_p50_ms", bp50, "ms", n64);
        emit(&name, "bare_ready_p95_ms", bp95, "ms", n64);
        emit(&name, "sandbox_ready_p50_ms", sp50, "ms", n64);
        emit(&name, "sandbox_ready_p95_ms", sp95, "ms", n64);
        let _ = sbxs
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        for _ in 0..600 {
            if sbxs.list(&ListParams::default()).await?.items.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The operator's sweep removes their directories a moment later: it must still run.
        common::swept(&ns).await;
        drop(_op);
        drop(cleanup);
        return Ok(());
    }
    let idle_start = Timestamp::now();
    tokio::time::sleep(Duration::from_secs(idle)).await;
    let idle_end = Timestamp::now();

    // Delete → gone of the same cold sandboxes, one at a time, each after the previous one's
    // workspace directory is off the node.
    let (mut sandbox_delete, mut dir_removed) = (Vec::new(), Vec::new());
    for i in 0..n {
        let name = format!("sbx-{i}");
        let uid = sbxs.get(&name).await?.uid().unwrap_or_default();
        let dir =
            std::path::PathBuf::from(agentbox_operator::controller::pod::workspace_host_path(
                agentbox_operator::config::DEFAULT_NODE_ROOT,
                &ns,
                &uid,
            ));
        let t = Instant::now();
        sandbox_delete.push(delete_until_gone(&sbxs, &name).await?);
        until_removed(&dir).await?;
        dir_removed.push(t.elapsed().as_secs_f64() * 1000.0);
    }

    // Writes by the operator: the requests with its User-Agent in the namespace. Its
    // leader-election Lease renewals are counted apart: they are the price of a standby
    // replica, the same with no sandbox at all.
    let writes = read_audit(&audit, &ns);
    let by_op = |from: Timestamp, to: Timestamp, leader: bool| -> Vec<&common::Write> {
        writes
            .iter()
            .filter(|w| w.user_agent.starts_with(OPERATOR_UA) && w.at >= from && w.at < to)
            .filter(|w| (w.resource == "leases" && w.name == LEADER_LEASE) == leader)
            .collect()
    };
    let per_sandbox: Vec<f64> = windows
        .iter()
        .map(|(a, b)| by_op(*a, *b, false).len() as f64)
        .collect();
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    if let Some((a, b)) = windows.first() {
        for w in by_op(*a, *b, false) {
            *kinds.entry(w.kind()).or_default() += 1;
        }
    }
    let idle_writes = by_op(idle_start, idle_end, false).len();
    let leader_writes = by_op(idle_start, idle_end, true).len();
    let per_min = |k: usize| k as f64 * 60.0 / idle as f64;

    let (bp50, bp95) = p50_p95(bare);
    let (sp50, sp95) = p50_p95(sandbox);
    let (wp50, wmax) = (
        p50_p95(per_sandbox.clone()).0,
        per_sandbox.iter().copied().fold(0.0, f64::max),
    );
    println!("| measure (n={n}) | p50 | p95 |");
    println!("|---|---|---|");
    println!("| bare pod create → Running (ms) | {bp50:.0} | {bp95:.0} |");
    println!("| Sandbox create → Ready (ms) | {sp50:.0} | {sp95:.0} |");
    let overhead = (sp50 / bp50 - 1.0) * 100.0;
    println!("| overhead of the median | {overhead:+.1}% | |");
    let (bd50, bd95) = p50_p95(bare_delete);
    let (sd50, sd95) = p50_p95(sandbox_delete);
    let (dr50, dr95) = p50_p95(dir_removed);
    println!("| bare pod delete → gone (ms) | {bd50:.0} | {bd95:.0} |");
    println!("| Sandbox delete → gone (ms) | {sd50:.0} | {sd95:.0} |");
    println!("| Sandbox delete → workspace directory removed (ms) | {dr50:.0} | {dr95:.0} |");
    println!();
    println!("API writes per sandbox, create → Ready (audit log): {per_sandbox:?}");
    println!("first sandbox's writes: {kinds:?}");
    println!(
        "API writes by the operator in {idle} s of steady state ({n} Ready sandboxes): {idle_writes}, \
         and {leader_writes} leader-election Lease renewals"
    );
    let n64 = n as u64;
    emit("lifecycle", "bare_ready_p50_ms", bp50, "ms", n64);
    emit("lifecycle", "bare_ready_p95_ms", bp95, "ms", n64);
    emit("lifecycle", "sandbox_ready_p50_ms", sp50, "ms", n64);
    emit("lifecycle", "sandbox_ready_p95_ms", sp95, "ms", n64);
    emit("lifecycle", "ready_overhead_pct", overhead, "%", n64);
    emit("lifecycle", "bare_delete_p50_ms", bd50, "ms", n64);
    emit("lifecycle", "bare_delete_p95_ms", bd95, "ms", n64);
    emit("lifecycle", "sandbox_delete_p50_ms", sd50, "ms", n64);
    emit("lifecycle", "sandbox_delete_p95_ms", sd95, "ms", n64);
    emit("lifecycle", "workspace_removed_p50_ms", dr50, "ms", n64);
    emit("lifecycle", "workspace_removed_p95_ms", dr95, "ms", n64);
    emit("lifecycle", "writes_to_ready_p50", wp50, "writes", n64);
    emit("lifecycle", "writes_to_ready_max", wmax, "writes", n64);
    emit(
        "lifecycle",
        "idle_writes_per_min",
        per_min(idle_writes),
        "writes/min",
        idle,
    );
    emit(
        "lifecycle",
        "idle_leader_writes_per_min",
        per_min(leader_writes),
        "writes/min",
        idle,
    );

    // The same seen from Python: get_or_create + wait_ready (a watch) through the SDK.
    match python_samples(
        "sdk_python.py",
        &[
            "ready",
            &ns,
            &n.to_string(),
            "docker.io/library/busybox:1.37",
        ],
        &["ready_ms"],
    ) {
        Ok(mut v) => {
            let ms: Vec<f64> = v.remove(0).iter().map(|d| d.as_secs_f64() * 1e3).collect();
            let (p50, p95) = p50_p95(ms);
            println!("| Sandbox create → Ready from the Python SDK (ms) | {p50:.0} | {p95:.0} |");
            emit("lifecycle", "python_sdk_ready_p50_ms", p50, "ms", n64);
            emit("lifecycle", "python_sdk_ready_p95_ms", p95, "ms", n64);
        }
        Err(e) => println!("Sandbox create → Ready from the Python SDK: skipped: {e}"),
    }

    // Every sandbox, also those the Python SDK made, while the operator still runs.
    let _ = sbxs
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    for _ in 0..600 {
        if sbxs.list(&ListParams::default()).await?.items.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(_op);
    drop(cleanup);
    Ok(())
}
