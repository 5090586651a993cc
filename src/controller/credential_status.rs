//! The `Credentials` condition of a running sandbox (issue 46): a credential of its
//! `network.allow` that [`super::credential::decide`] refuses once its pod runs (the entry was
//! edited, or the Secret's annotation, key or existence changed) is left out of the egress
//! proxy's table, and this says so where the user looks: condition `Credentials` False with
//! reason `CredentialRefused` (the reason the pre-pod check gives on `Ready`) and one Warning
//! Event per change, back to True (reason `CredentialsAllowed`, a Normal Event) when every
//! credential passes again. The pod is left running: its other entries still work.
//!
//! A condition of its own, not `Ready`: the sandbox still accepts commands (the SDKs' waits
//! read `Ready`), and `Ready` is the sandbox controller's, which would set it back on its next
//! status write. The proxy's feeder owns this one; the sandbox controller carries it over
//! as it carries every condition it does not set.
//!
//! The decision ([`wanted`]) compares what the Sandbox says now with the refusals now, so a
//! new leader writes nothing for a condition that is already right and a sandbox at rest costs
//! no write. The write ([`Reporter::report`]) runs only in the leader (the feeder is part of
//! the leader's controllers), with a timeout, and is conditioned on the Sandbox's
//! resourceVersion: the condition list is one field, and a copy from a lagging watch must not
//! put back conditions the sandbox controller has moved on from.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use tracing::{debug, warn};

use super::conditions;
use super::context::{self, Context};
use super::reasons::WorkspaceReason;
use agentbox_api::crd::{Sandbox, SandboxPhase};

/// Condition type: whether every credential of the sandbox's `network.allow` is allowed by its
/// Secret (set once one has been refused while the sandbox ran).
pub const CREDENTIALS: &str = "Credentials";
/// Reason of `Credentials` True after a refusal.
pub const ALLOWED: &str = "CredentialsAllowed";
/// Who writes the condition (the Sandbox's managedFields say it).
const FIELD_MANAGER: &str = "agentbox-operator-credentials";
/// How long one condition write may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How many condition writes run at once (a Secret's annotation removed can refuse many
/// sandboxes in one tick).
const WRITES_AT_ONCE: usize = 8;

/// The `Credentials` condition a sandbox should carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    /// True: every credential passes.
    pub status: bool,
    /// `CredentialRefused` or [`ALLOWED`].
    pub reason: &'static str,
    /// What is refused (Secret, key and domain of each, never a value), or that all pass.
    pub message: String,
}

/// The condition to write, if it must change (pure). `observed` is the sandbox's `Credentials`
/// condition as read, `refused` the causes [`super::credential::decide`] gives now (empty:
/// all pass), `running` whether the sandbox has a pod (a sandbox without one is held by the
/// pre-pod check, which says it on `Ready`). The condition appears for a running sandbox
/// with a refusal, follows the refusals while it is there (a new cause is a change), and
/// turns True when none is left; a sandbox that never had a refusal gets no condition.
pub fn wanted(observed: Option<&Condition>, refused: &[String], running: bool) -> Option<Wanted> {
    let want = if refused.is_empty() {
        // Only a False condition has something to clear.
        observed.filter(|c| c.status != "True")?;
        Wanted {
            status: true,
            reason: ALLOWED,
            message: "every network.allow credential is allowed by its Secret".to_string(),
        }
    } else {
        if observed.is_none() && !running {
            return None;
        }
        Wanted {
            status: false,
            reason: WorkspaceReason::CredentialRefused.as_str(),
            message: format!(
                "left out of the egress proxy (the sandbox keeps running, its other entries work): {}",
                refused.join("; ")
            ),
        }
    };
    let same = observed.is_some_and(|c| {
        (c.status == "True") == want.status && c.reason == want.reason && c.message == want.message
    });
    (!same).then_some(want)
}

/// Whether the sandbox has a pod its credentials apply to.
pub fn is_running(sbx: &Sandbox) -> bool {
    sbx.metadata.deletion_timestamp.is_none()
        && matches!(
            sbx.status.as_ref().and_then(|s| s.phase),
            Some(SandboxPhase::Initializing | SandboxPhase::Ready)
        )
}

/// Writes the `Credentials` conditions and their Events for the leader's proxy feeder.
pub struct Reporter {
    ctx: Arc<Context>,
    /// The version of each Sandbox (by UID) a condition was last written over: until the
    /// watch brings a newer one, the write is not made again.
    written_over: HashMap<String, String>,
    /// The last condition each Sandbox's Event announced (by UID), so a condition written
    /// again (the sandbox controller wrote a copy without it) makes no second Event.
    announced: HashMap<String, Wanted>,
}

impl Reporter {
    /// A reporter publishing through the operator's context.
    pub fn new(ctx: Arc<Context>) -> Reporter {
        Reporter {
            ctx,
            written_over: HashMap::new(),
            announced: HashMap::new(),
        }
    }

    /// Brings each sandbox's condition to what `refused` (causes by Sandbox UID) says now:
    /// a write and an Event for each one that changes, nothing for the others.
    pub async fn report(
        &mut self,
        sandboxes: &[Arc<Sandbox>],
        refused: &HashMap<String, Vec<String>>,
    ) {
        let live: HashSet<String> = sandboxes.iter().filter_map(|s| s.uid()).collect();
        self.written_over.retain(|u, _| live.contains(u));
        self.announced.retain(|u, _| live.contains(u));
        let mut todo = Vec::new();
        for sbx in sandboxes {
            let (Some(uid), Some(rv)) = (sbx.uid(), sbx.resource_version()) else {
                continue;
            };
            if self.written_over.get(&uid) == Some(&rv) {
                continue;
            }
            let causes = refused.get(&uid).map(Vec::as_slice).unwrap_or_default();
            let observed = sbx
                .status
                .as_ref()
                .and_then(|s| conditions::get(&s.conditions, CREDENTIALS));
            if let Some(w) = wanted(observed, causes, is_running(sbx)) {
                let announce = self.announced.get(&uid) != Some(&w);
                todo.push((sbx.clone(), uid, rv, w, announce));
            }
        }
        let ctx = &self.ctx;
        let done: Vec<_> = futures::stream::iter(todo)
            .map(|(sbx, uid, rv, w, announce)| async move {
                let ok = write(ctx, &sbx, &w, announce).await;
                (uid, rv, w, ok)
            })
            .buffer_unordered(WRITES_AT_ONCE)
            .collect()
            .await;
        for (uid, rv, w, ok) in done {
            if ok {
                self.written_over.insert(uid.clone(), rv);
                self.announced.insert(uid, w);
            }
        }
    }
}

/// Writes `w` as the sandbox's `Credentials` condition over the version read (a merge patch
/// of the condition list, conditioned on its resourceVersion), then, when `announce`, its
/// Event. False when the write did not happen (tried again on the next tick).
async fn write(ctx: &Context, sbx: &Sandbox, w: &Wanted, announce: bool) -> bool {
    let Some(ns) = sbx.namespace() else {
        return false;
    };
    let mut list = sbx
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    conditions::set(
        &mut list,
        CREDENTIALS,
        w.status,
        w.reason,
        w.message.clone(),
        sbx.metadata.generation,
        Timestamp::now(),
    );
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": sbx.resource_version()},
        "status": {"conditions": list},
    });
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let name = sbx.name_any();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    let merge = Patch::Merge(&patch);
    let sent = api.patch_status(&name, &params, &merge);
    match tokio::time::timeout(WRITE_TIMEOUT, sent).await {
        Ok(Ok(_)) => {}
        // Written over meanwhile: the watch brings the new version, decided again then.
        Ok(Err(kube::Error::Api(e))) if e.code == 409 || e.code == 404 => {
            debug!(sandbox = %name, namespace = %ns, "credentials condition: {}", e.message);
            return false;
        }
        Ok(Err(e)) => {
            warn!(sandbox = %name, namespace = %ns, "writing the credentials condition: {e}");
            return false;
        }
        Err(_) => {
            warn!(sandbox = %name, namespace = %ns, "writing the credentials condition: no answer within {WRITE_TIMEOUT:?}");
            return false;
        }
    }
    if announce {
        let type_ = if w.status {
            EventType::Normal
        } else {
            EventType::Warning
        };
        context::publish(ctx, sbx, type_, w.reason, "EgressProxy", &w.message).await;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn cond(status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: CREDENTIALS.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::from_second(1_000).unwrap()),
        }
    }

    fn refused(causes: &[&str]) -> Vec<String> {
        causes.iter().map(|c| c.to_string()).collect()
    }

    const CAUSE: &str = "network.allow api.example.com: Secret model-key has no key other";

    #[test]
    fn a_running_sandbox_with_a_refusal_gets_the_condition_false() {
        let w = wanted(None, &refused(&[CAUSE]), true).expect("a change");
        assert!(!w.status);
        assert_eq!(w.reason, "CredentialRefused");
        assert!(w.message.contains(CAUSE), "{}", w.message);
    }

    #[test]
    fn a_sandbox_without_a_pod_is_left_to_the_pre_pod_check() {
        assert_eq!(wanted(None, &refused(&[CAUSE]), false), None);
    }

    #[test]
    fn nothing_changes_while_the_refusal_stays_the_same() {
        let w = wanted(None, &refused(&[CAUSE]), true).unwrap();
        let now = cond("False", w.reason, &w.message);
        assert_eq!(wanted(Some(&now), &refused(&[CAUSE]), true), None);
        // Suspended meanwhile: still said, still no write.
        assert_eq!(wanted(Some(&now), &refused(&[CAUSE]), false), None);
    }

    #[test]
    fn a_new_cause_is_a_change() {
        let w = wanted(None, &refused(&[CAUSE]), true).unwrap();
        let now = cond("False", w.reason, &w.message);
        let other = "network.allow api.example.com: Secret model-key not found";
        let w2 = wanted(Some(&now), &refused(&[other]), true).expect("a change");
        assert!(w2.message.contains(other) && !w2.message.contains(CAUSE));
    }

    #[test]
    fn the_condition_clears_when_every_credential_passes_and_stays_cleared() {
        let now = cond("False", "CredentialRefused", "x");
        let w = wanted(Some(&now), &[], true).expect("a change");
        assert!(w.status);
        assert_eq!(w.reason, ALLOWED);
        let cleared = cond("True", w.reason, &w.message);
        assert_eq!(wanted(Some(&cleared), &[], true), None);
        assert_eq!(wanted(Some(&cleared), &[], false), None);
    }

    #[test]
    fn a_sandbox_that_never_had_a_refusal_gets_no_condition() {
        assert_eq!(wanted(None, &[], true), None);
        assert_eq!(wanted(None, &[], false), None);
    }

    #[test]
    fn refused_again_after_clearing_is_a_change() {
        let cleared = cond(
            "True",
            ALLOWED,
            "every network.allow credential is allowed by its Secret",
        );
        let w = wanted(Some(&cleared), &refused(&[CAUSE]), true).expect("a change");
        assert!(!w.status);
    }

    #[test]
    fn only_phases_with_a_pod_count_as_running() {
        let mut sbx: Sandbox = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u"},
            "spec": {"image": "i", "scope": {"kind": "Global"}},
            "status": {"phase": "Ready"}
        }))
        .unwrap();
        assert!(is_running(&sbx));
        for phase in [
            SandboxPhase::Pending,
            SandboxPhase::Suspended,
            SandboxPhase::Failed,
        ] {
            sbx.status.as_mut().unwrap().phase = Some(phase);
            assert!(!is_running(&sbx), "{phase:?}");
        }
    }
}
