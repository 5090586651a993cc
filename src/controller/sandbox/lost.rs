//! A node's loss: the sandbox's workspace on a lost node given up (recorded for cleanup when
//! the node returns) with what the recovery will restore, its pod force-deleted, the next
//! pod placed elsewhere.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use tracing::{debug, warn};

use super::observe::{World, node_health};
use super::status::{self, Lost, Stamp};
use super::tools::Tools;
use super::write::force_delete;
use crate::controller::context::{Error, Note};
use crate::controller::nodeloss::NodeHealth;
use crate::controller::{placement, restore_source};
use agentbox_api::crd::{Sandbox, SandboxSnapshot, SandboxStatus};

/// The pod's node is lost: records the loss once (a repeat, after a failed force-delete,
/// only deletes), then force-deletes the pod.
pub(super) async fn node_lost(
    h: &Tools<'_>,
    sbx: &Sandbox,
    world: &World,
    pod_name: &str,
    mut st: SandboxStatus,
    lost: &Lost,
) -> Result<Action, Error> {
    let old = &world.old;
    let recorded = old.node_loss.as_ref().is_some_and(|l| l.node == lost.node)
        && old.abandoned.iter().any(|a| a.node == lost.node);
    if !recorded {
        let dir = placement::host_dir_with(sbx, world.pod.as_ref(), h.podcfg.node_root);
        let note = lose_node(h, sbx, &mut st, lost, &dir).await?;
        h.writer(sbx).transition(old, &st, Some(note)).await?;
    }
    let uid = world.pod.as_ref().and_then(|p| p.uid());
    force_delete(&h.apis.pods, pod_name, uid).await?;
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// The node the next pod must land on: the one holding the workspace (ready, or not
/// ready for less than the grace), or anywhere (`None`) when there is no workspace on a
/// node yet or its node is lost — then the workspace is given up in `st` first and the
/// next start is B (restore) or D (fresh), on another node.
pub(super) async fn pin(
    h: &Tools<'_>,
    sbx: &Sandbox,
    st: &mut SandboxStatus,
) -> Result<Option<String>, Error> {
    let Some(node) = st.node_name.clone() else {
        return Ok(None);
    };
    let (since, why) = match node_health(h.ctx, &node, Timestamp::now()).await? {
        NodeHealth::Alive | NodeHealth::Suspect { .. } => return Ok(Some(node)),
        NodeHealth::Lost { since, why } => (since, why),
    };
    let dir = placement::recorded_in(st)
        .unwrap_or_else(|| placement::derived_host_dir(sbx, h.podcfg.node_root));
    let lost = Lost { node, since, why };
    let note = lose_node(h, sbx, st, &lost, &dir).await?;
    h.writer(sbx).publish(Some(note)).await;
    Ok(None)
}

/// Gives the workspace `dir` on the lost node up in `st` (see [`status::node_lost`]),
/// with what the recovery will restore; counts the loss. Returns the Event that says so.
async fn lose_node(
    h: &Tools<'_>,
    sbx: &Sandbox,
    st: &mut SandboxStatus,
    lost: &Lost,
    dir: &str,
) -> Result<Note, Error> {
    let recovery = status::Recovery {
        snapshot: recovery_snapshot(h, sbx).await?,
    };
    let stamp = Stamp {
        generation: sbx.metadata.generation,
        now: Timestamp::now(),
    };
    let note = status::node_lost(st, lost, dir, &recovery, stamp);
    h.ctx.metrics.node_lost();
    warn!("{}", note.message);
    Ok(note)
}

/// The snapshot a recovery will restore (what the restore policy points at) and when it
/// completed. `None` without a store or a snapshot; a refused one (a named snapshot gone,
/// of another scope) is left to the restore to report.
async fn recovery_snapshot(
    h: &Tools<'_>,
    sbx: &Sandbox,
) -> Result<Option<(String, Timestamp)>, Error> {
    let (ctx, sbx) = (h.ctx, sbx);
    if ctx.store.is_none() {
        return Ok(None);
    }
    let name = match restore_source::candidate(ctx, sbx).await {
        Ok(Some(name)) => name,
        Ok(None) => return Ok(None),
        Err(Error::Kube(e)) => return Err(Error::Kube(e)),
        Err(e) => {
            debug!(sandbox = %sbx.name_any(), "no snapshot for the recovery: {e}");
            return Ok(None);
        }
    };
    let snaps: Api<SandboxSnapshot> =
        Api::namespaced(ctx.client.clone(), &sbx.namespace().unwrap_or_default());
    let done = snaps
        .get_opt(&name)
        .await?
        .and_then(|s| s.status)
        .and_then(|s| s.completed_at);
    Ok(done.map(|t| (name, t.0)))
}
