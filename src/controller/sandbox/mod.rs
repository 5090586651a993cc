//! One reconcile top to bottom: deletion → cleanup; stale → requeue; template and reads →
//! [`observe`] → [`plan`] (pure) → one arm per [`Step`], a module each that returns its outcome
//! here and calls no other step; [`status`] (serve's: [`readiness`]) says what it makes of status.

mod abandoned;
pub mod claim;
mod cleanup;
mod create;
mod expose;
pub mod first_start;
pub mod idle;
mod init;
pub mod init_plan;
mod lost;
pub mod observe;
pub mod orphan;
pub mod plan;
mod readiness;
pub mod restore;
#[cfg(test)]
mod scenarios;
mod serve;
pub mod service;
mod short;
pub mod sources;
pub mod status;
mod suspend;
mod tools;
pub mod triggers;
pub mod write;

use std::{sync::Arc, time::Duration, time::Instant};

use kube::{ResourceExt, runtime::controller::Action};

use super::{context::Context, context::Error, effective, effective::Effective, pod::PodConfig};
use agentbox_api::crd::Sandbox;
use {create::Created, observe::World, plan::Plan, plan::Step, serve::Outcome, tools::Tools};
use {write::Apis, write::MetadataGate};

/// Reconciles one Sandbox.
pub async fn reconcile(sbx: Arc<Sandbox>, ctx: Arc<Context>) -> Result<Action, Error> {
    if sbx.metadata.deletion_timestamp.is_some() {
        return cleanup::deleting(&sbx, &ctx).await;
    }
    if write::SUPERSEDED.is_stale(&sbx, Instant::now()) {
        // A version this process wrote over: acting on it would repeat its writes (its newer
        // version's event brings us back; the requeue is the fallback).
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    write::with_metadata(&sbx, &ctx, |gate| start(sbx.clone(), ctx.clone(), gate)).await
}

/// A live Sandbox past its metadata: the template and the reads that need only its name, UID,
/// scope and status (no template sets them) side by side, then observe → plan → the step.
async fn start(sbx: Arc<Sandbox>, ctx: Arc<Context>, gate: MetadataGate) -> Result<Action, Error> {
    let apis = Apis::new(&ctx, &sbx.namespace().ok_or(Error::NotNamespaced)?, gate);
    let _claiming = plan::may_be_first_claim(&sbx).then(|| ctx.pool_claims.in_flight());
    let (resolved, reads) = tokio::join!(
        effective::effective_cached(&ctx, &sbx),
        observe::read(&sbx, &ctx, &apis)
    );
    let podcfg = PodConfig::from_config(&ctx.config);
    let h = Tools::new(&ctx, &apis, &podcfg);
    // From here on the sandbox is its effective spec: with a template, resolved against it.
    let (sbx, template) = match resolved? {
        Effective::Own => (sbx, None),
        Effective::Templated(resolved, used) => (Arc::new(*resolved), Some(used)),
        Effective::Missing(name) => return short::template_missing(&h, &sbx, &name).await,
    };
    let world = observe::observe(&sbx, &ctx, &podcfg, template, reads?).await?;
    let plan = plan::decide(&sbx, &world);
    Box::pin(act(&h, &sbx, world, plan)).await // boxed, as the steps: one future overflowed a stack
}

/// One arm per step of `plan`; each ends in at most one status write and its Event.
async fn act(h: &Tools<'_>, sbx: &Sandbox, world: World, plan: Plan) -> Result<Action, Error> {
    let (step, t, requeue) = plan.into_parts();
    let (old, pod_name) = (&world.old, observe::pod_name(sbx, &world));
    match step {
        Step::Invalid => return short::refuse(h, sbx, &world, t, requeue).await,
        Step::ShutDown => return short::shut_down(h, sbx, t.note).await,
        _ => expose::expose(h, sbx, &world).await?,
    }
    match step {
        Step::Suspend => suspend::suspend(h, sbx, old, &pod_name, t, requeue).await,
        Step::CreatePod => match Box::pin(create::create_pod(h, sbx, &world, t.status)).await? {
            Created::Done(action) => Ok(action),
            Created::Claimed(claimed) => {
                let served =
                    Box::pin(serve::serve_claimed(h, sbx, &world, claimed, requeue)).await?;
                after_serve(h, sbx, served).await
            }
            Created::Unplaced(mut st) => {
                let pin = lost::pin(h, sbx, &mut st).await?;
                Box::pin(create::apply_pod(h, sbx, &world, st, pin)).await
            }
        },
        Step::AwaitPodGone => short::await_pod_gone(h, sbx, old, t).await,
        Step::PodNameConflict => short::name_conflict(h, sbx, old, t).await,
        Step::ReplacePod => short::replace_pod(h, sbx, &pod_name, t.note).await,
        Step::Serve => {
            let served = Box::pin(serve::serve_found(h, sbx, &world, t.status, requeue)).await?;
            after_serve(h, sbx, served).await
        }
        Step::NodeLost(l) => {
            Box::pin(lost::node_lost(h, sbx, &world, &pod_name, t.status, &l)).await
        }
        Step::Invalid | Step::ShutDown => Ok(Action::await_change()),
    }
}

/// The serve step's outcome: done, or the operator's suspension it calls for.
async fn after_serve(h: &Tools<'_>, sbx: &Sandbox, served: Outcome) -> Result<Action, Error> {
    match served {
        Outcome::Done(action) => Ok(action),
        Outcome::IdleSuspend(st) => suspend::idle_suspend(h, sbx, st).await,
        Outcome::OverLimitSuspend(st, why) => suspend::over_limit_suspend(h, sbx, st, &why).await,
    }
}
