//! Scale: many Sandboxes in `lifecycle.mode: Suspended` (no pods) against one operator, and
//! that operator restarted (issue 44).
//!
//! `eval "$(hack/cluster env)"; BENCH_SCALE_N=2000 cargo bench --bench scale` (release). It
//! starts the operator (leader election on, as deployed) for a temporary namespace under a
//! memory limit, creates `BENCH_SCALE_N` (default 500) Suspended sandboxes,
//! `BENCH_SCALE_INFLIGHT` (16) requests in flight, and measures:
//! - the create rate and the time until every one is reconciled (a watch sees phase Suspended
//!   with `observedGeneration` = `generation`), and each one's create → reconciled latency;
//! - `BENCH_SCALE_IDLE_SECS` (default 60) at rest: the operator's RSS and CPU (from
//!   `/proc/<pid>`), and its writes from the API server's audit log (`$AGENTBOX_AUDIT_LOG`),
//!   told apart by its User-Agent, leader-election Lease renewals counted apart;
//! - `BENCH_SCALE_RESTARTS` (default 1) restarts in a row: the operator stopped (SIGTERM, as a
//!   rollout does) and a new one started under the same limit; the time from its start until
//!   every Sandbox is reconciled (its `agentbox_startup_reconciled_seconds`, polled on its
//!   metrics endpoint), its peak RSS meanwhile (`VmHWM`), its RSS after
//!   `BENCH_SCALE_SETTLE_SECS` (30) at rest, and its writes from its start to then (to
//!   Sandboxes apart: none is expected, every status is already true);
//! - `deletecollection`, sent again while some are not marked deleted (the API server ends a
//!   long one at its request timeout; scale/rounds.rs), and the time from the first until every
//!   sandbox is gone (finalizers removed).
//!
//! With `BENCH_SCALE_IMAGE` (an operator image of this tree, `hack/image`; `hack/bench` sets
//! it) the operator runs as the chart runs it: `helm install` of charts/agentbox in the bench's
//! namespace with hack/values-local.yaml and the chart's default `resources`, so the kubelet's
//! memory cgroup holds it to the chart's limit; a restart is a rollout of its Deployment, timed
//! from the rollout; the pod's process is found by its container's cgroup, and its memory is
//! read from `/proc/<pid>/status` and from that cgroup (working set, peak usage).
//!
//! Without it the bench runs this build's binary, and the limit is the chart's default
//! `resources.limits.memory` (charts/agentbox/values.yaml; `BENCH_SCALE_LIMIT_MIB` overrides
//! it in both modes), enforced as the kubelet would: each operator runs in a memory cgroup of
//! its own (cgroup v1 or v2 under `/sys/fs/cgroup`) with that limit, so an operator that needs
//! more is killed by the kernel and the bench fails saying so. Where no cgroup can be made (not
//! root, no writable hierarchy), the limit is checked instead against the operator's `VmHWM`,
//! and the output says which.
//!
//! Figures go to `BENCH_RESULTS` as JSON lines under the bench `scale_<N>`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
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
#[path = "scale/rounds.rs"]
mod rounds;

use common::{
    DeleteAll, LEADER_LEASE, OPERATOR_UA, Operator, audit_log, emit, env_num, namespace, p50_p95,
    proc_kib, read_audit, repo_root,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

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
    Command::new("getconf")
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
        "metadata": {"name": format!("s-{i:05}")},
        "spec": {"image": "docker.io/library/busybox:1.37",
            "scope": {"kind": "Session", "agent": "bench", "session": format!("s-{i}")},
            "lifecycle": {"mode": "Suspended"}},
    }))?)
}

/// The chart's default memory limit in MiB (`resources.limits.memory` of
/// charts/agentbox/values.yaml: `<n>Mi` or `<n>Gi`).
fn chart_limit_mib() -> Res<u64> {
    let path = repo_root().join("charts/agentbox/values.yaml");
    let values: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path)?)?;
    let limit = values["resources"]["limits"]["memory"]
        .as_str()
        .ok_or("values.yaml: no resources.limits.memory")?;
    if let Some(mi) = limit.strip_suffix("Mi") {
        return Ok(mi.parse()?);
    }
    if let Some(gi) = limit.strip_suffix("Gi") {
        return Ok(gi.parse::<u64>()? * 1024);
    }
    Err(format!("values.yaml: resources.limits.memory {limit:?} is not <n>Mi or <n>Gi").into())
}

/// A memory cgroup with a limit, removed when dropped (once its process has gone).
struct Cgroup {
    dir: PathBuf,
    /// cgroup v1 (`memory.limit_in_bytes`) or v2 (`memory.max`).
    v1: bool,
}

impl Cgroup {
    /// A new cgroup `name` limited to `bytes`, or why not.
    fn new(name: &str, bytes: u64) -> Result<Cgroup, String> {
        let v1_root = Path::new("/sys/fs/cgroup/memory");
        let (dir, v1) = if v1_root.join("memory.limit_in_bytes").exists() {
            (v1_root.join(name), true)
        } else {
            (Path::new("/sys/fs/cgroup").join(name), false)
        };
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let cg = Cgroup { dir, v1 };
        let file = if v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        std::fs::write(cg.dir.join(file), bytes.to_string())
            .map_err(|e| format!("{}/{file}: {e}", cg.dir.display()))?;
        if !v1 {
            // No swap to hide in: the limit is the memory the process may have.
            let _ = std::fs::write(cg.dir.join("memory.swap.max"), "0");
        }
        Ok(cg)
    }

    /// How many times the kernel's OOM killer ended a process in it.
    fn oom_kills(&self) -> u64 {
        let file = if self.v1 {
            "memory.oom_control"
        } else {
            "memory.events"
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

/// Where one operator of the bench runs.
enum Run {
    /// A process of this build, in a memory cgroup of its own when one could be made.
    Process {
        op: Operator,
        cgroup: Option<Cgroup>,
        log: PathBuf,
    },
    /// The chart's Deployment (`BENCH_SCALE_IMAGE`): its one pod, the container's process
    /// (`pid`, as the node sees it) in the memory cgroup the kubelet made with the chart's limit.
    Pod {
        name: String,
        pid: u32,
        cgroup: PathBuf,
    },
}

/// One operator of the bench: leader election on, its metrics on `port`.
struct Op {
    run: Run,
    port: u16,
}

impl Op {
    fn pid(&self) -> u32 {
        match &self.run {
            Run::Process { op, .. } => op.pid(),
            Run::Pod { pid, .. } => *pid,
        }
    }

    /// Whether a memory limit is enforced by a cgroup (else it is checked against `VmHWM`).
    fn enforced(&self) -> bool {
        match &self.run {
            Run::Process { cgroup, .. } => cgroup.is_some(),
            Run::Pod { .. } => true,
        }
    }

    /// The memory cgroup the operator runs in, if any.
    fn cgroup(&self) -> Option<CgroupFiles> {
        match &self.run {
            Run::Process { cgroup, .. } => cgroup.as_ref().map(|c| CgroupFiles {
                dir: c.dir.clone(),
                v1: c.v1,
            }),
            Run::Pod { cgroup, .. } => Some(CgroupFiles {
                dir: cgroup.clone(),
                v1: cgroup.starts_with("/sys/fs/cgroup/memory"),
            }),
        }
    }

    /// The process has exited (an OOM kill, a crash): how, with the log's last lines.
    fn exited(&mut self) -> Option<String> {
        match &mut self.run {
            Run::Process { op, cgroup, log } => {
                let status = op.0.try_wait().ok().flatten()?;
                let kills = cgroup.as_ref().map_or(0, Cgroup::oom_kills);
                let text = std::fs::read_to_string(&*log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(5).collect();
                Some(format!(
                    "the operator exited ({status}; OOM kills in its cgroup: {kills}); log {}: {}",
                    log.display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                ))
            }
            Run::Pod { name, pid, cgroup } => {
                if Path::new(&format!("/proc/{pid}")).exists() {
                    return None;
                }
                let kills = CgroupFiles {
                    dir: cgroup.clone(),
                    v1: cgroup.starts_with("/sys/fs/cgroup/memory"),
                }
                .oom_kills();
                Some(format!(
                    "the operator pod {name}'s process {pid} is gone (OOM kills in its cgroup: {kills}); see `kubectl describe pod {name}`"
                ))
            }
        }
    }

    /// Its `/metrics` text.
    async fn metrics(&self) -> Option<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .ok()?;
        let req = "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
    }
}

/// The memory files of a cgroup (v1 or v2) the bench reads.
struct CgroupFiles {
    dir: PathBuf,
    v1: bool,
}

impl CgroupFiles {
    fn read_u64(&self, file: &str) -> Option<u64> {
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// A field of `memory.stat`.
    fn stat(&self, field: &str) -> u64 {
        std::fs::read_to_string(self.dir.join("memory.stat"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix(field)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }

    /// The working set in KiB, as the kubelet counts it against the limit: the usage less the
    /// inactive file pages.
    fn working_set_kib(&self) -> u64 {
        let (usage, inactive) = if self.v1 {
            (
                self.read_u64("memory.usage_in_bytes"),
                self.stat("total_inactive_file"),
            )
        } else {
            (self.read_u64("memory.current"), self.stat("inactive_file"))
        };
        usage.unwrap_or(0).saturating_sub(inactive) >> 10
    }

    /// The cgroup's peak usage in KiB (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`).
    fn peak_kib(&self) -> u64 {
        self.read_u64(if self.v1 {
            "memory.max_usage_in_bytes"
        } else {
            "memory.peak"
        })
        .unwrap_or(0)
            >> 10
    }

    fn oom_kills(&self) -> u64 {
        let file = if self.v1 {
            "memory.oom_control"
        } else {
            "memory.events"
        };
        std::fs::read_to_string(self.dir.join(file))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// The value of an unlabelled sample `name` in a metrics text.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// Starts this build's operator for `ns` as `identity`, in a memory cgroup limited to
/// `limit_mib` when one can be made (the shell moves itself into it and then becomes the
/// operator, so not one allocation escapes the limit), and returns once it leads.
async fn start_operator(
    client: &kube::Client,
    ns: &str,
    identity: &str,
    limit_mib: u64,
) -> Res<Op> {
    let port = free_port();
    let log = std::env::temp_dir().join(format!("{ns}-{identity}.log"));
    let mut cmd = Operator::command();
    cmd.args(["--namespace", ns, "--metrics-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--identity", identity]);
    let name = format!("agentbox-bench-{}-{identity}", std::process::id());
    let cgroup = match Cgroup::new(&name, limit_mib << 20) {
        Ok(cg) => Some(cg),
        Err(e) => {
            eprintln!("no memory cgroup ({e}): the limit is checked against VmHWM instead");
            None
        }
    };
    let mut run = match &cgroup {
        Some(cg) => {
            let mut sh = Command::new("sh");
            sh.arg("-c")
                .arg(format!(
                    "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"",
                    cg.dir.display()
                ))
                .arg(cmd.get_program())
                .args(cmd.get_args());
            sh
        }
        None => cmd,
    };
    run.env("RUST_LOG", common::operator_log_level());
    let op = Operator::start(&mut run, &log)?;
    let mut op = Op {
        run: Run::Process { op, cgroup, log },
        port,
    };
    leads(client, ns, identity, &mut op).await?;
    Ok(op)
}

/// Waits (up to 60 s) until `op` holds the leader Lease as `identity`.
async fn leads(client: &kube::Client, ns: &str, identity: &str, op: &mut Op) -> Res<()> {
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(e) = op.exited() {
            return Err(e.into());
        }
        let holder = leases
            .get_opt(LEADER_LEASE)
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        if holder.as_deref() == Some(identity) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{identity} did not lead within 60 s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The chart installed as a release in the bench's namespace, watching it, with this tree's
/// image (`BENCH_SCALE_IMAGE`, from `hack/image`) and the local cluster's values
/// (hack/values-local.yaml); its resources are the chart's defaults unless
/// `BENCH_SCALE_LIMIT_MIB` sets the limit. Uninstalled when dropped.
struct Release {
    name: String,
    ns: String,
    installed: bool,
}

fn helm() -> String {
    std::env::var("HELM")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "helm".into())
}

impl Release {
    fn install(ns: &str, image: &str, port: u16, limit_mib: Option<u64>) -> Res<Release> {
        let (repo, tag) = image
            .rsplit_once(':')
            .ok_or_else(|| format!("BENCH_SCALE_IMAGE {image:?} is not <repository>:<tag>"))?;
        let mut cmd = Command::new(helm());
        cmd.current_dir(repo_root())
            .args(["install", ns, "charts/agentbox", "-n", ns])
            .args(["-f", "hack/values-local.yaml"]);
        let mut set = vec![
            format!("image.repository={repo}"),
            format!("image.tag={tag}"),
            format!("watchNamespace={ns}"),
            "crds.install=false".into(),
            format!("leaderElection.leaseName={LEADER_LEASE}"),
            format!("metrics.port={port}"),
            "metrics.service.enabled=false".into(),
        ];
        // The helper image hack/helper-image imports, as the process mode's (common.rs).
        if let Some(helper) = std::env::var("AGENTBOX_HELPER_IMAGE")
            .ok()
            .filter(|s| !s.is_empty())
        {
            set.push(format!("helperImage={helper}"));
        }
        if let Some(mib) = limit_mib {
            set.push(format!("resources.limits.memory={mib}Mi"));
        }
        for v in &set {
            cmd.args(["--set", v]);
        }
        let out = cmd.output()?;
        if !out.status.success() {
            return Err(format!(
                "helm install: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
            .into());
        }
        Ok(Release {
            name: ns.to_string(),
            ns: ns.to_string(),
            installed: true,
        })
    }

    /// `helm uninstall` (its cluster-scoped objects too).
    fn uninstall(&mut self) {
        if std::mem::take(&mut self.installed) {
            let _ = Command::new(helm())
                .args(["uninstall", &self.name, "-n", &self.ns, "--wait"])
                .args(["--timeout", "120s"])
                .stdout(std::process::Stdio::null())
                .status();
        }
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        self.uninstall();
    }
}

/// The pid (as the node sees it) of the container `container_id` of the pod `uid`, and its
/// memory cgroup, found under `/sys/fs/cgroup` (v1's memory hierarchy, or v2).
fn container_process(uid: &str, container_id: &str) -> Option<(u32, PathBuf)> {
    fn find(dir: &Path, depth: u32, pod: &[String], id: &str, in_pod: bool) -> Option<PathBuf> {
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = e.file_name().to_string_lossy().to_string();
            if in_pod && name.contains(id) {
                return Some(e.path());
            }
            let here = pod.iter().any(|p| name.contains(p.as_str()));
            if (here || (!in_pod && depth > 0))
                && let Some(found) = find(&e.path(), depth.saturating_sub(1), pod, id, here)
            {
                return Some(found);
            }
        }
        None
    }
    let v1 = Path::new("/sys/fs/cgroup/memory");
    let root = if v1.is_dir() {
        v1
    } else {
        Path::new("/sys/fs/cgroup")
    };
    let pod = [format!("pod{uid}"), format!("pod{}", uid.replace('-', "_"))];
    let dir = find(root, 5, &pod, container_id, false)?;
    let pid = std::fs::read_to_string(dir.join("cgroup.procs"))
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()?;
    Some((pid, dir))
}

/// Waits (up to 180 s) for the release's operator pod other than `old` to run, and then to
/// lead: the operator of the chart, as a rollout leaves it.
async fn chart_operator(client: &kube::Client, ns: &str, port: u16, old: Option<&str>) -> Res<Op> {
    use k8s_openapi::api::core::v1::Pod;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={ns}"));
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut op = loop {
        if Instant::now() > deadline {
            return Err("the chart's operator pod did not run within 180 s".into());
        }
        let found = pods.list(&lp).await?.items.into_iter().find_map(|p| {
            let name = p.name_any();
            if Some(name.as_str()) == old || p.metadata.deletion_timestamp.is_some() {
                return None;
            }
            let uid = p.metadata.uid.clone()?;
            let status = p.status?;
            let cs = status
                .container_statuses?
                .into_iter()
                .find(|c| c.name == "operator")?;
            cs.state.as_ref()?.running.as_ref()?;
            let id = cs.container_id?;
            let id = id.rsplit_once("://").map_or(id.as_str(), |(_, i)| i);
            let (pid, cgroup) = container_process(&uid, id)?;
            Some((name, pid, cgroup))
        });
        if let Some((name, pid, cgroup)) = found {
            break Op {
                run: Run::Pod { name, pid, cgroup },
                port,
            };
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let Run::Pod { name, .. } = &op.run else {
        return Err("not a pod".into());
    };
    let name = name.clone();
    leads(client, ns, &name, &mut op).await?;
    Ok(op)
}

/// A rollout of the chart's Deployment (`kubectl rollout restart`: with hostNetwork the old pod
/// goes before the new one starts).
async fn rollout(client: &kube::Client, ns: &str, k: u64) -> Res<()> {
    use k8s_openapi::api::apps::v1::Deployment;
    let deploys: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={ns}"));
    let d = deploys
        .list(&lp)
        .await?
        .items
        .into_iter()
        .next()
        .ok_or("the release has no Deployment")?;
    let patch = json!({"spec": {"template": {"metadata": {"annotations": {
        "kubectl.kubernetes.io/restartedAt": format!("bench-restart-{k}-{}", Timestamp::now())
    }}}}});
    deploys
        .patch(
            &d.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

/// What one restart came to.
struct Restart {
    /// Process start → every Sandbox reconciled, as the bench saw it on the metrics.
    reconciled: Duration,
    /// The operator's own figure (from the start of its controllers).
    operator_secs: f64,
    /// VmHWM by the end of the settle window (KiB).
    peak_kib: u64,
    /// VmRSS at the end of the settle window (KiB).
    rss_kib: u64,
    /// The cgroup's working set at the end of the settle window and its peak usage (KiB; 0
    /// without a cgroup).
    cgroup_ws_kib: u64,
    cgroup_peak_kib: u64,
    /// The limit the operator saw (`agentbox_memory_limit_bytes`).
    seen_limit: f64,
    /// The audit window: from the process start to the end of the settle window.
    from: Timestamp,
    to: Timestamp,
}

/// Stops `old` (SIGTERM, as a rollout does: it hands the leader Lease over), starts a new
/// operator and follows it until every Sandbox is reconciled, then `settle` at rest. With the
/// chart (`chart`), a rollout of its Deployment does both; the time runs from the rollout.
#[allow(clippy::too_many_arguments)]
async fn restart(
    client: &kube::Client,
    ns: &str,
    old: &mut Option<Op>,
    n: usize,
    k: u64,
    limit_mib: u64,
    settle: Duration,
    chart: bool,
) -> Res<(Op, Restart)> {
    let from = Timestamp::now();
    let t = Instant::now();
    let mut op = if chart {
        let (port, old_name) = match old.as_ref().map(|o| (o.port, &o.run)) {
            Some((port, Run::Pod { name, .. })) => (port, name.clone()),
            _ => return Err("no chart operator to restart".into()),
        };
        rollout(client, ns, k).await?;
        let op = chart_operator(client, ns, port, Some(&old_name)).await?;
        drop(old.take());
        op
    } else {
        drop(old.take()); // SIGTERM, then waits for it to exit (SIGKILL after 5 s)
        start_operator(client, ns, &format!("bench-scale-r{k}"), limit_mib).await?
    };
    let (reconciled, operator_secs) = loop {
        if let Some(e) = op.exited() {
            return Err(format!("restart {k}: {e}").into());
        }
        let m = op.metrics().await.unwrap_or_default();
        match sample(&m, "agentbox_startup_reconciled_seconds") {
            Some(secs) if secs > 0.0 => break (t.elapsed(), secs),
            Some(_) => {}
            // An operator from before the gauge (BENCH_OPERATOR_BIN, to compare builds): as
            // many sandbox reconciles as sandboxes, which a first pass makes at least.
            None => {
                let runs = sample(&m, "agentbox_reconciles_total{controller=\"sandbox\"}");
                if runs.is_some_and(|r| r >= n as f64) {
                    break (t.elapsed(), 0.0);
                }
            }
        }
        if t.elapsed() > Duration::from_secs(300) {
            let left = sample(&m, "agentbox_startup_pending_sandboxes");
            return Err(
                format!("restart {k}: {left:?} sandboxes not reconciled after 300 s").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(settle).await;
    if let Some(e) = op.exited() {
        return Err(format!("restart {k}, at rest: {e}").into());
    }
    let m = op.metrics().await.unwrap_or_default();
    let cg = op.cgroup();
    let r = Restart {
        reconciled,
        operator_secs,
        peak_kib: proc_kib(op.pid(), "VmHWM:"),
        rss_kib: proc_kib(op.pid(), "VmRSS:"),
        cgroup_ws_kib: cg.as_ref().map_or(0, CgroupFiles::working_set_kib),
        cgroup_peak_kib: cg.as_ref().map_or(0, CgroupFiles::peak_kib),
        seen_limit: sample(&m, "agentbox_memory_limit_bytes").unwrap_or(0.0),
        from,
        to: Timestamp::now(),
    };
    Ok((op, r))
}

/// After a failure with thousands of Sandboxes left: an operator without a limit (the one
/// given, while it still runs) deletes them all and removes their finalizers, so that the
/// namespace does not stay Terminating on a cluster others share.
async fn rescue(
    client: &kube::Client,
    ns: &str,
    sbxs: &Api<Sandbox>,
    op: Option<Op>,
    release: Option<&mut Release>,
) {
    let mut op = op;
    if let Some(r) = release
        && op.as_mut().is_none_or(|o| o.exited().is_some())
    {
        // Its pod would compete for the Lease with the rescuer.
        drop(op.take());
        r.uninstall();
    }
    if op.as_mut().is_none_or(|o| o.exited().is_some()) {
        drop(op.take());
        match start_operator(client, ns, "bench-scale-rescue", 1 << 20).await {
            Ok(o) => op = Some(o),
            Err(e) => eprintln!("no operator to remove the finalizers: {e}"),
        }
    }
    if let Err(e) = delete_all(sbxs, Duration::from_secs(900)).await {
        eprintln!("the rescue's deletion: {e}");
    }
    drop(op);
}

/// Deletes every Sandbox of `sbxs`: `deletecollection` sent again while some are not marked
/// deleted, at most [`rounds::MAX_ROUNDS`] times, and waits up to `wait` until none is left.
/// How long that took from the first request, and how many requests it took.
async fn delete_all(sbxs: &Api<Sandbox>, wait: Duration) -> Res<(Duration, u32)> {
    let t = Instant::now();
    let (mut sent, mut last_error) = (0, None::<String>);
    loop {
        let listed = sbxs.list_metadata(&ListParams::default()).await?.items;
        let unmarked = listed
            .iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .count();
        match rounds::next(
            listed.len(),
            unmarked,
            sent,
            rounds::MAX_ROUNDS,
            last_error.as_deref(),
        ) {
            rounds::Next::Done => return Ok((t.elapsed(), sent)),
            rounds::Next::GiveUp(why) => return Err(why.into()),
            rounds::Next::Send => {
                sent += 1;
                let out = sbxs
                    .delete_collection(&DeleteParams::default(), &ListParams::default())
                    .await;
                // A round the API server ended early (its request timeout) is not the end:
                // what it did not reach is sent again.
                last_error = out.err().map(|e| e.to_string());
                if let Some(e) = &last_error {
                    eprintln!("deletecollection {sent}: {e} ({unmarked} were not marked)");
                }
            }
            rounds::Next::Wait => {
                if t.elapsed() > wait {
                    return Err(format!(
                        "{} sandboxes still there {} s after the first deletecollection",
                        listed.len(),
                        wait.as_secs()
                    )
                    .into());
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

/// The settings of a run.
#[derive(Clone, Copy)]
struct Settings {
    n: usize,
    idle: u64,
    restarts: u64,
    settle: Duration,
    inflight: usize,
    limit_mib: u64,
    /// The chart's operator pod (`BENCH_SCALE_IMAGE`) instead of a process of this build.
    chart: bool,
}

#[tokio::main]
async fn main() -> Res<()> {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return Ok(()); // `cargo test --benches` / `--list`: nothing to list.
    }
    let image = std::env::var("BENCH_SCALE_IMAGE")
        .ok()
        .filter(|s| !s.is_empty());
    let limit_override = match std::env::var("BENCH_SCALE_LIMIT_MIB") {
        Ok(v) => Some(v.parse::<u64>()?),
        Err(_) => None,
    };
    let set = Settings {
        n: env_num("BENCH_SCALE_N", 500) as usize,
        idle: env_num("BENCH_SCALE_IDLE_SECS", 60),
        restarts: env_num("BENCH_SCALE_RESTARTS", 1),
        settle: Duration::from_secs(env_num("BENCH_SCALE_SETTLE_SECS", 30)),
        inflight: env_num("BENCH_SCALE_INFLIGHT", 16) as usize,
        limit_mib: match limit_override {
            Some(mib) => mib,
            None => chart_limit_mib()?,
        },
        chart: image.is_some(),
    };
    let audit = audit_log()?;
    let client = agentbox_api::kube_client().await?;
    let cleanup = namespace(&client, "bench-scale").await?;
    let ns = cleanup.1.clone();
    let (mut release, mut op) = match &image {
        Some(image) => {
            let port = free_port();
            let mut release = Release::install(&ns, image, port, limit_override)?;
            match chart_operator(&client, &ns, port, None).await {
                Ok(op) => (Some(release), Some(op)),
                Err(e) => {
                    release.uninstall();
                    return Err(e);
                }
            }
        }
        None => (
            None,
            Some(start_operator(&client, &ns, "bench-scale", set.limit_mib).await?),
        ),
    };
    let sbxs: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    // Declared after `op`: dropped first, so the operator is there to remove the finalizers.
    let _delete_all = DeleteAll::of(&client, &ns);
    let out = measure(&set, &client, &ns, &audit, &sbxs, &mut op).await;
    if let Err(e) = &out {
        eprintln!("{e}");
        rescue(&client, &ns, &sbxs, op.take(), release.as_mut()).await;
    }
    out
}

/// The whole run, from the operator's lead to the sandboxes' deletion and the figures.
async fn measure(
    set: &Settings,
    client: &kube::Client,
    ns: &str,
    audit: &str,
    sbxs: &Api<Sandbox>,
    op: &mut Option<Op>,
) -> Res<()> {
    let Settings {
        n,
        idle,
        restarts,
        settle,
        inflight,
        limit_mib,
        chart,
    } = *set;
    let bench = format!("scale_{n}");
    let enforced = op.as_ref().is_some_and(Op::enforced);
    let pid = op.as_ref().map_or(0, Op::pid);
    let ticks = clock_ticks();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_before = proc_kib(pid, "VmRSS:");
    let where_ = if chart {
        "the chart's operator pod"
    } else if enforced {
        "a memory cgroup"
    } else {
        "checked against VmHWM"
    };
    eprintln!(
        "operator pid {pid} leads in {ns} ({limit_mib} MiB limit, {where_}); creating {n} Suspended sandboxes"
    );

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
                created_at
                    .lock()
                    .map_err(|_| "poisoned")?
                    .insert(s.name_any(), t);
                Ok::<_, Box<dyn std::error::Error>>(())
            }
        })
        .buffer_unordered(inflight)
        .try_collect::<Vec<()>>();
    let mut done: HashMap<String, Instant> = HashMap::new();
    let watch = async {
        while done.len() < n {
            let s = match tokio::time::timeout(Duration::from_secs(300), events.next())
                .await
                .map_err(|_| format!("{} of {n} reconciled after 300 s quiet", done.len()))?
                .ok_or("watch ended")?
            {
                Ok(s) => s,
                // A watch the API server expired (thousands of writes go by): the watcher
                // lists again and goes on; the objects come again with it.
                Err(e) => {
                    eprintln!("the bench's watch: {e} (it lists again)");
                    continue;
                }
            };
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
    drop(events);
    let all_time = t0.elapsed();
    let cpu_reconcile = cpu_secs(pid, ticks) - cpu0;
    let created_at = created_at.into_inner().map_err(|_| "poisoned")?;
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
    let peak_first = proc_kib(pid, "VmHWM:");
    let cg_rest = op
        .as_ref()
        .and_then(Op::cgroup)
        .map_or(0, |c| c.working_set_kib());
    if let Some(e) = op.as_mut().and_then(Op::exited) {
        return Err(e.into());
    }

    // Restarts in a row, each under the same limit.
    let mut after: Vec<Restart> = Vec::new();
    for k in 1..=restarts {
        let (new, r) = restart(client, ns, op, n, k, limit_mib, settle, chart).await?;
        eprintln!(
            "restart {k}: every sandbox reconciled {:.1} s after the start (operator: {:.1} s), peak {:.1} MiB, {:.1} MiB after {} s at rest (cgroup: working set {:.1} MiB, peak {:.1} MiB); limit seen {:.0} MiB",
            r.reconciled.as_secs_f64(),
            r.operator_secs,
            r.peak_kib as f64 / 1024.0,
            r.rss_kib as f64 / 1024.0,
            settle.as_secs(),
            r.cgroup_ws_kib as f64 / 1024.0,
            r.cgroup_peak_kib as f64 / 1024.0,
            r.seen_limit / 1048576.0
        );
        *op = Some(new);
        after.push(r);
    }

    // Delete them all: `deletecollection`, again while some are not marked deleted (the API
    // server cuts a long one off); done when the last finalizer is gone.
    let del_start = Timestamp::now();
    let (delete_time, delete_rounds) = delete_all(sbxs, Duration::from_secs(900)).await?;
    let del_end = Timestamp::now();
    let last_pid = op.as_ref().map_or(0, Op::pid);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_deleted = proc_kib(last_pid, "VmRSS:");
    drop(op.take());

    // The operator's writes, by its User-Agent, in the namespace.
    let writes = read_audit(audit, ns);
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
        let to_sandboxes = ws.iter().filter(|w| w.resource == "sandboxes").count();
        (ws.len(), to_sandboxes, kinds)
    };
    let (w_reconcile, _, k_reconcile) = count(start_ts, reconcile_end, false);
    let (w_idle, _, k_idle) = count(idle_start, idle_end, false);
    let (w_leader, _, _) = count(idle_start, idle_end, true);
    let (w_delete, _, k_delete) = count(del_start, del_end, false);
    let mut restart_writes = 0;
    let mut restart_sandbox_writes = 0;
    let mut restart_kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for r in &after {
        let (w, s, k) = count(r.from, r.to, false);
        restart_writes += w;
        restart_sandbox_writes += s;
        for (kind, c) in k {
            *restart_kinds.entry(kind).or_default() += c;
        }
    }
    let per_min = |k: usize| k as f64 * 60.0 / idle_secs;
    let mib = |kib: u64| kib as f64 / 1024.0;
    let per_sbx = |kib: u64| kib.saturating_sub(rss_before) as f64 / n as f64;

    let worst = |f: fn(&Restart) -> f64| after.iter().map(f).fold(0.0, f64::max);
    let restart_secs = worst(|r| r.reconciled.as_secs_f64());
    let restart_peak = worst(|r| r.peak_kib as f64) as u64;
    let restart_rss = worst(|r| r.rss_kib as f64) as u64;
    let peak_ratio = restart_peak as f64 / rss_rest.max(1) as f64;
    let restart_cg_ws = worst(|r| r.cgroup_ws_kib as f64) as u64;
    let restart_cg_peak = worst(|r| r.cgroup_peak_kib as f64) as u64;

    println!();
    println!(
        "{n} Suspended sandboxes, one operator at a time under a {limit_mib} MiB limit ({where_}):"
    );
    println!(
        "  created in {:.1} s ({:.0}/s, {inflight} in flight); all reconciled {:.1} s after the first create",
        create_time.as_secs_f64(),
        n as f64 / create_time.as_secs_f64(),
        all_time.as_secs_f64()
    );
    println!("  create → reconciled p50 {lp50:.0} ms, p95 {lp95:.0} ms");
    println!(
        "  operator CPU while reconciling {cpu_reconcile:.1} s; writes {w_reconcile} ({:.2} per sandbox, bench's creates excluded): {k_reconcile:?}",
        w_reconcile as f64 / n as f64
    );
    println!(
        "  at rest ({idle_secs:.0} s): RSS {:.1} MiB = {:.1} KiB per sandbox (before the sandboxes {:.1} MiB, max in window {:.1} MiB, peak so far {:.1} MiB), CPU {cpu_rest_pct:.2}%",
        mib(rss_rest),
        per_sbx(rss_rest),
        mib(rss_before),
        mib(rss_max),
        mib(peak_first)
    );
    if cg_rest > 0 {
        println!(
            "  at rest: the cgroup's working set {:.1} MiB; after the restarts (worst) {:.1} MiB, the cgroup's peak {:.1} MiB",
            mib(cg_rest),
            mib(restart_cg_ws),
            mib(restart_cg_peak)
        );
    }
    println!(
        "  at rest: {w_idle} writes ({:.1}/min) {k_idle:?}, and {w_leader} leader-election Lease renewals ({:.1}/min)",
        per_min(w_idle),
        per_min(w_leader)
    );
    for (k, r) in after.iter().enumerate() {
        println!(
            "  restart {}: all reconciled {:.1} s after its start; peak {:.1} MiB ({:.2}× the rest figure); after {} s at rest {:.1} MiB = {:.1} KiB per sandbox",
            k + 1,
            r.reconciled.as_secs_f64(),
            mib(r.peak_kib),
            r.peak_kib as f64 / rss_rest.max(1) as f64,
            settle.as_secs(),
            mib(r.rss_kib),
            per_sbx(r.rss_kib)
        );
    }
    println!(
        "  restarts: {restart_writes} operator writes ({restart_sandbox_writes} to Sandboxes) {restart_kinds:?}"
    );
    println!(
        "  deletecollection → all gone {:.1} s ({delete_rounds} requests); operator writes {w_delete}: {k_delete:?}; its RSS 5 s later {:.1} MiB",
        delete_time.as_secs_f64(),
        mib(rss_deleted)
    );

    let n64 = n as u64;
    let b = bench.as_str();
    emit(b, "create_secs", create_time.as_secs_f64(), "s", n64);
    emit(
        b,
        "create_per_sec",
        n as f64 / create_time.as_secs_f64(),
        "1/s",
        inflight as u64,
    );
    emit(b, "reconcile_all_secs", all_time.as_secs_f64(), "s", n64);
    emit(b, "reconcile_p50_ms", lp50, "ms", n64);
    emit(b, "reconcile_p95_ms", lp95, "ms", n64);
    emit(b, "reconcile_cpu_secs", cpu_reconcile, "s", n64);
    let writes_per = w_reconcile as f64 / n as f64;
    emit(b, "writes_per_sandbox", writes_per, "writes", n64);
    emit(b, "rest_rss_mib", mib(rss_rest), "MiB", n64);
    emit(b, "rest_rss_before_mib", mib(rss_before), "MiB", n64);
    emit(b, "rest_kib_per_sandbox", per_sbx(rss_rest), "KiB", n64);
    emit(b, "rest_cpu_pct", cpu_rest_pct, "%", idle);
    emit(
        b,
        "rest_writes_per_min",
        per_min(w_idle),
        "writes/min",
        idle,
    );
    let leader = per_min(w_leader);
    emit(b, "rest_leader_writes_per_min", leader, "writes/min", idle);
    if !after.is_empty() {
        let k = after.len() as u64;
        emit(b, "restart_reconciled_secs", restart_secs, "s", k);
        emit(b, "restart_peak_mib", mib(restart_peak), "MiB", k);
        emit(b, "restart_peak_ratio", peak_ratio, "x", k);
        emit(b, "restart_rss_mib", mib(restart_rss), "MiB", k);
        emit(b, "restart_kib_per_sandbox", per_sbx(restart_rss), "KiB", k);
        emit(b, "restart_writes", restart_writes as f64, "writes", k);
        let sw = restart_sandbox_writes as f64;
        emit(b, "restart_sandbox_writes", sw, "writes", k);
    }
    emit(b, "limit_mib", limit_mib as f64, "MiB", u64::from(enforced));
    emit(b, "chart_pod", f64::from(u8::from(chart)), "", 1);
    if cg_rest > 0 {
        emit(b, "rest_cgroup_ws_mib", mib(cg_rest), "MiB", n64);
        if !after.is_empty() {
            let k = after.len() as u64;
            emit(b, "restart_cgroup_ws_mib", mib(restart_cg_ws), "MiB", k);
            emit(b, "restart_cgroup_peak_mib", mib(restart_cg_peak), "MiB", k);
        }
    }
    emit(b, "delete_all_secs", delete_time.as_secs_f64(), "s", n64);
    emit(
        b,
        "delete_rounds",
        f64::from(delete_rounds),
        "requests",
        n64,
    );
    emit(b, "deleted_rss_mib", mib(rss_deleted), "MiB", n64);

    // The limit, where no cgroup enforced it: the peak must have stayed under it.
    let peak_all = restart_peak.max(peak_first);
    if !enforced && peak_all > limit_mib << 10 {
        return Err(format!(
            "the operator's peak RSS {:.1} MiB is over the {limit_mib} MiB limit",
            mib(peak_all)
        )
        .into());
    }
    Ok(())
}
