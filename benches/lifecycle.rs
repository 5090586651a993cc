//! Sandbox create → Ready next to a bare pod's create → Running, and the API writes a sandbox
//! costs, counted from the API server's audit log (not from the operator's own counters).
//!
//! `eval "$(hack/cluster env)"; cargo bench --bench lifecycle` (release build). It starts the
//! operator (the release binary) for a temporary namespace and measures `BENCH_N` (default 10)
//! of each, one after another, then watches 60 s of steady state (`BENCH_IDLE_SECS`).
//! The audit log is `$AGENTBOX_AUDIT_LOG` (set by `hack/cluster env`).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agentbox::crd::{Sandbox, SandboxPhase};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

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

fn stats(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let pick = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
    (pick(0.5), pick(0.95))
}

/// An audit record of a write.
struct Write {
    at: Timestamp,
    user: String,
    verb: String,
    resource: String,
    subresource: String,
    namespace: String,
}

fn read_audit(path: &str) -> Vec<Write> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
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
                verb: s("/verb"),
                resource: s("/objectRef/resource"),
                subresource: s("/objectRef/subresource"),
                namespace: s("/objectRef/namespace"),
            })
        })
        .collect()
}

#[tokio::main]
async fn main() -> Res<()> {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let idle: u64 = std::env::var("BENCH_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let audit = std::env::var("AGENTBOX_AUDIT_LOG")
        .map_err(|_| "AGENTBOX_AUDIT_LOG unset: eval \"$(hack/cluster env)\"")?;
    let client = Client::try_default().await?;
    let ns = format!("bench-life-{}", std::process::id());
    let nss: Api<Namespace> = Api::all(client.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await; // default ServiceAccount
    let log = std::fs::File::create(std::env::temp_dir().join(format!("{ns}-operator.log")))?;
    let _op = Operator(
        Command::new(env!("CARGO_BIN_EXE_agentbox-operator"))
            .args([
                "--namespace",
                &ns,
                "--metrics-addr",
                "127.0.0.1:0",
                "--identity",
                "bench",
            ])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?,
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let sbxs: Api<Sandbox> = Api::namespaced(client.clone(), &ns);

    let mut bare = Vec::new();
    for i in 0..n {
        let name = format!("bare-{i}");
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "sandbox", "image": "agentbox/base:v1", "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", agentbox::controller::pod::KEEP_ALIVE]}]}
        }))?;
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
        pods.delete(&name, &DeleteParams::default()).await?;
    }

    let mut sandbox = Vec::new();
    let mut windows = Vec::new();
    for i in 0..n {
        let name = format!("sbx-{i}");
        let sbx: Sandbox = serde_json::from_value(json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": name},
            "spec": {"image": "agentbox/base:v1", "scope": {"kind": "Session", "agent": "bench", "session": name},
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
    let idle_start = Timestamp::now();
    tokio::time::sleep(Duration::from_secs(idle)).await;
    let idle_end = Timestamp::now();

    // Writes by the operator: the admin identity the operator and this program share, in the
    // namespace, less this program's own create of each sandbox.
    let writes = read_audit(&audit);
    let admin = writes
        .iter()
        .find(|w| w.namespace == ns && w.resource == "sandboxes" && w.verb == "create")
        .map(|w| w.user.clone())
        .ok_or("no sandbox create in the audit log")?;
    let by_op = |from: Timestamp, to: Timestamp| -> Vec<&Write> {
        writes
            .iter()
            .filter(|w| w.namespace == ns && w.user == admin && w.at >= from && w.at < to)
            .filter(|w| {
                !(w.resource == "sandboxes" && w.verb == "create" && w.subresource.is_empty())
            })
            .collect()
    };
    let per_sandbox: Vec<usize> = windows.iter().map(|(a, b)| by_op(*a, *b).len()).collect();
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    if let Some((a, b)) = windows.first() {
        for w in by_op(*a, *b) {
            let key = format!(
                "{} {}{}",
                w.verb,
                w.resource,
                if w.subresource.is_empty() {
                    String::new()
                } else {
                    format!("/{}", w.subresource)
                }
            );
            *kinds.entry(key).or_default() += 1;
        }
    }
    let idle_writes = by_op(idle_start, idle_end).len();

    let (bp50, bp95) = stats(bare.clone());
    let (sp50, sp95) = stats(sandbox.clone());
    println!("| measure (n={n}) | p50 | p95 |");
    println!("|---|---|---|");
    println!("| bare pod create → Running (ms) | {bp50:.0} | {bp95:.0} |");
    println!("| Sandbox create → Ready (ms) | {sp50:.0} | {sp95:.0} |");
    println!(
        "| overhead of the median | {:+.1}% | |",
        (sp50 / bp50 - 1.0) * 100.0
    );
    println!();
    println!("API writes per sandbox, create → Ready (audit log): {per_sandbox:?}");
    println!("first sandbox's writes: {kinds:?}");
    println!(
        "API writes by the operator in {idle} s of steady state ({n} Ready sandboxes): {idle_writes}"
    );

    for i in 0..n {
        let _ = sbxs
            .delete(&format!("sbx-{i}"), &DeleteParams::default())
            .await;
    }
    for _ in 0..600 {
        if sbxs.list(&ListParams::default()).await?.items.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(_op);
    nss.delete(&ns, &DeleteParams::default()).await?;
    Ok(())
}
