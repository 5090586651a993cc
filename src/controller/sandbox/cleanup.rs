//! Deleting a Sandbox: an onStop snapshot if asked for (it reads the workspace, so it comes
//! first), then its pod asked to go, its network policy, directories left on lost nodes, and
//! the scope's idle guard Lease — and the finalizer goes. The pod is not waited for and the
//! workspace directory is not removed here: both would keep a deleted object around for
//! seconds. The directory is left to the sweep ([`crate::controller::sweep`]), which removes
//! it once no pod mounts it, and whose passes catch it should this process stop in between.
//! Every unfinished step returns [`Cleanup::Pending`] (not an error: cleanup polls).

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::abandoned;
use super::observe::find_pod;
use super::observe::node_health;
use super::write::{Apis, Writer, delete_if_present, force_delete, write_status};
use super::write::{FINALIZER, MetadataGate, apply_metadata, without_finalizer};
use crate::controller::context::Note;
use crate::controller::context::{Context, Error, LeaseFate};
use crate::controller::memos::Hint;
use crate::controller::nodeloss::NodeHealth;
use crate::controller::placement::NodeDir;
use crate::controller::pod::PodConfig;
use crate::controller::{conditions, placement, snapshot};
use agentbox_api::crd::{Sandbox, SandboxPhase};
use agentbox_api::guard::LeaseView;
use agentbox_api::labels;

/// Grace of a deleted sandbox's pod: its workspace is about to be discarded (and the onStop
/// snapshot, if asked for, is taken), so there is nothing to shut down cleanly for. Not zero:
/// a graceful delete lets the pod object go only once its kubelet has stopped the containers,
/// which is what the sweep waits for before it removes the directory they mount.
pub const POD_DELETE_GRACE_SECONDS: u32 = 1;

/// How far the cleanup of a deleting Sandbox got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cleanup {
    /// All of it is done: the finalizer may go.
    Done,
    /// A step is under way (an onStop snapshot, a directory left on a lost node): look again
    /// shortly.
    Pending,
}

/// The reconcile of a deleting Sandbox: [`cleanup`], then the finalizer off.
pub(super) async fn deleting(sbx: &Sandbox, ctx: &Context) -> Result<Action, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let name = sbx.name_any();
    if !sbx.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    // The cache may trail the API server: a reconcile queued before the finalizer went
    // would otherwise clean up again (and leave a cleanup pod behind). Act only on what
    // the API server says now.
    let Some(fresh) = api.get_opt(&name).await? else {
        return Ok(Action::await_change());
    };
    if fresh.uid() != sbx.uid() || !fresh.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    // The on-stop snapshot follows the template's policy when the Sandbox names one.
    let effective = crate::controller::effective::resolved_or_own(&ctx.client, &fresh).await?;
    if cleanup(&effective, ctx).await? == Cleanup::Pending {
        return Ok(Action::requeue(std::time::Duration::from_secs(1)));
    }
    // Applying our metadata without the finalizer gives up the operator's hold on it; a
    // finalizer someone else also set (a manifest that carries it) is theirs under
    // server-side apply too, so it goes by a patch of the list, conditioned on the version
    // just returned.
    let applied = apply_metadata(&api, &name, &fresh, false).await?;
    if let Some(patch) = without_finalizer(&applied) {
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }
    Ok(Action::await_change())
}

/// Deleting a Sandbox; see the module's documentation for the order.
pub async fn cleanup(sbx: &Sandbox, ctx: &Context) -> Result<Cleanup, Error> {
    ctx.refusals.set(&sbx.uid().unwrap_or_default(), None);
    ctx.oom_kills.forget(&sbx.uid().unwrap_or_default());
    ctx.usage_reads.forget(&sbx.uid().unwrap_or_default());
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let apis = Apis::new(ctx, &ns, MetadataGate::open());
    // spec.snapshot.onStop: persist the workspace before its pod goes.
    let hold = crate::controller::context::handed_off_hold(ctx, sbx)
        .await?
        .map(|(h, _)| h);
    if snapshot::on_stop(ctx, sbx, hold).await? == snapshot::OnStop::Wait {
        mark_terminating(sbx, &apis).await;
        return Ok(Cleanup::Pending);
    }
    let (node, dir) = stop_pod(sbx, ctx, &apis).await?;
    delete_if_present(
        &apis.policies,
        &labels::network_policy_name(&sbx.name_any()),
    )
    .await?;
    if remove_abandoned(sbx, ctx, &apis).await? == Cleanup::Pending {
        return Ok(Cleanup::Pending);
    }
    let hint = match node {
        None => None,
        Some((node, NodeHealth::Lost { why, .. })) => {
            // Not waited for: a lost node may never return. Its directory is named, so nothing
            // is left behind unseen, and a pass of the sweep removes it should the node return.
            let msg = format!(
                "{why}; its workspace directory {dir} there cannot be removed now (the sweep removes it if node {node} comes back)"
            );
            crate::controller::context::publish(
                ctx,
                sbx,
                EventType::Warning,
                "WorkspaceUnreachable",
                "DeleteWorkspace",
                &msg,
            )
            .await;
            None
        }
        Some((node, _)) => {
            if PodConfig::from_config(&ctx.config).helper.is_none() {
                let at = NodeDir {
                    node: &node,
                    dir: &dir,
                };
                return Err(no_helper_for_cleanup(sbx, ctx, &apis, at).await);
            }
            // Only an entry of the namespace's directory is the operator's to remove (a
            // status naming anything else is not followed).
            placement::dir_name(&dir, &ctx.config.node_root, &ns).map(|name| Hint {
                node,
                namespace: ns.clone(),
                dir: name.to_string(),
            })
        }
    };
    if forget_scope_lease(sbx, ctx).await? == Cleanup::Pending {
        return Ok(Cleanup::Pending);
    }
    if let Some(h) = hint {
        // Its pod's deletion, seen after the Sandbox is gone, hints nothing more.
        super::orphan::swept(&sbx.uid().unwrap_or_default());
        ctx.sweep.add(h);
    }
    Ok(Cleanup::Done)
}

/// Marks the sandbox Terminating while its deletion waits (best effort: a failed status
/// write must not block deletion).
async fn mark_terminating(sbx: &Sandbox, apis: &Apis) {
    if sbx.status.as_ref().and_then(|s| s.phase) == Some(SandboxPhase::Terminating) {
        return;
    }
    let mut st = sbx.status.clone().unwrap_or_default();
    st.phase = Some(SandboxPhase::Terminating);
    if let Err(e) = write_status(apis, sbx, &st).await {
        warn!(sandbox = %sbx.name_any(), "could not mark the sandbox Terminating: {e}");
    }
}

/// Asks the sandbox's pod to go, without waiting for it (grace
/// [`POD_DELETE_GRACE_SECONDS`]); a pod on a lost node is deleted at once (its kubelet is gone
/// and would never confirm). Returns the node that holds the workspace and what it looks like,
/// and the workspace's directory there (recorded, else the one the pod mounts).
async fn stop_pod(
    sbx: &Sandbox,
    ctx: &Context,
    apis: &Apis,
) -> Result<(Option<(String, NodeHealth)>, String), Error> {
    let found: Option<Pod> = find_pod(sbx, ctx, &apis.pods).await?;
    let dir = placement::host_dir_with(sbx, found.as_ref(), &ctx.config.node_root);
    let node = found
        .as_ref()
        .and_then(|p| p.spec.as_ref()?.node_name.clone())
        .or_else(|| sbx.status.as_ref().and_then(|s| s.node_name.clone()));
    let health = match &node {
        Some(n) => Some((n.clone(), node_health(ctx, n, Timestamp::now()).await?)),
        None => None,
    };
    let Some(p) = found else {
        return Ok((health, dir));
    };
    let pod_name = p.name_any();
    if let Some((_, NodeHealth::Lost { why, .. })) = &health {
        info!(sandbox = %sbx.name_any(), "{why}: force-deleting its pod");
        force_delete(&apis.pods, &pod_name, p.uid()).await?;
        return Ok((health, dir));
    }
    if p.metadata.deletion_timestamp.is_some() {
        return Ok((health, dir));
    }
    let dp = DeleteParams {
        grace_period_seconds: Some(POD_DELETE_GRACE_SECONDS),
        preconditions: Some(kube::api::Preconditions {
            uid: p.uid(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match apis.pods.delete(&pod_name, &dp).await {
        Ok(_) => Ok((health, dir)),
        // Gone already, or replaced by a pod this deletion did not see: the owner reference
        // takes that one with the sandbox.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok((health, dir)),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the scope's guard Lease when this was the last sandbox of the scope in the namespace
/// and nobody holds the guard, so leases do not pile up. The delete is conditioned on the
/// resourceVersion read, so a harness taking the guard meanwhile keeps it. A holder whose time
/// is up has lost the guard (anyone may take it over): its Lease goes too. An operator's hold
/// that still stands (a suspension or snapshot whose operator was killed holding it) is waited
/// out ([`Cleanup::Pending`]): nobody else would ever delete that Lease. A harness's hold is
/// left to the harness; the sweep's pass deletes the Lease once it is released.
async fn forget_scope_lease(sbx: &Sandbox, ctx: &Context) -> Result<Cleanup, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let others = sandboxes
        .list_metadata(&ListParams::default().labels(&labels::scope_selector(&sbx.spec.scope)))
        .await?
        .items
        .into_iter()
        .filter(|o| o.metadata.uid != sbx.metadata.uid)
        .count();
    if others > 0 {
        return Ok(Cleanup::Done);
    }
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &ns);
    let name = labels::lease_name(&labels::scope_key(&sbx.spec.scope));
    let Some(lease) = leases.get_opt(&name).await? else {
        return Ok(Cleanup::Done);
    };
    match crate::controller::context::lease_fate(&LeaseView::of(Some(&lease), Timestamp::now())) {
        LeaseFate::Delete => {}
        LeaseFate::Keep => return Ok(Cleanup::Done),
        LeaseFate::WaitOut => return Ok(Cleanup::Pending),
    }
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version: lease.metadata.resource_version.clone(),
            uid: lease.metadata.uid.clone(),
        }),
        ..DeleteParams::default()
    };
    match leases.delete(&name, &dp).await {
        Ok(_) => Ok(Cleanup::Done),
        // Gone already, or changed under us (someone took the guard): leave it.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(Cleanup::Done),
        Err(e) => Err(e.into()),
    }
}

/// Deleting a Sandbox that left workspace directories on lost nodes: each removed if its node
/// is back, else given up with a Warning Event. What is done is recorded, so the next poll
/// does not start over.
async fn remove_abandoned(sbx: &Sandbox, ctx: &Context, apis: &Apis) -> Result<Cleanup, Error> {
    let old = sbx.status.clone().unwrap_or_default();
    if old.abandoned.is_empty() {
        return Ok(Cleanup::Done);
    }
    let mut st = old.clone();
    let again = abandoned::sweep(sbx, ctx, apis, &mut st, true).await?;
    if st != old {
        write_status(apis, sbx, &st).await?;
    }
    Ok(if again.is_some() || !st.abandoned.is_empty() {
        Cleanup::Pending
    } else {
        Cleanup::Done
    })
}

/// Without a helper image the workspace cannot be removed: the sandbox's own image is never run
/// for it (its `rm` is whatever the image author made it). The Sandbox stays, Terminating, with
/// the [`conditions::WORKSPACE_REMOVED`] condition and a Warning Event naming the directory, so
/// nothing is left behind unseen.
async fn no_helper_for_cleanup(
    sbx: &Sandbox,
    ctx: &Context,
    apis: &Apis,
    at: NodeDir<'_>,
) -> Error {
    let (node, dir) = (at.node, at.dir);
    let msg = format!(
        "workspace directory {dir} on node {node} cannot be removed: this operator has no helper image (--helper-image). The Sandbox stays until an operator with one removes it; to let it go anyway, remove the finalizer {FINALIZER} and the directory by hand"
    );
    let old = sbx.status.clone().unwrap_or_default();
    let mut st = old.clone();
    st.phase = Some(SandboxPhase::Terminating);
    conditions::set(
        &mut st.conditions,
        conditions::WORKSPACE_REMOVED,
        false,
        "NoHelperImage",
        &msg,
        sbx.metadata.generation,
        Timestamp::now(),
    );
    let note = Note {
        type_: EventType::Warning,
        reason: "NoHelperImage".into(),
        action: "DeleteWorkspace",
        message: msg.clone(),
    };
    let writer = Writer { sbx, ctx, apis };
    if let Err(e) = writer.transition(&old, &st, Some(note)).await {
        warn!(sandbox = %sbx.name_any(), "could not record the stuck cleanup: {e}");
    }
    Error::NoHelper(msg)
}
