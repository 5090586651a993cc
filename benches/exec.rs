//! Exec and guard latency against one bare pod on the local cluster (not a test).
//!
//! `eval "$(hack/cluster env)"; cargo bench --bench exec` (release build). In one run, against
//! one pod in a temporary namespace, it measures one-shot `true`:
//! - through `agentbox_api::exec::run` with kube's default client and with
//!   [`agentbox_api::kube_client`] (TCP_NODELAY), and through `agentbox_api::exec::run_unwrapped` (the
//!   same transport and client without the lossless wrapper: plain argv, as before it and as
//!   `kubectl exec` sends it), interleaved sample by sample;
//! - through `kubectl exec` (`$KUBECTL`, a process per command);
//! - through the Python `kubernetes` client in-process (`benches/exec_python.py`; needs
//!   the `kubernetes` package, skipped with a note if missing);
//! - through the agentbox Python SDK in-process (`benches/sdk_python.py`; needs `./python`
//!   installed, skipped with a note if missing), which also gives its session and guard
//!   figures;
//! - through the agentbox Java client in-process (`dev.agentbox.ExecBench` of `java/`, with
//!   the classpath in `$JAVA_CP`, which `hack/bench` sets; skipped with a note without it);
//!
//! and the persistent session's per-command latency, guard acquire/release latency, and the
//! guard's throughput with 8 contending clients. `BENCH_N` samples each (default 200),
//! `BENCH_GUARD_SECS` of contention (default 10). `PYTHON` names the interpreter with the
//! `kubernetes` package (`hack/bench` uses its own venv). With `BENCH_RESULTS` set, each figure
//! is also appended to that file as a JSON line.
//!
//! With `BENCH_RUNTIME_CLASS=gvisor` the pod runs under that RuntimeClass and only the
//! agentbox one-shot exec and the persistent session are measured, under the bench name
//! `exec_gvisor` (the same keys).

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use agentbox_api::exec::{self, ExecRequest, SANDBOX_CONTAINER, session::Session};
use agentbox_api::guard::{self, GuardConfig};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::conditions::is_pod_running;
use kube::runtime::wait::await_condition;
use serde_json::json;

mod common;

use common::{Cleanup, bench_name, emit, env_num, p50_p95, python_samples, runtime_class};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const POD: &str = "box";

/// (p50, p95) in milliseconds.
fn stats(v: &[Duration]) -> (f64, f64) {
    p50_p95(v.iter().map(|d| d.as_secs_f64() * 1e3).collect())
}

async fn start_pod(client: &Client, ns: &str) -> Res<Api<Pod>> {
    let nss: Api<Namespace> = Api::all(client.clone());
    let mut obj = Namespace::default();
    obj.metadata.name = Some(ns.to_string());
    nss.create(&PostParams::default(), &obj).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": POD},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": SANDBOX_CONTAINER,
                "image": "docker.io/library/busybox:1.37",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "trap 'exit 0' TERM; mkdir -p /workspace; while :; do sleep 3600 & wait; done"],
            }],
        },
    }))?;
    if let Some(spec) = pod.spec.as_mut() {
        spec.runtime_class_name = runtime_class();
    }
    // The namespace's default ServiceAccount appears shortly after the namespace.
    let mut created = pods.create(&PostParams::default(), &pod).await;
    for _ in 0..50 {
        if created.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        created = pods.create(&PostParams::default(), &pod).await;
    }
    created?;
    tokio::time::timeout(
        Duration::from_secs(120),
        await_condition(pods.clone(), POD, is_pod_running()),
    )
    .await??;
    Ok(pods)
}

async fn exec_true(pods: &Api<Pod>) -> Res<Duration> {
    let t = Instant::now();
    let out = exec::run(pods, POD, SANDBOX_CONTAINER, ExecRequest::argv(["true"])).await?;
    let d = t.elapsed();
    if !out.success() {
        return Err(format!("true failed: {out:?}").into());
    }
    Ok(d)
}

/// `true` as plain argv, without the lossless wrapper (what one-shot exec sent before it).
async fn exec_true_unwrapped(pods: &Api<Pod>) -> Res<Duration> {
    let t = Instant::now();
    let out = exec::run_unwrapped(pods, POD, SANDBOX_CONTAINER, vec!["true".into()]).await?;
    let d = t.elapsed();
    if !out.success() {
        return Err(format!("true failed: {out:?}").into());
    }
    Ok(d)
}

fn kubectl_exec(kubectl: &str, ns: &str) -> Res<Duration> {
    let t = Instant::now();
    let st = Command::new(kubectl)
        .args(["-n", ns, "exec", POD, "-c", SANDBOX_CONTAINER, "--", "true"])
        .stdin(Stdio::null())
        .status()?;
    let d = t.elapsed();
    if !st.success() {
        return Err(format!("kubectl exec: {st}").into());
    }
    Ok(d)
}

/// `n` one-shot execs from one Python process of the official client (after its own
/// warm-up); the samples.
fn python_exec(ns: &str, n: u64) -> Result<Vec<Duration>, String> {
    let n = n.to_string();
    python_samples(
        "exec_python.py",
        &[ns, POD, SANDBOX_CONTAINER, &n],
        &["samples_ms"],
    )
    .map(|mut v| v.remove(0))
}

/// The same through the agentbox Python SDK (`benches/sdk_python.py`).
fn python_sdk_exec(ns: &str, n: u64) -> Result<Vec<Duration>, String> {
    let n = n.to_string();
    python_samples(
        "sdk_python.py",
        &["oneshot", ns, POD, SANDBOX_CONTAINER, &n],
        &["oneshot_ms"],
    )
    .map(|mut v| v.remove(0))
}

/// The same through the agentbox Java client (`java/`'s `dev.agentbox.ExecBench`, one JVM
/// per round, after its own warm-up), with the classpath in `$JAVA_CP`.
fn java_exec(ns: &str, n: u64) -> Result<Vec<Duration>, String> {
    let cp = std::env::var("JAVA_CP")
        .ok()
        .filter(|cp| !cp.is_empty())
        .ok_or("no $JAVA_CP (hack/bench sets it)")?;
    let out = Command::new(std::env::var("JAVA").unwrap_or_else(|_| "java".into()))
        .args([
            "-cp",
            &cp,
            "dev.agentbox.ExecBench",
            ns,
            POD,
            SANDBOX_CONTAINER,
        ])
        .arg(n.to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("java: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("java: {}", err.lines().last().unwrap_or("")));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(v["oneshot_ms"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(serde_json::Value::as_f64)
                .map(|ms| Duration::from_secs_f64(ms / 1e3))
                .collect()
        })
        .unwrap_or_default())
}

/// 8 clients, each with its own connection, taking and releasing one lease for `secs`.
async fn guard_contention(ns: &str, secs: u64) -> Res<(u64, f64)> {
    let total = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let client = agentbox_api::kube_client().await?;
        let total = total.clone();
        let leases: Api<Lease> = Api::namespaced(client, ns);
        tasks.push(tokio::spawn(async move {
            let cfg = GuardConfig::default();
            while Instant::now() < stop {
                let g = guard::acquire(
                    &leases,
                    "bench-contended",
                    BTreeMap::new(),
                    &cfg,
                    Some(Duration::from_secs(30)),
                )
                .await?;
                total.fetch_add(1, Ordering::Relaxed);
                g.release().await?;
            }
            Ok::<_, guard::GuardError>(())
        }));
    }
    let started = Instant::now();
    for t in tasks {
        t.await??;
    }
    let n = total.load(Ordering::Relaxed);
    Ok((n, n as f64 / started.elapsed().as_secs_f64()))
}

/// `true` per command in one persistent session: 20 to warm up, then `n` (at least 500).
async fn session_samples(pods: &Api<Pod>, n: u64) -> Res<Vec<Duration>> {
    let session = Session::new(pods.clone(), POD, SANDBOX_CONTAINER);
    session.start().await?;
    for _ in 0..20 {
        session.run(ExecRequest::argv(["true"])).await?;
    }
    let mut s = Vec::new();
    for _ in 0..n.max(500) {
        let t = Instant::now();
        let out = session.run(ExecRequest::argv(["true"])).await?;
        s.push(t.elapsed());
        if !out.success() {
            return Err(format!("session true failed: {out:?}").into());
        }
    }
    session.close().await;
    Ok(s)
}

/// Under `BENCH_RUNTIME_CLASS`: the agentbox one-shot exec (beside the plain argv without the
/// lossless wrapper, interleaved: what the runtime costs per exec apart from the wrapper's
/// own processes) and the persistent session only, recorded as `exec_<class>`.
async fn other_runtime(pods: &Api<Pod>, n: u64) -> Res<()> {
    let (mut a, mut u) = (Vec::new(), Vec::new());
    for _ in 0..n {
        a.push(exec_true(pods).await?);
        u.push(exec_true_unwrapped(pods).await?);
    }
    let s = session_samples(pods, n).await?;
    let name = bench_name("exec");
    for (what, key, v) in [
        (
            "agentbox exec::run, one-shot `true`",
            "oneshot_agentbox",
            &a,
        ),
        (
            "plain argv without the lossless wrapper",
            "oneshot_unwrapped",
            &u,
        ),
        ("persistent session, per command", "session", &s),
    ] {
        let (p50, p95) = stats(v);
        println!("{what:<58} {p50:>9.2} {p95:>9.2}");
        emit(&name, &format!("{key}_p50_ms"), p50, "ms", v.len() as u64);
        emit(&name, &format!("{key}_p95_ms"), p95, "ms", v.len() as u64);
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let n = env_num("BENCH_N", 200);
    let guard_secs = env_num("BENCH_GUARD_SECS", 10);
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let default_client = Client::try_default().await?;
    let nodelay_client = agentbox_api::kube_client().await?;
    let ns = format!("bench-exec-{}", std::process::id());
    let _cleanup = Cleanup(default_client.clone(), ns.clone());
    start_pod(&default_client, &ns).await?;
    let pods_default: Api<Pod> = Api::namespaced(default_client.clone(), &ns);
    let pods_nodelay: Api<Pod> = Api::namespaced(nodelay_client.clone(), &ns);
    eprintln!("pod {ns}/{POD} running; {n} samples each");

    // Warm-up: connections, TLS sessions, the API server's and kubelet's caches.
    for _ in 0..5 {
        exec_true(&pods_default).await?;
        exec_true(&pods_nodelay).await?;
        exec_true_unwrapped(&pods_nodelay).await?;
    }
    if runtime_class().is_some() {
        return other_runtime(&pods_nodelay, n).await;
    }
    // Four rounds, so that load drifting on the machine hits every client alike: Rust with
    // both clients and without the wrapper (interleaved sample by sample), then a Python
    // process.
    let (mut a0, mut a1, mut a2) = (Vec::new(), Vec::new(), Vec::new());
    let mut py: Result<Vec<Duration>, String> = Ok(Vec::new());
    let mut sdk: Result<Vec<Duration>, String> = Ok(Vec::new());
    let mut java: Result<Vec<Duration>, String> = Ok(Vec::new());
    let rounds = 4;
    for _ in 0..rounds {
        for _ in 0..n.div_ceil(rounds) {
            a0.push(exec_true(&pods_default).await?);
            a1.push(exec_true(&pods_nodelay).await?);
            a2.push(exec_true_unwrapped(&pods_nodelay).await?);
        }
        for (acc, run) in [
            (
                &mut py,
                python_exec as fn(&str, u64) -> Result<Vec<Duration>, String>,
            ),
            (&mut sdk, python_sdk_exec),
            (&mut java, java_exec),
        ] {
            if let Ok(v) = acc {
                match run(&ns, n.div_ceil(rounds)) {
                    Ok(s) => v.extend(s),
                    Err(e) => *acc = Err(e),
                }
            }
        }
    }

    let mut k = Vec::new();
    kubectl_exec(&kubectl, &ns)?;
    for _ in 0..n.min(100) {
        k.push(kubectl_exec(&kubectl, &ns)?);
    }

    let s = session_samples(&pods_nodelay, n).await?;
    let sdk_session = python_samples(
        "sdk_python.py",
        &[
            "session",
            &ns,
            POD,
            SANDBOX_CONTAINER,
            &n.max(500).to_string(),
        ],
        &["session_ms"],
    );

    let leases: Api<Lease> = Api::namespaced(nodelay_client.clone(), &ns);
    let cfg = GuardConfig::default();
    let (mut acq, mut rel) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        let g = guard::acquire(&leases, "bench-solo", BTreeMap::new(), &cfg, None).await?;
        acq.push(t.elapsed());
        let t = Instant::now();
        g.release().await?;
        rel.push(t.elapsed());
    }
    let sdk_guard = python_samples(
        "sdk_python.py",
        &["guard", &ns, &n.to_string()],
        &["acquire_ms", "release_ms"],
    );
    let (entries, per_sec) = guard_contention(&ns, guard_secs).await?;

    // Each row also goes to $BENCH_RESULTS as `<key>_p50_ms` and `<key>_p95_ms`.
    let row = |what: &str, key: &str, v: &[Duration]| {
        let (p50, p95) = stats(v);
        println!("{what:<58} {p50:>9.2} {p95:>9.2}");
        emit("exec", &format!("{key}_p50_ms"), p50, "ms", v.len() as u64);
        emit("exec", &format!("{key}_p95_ms"), p95, "ms", v.len() as u64);
    };
    println!();
    println!(
        "{:<58} {:>9} {:>9}",
        "one-shot exec `true` (ms)", "p50", "p95"
    );
    row(
        "agentbox exec::run, kube default client (Nagle on)",
        "oneshot_kube_default",
        &a0,
    );
    row(
        "agentbox exec::run, agentbox_api::kube_client (TCP_NODELAY)",
        "oneshot_agentbox",
        &a1,
    );
    row(
        "agentbox, plain argv without the lossless wrapper (before it)",
        "oneshot_unwrapped",
        &a2,
    );
    let ((w50, w95), (u50, u95)) = (stats(&a1), stats(&a2));
    println!(
        "{:<58} {:>+8.1}% {:>+8.1}%",
        "  the lossless wrapper's cost (same run, interleaved)",
        100.0 * (w50 / u50 - 1.0),
        100.0 * (w95 / u95 - 1.0)
    );
    row("kubectl exec (process per command)", "oneshot_kubectl", &k);
    match py {
        Ok(p) => row("python kubernetes client, in-process", "oneshot_python", &p),
        Err(e) => println!(
            "{:<58} skipped: {e}",
            "python kubernetes client, in-process"
        ),
    }
    let sdk_row = |what: &str, key: &str, r: &Result<Vec<Duration>, String>| match r {
        Ok(v) => row(what, key, v),
        Err(e) => println!("{what:<58} skipped: {e}"),
    };
    sdk_row(
        "agentbox Python SDK, in-process",
        "oneshot_python_sdk",
        &sdk,
    );
    sdk_row("agentbox Java client, in-process", "oneshot_java", &java);
    row("persistent session, per command", "session", &s);
    sdk_row(
        "persistent session, Python SDK",
        "session_python_sdk",
        &sdk_session.map(|mut v| v.remove(0)),
    );
    row("guard acquire (uncontended)", "guard_acquire", &acq);
    row("guard release", "guard_release", &rel);
    let (sdk_acq, sdk_rel) = match sdk_guard {
        Ok(mut v) => (Ok(v.remove(0)), Ok(v.remove(0))),
        Err(e) => (Err(e.clone()), Err(e)),
    };
    sdk_row(
        "guard acquire, Python SDK",
        "guard_acquire_python_sdk",
        &sdk_acq,
    );
    sdk_row(
        "guard release, Python SDK",
        "guard_release_python_sdk",
        &sdk_rel,
    );
    println!(
        "guard, 8 contending clients for {guard_secs}s (retry {:?} ±50%): {entries} entries, {per_sec:.1}/s",
        cfg.retry_interval
    );
    emit(
        "exec",
        "guard_contended_per_s",
        per_sec,
        "entries/s",
        entries,
    );
    Ok(())
}
