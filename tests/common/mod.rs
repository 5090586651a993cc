//! Shared set-up of the integration tests: a temporary namespace on the real local cluster
//! (KUBECONFIG from `hack/cluster env`), and operator processes watching only that namespace.
//! Every process started here is stopped by its PID; the namespace and its sandboxes are
//! removed at the end, also when a test panics.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agentbox_api::crd::{Sandbox, SandboxPool, SandboxSnapshot, SnapshotPhase};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::wait::{Condition, await_condition};
use kube::{Client, ResourceExt};

/// The repository root, read at run time: the test binaries may be cached in a target
/// directory shared by several clones, so the compile-time path can name a clone that is gone.
pub fn repo_root() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The helm binary: `$HELM`, else the one `hack/cluster` caches, else `helm` on the PATH.
pub fn helm_bin() -> String {
    if let Ok(h) = std::env::var("HELM") {
        return h;
    }
    let cached = PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
        .join(".cache/agentbox/bin/helm");
    if cached.exists() {
        cached.to_string_lossy().into_owned()
    } else {
        "helm".into()
    }
}

/// The oldest Kubernetes the chart supports (Chart.yaml `kubeVersion`): what `helm template`
/// renders for without a cluster (helm's own default is older, and the chart refuses that).
pub const CHART_KUBE_VERSION: &str = "1.33.0";

/// `helm template rel charts/agentbox --kube-version <CHART_KUBE_VERSION> <args>` in the
/// repository: the rendered manifests, or helm's output when it fails.
pub fn helm_template(args: &[&str]) -> Result<String, String> {
    let out = Command::new(helm_bin())
        .args(["template", "rel", "charts/agentbox"])
        .args(["--kube-version", CHART_KUBE_VERSION])
        .args(args)
        .current_dir(repo_root())
        .output()
        .map_err(|e| format!("running helm: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The kubectl binary: `$KUBECTL` (set by `hack/cluster env`), else `kubectl` on the PATH.
pub fn kubectl_bin() -> String {
    std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into())
}

/// Runs kubectl with `args`, `stdin` on its standard input; returns (success, stdout, stderr).
pub fn kubectl(args: &[&str], stdin: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = Command::new(kubectl_bin())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child
        .stdin
        .take()
        .expect("kubectl stdin")
        .write_all(stdin.as_bytes())
        .expect("write kubectl stdin");
    let out = child.wait_with_output().expect("kubectl output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The sandbox base image the test cluster imports.
pub const BASE_IMAGE: &str = "docker.io/library/busybox:1.37";
/// Workspaces root the operator uses by default (the test operator runs on the node's host).
pub const NODE_ROOT: &str = agentbox_operator::config::DEFAULT_NODE_ROOT;

/// The trusted helper image the test operators run their node-side pods from:
/// `$AGENTBOX_HELPER_IMAGE`, else the one `hack/cluster up` (hack/helper-image) imports.
pub fn helper_image() -> String {
    std::env::var("AGENTBOX_HELPER_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "docker.io/agentbox/helper:dev".into())
}

/// A running operator process.
pub struct Operator {
    child: Child,
    /// Its leader-election identity.
    pub identity: String,
    /// Its metrics/health address.
    pub metrics_port: u16,
    /// Where it logs.
    pub log: PathBuf,
    /// Whether it has a helper image, so removes the workspaces of deleted sandboxes.
    pub sweeps: bool,
}

impl Operator {
    /// Stops it abruptly (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stops it gracefully (SIGTERM) and waits for it to exit.
    pub fn terminate(&mut self) {
        if !self.is_running() {
            return;
        }
        let pid = self.child.id().to_string();
        let _ = Command::new("kill")
            .args(["-TERM", &pid])
            .stderr(Stdio::null())
            .status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.kill();
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Fetches one of its HTTP endpoints (`/metrics`, `/readyz`).
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.metrics_port))
            .await
            .ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let code = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Some((code, body))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.terminate();
    }
}

/// The operator binary tests start: `$AGENTBOX_OPERATOR_BIN` when set (a copy taken right
/// after a build, on a machine where several checkouts share one target directory and so one
/// `target/debug/agentbox-operator`), else this package's.
pub fn operator_bin() -> PathBuf {
    std::env::var_os("AGENTBOX_OPERATOR_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_agentbox-operator")))
}

/// A temporary namespace and the operators started for it.
pub struct TestEnv {
    /// Client with the cluster's admin credentials.
    pub client: Client,
    /// The namespace's name.
    pub ns: String,
    /// Operators started so far.
    pub operators: Vec<Operator>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or(0)
}

/// A short random suffix for names.
pub fn suffix() -> String {
    use rand::Rng;
    let mut r = rand::rng();
    (0..6)
        .map(|_| char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[r.random_range(0..36)]))
        .collect()
}

/// The runtime class of hack/test's gVisor matrix (`AGENTBOX_TEST_RUNTIME_CLASS=gvisor`): every
/// test operator defaults sandboxes to it (`--default-runtime-class`) and every test namespace
/// requires it (`agentbox.dev/required-runtime-class`), so a sandbox that would run under
/// another runtime is refused instead of passing on runc. `None`: the node's default runtime.
pub fn matrix_runtime_class() -> Option<String> {
    std::env::var("AGENTBOX_TEST_RUNTIME_CLASS")
        .ok()
        .filter(|v| !v.trim().is_empty())
}

impl TestEnv {
    /// Creates namespace `<prefix>-<random>` (annotated with the matrix's required runtime
    /// class, see [`matrix_runtime_class`]).
    pub async fn new(prefix: &str) -> TestEnv {
        let client = Client::try_default()
            .await
            .expect("a cluster: run `eval \"$(hack/cluster env)\"` or use hack/test");
        // Once per test process: each apply of the four CRDs (~120 KB) is a server-side apply
        // the API server diffs in full, and a run makes about a hundred TestEnvs.
        static CRDS: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
        CRDS.get_or_init(|| ensure_crds(&client)).await;
        let ns = format!("{prefix}-{}", suffix());
        let nss: Api<Namespace> = Api::all(client.clone());
        let mut obj = Namespace::default();
        obj.metadata.name = Some(ns.clone());
        if let Some(rc) = matrix_runtime_class() {
            obj.metadata.annotations = Some(
                [("agentbox.dev/required-runtime-class".to_string(), rc)]
                    .into_iter()
                    .collect(),
            );
        }
        nss.create(&PostParams::default(), &obj)
            .await
            .expect("create namespace");
        // Pods need the namespace's default ServiceAccount, made by the controller-manager.
        let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(client.clone(), &ns);
        for _ in 0..100 {
            if sas.get_opt("default").await.ok().flatten().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        TestEnv {
            client,
            ns,
            operators: Vec::new(),
        }
    }

    /// Starts an operator process for this namespace with extra flags; returns its index.
    pub fn start_operator(&mut self, extra: &[&str]) -> usize {
        self.start_operator_env(extra, &[])
    }

    /// Starts an operator process with extra flags and environment variables (object-store
    /// credentials, for example); returns its index. It gets the test helper image unless
    /// `extra` names one (an empty `--helper-image` runs it without), and watches the test's
    /// namespace unless `extra` says `--namespace=...`.
    pub fn start_operator_env(&mut self, extra: &[&str], envs: &[(String, String)]) -> usize {
        let n = self.operators.len();
        let identity = format!("op-{}-{n}", self.ns);
        let port = free_port();
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("operator-logs");
        std::fs::create_dir_all(&dir).expect("log dir");
        let log = dir.join(format!("{}-{n}.log", self.ns));
        let file = std::fs::File::create(&log).expect("log file");
        let no_helper = extra.iter().enumerate().any(|(i, a)| {
            *a == "--helper-image=" || (*a == "--helper-image" && extra.get(i + 1) == Some(&""))
        });
        // `--namespace=` in `extra` (all namespaces) takes the place of the test's namespace.
        let watch = (!extra.iter().any(|a| a.starts_with("--namespace")))
            .then_some(["--namespace", self.ns.as_str()])
            .into_iter()
            .flatten();
        let child = Command::new(operator_bin())
            .args(watch)
            .args(["--identity", &identity])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            // Short, so a restarted operator takes over soon; not shorter, or a renewal slowed
            // by a loaded machine (hack/test runs binaries side by side) loses the leadership
            // and the operator exits with nobody to restart it.
            .args(["--lease-seconds", "10"])
            .args(
                (!extra.iter().any(|a| a.starts_with("--helper-image")))
                    .then(|| ["--helper-image".to_string(), helper_image()])
                    .into_iter()
                    .flatten(),
            )
            .args(
                matrix_runtime_class()
                    .filter(|_| {
                        !extra
                            .iter()
                            .any(|a| a.starts_with("--default-runtime-class"))
                    })
                    .map(|rc| ["--default-runtime-class".to_string(), rc])
                    .into_iter()
                    .flatten(),
            )
            .args(extra)
            .envs(envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info,agentbox=debug".into()),
            )
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .expect("start agentbox-operator");
        self.operators.push(Operator {
            child,
            identity,
            metrics_port: port,
            log,
            sweeps: !no_helper,
        });
        n
    }

    /// Typed API in the test namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        <K as kube::Resource>::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Waits until `cond` holds for the named object, or panics after `secs` with the last state.
    /// A broken watch (a loaded API server drops them) is opened again until the deadline.
    pub async fn wait_for<K>(
        &self,
        name: &str,
        secs: u64,
        cond: impl Condition<K> + Send + Sync + 'static,
    ) -> K
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
        <K as kube::Resource>::DynamicType: Default + Eq + std::hash::Hash + Clone + Send,
    {
        let api = self.api::<K>();
        let cond = std::sync::Arc::new(cond);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
        let mut watch_errors = Vec::new();
        let outcome = loop {
            let c = cond.clone();
            let waited = tokio::time::timeout_at(
                deadline,
                await_condition(api.clone(), name, move |o: Option<&K>| c.matches_object(o)),
            )
            .await;
            match waited {
                Ok(Ok(Some(obj))) => return obj,
                Ok(Err(e)) if tokio::time::Instant::now() < deadline => {
                    watch_errors.push(e.to_string());
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => break format!("{other:?}"),
            }
        };
        let last = api.get_opt(name).await.ok().flatten();
        panic!(
            "{name}: condition not met within {secs}s ({outcome}; watch errors: {watch_errors:?}); last state: {last:#?}\n{}",
            self.operator_logs()
        );
    }

    /// Waits until the named object is gone.
    pub async fn wait_gone<K>(&self, name: &str, secs: u64)
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug
            + Send
            + 'static,
        <K as kube::Resource>::DynamicType: Default + Eq + std::hash::Hash + Clone + Send,
    {
        let api = self.api::<K>();
        for _ in 0..secs * 10 {
            if api.get_opt(name).await.expect("get").is_none() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!(
            "{name} still exists after {secs}s\n{}",
            self.operator_logs()
        );
    }

    /// The value of counter `name` (a sample without labels, `agentbox_..._total`) on operator
    /// `op`'s metrics endpoint.
    pub async fn counter(&self, op: usize, name: &str) -> f64 {
        let (_, body) = self.operators[op]
            .get("/metrics")
            .await
            .expect("metrics answer");
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{body}"))
    }

    /// The tail of every operator log, for failure messages.
    pub fn operator_logs(&self) -> String {
        self.operators
            .iter()
            .map(|o| {
                let text = std::fs::read_to_string(&o.log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!(
                    "--- {} ({}) ---\n{}",
                    o.identity,
                    o.log.display(),
                    tail.join("\n")
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The pods of a sandbox (by label).
    pub async fn sandbox_pods(&self, sandbox: &str) -> Vec<Pod> {
        let lp =
            ListParams::default().labels(&format!("{}={}", agentbox_api::labels::SANDBOX, sandbox));
        self.api::<Pod>().list(&lp).await.expect("list pods").items
    }

    /// Deletes every Sandbox, waits for the operator to finish them, stops the operators, and
    /// deletes the namespace.
    pub async fn finish(mut self) {
        self.teardown().await;
    }

    async fn teardown(&mut self) {
        // Snapshots first, while the operators run (their finalizers remove stored objects),
        // then pools (their warm pods and directories), then Sandboxes (pods and workspace
        // directories).
        self.drain::<SandboxSnapshot>().await;
        self.drain::<SandboxPool>().await;
        self.drain::<Sandbox>().await;
        // The workspace directories of the deleted sandboxes go just after them (the
        // operator's sweep): wait for that while an operator that can remove them runs, so no
        // test leaves a directory on the node.
        if self
            .operators
            .iter_mut()
            .any(|o| o.sweeps && o.is_running())
        {
            let ns_dir = format!("{NODE_ROOT}/{}", self.ns);
            for _ in 0..600 {
                if workspace_names(&ns_dir).is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        for o in &mut self.operators {
            o.terminate();
        }
        // What the operators did not finish loses its finalizers: the namespace must go.
        self.drain::<SandboxSnapshot>().await;
        self.drain::<Sandbox>().await;
        let nss: Api<Namespace> = Api::all(self.client.clone());
        let _ = nss.delete(&self.ns, &DeleteParams::default()).await;
        self.ns.clear();
    }

    /// Deletes every object of kind `K` in the namespace and waits (up to a minute) until they
    /// are gone; once no operator runs any more, their finalizers are dropped.
    async fn drain<K>(&mut self)
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
        <K as kube::Resource>::DynamicType: Default,
    {
        let api = self.api::<K>();
        let _ = api
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await;
        for _ in 0..300 {
            match api.list(&ListParams::default()).await {
                Ok(l) if l.items.is_empty() => break,
                Ok(l) if self.operators.iter_mut().all(|o| !o.is_running()) => {
                    // Nobody is left to run the finalizers: drop them so the namespace can go.
                    for s in l.items {
                        let patch = serde_json::json!({"metadata": {"finalizers": null}});
                        let _ = api
                            .patch(
                                &s.name_any(),
                                &Default::default(),
                                &kube::api::Patch::Merge(&patch),
                            )
                            .await;
                    }
                }
                Err(_) => break,
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if self.ns.is_empty() {
            return;
        }
        // A panicking test: clean up on a fresh runtime in a plain thread (this drop may run
        // inside the test's runtime, where blocking on another future is not allowed). The
        // test's client has its connection task on the blocked runtime, so the teardown makes
        // a client of its own.
        let ns = std::mem::take(&mut self.ns);
        let operators = std::mem::take(&mut self.operators);
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(client) = Client::try_default().await else {
                    return;
                };
                let mut env = TestEnv {
                    client,
                    ns,
                    operators,
                };
                env.teardown().await;
            });
        })
        .join();
    }
}

/// Condition: the Sandbox's phase is `phase`.
pub fn phase_is(phase: &'static str) -> impl Condition<Sandbox> {
    move |s: Option<&Sandbox>| {
        s.and_then(|s| s.status.as_ref())
            .and_then(|st| st.phase)
            .is_some_and(|p| p.as_str() == phase)
    }
}

/// Condition: the SandboxSnapshot is Ready or Failed.
pub fn snapshot_finished(s: Option<&SandboxSnapshot>) -> bool {
    matches!(
        s.and_then(|s| s.status.as_ref()).and_then(|st| st.phase),
        Some(SnapshotPhase::Ready | SnapshotPhase::Failed)
    )
}

/// Creates SandboxSnapshot `name` of `sandbox` with `policy` (Delete or Retain) and waits
/// until it is Ready (panics with the operator's log when it fails).
pub async fn take_snapshot(
    env: &TestEnv,
    name: &str,
    sandbox: &str,
    policy: &str,
) -> SandboxSnapshot {
    let obj: SandboxSnapshot = serde_json::from_value(serde_json::json!({
        "apiVersion": "agentbox.dev/v1alpha1",
        "kind": "SandboxSnapshot",
        "metadata": {"name": name},
        "spec": {"sandboxRef": {"name": sandbox}, "deletionPolicy": policy},
    }))
    .expect("snapshot json");
    env.api::<SandboxSnapshot>()
        .create(&PostParams::default(), &obj)
        .await
        .expect("create snapshot");
    let s = env
        .wait_for::<SandboxSnapshot>(name, 900, snapshot_finished)
        .await;
    assert_eq!(
        s.status.as_ref().and_then(|st| st.phase),
        Some(SnapshotPhase::Ready),
        "{s:#?}\n{}",
        env.operator_logs()
    );
    s
}

/// Deletes every SandboxSnapshot of the namespace and waits until they are gone: call it
/// while the operator still runs, since their finalizers need it.
pub async fn delete_snapshots(env: &TestEnv) {
    let api = env.api::<SandboxSnapshot>();
    let _ = api
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    for _ in 0..300 {
        if api
            .list(&ListParams::default())
            .await
            .map(|l| l.items.is_empty())
            .unwrap_or(true)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates a Sandbox from JSON (name, spec) in the namespace.
pub async fn create_sandbox(
    env: &TestEnv,
    name: &str,
    spec: serde_json::Value,
) -> Result<Sandbox, kube::Error> {
    let obj: Sandbox = serde_json::from_value(serde_json::json!({
        "apiVersion": "agentbox.dev/v1alpha1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("sandbox json");
    env.api::<Sandbox>()
        .create(&PostParams::default(), &obj)
        .await
}

/// Runs a shell command in a sandbox pod and returns (exit code, stdout).
pub async fn sh(env: &TestEnv, pod: &str, script: &str) -> (Option<i32>, String) {
    let out = agentbox_api::exec::run(
        &env.api::<Pod>(),
        pod,
        "sandbox",
        agentbox_api::exec::ExecRequest::argv(["sh", "-c", script])
            .timeout(Duration::from_secs(60)),
    )
    .await
    .expect("exec");
    (out.status.code(), out.stdout_str())
}

/// Installs (server-side applies) the CRDs from the types and waits until they are served.
pub async fn ensure_crds(client: &Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::api::{Patch, PatchParams};
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in agentbox_api::crd::all() {
        let name = crd.name_any();
        crds.patch(
            &name,
            &PatchParams::apply("agentbox-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("apply CRD");
        let established = await_condition(
            crds.clone(),
            &name,
            kube::runtime::conditions::is_crd_established(),
        );
        tokio::time::timeout(Duration::from_secs(30), established)
            .await
            .expect("CRD established in time")
            .expect("watch CRD");
    }
}

/// Every path in the workspace (except .agentbox) with its type, mode and content digest or
/// link target.
pub const LISTING: &str = r#"cd /workspace && find . -path ./.agentbox -prune -o -print | sort | while IFS= read -r f; do
  [ "$f" = . ] && continue
  if [ -L "$f" ]; then echo "L $f $(readlink "$f")"
  elif [ -d "$f" ]; then echo "D $f $(stat -c %a "$f")"
  else echo "F $f $(stat -c %a "$f") $(sha256sum < "$f" | cut -d' ' -f1)"; fi
done"#;

pub async fn listing(env: &TestEnv, pod: &str) -> String {
    let out = agentbox_api::exec::run(
        &env.api::<Pod>(),
        pod,
        "sandbox",
        agentbox_api::exec::ExecRequest::shell(LISTING).timeout(Duration::from_secs(300)),
    )
    .await
    .expect("exec listing");
    assert!(out.success(), "listing failed: {}", out.stderr_str());
    out.stdout_str()
}

/// A raw ustar header (the tar crate refuses to write some of the hostile ones).
pub fn raw_header(path: &str, flag: u8, size: u64, link: &str) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..path.len()].copy_from_slice(path.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = flag;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// An archive of (path, type flag, data, link) members, padded and terminated.
pub fn raw(members: &[(&str, u8, &[u8], &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (path, flag, data, link) in members {
        out.extend_from_slice(&raw_header(path, *flag, data.len() as u64, link));
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// Makes a Ready SandboxSnapshot named `name` whose object in `store` is `bytes` and whose
/// recorded digest is `sha256` (forged as the test likes), as an administrator could: the
/// snapshot is created, the object put at its key, and the status patched.
pub async fn forge_snapshot(
    env: &TestEnv,
    store: &agentbox_operator::snapshot::store::Store,
    scope_key: &str,
    name: &str,
    bytes: &[u8],
    sha256: &str,
) -> agentbox_api::crd::SandboxSnapshot {
    use agentbox_api::crd::SandboxSnapshot;
    use kube::api::{Patch, PatchParams};
    use object_store::ObjectStoreExt;
    let api = env.api::<SandboxSnapshot>();
    let obj: SandboxSnapshot = serde_json::from_value(serde_json::json!({
        "apiVersion": "agentbox.dev/v1alpha1",
        "kind": "SandboxSnapshot",
        "metadata": {"name": name},
        "spec": {"sandboxRef": {"name": "gone"}},
    }))
    .expect("snapshot json");
    let created = api
        .create(&PostParams::default(), &obj)
        .await
        .expect("create snapshot");
    let keys = store.keys(&env.ns, scope_key, &created.uid().expect("uid"));
    store
        .inner()
        .put(&keys.object, bytes.to_vec().into())
        .await
        .expect("put object");
    let status = serde_json::json!({
        "apiVersion": "agentbox.dev/v1alpha1",
        "kind": "SandboxSnapshot",
        "status": {"phase": "Ready", "objectKey": keys.object.to_string(), "sha256": sha256,
                    "sizeBytes": bytes.len(), "members": 1, "scopeKey": scope_key},
    });
    api.patch_status(
        name,
        &PatchParams::apply("agentbox-tests").force(),
        &Patch::Apply(&status),
    )
    .await
    .expect("set status")
}

/// Deletes every SandboxSnapshot while the operator still runs (their finalizers need it),
/// then the namespace, then the test's `file://` store directory, if any.
pub async fn finish_with_snapshots(env: TestEnv, store_dir: Option<&std::path::Path>) {
    delete_snapshots(&env).await;
    env.finish().await;
    if let Some(dir) = store_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A `file://` snapshot store for a test namespace: the operator's flags, a client of the
/// same store, and its directory (removed by [`finish_with_snapshots`]).
pub fn file_store(
    ns: &str,
) -> (
    Vec<String>,
    agentbox_operator::snapshot::store::Store,
    std::path::PathBuf,
) {
    let dir = PathBuf::from(format!("/var/lib/agentbox/test-snapshots/{ns}"));
    let url = format!("file://{}", dir.display());
    let store = agentbox_operator::snapshot::store::Store::new(
        &agentbox_operator::snapshot::store::StoreConfig {
            url: url.clone(),
            prefix: "snaps".into(),
            s3_endpoint: String::new(),
            s3_region: String::new(),
            s3_path_style: false,
            s3_allow_http: false,
            s3_sign_payload: false,
        },
    )
    .expect("file store");
    let flags = vec![
        "--store-url".into(),
        url,
        "--store-prefix".into(),
        "snaps".into(),
    ];
    (flags, store, dir)
}

/// The workspace directories (named by a sandbox UID, or a warm pod's `warm-<suffix>`) in a
/// namespace's directory on this node.
pub fn workspace_names(ns_dir: &str) -> Vec<String> {
    std::fs::read_dir(ns_dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| agentbox_operator::controller::sweep::is_sweepable(n))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until the host directory `dir` is gone: a deleted sandbox's workspace directory is
/// removed just after the object goes. Panics with the operator logs if it stays `secs`.
pub async fn wait_removed(env: &TestEnv, dir: &str, secs: u64) {
    for _ in 0..secs * 10 {
        if !std::path::Path::new(dir).exists() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "{dir} still on the node after {secs}s\n{}",
        env.operator_logs()
    );
}

/// Deletes the test's namespace and waits (up to 2 min) until it is gone; panics with the
/// operators' logs otherwise.
pub async fn delete_namespace_and_wait(env: &TestEnv) {
    let nss: Api<Namespace> = Api::all(env.client.clone());
    nss.delete(&env.ns, &DeleteParams::default())
        .await
        .expect("delete the namespace");
    for _ in 0..1200 {
        if nss.get_opt(&env.ns).await.expect("get").is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the namespace {} did not go\n{}",
        env.ns,
        env.operator_logs()
    );
}

/// Waits until no pod is left in the namespace (a deleted sandbox's pod stops after its
/// object is gone; the sweep's helper pods go once done). Panics after `secs`.
/// Pods of the test namespace but the operator's own network-check beacon (the listener of
/// the check that proved a node, kept until the next check: the test operator's check
/// namespace is the test's, its leader-election namespace).
pub fn not_the_beacon() -> ListParams {
    ListParams::default().labels("!agentbox.dev/netcheck")
}

/// Waits until the test namespace holds no pods (but the network check's beacon).
pub async fn wait_no_pods(env: &TestEnv, secs: u64) {
    let mut left = Vec::new();
    for _ in 0..secs * 10 {
        left = env
            .api::<Pod>()
            .list(&not_the_beacon())
            .await
            .expect("list pods")
            .items
            .iter()
            .map(|p| p.name_any())
            .collect();
        if left.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("pods left after {secs}s: {left:?}\n{}", env.operator_logs());
}

/// Names at the top of a sandbox's workspace directory (the one its status records, else the
/// derived one), read on the node (this host).
pub fn workspace_entries(sbx: &Sandbox) -> Vec<String> {
    let host = agentbox_operator::controller::placement::host_dir(sbx, NODE_ROOT);
    std::fs::read_dir(&host)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The local cluster's audit log, rotated files first (the API server rotates it by size, also
/// in the middle of a test), as one text.
pub fn audit_log_text() -> String {
    let path = std::path::PathBuf::from(
        std::env::var("AGENTBOX_AUDIT_LOG")
            .unwrap_or_else(|_| "/var/lib/agentbox-cluster/audit.log".into()),
    );
    let dir = path
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let mut rotated: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("audit-") && n.ends_with(".log"))
                })
                .collect()
        })
        .unwrap_or_default();
    rotated.sort();
    let mut text = String::new();
    for p in rotated.iter().chain(std::iter::once(&path)) {
        text.push_str(&std::fs::read_to_string(p).unwrap_or_default());
    }
    assert!(!text.is_empty(), "no audit log at {}", path.display());
    text
}
pub mod net;
pub mod pools;
pub mod store;

/// The Events about `object` (by name) with `reason`, as listed now.
pub async fn events_now(
    env: &TestEnv,
    object: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    env.api::<k8s_openapi::api::events::v1::Event>()
        .list(&ListParams::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object)
                && e.reason.as_deref() == Some(reason)
        })
        .collect()
}

/// The Events about `object` with `reason`, waiting a little (10 s) for them to arrive.
pub async fn events(
    env: &TestEnv,
    object: &str,
    reason: &str,
) -> Vec<k8s_openapi::api::events::v1::Event> {
    for _ in 0..50 {
        let found = events_now(env, object, reason).await;
        if !found.is_empty() {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Vec::new()
}

/// Runs a command: (exit code, stdout, stderr).
pub fn output(mut cmd: Command) -> (Option<i32>, String, String) {
    let out = cmd.output().expect("run the command");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The path of one of agentbox-client's binaries (`agentbox`, `kubectl-agentbox`).
///
/// Cargo hands an integration test only its own package's binaries (`CARGO_BIN_EXE_*`), and
/// the CLI is agentbox-client's. With `$AGENTBOX_CLI_BIN` set (hack/test builds the workspace's
/// binaries first and sets it, as for the Python, Go and Java tests) they are beside it;
/// otherwise the first call in a test process builds that package's binaries into the target
/// directory this test binary runs from, with the same profile (a no-op when they are fresh),
/// so a stale CLI is never tested.
pub fn cli_bin(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let profile_dir = BUILT.get_or_init(|| {
        if let Some(dir) = std::env::var_os("AGENTBOX_CLI_BIN")
            .map(PathBuf::from)
            .and_then(|cli| cli.parent().map(PathBuf::from))
        {
            return dir;
        }
        // <target>/<profile>/deps/<test binary>
        let exe = std::env::current_exe().expect("the test binary's path");
        let profile_dir = exe
            .parent()
            .and_then(|deps| deps.parent())
            .expect("the test binary runs from <target>/<profile>/deps")
            .to_path_buf();
        let target = profile_dir.parent().expect("<target>");
        let mut build = Command::new(env!("CARGO"));
        build
            .args(["build", "--quiet", "--package", "agentbox-client", "--bins"])
            .arg("--target-dir")
            .arg(target)
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|p| p == "release") {
            build.arg("--release");
        }
        let status = build.status().expect("cargo build -p agentbox-client");
        assert!(
            status.success(),
            "cargo build -p agentbox-client --bins failed"
        );
        profile_dir
    });
    profile_dir.join(name)
}

/// Runs the `agentbox` CLI in the test namespace: (exit code, stdout, stderr).
pub fn cli(env: &TestEnv, args: &[&str]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(cli_bin("agentbox"));
    cmd.args(["-n", &env.ns]).args(args);
    output(cmd)
}

/// Waits (up to 180 s) until the Sandbox has condition `type_` with `status` and `reason`.
pub async fn wait_condition(
    env: &TestEnv,
    name: &str,
    type_: &'static str,
    status: &'static str,
    reason: &'static str,
) -> Sandbox {
    env.wait_for::<Sandbox>(name, 180, move |s: Option<&Sandbox>| {
        s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
            st.conditions
                .iter()
                .any(|c| c.type_ == type_ && c.status == status && c.reason == reason)
        })
    })
    .await
}

/// The message of the Sandbox's condition `type_` (empty without one).
pub fn condition_message(s: &Sandbox, type_: &str) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == type_))
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

/// Replaces `sh` in the sandbox as [`lying_shell`] does, with `case` arms of its own (`$*`
/// is what the shell was asked to run; `/tmp/told.tar` holds `bytes`); everything else runs
/// as before. Asked to run the exec wrapper (`sh -c WRAPPER agentbox-exec MARK STDIN ...`),
/// it forges the wrapper's frame around its lie (the mark is in its arguments: code in the
/// sandbox can always do that), so what reaches the operator is judged by the archive's rules,
/// not cut short by a missing trailer.
pub async fn plant_shell(env: &TestEnv, pod: &str, bytes: &[u8], arms: &str) -> Result<(), String> {
    let script = format!(
        r#"cat > /tmp/told.tar && mkdir -p /usr/local/bin && cat > /usr/local/bin/sh <<'END'
#!/bin/busybox sh
lie() {{ case "$*" in {arms} esac; return 99; }}
if [ "$3" = agentbox-exec ]; then
  ( lie "$@" ); r=$?
  [ "$r" = 99 ] && exec /bin/busybox sh "$@"
  printf %s "$4"; printf %s "$4" >&2
  [ "$5" = = ] || while read -r _; do :; done
  exit "$r"
fi
lie "$@"
exec /bin/busybox sh "$@"
END
chmod 0755 /usr/local/bin/sh"#
    );
    let req = agentbox_api::exec::ExecRequest::argv(["/bin/busybox", "sh", "-c", script.as_str()])
        .stdin(bytes.to_vec())
        .timeout(Duration::from_secs(60));
    match agentbox_api::exec::run(&env.api::<Pod>(), pod, "sandbox", req).await {
        Ok(out) if out.success() => Ok(()),
        Ok(out) => Err(format!("planting the shell: {}", out.stderr_str())),
        Err(e) => Err(format!("planting the shell: {e}")),
    }
}

/// The egress proxy's image: AGENTBOX_PROXY_IMAGE (hack/test builds it before the lanes), else
/// `hack/proxy-image --dev` builds and imports one.
pub fn proxy_image() -> String {
    if let Some(i) = std::env::var("AGENTBOX_PROXY_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
    {
        return i;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join("hack/proxy-image"))
        .arg("--dev")
        .current_dir(root)
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("hack/proxy-image runs");
    assert!(out.status.success(), "hack/proxy-image failed");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}
