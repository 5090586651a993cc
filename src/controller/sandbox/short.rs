//! The short steps of a reconcile, a few writes each: a spec refused, `shutdownTime` reached,
//! a pod awaited as it goes, a pod name taken by something else, a pod replaced, and a
//! template that does not exist.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::DeleteParams;
use kube::runtime::controller::Action;

use super::observe::{self, World};
use super::status;
use super::status::Transition;
use super::tools::Tools;
use super::write::delete_if_present;
use crate::controller::context::{Error, Note};
use agentbox_api::crd::{Sandbox, SandboxStatus};

/// `Some(d)`: look again after `d`; `None`: on the next change.
pub(super) fn then(requeue: Option<Duration>) -> Action {
    requeue.map_or_else(Action::await_change, Action::requeue)
}

/// The spec cannot be honoured: a pod of ours goes, the refusal is recorded.
pub(super) async fn refuse(
    h: &Tools<'_>,
    sbx: &Sandbox,
    world: &World,
    t: Transition,
    requeue: Option<Duration>,
) -> Result<Action, Error> {
    if world.pod_ours {
        delete_if_present(&h.apis.pods, &observe::pod_name(sbx, world)).await?;
    }
    h.writer(sbx)
        .transition(&world.old, &t.status, t.note)
        .await?;
    Ok(then(requeue))
}

/// `shutdownTime` has passed: the Sandbox deletes itself.
pub(super) async fn shut_down(
    h: &Tools<'_>,
    sbx: &Sandbox,
    note: Option<Note>,
) -> Result<Action, Error> {
    // The delete's cleanup (the on-stop snapshot, the workspace) needs the finalizer on.
    h.apis.metadata.needed(&h.apis.sandboxes, sbx).await?;
    h.writer(sbx).publish(note).await;
    h.apis
        .sandboxes
        .delete(&sbx.name_any(), &DeleteParams::default())
        .await?;
    Ok(Action::await_change())
}

/// The pod is terminating: the status says so, and the next look follows shortly.
pub(super) async fn await_pod_gone(
    h: &Tools<'_>,
    sbx: &Sandbox,
    old: &SandboxStatus,
    t: Transition,
) -> Result<Action, Error> {
    if old != &t.status {
        h.writer(sbx).status(&t.status).await?;
    }
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// A pod of the sandbox's name belongs to something else: said, and looked at again later.
pub(super) async fn name_conflict(
    h: &Tools<'_>,
    sbx: &Sandbox,
    old: &SandboxStatus,
    t: Transition,
) -> Result<Action, Error> {
    h.writer(sbx).transition(old, &t.status, t.note).await?;
    Ok(Action::requeue(Duration::from_secs(60)))
}

/// The pod must go (its spec changed, or it ended): deleted, with the Event that says why; a
/// later reconcile makes the new one.
pub(super) async fn replace_pod(
    h: &Tools<'_>,
    sbx: &Sandbox,
    pod_name: &str,
    note: Option<Note>,
) -> Result<Action, Error> {
    h.writer(sbx).publish(note).await;
    delete_if_present(&h.apis.pods, pod_name).await?;
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// The template `name` the Sandbox names does not exist: Pending with its reason. The
/// template's watch brings the sandbox back when it is created.
pub(super) async fn template_missing(
    h: &Tools<'_>,
    sbx: &Sandbox,
    name: &str,
) -> Result<Action, Error> {
    let (old, st, note) = status::template_missing(sbx, name, k8s_openapi::jiff::Timestamp::now());
    h.writer(sbx).transition(&old, &st, Some(note)).await?;
    Ok(Action::await_change())
}
