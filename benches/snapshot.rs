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
//! - the operator's peak RSS growth over its idle RSS (`VmHWM` − `VmRSS` before the run);
//! - last, the helper path: the sandbox suspended, then a snapshot of it by the node helper's
//!   `archive` job in a pod of its own (created → Ready, that pod's start included), and
//!   whether its digest is the exec path's.
//!
//! `BENCH_STORE=s3` uses the S3-compatible s3s-fs server of `hack/s3` instead of a `file://`
//! store, `BENCH_STORE=s3-minio` its MinIO server, `BENCH_STORE=s3-moto` its moto server.
//! `BENCH_RUNTIME_CLASS=gvisor` (issue 31) runs the sandboxes under that RuntimeClass and
//! records the figures under the bench name `snapshot_gvisor`.
//! With `BENCH_RESULTS` set, each figure is also appended to that file as a JSON line.
//!
//! `BENCH_SMALL_FILES=N` measures a workspace of N files of a few bytes instead (what
//! virtualenvs and `node_modules` look like), next to two baselines of its own: the raw
//! `tar -c` stream, and the image's own `tar -x` of the same archive from a file inside the pod
//! (onto the workspace's filesystem, before and after the restore). It also reports the operator's CPU time per member while taking
//! and restoring the snapshot (`utime + stime` of its process), and the canonicaliser's cost
//! per member in this process (parse, rules, re-encoding, SHA-256; no I/O).

use std::process::Command;
use std::time::{Duration, Instant};

use agentbox_api::crd::{Sandbox, SandboxPhase, SandboxSnapshot, SnapshotPhase, StartBranch};
use agentbox_api::exec::{self, ExecEvent, ExecRequest};
use agentbox_operator::snapshot::archive::{Canonicalizer, Limits};
use bytes::BytesMut;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

mod common;

use common::{Operator, bench_name, emit, proc_kib, repo_root, runtime_class};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64().max(1e-9)
}

/// Waits for a sandbox to be Ready; returns when its container was first seen running and
/// when the sandbox was first seen Ready.
async fn wait_sandbox(api: &Api<Sandbox>, pods: &Api<Pod>, name: &str) -> Res<(Instant, Instant)> {
    let mut pod_ready = None;
    let pod_name = agentbox_api::labels::pod_name(name);
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
    sandbox_of(name, "bench")
}

/// A sandbox of user `user`'s scope (another user's has no snapshot to restore: a cold start).
fn sandbox_of(name: &str, user: &str) -> Res<Sandbox> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": "docker.io/library/busybox:1.37", "imagePullPolicy": "Never",
                 "scope": {"kind": "User", "agent": "bench", "user": user}},
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
    for crd in agentbox_api::crd::all() {
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
    let small = std::env::var("BENCH_SMALL_FILES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let result = run(&client, &ns, mib, small).await;
    let _ = nss.delete(&ns, &DeleteParams::default()).await;
    result
}

async fn run(client: &Client, ns: &str, mib: u64, small: u64) -> Res<()> {
    let store_dir = format!("/var/lib/agentbox/bench-snapshots/{ns}");
    let mut cmd = Operator::command();
    cmd.args(["--namespace", ns, "--identity", &format!("bench-{ns}")])
        .args([
            "--metrics-addr",
            "127.0.0.1:0",
            "--leader-election",
            "false",
        ])
        .args([
            "--restore-max-input-bytes",
            &((mib.max(small >> 10) + 64) << 20).to_string(),
        ])
        .args([
            "--restore-max-extracted-bytes",
            &((mib.max(small >> 10) + 64) << 20).to_string(),
        ])
        .args([
            "--restore-max-members",
            &(small + 1000).max(100_000).to_string(),
        ]);
    // Under BENCH_RUNTIME_CLASS every sandbox runs under it (the operator's default runtime
    // class) and the figures go under `snapshot_<class>`.
    if let Some(rc) = runtime_class() {
        cmd.args(["--default-runtime-class", &rc]);
    }
    let store_kind = std::env::var("BENCH_STORE").unwrap_or_default();
    // The S3-compatible servers of hack/s3: its env variable for the endpoint, the label.
    let s3 = match store_kind.as_str() {
        "s3" => Some(("AGENTBOX_TEST_S3_ENDPOINT", "s3 (hack/s3: s3s-fs)")),
        "s3-moto" => Some(("AGENTBOX_TEST_S3_MOTO_ENDPOINT", "s3 (hack/s3: moto)")),
        "s3-minio" => Some(("AGENTBOX_TEST_S3_MINIO_ENDPOINT", "s3 (hack/s3: MinIO)")),
        _ => None,
    };
    let label = if let Some((endpoint_var, label)) = s3 {
        let out = Command::new(repo_root().join("hack/s3"))
            .arg("up")
            .args((store_kind == "s3-minio").then_some("minio"))
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
        .args(["--store-prefix", ns, "--s3-endpoint", &get(endpoint_var)])
        .args(["--s3-path-style", "true", "--s3-allow-http", "true"]);
        for (k, v) in vars.iter().filter(|(k, _)| k.starts_with("AWS_")) {
            cmd.env(k, v);
        }
        label
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
        let store = match store_kind.as_str() {
            "s3" => "s3",
            "s3-moto" => "s3moto",
            "s3-minio" => "s3minio",
            _ => "file",
        };
        let ctx = Ctx {
            sandboxes: &sandboxes,
            snaps: &snaps,
            pods: &pods,
            pod: &pod,
            pid,
        };
        if small > 0 {
            small_files(&ctx, store, small).await
        } else {
            big(&ctx, store, label, mib).await
        }
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
    // The 1 GiB workspace goes by the operator's sweep, once its pod has stopped.
    common::swept(ns).await;
    drop(op);
    let _ = std::fs::remove_dir_all(&store_dir);
    measured
}

/// What the measurements need.
struct Ctx<'a> {
    sandboxes: &'a Api<Sandbox>,
    snaps: &'a Api<SandboxSnapshot>,
    pods: &'a Api<Pod>,
    /// The source sandbox's pod.
    pod: &'a str,
    /// The operator's PID.
    pid: u32,
}

/// The operator's CPU time so far (user + system), from `/proc/<pid>/stat`.
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime and stime are the 12th
    // and 13th of them, in clock ticks.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    let hz: u64 = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100);
    Duration::from_secs_f64(ticks as f64 / hz as f64)
}

/// Raw: the same tar command the snapshot runs, streamed through exec; its size, its bytes
/// (kept when `keep`), how long it took, and in how many stdout frames it came.
async fn raw_stream(c: &Ctx<'_>, keep: bool) -> Res<(u64, Vec<u8>, Duration, u64)> {
    let mut argv = vec![
        "sh".to_string(),
        "-c".into(),
        agentbox_operator::controller::snapshot::TAR_SCRIPT.into(),
        "sh".into(),
    ];
    argv.extend(agentbox_operator::controller::snapshot::tar_args(
        "/workspace",
        &[],
    ));
    let t = Instant::now();
    let mut s = exec::stream(c.pods, c.pod, "sandbox", ExecRequest::argv(argv)).await?;
    let mut n = 0u64;
    let mut frames = 0u64;
    let mut bytes = Vec::new();
    while let Some(ev) = s.next().await {
        match ev? {
            ExecEvent::Stdout(b) => {
                n += b.len() as u64;
                frames += 1;
                if keep {
                    bytes.extend_from_slice(&b);
                }
            }
            ExecEvent::Stderr(_) => {}
            ExecEvent::Exit { status, .. } => {
                if !status.success() {
                    return Err(format!("raw tar: {status}").into());
                }
            }
        }
    }
    Ok((n, bytes, t.elapsed(), frames))
}

/// A snapshot of the source sandbox, created → Ready.
struct Taken {
    size: u64,
    /// The canonical archive's digest.
    sha256: String,
    members: u64,
    /// Create → Ready.
    total: Duration,
    /// Running → Ready.
    upload: Duration,
    /// The operator's CPU time meanwhile.
    cpu: Duration,
}

async fn take_snapshot(c: &Ctx<'_>) -> Res<Taken> {
    take_snapshot_named(c, "bench").await
}

/// A snapshot `name` of the source sandbox, created → Ready.
async fn take_snapshot_named(c: &Ctx<'_>, name: &str) -> Res<Taken> {
    let snap: SandboxSnapshot = serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxSnapshot",
        "metadata": {"name": name}, "spec": {"sandboxRef": {"name": "src"}},
    }))?;
    let cpu0 = cpu(c.pid);
    let t = Instant::now();
    c.snaps.create(&PostParams::default(), &snap).await?;
    let mut running = None;
    loop {
        let s = c.snaps.get(name).await?;
        let st = s.status.unwrap_or_default();
        match st.phase {
            Some(SnapshotPhase::Running) if running.is_none() => running = Some(Instant::now()),
            Some(SnapshotPhase::Ready) => {
                let total = t.elapsed();
                return Ok(Taken {
                    size: st.size_bytes.unwrap_or(0) as u64,
                    sha256: st.sha256.clone().unwrap_or_default(),
                    members: st.members.unwrap_or(0) as u64,
                    total,
                    upload: running.map_or(total, |r| r.elapsed()),
                    cpu: cpu(c.pid).saturating_sub(cpu0),
                });
            }
            Some(SnapshotPhase::Failed) => {
                return Err(format!("snapshot failed: {:?}", st.conditions).into());
            }
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// The helper path: the source sandbox suspended (its pod gone), then a snapshot of it taken
/// by the node helper's `archive` job in a pod of its own, created → Ready (the archive pod's
/// start included). Run last: the source stays suspended.
async fn suspended_snapshot(c: &Ctx<'_>) -> Res<Taken> {
    let patch = json!({"spec": {"lifecycle": {"mode": "Suspended"}}});
    c.sandboxes
        .patch("src", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    for i in 0.. {
        let suspended = c.sandboxes.get("src").await?.status.and_then(|s| s.phase)
            == Some(SandboxPhase::Suspended);
        if suspended && c.pods.get_opt(c.pod).await?.is_none() {
            break;
        }
        if i > 3000 {
            return Err("the source sandbox did not suspend within five minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    take_snapshot_named(c, "bench-suspended").await
}

/// A sandbox started and seen Ready.
struct Started {
    /// Create → Ready.
    total: Duration,
    /// Pod running → Ready.
    after_pod: Duration,
    /// The start branch it took.
    branch: Option<StartBranch>,
    /// The operator's CPU time meanwhile.
    cpu: Duration,
}

/// Creates sandbox `name` of user `user`'s scope and waits for it to be Ready: a restore of
/// the scope's latest snapshot for the source's user, a cold start for any other.
async fn start(c: &Ctx<'_>, name: &str, user: &str) -> Res<Started> {
    let cpu0 = cpu(c.pid);
    let t = Instant::now();
    c.sandboxes
        .create(&PostParams::default(), &sandbox_of(name, user)?)
        .await?;
    let (pod_ready, ready) = wait_sandbox(c.sandboxes, c.pods, name).await?;
    let spent = cpu(c.pid).saturating_sub(cpu0);
    let branch = c
        .sandboxes
        .get(name)
        .await?
        .status
        .and_then(|s| s.workspace)
        .and_then(|w| w.last_start_branch);
    Ok(Started {
        total: ready - t,
        after_pod: ready - pod_ready,
        branch,
        cpu: spent,
    })
}

/// Restores into a new sandbox of the same scope: its pod running → Ready, the start branch,
/// and the operator's CPU time meanwhile.
async fn restore(c: &Ctx<'_>) -> Res<(Duration, Option<StartBranch>, Duration)> {
    let s = start(c, "dst", "bench").await?;
    Ok((s.after_pod, s.branch, s.cpu))
}

/// Deletes sandbox `name` and waits until it is gone (its workspace with it).
async fn delete_sandbox(c: &Ctx<'_>, name: &str) -> Res<()> {
    let _ = c.sandboxes.delete(name, &DeleteParams::default()).await;
    for _ in 0..1200 {
        if c.sandboxes.get_opt(name).await?.is_none() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("sandbox {name} still there two minutes after its delete").into())
}

/// Runs a shell script in the source pod; an error if it fails.
async fn in_pod(c: &Ctx<'_>, script: String, stdin: Option<Vec<u8>>) -> Res<Duration> {
    let mut req = ExecRequest::shell(script).timeout(Duration::from_secs(3600));
    if let Some(b) = stdin {
        req = req.stdin(b);
    }
    let t = Instant::now();
    let out = exec::run(c.pods, c.pod, "sandbox", req).await?;
    if !out.success() {
        return Err(format!("in the pod: {}", out.stderr_str()).into());
    }
    Ok(t.elapsed())
}

/// 1 GiB (`BENCH_MIB`) of random data: throughput next to the raw stream, and RSS.
async fn big(c: &Ctx<'_>, store: &str, label: &str, mib: u64) -> Res<()> {
    eprintln!("filling the workspace with {mib} MiB of random data");
    in_pod(
        c,
        format!(
            "cd /workspace && i=0; while [ $i -lt {} ]; do head -c 268435456 /dev/urandom > f$i; i=$((i+1)); done; r={}; [ $r -gt 0 ] && head -c $((r*1048576)) /dev/urandom > rest; sync",
            mib / 256,
            mib % 256
        ),
        None,
    )
    .await?;
    let (raw_bytes, _, raw, _) = raw_stream(c, false).await?;
    let idle_rss = proc_kib(c.pid, "VmRSS:");
    let taken = take_snapshot(c).await?;
    let (restore_time, branch, _) = restore(c).await?;
    let peak = proc_kib(c.pid, "VmHWM:");
    let helper = suspended_snapshot(c).await?;

    let size = taken.size;
    let raw_rate = mib_s(raw_bytes, raw);
    let snap_rate = mib_s(size, taken.total);
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
        taken.total.as_secs_f64(),
        100.0 * snap_rate / raw_rate
    );
    println!(
        "snapshot (Running->Ready): {:8.1} MiB/s ({:.1}s) = {:.0}% of raw",
        mib_s(size, taken.upload),
        taken.upload.as_secs_f64(),
        100.0 * mib_s(size, taken.upload) / raw_rate
    );
    println!(
        "restore (pod running->Ready, 1 pass): {restore_rate:8.1} MiB/s ({:.1}s), branch {branch:?}",
        restore_time.as_secs_f64()
    );
    let helper_rate = mib_s(helper.size, helper.total);
    println!(
        "snapshot of the suspended sandbox by the node helper (create->Ready): {helper_rate:8.1} MiB/s ({:.1}s); sha256 {}",
        helper.total.as_secs_f64(),
        if helper.sha256 == taken.sha256 {
            "equal to the exec path's"
        } else {
            "DIFFERS from the exec path's"
        }
    );
    println!(
        "operator RSS: idle {:.1} MiB, peak {:.1} MiB, growth {:.1} MiB",
        idle_rss as f64 / 1024.0,
        peak as f64 / 1024.0,
        peak.saturating_sub(idle_rss) as f64 / 1024.0
    );
    let fig = |key: &str, value: f64, unit: &str| {
        emit(
            &bench_name("snapshot"),
            &format!("{store}_{key}"),
            value,
            unit,
            mib,
        );
    };
    fig("raw_mib_s", raw_rate, "MiB/s");
    fig("snapshot_mib_s", snap_rate, "MiB/s");
    fig("restore_mib_s", restore_rate, "MiB/s");
    fig("helper_snapshot_mib_s", helper_rate, "MiB/s");
    fig("idle_rss_mib", idle_rss as f64 / 1024.0, "MiB");
    fig("peak_rss_mib", peak as f64 / 1024.0, "MiB");
    let growth = peak.saturating_sub(idle_rss) as f64 / 1024.0;
    fig("rss_growth_mib", growth, "MiB");
    Ok(())
}

/// The median of `v` (the upper one of an even count).
fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// The ways of moving an archive into a pod and extracting it there that the small-file
/// restore is measured against, each one exec with the archive on its stdin, streamed as a
/// restore streams it (not through `head -c`): (figure key, what it is, script; `X` is a fresh
/// directory, `S` a file beside it).
const TRANSPORTS: [(&str, &str, &str); 3] = [
    (
        "stream_tar",
        "exec stdin straight into `tar -x`",
        "mkdir X && tar -x -f - -C X",
    ),
    ("stream_cat", "exec stdin into `cat > file`", "cat > S"),
    (
        "stream_spool",
        "exec stdin into `cat > file`, then `tar -x -f file`",
        "mkdir X && cat > S && tar -x -f S -C X && rm -f S",
    ),
];

/// Streams `archive` into `script` (of [`TRANSPORTS`]) in the source pod, then removes what
/// it made; how long the exec took.
async fn transport(c: &Ctx<'_>, script: &str, archive: &[u8]) -> Res<Duration> {
    let (x, spool) = (
        "/workspace/.agentbox/bench-x",
        "/workspace/.agentbox/bench-spool.tar",
    );
    let script = script.replace('X', x).replace('S', spool);
    let req = ExecRequest::shell(script)
        .timeout(Duration::from_secs(3600))
        .stdin_reader(std::io::Cursor::new(archive.to_vec()));
    let t = Instant::now();
    let out = exec::run(c.pods, c.pod, "sandbox", req).await?;
    let took = t.elapsed();
    if !out.success() {
        return Err(format!("in the pod: {}", out.stderr_str()).into());
    }
    in_pod(c, format!("rm -rf {x} {spool}; sync"), None).await?;
    Ok(took)
}

/// `n` files of `BENCH_SMALL_BYTES` bytes (1 KiB): snapshot against the raw stream; restore,
/// create → Ready, against a cold start plus the image's own `tar -x` of the same archive in
/// the pod, in the same run; the ways of getting the archive into the pod; the operator's time
/// per member.
async fn small_files(c: &Ctx<'_>, store: &str, n: u64) -> Res<()> {
    let bytes = common::env_num("BENCH_SMALL_BYTES", 1024).max(1);
    let rounds = common::env_num("BENCH_SMALL_ROUNDS", 3).max(1);
    eprintln!("filling the workspace with {n} files of {bytes} bytes");
    // One awk process writes them all (a shell loop runs a process per file).
    in_pod(
        c,
        format!(
            "mkdir -p /workspace/many && cd /workspace/many && awk -v n={n} -v b={bytes} 'BEGIN {{ pad = \"\"; while (length(pad) < b) pad = pad \"0123456789abcdef\"; for (i = 0; i < n; i++) {{ f = \"f\" i; printf \"%s\", substr(\"file \" i \" \" pad, 1, b) > f; close(f) }} }}' && sync"
        ),
        None,
    )
    .await?;
    // The first read of fresh files is slower; the snapshot reads them warm.
    raw_stream(c, false).await?;
    let (raw_bytes, archive, raw, frames) = raw_stream(c, true).await?;

    // The canonicaliser alone, in this process, over the same bytes; what it writes is what a
    // restore streams into the pod.
    let t = Instant::now();
    let mut canon = Canonicalizer::snapshot(Limits {
        max_members: 0,
        ..Limits::default()
    });
    let mut out = BytesMut::new();
    let mut canonical = Vec::with_capacity(archive.len());
    for chunk in archive.chunks(64 << 10) {
        canon.feed(chunk, &mut out)?;
        canonical.extend_from_slice(&out);
        out.clear();
    }
    let members = canon.finish(&mut out)?.members;
    canonical.extend_from_slice(&out);
    let in_process = t.elapsed();

    // The image's own tar -x of that archive from a file in the pod, onto the workspace's
    // filesystem; once before the restore and once after, since that filesystem slows down as
    // tens of thousands of files come and go (the restore is compared with the mean).
    in_pod(
        c,
        "cat > /workspace/.agentbox/bench.tar".into(),
        Some(canonical.clone()),
    )
    .await?;
    let baseline = || async {
        let x = "/workspace/.agentbox/bench-x";
        let t = in_pod(
            c,
            format!("mkdir {x} && tar -x -f /workspace/.agentbox/bench.tar -C {x}"),
            None,
        )
        .await?;
        in_pod(c, format!("rm -rf {x}; sync"), None).await?;
        Ok::<_, Box<dyn std::error::Error>>(t)
    };
    let before = baseline().await?;

    // The transports, interleaved round by round (the machine's load moves; each figure is
    // the median of its rounds).
    let mut moved: Vec<Vec<Duration>> = vec![Vec::new(); TRANSPORTS.len()];
    for _ in 0..rounds {
        for (i, (_, _, script)) in TRANSPORTS.iter().enumerate() {
            moved[i].push(transport(c, script, &canonical).await?);
        }
    }

    let taken = take_snapshot(c).await?;
    // Restores and cold starts, interleaved: each round a sandbox of the scope (restored from
    // the snapshot) and one of another user's scope (nothing to restore), both deleted again.
    let (mut restores, mut colds) = (Vec::new(), Vec::new());
    let mut first = None;
    for r in 0..rounds {
        let cold = start(c, &format!("cold{r}"), "bench-cold").await?;
        delete_sandbox(c, &format!("cold{r}")).await?;
        let dst = start(c, &format!("dst{r}"), "bench").await?;
        delete_sandbox(c, &format!("dst{r}")).await?;
        colds.push(cold.total);
        restores.push(dst.total);
        first.get_or_insert(dst);
    }
    let first = first.ok_or("no restore")?;
    let (restore_time, branch, restore_cpu) = (first.after_pod, first.branch, first.cpu);
    let restore_total = median(restores.clone());
    let cold = median(colds.clone());
    let after = baseline().await?;
    in_pod(c, "rm -f /workspace/.agentbox/bench.tar".into(), None).await?;
    let extract = (before + after) / 2;
    let per = |d: Duration| d.as_secs_f64() * 1e6 / taken.members.max(1) as f64;
    let secs = |v: &[Duration]| {
        v.iter()
            .map(|d| format!("{:.2}", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "store: {store}; {n} files of {bytes} bytes, archive {:.1} MiB, {} members",
        taken.size as f64 / (1 << 20) as f64,
        taken.members
    );
    println!(
        "raw tar -c through exec : {:.2}s, in {frames} stdout frames ({:.0} bytes each)",
        raw.as_secs_f64(),
        raw_bytes as f64 / frames.max(1) as f64
    );
    println!(
        "snapshot (create->Ready): {:.2}s = {:.0}% of raw's speed (Running->Ready {:.2}s); operator CPU {:.2}s = {:.1} us/member",
        taken.total.as_secs_f64(),
        100.0 * raw.as_secs_f64() / taken.total.as_secs_f64(),
        taken.upload.as_secs_f64(),
        taken.cpu.as_secs_f64(),
        per(taken.cpu)
    );
    println!(
        "in-pod tar -x of the same archive from a file: {:.2}s before the restore, {:.2}s after",
        before.as_secs_f64(),
        after.as_secs_f64()
    );
    for ((key, what, _), d) in TRANSPORTS.iter().zip(&moved) {
        println!(
            "transport {key} ({what}): median {:.2}s (rounds: {})",
            median(d.clone()).as_secs_f64(),
            secs(d)
        );
    }
    println!(
        "cold start (create->Ready): median {:.2}s (rounds: {})",
        cold.as_secs_f64(),
        secs(&colds)
    );
    println!(
        "restore (create->Ready): median {:.2}s (rounds: {}) = {:.2}x (cold start + in-pod tar -x)",
        restore_total.as_secs_f64(),
        secs(&restores),
        restore_total.as_secs_f64() / (cold + extract).as_secs_f64()
    );
    println!(
        "restore (pod running->Ready, first round): {:.2}s = {:.0}% of in-pod tar -x's speed, branch {branch:?}; operator CPU {:.2}s = {:.1} us/member",
        restore_time.as_secs_f64(),
        100.0 * extract.as_secs_f64() / restore_time.as_secs_f64(),
        restore_cpu.as_secs_f64(),
        per(restore_cpu)
    );
    println!(
        "canonicaliser in this process: {:.3}s for {members} members = {:.2} us/member ({raw_bytes} bytes)",
        in_process.as_secs_f64(),
        in_process.as_secs_f64() * 1e6 / members.max(1) as f64
    );
    let helper = suspended_snapshot(c).await?;
    println!(
        "snapshot of the suspended sandbox by the node helper (create->Ready): {:.2}s = {:.0}% of the exec path's time (Running->Ready {:.2}s); operator CPU {:.2}s; {} members, sha256 {}",
        helper.total.as_secs_f64(),
        100.0 * helper.total.as_secs_f64() / taken.total.as_secs_f64(),
        helper.upload.as_secs_f64(),
        helper.cpu.as_secs_f64(),
        helper.members,
        if helper.sha256 == taken.sha256 {
            "equal to the exec path's"
        } else {
            "DIFFERS from the exec path's"
        }
    );
    let fig = |key: &str, value: f64, unit: &str| {
        emit(
            &bench_name("snapshot"),
            &format!("{store}_small_{key}"),
            value,
            unit,
            n,
        );
    };
    fig("helper_snapshot_secs", helper.total.as_secs_f64(), "s");
    fig("file_bytes", bytes as f64, "B");
    fig("raw_secs", raw.as_secs_f64(), "s");
    fig("snapshot_secs", taken.total.as_secs_f64(), "s");
    fig("snapshot_cpu_us_per_member", per(taken.cpu), "us");
    fig("extract_secs", extract.as_secs_f64(), "s");
    fig("restore_secs", restore_time.as_secs_f64(), "s");
    fig("restore_create_secs", restore_total.as_secs_f64(), "s");
    fig("cold_secs", cold.as_secs_f64(), "s");
    for ((key, _, _), d) in TRANSPORTS.iter().zip(moved) {
        fig(&format!("{key}_secs"), median(d).as_secs_f64(), "s");
    }
    fig("restore_cpu_us_per_member", per(restore_cpu), "us");
    fig(
        "canonicalise_us_per_member",
        in_process.as_secs_f64() * 1e6 / members.max(1) as f64,
        "us",
    );
    Ok(())
}
