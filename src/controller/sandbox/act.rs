//! Carries out a [`Plan`]: the writes and execs of one reconcile of a live Sandbox. Each step
//! ends in at most one status write, made only when the status changed, with the Event that
//! goes with it.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use tracing::{debug, info, warn};

use super::decide::{self, Init, Plan, Serving, Step};
use super::idle::{self, Idle};
use super::observe::World;
use super::observe::node_health;
use super::write::{
    Apis, delete_by_uid, delete_if_present, force_delete, write_status, write_transition,
};
use super::{abandoned, claim, init};
use crate::controller::context::Note;
use crate::controller::context::{Context, Error, FIELD_MANAGER};
use crate::controller::helper_pod;
use crate::controller::nodeloss::NodeHealth;
use crate::controller::pod::{self, PodConfig, SPEC_HASH};
use crate::controller::podstate::{self, PodState, may_answer_exec, pod_age};
use crate::controller::{
    conditions, noderoot, placement, restore_source, runtime, service, snapshot, sources,
};
use crate::metrics::{COLD, ExecOp, GuardOp, GuardOutcome, Metrics, WARM};
use agentbox_api::crd::{Egress, LifecycleMode, Sandbox, SandboxSnapshot, SandboxStatus};
use agentbox_api::guard::{self, GuardConfig, GuardError, LeaseView};
use agentbox_api::labels;

/// How soon a sandbox whose RuntimeClass does not exist looks again (RuntimeClasses are not
/// watched).
const RUNTIME_CLASS_POLL: Duration = Duration::from_secs(30);

/// Carries out `plan` for `sbx`, as decided from `world`.
pub async fn act(
    sbx: &Sandbox,
    ctx: &Context,
    apis: &Apis,
    podcfg: &PodConfig<'_>,
    world: World,
    plan: Plan,
) -> Result<Action, Error> {
    let Plan {
        step,
        status,
        note,
        requeue,
    } = plan;
    let old = &world.old;
    // The pod found (it may not have the recorded or derived name: see `observe::find_pod`).
    let pod_name = world
        .pod
        .as_ref()
        .map_or_else(|| placement::pod_name(sbx), |p| p.name_any());
    match step {
        Step::Invalid => {
            if world
                .pod
                .as_ref()
                .is_some_and(|p| placement::controlled_by(p, sbx))
            {
                delete_if_present(&apis.pods, &pod_name).await?;
            }
            write_transition(ctx, sbx, apis, old, &status, note).await?;
            return Ok(requeue.map_or_else(Action::await_change, Action::requeue));
        }
        Step::ShutDown => {
            // The delete's cleanup (the on-stop snapshot, the workspace) needs the finalizer on.
            apis.metadata.needed(&apis.sandboxes, sbx).await?;
            publish(ctx, sbx, note).await;
            apis.sandboxes
                .delete(&sbx.name_any(), &DeleteParams::default())
                .await?;
            return Ok(Action::await_change());
        }
        _ => {}
    }
    ensure_network_policy(sbx, &apis.policies, world.policy.as_ref()).await?;
    // Exposed ports: the Service (where each port is reached is in the planned status).
    if service::ensure(&apis.services, sbx, old).await? > 0 {
        debug!(sandbox = %sbx.name_any(), "applied the Service of spec.ports");
    }
    let then = |a: Option<Duration>| a.map_or_else(Action::await_change, Action::requeue);
    match step {
        Step::Suspend => suspend(sbx, ctx, (apis, &pod_name), old, (status, note))
            .await
            .map(|gone| {
                if gone {
                    then(requeue)
                } else {
                    Action::requeue(Duration::from_secs(2))
                }
            }),
        Step::CreatePod => {
            let guard = LeaseView::of(world.lease.as_ref(), world.now);
            let start = (&world, &guard, requeue);
            create_pod(sbx, ctx, (apis, podcfg), start, status).await
        }
        Step::AwaitPodGone => {
            if old != &status {
                write_status(apis, sbx, &status).await?;
            }
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Step::PodNameConflict => {
            write_transition(ctx, sbx, apis, old, &status, note).await?;
            Ok(Action::requeue(Duration::from_secs(60)))
        }
        Step::ReplacePod => {
            publish(ctx, sbx, note).await;
            delete_if_present(&apis.pods, &pod_name).await?;
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Step::Serve => {
            let Some(pod) = world.pod.as_ref() else {
                return Ok(Action::requeue(Duration::from_secs(1)));
            };
            second_pods(sbx, ctx, apis, pod, old).await?;
            let mut status = status;
            let mut requeue = requeue;
            if !status.abandoned.is_empty()
                && let Some(d) = abandoned::sweep(sbx, ctx, apis, &mut status, false).await?
            {
                requeue = Some(requeue.map_or(d, |r| r.min(d)));
            }
            let seen = (old, status, world.now);
            let guard = LeaseView::of(world.lease.as_ref(), world.now);
            serve(
                sbx,
                ctx,
                (apis, podcfg),
                (pod, world.pod_state.clone(), &guard, None),
                seen,
                requeue,
            )
            .await
        }
        Step::NodeLost { node, since, why } => {
            let mut st = status;
            // A repeat (the force-delete failed after the loss was recorded) only deletes.
            let recorded = old.node_loss.as_ref().is_some_and(|l| l.node == node)
                && old.abandoned.iter().any(|a| a.node == node);
            if !recorded {
                let dir = placement::host_dir_with(sbx, world.pod.as_ref(), podcfg.node_root);
                let note = lose_node(sbx, ctx, &mut st, (&node, since, &why), &dir).await?;
                write_transition(ctx, sbx, apis, old, &st, Some(note)).await?;
            }
            let uid = world.pod.as_ref().and_then(|p| p.uid());
            force_delete(&apis.pods, &pod_name, uid).await?;
            Ok(Action::requeue(Duration::from_secs(1)))
        }
        Step::Invalid | Step::ShutDown => Ok(Action::await_change()),
    }
}

/// Deletes the pods of `sbx` other than `served`, the one its status names: two operators
/// starting the same sandbox at once (a leader change) can each adopt a warm pod, or one adopt
/// and the other make the cold pod, before either sees the other's write; the status names
/// one, and the other would run until the Sandbox goes. Found in the pod cache (labelled for
/// the sandbox, controlled by it, not being deleted); each deletion is conditioned on the
/// pod's UID. Nothing while the status does not name `served` yet.
async fn second_pods(
    sbx: &Sandbox,
    ctx: &Context,
    apis: &Apis,
    served: &Pod,
    old: &SandboxStatus,
) -> Result<(), Error> {
    let name = served.name_any();
    if ctx.cache.is_none() || old.pod_name.as_deref() != Some(name.as_str()) {
        return Ok(());
    }
    let label = labels::sandbox_label_value(&sbx.name_any());
    let ns = sbx.namespace();
    let others: Vec<std::sync::Arc<Pod>> = ctx
        .pods
        .state()
        .into_iter()
        .filter(|p| {
            p.namespace() == ns
                && p.name_any() != name
                && p.metadata.deletion_timestamp.is_none()
                && p.labels().get(labels::SANDBOX) == Some(&label)
                && placement::controlled_by(p, sbx)
        })
        .collect();
    for other in others {
        info!(pod = %other.name_any(), "deleting a second pod of the sandbox (its status names {name})");
        delete_by_uid(&apis.pods, &other.name_any(), other.uid(), None).await?;
        // Its directory is no Sandbox's: the sweep's, once the pod has stopped.
        let node = other.spec.as_ref().and_then(|s| s.node_name.clone());
        let dir = placement::pod_host_dir(&other);
        if let (Some(node), Some(dir), Some(ns)) = (node, dir, other.namespace())
            && placement::recorded_host_dir(sbx).as_deref() != Some(dir.as_str())
            && let Some(entry) = placement::dir_name(&dir, &ctx.config.node_root, &ns)
        {
            ctx.sweep.add(crate::controller::memory::Hint {
                node,
                namespace: ns.clone(),
                dir: entry.to_string(),
            });
        }
    }
    Ok(())
}

/// Suspends: takes the on-stop snapshot the spec asks for, deletes the pod, records the
/// transition. Whether the pod is gone (false: it still terminates, the snapshot runs, or a
/// harness holds the scope's guard).
///
/// Never under a harness at work: the pod goes under the hold the harness handed over in
/// `spec.lifecycle.guard` (it keeps the guard until the sandbox is Suspended, so nobody starts
/// work in between), else under the operator's own guard, not waited for (a harness at work
/// keeps its pod until it lets go; its release, a watched Lease event, brings the next look).
async fn suspend(
    sbx: &Sandbox,
    ctx: &Context,
    (apis, pod_name): (&Apis, &str),
    old: &SandboxStatus,
    (status, note): (SandboxStatus, Option<Note>),
) -> Result<bool, Error> {
    match apis.pods.get_opt(pod_name).await? {
        None => {
            // Gone already: nothing to stop, no guard to take.
            write_transition(ctx, sbx, apis, old, &status, note).await?;
            return Ok(true);
        }
        Some(p) if p.metadata.deletion_timestamp.is_some() => {
            // Going already (asked to under the guard by an earlier look): its going brings
            // the next look. Taking the guard again here wrote the Lease twice per look, and
            // each write, a watched Lease event, brought another look: ~20–90 Lease writes
            // per suspension until the pod was gone (hack/bench's idle figures).
            write_transition(ctx, sbx, apis, old, &status, note).await?;
            return Ok(false);
        }
        Some(_) => {}
    }
    let handed = crate::controller::context::handed_off_hold(ctx, sbx).await?;
    // spec.snapshot.onStop: persist the workspace before its pod goes.
    let hold = handed.as_ref().map(|(h, _)| h.clone());
    if snapshot::on_stop(ctx, sbx, hold).await? == snapshot::OnStop::Wait {
        return Ok(false);
    }
    let own = match &handed {
        Some(_) => None,
        None => {
            let cfg = GuardConfig {
                holder: crate::controller::context::operator_holder(ctx, "suspend"),
                ..GuardConfig::default()
            };
            let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
            let scope = &sbx.spec.scope;
            match guard::acquire_scope(ctx.client.clone(), &ns, scope, &cfg, Some(Duration::ZERO))
                .await
            {
                Ok(g) => Some(g),
                Err(GuardError::Timeout { holder, .. }) => {
                    debug!(sandbox = %sbx.name_any(), %holder, "suspending waits for the scope's guard");
                    return Ok(false);
                }
                Err(e) => return Err(Error::Guard(e)),
            }
        }
    };
    let deleted = match (&handed, &own) {
        (Some((_, h)), _) => h.run(delete_if_present(&apis.pods, pod_name)).await,
        (None, Some(g)) => g.run(delete_if_present(&apis.pods, pod_name)).await,
        (None, None) => Ok(delete_if_present(&apis.pods, pod_name).await),
    };
    if let Some(g) = own {
        release(g, &sbx.name_any()).await;
    }
    let gone = match deleted {
        Ok(r) => r?,
        // The hold went while the pod was being deleted: look again (the next look takes the
        // operator's own guard).
        Err(e) => {
            debug!(sandbox = %sbx.name_any(), "the guard went during the suspension: {e}");
            return Ok(false);
        }
    };
    write_transition(ctx, sbx, apis, old, &status, note).await?;
    Ok(gone)
}

/// Suspends a sandbox whose idle timeout has passed, without ever suspending one under a
/// harness: takes the scope's guard (not waiting: a harness that holds or takes it first keeps
/// its sandbox), then, under it, sets `spec.lifecycle.mode: Suspended` with the resourceVersion
/// read as precondition (a sandbox changed since — resumed, edited — is looked at again
/// instead), writes the idle suspension's status and Event, and releases the guard. A harness
/// that asks for the guard meanwhile gets it afterwards and finds the sandbox Suspended, which
/// `get_or_create` resumes. The suspend step that the mode change brings takes the on-stop
/// snapshot and deletes the pod, as for any suspend.
async fn idle_suspend(
    sbx: &Sandbox,
    ctx: &Context,
    apis: &Apis,
    mut st: SandboxStatus,
) -> Result<Action, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let name = sbx.name_any();
    let cfg = GuardConfig {
        holder: crate::controller::context::operator_holder(ctx, "idle-suspend"),
        ..GuardConfig::default()
    };
    let started = Instant::now();
    let taken = guard::acquire_scope(
        ctx.client.clone(),
        &ns,
        &sbx.spec.scope,
        &cfg,
        Some(Duration::ZERO),
    )
    .await;
    let outcome = match &taken {
        Ok(_) => GuardOutcome::Acquired,
        Err(GuardError::Timeout { .. }) => GuardOutcome::Busy,
        Err(_) => GuardOutcome::Error,
    };
    ctx.metrics
        .guard_waited(GuardOp::IdleSuspend, outcome, started.elapsed());
    let g = match taken {
        Ok(g) => g,
        Err(GuardError::Timeout { holder, .. }) => {
            // A harness got there first: not idle. Its release (a watched Lease event) brings
            // the next look; the requeue is the fallback.
            debug!(sandbox = %name, %holder, "the guard was taken as the idle timeout passed; not suspending");
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
        Err(e) => return Err(Error::Guard(e)),
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
        .run(apis.sandboxes.patch(&name, &pp, &Patch::Merge(&patch)))
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
                debug!(sandbox = %name, "the sandbox changed as its idle timeout passed; looking again");
                return Ok(Action::requeue(Duration::from_millis(500)));
            }
            return Err(e);
        }
    };
    super::write::SUPERSEDED.record(sbx, Instant::now());
    let timeout = idle::timeout(sbx).unwrap_or_default();
    let note = decide::idle_suspended(
        &mut st,
        timeout,
        updated.metadata.generation,
        Timestamp::now(),
    );
    info!("{}", note.message);
    ctx.metrics.idle_suspended();
    publish(ctx, sbx, Some(note)).await;
    // Written over the version the mode change returned, so that version, seen without this
    // status, is not acted on as a plain suspend.
    let status = write_status(apis, &updated, &st).await;
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

/// Publishes `note`, if any, about the sandbox.
async fn publish(ctx: &Context, sbx: &Sandbox, note: Option<Note>) {
    if let Some(n) = note {
        crate::controller::context::publish(ctx, sbx, n.type_, &n.reason, n.action, &n.message)
            .await;
    }
}

/// No pod: checks the sources the environment names, then adopts a warm pod when this start
/// may ([`decide::may_claim`]) and one fits, and serves it at once; else pins the pod to the
/// workspace's node if it still exists, and applies the pod.
async fn create_pod(
    sbx: &Sandbox,
    ctx: &Context,
    (apis, podcfg): (&Apis, &PodConfig<'_>),
    (world, guard, requeue): (&World, &LeaseView, Option<Duration>),
    mut st: SandboxStatus,
) -> Result<Action, Error> {
    let old = &world.old;
    let (generation, now) = (sbx.metadata.generation, Timestamp::now());
    // A pod the operator makes has the derived name, whatever pod the sandbox had before.
    let pod_name = placement::derived_pod_name(sbx);
    // The kubelet reads what the environment names on the operator's word: only objects
    // that opted in, checked before each pod is made. (A running pod keeps what it got.)
    if let Err(e) = sources::check_env(sbx, ctx).await {
        if let Error::SourceMissing(_) | Error::SourceNotReadable(_) = e {
            let (reason, message) = e.reason_and_message();
            let note = decide::held(&mut st, (reason, &message), generation, now);
            write_transition(ctx, sbx, apis, old, &st, Some(note)).await?;
        }
        return Err(e);
    }
    if decide::may_claim(sbx, old) {
        let started = Instant::now();
        // The restore's lookup needs no pod: it goes beside the adopting write (wasted, one
        // read, when no warm pod is taken).
        let ((claimed, patched), (lookup, looked)) = tokio::join!(
            async {
                (
                    claim::claim(sbx, ctx, &apis.pods, podcfg).await,
                    started.elapsed(),
                )
            },
            async { (restore_source::candidate(ctx, sbx).await, started.elapsed()) }
        );
        // Which of the two the start waited for (a profile's question).
        debug!(sandbox = %sbx.name_any(), "claim answered at {patched:?}, restore lookup at {looked:?}");
        let claimed = claimed?;
        ctx.metrics.claimed(claimed.result(), started.elapsed());
        if let claim::Claim::Adopted(pod, shell) = claimed {
            debug!(pod = %pod.name_any(), "adopted warm pod {}", pod.name_any());
            decide::serving(sbx, &mut st, &pod, world.template.as_ref());
            let state = podstate::observe_pod(&pod);
            let seen = (old, st, world.now);
            return serve(
                sbx,
                ctx,
                (apis, podcfg),
                (&pod, state, guard, Some((lookup, shell))),
                seen,
                requeue,
            )
            .await;
        }
    }
    // A runtime class that does not exist would leave the pod refused (or, where the API
    // server does not check, Pending for ever): said at once, and looked at again.
    if let Some(rc) = runtime::effective(&sbx.spec, podcfg.default_runtime_class) {
        let classes: Api<RuntimeClass> = Api::all(ctx.client.clone());
        match classes.get_opt(rc).await {
            Ok(Some(_)) => decide::clear_stall(&mut st, runtime::NOT_FOUND),
            Ok(None) => {
                let note = decide::runtime_class_missing(&mut st, rc, generation, now);
                write_transition(ctx, sbx, apis, old, &st, Some(note)).await?;
                return Ok(Action::requeue(RUNTIME_CLASS_POLL));
            }
            // An operator without the right to read RuntimeClasses: the API server's own
            // refusal of the pod (PodRejected, below) says it instead.
            Err(kube::Error::Api(s)) if s.code == 403 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let pin = match pinned_node(ctx, &st, now).await? {
        Pin::Free => None,
        Pin::Node(n) => Some(n),
        Pin::Lost { node, since, why } => {
            // The workspace's node is lost, and the workspace with it: the next start is B
            // (restore) or D (fresh), on another node.
            let dir = placement::recorded_in(&st)
                .unwrap_or_else(|| placement::derived_host_dir(sbx, podcfg.node_root));
            let note = lose_node(sbx, ctx, &mut st, (&node, since, &why), &dir).await?;
            publish(ctx, sbx, Some(note)).await;
            None
        }
    };
    // The workspace's directory, kept across a suspend or a pod's loss; a fresh one (the
    // derived name) when there is none.
    let dir = placement::recorded_in(&st)
        .unwrap_or_else(|| placement::derived_host_dir(sbx, podcfg.node_root));
    let uid = sbx.uid().unwrap_or_default();
    if let Some(cache) = ctx.cache.as_ref()
        && world.pod.is_none()
        && placement::recorded_pod_name(sbx).is_none()
        && apis.pods.get_opt(&pod_name).await?.is_some()
    {
        // The first start's lookup came from the cache of the operator's pods: a pod of this
        // name that is not one of them (someone else's) is read from the API server on the
        // next look, which reports the conflict instead of writing over it.
        cache.own_pods.wrote(&uid, &pod_name, Instant::now());
        return Ok(Action::requeue(Duration::ZERO));
    }
    let desired = pod::build_pod_in(sbx, podcfg, &dir, pin.as_deref());
    let created = apis
        .pods
        .patch(
            &pod_name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&desired),
        )
        .await;
    if let Err(kube::Error::Api(s)) = &created
        && matches!(s.code, 400 | 403 | 422)
    {
        // Refused by the API server: an unknown RuntimeClass, a policy (Pod Security
        // admission, a quota), a field it rejects. Say so instead of retrying blindly.
        let msg = format!("the API server refused the sandbox pod: {}", s.message);
        let note = decide::held(&mut st, ("PodRejected", &msg), generation, now);
        write_transition(ctx, sbx, apis, old, &st, Some(note)).await?;
        return Ok(Action::requeue(Duration::from_secs(60)));
    }
    created?;
    if let Some(cache) = ctx.cache.as_ref() {
        cache.own_pods.wrote(&uid, &pod_name, Instant::now());
    }
    let msg = match &pin {
        Some(n) => format!("created pod {pod_name} on node {n}, where the workspace is"),
        None => format!("created pod {pod_name}"),
    };
    // The reconcile span names the sandbox and its namespace.
    info!("{msg}");
    let note = Note {
        type_: kube::runtime::events::EventType::Normal,
        reason: "PodCreated".into(),
        action: "CreatePod",
        message: msg,
    };
    publish(ctx, sbx, Some(note)).await;
    if decide::pod_created(old, &mut st, (&pod_name, &dir), generation, now) {
        write_status(apis, sbx, &st).await?;
    }
    Ok(Action::requeue(Duration::from_secs(10)))
}

/// Where the next pod must land.
enum Pin {
    /// Anywhere: no workspace on a node yet.
    Free,
    /// On the node that holds the workspace (ready, or not ready for less than the grace).
    Node(String),
    /// Anywhere else: the workspace's node is lost.
    Lost {
        node: String,
        since: Option<Timestamp>,
        why: String,
    },
}

/// The node the next pod must land on: the one holding the workspace, unless it is lost.
async fn pinned_node(ctx: &Context, st: &SandboxStatus, now: Timestamp) -> Result<Pin, Error> {
    let Some(node) = st.node_name.clone() else {
        return Ok(Pin::Free);
    };
    Ok(match node_health(ctx, &node, now).await? {
        NodeHealth::Lost { since, why } => Pin::Lost { node, since, why },
        NodeHealth::Alive | NodeHealth::Suspect { .. } => Pin::Node(node),
    })
}

/// Gives the workspace on the lost `node` up in `st` (see [`decide::node_lost`]), with what
/// the recovery will restore; counts the loss. Returns the Event that says so.
async fn lose_node(
    sbx: &Sandbox,
    ctx: &Context,
    st: &mut SandboxStatus,
    (node, since, why): (&str, Option<Timestamp>, &str),
    dir: &str,
) -> Result<Note, Error> {
    let recovery = decide::Recovery {
        snapshot: recovery_snapshot(ctx, sbx).await?,
    };
    let now = Timestamp::now();
    let note = decide::node_lost(
        st,
        (node, since, why),
        dir,
        &recovery,
        (sbx.metadata.generation, now),
    );
    ctx.metrics.node_lost();
    warn!("{}", note.message);
    Ok(note)
}

/// The snapshot a recovery will restore (what the restore policy points at) and when it
/// completed. `None` without a store or a snapshot; a refused one (a named snapshot gone, of
/// another scope) is left to the restore to report.
async fn recovery_snapshot(
    ctx: &Context,
    sbx: &Sandbox,
) -> Result<Option<(String, Timestamp)>, Error> {
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

/// The pod is ours and current: the node's workspace directory checked, the workspace
/// initialised when the container runs (or may already answer exec), the status written once.
/// `adopted`: a warm pod adopted just now, whose directory has no marker, with the snapshot
/// lookup made beside the adoption and the shell its pool left open in it.
async fn serve(
    sbx: &Sandbox,
    ctx: &Context,
    (apis, podcfg): (&Apis, &PodConfig<'_>),
    (pod, state, guard, adopted): (&Pod, PodState, &LeaseView, Option<Adopted>),
    (old, mut st, now): (&SandboxStatus, SandboxStatus, Timestamp),
    mut requeue: Option<Duration>,
) -> Result<Action, Error> {
    let generation = sbx.metadata.generation;
    let was_adopted = adopted.is_some();
    let sooner = |r: Option<Duration>, d: Duration| Some(r.map_or(d, |r| r.min(d)));
    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
        if let Some(wait) =
            node_root(sbx, ctx, podcfg, &apis.pods, &node, (old, &mut st, now)).await?
        {
            requeue = sooner(requeue, wait);
        }
        st.node_name = Some(node);
    }
    // The kubelet reports a started container on its next relist, up to a second later; exec
    // reaches the container runtime directly. So a bound pod whose container answers exec is
    // initialised and served at once instead of after that report.
    let problem_for = match &state {
        PodState::Problem { reason, .. } => podstate::problem_since(pod, reason)
            .map(|since| Duration::try_from(now.duration_since(since)).unwrap_or_default()),
        _ => None,
    };
    let serving = Serving {
        early: state == PodState::Starting && may_answer_exec(pod),
        state,
        age: pod_age(pod, now),
        uid: pod.uid().unwrap_or_default(),
        problem_for,
        stall_grace: Duration::from_secs(ctx.config.stall_grace_seconds),
    };
    let (init, error) = if serving.initialises() && !podstate::initialised_in(&st, pod) {
        let ws = st.workspace.clone().unwrap_or_default();
        // An adopted warm pod's directory has no marker, and its pool left a shell open in
        // it for this start's command.
        let (marker, shell) = match adopted {
            Some((lookup, shell)) => (init::Marker::Absent(lookup), shell),
            None => (init::Marker::Probe, None),
        };
        let result = init::init_workspace(
            sbx,
            ctx,
            (&apis.pods, &pod.name_any()),
            (&ws, marker, shell.as_deref()),
        )
        .await;
        // The shell's stdin closes and it exits: nothing of the pool's stays in the pod.
        drop(shell);
        outcome(sbx, &ctx.metrics, &serving, result)
    } else {
        (Init::Skipped, None)
    };
    // The operator's own record of a permanent refusal follows the status's (it outlives a
    // status that could not keep it).
    let uid = sbx.uid().unwrap_or_default();
    match &init {
        Init::Ran { .. } => ctx.refusals.set(&uid, None),
        Init::Failed {
            refusal: Some(r), ..
        } => ctx.refusals.set(&uid, Some(r)),
        Init::Failed { .. } | Init::Skipped | Init::NotAnswering => {}
    }
    let out = decide::served(old, &mut st, &serving, init, (generation, now));
    if let (Some(note), Some(e)) = (out.failed, error) {
        write_transition(ctx, sbx, apis, old, &st, Some(note)).await?;
        return Err(e);
    }
    if let Some(retry) = out.retry {
        requeue = sooner(requeue, retry);
    }
    publish(ctx, sbx, out.problem).await;
    let idleness = idle::track(&mut st, idle::timeout(sbx), guard, now);
    if idleness != Idle::Off {
        debug!(sandbox = %sbx.name_any(), since = ?st.idle_since, "idle timeout: {idleness:?}");
    }
    match idleness {
        Idle::Suspend => return idle_suspend(sbx, ctx, apis, st).await,
        Idle::Wait(d) | Idle::Busy(Some(d)) => requeue = sooner(requeue, d),
        Idle::Busy(None) | Idle::Off => {}
    }
    if let Some(wait) = decide::defer_first_status(old.phase, out.starting, serving.age) {
        return Ok(Action::requeue(requeue.map_or(wait, |r| r.min(wait))));
    }
    if old != &st {
        write_status(apis, sbx, &st).await?;
    }
    if out.started.is_some() {
        record_ready(&ctx.metrics, sbx, pod, old, &st);
    }
    if decide::announce_start(was_adopted, &st) {
        publish(ctx, sbx, out.started).await;
    }
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// What a start that adopted a warm pod brings to [`serve`]: the snapshot lookup and the
/// pool's open shell.
type Adopted = (
    init::Lookup,
    Option<Box<agentbox_api::exec::session::Session>>,
);

/// Observes how long the start that has just become Ready took, by its branch: from the
/// Sandbox's creation for its first start, else from the creation of the pod made for this one
/// (a resume or a recovery). Called after the Ready status was written, so once per start.
fn record_ready(
    metrics: &Metrics,
    sbx: &Sandbox,
    pod: &Pod,
    old: &SandboxStatus,
    st: &SandboxStatus,
) {
    let Some(branch) = st.workspace.as_ref().and_then(|w| w.last_start_branch) else {
        return;
    };
    let first = old
        .workspace
        .as_ref()
        .is_none_or(|w| w.initialized_pod_uid.is_none());
    let since = if first {
        sbx.metadata.creation_timestamp.as_ref()
    } else {
        pod.metadata.creation_timestamp.as_ref()
    };
    let Some(since) = since else {
        return;
    };
    let took = Timestamp::now().duration_since(since.0);
    // A clock behind the API server's could make it negative: count that as instant.
    let took = Duration::try_from(took).unwrap_or_default();
    // A pool's pod keeps its pool label when a sandbox adopts it.
    let start = if pod.labels().contains_key(labels::POOL) {
        WARM
    } else {
        COLD
    };
    metrics.became_ready(branch, start, took);
}

/// The [`Init`] outcome of an initialisation, and the error to report when it failed; its exec
/// errors are counted in `metrics`. An early try whose container does not run yet is neither a
/// failure nor an exec error: the pod is still starting.
fn outcome(
    sbx: &Sandbox,
    metrics: &Metrics,
    serving: &Serving,
    result: Result<
        (
            agentbox_api::crd::WorkspaceStatus,
            crate::controller::workspace::Decision,
        ),
        Error,
    >,
) -> (Init, Option<Error>) {
    match result {
        Ok((workspace, decision)) => (
            Init::Ran {
                workspace,
                decision,
            },
            None,
        ),
        Err(e) if serving.early && container_not_running(&e) => {
            debug!(sandbox = %sbx.name_any(), "the container does not answer exec yet: {e}");
            (Init::NotAnswering, None)
        }
        Err(e) => {
            if let Error::Exec(x) = e.root() {
                metrics.exec_failed(ExecOp::Workspace, x.kind());
            }
            let (reason, message) = e.reason_and_message();
            let init = Init::Failed {
                reason: reason.to_string(),
                message,
                refusal: e.restore_refusal().cloned(),
                permanent: e.is_permanent(),
            };
            (init, Some(e))
        }
    }
}

/// Whether an initialisation failed only because the container does not run yet (exec could
/// not reach it), as opposed to a failure inside a running container.
fn container_not_running(e: &Error) -> bool {
    matches!(
        e,
        Error::Exec(
            agentbox_api::exec::ExecError::Connect { .. }
                | agentbox_api::exec::ExecError::NotStarted(_)
        )
    )
}

/// Sets the [`noderoot::CONDITION`] of a sandbox on `node`: from this process's record of the
/// namespace's directory there, else by starting (or reading, then deleting) the helper pod
/// that prepares it. Returns when to look again while that pod runs. A Warning Event goes out
/// when the condition turns False.
async fn node_root(
    sbx: &Sandbox,
    ctx: &Context,
    podcfg: &PodConfig<'_>,
    pods: &Api<Pod>,
    node: &str,
    (old, st, now): (&SandboxStatus, &mut SandboxStatus, Timestamp),
) -> Result<Option<Duration>, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let dir = pod::namespace_host_path(podcfg.node_root, &ns);
    let found = match ctx.node_roots.get(node, &ns, Instant::now()) {
        Some(found) => Some(found),
        None if podcfg.helper.is_none() => None,
        None => match noderoot::prepare(ctx, pods, (&ns, node), || {
            helper_pod::build_prepare_pod(sbx, podcfg, node)
        })
        .await?
        {
            Some(found) => Some(found),
            None => return Ok(Some(Duration::from_secs(2))),
        },
    };
    let (ok, reason, message) = match &found {
        Some(f) => noderoot::condition(f, node, &dir),
        None => noderoot::no_helper(node, &dir),
    };
    let was = conditions::get(&old.conditions, noderoot::CONDITION)
        .map(|c| (c.status == "True", c.reason.clone()));
    let generation = sbx.metadata.generation;
    conditions::set(
        &mut st.conditions,
        noderoot::CONDITION,
        ok,
        reason,
        &message,
        generation,
        now,
    );
    if !ok && was != Some((false, reason.to_string())) {
        let note = Note {
            type_: kube::runtime::events::EventType::Warning,
            reason: reason.to_string(),
            action: "PrepareNode",
            message,
        };
        publish(ctx, sbx, Some(note)).await;
    }
    Ok(None)
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
