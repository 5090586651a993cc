//! Carries out a [`Plan`]: the writes and execs of one reconcile of a live Sandbox. [`act`]
//! is the driver: one arm per [`Step`], the short ones here, the long ones each in the module
//! named for it (`create`: a pod made or a warm one claimed; `serve`: the pod initialised and
//! reported; `suspend`; `lost`: a node's loss). Each step ends in at most one status write,
//! made only when the status changed, with the Event that goes with it.

use std::time::Duration;

use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use tracing::debug;

use super::decide::{Plan, Step};
use super::observe::World;
use super::write::{Apis, Writer, delete_if_present};
use crate::controller::context::{Context, Error, FIELD_MANAGER, Note};
use crate::controller::pod::{self, PodConfig, SPEC_HASH};
use crate::controller::{placement, service};
use agentbox_api::crd::{Egress, Sandbox, SandboxStatus};

/// One reconcile's hands: the sandbox (its effective spec), the operator's context, the
/// namespace's API handles and the pod settings. The steps are its methods.
#[derive(Clone, Copy)]
pub(super) struct Act<'a> {
    /// The Sandbox, with its template applied.
    pub sbx: &'a Sandbox,
    /// The operator's context.
    pub ctx: &'a Context,
    /// The namespace's API handles.
    pub apis: &'a Apis,
    /// How the operator builds pods.
    pub podcfg: &'a PodConfig<'a>,
}

/// A status to write with the Event that says why.
pub(super) struct Transition {
    /// The status after the step.
    pub status: SandboxStatus,
    /// The Event that goes with it.
    pub note: Option<Note>,
}

/// `Some(d)`: look again after `d`; `None`: on the next change.
fn then(requeue: Option<Duration>) -> Action {
    requeue.map_or_else(Action::await_change, Action::requeue)
}

impl<'a> Act<'a> {
    /// Where the status and Events go.
    pub fn writer(&self) -> Writer<'a> {
        Writer {
            sbx: self.sbx,
            ctx: self.ctx,
            apis: self.apis,
        }
    }

    /// Carries out `plan`, as decided from `world`.
    pub async fn act(&self, world: World, plan: Plan) -> Result<Action, Error> {
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
            .map_or_else(|| placement::pod_name(self.sbx), |p| p.name_any());
        match step {
            Step::Invalid => return self.refuse(&world, &pod_name, t, requeue).await,
            Step::ShutDown => return self.shut_down(t.note).await,
            _ => self.expose(&world).await?,
        }
        let old = &world.old;
        match step {
            Step::Suspend => match self.suspend(old, &pod_name, t).await? {
                true => Ok(then(requeue)),
                false => Ok(Action::requeue(Duration::from_secs(2))),
            },
            Step::CreatePod => self.create_pod(&world, t.status, requeue).await,
            Step::AwaitPodGone => {
                if old != &t.status {
                    self.writer().status(&t.status).await?;
                }
                Ok(Action::requeue(Duration::from_secs(1)))
            }
            Step::PodNameConflict => {
                self.writer().transition(old, &t.status, t.note).await?;
                Ok(Action::requeue(Duration::from_secs(60)))
            }
            Step::ReplacePod => {
                self.writer().publish(t.note).await;
                delete_if_present(&self.apis.pods, &pod_name).await?;
                Ok(Action::requeue(Duration::from_secs(1)))
            }
            Step::Serve => self.serve_found(&world, t.status, requeue).await,
            Step::NodeLost(lost) => self.node_lost(&world, &pod_name, t.status, &lost).await,
            Step::Invalid | Step::ShutDown => Ok(Action::await_change()),
        }
    }

    /// The spec cannot be honoured: a pod of ours goes, the refusal is recorded.
    async fn refuse(
        &self,
        world: &World,
        pod_name: &str,
        t: Transition,
        requeue: Option<Duration>,
    ) -> Result<Action, Error> {
        if world
            .pod
            .as_ref()
            .is_some_and(|p| placement::controlled_by(p, self.sbx))
        {
            delete_if_present(&self.apis.pods, pod_name).await?;
        }
        self.writer()
            .transition(&world.old, &t.status, t.note)
            .await?;
        Ok(then(requeue))
    }

    /// `shutdownTime` has passed: the Sandbox deletes itself.
    async fn shut_down(&self, note: Option<Note>) -> Result<Action, Error> {
        // The delete's cleanup (the on-stop snapshot, the workspace) needs the finalizer on.
        self.apis
            .metadata
            .needed(&self.apis.sandboxes, self.sbx)
            .await?;
        self.writer().publish(note).await;
        self.apis
            .sandboxes
            .delete(&self.sbx.name_any(), &DeleteParams::default())
            .await?;
        Ok(Action::await_change())
    }

    /// What the spec exposes: the deny-egress policy and the Service of `spec.ports` (where
    /// each port is reached is in the planned status).
    async fn expose(&self, world: &World) -> Result<(), Error> {
        ensure_network_policy(self.sbx, &self.apis.policies, world.policy.as_ref()).await?;
        if service::ensure(&self.apis.services, self.sbx, &world.old).await? > 0 {
            debug!(sandbox = %self.sbx.name_any(), "applied the Service of spec.ports");
        }
        Ok(())
    }
}

/// Creates the deny-egress policy when asked for, removes it when not; writes nothing when it
/// is already as wanted.
async fn ensure_network_policy(
    sbx: &Sandbox,
    api: &Api<NetworkPolicy>,
    current: Option<&NetworkPolicy>,
) -> Result<(), Error> {
    let desired = pod::build_deny_egress(sbx);
    let name = desired.metadata.name.clone().unwrap_or_default();
    match (sbx.spec.pod.network.egress, current) {
        // Compare by the hash of what we asked for: the API server drops empty lists
        // (`egress: []`), so the stored spec never equals the desired one field by field.
        (Egress::Denied, Some(np))
            if np.annotations().get(SPEC_HASH) == desired.annotations().get(SPEC_HASH) =>
        {
            Ok(())
        }
        (Egress::Denied, _) => {
            api.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&desired),
            )
            .await?;
            Ok(())
        }
        (Egress::All, Some(_)) => {
            delete_if_present(api, &name).await?;
            Ok(())
        }
        (Egress::All, None) => Ok(()),
    }
}
