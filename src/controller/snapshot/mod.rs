//! The snapshot controller: SandboxSnapshot → `tar -c` in the sandbox pod → object store.
//!
//! observe (the snapshot, its sandbox and pod, whether this process is uploading it) →
//! [`decide`] (pure) → apply (take it under the scope's guard, or wait, or fail) → status.
//! Taking is in `take`; the sandbox controller's hook for `spec.snapshot.onStop` in `on_stop`.
//!
//! A snapshot is marked Ready only after its tarball is committed to its final key and the
//! manifest written. One found `Running` that this process is not uploading was interrupted
//! (operator restart, lost leadership): its objects are removed and it is taken again from
//! scratch, at most [`MAX_ATTEMPTS`] times in all, then Failed with the reason. Snapshots have
//! no owner, so they outlive their sandbox; a finalizer removes the object with the resource
//! when `deletionPolicy` is `Delete`.

mod decide;
mod on_stop;
#[cfg(test)]
mod scenarios;
mod take;
mod write;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};

use super::podstate;
use crate::controller::context::{Context, Error};
use crate::snapshot::store::SnapshotKeys;
use agentbox_api::crd::{DeletionPolicy, LifecycleMode, Sandbox, SandboxSnapshot, SnapshotPhase};
use agentbox_api::labels;
pub use agentbox_api::remote::{TAR_SCRIPT, tar_args};
pub use decide::{
    AtRest, MAX_ATTEMPTS, NotCommitted, Observed, Plan, SandboxState, decide, helper_for_running,
    retention_victims,
};
pub use on_stop::{ON_STOP, OnStop, on_stop};
pub use write::{COMMITTED, LAST_SNAPSHOT_MANAGER, set_committed};
use write::{discard_attempt, in_flight, snapshot_err, write_failure};

/// Finalizer that removes a snapshot's object (policy `Delete`) before the resource goes.
pub const FINALIZER: &str = "agentbox.dev/snapshot-object";
/// Reconciles one SandboxSnapshot.
pub async fn reconcile(snap: Arc<SandboxSnapshot>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = snap.namespace().ok_or(Error::NotNamespaced)?;
    let api: Api<SandboxSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, FINALIZER, snap, |event| async {
        match event {
            Finalizer::Apply(s) => apply(&s, &ctx).await,
            Finalizer::Cleanup(s) => cleanup(&s, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Observes the sandbox of a snapshot: the Sandbox and, if its workspace is initialised, its
/// pod.
async fn observe_sandbox(
    ctx: &Context,
    ns: &str,
    name: &str,
) -> Result<(SandboxState, Option<Sandbox>), Error> {
    // A name that is not one would change the request's path (kube does not escape it).
    if !agentbox_api::names::is_object_name(name) {
        let m = agentbox_api::names::refusal("sandboxRef.name", name);
        return Ok((SandboxState::InvalidReference(m), None));
    }
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), ns);
    let Some(sbx) = sandboxes.get_opt(name).await? else {
        return Ok((SandboxState::Missing, None));
    };
    let st = sbx.status.clone().unwrap_or_default();
    let pod = match st.pod_name.as_deref() {
        Some(pod_name) => {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
            pods.get_opt(pod_name).await?
        }
        None => None,
    };
    if let Some(pod) = &pod
        && podstate::serves_workspace(&st, pod)
    {
        let helper = !ctx.config.helper_image.trim().is_empty();
        let state = match decide::helper_for_running(&sbx, pod, helper, &ctx.config.node_root) {
            Some(at) => SandboxState::ReadyOnNode(at),
            None => SandboxState::Ready,
        };
        return Ok((state, Some(sbx)));
    }
    // No pod serves the workspace. One that is starting (or coming back) is waited for; a
    // suspended or deleted sandbox gets none until someone resumes it, so waiting would keep
    // the snapshot Pending for good.
    let stopping = if sbx.metadata.deletion_timestamp.is_some() {
        Some("the sandbox is being deleted and no pod serves its workspace")
    } else if sbx.spec.lifecycle.mode == LifecycleMode::Suspended {
        // Its pod stopping still: wait for it to go, so nothing writes while the helper reads.
        if pod.is_some() {
            let why = "the suspended sandbox's pod is still stopping";
            return Ok((SandboxState::NotReady(why.into()), Some(sbx)));
        }
        let helper = !ctx.config.helper_image.trim().is_empty();
        match decide::at_rest(&sbx, helper, &ctx.config.node_root) {
            Ok(at) => return Ok((SandboxState::AtRest(at), Some(sbx))),
            Err(why) => Some(why),
        }
    } else {
        None
    };
    if let Some(why) = stopping {
        return Ok((SandboxState::Stopped(why.into()), Some(sbx)));
    }
    let why = match &pod {
        None if st.pod_name.is_none() => "the sandbox has no pod",
        None => "the sandbox pod does not exist",
        Some(pod) if podstate::initialised_in(&st, pod) => "the sandbox pod is not ready",
        Some(_) => "the workspace is not initialised in the current pod",
    };
    Ok((SandboxState::NotReady(why.into()), Some(sbx)))
}

async fn apply(snap: &SandboxSnapshot, ctx: &Context) -> Result<Action, Error> {
    let ns = snap.namespace().ok_or(Error::NotNamespaced)?;
    let name = snap.name_any();
    let uid = snap.uid().unwrap_or_default();
    let api: Api<SandboxSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
    let old = snap.status.clone().unwrap_or_default();
    if matches!(
        old.phase,
        Some(SnapshotPhase::Ready | SnapshotPhase::Failed)
    ) {
        return Ok(Action::await_change());
    }
    let (sandbox, sbx) = observe_sandbox(ctx, &ns, &snap.spec.sandbox_ref.name).await?;
    let observed = Observed {
        phase: old.phase,
        attempts: old.attempts.unwrap_or(0),
        sandbox,
        in_flight: in_flight(&uid),
        store: ctx.store.is_some(),
    };
    let plan = decide(&observed);
    if matches!(plan, Plan::Take { .. } | Plan::Fail(..)) && !is_current(&api, snap).await? {
        // The cache lags our own last write (say, Ready): acting on it would take a finished
        // snapshot again. The watch event of the newer version brings us back.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let now = Timestamp::now();
    let mut st = old.clone();
    match plan {
        Plan::Done => Ok(Action::await_change()),
        Plan::Fail(reason, message) => {
            if let (Some(store), Some(keys)) = (ctx.store.as_ref(), keys_of(ctx, snap)) {
                discard_attempt(ctx, snap, store, &keys, old.upload_id.as_deref())
                    .await
                    .map_err(snapshot_err)?;
            }
            st.upload_id = None;
            write_failure(ctx, snap, &api, st, reason.as_str(), &message, true).await?;
            Ok(Action::await_change())
        }
        Plan::Wait(reason, message) => {
            st.phase = Some(SnapshotPhase::Pending);
            set_committed(
                &mut st.conditions,
                false,
                reason.as_str(),
                &message,
                None,
                now,
            );
            if st != old {
                crate::controller::context::apply_status(&api, &name, &st).await?;
            }
            Ok(Action::requeue(Duration::from_secs(3)))
        }
        Plan::Take {
            clean_first,
            reader,
        } => {
            let (Some(store), Some(sbx)) = (ctx.store.clone(), sbx) else {
                return Ok(Action::requeue(Duration::from_secs(5)));
            };
            take::take(ctx, snap, &sbx, &store, clean_first, reader, st).await
        }
    }
}

/// Whether the cached snapshot is the API server's current version (a fresh read), so a
/// decision to take or fail it does not rest on a status this process already replaced.
async fn is_current(api: &Api<SandboxSnapshot>, snap: &SandboxSnapshot) -> Result<bool, Error> {
    let fresh = api.get_opt(&snap.name_any()).await?;
    Ok(fresh.is_some_and(|f| f.metadata.resource_version == snap.metadata.resource_version))
}

/// The keys of a snapshot, from the scope key in its status or labels.
fn keys_of(ctx: &Context, snap: &SandboxSnapshot) -> Option<SnapshotKeys> {
    let store = ctx.store.as_ref()?;
    let scope_key = snap
        .status
        .as_ref()
        .and_then(|s| s.scope_key.clone())
        .or_else(|| snap.labels().get(labels::SCOPE_KEY).cloned())?;
    Some(store.keys(&snap.namespace()?, &scope_key, &snap.uid()?))
}

/// Deleting a snapshot: with `Delete`, its objects go first; with `Retain`, only what an
/// unfinished attempt left (a multipart upload, a temporary object).
async fn cleanup(snap: &SandboxSnapshot, ctx: &Context) -> Result<Action, Error> {
    let (Some(store), Some(keys)) = (ctx.store.as_ref(), keys_of(ctx, snap)) else {
        return Ok(Action::await_change());
    };
    // An upload still recorded was cut short (a finished attempt clears it).
    let upload_id = snap.status.as_ref().and_then(|s| s.upload_id.as_deref());
    discard_attempt(ctx, snap, store, &keys, upload_id)
        .await
        .map_err(snapshot_err)?;
    if snap.spec.deletion_policy == DeletionPolicy::Delete {
        store.delete_snapshot(&keys).await.map_err(snapshot_err)?;
    }
    Ok(Action::await_change())
}
