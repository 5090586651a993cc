//! What every controller shares: the [`Context`] they run with, the [`Error`] a reconcile
//! ends with (and the pace at which it is retried), the scope guard as the operator takes it,
//! status writes, and Events. A leaf: it imports no controller, and every controller imports it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector;
use kube::{Api, Client, ResourceExt};
use tracing::{debug, warn};

pub use super::error::{Error, retry_after};
use super::memos;
use super::{refill_delay, warm_shells};
use crate::config::Config;
use crate::metrics::{GuardOp, GuardOutcome, Metrics};
use crate::snapshot::store::Store;
use agentbox_api::crd::Sandbox;
use agentbox_api::guard::{self, Guard, GuardConfig, GuardError, LeaseView};
use agentbox_api::labels;

/// Field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "agentbox-operator";

/// Shared state of the reconcilers.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Operator configuration.
    pub config: Config,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Publishes Events as the operator; one recorder, so repeats of an Event become a series.
    pub recorder: Recorder,
    /// The snapshot store; `None` when snapshots are off or the store could not be built.
    pub store: Option<Store>,
    /// What the helper found on each node's workspace directory of each namespace.
    pub node_roots: memos::Checks,
    /// Permanent restore refusals this process made, by sandbox (beside `status.restoreRefusal`).
    pub refusals: memos::Refusals,
    /// The kills for memory this process announced, by sandbox (beside `status.lastOOMKill`).
    pub oom_kills: memos::OomKills,
    /// When this process last read each limited workspace's usage, by sandbox uid.
    pub usage_reads: memos::Reads,
    /// Workspace directories of deleted sandboxes, left to the sweep.
    pub sweep: memos::Hints,
    /// The pods the operator manages (label `app.kubernetes.io/managed-by: agentbox`), as its
    /// watch last saw them: where a sandbox's pod not named in its status is found, without a
    /// LIST on each reconcile.
    pub pods: reflector::Store<Pod>,
    /// Open shells in warm pods, kept by the pools for the claims.
    pub shells: warm_shells::Shells,
    /// When each pool last lost a warm pod to a claim of this process (its refill waits).
    pub pool_claims: refill_delay::Claims,
    /// The watch caches a first start reads instead of the API server ([`super::cache`]);
    /// `None` where no watch runs (the scenario tests): reads then go to the API server.
    pub cache: Option<super::cache::Caches>,
    /// What the operator has proven of NetworkPolicy enforcement, per node and runtime class.
    pub proofs: super::netcheck::Proofs,
}

/// The holder identity under which this operator takes a scope's guard for `what` (a
/// snapshot, a restore, a suspension): its identity, a slash, and the job.
pub fn operator_holder(ctx: &Context, what: &str) -> String {
    format!("{}/{what}", ctx.config.identity)
}

/// The jobs the operator takes a scope's guard for, as the last part of its holder identities
/// ([`operator_holder`]).
const OPERATOR_JOBS: [&str; 6] = [
    "snapshot",
    "restore",
    "idle_suspend",
    "suspend",
    "idle-suspend",
    "over-limit-suspend",
];

/// Whether a guard holder is an operator's (this one's or another's, a killed one's included):
/// `<identity>/<job>` with one of the operator's jobs. A deleting Sandbox's cleanup waits out
/// such a hold on its scope's Lease rather than leave the Lease behind.
pub fn is_operator_holder(holder: &str) -> bool {
    holder
        .rsplit_once('/')
        .is_some_and(|(id, job)| !id.is_empty() && OPERATOR_JOBS.contains(&job))
}

/// What the last Sandbox of a scope does with the scope's guard Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseFate {
    /// Delete it (conditioned on the version read).
    Delete,
    /// Leave it: a harness holds the guard.
    Keep,
    /// Wait until the operator's hold on it is released or runs out.
    WaitOut,
}

/// The fate of a scope's guard Lease as read (pure).
pub fn lease_fate(view: &LeaseView) -> LeaseFate {
    match view.holder.as_deref() {
        None => LeaseFate::Delete,
        Some(_) if view.expired => LeaseFate::Delete,
        Some(h) if is_operator_holder(h) => LeaseFate::WaitOut,
        Some(_) => LeaseFate::Keep,
    }
}

/// Takes the scope's guard for `op`, waiting up to [`GUARD_WAIT`], and records the wait.
pub(crate) async fn scope_guard(
    ctx: &Context,
    ns: &str,
    scope: &agentbox_api::crd::Scope,
    op: GuardOp,
) -> Result<Guard, GuardError> {
    let gcfg = GuardConfig {
        holder: operator_holder(ctx, op.as_str()),
        ..GuardConfig::default()
    };
    let started = Instant::now();
    let got = guard::acquire_scope(ctx.client.clone(), ns, scope, &gcfg, Some(GUARD_WAIT)).await;
    let outcome = match &got {
        Ok(_) => GuardOutcome::Acquired,
        Err(GuardError::Timeout { .. }) => GuardOutcome::Busy,
        Err(_) => GuardOutcome::Error,
    };
    ctx.metrics.guard_waited(op, outcome, started.elapsed());
    got
}

/// The hold of the scope's guard that a harness handed over in `spec.lifecycle.guard`, when it
/// still stands (the Lease held by that holder with that token); `None` when there is none or
/// it no longer stands (the operator then takes the guard itself).
pub(crate) async fn handed_off_hold(
    ctx: &Context,
    sbx: &Sandbox,
) -> Result<Option<(agentbox_api::crd::GuardHold, guard::HandOff)>, Error> {
    let Some(hold) = sbx.spec.lifecycle.guard.clone() else {
        return Ok(None);
    };
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let lease = labels::lease_name(&labels::scope_key(&sbx.spec.scope));
    let h = guard::HandOff::new(
        Api::namespaced(ctx.client.clone(), &ns),
        &lease,
        &hold.holder,
        hold.token,
    );
    match h.check().await {
        Ok(()) => Ok(Some((hold, h))),
        Err(GuardError::NotHeld { seen, .. }) => {
            debug!(sandbox = %sbx.name_any(), "the handed-over guard hold no longer stands ({seen}); the operator takes the guard itself");
            Ok(None)
        }
        Err(e) => Err(Error::Guard(e)),
    }
}

/// How long the operator waits for a scope's guard (a snapshot or a restore) before trying
/// again later.
pub const GUARD_WAIT: Duration = Duration::from_secs(60);

/// Server-side applies an object's whole status with the operator's field manager, so fields
/// it stops setting are removed.
pub(crate) async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    status: &impl serde::Serialize,
) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    apply_status_as(api, name, status, FIELD_MANAGER).await
}

/// Server-side applies the status fields in `status` with field manager `manager`.
pub(crate) async fn apply_status_as<K>(
    api: &Api<K>,
    name: &str,
    status: &impl serde::Serialize,
    manager: &str,
) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &kube::api::PatchParams::apply(manager).force(),
        &kube::api::Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// Publishes an Event about `obj`. Best effort: a failed Event is logged, never fatal.
pub(crate) async fn publish<K>(
    ctx: &Context,
    obj: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) where
    K: kube::Resource<DynamicType = ()>,
{
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &obj.object_ref(&())).await {
        warn!(object = %obj.name_any(), "could not publish event {reason}: {e}");
    }
}

/// An Event to publish about an object (see [`publish`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// Normal or Warning.
    pub type_: EventType,
    /// CamelCase reason.
    pub reason: String,
    /// What the operator did or tried.
    pub action: &'static str,
    /// What happened.
    pub message: String,
}

impl Note {
    pub(crate) fn new(type_: EventType, reason: &str, action: &'static str, message: &str) -> Self {
        Note {
            type_,
            reason: reason.to_string(),
            action,
            message: message.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentbox_api::guard::LeaseView;

    fn view(holder: Option<&str>, expired: bool) -> LeaseView {
        LeaseView {
            holder: holder.map(str::to_string),
            acquired: None,
            duration: std::time::Duration::from_secs(15),
            expired,
            expires_at: None,
            transitions: 1,
        }
    }

    #[test]
    fn the_last_sandbox_of_a_scope_deletes_a_free_or_lapsed_lease_and_waits_out_an_operators_hold()
    {
        assert_eq!(lease_fate(&view(None, false)), LeaseFate::Delete);
        assert_eq!(
            lease_fate(&view(Some("harness-7"), true)),
            LeaseFate::Delete
        );
        assert_eq!(
            lease_fate(&view(Some("op-1/suspend"), true)),
            LeaseFate::Delete
        );
        assert_eq!(lease_fate(&view(Some("harness-7"), false)), LeaseFate::Keep);
        for job in [
            "snapshot",
            "restore",
            "idle_suspend",
            "suspend",
            "idle-suspend",
        ] {
            let h = format!("agentbox-operator-5d9f-x2/{job}");
            assert_eq!(
                lease_fate(&view(Some(&h), false)),
                LeaseFate::WaitOut,
                "{h}"
            );
        }
        // A harness's own names are not the operator's.
        assert_eq!(
            lease_fate(&view(Some("user/alice"), false)),
            LeaseFate::Keep
        );
        assert_eq!(lease_fate(&view(Some("/suspend"), false)), LeaseFate::Keep);
    }
}
