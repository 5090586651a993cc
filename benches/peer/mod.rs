//! The peer beside agentbox's claim (issue 32): kubernetes-sigs/agent-sandbox's warm-pool claim,
//! measured in the claim bench's own run. Given its built controller (`hack/agent-sandbox
//! build`), this installs its CRDs (conversion `None`: its conversion webhook needs an
//! in-cluster Service, and only the stored version is used here), starts the controller out of
//! cluster as a child process, makes a SandboxTemplate of the agentbox warm pod's shape and a
//! SandboxWarmPool of the same size in a namespace of its own, and times one SandboxClaim at a
//! time as the agentbox claim is timed. Everything it made goes when it drops: its objects (with
//! the controller still running, for their finalizers), the controller (by PID), the namespace,
//! and the CRDs it installed (not ones that were there before).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::common::{self, Operator};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The variable naming the controller binary.
pub const VAR: &str = "BENCH_PEER_AGENT_SANDBOX";
/// The variable naming its CRD directory (default: `crds/` beside the binary's `bin/`, as
/// `hack/agent-sandbox build` lays them out).
pub const CRDS_VAR: &str = "BENCH_PEER_AGENT_SANDBOX_CRDS";
/// The controller's User-Agent prefix (controller-runtime's default: the binary's name), by
/// which the audit log tells its writes from the bench's.
const PEER_UA: &str = "agent-sandbox-controller";
/// The warm pool's name: its sandboxes are named `bench-<random>`, a claim served cold gets
/// the claim's name.
const POOL: &str = "bench";

/// Where the peer is: its controller binary and CRD directory.
pub struct Config {
    pub bin: PathBuf,
    pub crds: PathBuf,
}

/// The peer's configuration from the environment: `Err` says why the column is skipped.
pub fn config() -> Result<Config, String> {
    let bin = std::env::var(VAR)
        .ok()
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| format!("{VAR} unset"))?;
    let bin = PathBuf::from(bin);
    if !bin.is_file() {
        return Err(format!("{VAR}={}: no such file", bin.display()));
    }
    let crds = match std::env::var(CRDS_VAR)
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        Some(d) => PathBuf::from(d),
        None => bin
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join("crds"))
            .unwrap_or_default(),
    };
    if !crds.is_dir() {
        return Err(format!(
            "no CRD directory {} (set {CRDS_VAR})",
            crds.display()
        ));
    }
    Ok(Config { bin, crds })
}

fn resource(group: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, "v1beta1", kind), plural)
}

/// One claim's audit window: (claim, sandbox, pod, from, to).
type Window = (String, String, String, Timestamp, Timestamp);

/// The running peer and what its claims measured.
pub struct Peer {
    client: Client,
    pub ns: String,
    controller: Option<Operator>,
    log: PathBuf,
    /// CRDs this run installed (removed at the end).
    installed: Vec<String>,
    size: usize,
    claims: Api<DynamicObject>,
    sandboxes: Api<DynamicObject>,
    pods: Api<Pod>,
    pub ready: Vec<f64>,
    pub created: Vec<f64>,
    pub warm: usize,
    windows: Vec<Window>,
}

/// The peer's SandboxTemplate pod: the agentbox warm pod's sandbox container (image, pull
/// policy, command, arguments, resources, security context) and its pod-level runtime class,
/// service-account token, grace period and security context. Its workspace mount and working
/// directory are agentbox's own and stay out.
pub fn pod_template(warm: &Pod) -> Res<Value> {
    let spec = warm.spec.as_ref().ok_or("warm pod without a spec")?;
    let c = spec
        .containers
        .iter()
        .find(|c| c.name == agentbox_operator::controller::pod::CONTAINER)
        .ok_or("warm pod without its sandbox container")?;
    let mut container = json!({"name": "sandbox", "image": c.image, "command": c.command});
    for (k, v) in [
        (
            "imagePullPolicy",
            serde_json::to_value(&c.image_pull_policy)?,
        ),
        ("args", serde_json::to_value(&c.args)?),
        ("resources", serde_json::to_value(&c.resources)?),
        (
            "securityContext",
            serde_json::to_value(&c.security_context)?,
        ),
    ] {
        if !v.is_null() {
            container[k] = v;
        }
    }
    let mut pod = json!({"containers": [container]});
    for (k, v) in [
        (
            "runtimeClassName",
            serde_json::to_value(&spec.runtime_class_name)?,
        ),
        (
            "automountServiceAccountToken",
            serde_json::to_value(spec.automount_service_account_token)?,
        ),
        (
            "terminationGracePeriodSeconds",
            serde_json::to_value(spec.termination_grace_period_seconds)?,
        ),
        (
            "securityContext",
            serde_json::to_value(&spec.security_context)?,
        ),
    ] {
        if !v.is_null() {
            pod[k] = v;
        }
    }
    Ok(json!({"spec": pod}))
}

/// Whether `o`'s status has the condition `Ready` true.
fn is_ready(o: &DynamicObject) -> bool {
    o.data["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

impl Peer {
    /// Installs the CRDs, starts the controller and fills a warm pool of `size` sandboxes of
    /// `pod` (see [`pod_template`]) in the namespace `bench-claim-peer-<pid>`.
    pub async fn start(client: &Client, cfg: &Config, pod: Value, size: usize) -> Res<Peer> {
        let ns = format!("bench-claim-peer-{}", std::process::id());
        let log = std::env::temp_dir().join(format!("{ns}-agent-sandbox.log"));
        let mut peer = Peer {
            client: client.clone(),
            ns: ns.clone(),
            controller: None,
            log: log.clone(),
            installed: Vec::new(),
            size,
            claims: Api::namespaced_with(
                client.clone(),
                &ns,
                &resource(
                    "extensions.agents.x-k8s.io",
                    "SandboxClaim",
                    "sandboxclaims",
                ),
            ),
            sandboxes: Api::namespaced_with(
                client.clone(),
                &ns,
                &resource("agents.x-k8s.io", "Sandbox", "sandboxes"),
            ),
            pods: Api::namespaced(client.clone(), &ns),
            ready: Vec::new(),
            created: Vec::new(),
            warm: 0,
            windows: Vec::new(),
        };
        // From here on a failure still tears down what was made (Drop).
        peer.install_crds(&cfg.crds).await?;
        let nss: Api<Namespace> = Api::all(client.clone());
        let mut obj = Namespace::default();
        obj.metadata.name = Some(ns.clone());
        nss.create(&PostParams::default(), &obj).await?;
        // Out of cluster: no webhook (the CRDs convert nothing), no leader election (one
        // replica), no metrics or probe ports (another bench may hold 8080).
        peer.controller = Some(Operator::start(
            std::process::Command::new(&cfg.bin).args([
                "--extensions",
                "--enable-webhook=false",
                "--manage-webhook-certs=false",
                "--leader-elect=false",
                "--metrics-bind-address=0",
                "--health-probe-bind-address=0",
            ]),
            &log,
        )?);
        let tpl: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxTemplate",
            "metadata": {"name": "tpl"}, "spec": {"podTemplate": pod},
        }))?;
        let tr = resource(
            "extensions.agents.x-k8s.io",
            "SandboxTemplate",
            "sandboxtemplates",
        );
        Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &tr)
            .create(&PostParams::default(), &tpl)
            .await?;
        let pool: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxWarmPool",
            "metadata": {"name": POOL},
            "spec": {"replicas": size, "sandboxTemplateRef": {"name": "tpl"}},
        }))?;
        let pr = resource(
            "extensions.agents.x-k8s.io",
            "SandboxWarmPool",
            "sandboxwarmpools",
        );
        Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &pr)
            .create(&PostParams::default(), &pool)
            .await?;
        let t = Instant::now();
        peer.pool_full(Duration::from_secs(300)).await?;
        println!(
            "agent-sandbox: warm pool of {size} ready in {:.1} s (controller log {})",
            t.elapsed().as_secs_f64(),
            log.display()
        );
        Ok(peer)
    }

    /// Applies each CRD of `dir` with conversion `None`, then waits until all are established.
    async fn install_crds(&mut self, dir: &Path) -> Res<()> {
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        files.sort();
        let mut names = Vec::new();
        for f in files {
            let mut crd: Value = serde_yaml::from_str(&std::fs::read_to_string(&f)?)?;
            if crd["kind"] != "CustomResourceDefinition" {
                continue;
            }
            crd["spec"]["conversion"] = json!({"strategy": "None"});
            let name = crd["metadata"]["name"]
                .as_str()
                .ok_or_else(|| format!("{}: no name", f.display()))?
                .to_string();
            if crds.get_opt(&name).await?.is_none() {
                self.installed.push(name.clone());
            }
            crds.patch(
                &name,
                &PatchParams::apply("agentbox-bench-peer").force(),
                &Patch::Apply(&crd),
            )
            .await?;
            names.push(name);
        }
        if names.is_empty() {
            return Err(format!("no CRDs in {}", dir.display()).into());
        }
        let t = Instant::now();
        for name in &names {
            loop {
                let established = crds
                    .get(name)
                    .await?
                    .status
                    .and_then(|s| s.conditions)
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    });
                if established {
                    break;
                }
                if t.elapsed() > Duration::from_secs(60) {
                    return Err(format!("CRD {name} not established after 60 s").into());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(())
    }

    /// Waits until the pool has `size` Ready sandboxes of its own (not terminating); fails if
    /// the controller exited.
    pub async fn pool_full(&mut self, limit: Duration) -> Res<()> {
        let t = Instant::now();
        loop {
            let ready = self
                .sandboxes
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .filter(|s| s.metadata.deletion_timestamp.is_none())
                .filter(|s| {
                    s.owner_references()
                        .iter()
                        .any(|o| o.controller == Some(true) && o.kind == "SandboxWarmPool")
                })
                .filter(|s| is_ready(s))
                .count();
            if ready >= self.size {
                return Ok(());
            }
            if let Some(Operator(child)) = self.controller.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "the agent-sandbox controller exited ({status}); see {}",
                    self.log.display()
                )
                .into());
            }
            if t.elapsed() > limit {
                return Err(format!(
                    "agent-sandbox pool: {ready} of {} ready after {} s; see {}",
                    self.size,
                    limit.as_secs(),
                    self.log.display()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Claim `i`: the pool refilled to full, then a SandboxClaim timed from its create call to
    /// its Ready condition on a watch opened before the create (the client warmed as
    /// `common::create_until_ready` does), a second for its writes to land (the audit window),
    /// then the claim and its sandbox deleted and their pod gone before the next claim.
    pub async fn claim(&mut self, i: usize) -> Res<()> {
        self.pool_full(Duration::from_secs(120)).await?;
        let name = format!("p-{i}");
        let claim: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
            "metadata": {"name": name}, "spec": {"warmPoolRef": {"name": POOL}},
        }))?;
        let start = Timestamp::now();
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(120);
        let mut stream = self.claims.watch(&wp, "0").await?.boxed();
        self.claims.get_opt(&name).await?;
        common::quiet().await;
        let t = Instant::now();
        self.claims.create(&PostParams::default(), &claim).await?;
        let created = t.elapsed().as_secs_f64() * 1000.0;
        let mut seen = None;
        while let Some(ev) = stream.next().await {
            match ev? {
                WatchEvent::Added(o) | WatchEvent::Modified(o) if is_ready(&o) => {
                    let took = t.elapsed().as_secs_f64() * 1000.0;
                    let sandbox = o.data["status"]["sandbox"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string();
                    seen = Some((took, sandbox));
                    break;
                }
                WatchEvent::Error(e) => return Err(format!("watch: {e:?}").into()),
                _ => {}
            }
        }
        drop(stream);
        let (took, mut sandbox) =
            seen.ok_or_else(|| format!("{name}: watch ended before Ready"))?;
        if sandbox.is_empty() {
            // The status names it; read again if the Ready event came first.
            let o = self.claims.get(&name).await?;
            sandbox = o.data["status"]["sandbox"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
        }
        if sandbox.starts_with(&format!("{POOL}-")) {
            self.warm += 1;
        }
        self.ready.push(took);
        self.created.push(created);
        // The sandbox's pod: its pod-name annotation, else the sandbox's name.
        let pod = match self.sandboxes.get_opt(&sandbox).await? {
            Some(s) => s
                .annotations()
                .get("agents.x-k8s.io/pod-name")
                .cloned()
                .unwrap_or_else(|| sandbox.clone()),
            None => sandbox.clone(),
        };
        tokio::time::sleep(Duration::from_millis(1000)).await;
        self.windows.push((
            name.clone(),
            sandbox.clone(),
            pod.clone(),
            start,
            Timestamp::now(),
        ));
        delete_ignoring_missing(&self.claims, &name).await?;
        if !sandbox.is_empty() {
            delete_ignoring_missing(&self.sandboxes, &sandbox).await?;
        }
        // All three gone, so that no write of this claim's teardown lands in the next window.
        gone(&self.claims, &name).await?;
        if !sandbox.is_empty() {
            gone(&self.sandboxes, &sandbox).await?;
        }
        pod_gone(&self.pods, &pod).await
    }

    /// The peer's rows of the claim table: create → Ready and the create call, p50 / p95.
    pub fn rows(&self) -> Vec<String> {
        if self.ready.is_empty() {
            return Vec::new();
        }
        let (p50, p95) = common::p50_p95(self.ready.clone());
        let (c50, c95) = common::p50_p95(self.created.clone());
        vec![
            format!(
                "| agent-sandbox: SandboxClaim create → Ready on a watch, warm pool of {} ({} of {} warm; same run, interleaved) (ms) | {p50:.1} | {p95:.1} |",
                self.size,
                self.warm,
                self.ready.len()
            ),
            format!("| agent-sandbox: create call → its response (ms) | {c50:.1} | {c95:.1} |"),
        ]
    }

    /// Prints the peer's write counts and emits its figures under `bench`: create → Ready p50/p95
    /// (`claim_peer_ready_*`), the create call, and from the audit log `audit` the writes its
    /// controller made in each claim's window (the claim, the sandbox, its pod, Events and the
    /// pool's refill alike: `claim_peer_writes_*`).
    pub fn report(&self, audit: &str, bench: &str) {
        let n = self.ready.len();
        if n == 0 {
            return;
        }
        let writes = common::read_audit(audit, &self.ns);
        let mut per_claim = Vec::new();
        let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
        for (i, (_, _, _, from, to)) in self.windows.iter().enumerate() {
            let ours: Vec<&common::Write> = writes
                .iter()
                .filter(|w| w.at >= *from && w.at < *to)
                .filter(|w| w.user_agent.starts_with(PEER_UA))
                .collect();
            if i == 0 {
                for w in &ours {
                    *kinds.entry(w.kind()).or_default() += 1;
                }
            }
            per_claim.push(ours.len() as f64);
        }
        let (p50, p95) = common::p50_p95(self.ready.clone());
        let warm = self.warm;
        println!(
            "agent-sandbox controller writes per claim window (claim, sandbox, pod, Events, refill): {per_claim:?}"
        );
        println!("agent-sandbox first claim's writes: {kinds:?}");
        let n64 = n as u64;
        common::emit(bench, "claim_peer_ready_p50_ms", p50, "ms", n64);
        common::emit(bench, "claim_peer_ready_p95_ms", p95, "ms", n64);
        common::emit(bench, "claim_peer_warm_starts", warm as f64, "starts", n64);
        if writes.is_empty() {
            println!(
                "agent-sandbox: no writes in the audit log for {} (no write counts)",
                self.ns
            );
            return;
        }
        let (w50, _) = common::p50_p95(per_claim.clone());
        let wmax = per_claim.iter().copied().fold(0.0, f64::max);
        common::emit(bench, "claim_peer_writes_p50", w50, "writes", n64);
        common::emit(bench, "claim_peer_writes_max", wmax, "writes", n64);
    }
}

/// Deletes `name`; gone already is fine.
async fn delete_ignoring_missing(api: &Api<DynamicObject>, name: &str) -> Res<()> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Waits (up to 2 min) until the pod `name` is gone.
pub async fn pod_gone(pods: &Api<Pod>, name: &str) -> Res<()> {
    gone(pods, name).await
}

/// Waits (up to 2 min) until the object `name` is gone.
async fn gone<K>(api: &Api<K>, name: &str) -> Res<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let t = Instant::now();
    while api.get_opt(name).await?.is_some() {
        if t.elapsed() > Duration::from_secs(120) {
            return Err(format!("{name} still there after 120 s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

impl Drop for Peer {
    /// Objects first (the controller still running for their finalizers), then the controller,
    /// the namespace and the CRDs this run installed; each waited for, with limits, so that a
    /// run leaves nothing behind and a stuck step does not hang it.
    fn drop(&mut self) {
        let client = self.client.clone();
        let ns = self.ns.clone();
        let installed = std::mem::take(&mut self.installed);
        let controller = self.controller.take();
        let (claims, sandboxes) = (self.claims.clone(), self.sandboxes.clone());
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async move {
                let lp = ListParams::default();
                let dp = DeleteParams::default();
                if controller.is_some() {
                    let pools: Api<DynamicObject> = Api::namespaced_with(
                        client.clone(),
                        &ns,
                        &resource(
                            "extensions.agents.x-k8s.io",
                            "SandboxWarmPool",
                            "sandboxwarmpools",
                        ),
                    );
                    let _ = claims.delete_collection(&dp, &lp).await;
                    let _ = pools.delete_collection(&dp, &lp).await;
                    let _ = sandboxes.delete_collection(&dp, &lp).await;
                    for _ in 0..240 {
                        match sandboxes.list_metadata(&lp).await {
                            Ok(l) if !l.items.is_empty() => {
                                tokio::time::sleep(Duration::from_millis(500)).await
                            }
                            _ => break,
                        }
                    }
                }
                drop(controller); // SIGTERM by PID, SIGKILL after 5 s
                let nss: Api<Namespace> = Api::all(client.clone());
                let _ = nss.delete(&ns, &dp).await;
                let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
                for name in &installed {
                    let _ = crds.delete(name, &dp).await;
                }
                for _ in 0..120 {
                    let mut left = 0;
                    for name in &installed {
                        if let Ok(Some(_)) = crds.get_opt(name).await {
                            left += 1;
                        }
                    }
                    if left == 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            })
        });
    }
}
