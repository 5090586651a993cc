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

use super::memory;
use super::reasons;
use super::{refill_delay, warm_shells};
use crate::config::Config;
use crate::metrics::{GuardOp, GuardOutcome, Metrics};
use crate::snapshot::store::Store;
use agentbox_api::crd::Sandbox;
use agentbox_api::guard::{self, Guard, GuardConfig, GuardError};
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
    pub node_roots: memory::Checks,
    /// Permanent restore refusals this process made, by sandbox (beside `status.restoreRefusal`).
    pub refusals: memory::Refusals,
    /// Workspace directories of deleted sandboxes, left to the sweep.
    pub sweep: memory::Hints,
    /// The pods the operator manages (label `app.kubernetes.io/managed-by: agentbox`), as its
    /// watch last saw them: where a sandbox's pod not named in its status is found, without a
    /// LIST on each reconcile.
    pub pods: reflector::Store<Pod>,
    /// Open shells in warm pods, kept by the pools for the claims.
    pub shells: warm_shells::Shells,
    /// When each pool last lost a warm pod to a claim of this process (its refill waits).
    pub pool_claims: refill_delay::Claims,
}

/// Reconcile errors. [`Error::is_permanent`] decides the retry pace.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused or failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An exec into the sandbox failed.
    #[error("exec: {0}")]
    Exec(#[from] agentbox_api::exec::ExecError),
    /// The finalizer helper failed (wraps the inner error).
    #[error("{0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// Workspace initialisation ran but failed.
    #[error("workspace initialisation: {0}")]
    Init(String),
    /// A ConfigMap or Secret a file, projection or environment variable needs is missing.
    #[error("{0}")]
    SourceMissing(String),
    /// A ConfigMap or Secret a file, projection or environment variable names has not been
    /// made readable by sandboxes (label `agentbox.dev/sandbox-readable: "true"`).
    #[error("{0}")]
    SourceNotReadable(String),
    /// Building the file archive failed.
    #[error("building the file archive: {0}")]
    Archive(#[from] std::io::Error),
    /// The workspace cleanup pod failed.
    #[error("{0}")]
    Cleanup(String),
    /// Work on a node needs the helper image, and the operator has none.
    #[error("{0}")]
    NoHelper(String),
    /// The workspace was lost with nothing to restore, and `snapshot.whenLost` is `Fail`.
    #[error("{0}")]
    WorkspaceLost(String),
    /// A namespaced object without a namespace.
    #[error("object has no namespace")]
    NotNamespaced,
    /// A status write waited for the reconcile's metadata write (finalizer and scope
    /// labels), which failed: the reconcile returns that write's own error instead.
    #[error("the Sandbox's finalizer and scope labels were not written")]
    MetadataNotWritten,
    /// A write did not finish in time.
    #[error("a write to the API server did not finish within {}s", .0.as_secs())]
    Timeout(Duration),
    /// The watch of managed pods has not listed them yet: a sandbox's pod not named in its
    /// status cannot be looked for, so nothing is made or adopted until it has.
    #[error("the watch of the operator's pods has not synced within {}s", .0.as_secs())]
    PodCacheNotSynced(Duration),
    /// Taking or storing a snapshot failed.
    #[error("snapshot: {0}")]
    Snapshot(#[source] crate::snapshot::SnapshotError),
    /// The scope's guard could not be taken or was lost.
    #[error("guard: {0}")]
    Guard(#[source] agentbox_api::guard::GuardError),
    /// Restoring a workspace from a snapshot failed; the workspace is as it was.
    #[error("restore refused or failed ({reason}): {message}")]
    Restore {
        /// The WorkspaceReady condition's reason; says whether the failure is permanent.
        reason: reasons::RestoreReason,
        /// What happened.
        message: String,
        /// Set when the refusal is permanent: recorded on the Sandbox so the restore is not
        /// attempted again until what it was judged against changes.
        refusal: Option<Box<agentbox_api::crd::RestoreRefusal>>,
    },
}

impl Error {
    /// The error inside the finalizer helper's wrapping, or this one.
    pub fn root(&self) -> &Error {
        match self {
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.root(),
                _ => self,
            },
            _ => self,
        }
    }

    /// A short kind for metrics.
    pub fn kind(&self) -> &'static str {
        match self.root() {
            Error::Kube(_) => "kube",
            Error::Exec(_) => "exec",
            Error::Finalizer(_) => "finalizer",
            Error::Init(_) => "init",
            Error::SourceMissing(_) => "source_missing",
            Error::SourceNotReadable(_) => "source_not_readable",
            Error::Archive(_) => "archive",
            Error::Cleanup(_) => "cleanup",
            Error::NoHelper(_) => "no_helper",
            Error::WorkspaceLost(_) => "workspace_lost",
            Error::NotNamespaced => "not_namespaced",
            Error::MetadataNotWritten => "metadata_not_written",
            Error::Timeout(_) => "timeout",
            Error::PodCacheNotSynced(_) => "pod_cache_not_synced",
            Error::Snapshot(_) => "snapshot",
            Error::Guard(_) => "guard",
            Error::Restore { .. } => "restore",
        }
    }

    /// The permanent restore refusal this error records, if it is one.
    pub fn restore_refusal(&self) -> Option<&agentbox_api::crd::RestoreRefusal> {
        match self.root() {
            Error::Restore {
                refusal: Some(r), ..
            } => Some(r),
            _ => None,
        }
    }

    /// The reason a workspace initialisation that failed with this error gives.
    pub fn workspace_reason(&self) -> reasons::WorkspaceReason {
        use reasons::WorkspaceReason as W;
        match self {
            Error::SourceMissing(_) => W::SourceMissing,
            Error::SourceNotReadable(_) => W::SourceNotReadable,
            Error::Exec(_) => W::ExecFailed,
            Error::Restore { reason, .. } => W::Restore(*reason),
            Error::WorkspaceLost(_) => W::WorkspaceLost,
            _ => W::InitFailed,
        }
    }

    /// Condition reason and message for a failed workspace initialisation.
    pub fn reason_and_message(&self) -> (&'static str, String) {
        (self.workspace_reason().as_str(), self.to_string())
    }

    /// Errors that will not go away by retrying soon (they wait for a spec or source change,
    /// polled slowly).
    pub fn is_permanent(&self) -> bool {
        match self.root() {
            Error::Exec(e) => !e.is_transient(),
            Error::NotNamespaced | Error::NoHelper(_) | Error::WorkspaceLost(_) => true,
            Error::Restore { reason, .. } => reason.is_permanent(),
            _ => false,
        }
    }
}

/// Retry pace after a failed reconcile: backoff with jitter for transient errors, a slow poll
/// (`permanent`, `--permanent-retry-seconds`) for permanent ones.
pub fn retry_after(err: &Error, jitter: f64, permanent: Duration) -> Duration {
    let base = match err.root() {
        // Waits for someone to create or label an object (no watch on those): a slow poll.
        Error::SourceMissing(_) | Error::SourceNotReadable(_) => 30.0,
        Error::Restore {
            reason: reasons::RestoreReason::SnapshotNotFound,
            ..
        } => 30.0,
        e if e.is_permanent() => permanent.as_secs_f64().max(1.0),
        _ => 5.0,
    };
    Duration::from_secs_f64(base * (1.0 + jitter.clamp(0.0, 1.0) * 0.5))
}

/// Takes the scope's guard for `op`, waiting up to [`GUARD_WAIT`], and records the wait.
pub(crate) async fn scope_guard(
    ctx: &Context,
    ns: &str,
    scope: &agentbox_api::crd::Scope,
    op: GuardOp,
) -> Result<Guard, GuardError> {
    let gcfg = GuardConfig {
        holder: format!("{}/{}", ctx.config.identity, op.as_str()),
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

#[cfg(test)]
mod tests {
    use super::*;

    const SLOW: Duration = Duration::from_secs(300);

    #[test]
    fn retry_pace() {
        assert_eq!(
            retry_after(&Error::Init("x".into()), 0.0, SLOW),
            Duration::from_secs(5)
        );
        assert!(retry_after(&Error::Init("x".into()), 1.0, SLOW) <= Duration::from_secs_f64(7.5));
        assert_eq!(
            retry_after(&Error::NotNamespaced, 0.0, SLOW),
            Duration::from_secs(300)
        );
        assert_eq!(
            retry_after(&Error::SourceMissing("cm".into()), 0.0, SLOW),
            Duration::from_secs(30)
        );
        assert_eq!(
            retry_after(&Error::SourceNotReadable("secret".into()), 0.0, SLOW),
            Duration::from_secs(30)
        );
        use reasons::RestoreReason::*;
        let refused = |reason| Error::Restore {
            reason,
            message: String::new(),
            refusal: None,
        };
        assert_eq!(
            retry_after(&refused(CrossScopeRestore), 0.0, SLOW),
            Duration::from_secs(300),
            "waits for a change"
        );
        assert_eq!(
            retry_after(&refused(SnapshotNotReady), 0.0, SLOW),
            Duration::from_secs(5)
        );
        let short = Duration::from_secs(20);
        assert_eq!(
            retry_after(&refused(CrossScopeRestore), 0.0, short),
            short,
            "the permanent pace is --permanent-retry-seconds"
        );
        assert_eq!(
            retry_after(&Error::Init("x".into()), 0.0, short),
            Duration::from_secs(5),
            "transient errors keep their backoff"
        );
    }
}
