//! The suspend step and the idle timeout's suspension: never under a harness at work.

use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use tracing::{debug, info, warn};

use super::idle;
use super::status;
use super::status::Transition;
use super::tools::Tools;
use super::write::{SUPERSEDED, delete_if_present, write_status};
use crate::controller::context::{self, Error, FIELD_MANAGER};
use crate::controller::snapshot;
use crate::metrics::{GuardOp, GuardOutcome};
use agentbox_api::crd::{LifecycleMode, Sandbox, SandboxStatus};
use agentbox_api::guard::{self, GuardConfig, GuardError};

/// Suspends: takes the on-stop snapshot the spec asks for, deletes the pod, records the
/// transition. Looked at again as planned once the pod is gone, else shortly (it still
/// terminates, the snapshot runs, or a harness holds the scope's guard).
///
/// Never under a harness at work: the pod goes under the hold the harness handed over in
/// `spec.lifecycle.guard` (it keeps the guard until the sandbox is Suspended, so nobody
/// starts work in between), else under the operator's own guard, not waited for (a
/// harness at work keeps its pod until it lets go; its release, a watched Lease event,
/// brings the next look).
pub(super) async fn suspend(
    h: &Tools<'_>,
    sbx: &Sandbox,
    old: &SandboxStatus,
    pod_name: &str,
    t: Transition,
    requeue: Option<Duration>,
) -> Result<Action, Error> {
    Ok(match stop_pod(h, sbx, old, pod_name, t).await? {
        true => requeue.map_or_else(Action::await_change, Action::requeue),
        false => Action::requeue(Duration::from_secs(2)),
    })
}

/// The suspend step's work (see [`suspend`]): whether the pod is gone.
async fn stop_pod(
    h: &Tools<'_>,
    sbx: &Sandbox,
    old: &SandboxStatus,
    pod_name: &str,
    t: Transition,
) -> Result<bool, Error> {
    match h.apis.pods.get_opt(pod_name).await? {
        None => {
            // Gone already: nothing to stop, no guard to take.
            h.writer(sbx).transition(old, &t.status, t.note).await?;
            return Ok(true);
        }
        Some(p) if p.metadata.deletion_timestamp.is_some() => {
            // Going already (asked to under the guard by an earlier look): its going
            // brings the next look. Taking the guard again here wrote the Lease twice per
            // look, and each write, a watched Lease event, brought another look: ~20–90
            // Lease writes per suspension until the pod was gone (hack/bench's idle
            // figures).
            h.writer(sbx).transition(old, &t.status, t.note).await?;
            return Ok(false);
        }
        Some(_) => {}
    }
    let handed = context::handed_off_hold(h.ctx, sbx).await?;
    // spec.snapshot.onStop: persist the workspace before its pod goes.
    let hold = handed.as_ref().map(|(h, _)| h.clone());
    if snapshot::on_stop(h.ctx, sbx, hold).await? == snapshot::OnStop::Wait {
        return Ok(false);
    }
    let own = match &handed {
        Some(_) => None,
        None => match take_guard(h, sbx, "suspend", None).await? {
            Some(g) => Some(g),
            None => return Ok(false),
        },
    };
    let pods = &h.apis.pods;
    let deleted = match (&handed, &own) {
        (Some((_, h)), _) => h.run(delete_if_present(pods, pod_name)).await,
        (None, Some(g)) => g.run(delete_if_present(pods, pod_name)).await,
        (None, None) => Ok(delete_if_present(pods, pod_name).await),
    };
    if let Some(g) = own {
        release(g, &sbx.name_any()).await;
    }
    let gone = match deleted {
        Ok(r) => r?,
        // The hold went while the pod was being deleted: look again (the next look takes
        // the operator's own guard).
        Err(e) => {
            debug!(sandbox = %sbx.name_any(), "the guard went during the suspension: {e}");
            return Ok(false);
        }
    };
    h.writer(sbx).transition(old, &t.status, t.note).await?;
    Ok(gone)
}

/// The scope's guard for the operator's `purpose`, not waited for: `None` when someone
/// holds it (their release, a watched Lease event, brings the next look). The outcome is
/// counted under `counted`, if given.
async fn take_guard(
    h: &Tools<'_>,
    sbx: &Sandbox,
    purpose: &str,
    counted: Option<GuardOp>,
) -> Result<Option<guard::Guard>, Error> {
    let cfg = GuardConfig {
        holder: context::operator_holder(h.ctx, purpose),
        ..GuardConfig::default()
    };
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let scope = &sbx.spec.scope;
    let client = h.ctx.client.clone();
    let started = Instant::now();
    let taken = guard::acquire_scope(client, &ns, scope, &cfg, Some(Duration::ZERO)).await;
    if let Some(op) = counted {
        let outcome = match &taken {
            Ok(_) => GuardOutcome::Acquired,
            Err(GuardError::Timeout { .. }) => GuardOutcome::Busy,
            Err(_) => GuardOutcome::Error,
        };
        let waited = started.elapsed();
        h.ctx.metrics.guard_waited(op, outcome, waited);
    }
    match taken {
        Ok(g) => Ok(Some(g)),
        Err(GuardError::Timeout { holder, .. }) => {
            debug!(sandbox = %sbx.name_any(), %holder, "{purpose} waits for the scope's guard");
            Ok(None)
        }
        Err(e) => Err(Error::Guard(e)),
    }
}

/// Suspends a sandbox whose idle timeout has passed, without ever suspending one under a
/// harness: takes the scope's guard (not waiting: a harness that holds or takes it first
/// keeps its sandbox), then, under it, sets `spec.lifecycle.mode: Suspended` with the
/// resourceVersion read as precondition (a sandbox changed since — resumed, edited — is
/// looked at again instead), writes the idle suspension's status and Event, and releases
/// the guard. A harness that asks for the guard meanwhile gets it afterwards and finds the
/// sandbox Suspended, which `get_or_create` resumes. The suspend step that the mode change
/// brings takes the on-stop snapshot and deletes the pod, as for any suspend.
pub(super) async fn idle_suspend(
    h: &Tools<'_>,
    sbx: &Sandbox,
    st: SandboxStatus,
) -> Result<Action, Error> {
    let finish = |st: &mut SandboxStatus, generation| {
        let timeout = idle::timeout(sbx).unwrap_or_default();
        let note = status::idle_suspended(st, timeout, generation, Timestamp::now());
        h.ctx.metrics.idle_suspended();
        note
    };
    operator_suspend(
        h,
        sbx,
        st,
        "idle-suspend",
        Some(GuardOp::IdleSuspend),
        finish,
    )
    .await
}

/// Suspends a sandbox whose workspace holds more than its size limit (measured where the
/// node root gives no hard limit), as the idle timeout does ([`idle_suspend`]): Suspended
/// rather than Failed, because the workspace is the user's data and stays on the node (and
/// in the on-stop snapshot, if the spec asks for one); a raised `workspace.sizeLimit`, or
/// data removed, and a resume bring it back. `message` says why (the Warning Event's).
pub(super) async fn over_limit_suspend(
    h: &Tools<'_>,
    sbx: &Sandbox,
    st: SandboxStatus,
    message: &str,
) -> Result<Action, Error> {
    let finish = |st: &mut SandboxStatus, generation| {
        h.ctx.metrics.over_limit_suspended();
        status::over_limit_suspended(st, message, generation, Timestamp::now())
    };
    operator_suspend(h, sbx, st, "over-limit-suspend", None, finish).await
}

/// Sets `spec.lifecycle.mode: Suspended` under the scope's guard (see [`idle_suspend`]) and
/// writes the status `finish` makes (given the new generation), with its Event.
async fn operator_suspend(
    h: &Tools<'_>,
    sbx: &Sandbox,
    mut st: SandboxStatus,
    purpose: &str,
    counted: Option<GuardOp>,
    finish: impl FnOnce(&mut SandboxStatus, Option<i64>) -> context::Note,
) -> Result<Action, Error> {
    let name = sbx.name_any();
    let Some(g) = take_guard(h, sbx, purpose, counted).await? else {
        // A harness got there first: not idle. Its release brings the next look; the
        // requeue is the fallback.
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": sbx.resource_version()},
        "spec": {"lifecycle": {"mode": LifecycleMode::Suspended}},
    });
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let written = g
        .run(h.apis.sandboxes.patch(&name, &pp, &Patch::Merge(&patch)))
        .await
        .map_err(Error::Guard)
        .and_then(|r| r.map_err(Error::from));
    let updated = match written {
        Ok(u) => u,
        Err(e) => {
            release(g, &name).await;
            if let Error::Kube(kube::Error::Api(s)) = &e
                && s.code == 409
            {
                // Changed since it was read: the newer version's event brings a fresh look.
                debug!(sandbox = %name, "the sandbox changed as it was to be suspended ({purpose}); looking again");
                return Ok(Action::requeue(Duration::from_millis(500)));
            }
            return Err(e);
        }
    };
    SUPERSEDED.record(sbx, Instant::now());
    let generation = updated.metadata.generation;
    let note = finish(&mut st, generation);
    info!("{}", note.message);
    h.writer(sbx).publish(Some(note)).await;
    // Written over the version the mode change returned, so that version, seen without
    // this status, is not acted on as a plain suspend.
    let status = write_status(h.apis, &updated, &st).await;
    release(g, &name).await;
    status?;
    Ok(Action::await_change())
}

/// Releases a guard the operator took; a failure only delays others until it expires.
async fn release(g: guard::Guard, sandbox: &str) {
    if let Err(e) = g.release().await {
        warn!(sandbox, "could not release the scope's guard: {e}");
    }
}
