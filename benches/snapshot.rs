//! Snapshot and restore throughput against the real local cluster, next to the raw stream.
//!
//! `eval "$(hack/cluster env)"; cargo bench --bench snapshot` (release build). It starts an
//! operator (the release binary) for a temporary namespace, fills a sandbox with 1 GiB
//! (`BENCH_MIB` to change), and prints:
//! - raw: `tar -c` of the workspace streamed through exec to nowhere (the ceiling);
//! - snapshot: SandboxSnapshot created → Ready (tar through exec, SHA-256, tar parsing,
//!   multipart upload, commit, manifest);
//! - restore: a new sandbox of the same scope, from its pod running to the sandbox Ready
//!   (one validating, extracting pass, then the swap);
//! - the operator's peak RSS growth over its idle RSS (`VmHWM` − `VmRSS` before the run).
//!
//! `BENCH_STORE=s3` uses the S3-compatible server of `hack/s3` instead of a `file://` store.
//! With `BENCH_RESULTS` set, each figure is also appended to that file as a JSON line.

use std::process::Command;
use std::time::{Duration, Instant};

use agentbox::crd::{Sandbox, SandboxPhase, SandboxSnapshot, SnapshotPhase};
use agentbox::exec::{self, ExecEvent, ExecRequest};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

mod common;

use common::{Operator, emit, proc_kib, repo_root};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64().max(1e-9)
}

/// Waits for a sandbox to be Ready; returns when its container was first seen running and
/// when the sandbox was first seen Ready.
async fn wait_sandbox(api: &Api<Sandbox>, pods: &Api<Pod>, name: &str) -> Res<(Instant, Instant)> {
    let mut pod_ready = None;
    let pod_name = agentbox::labels::pod_name(name);
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let s = api.get(name).await?;
        let st = s.status.unwrap_or_default();
        if pod_ready.is_none()
            && pods.get_opt(&pod_name).await?.is_some_and(|p| {
                p.status
                    .and_then(|s| s.container_statuses)
                    .is_some_and(|cs| cs.iter().any(|c| c.ready))
            })
        {
            pod_ready = Some(Instant::now());
        }
        if st.phase == Some(SandboxPhase::Ready) {
            let now = Instant::now();
            return Ok((pod_ready.unwrap_or(now), now));
        }
        if Instant::now() > deadline {
            return Err(format!("sandbox {name} not Ready: {:?}", st.conditions).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn sandbox(name: &str) -> Res<Sandbox> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": "docker.io/library/busybox:1.37", "imagePullPolicy": "Never",
                 "scope": {"kind": "User", "agent": "bench", "user": "bench"}},
    }))?)
}

#[tokio::main]
async fn main() -> Res<()> {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return Ok(()); // `cargo test --benches` / `--list`: nothing to list.
    }
    let mib: u64 = std::env::var("BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let client = Client::try_default().await?;
    let ns = format!("bench-{:06x}", rand::random::<u32>() & 0xff_ffff);
    let nss: Api<Namespace> = Api::all(client.clone());
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    for crd in agentbox::crd::all() {
        crds.patch(
            &crd.name_any(),
            &PatchParams::apply("agentbox-bench").force(),
            &Patch::Apply(&crd),
        )
        .await?;
    }
    let mut nsobj = Namespace::default();
    nsobj.metadata.name = Some(ns.clone());
    nss.create(&PostParams::default(), &nsobj).await?;
    tokio::time::sleep(Duration::from_secs(2)).await; // default ServiceAccount
    let result = run(&client, &ns, mib).await;
    let _ = nss.delete(&ns, &DeleteParams::default()).await;
    result
}

async fn run(client: &Client, ns: &str, mib: u64) -> Res<()> {
    let store_dir = format!("/var/lib/agentbox/bench-snapshots/{ns}");
    let mut cmd = Operator::command();
    cmd.args(["--namespace", ns, "--identity", &format!("bench-{ns}")])
        .args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--leader-election",
            "false",
        ])
        .args(["--restore-max-input-bytes", &((mib + 64) << 20).to_string()])
        .args([
            "--restore-max-extracted-bytes",
            &((mib + 64) << 20).to_string(),
        ]);
    let label = if std::env::var("BENCH_STORE").as_deref() == Ok("s3") {
        let out = Command::new(repo_root().join("hack/s3"))
            .arg("up")
            .status()?;
        if !out.success() {
            return Err("hack/s3 up failed".into());
        }
        let env = Command::new(repo_root().join("hack/s3"))
            .arg("env")
            .output()?;
        let vars: Vec<(String, String)> = String::from_utf8_lossy(&env.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let get = |k: &str| {
            vars.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        cmd.args([
            "--store-url",
            &format!("s3://{}", get("AGENTBOX_TEST_S3_BUCKET")),
        ])
        .args([
            "--store-prefix",
            ns,
            "--s3-endpoint",
            &get("AGENTBOX_TEST_S3_ENDPOINT"),
        ])
        .args(["--s3-path-style", "true", "--s3-allow-http", "true"]);
        for (k, v) in vars.iter().filter(|(k, _)| k.starts_with("AWS_")) {
            cmd.env(k, v);
        }
        "s3 (hack/s3)"
    } else {
        cmd.args(["--store-url", &format!("file://{store_dir}")]);
        "file://"
    };
    let log = format!("/tmp/agentbox-bench-{ns}.log");
    let op = Operator::start(cmd.env("RUST_LOG", "info"), log.as_ref())?;
    let pid = op.0.id();
    let sandboxes: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let snaps: Api<SandboxSnapshot> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    // Measured in a block so that the sandboxes are deleted while the operator still runs,
    // also after a failure: their finalizers need it, and a 1 GiB workspace must not stay behind.
    let measured: Res<()> = async {
        sandboxes
            .create(&PostParams::default(), &sandbox("src")?)
            .await?;
        wait_sandbox(&sandboxes, &pods, "src").await?;
        let pod = sandboxes
            .get("src")
            .await?
            .status
            .and_then(|s| s.pod_name)
            .ok_or("no pod")?;
        eprintln!("filling the workspace with {mib} MiB of random data");
        let fill = format!(
            "cd /workspace && i=0; while [ $i -lt {} ]; do head -c 268435456 /dev/urandom > f$i; i=$((i+1)); done; r={}; [ $r -gt 0 ] && head -c $((r*1048576)) /dev/urandom > rest; sync",
            mib / 256,
            mib % 256
        );
        let out = exec::run(&pods, &pod, "sandbox", ExecRequest::shell(fill)).await?;
        if !out.success() {
            return Err(format!("fill failed: {}", out.stderr_str()).into());
        }

        // Raw: the same tar command the snapshot runs, streamed to nowhere.
        let mut argv = vec![
            "sh".to_string(),
            "-c".into(),
            agentbox::controller::snapshot::TAR_SCRIPT.into(),
            "sh".into(),
        ];
        argv.extend(agentbox::controller::snapshot::tar_args("/workspace", &[]));
        let t = Instant::now();
        let mut s = exec::stream(&pods, &pod, "sandbox", ExecRequest::argv(argv)).await?;
        let mut raw_bytes = 0u64;
        while let Some(ev) = s.next().await {
            match ev? {
                ExecEvent::Stdout(b) => raw_bytes += b.len() as u64,
                ExecEvent::Stderr(_) => {}
                ExecEvent::Exit { status, .. } => {
                    if !status.success() {
                        return Err(format!("raw tar: {status}").into());
                    }
                }
            }
        }
        let raw = t.elapsed();
        let idle_rss = proc_kib(pid, "VmRSS:");

        // Snapshot.
        let snap: SandboxSnapshot = serde_json::from_value(json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxSnapshot",
            "metadata": {"name": "bench"}, "spec": {"sandboxRef": {"name": "src"}},
        }))?;
        let t = Instant::now();
        snaps.create(&PostParams::default(), &snap).await?;
        let mut running = None;
        let size = loop {
            let s = snaps.get("bench").await?;
            let st = s.status.unwrap_or_default();
            match st.phase {
                Some(SnapshotPhase::Running) if running.is_none() => running = Some(Instant::now()),
                Some(SnapshotPhase::Ready) => break st.size_bytes.unwrap_or(0) as u64,
                Some(SnapshotPhase::Failed) => {
                    return Err(format!("snapshot failed: {:?}", st.conditions).into());
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let snap_time = t.elapsed();
        let upload_time = running.map_or(snap_time, |r| r.elapsed());

        // Restore into a new sandbox of the same scope.
        sandboxes
            .create(&PostParams::default(), &sandbox("dst")?)
            .await?;
        let (pod_ready, ready) = wait_sandbox(&sandboxes, &pods, "dst").await?;
        let restore_time = ready - pod_ready;
        let branch = sandboxes
            .get("dst")
            .await?
            .status
            .and_then(|s| s.workspace)
            .and_then(|w| w.last_start_branch);
        let peak = proc_kib(pid, "VmHWM:");

        let raw_rate = mib_s(raw_bytes, raw);
        let snap_rate = mib_s(size, snap_time);
        let restore_rate = mib_s(size, restore_time);
        println!(
            "store: {label}; workspace {mib} MiB, archive {:.1} MiB",
            size as f64 / (1 << 20) as f64
        );
        println!(
            "raw tar -c through exec : {raw_rate:8.1} MiB/s ({:.1}s)",
            raw.as_secs_f64()
        );
        println!(
            "snapshot (create->Ready): {snap_rate:8.1} MiB/s ({:.1}s) = {:.0}% of raw",
            snap_time.as_secs_f64(),
            100.0 * snap_rate / raw_rate
        );
        println!(
            "snapshot (Running->Ready): {:8.1} MiB/s ({:.1}s) = {:.0}% of raw",
            mib_s(size, upload_time),
            upload_time.as_secs_f64(),
            100.0 * mib_s(size, upload_time) / raw_rate
        );
        println!(
            "restore (pod running->Ready, 1 pass): {restore_rate:8.1} MiB/s ({:.1}s), branch {branch:?}",
            restore_time.as_secs_f64()
        );
        println!(
            "operator RSS: idle {:.1} MiB, peak {:.1} MiB, growth {:.1} MiB",
            idle_rss as f64 / 1024.0,
            peak as f64 / 1024.0,
            peak.saturating_sub(idle_rss) as f64 / 1024.0
        );

        let store = if label == "file://" { "file" } else { "s3" };
        let fig = |key: &str, value: f64, unit: &str| {
            emit("snapshot", &format!("{store}_{key}"), value, unit, mib);
        };
        fig("raw_mib_s", raw_rate, "MiB/s");
        fig("snapshot_mib_s", snap_rate, "MiB/s");
        fig("restore_mib_s", restore_rate, "MiB/s");
        fig("idle_rss_mib", idle_rss as f64 / 1024.0, "MiB");
        fig("peak_rss_mib", peak as f64 / 1024.0, "MiB");
        let growth = peak.saturating_sub(idle_rss) as f64 / 1024.0;
        fig("rss_growth_mib", growth, "MiB");

        Ok(())
    }
    .await;

    let _ = snaps
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    for _ in 0..100 {
        if snaps.list(&ListParams::default()).await?.items.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = sandboxes
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    for _ in 0..300 {
        if sandboxes
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(op);
    let _ = std::fs::remove_dir_all(&store_dir);
    measured
}
