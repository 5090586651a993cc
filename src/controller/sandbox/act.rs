//! Carries out a [`Plan`]: the writes and execs of one reconcile of a live Sandbox. [`act`]
//! is the driver: one arm per [`Step`], the short ones here, the long ones each in the module
//! named for it (`create`: a pod made or a warm one claimed; `serve`: the pod initialised and
//! reported; `suspend`; `lost`: a node's loss), each given the Sandbox and the reconcile's
//! [`Hands`] (what it works with, apart from what it works on). Each step ends in at most
//! one status write, made only when the status changed, with the Event that goes with it.

use std::time::Duration;

use kube::ResourceExt;
use kube::api::DeleteParams;
use kube::runtime::controller::Action;
use tracing::debug;

use super::decide::{Plan, Step};
use super::hands::{Hands, Transition};
use super::observe::World;
use super::write::delete_if_present;
use super::{create, lost, serve, suspend};
use crate::controller::context::{Error, Note};
use crate::controller::pod;
use crate::controller::{placement, service};
use agentbox_api::crd::Sandbox;
use agentbox_api::labels;

/// `Some(d)`: look again after `d`; `None`: on the next change.
fn then(requeue: Option<Duration>) -> Action {
    requeue.map_or_else(Action::await_change, Action::requeue)
}

/// Carries out `plan`, as decided from `world`.
pub async fn act(h: &Hands<'_>, sbx: &Sandbox, world: World, plan: Plan) -> Result<Action, Error> {
    let Plan {
        step,
        status,
        note,
        requeue,
    } = plan;
    let t = Transition { status, note };
    // The pod found (it may not have the recorded or derived name: see
    // `observe::find_pod`).
    let pod_name = world
        .pod
        .as_ref()
        .map_or_else(|| placement::pod_name(sbx), |p| p.name_any());
    match step {
        Step::Invalid => return refuse(h, sbx, &world, &pod_name, t, requeue).await,
        Step::ShutDown => return shut_down(h, sbx, t.note).await,
        _ => expose(h, sbx, &world).await?,
    }
    let old = &world.old;
    match step {
        Step::Suspend => match suspend::suspend(h, sbx, old, &pod_name, t).await? {
            true => Ok(then(requeue)),
            false => Ok(Action::requeue(Duration::from_secs(2))),
        },
        Step::CreatePod => create::create_pod(h, sbx, &world, t.status, requeue).await,
        Step::AwaitPodGone => {
            if old != &t.status {
                h.writer(sbx).status(&t.status).await?;
            }
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Step::PodNameConflict => {
            h.writer(sbx).transition(old, &t.status, t.note).await?;
            Ok(Action::requeue(Duration::from_secs(60)))
        }
        Step::ReplacePod => {
            h.writer(sbx).publish(t.note).await;
            delete_if_present(&h.apis.pods, &pod_name).await?;
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Step::Serve => serve::serve_found(h, sbx, &world, t.status, requeue).await,
        Step::NodeLost(lost) => lost::node_lost(h, sbx, &world, &pod_name, t.status, &lost).await,
        Step::Invalid | Step::ShutDown => Ok(Action::await_change()),
    }
}

/// The spec cannot be honoured: a pod of ours goes, the refusal is recorded.
async fn refuse(
    h: &Hands<'_>,
    sbx: &Sandbox,
    world: &World,
    pod_name: &str,
    t: Transition,
    requeue: Option<Duration>,
) -> Result<Action, Error> {
    if world.pod_ours {
        delete_if_present(&h.apis.pods, pod_name).await?;
    }
    h.writer(sbx)
        .transition(&world.old, &t.status, t.note)
        .await?;
    Ok(then(requeue))
}

/// `shutdownTime` has passed: the Sandbox deletes itself.
async fn shut_down(h: &Hands<'_>, sbx: &Sandbox, note: Option<Note>) -> Result<Action, Error> {
    // The delete's cleanup (the on-stop snapshot, the workspace) needs the finalizer on.
    h.apis.metadata.needed(&h.apis.sandboxes, sbx).await?;
    h.writer(sbx).publish(note).await;
    h.apis
        .sandboxes
        .delete(&sbx.name_any(), &DeleteParams::default())
        .await?;
    Ok(Action::await_change())
}

/// What the spec exposes: the egress policy and the Service of `spec.ports` (where each port
/// is reached is in the planned status).
async fn expose(h: &Hands<'_>, sbx: &Sandbox, world: &World) -> Result<(), Error> {
    ensure_network_policy(h, sbx, world).await?;
    if service::ensure(&h.apis.services, sbx, &world.old).await? > 0 {
        debug!(sandbox = %sbx.name_any(), "applied the Service of spec.ports");
    }
    Ok(())
}

/// Makes the egress policy over the sandbox's pod what its (resolved) spec asks for: its own
/// policy, or for a templated sandbox its template's (shared by the template's pods, so a
/// claim of a warm pod finds it in place); removed for egress `All`. Writes nothing when it
/// is already as wanted, so an edit of `network` applies on the next reconcile, without a
/// restart.
async fn ensure_network_policy(h: &Hands<'_>, sbx: &Sandbox, world: &World) -> Result<(), Error> {
    let default = h.podcfg.default_egress;
    let proxy = h.podcfg.proxy.as_ref();
    let (name, desired) = match (sbx.spec.template_ref.as_ref(), world.template.as_ref()) {
        (Some(t), Some(used)) => (
            labels::template_policy_name(&t.name),
            pod::build_template_policy(used, sbx.namespace(), &sbx.spec, default, proxy),
        ),
        _ => (
            labels::network_policy_name(&sbx.name_any()),
            pod::build_egress_policy(sbx, default, proxy),
        ),
    };
    crate::controller::policy::apply(&h.apis.policies, &name, desired, world.policy.as_ref()).await
}
