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

use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicySpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use tracing::{info, warn};

use agentbox_api::crd::Egress;
use agentbox_api::exec::{self, ExecRequest};

/// Label on the check's pods: `listener` or `canary`.
pub const LABEL: &str = "agentbox.dev/netcheck";
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
/// Field manager of the check's objects.
const MANAGER: &str = "agentbox-netcheck";
/// Name of the deny-all egress policy over the canaries.
pub const POLICY: &str = "agentbox-netcheck-deny-egress";
/// How many times a probe is tried (policy programming takes a moment), and the pause between.
const PROBES: u32 = 12;
const PROBE_PAUSE: Duration = Duration::from_millis(1000);
/// How long the check waits for its pods to run.
const POD_WAIT: Duration = Duration::from_secs(90);

/// Errors of a check (each ends it inconclusive).
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// An API call failed.
    #[error("API: {0}")]
    Kube(#[from] kube::Error),
    /// A check pod did not run in time.
    #[error("check pod {0} did not run within {1:?}")]
    PodNotRunning(String, Duration),
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
#[derive(Clone, Debug)]
pub enum State {
    /// A check runs.
    Checking,
    /// The last check ended `at` with `verdict`.
    Done {
        /// When.
        at: Instant,
        /// Its outcome.
        verdict: Verdict,
    },
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
}

/// Where and how the checks run.
#[derive(Clone, Debug)]
pub struct Settings {
    /// `Attested`: no checks.
    pub attested: bool,
    /// The checks' namespace; `None`: the asking sandbox's.
    pub namespace: Option<String>,
    /// Image of the check pods (`sh`, `mkdir`, `httpd`, `nc`).
    pub image: String,
    /// Re-check interval of a proven node.
    pub interval: Duration,
}

impl Settings {
    /// From the operator's configuration.
    pub fn from_config(c: &crate::config::Config) -> Self {
        Settings {
            attested: c.network_enforcement == "Attested",
            namespace: (!c.network_check_namespace.trim().is_empty())
                .then(|| c.network_check_namespace.trim().to_string()),
            image: c.network_check_image.clone(),
            interval: Duration::from_secs(c.network_check_interval_seconds),
        }
    }
}

/// What a verdict of `age` means for a sandbox, and whether to check again (pure).
pub fn judge(state: Option<&State>, interval: Duration, now: Instant) -> (Gate, bool) {
    match state {
        None => (Gate::Pending, true),
        Some(State::Checking) => (Gate::Pending, false),
        Some(State::Done { at, verdict }) => {
            let age = now.saturating_duration_since(*at);
            match verdict {
                // A proven node stays proven while its periodic re-check runs.
                Verdict::Enforced => (Gate::Proven, age >= interval),
                Verdict::Not(reason, message) => (
                    Gate::Failed {
                        reason: reason.clone(),
                        message: message.clone(),
                    },
                    age >= RETRY_FAILED,
                ),
            }
        }
    }
}

impl Proofs {
    /// The gate for a pod on `node` under runtime class `rc` whose egress is `egress`; starts
    /// a check (in the background) where none is known or the last is due again.
    pub fn gate(
        &self,
        client: &Client,
        settings: &Settings,
        sandbox_ns: &str,
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
                map.insert(key.clone(), State::Checking);
            }
            (gate, start)
        };
        if start {
            let ns = settings
                .namespace
                .clone()
                .unwrap_or_else(|| sandbox_ns.to_string());
            let (client, settings, proofs) = (client.clone(), settings.clone(), self.clone());
            tokio::spawn(async move {
                let verdict = match check(&client, &settings, &ns, &key.0, key.1.as_deref()).await {
                    Ok(v) => v,
                    Err(e) => Verdict::Not(
                        INCONCLUSIVE.into(),
                        format!(
                            "the NetworkPolicy check on node {} could not finish ({e}); \
                             sandboxes that rely on NetworkPolicy wait there",
                            key.0
                        ),
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
                if let Ok(mut map) = proofs.inner.lock() {
                    map.insert(
                        key,
                        State::Done {
                            at: Instant::now(),
                            verdict,
                        },
                    );
                }
            });
        }
        gate
    }
}

/// A short, stable name part for a key (check pods are per node and runtime class).
fn suffix(node: &str, rc: Option<&str>) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(node.as_bytes());
    h.update([0]);
    h.update(rc.unwrap_or("").as_bytes());
    let d = h.finalize();
    d.iter().take(5).map(|b| format!("{b:02x}")).collect()
}

/// The deny-all egress policy over the canaries of `ns`.
pub fn canary_policy(ns: &str) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(POLICY.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([(LABEL.to_string(), "policy".to_string())])),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(LABEL.to_string(), "canary".to_string())])),
                ..Default::default()
            }),
            policy_types: Some(vec!["Egress".into()]),
            egress: Some(vec![]),
            ingress: None,
        }),
    }
}

/// A check pod (`role`: listener or canary) on `node` under `rc`: it serves a page on
/// [`PORT`] as an unprivileged user, with no token and no capabilities.
pub fn check_pod(
    name: &str,
    ns: &str,
    role: &str,
    node: &str,
    rc: Option<&str>,
    image: &str,
) -> Pod {
    let script = format!(
        "mkdir -p /tmp/w && echo ok > /tmp/w/index.html && exec httpd -f -p {PORT} -h /tmp/w"
    );
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {LABEL: role}},
        "spec": {
            "nodeName": node,
            "runtimeClassName": rc,
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "terminationGracePeriodSeconds": 1,
            "tolerations": [{"operator": "Exists"}],
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65534, "runAsGroup": 65534,
                                 "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "check",
                "image": image,
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

/// The pod `pod`, made if missing (or replaced when it ended), once it runs with an IP.
async fn running_pod(api: &Api<Pod>, pod: Pod) -> Result<String, CheckError> {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let t0 = Instant::now();
    loop {
        match api.get_opt(&name).await? {
            None => match api.create(&PostParams::default(), &pod).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            },
            Some(p) => {
                let status = p.status.as_ref();
                let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("");
                let ip = status.and_then(|s| s.pod_ip.clone());
                let deleting = p.metadata.deletion_timestamp.is_some();
                match (phase, ip) {
                    ("Running", Some(ip)) if !deleting => return Ok(ip),
                    ("Succeeded" | "Failed", _) if !deleting => {
                        api.delete(&name, &DeleteParams::default()).await?;
                    }
                    _ => {}
                }
            }
        }
        if t0.elapsed() > POD_WAIT {
            return Err(CheckError::PodNotRunning(name, POD_WAIT));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Whether pod `from` fetches the page of `ip` (one try, of at most 2 s). With `nc`: the
/// static busybox's `wget` looks up the `http` service through NSS, which it cannot load.
async fn reaches(api: &Api<Pod>, from: &str, ip: &str) -> bool {
    let script = format!("printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {ip} {PORT}");
    let req = ExecRequest::shell(script)
        .timeout(Duration::from_secs(5))
        .max_output(1024);
    match exec::run(api, from, "check", req).await {
        Ok(out) => out.stdout_str().lines().last().map(str::trim) == Some("ok"),
        Err(_) => false,
    }
}

/// The check itself, on `node` under `rc`, with the check's objects in `ns`.
pub async fn check(
    client: &Client,
    settings: &Settings,
    ns: &str,
    node: &str,
    rc: Option<&str>,
) -> Result<Verdict, CheckError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
    policies
        .patch(
            POLICY,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&canary_policy(ns)),
        )
        .await?;
    let sfx = suffix(node, rc);
    let (lname, cname) = (
        format!("agentbox-netcheck-{sfx}-listener"),
        format!("agentbox-netcheck-{sfx}-canary"),
    );
    let result = probe(&pods, settings, ns, node, rc, &lname, &cname).await;
    // The check's pods and policy go after each check, whatever its verdict: the next check
    // (when due) makes them again, and nothing of the check stays in a namespace meanwhile
    // (without --network-check-namespace that is the sandbox's own namespace).
    let gone = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for name in [&lname, &cname] {
        match pods.delete(name, &gone).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => warn!(pod = %name, error = %e, "could not delete a network check pod"),
        }
    }
    // Its policy too (made again by the next check), once no canary of it is left running.
    match policies.delete(POLICY, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => warn!(error = %e, "could not delete the network check's policy"),
    }
    result
}

/// The probes of [`check`] between its two pods.
async fn probe(
    pods: &Api<Pod>,
    settings: &Settings,
    ns: &str,
    node: &str,
    rc: Option<&str>,
    lname: &str,
    cname: &str,
) -> Result<Verdict, CheckError> {
    let image = settings.image.as_str();
    let (lip, cip) = tokio::try_join!(
        running_pod(pods, check_pod(lname, ns, "listener", node, rc, image)),
        running_pod(pods, check_pod(cname, ns, "canary", node, rc, image)),
    )?;
    let mut control = false;
    for _ in 0..PROBES {
        if reaches(pods, lname, &cip).await {
            control = true;
            break;
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
    if !control {
        return Ok(Verdict::Not(
            INCONCLUSIVE.into(),
            format!(
                "the NetworkPolicy check on node {node}: its listener pod could not reach its \
                 canary pod (pod {cname} in namespace {ns}), so enforcement cannot be proven there"
            ),
        ));
    }
    for _ in 0..PROBES {
        if !reaches(pods, cname, &lip).await {
            return Ok(Verdict::Enforced);
        }
        tokio::time::sleep(PROBE_PAUSE).await;
    }
    Ok(Verdict::Not(
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
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_known_starts_a_check_and_waits() {
        let now = Instant::now();
        assert_eq!(
            judge(None, Duration::from_secs(60), now),
            (Gate::Pending, true)
        );
        assert_eq!(
            judge(Some(&State::Checking), Duration::from_secs(60), now),
            (Gate::Pending, false)
        );
    }

    #[test]
    fn a_proof_holds_and_is_checked_again_when_due() {
        let at = Instant::now();
        let done = State::Done {
            at,
            verdict: Verdict::Enforced,
        };
        let i = Duration::from_secs(60);
        assert_eq!(
            judge(Some(&done), i, at + Duration::from_secs(1)),
            (Gate::Proven, false)
        );
        assert_eq!(judge(Some(&done), i, at + i), (Gate::Proven, true));
    }

    #[test]
    fn a_failure_keeps_the_sandbox_waiting_and_is_retried_soon() {
        let at = Instant::now();
        let done = State::Done {
            at,
            verdict: Verdict::Not(NOT_ENFORCED.into(), "install one".into()),
        };
        let (gate, again) = judge(Some(&done), Duration::from_secs(300), at);
        assert!(matches!(gate, Gate::Failed { ref reason, .. } if reason == NOT_ENFORCED));
        assert!(!again);
        let (_, again) = judge(Some(&done), Duration::from_secs(300), at + RETRY_FAILED);
        assert!(again);
    }

    #[test]
    fn the_canary_policy_denies_all_egress_of_canaries_only() {
        let p = canary_policy("ops");
        let spec = p.spec.unwrap_or_default();
        assert_eq!(spec.egress, Some(vec![]));
        assert_eq!(spec.policy_types, Some(vec!["Egress".to_string()]));
        let sel = spec
            .pod_selector
            .and_then(|s| s.match_labels)
            .unwrap_or_default();
        assert_eq!(sel.get(LABEL).map(String::as_str), Some("canary"));
    }

    #[test]
    fn check_pods_are_pinned_unprivileged_and_under_the_runtime_class() {
        let p = check_pod("n", "ops", "canary", "node-a", Some("gvisor"), "busybox");
        let spec = p.spec.unwrap_or_default();
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(spec.runtime_class_name.as_deref(), Some("gvisor"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        let c = &spec.containers[0];
        let sc = c.security_context.clone().unwrap_or_default();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_ne!(suffix("node-a", None), suffix("node-a", Some("gvisor")));
    }
}
