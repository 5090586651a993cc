//! Shared by the benches: the repository root, the machine-readable results `hack/bench`
//! assembles its table from, an operator process stopped by PID, and the API server's audit log.
#![allow(dead_code)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agentbox_api::crd::{Sandbox, SandboxPhase};
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};

/// The operator's leader-election Lease (its default name) and its User-Agent, by which the
/// audit log tells its writes from the bench's (both use the same kubeconfig).
pub const LEADER_LEASE: &str = "agentbox-operator-leader";
pub const OPERATOR_UA: &str = agentbox_api::kubeclient::OPERATOR_USER_AGENT;

/// The repository root, read at run time: the bench binaries may be cached in a target
/// directory shared by several clones, so the compile-time path can name a clone that is gone.
pub fn repo_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// An unsigned number from the environment, else `default`.
pub fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The runtime class a bench runs its pods and sandboxes under (`BENCH_RUNTIME_CLASS`, e.g.
/// `gvisor`: hack/bench's gVisor rows); `None`: the node's default runtime (runc).
pub fn runtime_class() -> Option<String> {
    std::env::var("BENCH_RUNTIME_CLASS")
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// The name a bench records its figures under: `bench`, or `bench_<class>` under
/// [`runtime_class`] (the report sets the two side by side).
pub fn bench_name(bench: &str) -> String {
    match runtime_class() {
        Some(rc) => format!("{bench}_{rc}"),
        None => bench.to_string(),
    }
}

/// Records one figure as a JSON line in the file `$BENCH_RESULTS` (appended; nothing when
/// unset): `{"bench", "key", "value", "unit", "n"}`. `hack/bench` builds its table from these
/// lines only, never from the human-readable output.
pub fn emit(bench: &str, key: &str, value: f64, unit: &str, n: u64) {
    let Some(path) = std::env::var_os("BENCH_RESULTS") else {
        return;
    };
    let line = serde_json::json!({
        "bench": bench, "key": key, "value": value, "unit": unit, "n": n,
    });
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| writeln!(f, "{line}"));
    if let Err(e) = written {
        eprintln!("BENCH_RESULTS {}: {e}", PathBuf::from(path).display());
    }
}

/// The machine's CPU time so far from `/proc/stat`: (idle, all), in clock ticks.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|t| t.parse().ok())
        .collect();
    let idle = ticks.get(3)? + ticks.get(4).copied().unwrap_or(0);
    Some((idle, ticks.iter().sum()))
}

/// Waits until the machine is quiet (the CPUs at least `BENCH_QUIET_IDLE` percent idle, 80
/// by default, over 200 ms; 0 turns the wait off), for at most 5 s; returns how long it
/// waited. A claim bench starts each claim on a quiet machine: the cluster runs on these two
/// cores, and the last claim's teardown or a pool's refill (the kubelet, the container
/// runtime, the other side's controller) would otherwise share them with it.
pub async fn quiet() -> Duration {
    const SPAN: Duration = Duration::from_millis(200);
    const MOST: Duration = Duration::from_secs(5);
    let want = env_num("BENCH_QUIET_IDLE", 80) as f64 / 100.0;
    let started = Instant::now();
    if want <= 0.0 {
        return Duration::ZERO;
    }
    let Some(mut before) = cpu_ticks() else {
        return Duration::ZERO;
    };
    while started.elapsed() < MOST {
        tokio::time::sleep(SPAN).await;
        let Some(now) = cpu_ticks() else {
            break;
        };
        let (idle, all) = (now.0 - before.0, now.1 - before.1);
        if all > 0 && idle as f64 / all as f64 >= want {
            break;
        }
        before = now;
    }
    started.elapsed()
}

/// (p50, p95) of the samples, nearest rank.
pub fn p50_p95(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let pick = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    (pick(0.5), pick(0.95))
}

/// The operator (this build's binary), stopped by its PID (SIGTERM, then SIGKILL after 5 s)
/// when dropped.
pub struct Operator(pub Child);

impl Operator {
    /// A command for this build's operator binary (`$BENCH_OPERATOR_BIN` names another: an
    /// earlier commit's, to compare two builds in one session, on the same cluster), with the
    /// helper image `hack/helper-image` imports (`$AGENTBOX_HELPER_IMAGE` overrides it):
    /// without one, deleted sandboxes would keep their workspaces and never go.
    pub fn command() -> Command {
        let helper = std::env::var("AGENTBOX_HELPER_IMAGE")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "docker.io/agentbox/helper:dev".into());
        let bin = std::env::var("BENCH_OPERATOR_BIN")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_agentbox-operator").into());
        let mut cmd = Command::new(bin);
        cmd.args(["--helper-image", &helper]);
        cmd
    }

    /// Spawns `cmd` with its output into the file `log`.
    pub fn start(cmd: &mut Command, log: &Path) -> std::io::Result<Operator> {
        let log = std::fs::File::create(log)?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        Ok(Operator(child))
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        for _ in 0..50 {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Deletes the bench's namespace when dropped, also on an error (needs the multi-threaded
/// runtime, still alive while `main`'s future drops its locals).
pub struct Cleanup(pub kube::Client, pub String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let nss: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(self.0.clone());
        let name = self.1.clone();
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async move {
                let _ = nss.delete(&name, &Default::default()).await;
            })
        });
    }
}

/// Deletes the namespace's SandboxSnapshots, SandboxPools and Sandboxes when dropped, waits (up
/// to 2 min each) until they are gone and then ([`swept`]) until the operator's sweep has
/// removed their workspace directories from the node. Declared after the operator, it
/// drops first, also after a failure: the finalizers and the sweep need the operator, a failed
/// run must not leave its namespace stuck Terminating, and a directory whose operator stopped
/// first would stay on the node.
pub struct DeleteAll {
    client: kube::Client,
    ns: String,
}

impl DeleteAll {
    /// For namespace `ns`.
    pub fn of(client: &kube::Client, ns: &str) -> DeleteAll {
        DeleteAll {
            client: client.clone(),
            ns: ns.to_string(),
        }
    }
}

impl Drop for DeleteAll {
    fn drop(&mut self) {
        let pools: kube::Api<agentbox_api::crd::SandboxPool> =
            kube::Api::namespaced(self.client.clone(), &self.ns);
        let sbxs: kube::Api<agentbox_api::crd::Sandbox> =
            kube::Api::namespaced(self.client.clone(), &self.ns);
        let snaps: kube::Api<agentbox_api::crd::SandboxSnapshot> =
            kube::Api::namespaced(self.client.clone(), &self.ns);
        let ns = self.ns.clone();
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async move {
                let lp = kube::api::ListParams::default();
                // Snapshots first: their finalizer removes the stored object, and one left
                // with it holds the namespace Terminating once the operator has stopped.
                let _ = snaps.delete_collection(&Default::default(), &lp).await;
                for _ in 0..240 {
                    match snaps.list_metadata(&lp).await {
                        Ok(s) if !s.items.is_empty() => {
                            tokio::time::sleep(Duration::from_millis(500)).await
                        }
                        _ => break,
                    }
                }
                let _ = pools.delete_collection(&Default::default(), &lp).await;
                let _ = sbxs.delete_collection(&Default::default(), &lp).await;
                for _ in 0..240 {
                    let (p, s) = (
                        pools.list_metadata(&lp).await,
                        sbxs.list_metadata(&lp).await,
                    );
                    match (p, s) {
                        (Ok(p), Ok(s)) if !p.items.is_empty() || !s.items.is_empty() => {
                            tokio::time::sleep(Duration::from_millis(500)).await
                        }
                        _ => break,
                    }
                }
                swept(&ns).await;
            })
        });
    }
}

/// Waits (up to 3 min) until the operator's sweep has removed the workspace directories of
/// namespace `ns` from the node (the bench runs on the node): the sandboxes are gone, and a
/// directory whose operator stopped first would stay behind.
pub async fn swept(ns: &str) {
    let ns_dir = format!("{}/{ns}", agentbox_operator::config::DEFAULT_NODE_ROOT);
    // Three minutes: twenty pods deleted at once stop slowly on two cores, and the sweep
    // tries again on a backoff (one minute left 19 of 20 behind once).
    for _ in 0..360 {
        if workspace_dirs(&ns_dir) == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("workspace directories still in {ns_dir} after three minutes");
}

/// How many entries of `ns_dir` are named like a workspace (none when it does not exist).
fn workspace_dirs(ns_dir: &str) -> usize {
    std::fs::read_dir(ns_dir)
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .is_some_and(agentbox_operator::controller::sweep::is_sweepable)
                })
                .count()
        })
        .unwrap_or(0)
}

/// Creates the namespace `<prefix>-<pid>`, deleted when the returned guard drops.
pub async fn namespace(client: &kube::Client, prefix: &str) -> Result<Cleanup, kube::Error> {
    let name = format!("{prefix}-{}", std::process::id());
    let nss: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
    let mut obj = k8s_openapi::api::core::v1::Namespace::default();
    obj.metadata.name = Some(name.clone());
    nss.create(&Default::default(), &obj).await?;
    Ok(Cleanup(client.clone(), name))
}

/// The namespace `<prefix>-<pid>` and this build's operator watching it alone (identity
/// `bench`, metrics on a free port, warnings only, its log in the temp directory), started once
/// the namespace's default ServiceAccount had a moment to appear. Bound in this order
/// (`let (ns, _op) = ...`), the operator stops before the namespace is deleted.
pub async fn namespace_with_operator(
    client: &kube::Client,
    prefix: &str,
) -> Result<(Cleanup, Operator), Box<dyn std::error::Error>> {
    namespace_with_operator_args(client, prefix, |_| Vec::new()).await
}

/// [`namespace_with_operator`], the operator also given `extra(namespace)`'s arguments.
pub async fn namespace_with_operator_args(
    client: &kube::Client,
    prefix: &str,
    extra: impl FnOnce(&str) -> Vec<String>,
) -> Result<(Cleanup, Operator), Box<dyn std::error::Error>> {
    let cleanup = namespace(client, prefix).await?;
    let ns = cleanup.1.clone();
    tokio::time::sleep(Duration::from_secs(1)).await; // default ServiceAccount
    let op = Operator::start(
        Operator::command()
            .args([
                "--namespace",
                &ns,
                "--metrics-addr",
                "127.0.0.1:0",
                "--identity",
                "bench",
            ])
            .args(extra(&ns))
            .env("RUST_LOG", operator_log_level()),
        &std::env::temp_dir().join(format!("{ns}-operator.log")),
    )?;
    Ok((cleanup, op))
}

/// The operator's `RUST_LOG`: warnings only, unless `BENCH_OPERATOR_LOG` says otherwise (a
/// profile: `BENCH_OPERATOR_LOG=agentbox=debug,kube_client=debug`; the log is in the temp
/// directory, named for the namespace).
pub fn operator_log_level() -> String {
    std::env::var("BENCH_OPERATOR_LOG").unwrap_or_else(|_| "warn".into())
}

/// The API server's audit log (`hack/cluster env` sets `AGENTBOX_AUDIT_LOG`).
pub fn audit_log() -> Result<String, &'static str> {
    std::env::var("AGENTBOX_AUDIT_LOG")
        .map_err(|_| "AGENTBOX_AUDIT_LOG unset: eval \"$(hack/cluster env)\"")
}

/// An audit record of a write (the local cluster's policy logs writes only).
pub struct Write {
    pub at: Timestamp,
    pub user: String,
    pub user_agent: String,
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

impl Write {
    /// `verb resource[/subresource]`.
    pub fn kind(&self) -> String {
        if self.subresource.is_empty() {
            format!("{} {}", self.verb, self.resource)
        } else {
            format!("{} {}/{}", self.verb, self.resource, self.subresource)
        }
    }
}

/// The writes in the audit log at `path` in namespace `ns`.
pub fn read_audit(path: &str, ns: &str) -> Vec<Write> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter(|l| l.contains(ns)) // cheap pre-filter: the log holds every namespace
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            let s = |p: &str| {
                v.pointer(p)
                    .and_then(|x| x.as_str())
                    .unwrap_or_default()
                    .to_string()
            };
            Some(Write {
                at: s("/requestReceivedTimestamp").parse().ok()?,
                user: s("/user/username"),
                user_agent: s("/userAgent"),
                verb: s("/verb"),
                resource: s("/objectRef/resource"),
                subresource: s("/objectRef/subresource"),
                namespace: s("/objectRef/namespace"),
                name: s("/objectRef/name"),
            })
        })
        .filter(|w| w.namespace == ns)
        .collect()
}

/// `/proc/<pid>/status` field in KiB (`VmRSS:`, `VmHWM:`), 0 when unreadable.
pub fn proc_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Runs a Python bench script (`$PYTHON`, else `python3`) from `benches/` with `args`, and
/// returns the samples (ms) under each of `fields` of the JSON line it prints.
pub fn python_samples(
    script: &str,
    args: &[&str],
    fields: &[&str],
) -> Result<Vec<Vec<Duration>>, String> {
    let out = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
        .arg(repo_root().join("benches").join(script))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("").to_string();
        return Err(format!("python: {last}"));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(fields
        .iter()
        .map(|f| {
            v[*f]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(serde_json::Value::as_f64)
                        .map(|ms| Duration::from_secs_f64(ms / 1e3))
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect())
}

/// Starts this build's operator for namespace `ns` as `identity` (leader election on, as
/// deployed; warnings only, into `$TMPDIR/<ns>-operator.log`) and returns once it leads: its
/// caches are syncing by then, so a bench's clock starts on a working operator.
pub async fn leading_operator(
    client: &kube::Client,
    ns: &str,
    identity: &str,
) -> Result<(Operator, PathBuf), Box<dyn std::error::Error>> {
    let log = std::env::temp_dir().join(format!("{ns}-operator.log"));
    let op = Operator::start(
        Operator::command()
            .args(["--namespace", ns, "--metrics-addr", "127.0.0.1:0"])
            .args(["--identity", identity])
            .env("RUST_LOG", "warn"),
        &log,
    )?;
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(client.clone(), ns);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let holder = leases
            .get_opt(LEADER_LEASE)
            .await?
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity);
        if holder.as_deref() == Some(identity) {
            return Ok((op, log));
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("the operator did not lead within 60 s; see {log:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One claim as the client saw it.
pub struct Seen {
    /// Create call → Ready on the watch (ms).
    pub ready: f64,
    /// Create call → its response (ms).
    pub created: f64,
    /// The pod the status names.
    pub pod: String,
}

/// Creates `sbx` and times it to its Ready on a watch opened before it. The client is warm
/// as a harness's long-lived one is: the watch holds one connection, and a read just before
/// the create leaves another idle for it (else each create would pay a TLS handshake to the
/// API server, which the `created` column shows when it happens).
pub async fn create_until_ready(
    api: &Api<Sandbox>,
    sbx: &Sandbox,
) -> Result<Seen, Box<dyn std::error::Error>> {
    let name = sbx.name_any();
    let wp = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(120);
    let mut stream = api.watch(&wp, "0").await?.boxed();
    api.get_opt(&name).await?;
    let t = Instant::now();
    api.create(&PostParams::default(), sbx).await?;
    let created = t.elapsed().as_secs_f64() * 1000.0;
    while let Some(ev) = stream.next().await {
        match ev? {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                let st = o.status.clone().unwrap_or_default();
                if st.phase == Some(SandboxPhase::Ready) {
                    let ready = t.elapsed().as_secs_f64() * 1000.0;
                    let pod = st.pod_name.unwrap_or_default();
                    return Ok(Seen {
                        ready,
                        created,
                        pod,
                    });
                }
            }
            WatchEvent::Error(e) => return Err(format!("watch: {e:?}").into()),
            _ => {}
        }
    }
    Err(format!("{name}: watch ended before Ready").into())
}

/// Deletes the named object and returns the milliseconds from the delete call to its
/// `Deleted` event on a watch opened (at the object's current version) before the call.
pub async fn delete_until_gone<K>(
    api: &Api<K>,
    name: &str,
) -> Result<f64, Box<dyn std::error::Error>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let rv = api
        .get(name)
        .await?
        .meta()
        .resource_version
        .clone()
        .unwrap_or_default();
    let wp = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(120);
    let mut stream = api.watch(&wp, &rv).await?.boxed();
    let t = Instant::now();
    api.delete(name, &kube::api::DeleteParams::default())
        .await?;
    while let Some(ev) = stream.next().await {
        match ev? {
            WatchEvent::Deleted(_) => return Ok(t.elapsed().as_secs_f64() * 1000.0),
            WatchEvent::Error(e) => return Err(format!("watch: {e:?}").into()),
            _ => {}
        }
    }
    Err(format!("{name}: watch ended before it was deleted").into())
}
