//! The Helm chart against the real local cluster: build and import the operator image
//! (hack/image --dev), `helm install` the **previous chart version** (taken from git history with
//! `git archive`, its CRDs applied as it left them) watching a test namespace, run the Sandbox
//! lifecycle against the in-cluster operator, `helm upgrade` to this chart (with a changed
//! value): the CRDs are upgraded with it, then the lifecycle again, `helm test`, the aggregated
//! ClusterRoles through the built-in edit and view roles, and `helm uninstall`, after which no
//! object of the release is left. What stays by design: the CRDs (`crds.keep`), the
//! leader-election Lease the operator created at run time (it goes with its namespace), the
//! Events the operator recorded (they expire), and the snapshot store's directory on the node.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use agentbox_api::crd::{Sandbox, SandboxSnapshot, SnapshotPhase, StartBranch};
use common::{NODE_ROOT, TestEnv, create_sandbox, helm_bin, phase_is, repo_root, sh, suffix};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, LogParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// The previous version of the chart as it was last committed: the newest commit that changed
/// `charts/agentbox` while its Chart.yaml had another version than this one, extracted with
/// `git archive` into `dir` with that commit's hack/values-local.yaml (a value this tree's file
/// adds would be refused by the older chart's schema). Returns its version and the chart's
/// path; the values file is `dir/hack/values-local.yaml`.
///
/// First-parent history only: a branch that bumps the version is merged into main with a merge
/// commit, so main's first parents are main's own states and the previous version is the chart
/// main last shipped, not an intermediate state of the branch that bumped it.
fn previous_chart(dir: &Path) -> (String, std::path::PathBuf) {
    let version = |text: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix("version:"))
            .map(|v| v.trim().to_string())
            .expect("a version in Chart.yaml")
    };
    let current =
        version(&std::fs::read_to_string(repo_root().join("charts/agentbox/Chart.yaml")).unwrap());
    // AGENTBOX_PREVIOUS_CHART_COMMIT: take the previous chart from this commit instead.
    let log = match std::env::var("AGENTBOX_PREVIOUS_CHART_COMMIT") {
        Ok(c) if !c.is_empty() => c,
        _ => run(Command::new("git")
            .args([
                "log",
                "--first-parent",
                "--format=%H",
                "--",
                "charts/agentbox",
            ])
            .current_dir(repo_root())),
    };
    for commit in log.lines() {
        let chart = run(Command::new("git")
            .args(["show", &format!("{commit}:charts/agentbox/Chart.yaml")])
            .current_dir(repo_root()));
        let v = version(&chart);
        if v != current {
            let archive = run(Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "git archive {commit} charts/agentbox hack/values-local.yaml | tar -x -C '{}'",
                    dir.display()
                ))
                .current_dir(repo_root()));
            assert!(archive.is_empty(), "{archive}");
            return (v, dir.join("charts/agentbox"));
        }
    }
    panic!("no earlier chart version than {current} in git history");
}

/// The property paths of a CRD's schema (`spec.workspace.files[].path`, ...).
fn schema_paths(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> std::collections::BTreeSet<String> {
    fn walk(v: &serde_json::Value, at: &str, out: &mut std::collections::BTreeSet<String>) {
        if let Some(props) = v.get("properties").and_then(|p| p.as_object()) {
            for (k, child) in props {
                let p = format!("{at}.{k}");
                out.insert(p.clone());
                walk(child, &p, out);
            }
        }
        if let Some(items) = v.get("items") {
            walk(items, &format!("{at}[]"), out);
        }
    }
    let mut out = std::collections::BTreeSet::new();
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
    walk(&schema["openAPIV3Schema"], "", &mut out);
    out
}

/// The snapshot store directory of hack/values-local.yaml (a hostPath of the operator pod).
const STORE_DIR: &str = "/var/lib/agentbox/helm-snapshots";

/// Runs a command; panics with its output when it fails; returns stdout.
fn run(cmd: &mut Command) -> String {
    let shown = format!("{cmd:?}");
    let t = Instant::now();
    let out = cmd.output().unwrap_or_else(|e| panic!("{shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("[helm test] {shown} took {:.1?}", t.elapsed());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A Helm release in its own namespace; uninstalled and its namespace deleted on drop (also when
/// the test panics).
struct Release {
    name: String,
    ns: String,
    /// The namespace the release watches.
    watched: String,
    uninstalled: bool,
}

impl Release {
    fn helm(&self, args: &[&str]) -> String {
        run(Command::new(helm_bin())
            .args(args)
            .args(["-n", &self.ns])
            .current_dir(repo_root()))
    }

    /// The release's operator objects (not its egress proxy's, which share the instance).
    fn selector(&self) -> String {
        format!(
            "app.kubernetes.io/instance={},app.kubernetes.io/component=operator",
            self.name
        )
    }

    /// Every labelled object of the release.
    fn release_selector(&self) -> String {
        format!("app.kubernetes.io/instance={}", self.name)
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        if !self.uninstalled {
            let _ = Command::new(helm_bin())
                .args([
                    "uninstall",
                    &self.name,
                    "-n",
                    &self.ns,
                    "--wait",
                    "--timeout",
                    "60s",
                ])
                .status();
        }
        let kubectl = common::kubectl_bin();
        // After a panic nobody runs the finalizers any more: drop them so that the watched
        // namespace can go (a workspace directory may stay behind then).
        for kind in ["sandboxsnapshots.agentbox.dev", "sandboxes.agentbox.dev"] {
            let names = Command::new(&kubectl)
                .args(["-n", &self.watched, "get", kind, "-o", "name"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for obj in names.lines() {
                let _ = Command::new(&kubectl)
                    .args(["-n", &self.watched, "patch", obj, "--type=merge"])
                    .args(["-p", r#"{"metadata":{"finalizers":null}}"#])
                    .status();
            }
        }
        let _ = Command::new(kubectl)
            .args([
                "delete",
                "namespace",
                &self.ns,
                "--wait=false",
                "--ignore-not-found",
            ])
            .status();
    }
}

/// Polls `f` every 500 ms until it returns Some, or panics with `what` after `secs`.
async fn eventually<T, F, Fut>(what: &str, secs: u64, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {secs}s: {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The release's operator pods that are not terminating.
async fn operator_pods(client: &Client, rel: &Release) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &rel.ns);
    pods.list(&ListParams::default().labels(&rel.selector()))
        .await
        .expect("list operator pods")
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// Waits until the Deployment has rolled out: one up-to-date, ready pod and no other pod left.
async fn rolled_out(client: &Client, rel: &Release) -> Pod {
    let deps: Api<Deployment> = Api::namespaced(client.clone(), &rel.ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &rel.ns);
    let sel = rel.selector();
    eventually("the operator Deployment to roll out", 180, || async {
        let d = deps
            .list(&ListParams::default().labels(&sel))
            .await
            .ok()?
            .items
            .pop()?;
        let st = d.status.as_ref()?;
        let want = d.spec.as_ref()?.replicas.unwrap_or(1);
        let done = st.observed_generation == d.metadata.generation
            && st.updated_replicas == Some(want)
            && st.ready_replicas == Some(want)
            && st.replicas == Some(want);
        let all = pods
            .list(&ListParams::default().labels(&sel))
            .await
            .ok()?
            .items;
        (done && all.len() == 1 && all[0].metadata.deletion_timestamp.is_none())
            .then(|| all[0].clone())
    })
    .await
}

async fn lease_holder(client: &Client, ns: &str, name: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    leases
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
}

async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let code = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, text.split_once("\r\n\r\n")?.1.to_string()))
}

fn env_of(pod: &Pod, name: &str) -> Option<String> {
    pod.spec.as_ref()?.containers[0]
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == name)?
        .value
        .clone()
}

fn sandbox_spec(name: &str) -> serde_json::Value {
    json!({
        "image": common::BASE_IMAGE,
        "scope": {"kind": "Session", "agent": "helm", "session": name},
        "network": {"egress": "None"},
        "workspace": {
            "files": [
                {"path": "README.md", "content": "in-cluster\n"},
                {"path": "conf/settings", "contentFrom": {"configMapKeyRef": {"name": "cfg", "key": "settings"}}},
                {"path": "secret/token", "contentFrom": {"secretKeyRef": {"name": "token", "key": "value"}}, "mode": 0o600}
            ],
            "projections": [{"configMap": "tools", "path": "tools"}]
        }
    })
}

/// Deletes a sandbox and checks that its pods, policy and workspace directory go with it.
async fn delete_sandbox(env: &TestEnv, s: &Sandbox) {
    let name = s.name_any();
    let dir = agentbox_operator::controller::pod::workspace_host_path(
        NODE_ROOT,
        &env.ns,
        &s.uid().unwrap(),
    );
    assert!(
        Path::new(&dir).join(".agentbox/marker").exists(),
        "{dir} on the node"
    );
    env.api::<Sandbox>()
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete sandbox");
    env.wait_gone::<Sandbox>(&name, 120).await;
    // The finalizer does not wait for the sandbox pod (asked to go with a short grace) nor for
    // the workspace directory (the operator's sweep removes it just after): both follow.
    eventually("the pods of the sandbox to go", 60, || async {
        env.sandbox_pods(&name).await.is_empty().then_some(())
    })
    .await;
    let np_name = agentbox_api::labels::network_policy_name(&name);
    assert!(
        env.api::<NetworkPolicy>()
            .get_opt(&np_name)
            .await
            .unwrap()
            .is_none()
    );
    common::wait_removed(env, &dir, 60).await;
}

/// The Sandbox lifecycle against the in-cluster operator (`operator_pod`, checked through the
/// Events' reporting instance): create → Ready (files from inline content, a ConfigMap and a
/// Secret, a projection, egress denied) → exec → snapshot into the file store → delete (pod,
/// policy, workspace directory gone) → create again: restored from the snapshot (branch C) →
/// delete → delete the snapshot (its object goes, policy Delete). `proxy`: the egress proxy URL
/// the sandbox's pod must get (`HTTP_PROXY`), `None` for none.
async fn lifecycle(env: &TestEnv, name: &str, operator_pod: &str, proxy: Option<&str>) {
    create_sandbox(env, name, sandbox_spec(name))
        .await
        .expect("create sandbox");
    let s = env.wait_for::<Sandbox>(name, 120, phase_is("Ready")).await;
    let pod = s
        .status
        .as_ref()
        .and_then(|st| st.pod_name.clone())
        .expect("pod name");
    let sandbox_pod = env.api::<Pod>().get(&pod).await.expect("sandbox pod");
    assert_eq!(
        env_of(&sandbox_pod, "HTTP_PROXY").as_deref(),
        proxy,
        "the egress proxy's address in the sandbox's environment"
    );
    let (code, out) = sh(
        env,
        &pod,
        "cd /workspace && cat README.md conf/settings secret/token && echo && ls tools \
         && echo kept > notes.txt",
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(out, "in-cluster\na=1\ns3cr3t\nlint.sh\n");
    let (code, _) = sh(env, &pod, "exit 7").await;
    assert_eq!(code, Some(7), "the real exit code comes back");
    let np_name = agentbox_api::labels::network_policy_name(name);
    assert!(
        env.api::<NetworkPolicy>()
            .get_opt(&np_name)
            .await
            .unwrap()
            .is_some()
    );

    let events = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .expect("events");
    let ours: Vec<&Event> = events
        .items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect();
    assert!(!ours.is_empty(), "events about {name}");
    for e in &ours {
        assert_eq!(e.reporting_controller.as_deref(), Some("agentbox-operator"));
        assert_eq!(e.reporting_instance.as_deref(), Some(operator_pod), "{e:?}");
    }

    // A snapshot into the file store on the operator's hostPath volume, written as the
    // operator's non-root user.
    let snaps = env.api::<SandboxSnapshot>();
    let snap_name = format!("{name}-snap");
    let snap: SandboxSnapshot = serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1",
        "kind": "SandboxSnapshot",
        "metadata": {"name": snap_name},
        "spec": {"sandboxRef": {"name": name}, "deletionPolicy": "Delete"},
    }))
    .unwrap();
    snaps
        .create(&PostParams::default(), &snap)
        .await
        .expect("create snapshot");
    let snap = env
        .wait_for::<SandboxSnapshot>(&snap_name, 120, |s: Option<&SandboxSnapshot>| {
            matches!(
                s.and_then(|s| s.status.as_ref()).and_then(|st| st.phase),
                Some(SnapshotPhase::Ready | SnapshotPhase::Failed)
            )
        })
        .await;
    let st = snap.status.clone().unwrap_or_default();
    assert_eq!(st.phase, Some(SnapshotPhase::Ready), "{snap:#?}");
    let object = Path::new(STORE_DIR).join(st.object_key.expect("object key"));
    let meta = std::fs::metadata(&object).expect("snapshot object in the file store");
    assert_eq!(Some(meta.len() as i64), st.size_bytes);
    {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(meta.uid(), 65532, "written by the operator's non-root user");
    }

    delete_sandbox(env, &s).await;

    // The same scope again, in a new Sandbox: a fresh workspace restored from the snapshot
    // (branch C). (A name made again at once is tests/sandbox.rs's case.)
    let again = format!("{name}-again");
    create_sandbox(env, &again, sandbox_spec(name))
        .await
        .expect("create sandbox again");
    let s = env
        .wait_for::<Sandbox>(&again, 120, phase_is("Ready"))
        .await;
    let st = s.status.clone().unwrap_or_default();
    assert_eq!(
        st.restored_from.as_deref(),
        Some(snap_name.as_str()),
        "{st:#?}"
    );
    assert_eq!(
        st.workspace.as_ref().and_then(|w| w.last_start_branch),
        Some(StartBranch::Restored)
    );
    let pod = st.pod_name.clone().expect("pod name");
    let (code, out) = sh(env, &pod, "cat /workspace/notes.txt").await;
    assert_eq!((code, out.as_str()), (Some(0), "kept\n"));
    delete_sandbox(env, &s).await;

    snaps
        .delete(&snap_name, &DeleteParams::default())
        .await
        .expect("delete snapshot");
    env.wait_gone::<SandboxSnapshot>(&snap_name, 60).await;
    assert!(
        !object.exists(),
        "deletionPolicy Delete removed {}",
        object.display()
    );
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn helm_install_lifecycle_upgrade_uninstall() {
    let t0 = Instant::now();
    // AGENTBOX_OPERATOR_IMAGE: an image already in the cluster (skips hack/image). A dev
    // build: this tests the chart, and a release build takes minutes.
    let image = match std::env::var("AGENTBOX_OPERATOR_IMAGE") {
        Ok(image) if !image.is_empty() => image,
        _ => run(Command::new(repo_root().join("hack/image"))
            .arg("--dev")
            .current_dir(repo_root()))
        .lines()
        .last()
        .expect("hack/image prints the image")
        .trim()
        .to_string(),
    };
    let (repo, tag) = image.rsplit_once(':').expect("repo:tag");

    let env = TestEnv::new("helm").await;
    let client = env.client.clone();
    let name = format!("abx-{}", suffix());
    let mut rel = Release {
        ns: format!("{name}-system"),
        watched: env.ns.clone(),
        name,
        uninstalled: false,
    };
    let lease = format!("{}-leader", rel.name);
    // The file store of hack/values-local.yaml, writable by the operator's user.
    std::fs::create_dir_all(STORE_DIR).expect("store dir");
    std::os::unix::fs::chown(STORE_DIR, Some(65532), Some(65532)).expect("chown store dir");
    let port = free_port();

    // Sources for the sandbox's files: read by the in-cluster operator through its Role, and
    // labelled readable by sandboxes (docs/security.md).
    let readable = json!({"agentbox.dev/sandbox-readable": "true"});
    let cm: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "cfg", "labels": readable}, "data": {"settings": "a=1\n"}}),
    )
    .unwrap();
    env.api::<ConfigMap>()
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let tools: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "tools", "labels": readable}, "data": {"lint.sh": "echo lint\n"}}),
    )
    .unwrap();
    env.api::<ConfigMap>()
        .create(&PostParams::default(), &tools)
        .await
        .unwrap();
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "token", "labels": readable}, "stringData": {"value": "s3cr3t"}}),
    )
    .unwrap();
    env.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    // --- install the previous chart version, its CRDs as it left them ------------------------
    let prev_dir = std::env::temp_dir().join(format!("agentbox-prev-chart-{}", rel.name));
    std::fs::create_dir_all(&prev_dir).expect("temp dir");
    let (prev_version, prev_chart) = previous_chart(&prev_dir);
    let prev_values = prev_dir.join("hack/values-local.yaml");
    // The previous chart runs this tree's image, whose NetworkPolicy check runs in the release
    // namespace with RBAC that chart lacks (in a real upgrade the old chart runs the old
    // image): it attests enforcement (true here: hack/cluster runs kube-router). The upgrade's
    // values (hack/values-local.yaml's extraEnv) drop that, and this chart's check runs.
    let attested = prev_dir.join("attested.yaml");
    {
        let prev: serde_yaml::Value =
            serde_yaml::from_str(&std::fs::read_to_string(&prev_values).expect("values"))
                .expect("values YAML");
        let mut env_list = prev
            .get("extraEnv")
            .and_then(|e| e.as_sequence())
            .cloned()
            .unwrap_or_default();
        env_list.push(
            serde_yaml::from_str("{name: AGENTBOX_NETWORK_ENFORCEMENT, value: Attested}").unwrap(),
        );
        let mut doc = serde_yaml::Mapping::new();
        doc.insert("extraEnv".into(), serde_yaml::Value::Sequence(env_list));
        std::fs::write(&attested, serde_yaml::to_string(&doc).unwrap()).expect("write values");
    }
    let prev_crds: Vec<_> = std::fs::read_dir(prev_chart.join("crds"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        !prev_crds.is_empty(),
        "chart {prev_version} kept its CRDs in crds/ (written for that layout)"
    );
    // What a cluster that ran the previous version has: its CRDs, which `helm install` would
    // have created (it skips them here, where they exist).
    for f in &prev_crds {
        run(Command::new(common::kubectl_bin())
            .args(["apply", "--server-side", "--force-conflicts", "-f"])
            .arg(f));
    }
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let served_before = crds.get("sandboxes.agentbox.dev").await.unwrap();
    let ours: Vec<CustomResourceDefinition> = agentbox_api::crd::all();
    assert_ne!(
        served_before.spec.versions[0].schema, ours[0].spec.versions[0].schema,
        "this chart changes the Sandbox CRD, so the upgrade has something to bring"
    );
    let t = Instant::now();
    eprintln!("[helm test] installing the previous chart {prev_version}");
    rel.helm(&[
        "install",
        &rel.name,
        prev_chart.to_str().unwrap(),
        "--create-namespace",
        "-f",
        prev_values.to_str().unwrap(),
        "-f",
        attested.to_str().unwrap(),
        "--set",
        &format!("image.repository={repo}"),
        "--set",
        &format!("image.tag={tag}"),
        "--set",
        &format!("watchNamespace={}", env.ns),
        "--set",
        &format!("leaderElection.leaseName={lease}"),
        "--set",
        "leaderElection.leaseSeconds=5",
        "--set",
        &format!("metrics.port={port}"),
        "--wait",
        "--timeout",
        "180s",
    ]);
    let pod = rolled_out(&client, &rel).await;
    let pod_name = pod.name_any();
    eprintln!(
        "[helm test] installed and ready in {:.1?} ({pod_name})",
        t.elapsed()
    );

    // The restricted security context holds: non-root, read-only root, no capabilities.
    let spec = pod.spec.clone().unwrap();
    let sc = spec.containers[0].security_context.clone().unwrap();
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
    assert_eq!(spec.security_context.unwrap().run_as_user, Some(65532));
    assert_eq!(spec.host_network, Some(true));

    // Leader election: this pod holds the release's Lease; endpoints answer on loopback.
    let holder = eventually("the operator to hold its leader Lease", 60, || async {
        lease_holder(&client, &rel.ns, &lease).await
    })
    .await;
    assert_eq!(holder, pod_name);
    let (code, body) = http_get(port, "/readyz").await.expect("/readyz");
    assert_eq!(code, 200, "{body}");
    let (code, body) = http_get(port, "/metrics").await.expect("/metrics");
    assert_eq!(code, 200);
    assert!(body.contains("# EOF"), "OpenMetrics text: {body}");

    lifecycle(&env, "life", &pod_name, None).await;

    // --- upgrade to this chart, with a changed value (JSON logs): the CRDs come along -----
    // --take-ownership: the previous chart's CRDs were not the release's (Helm installs a
    // crds/ directory outside the release); --reset-then-reuse-values: this chart's defaults
    // for its new values, the install's settings for the others.
    let t = Instant::now();
    rel.helm(&[
        "upgrade",
        &rel.name,
        "charts/agentbox",
        "--take-ownership",
        "--reset-then-reuse-values",
        // This tree's local values over the install's (the previous chart's file lacks what
        // this chart added, such as the test cluster's pids cgroup root).
        "-f",
        "hack/values-local.yaml",
        "--set",
        "logging.json=true",
        // The sweep's steps, should the self-test's directory stay (checked below).
        "--set",
        "logging.level=info\\,agentbox_operator::controller::sweep=debug",
        "--wait",
        "--timeout",
        "180s",
    ]);
    let _ = std::fs::remove_dir_all(&prev_dir);
    for (i, name) in [
        "sandboxes.agentbox.dev",
        "sandboxsnapshots.agentbox.dev",
        // New in this chart: the upgrade brings them.
        "sandboxtemplates.agentbox.dev",
        "sandboxpools.agentbox.dev",
    ]
    .iter()
    .enumerate()
    {
        let served = crds.get(name).await.unwrap();
        assert_eq!(
            served.spec.versions[0].schema, ours[i].spec.versions[0].schema,
            "{name}: the upgrade brought this chart's schema"
        );
        assert_eq!(served.spec.names.categories, ours[i].spec.names.categories);
        let ann = served.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            ann.get("helm.sh/resource-policy").map(String::as_str),
            Some("keep"),
            "{name}"
        );
        assert_eq!(
            ann.get("meta.helm.sh/release-name"),
            Some(&rel.name),
            "{name}: adopted"
        );
    }
    let served = crds.get("sandboxes.agentbox.dev").await.unwrap();
    let added: Vec<String> = schema_paths(&ours[0])
        .difference(&schema_paths(&served_before))
        .cloned()
        .collect();
    let now = schema_paths(&served);
    for p in &added {
        assert!(now.contains(p), "{p} added by the upgrade");
    }
    eprintln!("[helm test] fields the upgrade added to the Sandbox CRD: {added:?}");
    // And the new rules hold at admission (the previous CRD accepted this).
    let dup = create_sandbox(
        &env,
        "dup",
        json!({"image": common::BASE_IMAGE, "scope": {"kind": "Global"},
               "workspace": {"files": [{"path": "a", "content": "1"}, {"path": "a", "content": "2"}]}}),
    )
    .await
    .expect_err("duplicate file paths after the upgrade");
    assert!(
        dup.to_string()
            .contains("file paths must be unique: a appears more than once"),
        "{dup}"
    );
    let new_pod = rolled_out(&client, &rel).await;
    let new_name = new_pod.name_any();
    eprintln!(
        "[helm test] upgraded and rolled out in {:.1?} ({new_name})",
        t.elapsed()
    );
    assert_ne!(new_name, pod_name, "the pod was replaced");
    assert_eq!(
        env_of(&new_pod, "AGENTBOX_LOG_JSON").as_deref(),
        Some("true")
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &rel.ns);
    let logs = eventually("log lines from the upgraded operator", 60, || async {
        let l = pods.logs(&new_name, &LogParams::default()).await.ok()?;
        (!l.trim().is_empty()).then_some(l)
    })
    .await;
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(v.is_object(), "{line}");
    }
    let holder = eventually("the new pod to take the leader Lease", 60, || async {
        lease_holder(&client, &rel.ns, &lease)
            .await
            .filter(|h| *h == new_name)
    })
    .await;
    assert_eq!(holder, new_name);
    // This chart runs the egress proxy: its Service's DNS name is the operator's URL, and the
    // operator gives sandboxes the Service's ClusterIP (an allowlisted sandbox has no DNS).
    let proxy_service = Api::<Service>::namespaced(client.clone(), &rel.ns)
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/instance={},app.kubernetes.io/component=egress-proxy",
            rel.name
        )))
        .await
        .expect("list the proxy's Service");
    assert_eq!(proxy_service.items.len(), 1, "one egress proxy Service");
    let proxy_ip = proxy_service.items[0]
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .expect("the proxy Service's ClusterIP");
    assert!(
        env_of(&new_pod, "AGENTBOX_EGRESS_PROXY_URL").is_some_and(|u| u.contains(".svc:")),
        "the chart names the proxy by its Service's DNS name"
    );
    let proxy_url = format!("http://{proxy_ip}:3128");
    lifecycle(&env, "after-upgrade", &new_name, Some(&proxy_url)).await;

    // --- helm test: the chart's test pod creates a Sandbox, execs, deletes ---------------
    let t = Instant::now();
    // (No --logs: the pod is deleted as soon as it passes, hook-delete-policy hook-succeeded.)
    let out = rel.helm(&["test", &rel.name, "--timeout", "300s"]);
    eprintln!(
        "[helm test] `helm test` passed in {:.1?}:\n{out}",
        t.elapsed()
    );
    let phases: Vec<&str> = out
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Phase:"))
        .map(str::trim)
        .collect();
    assert!(
        !phases.is_empty() && phases.iter().all(|p| *p == "Succeeded"),
        "{out}"
    );
    // It leaves nothing behind (its pod, ServiceAccount and Role go when it passes).
    let left = env
        .api::<Sandbox>()
        .list(&ListParams::default().labels("agentbox.dev/agent=agentbox-selftest"))
        .await
        .unwrap();
    assert!(left.items.is_empty(), "{:?}", left.items);
    assert!(
        env.api::<Pod>()
            .get_opt(&format!("{}-agentbox-test", rel.name))
            .await
            .unwrap()
            .is_none()
    );
    // Nor a directory on the node: the self-test's workspace goes just after its Sandbox (the
    // operator's sweep), while the release runs. Uninstalled sooner, it would wait for the
    // next operator's pass, and after this test there is none.
    let ns_dir = format!("{NODE_ROOT}/{}", env.ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !common::workspace_names(&ns_dir).is_empty() {
        if Instant::now() >= deadline {
            let logs = pods
                .logs(&new_name, &LogParams::default())
                .await
                .unwrap_or_else(|e| format!("(no logs: {e})"));
            panic!(
                "the self-test's workspace is still in {ns_dir} after 60 s: {:?}\n{logs}",
                common::workspace_names(&ns_dir)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // --- people: agentbox-edit and agentbox-view through the built-in roles ---------------
    for (user, role) in [("alice", "edit"), ("bob", "view")] {
        let rb: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": format!("{user}-{role}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }))
        .unwrap();
        env.api::<RoleBinding>()
            .create(&PostParams::default(), &rb)
            .await
            .unwrap();
    }
    let can = |user: &'static str, verb: &'static str, what: &'static str| {
        let ns = env.ns.clone();
        async move {
            let (_, out, _) =
                common::kubectl(&["auth", "can-i", verb, what, "-n", &ns, "--as", user], "");
            out.trim() == "yes"
        }
    };
    eventually(
        "the aggregated roles to reach edit and view",
        60,
        || async {
            (can("alice", "create", "sandboxes.agentbox.dev").await
                && can("alice", "delete", "sandboxsnapshots.agentbox.dev").await
                && can("bob", "list", "sandboxes.agentbox.dev").await
                && can("bob", "get", "sandboxsnapshots.agentbox.dev").await)
                .then_some(())
        },
    )
    .await;
    assert!(!can("bob", "create", "sandboxes.agentbox.dev").await);
    assert!(!can("bob", "delete", "sandboxsnapshots.agentbox.dev").await);

    // --- uninstall: nothing of the release is left -------------------------------------
    let t = Instant::now();
    rel.helm(&["uninstall", &rel.name, "--wait", "--timeout", "120s"]);
    rel.uninstalled = true;
    eprintln!("[helm test] uninstalled in {:.1?}", t.elapsed());
    let lp = ListParams::default().labels(&rel.release_selector());
    eventually("the operator pods to go", 60, || async {
        operator_pods(&client, &rel).await.is_empty().then_some(())
    })
    .await;
    let all_pods: Api<Pod> = Api::namespaced(client.clone(), &rel.ns);
    eventually("terminating operator pods to go", 60, || async {
        all_pods
            .list(&lp)
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let mut left: BTreeMap<&str, usize> = BTreeMap::new();
    for ns in [rel.ns.as_str(), env.ns.as_str()] {
        left.insert(
            "Deployment",
            Api::<Deployment>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .unwrap()
                .items
                .len(),
        );
        left.insert(
            "ServiceAccount",
            Api::<ServiceAccount>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .unwrap()
                .items
                .len(),
        );
        left.insert(
            "Service",
            Api::<Service>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .unwrap()
                .items
                .len(),
        );
        left.insert(
            "Role",
            Api::<Role>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .unwrap()
                .items
                .len(),
        );
        left.insert(
            "RoleBinding",
            Api::<RoleBinding>::namespaced(client.clone(), ns)
                .list(&lp)
                .await
                .unwrap()
                .items
                .len(),
        );
        left.retain(|_, n| *n > 0);
        assert!(left.is_empty(), "left in {ns}: {left:?}");
    }
    assert!(
        Api::<ClusterRole>::all(client.clone())
            .list(&lp)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    assert!(
        Api::<ClusterRoleBinding>::all(client.clone())
            .list(&lp)
            .await
            .unwrap()
            .items
            .is_empty()
    );
    // By design: the CRDs stay (crds.keep, although the release owned them), and so does the
    // leader Lease.
    for name in [
        "sandboxes.agentbox.dev",
        "sandboxsnapshots.agentbox.dev",
        "sandboxtemplates.agentbox.dev",
        "sandboxpools.agentbox.dev",
    ] {
        let crd = crds.get_opt(name).await.unwrap();
        assert!(
            crd.is_some_and(|c| c.metadata.deletion_timestamp.is_none()),
            "{name} stays"
        );
    }
    // The Lease is the operator's, not Helm's. Helm deletes the RBAC while the pod is still
    // stopping, so its release may be refused: the holder then just expires.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &rel.ns);
    assert!(
        leases.get_opt(&lease).await.unwrap().is_some(),
        "leader Lease stays"
    );

    env.finish().await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let _ = nss.delete(&rel.ns, &DeleteParams::default()).await;
    eprintln!("[helm test] total {:.1?}", t0.elapsed());
}
