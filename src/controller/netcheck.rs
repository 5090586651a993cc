//! Proof that NetworkPolicy is enforced on a node, before a sandbox that relies on it (egress
//! `None` or `Allowlist`) is called Ready there: fail closed.
//!
//! A NetworkPolicy is only an object; whether anything enforces it is the network plugin's
//! business, and a cluster without an engine accepts every policy and enforces none. So, per
//! node and runtime class, the operator runs a check: two pods of its own on that node, a
//! listener and a canary, both serving a page on port [`PORT`]; the canary is under a deny-all
//! egress policy. Enforced = the listener reaches the canary (the two can talk: the control)
//! and the canary does not reach the listener. The verdict is kept in memory
//! ([`Proofs`]): checked when a node is first used, again every
//! `--network-check-interval-seconds` while it is in use, and a failed one again after
//! [`RETRY_FAILED`]. Probes are bounded in count and time and go only to the check's own pods.
//! With `--network-enforcement Attested` the administrator vouches for the cluster and no
//! check runs.
//!
//! The verdict must not be forgeable by anyone but the operator, so:
//! - the check runs in the operator's own namespace (`--network-check-namespace`, else the
//!   leader-election Lease's), never in a sandbox's, where a tenant may create pods and exec;
//! - every check names its pods and policy afresh (a random id), creates them (never reuses a
//!   pod of that name it did not make), serves that id as its page, and trusts a pod only while
//!   it is the very pod it made (its UID) with the spec it made ([`is_ours`]), checked before
//!   and after the probes;
//! - leftovers of a check this operator did not finish (it was killed) are bounded by their
//!   `activeDeadlineSeconds` and deleted before this process's first check ([`Proofs`]).

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use kube::{Client, ResourceExt};
use tracing::{info, warn};

use agentbox_api::crd::Egress;
use agentbox_api::exec::{self, ExecRequest};

/// Label on the check's objects: `listener`, `canary` or `policy`.
pub const LABEL: &str = "agentbox.dev/netcheck";
/// Label on the check's objects: the check's random id.
pub const ID_LABEL: &str = "agentbox.dev/netcheck-id";
/// Label on the check's objects: which operator made them ([`Settings::owner`]).
pub const BY_LABEL: &str = "agentbox.dev/netcheck-by";
/// The port both check pods serve on.
pub const PORT: u16 = 8080;
/// Condition type on a Sandbox: whether its egress policy is known to be enforced on its node.
pub const CONDITION: &str = "NetworkEnforced";
/// Reason: NetworkPolicy is not enforced on the node (the canary reached the listener).
pub const NOT_ENFORCED: &str = "NetworkPolicyNotEnforced";
/// Reason: the check could not tell (its pods could not reach each other, or did not start).
pub const INCONCLUSIVE: &str = "NetworkCheckInconclusive";
/// Reason: the check runs.
pub const CHECKING: &str = "NetworkCheckPending";
/// A failed verdict is checked again this long after it was reached (when a sandbox asks).
pub const RETRY_FAILED: Duration = Duration::from_secs(5);
/// Name prefix of the check's pods and policy.
const PREFIX: &str = "agentbox-netcheck";
/// How many times a probe is tried (policy programming takes a moment), and the pause between.
const PROBES: u32 = 12;
const PROBE_PAUSE: Duration = Duration::from_millis(1000);
/// How long the check waits for its pods to run.
const POD_WAIT: Duration = Duration::from_secs(90);
/// The longest a check pod lives: the kubelet stops it then, even if the operator that made it
/// was killed mid-check (a check takes at most [`POD_WAIT`] plus its probes, under 4 minutes).
const POD_DEADLINE_SECONDS: i64 = 600;

/// Errors of a check (each ends it inconclusive).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// An API call failed.
    #[error("API: {0}")]
    Kube(#[from] kube::Error),
    /// A check pod did not run in time.
    #[error("check pod {0} did not run within {1:?}")]
    PodNotRunning(String, Duration),
    /// An object of the check's fresh name existed before the check made it.
    #[error("{0} already existed, made by someone else: the check does not use it")]
    Planted(String),
    /// A check pod is gone, ended, or is no longer the pod (UID and spec) the check made.
    #[error("check pod {0} is gone or not the pod the check made: the check does not trust it")]
    NotOurs(String),
}

/// What is in force for one sandbox's pod, as far as its egress needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// Its egress is `All`: nothing to enforce.
    NotNeeded,
    /// The administrator attests enforcement (`--network-enforcement Attested`).
    Attested,
    /// Proven on the pod's node.
    Proven,
    /// A check runs (or was just started): not Ready yet.
    Pending,
    /// Not enforced, or not provable: not Ready, with this reason and message.
    Failed {
        /// Condition reason.
        reason: String,
        /// What happened and what to install.
        message: String,
    },
}

/// The state of one (node, runtime class).
#[derive(Clone, Debug, Default)]
pub struct State {
    /// A check runs.
    pub checking: bool,
    /// The last check that ended: when, and its outcome.
    pub done: Option<(Instant, Verdict)>,
    /// Check again at the next chance, whatever the age of the last verdict (its beacon is
    /// gone).
    pub stale: bool,
    /// The listener of the last check that proved enforcement, kept as the node's beacon.
    pub beacon: Option<Beacon>,
}

/// The listener pod of a check that proved enforcement on a node, kept until the next check
/// there: a destination every pod of that node reaches unless a policy forbids it, so a new
/// pod under a policy that does not admit it shows its own rules in force by failing to
/// reach it ([`release`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Beacon {
    /// The pod as the check made it (for [`is_ours`]).
    pub pod: Pod,
    /// Its UID.
    pub uid: String,
    /// Its IP.
    pub ip: String,
    /// The page it serves (the check's id).
    pub page: String,
}

/// A check's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Enforced.
    Enforced,
    /// Not enforced or not provable: reason and message.
    Not(String, String),
}

/// Key of a verdict: node and runtime class (`None`: the node's default runtime).
type Key = (String, Option<String>);

/// The verdicts of this process, shared by the controllers.
#[derive(Clone, Default)]
pub struct Proofs {
    inner: Arc<Mutex<HashMap<Key, State>>>,
    /// Leftovers of checks of an earlier process of this operator are deleted once, before
    /// this process's first check.
    swept: Arc<tokio::sync::OnceCell<()>>,
}

/// Where and how the checks run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `Attested`: no checks.
    pub attested: bool,
    /// The checks' namespace: the operator's own (`--network-check-namespace`, else the
    /// namespace of its leader-election Lease), never a sandbox's.
    pub namespace: String,
    /// Image of the check pods (`sh`, `mkdir`, `httpd`, `nc`).
    pub image: String,
    /// Re-check interval of a proven node.
    pub interval: Duration,
    /// Value of [`BY_LABEL`]: this operator (its Lease), so that its start-up sweep deletes
    /// only its own leftovers where several operators share a namespace.
    pub owner: String,
}

impl Settings {
    /// From the operator's configuration.
    pub fn from_config(c: &crate::config::Config) -> Self {
        let namespace = match c.network_check_namespace.trim() {
            "" => c.lease_namespace().to_string(),
            ns => ns.to_string(),
        };
        Settings {
            attested: c.network_enforcement == "Attested",
            namespace,
            image: c.network_check_image.clone(),
            interval: Duration::from_secs(c.network_check_interval_seconds),
            owner: short_hash(&[c.lease_namespace(), &c.leader_election_name]),
        }
    }
}

/// A short hex digest of `parts` (a label value).
fn short_hash(parts: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    h.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A fresh, unguessable id for one check (128 random bits).
fn fresh_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The names of one check's objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Names {
    /// The check's id (also the page its pods serve).
    pub id: String,
    /// The listener pod.
    pub listener: String,
    /// The canary pod.
    pub canary: String,
    /// The deny-all egress policy over the canary.
    pub policy: String,
}

impl Names {
    /// The names of the check `id`.
    pub fn new(id: &str) -> Self {
        Names {
            id: id.to_string(),
            listener: format!("{PREFIX}-{id}-l"),
            canary: format!("{PREFIX}-{id}-c"),
            policy: format!("{PREFIX}-{id}"),
        }
    }
}

/// What the state of a node means for a sandbox, and whether to start a check (pure). While
/// a check runs, the verdict before it stands: a proven node's sandboxes stay Ready through
/// its periodic re-check.
pub fn judge(state: Option<&State>, interval: Duration, now: Instant) -> (Gate, bool) {
    let Some(state) = state else {
        return (Gate::Pending, true);
    };
    let Some((at, verdict)) = &state.done else {
        return (Gate::Pending, !state.checking);
    };
    let age = now.saturating_duration_since(*at);
    match verdict {
        Verdict::Enforced => (
            Gate::Proven,
            !state.checking && (state.stale || age >= interval),
        ),
        Verdict::Not(reason, message) => (
            Gate::Failed {
                reason: reason.clone(),
                message: message.clone(),
            },
            !state.checking && age >= RETRY_FAILED,
        ),
    }
}

impl Proofs {
    /// The gate for a pod on `node` under runtime class `rc` whose egress is `egress`; starts
    /// a check (in the background) where none is known or the last is due again.
    pub fn gate(
        &self,
        client: &Client,
        settings: &Settings,
        egress: Egress,
        node: &str,
        rc: Option<&str>,
    ) -> Gate {
        if egress == Egress::All {
            return Gate::NotNeeded;
        }
        if settings.attested {
            return Gate::Attested;
        }
        let key: Key = (node.to_string(), rc.map(str::to_string));
        let (gate, start) = {
            let Ok(mut map) = self.inner.lock() else {
                return Gate::Pending;
            };
            let (gate, start) = judge(map.get(&key), settings.interval, Instant::now());
            if start {
                map.entry(key.clone()).or_default().checking = true;
            }
            (gate, start)
        };
        if start {
            let (client, settings, proofs) = (client.clone(), settings.clone(), self.clone());
            tokio::spawn(async move {
                proofs.swept.get_or_init(|| sweep(&client, &settings)).await;
                let (verdict, beacon) =
                    match check(&client, &settings, &key.0, key.1.as_deref()).await {
                        Ok(v) => v,
                        Err(e) => (
                            Verdict::Not(
                                INCONCLUSIVE.into(),
                                format!(
                                    "the NetworkPolicy check on node {} could not finish ({e}); \
                                     sandboxes that rely on NetworkPolicy wait there",
                                    key.0
                                ),
                            ),
                            None,
                        ),
                    };
                match &verdict {
                    Verdict::Enforced => {
                        info!(node = %key.0, runtime = ?key.1, "NetworkPolicy enforcement proven")
                    }
                    Verdict::Not(reason, message) => {
                        warn!(node = %key.0, runtime = ?key.1, %reason, "{message}")
                    }
                }
                let old = match proofs.inner.lock() {
                    Ok(mut map) => {
                        let state = map.entry(key).or_default();
                        let old = std::mem::replace(&mut state.beacon, beacon);
                        state.checking = false;
                        state.stale = false;
                        state.done = Some((Instant::now(), verdict));
                        old
                    }
                    Err(_) => None,
                };
                // The node's new beacon (or none) takes the old one's place.
                if let Some(old) = old {
                    let pods: Api<Pod> = Api::namespaced(client.clone(), &settings.namespace);
                    delete_own(&pods, &old.pod.name_any(), &old.uid).await;
                }
            });
        }
        gate
    }

    /// The beacon of `node` under `rc`: the listener of the check that proved enforcement
    /// there, if it is kept.
    pub fn beacon(&self, node: &str, rc: Option<&str>) -> Option<Beacon> {
        let map = self.inner.lock().ok()?;
        map.get(&(node.to_string(), rc.map(str::to_string)))?
            .beacon
            .clone()
    }

    /// Marks the beacon of `node` under `rc` gone: the next ask starts a check (its verdict
    /// stands meanwhile), which keeps a new one.
    pub fn beacon_gone(&self, node: &str, rc: Option<&str>) {
        if let Ok(mut map) = self.inner.lock()
            && let Some(state) = map.get_mut(&(node.to_string(), rc.map(str::to_string)))
        {
            state.stale = true;
        }
    }
}

/// Labels of a check's object of `role`.
fn labels(settings: &Settings, names: &Names, role: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL.to_string(), role.to_string()),
        (ID_LABEL.to_string(), names.id.clone()),
        (BY_LABEL.to_string(), settings.owner.clone()),
    ])
}

/// The deny-all egress policy over the canary of the check `names`.
pub fn canary_policy(settings: &Settings, names: &Names) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(names.policy.clone()),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels(settings, names, "policy")),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([
                    (LABEL.to_string(), "canary".to_string()),
                    (ID_LABEL.to_string(), names.id.clone()),
                ])),
                ..Default::default()
            }),
            policy_types: Some(vec!["Egress".into()]),
            egress: Some(vec![]),
            ingress: None,
        }),
    }
}

/// A check pod (`role`: listener or canary) on `node` under `rc`: it serves the check's id as
/// its page on [`PORT`] as an unprivileged user, with no token and no capabilities, for at
/// most [`POD_DEADLINE_SECONDS`].
pub fn check_pod(
    settings: &Settings,
    names: &Names,
    role: &str,
    node: &str,
    rc: Option<&str>,
) -> Pod {
    let name = if role == "canary" {
        &names.canary
    } else {
        &names.listener
    };
    let script = format!(
        "mkdir -p /tmp/w && echo {} > /tmp/w/index.html && exec httpd -f -p {PORT} -h /tmp/w",
        names.id
    );
    // A proof's listener may live on as the node's beacon until the next check there.
    let deadline = match role {
        "listener" => POD_DEADLINE_SECONDS
            .saturating_add(i64::try_from(settings.interval.as_secs()).unwrap_or(i64::MAX / 2)),
        _ => POD_DEADLINE_SECONDS,
    };
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": settings.namespace,
                     "labels": labels(settings, names, role)},
        "spec": {
            "nodeName": node,
            "runtimeClassName": rc,
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "terminationGracePeriodSeconds": 1,
            "activeDeadlineSeconds": deadline,
            "restartPolicy": "Never",
            "tolerations": [{"operator": "Exists"}],
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534,
                                 "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "check",
                "image": settings.image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", script],
                "resources": {"requests": {"cpu": "5m", "memory": "8Mi"},
                               "limits": {"cpu": "100m", "memory": "32Mi"}},
                "securityContext": {"allowPrivilegeEscalation": false,
                                    "capabilities": {"drop": ["ALL"]}}
            }]
        }
    }))
    .unwrap_or_default()
}

/// Whether `seen` is the pod the check made, `made` as the API server returned it from the
/// create, UID `uid`: the same object (UID), not being deleted, and still with the spec it was
/// made with (node, runtime class, image, command, security context: a container's image is
/// the one part of a pod spec an update may change; no ephemeral container added). Anything
/// else, a pod planted under the name or one put in its place, decides nothing (pure).
pub fn is_ours(made: &Pod, uid: &str, seen: &Pod) -> bool {
    if uid.is_empty() || seen.metadata.uid.as_deref() != Some(uid) {
        return false;
    }
    if seen.metadata.deletion_timestamp.is_some() || seen.metadata.name != made.metadata.name {
        return false;
    }
    let (Some(m), Some(s)) = (made.spec.as_ref(), seen.spec.as_ref()) else {
        return false;
    };
    let same_containers = m.containers.len() == s.containers.len()
        && m.containers.iter().zip(&s.containers).all(|(a, b)| {
            a.name == b.name
                && a.image == b.image
                && a.command == b.command
                && a.args == b.args
                && a.security_context == b.security_context
        });
    same_containers
        && s.init_containers.as_ref().is_none_or(Vec::is_empty)
        && s.ephemeral_containers.as_ref().is_none_or(Vec::is_empty)
        && m.node_name == s.node_name
        && m.runtime_class_name == s.runtime_class_name
        && m.host_network.unwrap_or(false) == s.host_network.unwrap_or(false)
}

/// What a read of a check pod means: its IP once it runs, `None` while it starts (pure).
pub fn running_ip(made: &Pod, uid: &str, seen: Option<&Pod>) -> Result<Option<String>, CheckError> {
    let name = made.metadata.name.clone().unwrap_or_default();
    let Some(p) = seen.filter(|p| is_ours(made, uid, p)) else {
        return Err(CheckError::NotOurs(name));
    };
    let status = p.status.as_ref();
    match (
        status.and_then(|s| s.phase.as_deref()).unwrap_or(""),
        status.and_then(|s| s.pod_ip.clone()),
    ) {
        ("Running", Some(ip)) => Ok(Some(ip)),
        ("Succeeded" | "Failed", _) => Err(CheckError::NotOurs(name)),
        _ => Ok(None),
    }
}

/// Name of the init container that holds a cold sandbox pod's own containers until its own
/// rules are in force ([`release`]).
pub const WAIT_CONTAINER: &str = "network-wait";
/// What [`WAIT_CONTAINER`] runs: it ends once [`release`] made its file.
const WAIT_SCRIPT: &str = "until [ -e /tmp/agentbox-network-released ]; do sleep 0.05; done";
/// [`release`]'s probe: fetch the beacon's page (`$1`:`$2`, page `$3`) until that fails, at
/// most `$4` times, then release; exit 3 while the beacon is still reached.
const RELEASE_SCRIPT: &str = r#"i=0
while printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 1 "$1" "$2" 2>/dev/null | grep -qx -- "$3"; do
  i=$((i+1)); [ "$i" -lt "$4" ] || exit 3
  sleep 0.05
done
: > /tmp/agentbox-network-released"#;
/// How many fetches one [`release`] tries before it gives the reconcile back.
const RELEASE_TRIES: u32 = 40;

/// The init container that holds a cold sandbox pod whose egress relies on enforcement: the
/// pod's network namespace (and so its policy) is the sandbox's, and its containers start
/// only after this one ends, which [`release`] allows once the pod fails to reach its node's
/// beacon: the pod's own rules are in force before any code of the sandbox runs. Image: the
/// check's (`sh`, `nc`, `grep`); unprivileged, small, no token.
pub fn wait_container(image: &str) -> k8s_openapi::api::core::v1::Container {
    serde_json::from_value(serde_json::json!({
        "name": WAIT_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", WAIT_SCRIPT],
        "resources": {"requests": {"cpu": "5m", "memory": "8Mi"},
                       "limits": {"cpu": "100m", "memory": "32Mi"}},
        "securityContext": {"runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534,
                            "allowPrivilegeEscalation": false,
                            "capabilities": {"drop": ["ALL"]}}
    }))
    .unwrap_or_default()
}

/// Whether `pod`'s [`WAIT_CONTAINER`] runs: the pod waits for [`release`].
pub fn waiting(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.name == WAIT_CONTAINER && c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

/// Whether `network`'s allowlist admits TCP to `ip`:`port` (pure): then a pod under it
/// reaches the beacon whether or not its rules are in force, and the beacon proves nothing.
pub fn admits(network: &agentbox_api::crd::Network, default: Egress, ip: &str, port: u16) -> bool {
    use agentbox_api::crd::PortProtocol;
    match network.egress_or(default) {
        Egress::All => return true,
        Egress::Denied => return false,
        Egress::Allowlist => {}
    }
    let Ok(ip) = ip.parse::<std::net::IpAddr>() else {
        return false;
    };
    network.allow.iter().any(|a| {
        a.cidr.as_deref().is_some_and(|c| cidr_contains(c, ip))
            && (a.ports.is_empty()
                || a.ports.iter().any(|p| {
                    p.protocol == PortProtocol::Tcp
                        && i32::from(port) >= p.port
                        && i32::from(port) <= p.end_port.unwrap_or(p.port)
                }))
    })
}

/// Whether the block `cidr` holds `ip` (pure; a malformed block holds nothing).
fn cidr_contains(cidr: &str, ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    let Some((net, len)) = cidr.split_once('/') else {
        return false;
    };
    let (Ok(net), Ok(len)) = (net.parse::<IpAddr>(), len.parse::<u32>()) else {
        return false;
    };
    let bits = |a: IpAddr| match a {
        IpAddr::V4(v) => (u128::from(u32::from(v)), 32),
        IpAddr::V6(v) => (u128::from(v), 128),
    };
    let ((n, width), (i, iw)) = (bits(net), bits(ip));
    if width != iw || len > width {
        return false;
    }
    let shift = width - len;
    shift >= 128 || (n >> shift) == (i >> shift)
}

/// Whether `beacon` is still the running pod its check made (a dead one is refused by
/// everyone, which would prove nothing).
pub async fn beacon_alive(checks: &Api<Pod>, beacon: &Beacon) -> bool {
    match checks.get_opt(&beacon.pod.name_any()).await {
        Ok(seen) => matches!(
            running_ip(&beacon.pod, &beacon.uid, seen.as_ref()),
            Ok(Some(ip)) if ip == beacon.ip
        ),
        Err(_) => false,
    }
}

/// Lets the pod `pod`'s [`WAIT_CONTAINER`] end: with `beacon`, only once the pod fails to
/// fetch the beacon's page (its own rules are in force); without, at once (its egress relies
/// on nothing, enforcement is attested, or its allowlist admits the beacon). `false`: not
/// released (the beacon is still reached, or the exec failed), ask again.
pub async fn release(pods: &Api<Pod>, pod: &str, beacon: Option<&Beacon>) -> bool {
    let argv: Vec<String> = match beacon {
        Some(b) => [
            "sh",
            "-c",
            RELEASE_SCRIPT,
            "sh",
            &b.ip,
            &PORT.to_string(),
            &b.page,
        ]
        .into_iter()
        .map(String::from)
        .chain([RELEASE_TRIES.to_string()])
        .collect(),
        None => ["sh", "-c", ": > /tmp/agentbox-network-released"]
            .into_iter()
            .map(String::from)
            .collect(),
    };
    let req = ExecRequest::argv(argv)
        .timeout(Duration::from_secs(30))
        .max_output(4096);
    match exec::run(pods, pod, WAIT_CONTAINER, req).await {
        Ok(out) => out.success(),
        Err(e) => {
            // Also when the pod's cached state is behind: its wait has ended already.
            tracing::debug!(pod = %pod, error = %e, "could not release a pod's network wait");
            false
        }
    }
}

/// Creates `pod` (never adopts one of its name: with a fresh name, an existing one was
/// planted) and returns it as the API server made it (after admission, which may have
/// rewritten an image or added defaults: later reads are compared with this) and its UID.
async fn create_pod(api: &Api<Pod>, pod: &Pod) -> Result<(Pod, String), CheckError> {
    match api.create(&PostParams::default(), pod).await {
        Ok(p) => {
            let uid = p.uid().unwrap_or_default();
            Ok((p, uid))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            Err(CheckError::Planted(format!("pod {}", pod.name_any())))
        }
        Err(e) => Err(e.into()),
    }
}

/// The IP of the check's pod `made` (UID `uid`) once it runs.
async fn running_pod(api: &Api<Pod>, made: &Pod, uid: &str) -> Result<String, CheckError> {
    let t0 = Instant::now();
    loop {
        let seen = api.get_opt(&made.name_any()).await?;
        if let Some(ip) = running_ip(made, uid, seen.as_ref())? {
            return Ok(ip);
        }
        if t0.elapsed() > POD_WAIT {
            return Err(CheckError::PodNotRunning(made.name_any(), POD_WAIT));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Whether pod `from` fetches the page `page` of `ip` (one try, of at most 2 s). With `nc`:
/// the static busybox's `wget` looks up the `http` service through NSS, which it cannot load.
async fn reaches(api: &Api<Pod>, from: &str, ip: &str, page: &str) -> bool {
    let script = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {ip} {PORT}");
    let req = ExecRequest::shell(script)
        .timeout(Duration::from_secs(5))
        .max_output(1024);
    match exec::run(api, from, "check", req).await {
        Ok(out) => out.stdout_str().lines().last().map(str::trim) == Some(page),
        Err(_) => false,
    }
}

/// Deletes the pod `name` if it is still the one of UID `uid` (never a pod of the name that
/// someone else made).
async fn delete_own(api: &Api<Pod>, name: &str, uid: &str) {
    let gone = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &gone).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => warn!(pod = %name, error = %e, "could not delete a network check pod"),
    }
}

/// Deletes what checks of an earlier process of this operator left in its namespace (it was
/// killed mid-check): pods and policies with this operator's [`BY_LABEL`]. Runs before this
/// process's first check, so none of its own checks runs yet.
pub async fn sweep(client: &Client, settings: &Settings) {
    let selector = format!("{LABEL},{BY_LABEL}={}", settings.owner);
    let lp = ListParams::default().labels(&selector);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &settings.namespace);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &settings.namespace);
    match pods.list(&lp).await {
        Ok(list) => {
            for p in list {
                delete_own(&pods, &p.name_any(), &p.uid().unwrap_or_default()).await;
            }
        }
        Err(e) => warn!(error = %e, "could not list earlier network check pods"),
    }
    match policies.list(&lp).await {
        Ok(list) => {
            for p in list {
                match policies
                    .delete(&p.name_any(), &DeleteParams::default())
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => warn!(error = %e, "could not delete an earlier network check policy"),
                }
            }
        }
        Err(e) => warn!(error = %e, "could not list earlier network check policies"),
    }
}

/// The check itself, on `node` under `rc`, with fresh objects in the operator's namespace.
pub async fn check(
    client: &Client,
    settings: &Settings,
    node: &str,
    rc: Option<&str>,
) -> Result<(Verdict, Option<Beacon>), CheckError> {
    let ns = settings.namespace.as_str();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    let names = Names::new(&fresh_id());
    match policies
        .create(&PostParams::default(), &canary_policy(settings, &names))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {
            return Err(CheckError::Planted(format!(
                "NetworkPolicy {}",
                names.policy
            )));
        }
        Err(e) => return Err(e.into()),
    }
    let mut made: Vec<(String, String)> = Vec::new();
    let result = async {
        let (listener, luid) =
            create_pod(&pods, &check_pod(settings, &names, "listener", node, rc)).await?;
        made.push((names.listener.clone(), luid.clone()));
        let (canary, cuid) =
            create_pod(&pods, &check_pod(settings, &names, "canary", node, rc)).await?;
        made.push((names.canary.clone(), cuid.clone()));
        let (verdict, lip) = probe(
            &pods,
            ns,
            node,
            rc,
            &names,
            (&listener, &luid),
            (&canary, &cuid),
        )
        .await?;
        // The listener of a proof stays as the node's beacon (see [`Beacon`]).
        let beacon = (verdict == Verdict::Enforced).then(|| Beacon {
            pod: listener,
            uid: luid,
            ip: lip,
            page: names.id.clone(),
        });
        Ok((verdict, beacon))
    }
    .await;
    // The check's pods and policy go after each check, whatever its verdict (the next check
    // makes new ones), but for a proof's listener, kept as the node's beacon. Only the pods it
    // made (their UIDs).
    let kept = result
        .as_ref()
        .ok()
        .and_then(|(_, b)| b.as_ref())
        .map(|b| b.uid.clone());
    for (name, uid) in &made {
        if kept.as_ref() != Some(uid) {
            delete_own(&pods, name, uid).await;
        }
    }
    match policies
        .delete(&names.policy, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => warn!(error = %e, "could not delete the network check's policy"),
    }
    result
}

/// The probes of [`check`] between its two pods (each with the UID the check got back).
async fn probe(
    pods: &Api<Pod>,
    ns: &str,
    node: &str,
    rc: Option<&str>,
    names: &Names,
    (listener, luid): (&Pod, &str),
    (canary, cuid): (&Pod, &str),
) -> Result<(Verdict, String), CheckError> {
    let (lip, cip) = tokio::try_join!(
        running_pod(pods, listener, luid),
        running_pod(pods, canary, cuid),
    )?;
    let (lname, cname) = (names.listener.as_str(), names.canary.as_str());
    let mut control = false;
    for _ in 0..PROBES {
        if reaches(pods, lname, &cip, &names.id).await {
            control = true;
            break;
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
    let mut enforced = false;
    if control {
        for _ in 0..PROBES {
            if !reaches(pods, cname, &lip, &names.id).await {
                enforced = true;
                break;
            }
            tokio::time::sleep(PROBE_PAUSE).await;
        }
    }
    // The execs went to the pods of these names: the verdict stands only if those were the
    // pods the check made, then and now (a pod replaced in between has a new UID, and one
    // whose image was changed fails the spec comparison).
    for (made, uid) in [(listener, luid), (canary, cuid)] {
        let seen = pods.get_opt(&made.name_any()).await?;
        if seen.as_ref().is_none_or(|p| !is_ours(made, uid, p)) {
            return Err(CheckError::NotOurs(made.name_any()));
        }
    }
    if !control {
        return Ok((
            Verdict::Not(
                INCONCLUSIVE.into(),
                format!(
                    "the NetworkPolicy check on node {node}: its listener pod could not reach its \
                 canary pod (pod {cname} in namespace {ns}), so enforcement cannot be proven there"
                ),
            ),
            lip,
        ));
    }
    if enforced {
        return Ok((Verdict::Enforced, lip));
    }
    Ok((
        Verdict::Not(
            NOT_ENFORCED.into(),
            format!(
                "NetworkPolicy is not enforced on node {node}{}: a pod under a deny-all egress \
             policy (pod {cname} in namespace {ns}) still reached another pod. Install a \
             network plugin that enforces NetworkPolicy (for example Calico, Cilium, or \
             kube-router's firewall), or, if it is enforced, set network.enforcement: Attested \
             in the agentbox Helm values",
                rc.map(|r| format!(" under runtime class {r}"))
                    .unwrap_or_default()
            ),
        ),
        lip,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(at: Instant, verdict: Verdict) -> State {
        State {
            done: Some((at, verdict)),
            ..State::default()
        }
    }

    #[test]
    fn nothing_known_starts_a_check_and_waits() {
        let now = Instant::now();
        assert_eq!(
            judge(None, Duration::from_secs(60), now),
            (Gate::Pending, true)
        );
        let first = State {
            checking: true,
            ..State::default()
        };
        assert_eq!(
            judge(Some(&first), Duration::from_secs(60), now),
            (Gate::Pending, false)
        );
    }

    #[test]
    fn a_proof_holds_and_is_checked_again_when_due() {
        let at = Instant::now();
        let mut state = done(at, Verdict::Enforced);
        let i = Duration::from_secs(60);
        assert_eq!(
            judge(Some(&state), i, at + Duration::from_secs(1)),
            (Gate::Proven, false)
        );
        assert_eq!(judge(Some(&state), i, at + i), (Gate::Proven, true));
        // Its re-check runs: the node stays proven (its Ready sandboxes stay Ready) and no
        // second check starts.
        state.checking = true;
        assert_eq!(judge(Some(&state), i, at + i), (Gate::Proven, false));
        // A beacon found gone asks for a check before the interval is up.
        state.checking = false;
        state.stale = true;
        assert_eq!(
            judge(Some(&state), i, at + Duration::from_secs(1)),
            (Gate::Proven, true)
        );
    }

    #[test]
    fn a_failure_keeps_the_sandbox_waiting_and_is_retried_soon() {
        let at = Instant::now();
        let mut state = done(at, Verdict::Not(NOT_ENFORCED.into(), "install one".into()));
        let (gate, again) = judge(Some(&state), Duration::from_secs(300), at);
        assert!(matches!(gate, Gate::Failed { ref reason, .. } if reason == NOT_ENFORCED));
        assert!(!again);
        let (_, again) = judge(Some(&state), Duration::from_secs(300), at + RETRY_FAILED);
        assert!(again);
        state.checking = true;
        let (gate, again) = judge(Some(&state), Duration::from_secs(300), at + RETRY_FAILED);
        assert!(matches!(gate, Gate::Failed { .. }) && !again);
    }

    #[test]
    fn an_allowlist_admits_the_beacon_only_by_block_and_tcp_port() {
        let net = |v: serde_json::Value| -> agentbox_api::crd::Network {
            serde_json::from_value(v).unwrap_or_default()
        };
        let none = net(serde_json::json!({"egress": "None"}));
        assert!(!admits(&none, Egress::All, "10.1.2.3", 8080));
        assert!(admits(
            &net(serde_json::json!({})),
            Egress::All,
            "10.1.2.3",
            8080
        ));
        assert!(!admits(
            &net(serde_json::json!({})),
            Egress::Denied,
            "10.1.2.3",
            8080
        ));
        let list = |allow: serde_json::Value| {
            net(serde_json::json!({"egress": "Allowlist", "allow": allow}))
        };
        let d = Egress::Denied;
        assert!(admits(
            &list(serde_json::json!([{"cidr": "10.0.0.0/8"}])),
            d,
            "10.1.2.3",
            8080
        ));
        assert!(!admits(
            &list(serde_json::json!([{"cidr": "10.2.0.0/16"}])),
            d,
            "10.1.2.3",
            8080
        ));
        assert!(admits(
            &list(
                serde_json::json!([{"cidr": "10.1.2.3/32", "ports": [{"port": 8000, "endPort": 9000}]}])
            ),
            d,
            "10.1.2.3",
            8080
        ));
        assert!(!admits(
            &list(serde_json::json!([{"cidr": "10.1.2.3/32", "ports": [{"port": 443}]}])),
            d,
            "10.1.2.3",
            8080
        ));
        assert!(!admits(
            &list(
                serde_json::json!([{"cidr": "10.1.2.3/32", "ports": [{"port": 8080, "protocol": "UDP"}]}])
            ),
            d,
            "10.1.2.3",
            8080
        ));
        assert!(admits(
            &list(serde_json::json!([{"cidr": "0.0.0.0/0"}])),
            d,
            "10.1.2.3",
            8080
        ));
        assert!(!admits(
            &list(serde_json::json!([{"cidr": "::/0"}])),
            d,
            "10.1.2.3",
            8080
        ));
        assert!(admits(
            &list(serde_json::json!([{"cidr": "fd00::/8"}])),
            d,
            "fd00::5",
            8080
        ));
        assert!(!admits(
            &list(serde_json::json!([{"cidr": "10.1.2.3/33"}])),
            d,
            "10.1.2.3",
            8080
        ));
    }

    #[test]
    fn the_network_wait_holds_until_released_and_is_unprivileged() {
        let c = wait_container("busybox");
        assert_eq!(c.name, WAIT_CONTAINER);
        assert_eq!(c.image.as_deref(), Some("busybox"));
        let sc = c.security_context.clone().unwrap_or_default();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert!(WAIT_SCRIPT.contains("/tmp/agentbox-network-released"));
        assert!(RELEASE_SCRIPT.ends_with(": > /tmp/agentbox-network-released"));
        let pod = |state: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "status": {
                "initContainerStatuses": [{"name": WAIT_CONTAINER, "image": "busybox", "imageID": "",
                    "ready": false, "restartCount": 0, "state": state}]}}))
            .unwrap_or_default()
        };
        assert!(waiting(&pod(serde_json::json!({"running": {}}))));
        assert!(!waiting(&pod(
            serde_json::json!({"waiting": {"reason": "PodInitializing"}})
        )));
        assert!(!waiting(&pod(
            serde_json::json!({"terminated": {"exitCode": 0}})
        )));
        assert!(!waiting(&Pod::default()));
    }

    fn settings() -> Settings {
        Settings {
            attested: false,
            namespace: "ops".into(),
            image: "busybox".into(),
            interval: Duration::from_secs(300),
            owner: "abc".into(),
        }
    }

    #[test]
    fn the_canary_policy_denies_all_egress_of_this_checks_canary_only() {
        let names = Names::new("id1");
        let p = canary_policy(&settings(), &names);
        assert_eq!(p.metadata.name.as_deref(), Some(names.policy.as_str()));
        assert_eq!(p.metadata.namespace.as_deref(), Some("ops"));
        let spec = p.spec.unwrap_or_default();
        assert_eq!(spec.egress, Some(vec![]));
        assert_eq!(spec.policy_types, Some(vec!["Egress".to_string()]));
        let sel = spec
            .pod_selector
            .and_then(|s| s.match_labels)
            .unwrap_or_default();
        assert_eq!(sel.get(LABEL).map(String::as_str), Some("canary"));
        assert_eq!(sel.get(ID_LABEL).map(String::as_str), Some("id1"));
    }

    #[test]
    fn check_pods_are_pinned_unprivileged_bounded_and_under_the_runtime_class() {
        let names = Names::new("id1");
        let p = check_pod(&settings(), &names, "canary", "node-a", Some("gvisor"));
        assert_eq!(p.metadata.name.as_deref(), Some(names.canary.as_str()));
        assert_eq!(p.metadata.namespace.as_deref(), Some("ops"));
        let labels = p.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get(BY_LABEL).map(String::as_str), Some("abc"));
        let spec = p.spec.unwrap_or_default();
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert_eq!(spec.active_deadline_seconds, Some(POD_DEADLINE_SECONDS));
        let c = &spec.containers[0];
        let sc = c.security_context.clone().unwrap_or_default();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        // The page it serves is the check's id, not a constant a planted pod could know.
        assert!(c.command.clone().unwrap_or_default()[2].contains("echo id1 >"));
    }

    #[test]
    fn every_check_has_fresh_unguessable_names() {
        let (a, b) = (fresh_id(), fresh_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        let n = Names::new(&a);
        for name in [&n.listener, &n.canary, &n.policy] {
            assert!(name.contains(&a), "{name}");
            assert!(agentbox_api::names::is_object_name(name), "{name}");
            assert!(name.len() <= 63, "{name}");
        }
        assert_ne!(Names::new(&a).listener, Names::new(&b).listener);
    }

    #[test]
    fn the_checks_namespace_is_the_operators_own_never_a_sandboxs() {
        use clap::Parser;
        let c = crate::config::Config::parse_from(["op", "--namespace", "team-a"]);
        assert_eq!(Settings::from_config(&c).namespace, "team-a");
        let c = crate::config::Config::parse_from(["op"]);
        assert_eq!(Settings::from_config(&c).namespace, "default");
        let c = crate::config::Config::parse_from([
            "op",
            "--namespace",
            "team-a",
            "--leader-election-namespace",
            "agentbox-system",
        ]);
        let s = Settings::from_config(&c);
        assert_eq!(s.namespace, "agentbox-system");
        let c = crate::config::Config::parse_from(["op", "--network-check-namespace", " checks "]);
        assert_eq!(Settings::from_config(&c).namespace, "checks");
        // Two operators (Leases) sharing a namespace sweep only their own leftovers.
        let other = crate::config::Config::parse_from(["op", "--leader-election-name", "another"]);
        assert_ne!(
            Settings::from_config(&other).owner,
            Settings::from_config(&c).owner
        );
    }

    /// The pod the API server returns for `made`: with a UID and, if `running`, an IP.
    fn served(made: &Pod, uid: &str, running: bool) -> Pod {
        let mut p = made.clone();
        p.metadata.uid = Some(uid.into());
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some(if running { "Running" } else { "Pending" }.into()),
            pod_ip: running.then(|| "10.0.0.9".to_string()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn only_the_pod_the_check_made_decides_anything() {
        let names = Names::new("id1");
        let made = check_pod(&settings(), &names, "listener", "node-a", None);
        let ours = served(&made, "u1", true);
        assert!(is_ours(&made, "u1", &ours));
        assert_eq!(
            running_ip(&made, "u1", Some(&ours))
                .ok()
                .flatten()
                .as_deref(),
            Some("10.0.0.9")
        );
        assert!(matches!(
            running_ip(&made, "u1", Some(&served(&made, "u1", false))),
            Ok(None)
        ));
        // A pod of that name someone else made (planted before, or put in its place after a
        // delete): another UID.
        let planted = served(&made, "u2", true);
        assert!(!is_ours(&made, "u1", &planted));
        assert!(matches!(
            running_ip(&made, "u1", Some(&planted)),
            Err(CheckError::NotOurs(_))
        ));
        // No UID known: nothing is ours.
        assert!(!is_ours(&made, "", &served(&made, "", true)));
        // Gone.
        assert!(matches!(
            running_ip(&made, "u1", None),
            Err(CheckError::NotOurs(_))
        ));
        // Ours, but its image changed (the one mutable part of a container).
        let mut swapped = ours.clone();
        if let Some(s) = swapped.spec.as_mut() {
            s.containers[0].image = Some("evil".into());
        }
        assert!(!is_ours(&made, "u1", &swapped));
        // Ours, but being deleted, or ended.
        let mut deleting = ours.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(!is_ours(&made, "u1", &deleting));
        let mut ended = ours.clone();
        if let Some(st) = ended.status.as_mut() {
            st.phase = Some("Succeeded".into());
        }
        assert!(matches!(
            running_ip(&made, "u1", Some(&ended)),
            Err(CheckError::NotOurs(_))
        ));
        // Ours, with a container added (an ephemeral debug container: exec into it is not
        // the check's probe).
        let mut debugged = ours.clone();
        if let Some(s) = debugged.spec.as_mut() {
            s.ephemeral_containers = Some(vec![Default::default()]);
        }
        assert!(!is_ours(&made, "u1", &debugged));
        // Same name and UID but another node or runtime: not the pod the check asked for.
        let mut elsewhere = ours;
        if let Some(s) = elsewhere.spec.as_mut() {
            s.node_name = Some("node-b".into());
        }
        assert!(!is_ours(&made, "u1", &elsewhere));
    }
}
