//! The controllers against an in-process fake API server, for the scenario tests beside each
//! controller (`controller/sandbox/scenarios.rs`, `controller/snapshot/scenarios.rs`): a
//! reconcile runs for real (its requests, its order of writes, its decisions) in milliseconds,
//! with no cluster. The fake keeps objects by path and answers GET (an object, a list, or
//! 404), PATCH (merge of the body; `/status` merges the status), POST (create), DELETE (pods
//! and objects with finalizers get a deletionTimestamp and stay, the rest go) and the JSON
//! patches of kube's finalizer helper; it records every request so a scenario can assert
//! which writes a transition costs, in which order. Here too: the objects and contexts the
//! scenarios of more than one controller build on.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use clap::Parser;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::{Value, json};

use crate::config::Config;
use crate::controller::context::Context;
use crate::metrics::Metrics;
use agentbox_api::crd::{Sandbox, SandboxSnapshot};

mod loopback;

/// Namespace of every scenario.
pub(crate) const NS: &str = "n";
pub(crate) const SBX: &str = "/apis/agentbox.dev/v1alpha1/namespaces/n/sandboxes";
pub(crate) const SNAPS: &str = "/apis/agentbox.dev/v1alpha1/namespaces/n/sandboxsnapshots";
pub(crate) const PODS: &str = "/api/v1/namespaces/n/pods";
pub(crate) const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/n/events";

/// The fake API server's state.
#[derive(Default)]
pub(crate) struct FakeApi {
    pub(crate) objects: Mutex<BTreeMap<String, Value>>,
    pub(crate) requests: Mutex<Vec<(String, String)>>,
    pub(crate) version: Mutex<u64>,
    /// Someone else's write that lands just before the request `"METHOD path"`: the object
    /// to store and where (a race lost by the reconcile).
    pub(crate) first: Mutex<Option<(String, String, Value)>>,
    /// Requests `"METHOD path"` that reach the fake only after a delay (a slow write).
    pub(crate) slow: Mutex<BTreeMap<String, std::time::Duration>>,
    /// Requests `"METHOD path"` that wait until the test closes their semaphore
    /// ([`FakeApi::hold`]): a write still on its way, for as long as the test needs.
    pub(crate) held: Mutex<BTreeMap<String, Arc<tokio::sync::Semaphore>>>,
    /// Requests `"METHOD path"` answered with this error code instead.
    pub(crate) failing: Mutex<BTreeMap<String, u16>>,
    /// Every Sandbox status written, in order: the Sandbox's path, the status, and the pod it
    /// names as the fake held it at that moment (what a harness reading both would have seen).
    pub(crate) statuses: Mutex<Vec<(String, Value, Option<Value>)>>,
}

/// The entry of a request `"METHOD path"` in one of the fake's maps.
fn entry<T: Clone>(map: &Mutex<BTreeMap<String, T>>, what: &str) -> Option<T> {
    map.lock().expect("fake's map").get(what).cloned()
}

pub(crate) fn status_body(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": if code < 300 { "Success" } else { "Failure" },
        "message": reason, "reason": reason, "code": code})
}

/// Merges `patch` into `target` as a JSON merge patch does (objects key by key, a null
/// removes its key, everything else replaced).
pub(crate) fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl FakeApi {
    pub(crate) fn put(&self, path: &str, obj: Value) {
        let mut obj = obj;
        obj["metadata"]["resourceVersion"] = json!(self.next_version());
        self.objects
            .lock()
            .expect("objects")
            .insert(path.to_string(), obj);
    }

    pub(crate) fn get(&self, path: &str) -> Option<Value> {
        self.objects.lock().expect("objects").get(path).cloned()
    }

    pub(crate) fn next_version(&self) -> String {
        let mut v = self.version.lock().expect("version");
        *v += 1;
        v.to_string()
    }

    /// The writes so far: method and path, in order.
    pub(crate) fn writes(&self) -> Vec<String> {
        self.requests
            .lock()
            .expect("requests")
            .iter()
            .filter(|(m, _)| m != "GET")
            .map(|(m, p)| format!("{m} {p}"))
            .collect()
    }

    /// Holds requests `"METHOD path"` until the returned semaphore is closed.
    pub(crate) fn hold(&self, what: &str) -> Arc<tokio::sync::Semaphore> {
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        self.held
            .lock()
            .expect("held")
            .insert(what.to_string(), gate.clone());
        gate
    }

    /// Whether a request `"METHOD path"` was made.
    pub(crate) fn requested(&self, what: &str) -> bool {
        self.requests
            .lock()
            .expect("requests")
            .iter()
            .any(|(m, p)| format!("{m} {p}") == what)
    }

    pub(crate) fn requests(&self) -> usize {
        self.requests.lock().expect("requests").len()
    }

    pub(crate) fn record(&self, method: &str, path: &str) {
        self.requests
            .lock()
            .expect("requests")
            .push((method.to_string(), path.to_string()));
    }

    pub(crate) fn answer(&self, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
        self.record(method, path);
        if let Some(code) = self
            .failing
            .lock()
            .expect("failing")
            .get(&format!("{method} {path}"))
        {
            return (*code, status_body(*code, "InternalError"));
        }
        let raced = {
            let mut first = self.first.lock().expect("first");
            match first.take() {
                Some((when, at, obj)) if when == format!("{method} {path}") => Some((at, obj)),
                other => {
                    *first = other;
                    None
                }
            }
        };
        if let Some((at, obj)) = raced {
            self.put(&at, obj);
        }
        let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        match method {
            "GET" => self.read(path),
            "POST" => {
                let name = body["metadata"]["name"]
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| self.next_version());
                let at = format!("{path}/{name}");
                // Creates are conditional (the guard relies on it); events may repeat.
                if !path.starts_with(EVENTS) && self.get(&at).is_some() {
                    return (409, status_body(409, "AlreadyExists"));
                }
                self.put(&at, body);
                (201, self.get(&at).unwrap_or_default())
            }
            "PUT" => self.replace(path, body),
            "PATCH" => self.patch(path, &body),
            "DELETE" => self.delete(path, &body),
            _ => (405, status_body(405, "MethodNotAllowed")),
        }
    }

    pub(crate) fn read(&self, path: &str) -> (u16, Value) {
        if let Some(o) = self.get(path) {
            return (200, o);
        }
        // A collection: the objects right below it.
        let prefix = format!("{path}/");
        let objects = self.objects.lock().expect("objects");
        let items: Vec<Value> = objects
            .iter()
            .filter(|(k, _)| k.strip_prefix(&prefix).is_some_and(|r| !r.contains('/')))
            .map(|(_, v)| v.clone())
            .collect();
        let collections = [SBX, SNAPS, PODS];
        if collections.contains(&path) {
            return (
                200,
                json!({"apiVersion": "v1", "kind": "List",
                "metadata": {"resourceVersion": "1"}, "items": items}),
            );
        }
        (404, status_body(404, "NotFound"))
    }

    pub(crate) fn patch(&self, path: &str, body: &Value) -> (u16, Value) {
        if let Some(base) = path.strip_suffix("/status") {
            let Some(mut obj) = self.get(base) else {
                return (404, status_body(404, "NotFound"));
            };
            if base.starts_with(SBX) {
                let named = body["status"]["podName"]
                    .as_str()
                    .and_then(|p| self.get(&format!("{PODS}/{p}")));
                self.statuses.lock().expect("statuses").push((
                    base.to_string(),
                    body["status"].clone(),
                    named,
                ));
            }
            obj["status"] = body["status"].clone();
            self.put(base, obj);
            return (200, self.get(base).unwrap_or_default());
        }
        let mut obj = self.get(path).unwrap_or_else(|| json!({"metadata": {}}));
        // A resourceVersion in a merge patch is a precondition, as on the API server.
        let rv = &body["metadata"]["resourceVersion"];
        if rv.is_string() && rv != &obj["metadata"]["resourceVersion"] {
            return (409, status_body(409, "Conflict"));
        }
        match body {
            // kube's finalizer helper: JSON patches of metadata.finalizers.
            Value::Array(ops) => {
                for op in ops {
                    let p = op["path"].as_str().unwrap_or_default();
                    match (op["op"].as_str(), p) {
                        (Some("add"), "/metadata/finalizers") => {
                            obj["metadata"]["finalizers"] = op["value"].clone();
                        }
                        (Some("add"), "/metadata/finalizers/-") => {
                            let f = &mut obj["metadata"]["finalizers"];
                            if let Some(a) = f.as_array_mut() {
                                a.push(op["value"].clone());
                            }
                        }
                        (Some("remove"), p) if p.starts_with("/metadata/finalizers/") => {
                            obj["metadata"]["finalizers"] = json!([]);
                        }
                        _ => {}
                    }
                }
            }
            body => {
                let mut body = body.clone();
                // An apply owns the whole list it names.
                if let Some(f) = body["metadata"].get("finalizers").cloned() {
                    obj["metadata"]["finalizers"] = f;
                    body["metadata"]
                        .as_object_mut()
                        .map(|m| m.remove("finalizers"));
                }
                merge(&mut obj, &body);
            }
        }
        self.put(path, obj);
        (200, self.get(path).unwrap_or_default())
    }

    /// A replace: refused (409) when the body's resourceVersion is not the stored one.
    pub(crate) fn replace(&self, path: &str, body: Value) -> (u16, Value) {
        let Some(cur) = self.get(path) else {
            return (404, status_body(404, "NotFound"));
        };
        let rv = &body["metadata"]["resourceVersion"];
        if !rv.is_null() && rv != &cur["metadata"]["resourceVersion"] {
            return (409, status_body(409, "Conflict"));
        }
        self.put(path, body);
        (200, self.get(path).unwrap_or_default())
    }

    pub(crate) fn delete(&self, path: &str, options: &Value) -> (u16, Value) {
        let Some(mut obj) = self.get(path) else {
            return (404, status_body(404, "NotFound"));
        };
        let expected_uid = &options["preconditions"]["uid"];
        if !expected_uid.is_null() && obj["metadata"]["uid"] != *expected_uid {
            return (409, status_body(409, "Conflict"));
        }
        let has_finalizers = obj["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        // A pod goes at once only when forced (grace 0); otherwise its kubelet would finish it.
        let forced = options["gracePeriodSeconds"] == json!(0);
        if has_finalizers || (path.starts_with(PODS) && !forced) {
            obj["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            self.put(path, obj);
            return (200, self.get(path).unwrap_or_default());
        }
        self.objects.lock().expect("objects").remove(path);
        (200, status_body(200, "Deleted"))
    }
}

/// A Context whose client talks to `fake`; no store, no helper image.
pub(crate) fn context(fake: Arc<FakeApi>) -> Arc<Context> {
    context_with(fake, None)
}

/// A Context whose client talks to `fake` in-process, with `store`; no helper image.
pub(crate) fn context_with(
    fake: Arc<FakeApi>,
    store: Option<crate::snapshot::store::Store>,
) -> Arc<Context> {
    context_with_pods(fake, store, Vec::new())
}

/// [`context_with`], whose watch of managed pods has seen `pods`.
pub(crate) fn context_with_pods(
    fake: Arc<FakeApi>,
    store: Option<crate::snapshot::store::Store>,
    pods: Vec<k8s_openapi::api::core::v1::Pod>,
) -> Arc<Context> {
    let svc = tower::service_fn(move |req: http::Request<Body>| {
        let fake = fake.clone();
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            let bytes = req.into_body().collect_bytes().await.unwrap_or_default();
            let what = format!("{method} {path}");
            if let Some(d) = entry(&fake.slow, &what) {
                tokio::time::sleep(d).await;
            }
            if let Some(gate) = entry(&fake.held, &what) {
                // Closed: the test lets it through (no permit is ever added).
                let _ = gate.acquire().await;
            }
            let (code, body) = fake.answer(&method, &path, &bytes);
            let resp = http::Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()))
                .expect("response");
            Ok::<_, std::convert::Infallible>(resp)
        }
    });
    context_on(kube::Client::new(svc, NS), store, pods)
}

/// A Context whose client talks to `fake` served over loopback HTTP, so that exec works (see
/// [`served`]), with `store`; no helper image.
pub(crate) async fn served_context(
    fake: Arc<FakeApi>,
    store: Option<crate::snapshot::store::Store>,
) -> Arc<Context> {
    served_context_with_pods(fake, store, Vec::new()).await
}

/// [`served_context`], whose watch of managed pods has seen `pods` (a cache that may trail
/// the fake).
pub(crate) async fn served_context_with_pods(
    fake: Arc<FakeApi>,
    store: Option<crate::snapshot::store::Store>,
    pods: Vec<k8s_openapi::api::core::v1::Pod>,
) -> Arc<Context> {
    context_on(loopback::serve(fake).await, store, pods)
}

pub(crate) fn context_on(
    client: kube::Client,
    store: Option<crate::snapshot::store::Store>,
    pods: Vec<k8s_openapi::api::core::v1::Pod>,
) -> Arc<Context> {
    let (cache, mut writer) = kube::runtime::reflector::store();
    for p in pods {
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(p));
    }
    let config = Config::parse_from([
        "agentbox-operator",
        "--helper-image",
        "",
        "--store-url",
        "",
        "--namespace",
        NS,
        // The scenarios' request sequences are of sandboxes without a NetworkPolicy; the
        // policies and the enforcement gate have tests of their own.
        "--default-egress",
        "All",
    ]);
    Arc::new(Context {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "agentbox-operator".into(),
                instance: None,
            },
        ),
        client,
        config,
        metrics: Arc::new(Metrics::default()),
        store,
        node_roots: crate::controller::memos::Checks::default(),
        refusals: crate::controller::memos::Refusals::default(),
        oom_kills: crate::controller::memos::OomKills::default(),
        usage_reads: crate::controller::memos::Reads::default(),
        sweep: crate::controller::memos::Hints::default(),
        shells: crate::controller::warm_shells::Shells::default(),
        pool_claims: crate::controller::refill_delay::Claims::default(),
        proofs: crate::controller::netcheck::Proofs::default(),
        pods: cache,
        cache: None,
    })
}

pub(crate) fn sandbox(name: &str, spec: Value, meta: Value, status: Value) -> Value {
    let mut s = json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "generation": 1},
        "spec": {"image": "busybox", "scope": {"kind": "Agent", "agent": name}},
    });
    merge(&mut s["spec"], &spec);
    merge(&mut s["metadata"], &meta);
    if !status.is_null() {
        s["status"] = status;
    }
    s
}

/// A sandbox as the operator left it after its first reconcile: finalizer and scope labels.
pub(crate) fn adopted(name: &str, spec: Value, status: Value) -> Value {
    let probe: Sandbox =
        serde_json::from_value(sandbox(name, spec.clone(), json!({}), Value::Null))
            .expect("sandbox");
    let labels = agentbox_api::labels::scope_labels(&probe.spec.scope);
    let meta =
        json!({"finalizers": [crate::controller::sandbox::write::FINALIZER], "labels": labels});
    sandbox(name, spec, meta, status)
}

/// Stores `obj` at `path` and reconciles what the fake now holds there.
pub(crate) async fn reconcile_sandbox(
    fake: &Arc<FakeApi>,
    ctx: &Arc<Context>,
    name: &str,
) -> Action {
    let obj: Sandbox =
        serde_json::from_value(fake.get(&format!("{SBX}/{name}")).expect("stored")).expect("sbx");
    crate::controller::sandbox::reconcile(Arc::new(obj), ctx.clone())
        .await
        .expect("reconcile")
}

/// The pod name of sandbox `name`.
pub(crate) fn pod(name: &str) -> String {
    agentbox_api::labels::pod_name(name)
}

pub(crate) fn event_and_status(name: &str) -> Vec<String> {
    vec![
        format!("POST {EVENTS}"),
        format!("PATCH {SBX}/{name}/status"),
    ]
}

/// A pod of sandbox `name` as the operator would make it now, owned by it, on node `node-1`,
/// its container running and ready.
/// node-1's workspace root as the node-root check leaves it: checked, nosuid and nodev.
pub(crate) fn node_root_checked(ctx: &Context) {
    let found = crate::controller::memos::Found::Checked {
        nosuid: true,
        nodev: true,
        mount: "/".into(),
    };
    ctx.node_roots
        .record("node-1", NS, found, std::time::Instant::now());
}

pub(crate) fn current_pod(ctx: &Context, name: &str, fake: &FakeApi) -> Value {
    let sbx: Sandbox =
        serde_json::from_value(fake.get(&format!("{SBX}/{name}")).expect("stored")).expect("sbx");
    let podcfg = crate::controller::pod::PodConfig::from_config(&ctx.config);
    let mut p =
        serde_json::to_value(crate::controller::pod::build_pod(&sbx, &podcfg, None)).expect("pod");
    p["metadata"]["uid"] = json!("pod-uid");
    p["spec"]["nodeName"] = json!("node-1");
    p["status"] = json!({"phase": "Running", "containerStatuses": [{
        "name": crate::controller::pod::CONTAINER, "ready": true, "restartCount": 0, "image": "busybox",
        "imageID": "", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]});
    fake.put(&node_path("node-1"), node("node-1", "True"));
    p
}

pub(crate) fn node_path(name: &str) -> String {
    format!("/api/v1/nodes/{name}")
}

/// A Node whose Ready condition is `ready` (since long ago).
pub(crate) fn node(name: &str, ready: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        "status": {"conditions": [{"type": "Ready", "status": ready,
            "lastTransitionTime": "2020-01-01T00:00:00Z"}]}})
}

pub(crate) fn snapshot_of(name: &str, sandbox: &str, status: Value) -> Value {
    let mut s = json!({"apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxSnapshot",
        "metadata": {"name": name, "namespace": NS, "uid": format!("snap-{name}"),
            "finalizers": [crate::controller::snapshot::FINALIZER]},
        "spec": {"sandboxRef": {"name": sandbox}}});
    if !status.is_null() {
        s["status"] = status;
    }
    s
}

pub(crate) fn stored_snapshot(fake: &FakeApi, name: &str) -> Arc<SandboxSnapshot> {
    let v = fake.get(&format!("{SNAPS}/{name}")).expect("stored");
    Arc::new(serde_json::from_value(v).expect("a snapshot"))
}

/// A workspace on the host, initialised as the operator leaves one: its marker and a file.
pub(crate) fn host_workspace(name: &str) -> std::path::PathBuf {
    let root =
        std::env::temp_dir().join(format!("agentbox-scenario-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join(agentbox_api::remote::STATE_DIR)).expect("state dir");
    std::fs::write(root.join(agentbox_api::remote::MARKER), "pod-uid\n").expect("marker");
    std::fs::create_dir_all(root.join("src")).expect("src");
    std::fs::write(root.join("src/main.py"), "print('hi')\n").expect("a file");
    root
}

/// A served context, a sandbox `name` whose workspace root is `root` on the host, its pod
/// running, the node root checked: what the sandbox controller needs to reach its init step.
pub(crate) async fn serving_sandbox(
    name: &str,
    root: &std::path::Path,
    workspace: Value,
) -> (Arc<FakeApi>, Arc<Context>, crate::snapshot::store::Store) {
    let fake = Arc::new(FakeApi::default());
    let store = crate::snapshot::store::Store::memory("");
    let ctx = served_context(fake.clone(), Some(store.clone())).await;
    let spec = json!({"workspace": {"root": root.to_string_lossy(),
        "files": [{"path": "notes/todo.txt", "content": "ship it\n"}]}});
    let status = json!({"phase": "Pending", "podName": pod(name), "workspace": workspace});
    fake.put(&format!("{SBX}/{name}"), adopted(name, spec, status));
    fake.put(
        &format!("{PODS}/{}", pod(name)),
        current_pod(&ctx, name, &fake),
    );
    node_root_checked(&ctx);
    (fake, ctx, store)
}

/// The condition `type_` of an object's status.
pub(crate) fn condition(obj: &Value, type_: &str) -> Value {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .cloned()
        .unwrap_or_else(|| panic!("no {type_} condition in {obj:#}"))
}
