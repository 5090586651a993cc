//! The serve step: the pod is ours and current (or a warm pod adopted just now). Its node's
//! workspace directory checked, the workspace initialised once the kubelet reports the
//! container running and ready, the status written once, Ready recorded.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::{debug, info};

use super::claim::{Adopted, Claimed};
use super::idle::{self, Idle};
use super::observe::World;
use super::readiness::{self, Init, Serving};
use super::status::Stamp;
use super::tools::Tools;
use super::write::delete_by_uid;
use super::{abandoned, init};
use crate::controller::context::{Error, Note};
use crate::controller::podstate::{self, PodState, pod_age};
use crate::controller::{
    conditions, domain_egress, helper_pod, netcheck, noderoot, oomkill, pids, placement, pod,
    sizelimit,
};
use crate::metrics::{COLD, ExecOp, Metrics, WARM};
use agentbox_api::crd::{Sandbox, SandboxStatus, WorkspaceStatus};
use agentbox_api::exec::session::Session;
use agentbox_api::guard::LeaseView;
use agentbox_api::labels;

/// The pod to serve, as found.
struct Found<'p> {
    /// The pod.
    pod: &'p Pod,
    /// Its state.
    state: PodState,
    /// The scope's guard Lease, as seen (for the idle clock).
    guard: &'p LeaseView,
    /// A warm pod adopted just now, whose directory has no sandbox's marker.
    adopted: Option<Adopted>,
}

/// The status as read, the one the step builds on, and when.
struct Seen<'o> {
    /// The status as read.
    old: &'o SandboxStatus,
    /// The planned status the serve step completes.
    status: SandboxStatus,
    /// Now.
    now: Timestamp,
}

/// How the serve step ended: done, or the sandbox is to be suspended by the operator (the
/// driver runs the suspend step with the status served so far).
pub(super) enum Outcome {
    /// Served: look again as the action says.
    Done(Action),
    /// The idle timeout has passed.
    IdleSuspend(SandboxStatus),
    /// The workspace holds more than its size limit; the message says so.
    OverLimitSuspend(SandboxStatus, String),
}

/// `requeue`, or `d` if that is sooner.
fn sooner(requeue: Option<Duration>, d: Duration) -> Option<Duration> {
    Some(requeue.map_or(d, |r| r.min(d)))
}

/// The serve step on the pod that observe found: a second pod of the sandbox goes, the
/// directories on nodes that came back are removed, then [`serve`].
pub(super) async fn serve_found(
    h: &Tools<'_>,
    sbx: &Sandbox,
    world: &World,
    mut status: SandboxStatus,
    mut requeue: Option<Duration>,
) -> Result<Outcome, Error> {
    let Some(pod) = world.pod.as_ref() else {
        return Ok(Outcome::Done(Action::requeue(Duration::from_secs(1))));
    };
    second_pods(h, sbx, pod, &world.old).await?;
    if !status.abandoned.is_empty()
        && let Some(d) = abandoned::sweep(sbx, h.ctx, h.apis, &mut status, false).await?
    {
        requeue = sooner(requeue, d);
    }
    let found = Found {
        pod,
        state: world.pod_state.clone(),
        guard: &LeaseView::of(world.lease.as_ref(), world.now),
        adopted: None,
    };
    let seen = Seen {
        old: &world.old,
        status,
        now: world.now,
    };
    serve(h, sbx, found, seen, requeue).await
}

/// The serve step on a warm pod the create step has just adopted: served at once.
pub(super) async fn serve_claimed(
    h: &Tools<'_>,
    sbx: &Sandbox,
    world: &World,
    claimed: Claimed,
    requeue: Option<Duration>,
) -> Result<Outcome, Error> {
    let Claimed {
        pod,
        adopted,
        status,
    } = claimed;
    let found = Found {
        state: podstate::observe_pod(&pod),
        pod: &pod,
        guard: &LeaseView::of(world.lease.as_ref(), world.now),
        adopted: Some(adopted),
    };
    let seen = Seen {
        old: &world.old,
        status,
        now: world.now,
    };
    serve(h, sbx, found, seen, requeue).await
}

/// What the node checks of the serve step found.
enum NodeChecked {
    /// All is well: look again after this, if at all.
    Fine(Option<Duration>),
    /// The workspace is over its size limit: the message that says so.
    OverLimit(String),
}

/// The checks of `pod`'s node: its workspace directory, the process limit, a kill for
/// memory, the workspace's size, the usage read.
async fn node_checks(
    h: &Tools<'_>,
    sbx: &Sandbox,
    pod: &Pod,
    state: &PodState,
    seen: (&SandboxStatus, Timestamp),
    st: &mut SandboxStatus,
) -> Result<NodeChecked, Error> {
    let (old, now) = seen;
    let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
        return Ok(NodeChecked::Fine(None));
    };
    let mut requeue = node_root(h, sbx, &node, old, st, now).await?;
    process_limit(h, sbx, pod, &node, old, st, now).await;
    oom_kill(h, sbx, pod, old, st).await;
    let over = workspace_limit(h, sbx, pod, &node, old, st, now).await;
    st.node_name = Some(node.clone());
    if let Some(o) = over {
        return Ok(NodeChecked::OverLimit(sizelimit::over_message(o, &node)));
    }
    if let Some(wait) = read_usage(h, sbx, pod, state, st).await {
        requeue = sooner(requeue, wait);
    }
    Ok(NodeChecked::Fine(requeue))
}

/// Serves `found`: the node's workspace directory checked, the workspace initialised once
/// the kubelet reports the container running and ready, the idle clock kept, the status
/// written once (not before [`readiness::defer_first_status`] allows), Ready recorded.
async fn serve(
    h: &Tools<'_>,
    sbx: &Sandbox,
    found: Found<'_>,
    seen: Seen<'_>,
    mut requeue: Option<Duration>,
) -> Result<Outcome, Error> {
    let (old, mut st, now) = (seen.old, seen.status, seen.now);
    let pod = found.pod;
    let was_adopted = found.adopted.is_some();
    match node_checks(h, sbx, pod, &found.state, (old, now), &mut st).await? {
        NodeChecked::Fine(Some(wait)) => requeue = sooner(requeue, wait),
        NodeChecked::Fine(None) => {}
        NodeChecked::OverLimit(message) => return Ok(Outcome::OverLimitSuspend(st, message)),
    }
    let no_proxy = domain_entries(h, sbx, old, &mut st, now);
    let serving = serving(h, pod, found.state, now);
    // Asked before the workspace's start, so that a node's first check runs beside it.
    let gate = network_gate(h, sbx, pod);
    if netcheck::waiting(pod)
        && let Some(wait) = release_network_wait(h, sbx, pod, &gate).await
    {
        requeue = sooner(requeue, wait);
    }
    // An adopted pod's open shell (its pool's) is closed only once the status is written: its
    // exit (the exec stream torn down through the API server, the kubelet and the container
    // runtime) would otherwise share the two cores with the claim's Ready status write.
    let (adopted, shell) = found.adopted.map_or((None, None), Adopted::split);
    let (init, error) = initialise(h, sbx, &serving, pod, &st, adopted, shell.as_deref()).await;
    let stamp = Stamp {
        generation: sbx.metadata.generation,
        now,
    };
    let out = readiness::served(old, &mut st, &serving, init, stamp);
    if let (Some(note), Some(e)) = (out.failed, error) {
        h.writer(sbx).transition(old, &st, Some(note)).await?;
        return Err(e);
    }
    if let Some(retry) = out.retry {
        requeue = sooner(requeue, retry);
    }
    let (held, wait) = readiness::network_gate(old, &mut st, &gate, stamp);
    if let Some(wait) = wait {
        requeue = sooner(requeue, wait);
    }
    // A container killed for memory has its own Event, once per kill (oom_kill above): the
    // pod problem's of the same reason would say it again.
    let problem = out.problem.filter(|n| n.reason != oomkill::REASON);
    h.writer(sbx).publish(problem).await;
    h.writer(sbx).publish(held).await;
    match idleness(sbx, &mut st, found.guard, now) {
        Idle::Suspend => return Ok(Outcome::IdleSuspend(st)),
        Idle::Wait(d) | Idle::Busy(Some(d)) => requeue = sooner(requeue, d),
        Idle::Busy(None) | Idle::Off => {}
    }
    if let Some(wait) = readiness::defer_first_status(old.phase, out.starting, serving.age) {
        return Ok(Outcome::Done(Action::requeue(
            sooner(requeue, wait).unwrap_or(wait),
        )));
    }
    if old != &st {
        h.writer(sbx).status(&st).await?;
    }
    // Once the condition is written: a reconcile that wrote no status tells it again.
    h.writer(sbx).publish(no_proxy).await;
    // Its stdin closes and it exits: nothing of the pool's stays in the pod.
    drop(shell);
    if out.started.is_some() {
        record_ready(&h.ctx.metrics, sbx, pod, old, &st);
    }
    if readiness::announce_start(was_adopted, &st) {
        h.writer(sbx).publish(out.started).await;
    }
    Ok(Outcome::Done(
        requeue.map_or_else(Action::await_change, Action::requeue),
    ))
}

/// Domain entries without an egress proxy: said on the Sandbox (they stay closed). The
/// Event that goes with a change.
fn domain_entries(
    h: &Tools<'_>,
    sbx: &Sandbox,
    old: &SandboxStatus,
    st: &mut SandboxStatus,
    now: Timestamp,
) -> Option<Note> {
    domain_egress::apply(
        &sbx.spec.pod.network,
        h.podcfg.default_egress,
        h.podcfg.proxy.as_ref(),
        &old.conditions,
        &mut st.conditions,
        sbx.metadata.generation,
        now,
    )
}

/// The idle clock kept in the served status `st`: what it says.
fn idleness(sbx: &Sandbox, st: &mut SandboxStatus, guard: &LeaseView, now: Timestamp) -> Idle {
    let idleness = idle::track(st, idle::timeout(sbx), guard, now);
    if idleness != Idle::Off {
        debug!(sandbox = %sbx.name_any(), since = ?st.idle_since, "idle timeout: {idleness:?}");
    }
    idleness
}

/// What is known of the enforcement of `sbx`'s egress policy on `pod`'s node (a check
/// starts in the background where nothing is).
fn network_gate(h: &Tools<'_>, sbx: &Sandbox, pod: &Pod) -> netcheck::Gate {
    let egress = sbx.spec.pod.network.egress_or(h.podcfg.default_egress);
    let spec = pod.spec.as_ref();
    let Some(node) = spec.and_then(|s| s.node_name.as_deref()) else {
        return if egress == agentbox_api::crd::Egress::All {
            netcheck::Gate::NotNeeded
        } else {
            netcheck::Gate::Pending
        };
    };
    let rc = spec.and_then(|s| s.runtime_class_name.as_deref());
    let settings = netcheck::Settings::from_config(&h.ctx.config);
    h.ctx
        .proofs
        .gate(&h.ctx.client, &settings, egress, node, rc)
}

/// Lets a cold pod's network wait end (its containers start) once its own egress rules are
/// shown in force by the node's beacon, or at once where its egress relies on nothing or
/// enforcement is attested. While the node's verdict is pending or failed, the pod keeps
/// waiting (the gate's condition says why) and its sandbox asks again soon. Returns how soon
/// to look again.
async fn release_network_wait(
    h: &Tools<'_>,
    sbx: &Sandbox,
    pod: &Pod,
    gate: &netcheck::Gate,
) -> Option<Duration> {
    use netcheck::Gate;
    let spec = pod.spec.as_ref();
    let node = spec.and_then(|s| s.node_name.as_deref())?;
    let rc = spec.and_then(|s| s.runtime_class_name.as_deref());
    let beacon = match gate {
        Gate::NotNeeded | Gate::Attested => None,
        // The pod waits; its sandbox asks again when the node's check may have ended (a
        // sandbox that is not Ready gets no other requeue for it).
        Gate::Pending => return Some(Duration::from_millis(500)),
        Gate::Failed { .. } => return Some(netcheck::RETRY_FAILED),
        Gate::Proven => {
            let Some(b) = h.ctx.proofs.beacon(node, rc) else {
                h.ctx.proofs.beacon_gone(node, rc);
                return Some(Duration::from_millis(500));
            };
            let settings = netcheck::Settings::from_config(&h.ctx.config);
            let checks: kube::Api<Pod> =
                kube::Api::namespaced(h.ctx.client.clone(), &settings.namespace);
            if !netcheck::beacon_alive(&checks, &b).await {
                h.ctx.proofs.beacon_gone(node, rc);
                return Some(Duration::from_millis(500));
            }
            let admitted = netcheck::admits(
                &sbx.spec.pod.network,
                h.podcfg.default_egress,
                &b.ip,
                netcheck::PORT,
            );
            (!admitted).then_some(b)
        }
    };
    let pods: kube::Api<Pod> =
        kube::Api::namespaced(h.ctx.client.clone(), &pod.namespace().unwrap_or_default());
    if netcheck::release(&pods, &pod.name_any(), beacon.as_ref()).await {
        debug!(sandbox = %sbx.name_any(), pod = %pod.name_any(), proven = beacon.is_some(), "network wait released");
        None
    } else {
        Some(Duration::from_millis(200))
    }
}

/// What `pod` looks like to the serve step.
fn serving(h: &Tools<'_>, pod: &Pod, state: PodState, now: Timestamp) -> Serving {
    let problem_for = match &state {
        PodState::Problem { reason, .. } => podstate::problem_since(pod, reason)
            .map(|since| Duration::try_from(now.duration_since(since)).unwrap_or_default()),
        _ => None,
    };
    Serving {
        state,
        age: pod_age(pod, now),
        uid: pod.uid().unwrap_or_default(),
        problem_for,
        stall_grace: Duration::from_secs(h.ctx.config.stall_grace_seconds),
    }
}

/// Initialises the workspace in `pod` when the serve step does and it was not initialised
/// in this pod yet: the [`Init`] outcome, and the error to report when it failed. The
/// operator's own record of a permanent refusal follows (it outlives a status that could
/// not keep it).
async fn initialise(
    h: &Tools<'_>,
    sbx: &Sandbox,
    serving: &Serving,
    pod: &Pod,
    st: &SandboxStatus,
    adopted: Option<(init::Lookup, bool)>,
    shell: Option<&Session>,
) -> (Init, Option<Error>) {
    if !serving.initialises() || podstate::initialised_in(st, pod) {
        return (Init::Skipped, None);
    }
    let ws = st.workspace.clone().unwrap_or_default();
    // An adopted warm pod's directory has no marker of a sandbox (its pool's, or none), and
    // its pool left a shell open in it for this start's command.
    let marker = match adopted {
        Some((lookup, warm)) => init::Marker::Absent { lookup, warm },
        None => init::Marker::Probe,
    };
    let start = init::Start {
        ws: &ws,
        marker,
        shell,
    };
    let pod_name = pod.name_any();
    let result = init::init_workspace(sbx, h.ctx, &h.apis.pods, &pod_name, start).await;
    let (init, error) = outcome(&h.ctx.metrics, result);
    let uid = sbx.uid().unwrap_or_default();
    match &init {
        Init::Ran { .. } => h.ctx.refusals.set(&uid, None),
        Init::Failed {
            refusal: Some(r), ..
        } => h.ctx.refusals.set(&uid, Some(r)),
        Init::Failed { .. } | Init::Skipped => {}
    }
    (init, error)
}

/// Deletes the pods of the sandbox other than `served`, the one its status names: two
/// operators starting the same sandbox at once (a leader change) can each adopt a warm
/// pod, or one adopt and the other make the cold pod, before either sees the other's
/// write; the status names one, and the other would run until the Sandbox goes. Found in
/// the pod cache (labelled for the sandbox, controlled by it, not being deleted); each
/// deletion is conditioned on the pod's UID. Nothing while the status does not name
/// `served` yet.
async fn second_pods(
    h: &Tools<'_>,
    sbx: &Sandbox,
    served: &Pod,
    old: &SandboxStatus,
) -> Result<(), Error> {
    let ctx = h.ctx;
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
        delete_by_uid(&h.apis.pods, &other.name_any(), other.uid(), None).await?;
        // Its directory is no Sandbox's: the sweep's, once the pod has stopped.
        let node = other.spec.as_ref().and_then(|s| s.node_name.clone());
        let dir = placement::pod_host_dir(&other);
        if let (Some(node), Some(dir), Some(ns)) = (node, dir, other.namespace())
            && placement::recorded_host_dir(sbx).as_deref() != Some(dir.as_str())
            && let Some(entry) = placement::dir_name(&dir, &ctx.config.node_root, &ns)
        {
            ctx.sweep.add(crate::controller::memos::Hint {
                node,
                namespace: ns.clone(),
                dir: entry.to_string(),
            });
        }
    }
    Ok(())
}

/// Sets the [`noderoot::CONDITION`] of a sandbox on `node`: from this process's record of
/// the namespace's directory there, else by starting (or reading, then deleting) the
/// helper pod that prepares it. Returns when to look again while that pod runs. A Warning
/// Event goes out when the condition turns False.
async fn node_root(
    h: &Tools<'_>,
    sbx: &Sandbox,
    node: &str,
    old: &SandboxStatus,
    st: &mut SandboxStatus,
    now: Timestamp,
) -> Result<Option<Duration>, Error> {
    let (ctx, podcfg) = (h.ctx, h.podcfg);
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let dir = pod::namespace_host_path(podcfg.node_root, &ns);
    let found = match ctx.node_roots.get(node, &ns, Instant::now()) {
        Some(found) => Some(found),
        None if podcfg.helper.is_none() => None,
        None => match noderoot::prepare(ctx, &h.apis.pods, &ns, node, || {
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
    let cond = &mut st.conditions;
    conditions::set(
        cond,
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
        h.writer(sbx).publish(Some(note)).await;
    }
    Ok(None)
}

/// Sets the [`pids::CONDITION`] and [`pids::NODE_CONDITION`] of a sandbox whose pod on `node`
/// should have a process limit, from what the pod's init container that sets it reported;
/// nothing while it has not finished, nor for a sandbox without a limit. A Warning Event goes
/// out when either turns False.
async fn process_limit(
    h: &Tools<'_>,
    sbx: &Sandbox,
    pod: &Pod,
    node: &str,
    old: &SandboxStatus,
    st: &mut SandboxStatus,
    now: Timestamp,
) {
    let podcfg = h.podcfg;
    // The pod says which limit it was made with (a template's included); a pod without one
    // is held to the sandbox's own or the operator's default.
    let limit = pod_limit(pod).or_else(|| pids::effective(&sbx.spec, &podcfg.processes));
    let Some((own, node_cond)) = pids::conditions(pod, node, limit, podcfg.helper.is_some()) else {
        return;
    };
    let generation = sbx.metadata.generation;
    for (type_, (ok, reason, message)) in
        std::iter::once((pids::CONDITION, own)).chain(node_cond.map(|c| (pids::NODE_CONDITION, c)))
    {
        let was =
            conditions::get(&old.conditions, type_).map(|c| (c.status == "True", c.reason.clone()));
        conditions::set(
            &mut st.conditions,
            type_,
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
                action: "LimitProcesses",
                message,
            };
            h.writer(sbx).publish(Some(note)).await;
        }
    }
}

/// Records a kill of the sandbox's container for memory that the pod's status shows and the
/// sandbox's status does not have yet (`status.lastOOMKill`), and announces it with an
/// `OOMKilled` Warning Event: once per kill, whichever state of the container shows it.
async fn oom_kill(
    h: &Tools<'_>,
    sbx: &Sandbox,
    pod: &Pod,
    old: &SandboxStatus,
    st: &mut SandboxStatus,
) {
    let Some(seen) = oomkill::observed(pod) else {
        return;
    };
    let uid = sbx.uid().unwrap_or_default();
    let announced = h.ctx.oom_kills.get(&uid);
    if !oomkill::is_new(old.last_oom_kill.as_ref(), &seen)
        || !oomkill::is_new(announced.as_ref(), &seen)
    {
        // Announced already: the status keeps (or gets again) the record.
        if old.last_oom_kill.is_none() {
            st.last_oom_kill = announced;
        }
        return;
    }
    let rc = pod
        .spec
        .as_ref()
        .and_then(|s| s.runtime_class_name.as_deref());
    let note = Note {
        type_: kube::runtime::events::EventType::Warning,
        reason: oomkill::REASON.to_string(),
        action: "Run",
        message: oomkill::message(&seen, rc),
    };
    info!(sandbox = %sbx.name_any(), restarts = seen.restart_count, "container killed for memory");
    h.ctx.oom_kills.record(&uid, seen.clone());
    st.last_oom_kill = Some(seen);
    h.writer(sbx).publish(Some(note)).await;
}

/// Sets the [`sizelimit::CONDITION`] of a sandbox whose pod on `node` should have a
/// workspace size limit, from what the pod's helper containers reported, and the limit and
/// (once over it) the usage in `status.workspace`; a Warning Event when it turns False.
/// Returns the over-limit measurement when the sidecar ended with one: the sandbox must stop.
async fn workspace_limit(
    h: &Tools<'_>,
    sbx: &Sandbox,
    pod: &Pod,
    node: &str,
    old: &SandboxStatus,
    st: &mut SandboxStatus,
    now: Timestamp,
) -> Option<sizelimit::Over> {
    let podcfg = h.podcfg;
    let limit =
        sizelimit::pod_limit(pod).or_else(|| sizelimit::effective(&sbx.spec, &podcfg.sizes));
    // Only a limited workspace's status (or one that was) changes: no write for the others.
    let was_limited = st
        .workspace
        .as_ref()
        .is_some_and(|w| w.limit_bytes.is_some());
    if limit.is_some() || was_limited {
        let ws = st.workspace.get_or_insert_with(WorkspaceStatus::default);
        ws.limit_bytes = limit;
        if limit.is_none() {
            ws.used_bytes = None;
        }
    }
    if limit.is_none() {
        // A limit removed: so is what was said of it.
        conditions::remove(&mut st.conditions, sizelimit::CONDITION);
    }
    let (ok, reason, message) = sizelimit::condition(pod, node, limit, podcfg.helper.is_some())?;
    let over = sizelimit::over(pod);
    if let Some(o) = over {
        st.workspace
            .get_or_insert_with(WorkspaceStatus::default)
            .used_bytes = Some(o.used);
        h.ctx.metrics.workspace_used(o.used);
    }
    let was = conditions::get(&old.conditions, sizelimit::CONDITION)
        .map(|c| (c.status == "True", c.reason.clone()));
    conditions::set(
        &mut st.conditions,
        sizelimit::CONDITION,
        ok,
        reason,
        &message,
        sbx.metadata.generation,
        now,
    );
    if was.as_ref().map(|(_, r)| r.as_str()) != Some(reason) {
        // Counted once per change of reason: a start's outcome, not every look at it.
        let mode = match reason {
            sizelimit::QUOTA => Some("quota"),
            sizelimit::MEASURED => Some("measure"),
            sizelimit::NOT_ENFORCED => Some("not_enforced"),
            _ => None,
        };
        if let Some(mode) = mode {
            h.ctx.metrics.workspace_limited(mode);
        }
    }
    if !ok && was != Some((false, reason.to_string())) {
        let note = Note {
            type_: kube::runtime::events::EventType::Warning,
            reason: reason.to_string(),
            action: "LimitWorkspace",
            message,
        };
        h.writer(sbx).publish(Some(note)).await;
    }
    over
}

/// Reads the usage a limited workspace's sidecar last printed (the last line of its log), at
/// most once per `--workspace-usage-interval-seconds` per sandbox, into
/// `status.workspace.usedBytes` (kept within a MiB of the last written, so the status is not
/// rewritten for every byte) and the metric. Returns when to read again; `None` for a pod
/// without the sidecar or not running. A failed read waits for the next.
async fn read_usage(
    h: &Tools<'_>,
    sbx: &Sandbox,
    pod: &Pod,
    state: &PodState,
    st: &mut SandboxStatus,
) -> Option<Duration> {
    let has_sidecar = pod
        .spec
        .as_ref()?
        .init_containers
        .iter()
        .flatten()
        .any(|c| c.name == sizelimit::SIDECAR);
    if !has_sidecar || *state != PodState::Ready {
        return None;
    }
    let every = Duration::from_secs(h.podcfg.sizes.interval_secs.max(1));
    let uid = sbx.uid().unwrap_or_default();
    if let Err(wait) = h.ctx.usage_reads.due(&uid, every, Instant::now()) {
        return Some(wait);
    }
    let params = kube::api::LogParams {
        container: Some(sizelimit::SIDECAR.into()),
        tail_lines: Some(1),
        ..Default::default()
    };
    match h.apis.pods.logs(&pod.name_any(), &params).await {
        Ok(text) => {
            if let Some(used) = sizelimit::measured(&text) {
                h.ctx.metrics.workspace_used(used);
                let ws = st.workspace.get_or_insert_with(WorkspaceStatus::default);
                ws.used_bytes = Some(sizelimit::reported(ws.used_bytes, used));
            }
        }
        Err(e) => debug!(sandbox = %sbx.name_any(), "reading the workspace usage: {e}"),
    }
    Some(every)
}

/// The process limit a pod's init container was told to set, if it has one.
fn pod_limit(pod: &Pod) -> Option<u32> {
    let c = pod
        .spec
        .as_ref()?
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == pids::INIT_CONTAINER)?;
    c.command.as_ref()?.last()?.parse().ok()
}

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
/// errors are counted in `metrics`.
fn outcome(
    metrics: &Metrics,
    result: Result<(WorkspaceStatus, super::init_plan::Decision), Error>,
) -> (Init, Option<Error>) {
    match result {
        Ok((workspace, decision)) => (
            Init::Ran {
                workspace,
                decision,
            },
            None,
        ),
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
