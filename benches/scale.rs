//! Scale: many Sandboxes in `lifecycle.mode: Suspended` (no pods) against one operator.
//!
//! `eval "$(hack/cluster env)"; cargo bench --bench scale` (release build). It starts the
//! operator (the release binary, leader election on as deployed) for a temporary namespace,
//! creates `BENCH_SCALE_N` (default 500) Suspended sandboxes, 16 requests in flight, and
//! measures:
//! - the time until every one is reconciled (a watch sees phase Suspended with
//!   `observedGeneration` = `generation`), and each one's create → reconciled latency;
//! - `BENCH_SCALE_IDLE_SECS` (default 60) at rest: the operator's RSS and CPU (from
//!   `/proc/<pid>`), and its writes from the API server's audit log (`$AGENTBOX_AUDIT_LOG`),
//!   told apart by its User-Agent, leader-election Lease renewals counted apart;
//! - one `deletecollection`, and the time until every sandbox is gone (finalizers removed).
//!
//! With `BENCH_RESULTS` set, each figure is also appended to that file as a JSON line.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use agentbox_api::crd::{Sandbox, SandboxPhase};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use serde_json::json;

mod common;

use common::{
    DeleteAll, LEADER_LEASE, OPERATOR_UA, audit_log, emit, env_num, leading_operator, namespace,
    p50_p95, proc_kib, read_audit,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const IDENTITY: &str = "bench-scale";

/// User + system CPU time of a process in seconds, from `/proc/<pid>/stat`.
fn cpu_secs(pid: u32, ticks_per_sec: f64) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    (f.get(11).unwrap_or(&0.0) + f.get(12).unwrap_or(&0.0)) / ticks_per_sec
}

fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

fn reconciled(s: &Sandbox) -> bool {
    let st = s.status.as_ref();
    st.and_then(|st| st.phase) == Some(SandboxPhase::Suspended)
        && st.and_then(|st| st.observed_generation) == s.metadata.generation
}

fn sandbox(i: usize) -> Res<Sandbox> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": format!("s-{i:04}")},
        "spec": {"image": "docker.io/library/busybox:1.37",
            "scope": {"kind": "Session", "agent": "bench", "session": format!("s-{i}")},
            "lifecycle": {"mode": "Suspended"}},
    }))?)
}

#[tokio::main]
async fn main() -> Res<()> {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return Ok(()); // `cargo test --benches` / `--list`: nothing to list.
    }
    let n = env_num("BENCH_SCALE_N", 500) as usize;
    let idle = env_num("BENCH_SCALE_IDLE_SECS", 60);
    let audit = audit_log()?;
    let client = agentbox_api::kube_client().await?;
    let cleanup = namespace(&client, "bench-scale").await?;
    let ns = cleanup.1.clone();
    let (op, log) = leading_operator(&client, &ns, IDENTITY).await?;
    let pid = op.pid();
    let ticks = clock_ticks();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = proc_kib(pid, "VmRSS:");
    eprintln!(
        "operator pid {pid} leads in {ns}; creating {n} Suspended sandboxes (log {})",
        log.display()
    );

    let sbxs: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let _delete_all = DeleteAll::of(&client, &ns);
    // The watch is open before the first create, so no status is missed.
    let mut events = watcher::watcher(sbxs.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    let created_at: std::sync::Mutex<HashMap<String, Instant>> = Default::default();
    let cpu0 = cpu_secs(pid, ticks);
    let start_ts = Timestamp::now();
    let t0 = Instant::now();
    let creates = futures::stream::iter(0..n)
        .map(|i| {
            let (sbxs, created_at) = (&sbxs, &created_at);
            async move {
                let s = sandbox(i)?;
                let t = Instant::now();
                sbxs.create(&PostParams::default(), &s).await?;
                created_at.lock().unwrap().insert(s.name_any(), t);
                Ok::<_, Box<dyn std::error::Error>>(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>();
    let mut done: HashMap<String, Instant> = HashMap::new();
    let watch = async {
        while done.len() < n {
            let s = tokio::time::timeout(Duration::from_secs(300), events.try_next())
                .await
                .map_err(|_| format!("{} of {n} reconciled after 300 s quiet", done.len()))??
                .ok_or("watch ended")?;
            if reconciled(&s) {
                done.entry(s.name_any()).or_insert_with(Instant::now);
            }
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    };
    let (created, watched) = futures::join!(
        async {
            let r = creates.await;
            (r, t0.elapsed())
        },
        watch
    );
    let (created, create_time) = created;
    created?;
    watched?;
    let all_time = t0.elapsed();
    let cpu_reconcile = cpu_secs(pid, ticks) - cpu0;
    let created_at = created_at.into_inner().unwrap();
    let lat: Vec<f64> = done
        .iter()
        .filter_map(|(k, t)| Some(t.duration_since(*created_at.get(k)?).as_secs_f64() * 1e3))
        .collect();
    let (lp50, lp95) = p50_p95(lat);
    // Let the last writes land and the queue settle before the window at rest opens.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let reconcile_end = Timestamp::now();

    let (cpu_a, idle_start) = (cpu_secs(pid, ticks), Timestamp::now());
    let t_idle = Instant::now();
    let mut rss_max = 0;
    while t_idle.elapsed() < Duration::from_secs(idle) {
        rss_max = rss_max.max(proc_kib(pid, "VmRSS:"));
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (cpu_b, idle_end) = (cpu_secs(pid, ticks), Timestamp::now());
    let idle_secs = t_idle.elapsed().as_secs_f64();
    let cpu_rest_pct = (cpu_b - cpu_a) / idle_secs * 100.0;
    let rss_rest = proc_kib(pid, "VmRSS:");
    let peak_reconcile = proc_kib(pid, "VmHWM:");

    // Delete them all with one request; done when the last finalizer is gone.
    let t = Instant::now();
    let del_start = Timestamp::now();
    sbxs.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    let mut left = n;
    while left > 0 {
        if t.elapsed() > Duration::from_secs(600) {
            return Err(format!("{left} sandboxes still there after 600 s").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        left = sbxs
            .list_metadata(&ListParams::default())
            .await?
            .items
            .len();
    }
    let delete_time = t.elapsed();
    let del_end = Timestamp::now();
    let peak = proc_kib(pid, "VmHWM:");
    drop(events);
    drop(op);

    // The operator's writes, by its User-Agent, in the namespace.
    let writes = read_audit(&audit, &ns);
    let count = |from: Timestamp, to: Timestamp, leader: bool| {
        let ws: Vec<&common::Write> = writes
            .iter()
            .filter(|w| w.user_agent.starts_with(OPERATOR_UA) && w.at >= from && w.at < to)
            .filter(|w| (w.resource == "leases" && w.name == LEADER_LEASE) == leader)
            .collect();
        let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
        for w in &ws {
            *kinds.entry(w.kind()).or_default() += 1;
        }
        (ws.len(), kinds)
    };
    let (w_reconcile, k_reconcile) = count(start_ts, reconcile_end, false);
    let (w_idle, k_idle) = count(idle_start, idle_end, false);
    let (w_leader, _) = count(idle_start, idle_end, true);
    let (w_delete, k_delete) = count(del_start, del_end, false);
    let per_min = |k: usize| k as f64 * 60.0 / idle_secs;
    let mib = |kib: u64| kib as f64 / 1024.0;

    println!();
    println!("{n} Suspended sandboxes, one operator (pid {pid}):");
    println!(
        "  created in {:.1} s (16 in flight); all reconciled {:.1} s after the first create",
        create_time.as_secs_f64(),
        all_time.as_secs_f64()
    );
    println!("  create → reconciled p50 {lp50:.0} ms, p95 {lp95:.0} ms");
    println!(
        "  operator CPU while reconciling {cpu_reconcile:.1} s; writes {w_reconcile} ({:.2} per sandbox, bench's creates excluded): {k_reconcile:?}",
        w_reconcile as f64 / n as f64
    );
    println!(
        "  at rest ({idle_secs:.0} s): RSS {:.1} MiB (before the sandboxes {:.1} MiB, max in window {:.1} MiB), CPU {cpu_rest_pct:.2}%",
        mib(rss_rest),
        mib(rss_before),
        mib(rss_max)
    );
    println!(
        "  at rest: {w_idle} writes ({:.1}/min) {k_idle:?}, and {w_leader} leader-election Lease renewals ({:.1}/min)",
        per_min(w_idle),
        per_min(w_leader)
    );
    println!(
        "  deletecollection → all gone {:.1} s; operator writes {w_delete}: {k_delete:?}",
        delete_time.as_secs_f64()
    );
    println!(
        "  operator peak RSS {:.1} MiB (while reconciling {:.1} MiB)",
        mib(peak),
        mib(peak_reconcile)
    );

    let n64 = n as u64;
    emit("scale", "create_secs", create_time.as_secs_f64(), "s", n64);
    emit(
        "scale",
        "reconcile_all_secs",
        all_time.as_secs_f64(),
        "s",
        n64,
    );
    emit("scale", "reconcile_p50_ms", lp50, "ms", n64);
    emit("scale", "reconcile_p95_ms", lp95, "ms", n64);
    emit("scale", "reconcile_cpu_secs", cpu_reconcile, "s", n64);
    let per_sbx = w_reconcile as f64 / n as f64;
    emit("scale", "writes_per_sandbox", per_sbx, "writes", n64);
    emit("scale", "rest_rss_mib", mib(rss_rest), "MiB", n64);
    emit("scale", "rest_rss_before_mib", mib(rss_before), "MiB", n64);
    emit("scale", "rest_cpu_pct", cpu_rest_pct, "%", idle);
    emit(
        "scale",
        "rest_writes_per_min",
        per_min(w_idle),
        "writes/min",
        idle,
    );
    let leader = per_min(w_leader);
    emit(
        "scale",
        "rest_leader_writes_per_min",
        leader,
        "writes/min",
        idle,
    );
    emit(
        "scale",
        "delete_all_secs",
        delete_time.as_secs_f64(),
        "s",
        n64,
    );
    emit("scale", "peak_rss_mib", mib(peak), "MiB", n64);
    Ok(())
}
