//! The sandbox controller's decisions, pure: from what [`super::observe`] saw to a [`Plan`] (a
//! [`Step`] and the status it leads to), and from what a step's I/O found to the status that
//! follows. Nothing here reads or writes the API; [`super::act`] does.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::idle;
use super::observe::World;
use crate::controller::conditions::{self, GUARDED, POD_READY, READY, STALLED, WORKSPACE_READY};
use crate::controller::context::Note;
use crate::controller::nodeloss::{self, NodeHealth};
use crate::controller::podstate::{self, PodState};
use crate::controller::sizelimit;
use crate::controller::{netcheck, placement, runtime, service, workspace};
use agentbox_api::crd::{
    AbandonedWorkspace, GuardStatus, LifecycleMode, NodeLoss, RestoreRefusal, Sandbox,
    SandboxPhase, SandboxStatus, StartBranch, TemplateUse, WorkspaceStatus,
};
use agentbox_api::guard::LeaseView;
use agentbox_api::labels;

/// What one reconcile of a live Sandbox does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The spec cannot be honoured: no pod, phase Failed.
    Invalid,
    /// `shutdownTime` has passed: the sandbox deletes itself.
    ShutDown,
    /// Mode Suspended: snapshot on stop if asked, delete the pod, keep the workspace.
    Suspend,
    /// No pod: check the environment's sources, then make one.
    CreatePod,
    /// The pod is terminating: wait for it to go.
    AwaitPodGone,
    /// A pod of the sandbox's pod name belongs to something else.
    PodNameConflict,
    /// The pod must go (its spec changed, or it ended); a later reconcile makes a new one.
    ReplacePod,
    /// The pod is ours and current: check its node, initialise the workspace, report.
    Serve,
    /// The pod's node is lost (not ready past the node-loss grace, or gone): give its
    /// workspace up, force-delete the pod, start again elsewhere from a snapshot.
    NodeLost(Lost),
}

/// A node judged lost, as a step and a status record it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lost {
    /// The lost node.
    pub node: String,
    /// Since when it was not ready (`None`: the Node object is gone).
    pub since: Option<Timestamp>,
    /// Why it counts as lost.
    pub why: String,
}

/// What a condition written now is stamped with: the generation it was decided for, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The Sandbox's `metadata.generation`.
    pub generation: Option<i64>,
    /// Now.
    pub now: Timestamp,
}

/// A [`Step`] with the status it leads to.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// What to do.
    pub step: Step,
    /// The status after the step; for [`Step::CreatePod`] and [`Step::Serve`] the base that
    /// the step's outcome completes.
    pub status: SandboxStatus,
    /// The Event that goes with the step (published with its status write, or alone).
    pub note: Option<Note>,
    /// When to look again whatever happens (before `shutdownTime`).
    pub requeue: Option<Duration>,
}

/// Decides what a reconcile does with a live (not deleting) Sandbox.
pub fn decide(sbx: &Sandbox, w: &World) -> Plan {
    let now = w.now;
    let view = LeaseView::of(w.lease.as_ref(), now);
    let mut st = observed(sbx, w, &view);
    if let Some(refused) = refusal(sbx, w, &mut st) {
        return refused;
    }
    // Taken now: a refusal of the runtime class is over.
    clear_stall(&mut st, runtime::REFUSED);
    let mut requeue = None;
    if let Some(at) = sbx.spec.lifecycle.shutdown_time.as_ref() {
        if at.0 <= now {
            let note = Note::new(
                EventType::Normal,
                "ShutdownTimeReached",
                "Delete",
                "shutdownTime passed; deleting the sandbox",
            );
            return Plan {
                step: Step::ShutDown,
                status: st,
                note: Some(note),
                requeue: None,
            };
        }
        let secs = at.0.as_second().saturating_sub(now.as_second()).max(1);
        requeue = Some(Duration::from_secs(secs as u64));
    }
    // Exposed ports: where each is reached (with the pod's IP once there is a pod to serve).
    st.endpoints = service::endpoints(sbx, None);
    match node_of_pod(sbx, w) {
        Some(NodeHealth::Lost { since, why }) => {
            let node = w.node.as_ref().map(|(n, _)| n.clone()).unwrap_or_default();
            return Plan {
                step: Step::NodeLost(Lost { node, since, why }),
                status: st,
                note: None,
                requeue,
            };
        }
        // Look again the moment the grace runs out.
        Some(NodeHealth::Suspect { remaining, .. }) => {
            requeue = Some(requeue.map_or(remaining, |r: Duration| r.min(remaining)));
        }
        Some(NodeHealth::Alive) | None => {}
    }
    let (step, note) = pod_step(sbx, w, &mut st);
    if step != Step::Serve {
        // No pod of ours to be stuck (suspended, replaced, going, or not made yet): a stall
        // a pod problem set is over; the serve step judges the next pod's problems anew.
        clear_pod_stall(&mut st);
    }
    // The idle clock rides along in whatever status this step leaves; a served sandbox's
    // idleness is decided once its status is final (in the serve step).
    idle::track(&mut st, idle::timeout(sbx), &view, now);
    Plan {
        step,
        status: st,
        note,
        requeue,
    }
}

/// The status as observed: the scope key, the generation and the guard's holder and
/// condition, on the status as read.
fn observed(sbx: &Sandbox, w: &World, view: &LeaseView) -> SandboxStatus {
    let generation = sbx.metadata.generation;
    let mut st = w.old.clone();
    st.scope_key = Some(w.scope_key.clone());
    st.observed_generation = generation;
    let (guard, held, reason, message) = guarded(view);
    st.guard = guard;
    let cond = &mut st.conditions;
    conditions::set(cond, GUARDED, held, reason, message, generation, w.now);
    st
}

/// The plan of a spec that cannot be honoured (its problems) or a runtime the namespace
/// refuses, if either.
fn refusal(sbx: &Sandbox, w: &World, st: &mut SandboxStatus) -> Option<Plan> {
    let (generation, now) = (sbx.metadata.generation, w.now);
    if !w.problems.is_empty() {
        let message = w.problems.join("; ");
        invalid(st, &message, generation, now);
        let note = Note::new(EventType::Warning, "InvalidSpec", "Validate", &message);
        return Some(Plan {
            step: Step::Invalid,
            status: st.clone(),
            note: Some(note),
            requeue: None,
        });
    }
    let message = w.runtime_refusal.as_ref()?;
    // Refused like an invalid spec (no pod; a running one goes), but looked at again: the
    // namespace's annotation may change, and it is not watched.
    runtime_refused(st, message, generation, now);
    let note = Note::new(EventType::Warning, runtime::REFUSED, "Validate", message);
    Some(Plan {
        step: Step::Invalid,
        status: st.clone(),
        note: Some(note),
        requeue: Some(w.recheck),
    })
}

/// How the node of the sandbox's own pod fares, when the sandbox runs and has a pod of its
/// own on a node.
fn node_of_pod(sbx: &Sandbox, w: &World) -> Option<NodeHealth> {
    if sbx.spec.lifecycle.mode == LifecycleMode::Suspended {
        return None;
    }
    let (node, seen) = w.node.as_ref()?;
    if !w.pod_ours {
        return None;
    }
    Some(nodeloss::judge(
        node,
        seen.as_ref(),
        w.now,
        w.node_loss_grace,
    ))
}

/// The scope's execution guard as the Sandbox reports it: holder and since when, whether it is
/// held, and the Guarded condition's reason and message. An expired lease counts as free:
/// anyone may take it over.
pub fn guarded(view: &LeaseView) -> (Option<GuardStatus>, bool, &'static str, String) {
    let Some(holder) = view.holder.clone() else {
        return (None, false, "Free", "nobody holds the scope's guard".into());
    };
    if view.expired {
        let message = format!("{holder} held the guard but stopped renewing it");
        return (None, false, "Expired", message);
    }
    let status = GuardStatus {
        holder: Some(holder.clone()),
        since: view.acquired.map(Time),
    };
    (Some(status), true, "Held", format!("held by {holder}"))
}

/// The step for the sandbox's pod (or its absence), once the spec is valid and the sandbox
/// has not reached its shutdown time.
fn pod_step(sbx: &Sandbox, w: &World, st: &mut SandboxStatus) -> (Step, Option<Note>) {
    let (generation, now) = (sbx.metadata.generation, w.now);
    if sbx.spec.lifecycle.mode == LifecycleMode::Suspended {
        // An idle suspension said so (and announced it) when it set the mode: keep its reason.
        if idle::suspended_for_idleness(&w.old) {
            let timeout = idle::timeout(sbx).unwrap_or_default();
            let message = idle::message(timeout, w.old.idle_since.as_ref());
            suspended(st, generation, now, Some(&message));
            return (Step::Suspend, None);
        }
        // So did an over-limit suspension.
        if let Some(c) = conditions::get(&w.old.conditions, sizelimit::CONDITION)
            .filter(|c| c.reason == sizelimit::OVER_LIMIT)
        {
            let message = c.message.clone();
            suspended_because(st, generation, now, Some((sizelimit::OVER_LIMIT, &message)));
            return (Step::Suspend, None);
        }
        suspended(st, generation, now, None);
        let note = Note::new(
            EventType::Normal,
            "Suspended",
            "DeletePod",
            "pod deleted; workspace kept",
        );
        return (Step::Suspend, Some(note));
    }
    let Some(pod) = &w.pod else {
        // The pod about to be made is made from the template as it is now.
        st.template = w.template.clone();
        return (Step::CreatePod, None);
    };
    if pod.metadata.deletion_timestamp.is_some() {
        st.phase = Some(SandboxPhase::Pending);
        not_ready(
            st,
            "PodTerminating",
            "the sandbox pod is terminating; a new one follows",
            generation,
            now,
        );
        return (Step::AwaitPodGone, None);
    }
    if !w.pod_ours {
        let msg = format!(
            "a pod named {} exists and does not belong to this sandbox",
            pod.name_any()
        );
        st.phase = Some(SandboxPhase::Failed);
        not_ready(st, "PodNameConflict", &msg, generation, now);
        let note = Note::new(EventType::Warning, "PodNameConflict", "CreatePod", &msg);
        return (Step::PodNameConflict, Some(note));
    }
    // A pod made from another version of the template is kept: a template edit applies from
    // the sandbox's next start, not by replacing a running pod.
    let template_moved = w.old.template.is_some() && w.old.template != w.template;
    let replace = if w.desired_hash != w.pod_hash && !template_moved {
        Some((
            "PodReplaced",
            "the sandbox spec changed; replacing the pod (the workspace is kept)".to_string(),
        ))
    } else if let PodState::Ended(reason) = &w.pod_state {
        Some((
            "PodRecreated",
            format!("the pod ended ({reason}); replacing it (the workspace is kept)"),
        ))
    } else {
        None
    };
    if let Some((reason, msg)) = replace {
        let note = Note::new(EventType::Normal, reason, "DeletePod", &msg);
        return (Step::ReplacePod, Some(note));
    }
    serving(sbx, st, pod, w.template.as_ref());
    (Step::Serve, None)
}

/// The status of a sandbox about to be served by `pod` (its own, or a warm one it has just
/// adopted): the pod and the directory it mounts recorded together, in the status write that
/// records the pod (no write of their own), with its endpoints and template.
pub fn serving(sbx: &Sandbox, st: &mut SandboxStatus, pod: &Pod, template: Option<&TemplateUse>) {
    st.pod_name = Some(pod.name_any());
    // What the pod runs under, from the pod itself (an adopted warm pod's, a pod made before
    // the operator's default changed).
    st.runtime_class_name = pod.spec.as_ref().and_then(|s| s.runtime_class_name.clone());
    // Only a directory other than the derived `<nodeRoot>/<ns>/<uid>` (an adopted warm one) is
    // recorded: a cold sandbox's status stays writable against a CRD from before
    // `workspace.hostDir` (an operator rolled out ahead of its CRDs), and says nothing the
    // derivation does not.
    if let Some(dir) = placement::pod_host_dir(pod)
        && !is_derived(sbx, &dir)
    {
        st.workspace.get_or_insert_with(Default::default).host_dir = Some(dir);
    }
    st.endpoints = service::endpoints(sbx, Some(pod));
    if st.template.is_none() {
        // The status of a pod's creation may have been deferred (a pod that starts at once
        // is reported Ready directly): its template is the one resolved now.
        st.template = template.cloned();
    }
}

/// Whether a start may adopt a warm pod instead of making one: only a sandbox's first start,
/// from a template, whose workspace is nowhere yet. A resume (the workspace kept on its node,
/// `status.workspace.hostDir`), a start after the pod was lost (branch A reuses the directory)
/// and a recovery from a lost node (branch B restores what the status says was ready) all
/// start cold, where the workspace is or was.
pub fn may_claim(sbx: &Sandbox, old: &SandboxStatus) -> bool {
    sbx.spec.template_ref.is_some()
        && sbx.spec.lifecycle.mode == LifecycleMode::Running
        && old.node_name.is_none()
        && old.abandoned.is_empty()
        && old
            .workspace
            .as_ref()
            .is_none_or(|w| !w.root_ready && w.host_dir.is_none())
}

/// No pod, and no pod wanted: `phase`, with PodReady and Ready False for `reason` with their
/// messages (in the order given).
fn no_pod(
    st: &mut SandboxStatus,
    phase: SandboxPhase,
    reason: &str,
    messages: [(&str, &str); 2],
    generation: Option<i64>,
    now: Timestamp,
) {
    st.phase = Some(phase);
    st.pod_name = None;
    st.runtime_class_name = None;
    set_false(st, reason, &messages, generation, now);
}

/// Sets each condition of `messages` (type, message) to False with one reason.
fn set_false(
    st: &mut SandboxStatus,
    reason: &str,
    messages: &[(&str, &str)],
    generation: Option<i64>,
    now: Timestamp,
) {
    for (type_, message) in messages {
        conditions::set(
            &mut st.conditions,
            type_,
            false,
            reason,
            *message,
            generation,
            now,
        );
    }
}

/// Failed for an invalid spec: no pod.
fn invalid(st: &mut SandboxStatus, message: &str, generation: Option<i64>, now: Timestamp) {
    let messages = [(READY, message), (POD_READY, "no pod for an invalid spec")];
    no_pod(
        st,
        SandboxPhase::Failed,
        "InvalidSpec",
        messages,
        generation,
        now,
    );
}

/// Failed for a runtime class the namespace refuses: no pod, and `Stalled` so that every
/// client's wait for Ready ends with the reason.
fn runtime_refused(st: &mut SandboxStatus, message: &str, generation: Option<i64>, now: Timestamp) {
    let messages = [
        (READY, message),
        (
            POD_READY,
            "no pod for a runtime class the namespace refuses",
        ),
    ];
    no_pod(
        st,
        SandboxPhase::Failed,
        runtime::REFUSED,
        messages,
        generation,
        now,
    );
    conditions::set(
        &mut st.conditions,
        STALLED,
        true,
        runtime::REFUSED,
        message,
        generation,
        now,
    );
}

/// Suspended: no pod, the workspace kept on its node. `idle` is the message of a suspension
/// by the idle timeout (reason [`idle::REASON`]).
fn suspended(st: &mut SandboxStatus, generation: Option<i64>, now: Timestamp, idle: Option<&str>) {
    let why = idle.map(|message| (idle::REASON, message));
    suspended_because(st, generation, now, why);
}

/// [`suspended`] with the reason and message of an operator's suspension (`None`: the
/// spec's).
fn suspended_because(
    st: &mut SandboxStatus,
    generation: Option<i64>,
    now: Timestamp,
    why: Option<(&str, &str)>,
) {
    let (reason, ready) = why.unwrap_or(("Suspended", "the sandbox is suspended"));
    let messages = [
        (
            POD_READY,
            "the sandbox is suspended; its workspace is kept on its node",
        ),
        (READY, ready),
    ];
    no_pod(
        st,
        SandboxPhase::Suspended,
        reason,
        messages,
        generation,
        now,
    );
}

/// The status an idle suspension writes with the mode it sets: Suspended for the idle
/// timeout, as the suspend step that follows will say, but still naming the pod (the on-stop
/// snapshot is taken from it; the suspend step drops it once the pod is gone). Returns the
/// Event that announces it.
pub fn idle_suspended(
    st: &mut SandboxStatus,
    timeout: Duration,
    generation: Option<i64>,
    now: Timestamp,
) -> Note {
    let pod = st.pod_name.clone();
    st.observed_generation = generation;
    let message = idle::message(timeout, st.idle_since.as_ref());
    suspended(st, generation, now, Some(&message));
    st.pod_name = pod;
    Note::new(EventType::Normal, idle::REASON, "Suspend", &message)
}

/// The status an over-limit suspension writes with the mode it sets (as
/// [`idle_suspended`]), and its Warning Event ([`sizelimit::OVER_LIMIT`]).
pub fn over_limit_suspended(
    st: &mut SandboxStatus,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Note {
    let pod = st.pod_name.clone();
    st.observed_generation = generation;
    suspended_because(st, generation, now, Some((sizelimit::OVER_LIMIT, message)));
    st.pod_name = pod;
    Note::new(
        EventType::Warning,
        sizelimit::OVER_LIMIT,
        "Suspend",
        message,
    )
}

/// No pod for now (its sources are missing, or the API server refused it): Pending, PodReady
/// and Ready False with `reason`, and the Warning Event that goes with it.
pub fn held(st: &mut SandboxStatus, reason: &str, message: &str, stamp: Stamp) -> Note {
    let Stamp { generation, now } = stamp;
    st.phase = Some(SandboxPhase::Pending);
    st.pod_name = None;
    st.runtime_class_name = None;
    not_ready(st, reason, message, generation, now);
    Note::new(EventType::Warning, reason, "CreatePod", message)
}

/// No pod because the runtime class `name` it would run under does not exist: Pending, Ready
/// False and `Stalled` with reason [`runtime::NOT_FOUND`] (a client's wait for Ready ends with
/// it), and the Warning Event. It clears when the class exists and the pod is made.
pub fn runtime_class_missing(
    st: &mut SandboxStatus,
    name: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Note {
    let message = runtime::not_found_message(name);
    let note = held(st, runtime::NOT_FOUND, &message, Stamp { generation, now });
    conditions::set(
        &mut st.conditions,
        STALLED,
        true,
        runtime::NOT_FOUND,
        message,
        generation,
        now,
    );
    note
}

/// A Sandbox whose template `name` does not exist: Pending with reason `TemplateNotFound`
/// (its status as read, the status to write, and the Warning Event).
pub fn template_missing(
    sbx: &Sandbox,
    name: &str,
    now: Timestamp,
) -> (SandboxStatus, SandboxStatus, Note) {
    let old = sbx.status.clone().unwrap_or_default();
    let mut st = old.clone();
    st.scope_key = Some(labels::scope_key(&sbx.spec.scope));
    st.observed_generation = sbx.metadata.generation;
    let message = crate::controller::template::missing_message(name);
    let stamp = Stamp {
        generation: sbx.metadata.generation,
        now,
    };
    let note = held(
        &mut st,
        crate::controller::template::NOT_FOUND,
        &message,
        stamp,
    );
    (old, st, note)
}

/// What a node loss costs: the snapshot the recovery will restore, if any, and when it
/// completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// The snapshot and its completion time; `None`: nothing to restore.
    pub snapshot: Option<(String, Timestamp)>,
}

/// The sandbox's node `node` is lost (not ready since `since`, `why`): the workspace
/// directory `dir` there is abandoned (recorded for cleanup when the node returns), the
/// sandbox unpinned and Pending, the loss and what the recovery restores and loses recorded;
/// returns the one Warning Event that says so.
pub fn node_lost(
    st: &mut SandboxStatus,
    lost: &Lost,
    dir: &str,
    recovery: &Recovery,
    Stamp { generation, now }: Stamp,
) -> Note {
    let (node, since, why) = (lost.node.as_str(), lost.since, lost.why.as_str());
    st.node_name = None;
    st.pod_name = None;
    // The directory is given up with its node: the next pod, elsewhere, gets a fresh one.
    if let Some(w) = st.workspace.as_mut() {
        w.host_dir = None;
    }
    st.phase = Some(SandboxPhase::Pending);
    if !st.abandoned.iter().any(|a| a.node == node) {
        st.abandoned.push(AbandonedWorkspace {
            node: node.to_string(),
            directory: dir.to_string(),
            since: Time(now),
        });
    }
    // The work between the snapshot and the node's failure is what is lost.
    let failed_at = since.unwrap_or(now);
    let lost = recovery.snapshot.as_ref().map(|(_, done)| {
        failed_at
            .as_second()
            .saturating_sub(done.as_second())
            .max(0)
    });
    st.node_loss = Some(NodeLoss {
        node: node.to_string(),
        not_ready_since: since.map(Time),
        detected_at: Time(now),
        snapshot: recovery.snapshot.as_ref().map(|(n, _)| n.clone()),
        snapshot_completed_at: recovery.snapshot.as_ref().map(|(_, t)| Time(*t)),
        lost_seconds: lost,
    });
    let plan = match (&recovery.snapshot, lost) {
        (Some((snap, _)), Some(secs)) => format!(
            "restarting on another node from snapshot {snap}; the work of the {secs}s between that snapshot and the node's failure is lost"
        ),
        _ => "there is no snapshot to restore: the workspace is lost, and the sandbox restarts on another node with a fresh one from its spec".to_string(),
    };
    let message = format!(
        "{why}: its workspace there ({dir}) is given up (removed when the node is back) and its pod force-deleted; {plan}"
    );
    set_false(
        st,
        "NodeLost",
        &[
            (POD_READY, &message),
            (WORKSPACE_READY, &message),
            (READY, &message),
        ],
        generation,
        now,
    );
    Note::new(EventType::Warning, "NodeLost", "RecoverWorkspace", &message)
}

/// Whether `dir` is the directory derived from the sandbox's UID (`.../<ns>/<uid>`).
fn is_derived(sbx: &Sandbox, dir: &str) -> bool {
    let (Some(ns), Some(uid)) = (sbx.metadata.namespace.as_deref(), sbx.uid()) else {
        return false;
    };
    dir.ends_with(&format!("/{ns}/{uid}"))
}

/// A pod was just made. A brand-new sandbox gets its first status from the pod's own progress
/// (one write fewer); one that had a pod must stop saying Ready at once. Returns whether the
/// status is to be written.
pub fn pod_created(
    old: &SandboxStatus,
    st: &mut SandboxStatus,
    pod_name: &str,
    Stamp { generation, now }: Stamp,
) -> bool {
    if old.phase.is_none() {
        return false;
    }
    st.pod_name = Some(pod_name.to_string());
    // A made pod mounts the recorded directory, or the derived one (not recorded: see
    // `serving`); either way the status already says which.
    pod_starting(st, generation, now);
    old != st
}

/// Pending: the pod is on its way.
fn pod_starting(st: &mut SandboxStatus, generation: Option<i64>, now: Timestamp) {
    st.phase = Some(SandboxPhase::Pending);
    not_ready(
        st,
        "PodStarting",
        "waiting for the sandbox pod to run",
        generation,
        now,
    );
}

/// Sets PodReady and Ready to False with one reason: the pod is not (yet) serving.
fn not_ready(
    st: &mut SandboxStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    set_false(
        st,
        reason,
        &[(POD_READY, message), (READY, message)],
        generation,
        now,
    );
}

/// What the pod looked like to [`Step::Serve`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Serving {
    /// Its state.
    pub state: PodState,
    /// Its age.
    pub age: Duration,
    /// Its UID.
    pub uid: String,
    /// How long it has been in its problem ([`podstate::problem_since`]; `None`: unknown).
    pub problem_for: Option<Duration>,
    /// The operator's stall grace: how long a problem of [`podstate::STALL_REASONS`] may last
    /// before the start is `Stalled`.
    pub stall_grace: Duration,
}

impl Serving {
    /// Whether the workspace is to be initialised (or was, in this pod) now: only once the
    /// kubelet reports this pod (by UID) Running with its container ready. Not before, even
    /// where an exec might already reach a container: exec finds its container by the pod's
    /// *name*, and a pod of the same name can still be stopping on the node (a force delete
    /// removes the object before the kubelet has stopped anything), so an early exec may run
    /// in the old pod, and a Ready written on its word names a pod that cannot run a command
    /// yet (issue 42).
    pub fn initialises(&self) -> bool {
        self.state == PodState::Ready
    }
}

/// The outcome of initialising the workspace in the pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Init {
    /// Not tried: the pod does not run yet, or the workspace was initialised in it before.
    Skipped,
    /// Initialised now.
    Ran {
        /// The workspace status to record.
        workspace: WorkspaceStatus,
        /// The start decided.
        decision: workspace::Decision,
    },
    /// Failed (the error goes back to the controller for its retry pace).
    Failed {
        /// Condition reason.
        reason: String,
        /// What happened.
        message: String,
        /// A permanent restore refusal to record.
        refusal: Option<RestoreRefusal>,
        /// Whether it waits for a change rather than passing by itself (`Stalled`).
        permanent: bool,
    },
}

/// What [`served`] settled.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Served {
    /// The pod is still on its way (for [`defer_first_status`]).
    pub starting: bool,
    /// Look again this soon (a pod problem that stalls the start if it lasts this much
    /// longer).
    pub retry: Option<Duration>,
    /// Initialisation failed: write the status with this Warning Event and report the error.
    pub failed: Option<Note>,
    /// A problem with the pod, published when its reason is new (before the status write).
    pub problem: Option<Note>,
    /// The start of the workspace, published after the status write (Ready is what a harness
    /// waits for).
    pub started: Option<Note>,
}

/// Whether a start that has just become Ready is announced with an Event. A claimed warm
/// pod's fresh start (branch D: nothing restored) is not: it is the hot path of a harness's
/// request and an Event is one more API write, while the status already says the same (Ready,
/// and `WorkspaceReady`'s message names the branch). Every other start is (a restore into a
/// warm pod, and any cold start).
pub fn announce_start(adopted: bool, st: &SandboxStatus) -> bool {
    let branch = st.workspace.as_ref().and_then(|w| w.last_start_branch);
    !(adopted && branch == Some(StartBranch::Fresh))
}

/// The status of a served pod, from its state and the outcome of initialising it.
pub fn served(
    old: &SandboxStatus,
    st: &mut SandboxStatus,
    pod: &Serving,
    init: Init,
    Stamp { generation, now }: Stamp,
) -> Served {
    let mut out = Served::default();
    // A stall of the pod's is about the pod as it is now: it goes once the problem does.
    if !matches!(&pod.state, PodState::Problem { .. }) {
        clear_pod_stall(st);
    }
    match (&pod.state, init) {
        // Whatever the status said before (Ready in an earlier pod of the same name), not
        // Ready until the kubelet reports this pod running.
        (PodState::Starting, _) => {
            out.starting = true;
            pod_starting(st, generation, now);
        }
        (PodState::Ready, init) => {
            out = running(st, pod, init, Stamp { generation, now });
        }
        (PodState::Problem { reason, message }, _) => {
            st.phase = Some(SandboxPhase::Pending);
            not_ready(st, reason, message, generation, now);
            match pod_stall(reason, pod.problem_for, pod.stall_grace) {
                PodStall::Now => {
                    let message = stalled_message(message, pod.stall_grace);
                    let was = old.conditions.iter().any(|c| {
                        c.type_ == STALLED && c.status == "True" && podstate::stalls(&c.reason)
                    });
                    conditions::set(
                        &mut st.conditions,
                        STALLED,
                        true,
                        reason,
                        message.as_str(),
                        generation,
                        now,
                    );
                    // Announced once, when the start stalls (the problem's own Event came
                    // when it began). An action of its own: Events of one reason and action
                    // are folded into one series, which keeps the first one's note.
                    if !was {
                        let note = Note::new(EventType::Warning, reason, "Stall", &message);
                        out.problem = Some(note);
                    }
                }
                PodStall::In(wait) => {
                    clear_pod_stall(st);
                    // Nothing else may happen to the pod meanwhile (an image pull backs off
                    // for minutes without a status change): look again when the grace ends.
                    out.retry = Some(wait);
                }
                PodStall::Never => clear_pod_stall(st),
            }
            let was = conditions::get(&old.conditions, POD_READY).map(|c| c.reason.as_str());
            if out.problem.is_none() && was != Some(reason.as_str()) {
                out.problem = Some(Note::new(EventType::Warning, reason, "StartPod", message));
            }
        }
        // Ended pods are replaced, never served.
        (PodState::Ended(_), _) => {}
    }
    out
}

/// What a pod problem means for the start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodStall {
    /// It stalls the start now: it has lasted the grace.
    Now,
    /// It will, if it lasts this much longer.
    In(Duration),
    /// It never does (a problem that is not one of [`podstate::STALL_REASONS`], or one whose
    /// start is unknown).
    Never,
}

/// Whether a pod problem of `reason` that has lasted `lasted` stalls the start under `grace`.
pub fn pod_stall(reason: &str, lasted: Option<Duration>, grace: Duration) -> PodStall {
    match lasted {
        Some(lasted) if podstate::stalls(reason) => match grace.checked_sub(lasted) {
            Some(left) if !left.is_zero() => PodStall::In(left),
            _ => PodStall::Now,
        },
        _ => PodStall::Never,
    }
}

/// The `Stalled` message of a pod problem: the kubelet's or the scheduler's message, and why
/// waiting stopped. Stable while the problem lasts (a message that counted seconds would be a
/// status write on every look).
fn stalled_message(message: &str, grace: Duration) -> String {
    format!(
        "{message} (the sandbox pod cannot start, and has not for longer than the operator's stall grace of {}s)",
        grace.as_secs()
    )
}

/// Removes a `Stalled` condition of `reason`, if there is one.
pub fn clear_stall(st: &mut SandboxStatus, reason: &str) {
    st.conditions
        .retain(|c| !(c.type_ == STALLED && c.reason == reason));
}

/// Removes a `Stalled` condition that a pod problem set (one a refused start set stays).
pub fn clear_pod_stall(st: &mut SandboxStatus) {
    st.conditions
        .retain(|c| !(c.type_ == STALLED && podstate::stalls(&c.reason)));
}

/// A running container (the kubelet says so): PodReady, then the workspace's outcome; Ready
/// when it is initialised in this pod.
fn running(
    st: &mut SandboxStatus,
    pod: &Serving,
    init: Init,
    Stamp { generation, now }: Stamp,
) -> Served {
    let mut out = Served::default();
    conditions::set(
        &mut st.conditions,
        POD_READY,
        true,
        "PodRunning",
        "the sandbox container is running",
        generation,
        now,
    );
    match init {
        Init::Skipped => {}
        Init::Ran {
            workspace,
            decision,
        } => {
            out.started = Some(initialised(
                st,
                pod,
                workspace,
                &decision,
                Stamp { generation, now },
            ));
        }
        Init::Failed {
            reason,
            message,
            refusal,
            permanent,
        } => {
            if refusal.is_some() {
                st.restore_refusal = refusal;
            }
            st.phase = Some(SandboxPhase::Initializing);
            let messages = [
                (WORKSPACE_READY, message.as_str()),
                (READY, message.as_str()),
            ];
            set_false(st, &reason, &messages, generation, now);
            if permanent {
                conditions::set(
                    &mut st.conditions,
                    STALLED,
                    true,
                    &reason,
                    message.as_str(),
                    generation,
                    now,
                );
            } else {
                conditions::remove(&mut st.conditions, STALLED);
            }
            let note = Note::new(EventType::Warning, &reason, "InitWorkspace", &message);
            out.failed = Some(note);
            return out;
        }
    }
    st.phase = Some(SandboxPhase::Ready);
    conditions::remove(&mut st.conditions, STALLED);
    conditions::set(
        &mut st.conditions,
        READY,
        true,
        "Ready",
        "the sandbox accepts commands",
        generation,
        now,
    );
    out
}

/// A sandbox that would be Ready, held by what is known of its egress policy's enforcement
/// on its node (fail closed): with a proof, an attestation, or nothing to enforce it is Ready
/// (and `NetworkEnforced` says which); otherwise it is Initializing with Ready and
/// `NetworkEnforced` False, and a Warning Event when the enforcement is known to be missing.
/// A sandbox whose pod is still starting (held until its own rules are in force) says so too
/// when the enforcement is known to be missing: that is why it is not Ready. Returns the Event
/// and how soon to look again.
pub fn network_gate(
    old: &SandboxStatus,
    st: &mut SandboxStatus,
    gate: &netcheck::Gate,
    Stamp { generation, now }: Stamp,
) -> (Option<Note>, Option<Duration>) {
    use netcheck::Gate;
    let (ok, reason, message) = match gate {
        Gate::NotNeeded => {
            conditions::remove(&mut st.conditions, netcheck::CONDITION);
            return (None, None);
        }
        Gate::Attested => (true, "Attested", "the administrator attests that NetworkPolicy is enforced (network.enforcement: Attested)".to_string()),
        Gate::Proven => (true, "Proven", "NetworkPolicy enforcement was proven on this node by the operator's check".to_string()),
        Gate::Pending => (false, netcheck::CHECKING, "the operator is checking that NetworkPolicy is enforced on this node".to_string()),
        Gate::Failed { reason, message } => (false, reason.as_str(), message.clone()),
    };
    conditions::set(
        &mut st.conditions,
        netcheck::CONDITION,
        ok,
        reason,
        message.as_str(),
        generation,
        now,
    );
    // A cold pod that relies on a policy waits (its network-wait init container) while its
    // node's verdict is failed: then the failure, not the pod's start, is why it is not Ready.
    let stalled = conditions::get(&st.conditions, STALLED).is_some_and(|c| c.status == "True");
    let waits_for_it = matches!(gate, Gate::Failed { .. })
        && matches!(
            st.phase,
            Some(SandboxPhase::Pending | SandboxPhase::Initializing)
        )
        && !stalled;
    if ok || (st.phase != Some(SandboxPhase::Ready) && !waits_for_it) {
        return (None, None);
    }
    st.phase = Some(SandboxPhase::Initializing);
    conditions::set(
        &mut st.conditions,
        READY,
        false,
        reason,
        message.as_str(),
        generation,
        now,
    );
    match gate {
        Gate::Failed { .. } => {
            let was = conditions::get(&old.conditions, netcheck::CONDITION)
                .is_some_and(|c| c.status == "False" && c.reason == reason);
            let note = (!was)
                .then(|| Note::new(EventType::Warning, reason, "CheckNetworkPolicy", &message));
            (note, Some(netcheck::RETRY_FAILED))
        }
        _ => (None, Some(Duration::from_millis(500))),
    }
}

/// The workspace was initialised in `pod` now: recorded, WorkspaceReady with the start's
/// reason; returns the Event that announces the start branch.
fn initialised(
    st: &mut SandboxStatus,
    pod: &Serving,
    workspace: WorkspaceStatus,
    decision: &workspace::Decision,
    Stamp { generation, now }: Stamp,
) -> Note {
    let host_dir = st.workspace.as_ref().and_then(|w| w.host_dir.clone());
    st.workspace = Some(WorkspaceStatus {
        initialized_pod_uid: Some(pod.uid.clone()),
        host_dir: workspace.host_dir.clone().or(host_dir),
        ..workspace
    });
    if decision.restore.is_some() {
        st.restored_from = decision.restore.clone();
    }
    st.restore_refusal = None;
    conditions::set(
        &mut st.conditions,
        WORKSPACE_READY,
        true,
        decision.reason,
        &decision.message,
        generation,
        now,
    );
    let (letter, label) = (decision.branch.letter(), decision.branch.label());
    let note = format!("start branch {letter} ({label}): {}", decision.message);
    Note::new(EventType::Normal, decision.reason, "InitWorkspace", &note)
}

/// How long a brand-new sandbox whose pod is starting goes without a status.
pub const FIRST_STATUS_GRACE: Duration = Duration::from_secs(2);

/// Whether to hold back a brand-new sandbox's first status (and for how long): while its pod
/// starts, for the first [`FIRST_STATUS_GRACE`]. Most sandboxes are Ready by then, and Ready
/// becomes their first and only status write; a slow start still shows Pending after it.
pub fn defer_first_status(
    old_phase: Option<SandboxPhase>,
    starting: bool,
    pod_age: Duration,
) -> Option<Duration> {
    (old_phase.is_none() && starting && pod_age < FIRST_STATUS_GRACE)
        .then(|| FIRST_STATUS_GRACE - pod_age)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    #[test]
    fn a_pod_held_for_its_rules_says_the_network_is_why_it_is_not_ready() {
        use crate::controller::netcheck::{self, Gate};
        let failed = Gate::Failed {
            reason: netcheck::NOT_ENFORCED.into(),
            message: "NetworkPolicy is not enforced on node n: Install ...".into(),
        };
        let stamp = || Stamp {
            generation: Some(1),
            now: t(10),
        };
        let ready_reason = |st: &SandboxStatus| {
            conditions::get(&st.conditions, READY).map(|c| (c.status.clone(), c.reason.clone()))
        };
        // Starting (its pod waits in network-wait): the failure is the reason, with its Event.
        let old = SandboxStatus::default();
        let mut st = SandboxStatus {
            phase: Some(SandboxPhase::Pending),
            ..Default::default()
        };
        conditions::set(
            &mut st.conditions,
            READY,
            false,
            "PodStarting",
            "starting",
            Some(1),
            t(5),
        );
        let (note, wait) = network_gate(&old, &mut st, &failed, stamp());
        assert_eq!(
            ready_reason(&st),
            Some(("False".into(), netcheck::NOT_ENFORCED.into()))
        );
        assert!(note.is_some());
        assert_eq!(wait, Some(netcheck::RETRY_FAILED));
        // Still checking: the pod's start stays the reason.
        let mut st = SandboxStatus {
            phase: Some(SandboxPhase::Pending),
            ..Default::default()
        };
        conditions::set(
            &mut st.conditions,
            READY,
            false,
            "PodStarting",
            "starting",
            Some(1),
            t(5),
        );
        let _ = network_gate(&old, &mut st, &Gate::Pending, stamp());
        assert_eq!(
            ready_reason(&st),
            Some(("False".into(), "PodStarting".into()))
        );
        // Stalled for another reason: that stays the reason.
        let mut st = SandboxStatus {
            phase: Some(SandboxPhase::Pending),
            ..Default::default()
        };
        conditions::set(
            &mut st.conditions,
            STALLED,
            true,
            "ImagePullBackOff",
            "no image",
            Some(1),
            t(5),
        );
        conditions::set(
            &mut st.conditions,
            READY,
            false,
            "ImagePullBackOff",
            "no image",
            Some(1),
            t(5),
        );
        let _ = network_gate(&old, &mut st, &failed, stamp());
        assert_eq!(
            ready_reason(&st),
            Some(("False".into(), "ImagePullBackOff".into()))
        );
    }

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn sandbox(spec: serde_json::Value) -> Sandbox {
        let mut spec_full = json!({"image": "busybox", "scope": {"kind": "Global"}});
        if let (Some(base), Some(extra)) = (spec_full.as_object_mut(), spec.as_object()) {
            base.extend(extra.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s", "namespace": "n", "uid": "sbx-uid", "generation": 3},
            "spec": spec_full,
        }))
        .unwrap()
    }

    fn pod(owner: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "s-sandbox", "uid": "pod-uid",
                "ownerReferences": [{"apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
                    "name": "s", "uid": owner, "controller": true}]},
        }))
        .unwrap()
    }

    fn world(pod: Option<Pod>) -> World {
        World {
            scope_key: labels::scope_key(&sandbox(json!({})).spec.scope),
            pod_ours: pod
                .as_ref()
                .is_some_and(|p| placement::controlled_by(p, &sandbox(json!({})))),
            now: t(0),
            old: SandboxStatus::default(),
            lease: None,
            problems: Vec::new(),
            runtime_refusal: None,
            recheck: Duration::from_secs(300),
            pod,
            policy: None,
            pod_state: PodState::Starting,
            desired_hash: Some("h".into()),
            pod_hash: Some("h".into()),
            node: None,
            node_loss_grace: Duration::from_secs(60),
            template: None,
        }
    }

    fn reason(st: &SandboxStatus, type_: &str) -> String {
        conditions::get(&st.conditions, type_)
            .map(|c| c.reason.clone())
            .unwrap_or_default()
    }

    fn not_ready_node(since: Timestamp) -> k8s_openapi::api::core::v1::Node {
        serde_json::from_value(json!({
            "metadata": {"name": "n2"},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown",
                "lastTransitionTime": Time(since)}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_pod_on_a_node_not_ready_within_the_grace_is_kept_and_looked_at_when_it_ends() {
        let mut w = world(Some(pod("sbx-uid")));
        w.now = t(20);
        w.node = Some(("n2".into(), Some(not_ready_node(t(0)))));
        let plan = decide(&sandbox(json!({})), &w);
        assert_eq!(plan.step, Step::Serve);
        assert_eq!(plan.requeue, Some(Duration::from_secs(40)));
    }

    #[test]
    fn a_pod_on_a_node_not_ready_past_the_grace_or_gone_is_a_node_loss() {
        let mut w = world(Some(pod("sbx-uid")));
        w.now = t(61);
        w.node = Some(("n2".into(), Some(not_ready_node(t(0)))));
        let plan = decide(&sandbox(json!({})), &w);
        match plan.step {
            Step::NodeLost(Lost { node, since, .. }) => {
                assert_eq!((node.as_str(), since), ("n2", Some(t(0))));
            }
            other => panic!("{other:?}"),
        }
        w.node = Some(("n2".into(), None));
        assert!(matches!(
            decide(&sandbox(json!({})), &w).step,
            Step::NodeLost(Lost { since: None, .. })
        ));
        // Not ours: never force-deleted for a node loss.
        w = World {
            node: w.node.clone(),
            now: w.now,
            ..world(Some(pod("someone-else")))
        };
        assert_eq!(decide(&sandbox(json!({})), &w).step, Step::PodNameConflict);
    }

    #[test]
    fn a_node_loss_unpins_records_the_directory_and_what_was_lost() {
        let mut st = SandboxStatus {
            node_name: Some("n2".into()),
            pod_name: Some("s-sandbox".into()),
            phase: Some(SandboxPhase::Ready),
            ..Default::default()
        };
        let recovery = Recovery {
            snapshot: Some(("snap-1".into(), t(-30))),
        };
        let note = node_lost(
            &mut st,
            &Lost {
                node: "n2".into(),
                since: Some(t(0)),
                why: "node n2 has not been ready".into(),
            },
            "/root/n/sbx-uid",
            &recovery,
            Stamp {
                generation: Some(3),
                now: t(60),
            },
        );
        assert_eq!(
            (st.node_name.as_deref(), st.pod_name.as_deref()),
            (None, None)
        );
        assert_eq!(st.phase, Some(SandboxPhase::Pending));
        assert_eq!(st.abandoned.len(), 1);
        assert_eq!(
            (
                st.abandoned[0].node.as_str(),
                st.abandoned[0].directory.as_str()
            ),
            ("n2", "/root/n/sbx-uid")
        );
        let loss = st.node_loss.clone().unwrap();
        assert_eq!(loss.snapshot.as_deref(), Some("snap-1"));
        assert_eq!(loss.lost_seconds, Some(30));
        assert_eq!(loss.detected_at, Time(t(60)));
        assert_eq!(reason(&st, WORKSPACE_READY), "NodeLost");
        assert_eq!(reason(&st, READY), "NodeLost");
        assert_eq!(
            (note.type_, note.reason.as_str()),
            (EventType::Warning, "NodeLost")
        );
        assert!(
            note.message.contains("snap-1") && note.message.contains("30s"),
            "{}",
            note.message
        );
        // Again (a repeat after a failed delete): one entry per node.
        node_lost(
            &mut st,
            &Lost {
                node: "n2".into(),
                since: Some(t(0)),
                why: "x".into(),
            },
            "/root/n/sbx-uid",
            &recovery,
            Stamp {
                generation: Some(3),
                now: t(61),
            },
        );
        assert_eq!(st.abandoned.len(), 1);
        // Without a snapshot it says plainly that the workspace is lost.
        let mut st = SandboxStatus::default();
        let note = node_lost(
            &mut st,
            &Lost {
                node: "n2".into(),
                since: None,
                why: "node n2 no longer exists".into(),
            },
            "/d",
            &Recovery { snapshot: None },
            Stamp {
                generation: None,
                now: t(0),
            },
        );
        assert!(
            note.message.contains("workspace is lost"),
            "{}",
            note.message
        );
        assert_eq!(st.node_loss.unwrap().lost_seconds, None);
    }

    #[test]
    fn an_invalid_spec_fails_the_sandbox_before_anything_else() {
        let mut w = world(Some(pod("sbx-uid")));
        w.problems = vec!["a".into(), "b".into()];
        let sbx = sandbox(json!({"lifecycle": {"mode": "Suspended"}}));
        let plan = decide(&sbx, &w);
        assert_eq!(plan.step, Step::Invalid);
        assert_eq!(plan.status.phase, Some(SandboxPhase::Failed));
        assert_eq!(plan.status.pod_name, None);
        assert_eq!(reason(&plan.status, READY), "InvalidSpec");
        let note = plan.note.unwrap();
        assert_eq!(
            (note.reason.as_str(), note.message.as_str()),
            ("InvalidSpec", "a; b")
        );
    }

    #[test]
    fn a_runtime_class_the_namespace_refuses_fails_the_sandbox_stalled_and_is_looked_at_again() {
        let why = "namespace n requires runtime class \"gvisor\" (annotation agentbox.dev/required-runtime-class)";
        let mut w = world(Some(pod("sbx-uid")));
        w.runtime_refusal = Some(why.into());
        let plan = decide(&sandbox(json!({})), &w);
        // The Invalid step: no pod (a running one is deleted).
        assert_eq!(plan.step, Step::Invalid);
        assert_eq!(plan.status.phase, Some(SandboxPhase::Failed));
        assert_eq!(plan.status.pod_name, None);
        assert_eq!(reason(&plan.status, READY), "RuntimeClassRequired");
        let stalled = conditions::get(&plan.status.conditions, STALLED).expect("stalled");
        assert_eq!(
            (stalled.status.as_str(), stalled.message.as_str()),
            ("True", why)
        );
        assert_eq!(plan.requeue, Some(Duration::from_secs(300)));
        let note = plan.note.expect("note");
        assert_eq!(
            (note.type_, note.reason.as_str(), note.message.as_str()),
            (EventType::Warning, "RuntimeClassRequired", why)
        );
        // The namespace takes it now: the refusal's stall goes, a pod is made.
        let mut w = world(None);
        w.old = plan.status;
        let plan = decide(&sandbox(json!({})), &w);
        assert_eq!(plan.step, Step::CreatePod);
        assert!(conditions::get(&plan.status.conditions, STALLED).is_none());
    }

    #[test]
    fn a_missing_runtime_class_holds_the_sandbox_stalled_until_it_exists() {
        let mut st = SandboxStatus {
            pod_name: Some("old".into()),
            runtime_class_name: Some("gvisor".into()),
            ..Default::default()
        };
        let note = runtime_class_missing(&mut st, "no-such", Some(3), t(0));
        assert_eq!(st.phase, Some(SandboxPhase::Pending));
        assert_eq!(
            (st.pod_name.as_ref(), st.runtime_class_name.as_ref()),
            (None, None)
        );
        assert_eq!(reason(&st, READY), "RuntimeClassNotFound");
        let stalled = conditions::get(&st.conditions, STALLED).expect("stalled");
        assert_eq!(stalled.status, "True");
        assert!(
            stalled
                .message
                .contains("RuntimeClass \"no-such\" does not exist")
        );
        assert_eq!(
            (note.type_, note.reason.as_str()),
            (EventType::Warning, "RuntimeClassNotFound")
        );
        clear_stall(&mut st, "RuntimeClassNotFound");
        assert!(conditions::get(&st.conditions, STALLED).is_none());
    }

    #[test]
    fn a_served_sandbox_records_the_runtime_class_its_pod_runs_under() {
        let sbx = sandbox(json!({}));
        let mut p = pod("sbx-uid");
        let mut st = SandboxStatus::default();
        super::serving(&sbx, &mut st, &p, None);
        assert_eq!(st.runtime_class_name, None);
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            runtime_class_name: Some("gvisor".into()),
            ..Default::default()
        });
        super::serving(&sbx, &mut st, &p, None);
        assert_eq!(st.runtime_class_name.as_deref(), Some("gvisor"));
    }

    #[test]
    fn every_plan_records_scope_generation_and_guard() {
        let plan = decide(&sandbox(json!({})), &world(None));
        assert_eq!(plan.status.observed_generation, Some(3));
        assert!(plan.status.scope_key.is_some());
        assert_eq!(reason(&plan.status, GUARDED), "Free");
    }

    #[test]
    fn a_passed_shutdown_time_deletes_the_sandbox_and_a_future_one_wakes_it() {
        let past = sandbox(json!({"lifecycle": {"shutdownTime": t(-1).to_string()}}));
        assert_eq!(decide(&past, &world(None)).step, Step::ShutDown);
        let future = sandbox(json!({"lifecycle": {"shutdownTime": t(90).to_string()}}));
        let plan = decide(&future, &world(None));
        assert_eq!(plan.step, Step::CreatePod);
        assert_eq!(plan.requeue, Some(Duration::from_secs(90)));
    }

    #[test]
    fn a_suspended_sandbox_loses_its_pod_and_says_so() {
        let sbx = sandbox(json!({"lifecycle": {"mode": "Suspended"}}));
        let plan = decide(&sbx, &world(Some(pod("sbx-uid"))));
        assert_eq!(plan.step, Step::Suspend);
        assert_eq!(plan.status.phase, Some(SandboxPhase::Suspended));
        assert_eq!(reason(&plan.status, POD_READY), "Suspended");
        assert_eq!(plan.note.unwrap().reason, "Suspended");
    }

    #[test]
    fn an_idle_suspension_keeps_its_reason_and_was_announced_already() {
        let sbx = sandbox(json!({"lifecycle": {"mode": "Suspended", "idleTimeout": "90s"}}));
        let mut w = world(Some(pod("sbx-uid")));
        let mut old = SandboxStatus {
            phase: Some(SandboxPhase::Ready),
            pod_name: Some("s-sandbox".into()),
            idle_since: Some(Time(t(-90))),
            idle_guard_transitions: Some(2),
            ..Default::default()
        };
        let note = idle_suspended(&mut old, Duration::from_secs(90), Some(4), t(0));
        assert_eq!(
            (note.reason.as_str(), note.action),
            ("IdleTimeout", "Suspend")
        );
        assert_eq!(old.phase, Some(SandboxPhase::Suspended));
        assert_eq!(old.observed_generation, Some(4));
        assert_eq!(
            old.pod_name.as_deref(),
            Some("s-sandbox"),
            "the on-stop snapshot still finds the pod"
        );
        assert_eq!(reason(&old, READY), "IdleTimeout");
        w.old = old;
        let plan = decide(&sbx, &w);
        assert_eq!(plan.step, Step::Suspend);
        assert_eq!(plan.note, None, "one Event per idle suspension");
        assert_eq!(reason(&plan.status, READY), "IdleTimeout");
        assert_eq!(plan.status.pod_name, None);
        assert_eq!(
            plan.status.idle_since,
            Some(Time(t(-90))),
            "says when it went idle"
        );
        // Resumed: the pod starts again and the idle record goes.
        let running = sandbox(json!({"lifecycle": {"idleTimeout": "90s"}}));
        let mut w2 = world(None);
        w2.old = plan.status;
        let mut st = w2.old.clone();
        assert!(pod_created(
            &w2.old,
            &mut st,
            "s-sandbox",
            Stamp {
                generation: Some(5),
                now: t(1)
            }
        ));
        let plan = decide(&running, &w2);
        assert_eq!(plan.step, Step::CreatePod);
        assert_eq!(plan.status.idle_since, Some(Time(t(-90))), "until it runs");
        assert_eq!(reason(&st, READY), "PodStarting");
    }

    #[test]
    fn an_over_limit_suspension_keeps_its_reason_and_was_announced_already() {
        let sbx = sandbox(json!({"lifecycle": {"mode": "Suspended"}}));
        let mut w = world(Some(pod("sbx-uid")));
        let mut old = SandboxStatus {
            phase: Some(SandboxPhase::Ready),
            pod_name: Some("s-sandbox".into()),
            ..Default::default()
        };
        let message = "the workspace holds 70 MiB, more than its size limit of 64 MiB";
        conditions::set(
            &mut old.conditions,
            sizelimit::CONDITION,
            false,
            sizelimit::OVER_LIMIT,
            message,
            Some(3),
            t(0),
        );
        let note = over_limit_suspended(&mut old, message, Some(4), t(0));
        assert_eq!(
            (note.type_, note.reason.as_str(), note.action),
            (EventType::Warning, sizelimit::OVER_LIMIT, "Suspend")
        );
        assert_eq!(old.phase, Some(SandboxPhase::Suspended));
        assert_eq!(old.pod_name.as_deref(), Some("s-sandbox"));
        assert_eq!(reason(&old, READY), sizelimit::OVER_LIMIT);
        w.old = old;
        let plan = decide(&sbx, &w);
        assert_eq!(plan.step, Step::Suspend);
        assert_eq!(plan.note, None, "one Event per over-limit suspension");
        assert_eq!(reason(&plan.status, READY), sizelimit::OVER_LIMIT);
        assert_eq!(
            reason(&plan.status, sizelimit::CONDITION),
            sizelimit::OVER_LIMIT
        );
    }

    #[test]
    fn no_pod_makes_one() {
        let plan = decide(&sandbox(json!({})), &world(None));
        assert_eq!(plan.step, Step::CreatePod);
        assert_eq!(
            plan.status.phase, None,
            "the first status comes from the pod"
        );
    }

    #[test]
    fn a_terminating_pod_is_waited_for() {
        let mut p = pod("sbx-uid");
        p.metadata.deletion_timestamp = Some(Time(t(-5)));
        let plan = decide(&sandbox(json!({})), &world(Some(p)));
        assert_eq!(plan.step, Step::AwaitPodGone);
        assert_eq!(reason(&plan.status, READY), "PodTerminating");
    }

    #[test]
    fn a_pod_of_someone_else_is_a_name_conflict() {
        let plan = decide(&sandbox(json!({})), &world(Some(pod("other-uid"))));
        assert_eq!(plan.step, Step::PodNameConflict);
        assert_eq!(plan.status.phase, Some(SandboxPhase::Failed));
        assert_eq!(plan.note.unwrap().type_, EventType::Warning);
    }

    #[test]
    fn a_changed_spec_or_an_ended_pod_replaces_the_pod() {
        let mut w = world(Some(pod("sbx-uid")));
        w.desired_hash = Some("new".into());
        let plan = decide(&sandbox(json!({})), &w);
        assert_eq!(plan.step, Step::ReplacePod);
        assert_eq!(plan.note.unwrap().reason, "PodReplaced");
        let mut w = world(Some(pod("sbx-uid")));
        w.pod_state = PodState::Ended("Evicted".into());
        let plan = decide(&sandbox(json!({})), &w);
        assert_eq!(plan.step, Step::ReplacePod);
        let note = plan.note.unwrap();
        assert_eq!(note.reason, "PodRecreated");
        assert!(note.message.contains("Evicted"), "{}", note.message);
    }

    fn template_use(generation: i64) -> agentbox_api::crd::TemplateUse {
        agentbox_api::crd::TemplateUse {
            name: "agent".into(),
            uid: "tpl-uid".into(),
            generation,
        }
    }

    #[test]
    fn a_new_pod_records_the_template_version_it_is_made_from() {
        let mut w = world(None);
        w.template = Some(template_use(3));
        let plan = decide(&sandbox(json!({})), &w);
        assert_eq!(plan.step, Step::CreatePod);
        assert_eq!(plan.status.template, Some(template_use(3)));
    }

    #[test]
    fn a_template_edit_keeps_the_running_pod_and_a_sandbox_edit_replaces_it() {
        let mut w = world(Some(pod("sbx-uid")));
        w.old.template = Some(template_use(1));
        w.template = Some(template_use(2));
        w.desired_hash = Some("new".into());
        let plan = decide(&sandbox(json!({})), &w);
        assert_eq!(plan.step, Step::Serve);
        assert_eq!(
            plan.status.template,
            Some(template_use(1)),
            "status still names the version the pod was made from"
        );
        w.template = Some(template_use(1));
        let plan = decide(&sandbox(json!({})), &w);
        assert_eq!(plan.step, Step::ReplacePod, "same template, spec changed");
    }

    #[test]
    fn a_served_pod_without_a_recorded_template_records_the_current_one() {
        let mut w = world(Some(pod("sbx-uid")));
        w.template = Some(template_use(4));
        let plan = decide(&sandbox(json!({})), &w);
        assert_eq!(plan.step, Step::Serve);
        assert_eq!(plan.status.template, Some(template_use(4)));
    }

    #[test]
    fn a_missing_template_holds_the_sandbox_pending_with_its_reason() {
        let (old, st, note) = template_missing(&sandbox(json!({})), "agent", t(0));
        assert_eq!(old, SandboxStatus::default());
        assert_eq!(st.phase, Some(SandboxPhase::Pending));
        assert_eq!(reason(&st, READY), "TemplateNotFound");
        assert_eq!(reason(&st, POD_READY), "TemplateNotFound");
        assert_eq!(note.type_, EventType::Warning);
        assert!(
            note.message.contains("SandboxTemplate agent not found"),
            "{}",
            note.message
        );
    }

    #[test]
    fn a_current_pod_of_ours_is_served() {
        let plan = decide(&sandbox(json!({})), &world(Some(pod("sbx-uid"))));
        assert_eq!(plan.step, Step::Serve);
        assert_eq!(plan.status.pod_name.as_deref(), Some("s-sandbox"));
        assert_eq!(plan.note, None);
    }

    fn serving(state: PodState) -> Serving {
        Serving {
            state,
            age: Duration::from_millis(800),
            uid: "pod-uid".into(),
            problem_for: None,
            stall_grace: Duration::from_secs(20),
        }
    }

    fn ran() -> Init {
        Init::Ran {
            workspace: WorkspaceStatus {
                root_ready: true,
                ..Default::default()
            },
            decision: workspace::decide(workspace::Observed {
                marker_present: false,
                root_was_ready: false,
                snapshot: None,
                can_restore: false,
            }),
        }
    }

    #[test]
    fn an_initialised_workspace_makes_the_sandbox_ready_and_announces_its_branch() {
        let (old, mut st) = (SandboxStatus::default(), SandboxStatus::default());
        let out = served(
            &old,
            &mut st,
            &serving(PodState::Ready),
            ran(),
            Stamp {
                generation: Some(1),
                now: t(0),
            },
        );
        assert_eq!(st.phase, Some(SandboxPhase::Ready));
        assert!(conditions::is_true(&st.conditions, READY));
        assert!(conditions::is_true(&st.conditions, WORKSPACE_READY));
        let ws = st.workspace.unwrap();
        assert_eq!(ws.initialized_pod_uid.as_deref(), Some("pod-uid"));
        let started = out.started.unwrap();
        assert_eq!(started.reason, "WorkspaceInitialized");
        assert!(
            started.message.starts_with("start branch D"),
            "{}",
            started.message
        );
        assert!(out.failed.is_none() && !out.starting);
    }

    #[test]
    fn a_failed_initialisation_is_reported_with_its_reason_and_recorded_refusal() {
        let (old, mut st) = (SandboxStatus::default(), SandboxStatus::default());
        let init = Init::Failed {
            reason: "SourceMissing".into(),
            message: "configmap c is missing".into(),
            refusal: None,
            permanent: false,
        };
        let out = served(
            &old,
            &mut st,
            &serving(PodState::Ready),
            init,
            Stamp {
                generation: None,
                now: t(0),
            },
        );
        assert_eq!(st.phase, Some(SandboxPhase::Initializing));
        assert_eq!(reason(&st, WORKSPACE_READY), "SourceMissing");
        assert_eq!(reason(&st, READY), "SourceMissing");
        assert!(conditions::is_true(&st.conditions, POD_READY));
        assert!(
            conditions::get(&st.conditions, STALLED).is_none(),
            "it may pass by itself"
        );
        assert_eq!(out.failed.unwrap().action, "InitWorkspace");
    }

    #[test]
    fn a_permanent_refusal_stalls_the_start_until_one_succeeds() {
        let (old, mut st) = (SandboxStatus::default(), SandboxStatus::default());
        let refused = Init::Failed {
            reason: "CrossScopeRestore".into(),
            message: "snapshot s is of another scope".into(),
            refusal: None,
            permanent: true,
        };
        let pod = serving(PodState::Ready);
        served(
            &old,
            &mut st,
            &pod,
            refused,
            Stamp {
                generation: Some(3),
                now: t(0),
            },
        );
        let stalled = conditions::get(&st.conditions, STALLED).expect("stalled");
        assert_eq!(
            (stalled.status.as_str(), stalled.reason.as_str()),
            ("True", "CrossScopeRestore")
        );
        assert_eq!(stalled.observed_generation, Some(3));
        assert_eq!(reason(&st, READY), "CrossScopeRestore");
        // What a client reads: stalled for the generation it was judged on, not a later one.
        let mut sbx = sandbox(json!({}));
        sbx.metadata.generation = Some(3);
        sbx.status = Some(st.clone());
        assert!(sbx.stalled().is_some());
        sbx.metadata.generation = Some(4);
        assert!(
            sbx.stalled().is_none(),
            "a spec changed since is judged anew"
        );
        // The start goes through (the namespace consented): no longer stalled.
        let before = st.clone();
        served(
            &before,
            &mut st,
            &pod,
            ran(),
            Stamp {
                generation: Some(3),
                now: t(1),
            },
        );
        assert_eq!(st.phase, Some(SandboxPhase::Ready));
        assert!(conditions::get(&st.conditions, STALLED).is_none());
    }

    #[test]
    fn a_starting_pod_is_pending_even_where_the_status_said_ready_in_an_earlier_pod() {
        let old = SandboxStatus {
            phase: Some(SandboxPhase::Ready),
            ..Default::default()
        };
        let mut st = old.clone();
        conditions::set(&mut st.conditions, READY, true, "Ready", "x", None, t(0));
        conditions::set(
            &mut st.conditions,
            POD_READY,
            true,
            "PodRunning",
            "x",
            None,
            t(0),
        );
        let pod = serving(PodState::Starting);
        assert!(
            !pod.initialises(),
            "no exec before the kubelet reports it running"
        );
        let out = served(
            &old,
            &mut st,
            &pod,
            Init::Skipped,
            Stamp {
                generation: None,
                now: t(0),
            },
        );
        assert!(out.starting && out.retry.is_none());
        assert_eq!(st.phase, Some(SandboxPhase::Pending));
        assert_eq!(reason(&st, READY), "PodStarting");
        assert_eq!(reason(&st, POD_READY), "PodStarting");
        assert!(!conditions::is_true(&st.conditions, READY));
        assert!(!conditions::is_true(&st.conditions, POD_READY));
    }

    #[test]
    fn a_pod_problem_is_announced_once_per_reason() {
        let problem = PodState::Problem {
            reason: "ErrImagePull".into(),
            message: "no such image".into(),
        };
        let (old, mut st) = (SandboxStatus::default(), SandboxStatus::default());
        let out = served(
            &old,
            &mut st,
            &serving(problem.clone()),
            Init::Skipped,
            Stamp {
                generation: None,
                now: t(0),
            },
        );
        assert_eq!(out.problem.unwrap().reason, "ErrImagePull");
        assert_eq!(reason(&st, POD_READY), "ErrImagePull");
        let old = st.clone();
        let out = served(
            &old,
            &mut st,
            &serving(problem),
            Init::Skipped,
            Stamp {
                generation: None,
                now: t(1),
            },
        );
        assert_eq!(out.problem, None, "same reason again: no second Event");
        assert_eq!(old, st, "and no status change");
    }

    fn stuck(reason: &str, for_secs: u64) -> Serving {
        let problem = PodState::Problem {
            reason: reason.into(),
            message: format!("{reason} says why"),
        };
        Serving {
            problem_for: Some(Duration::from_secs(for_secs)),
            ..serving(problem)
        }
    }

    fn stalled_reason(st: &SandboxStatus) -> Option<String> {
        conditions::get(&st.conditions, STALLED)
            .filter(|c| c.status == "True")
            .map(|c| c.reason.clone())
    }

    #[test]
    fn a_problem_stalls_only_a_start_it_outlasts_the_grace_of_and_only_for_its_reasons() {
        let grace = Duration::from_secs(20);
        let secs = |s| Some(Duration::from_secs(s));
        assert_eq!(
            pod_stall("ErrImagePull", secs(5), grace),
            PodStall::In(Duration::from_secs(15))
        );
        assert_eq!(
            pod_stall("ImagePullBackOff", secs(20), grace),
            PodStall::Now
        );
        assert_eq!(pod_stall("Unschedulable", secs(90), grace), PodStall::Now);
        for reason in podstate::STALL_REASONS {
            assert_eq!(
                pod_stall(reason, secs(21), grace),
                PodStall::Now,
                "{reason}"
            );
        }
        // A crash loop or an exited container may be the command's own doing: not a stall.
        assert_eq!(
            pod_stall("CrashLoopBackOff", secs(600), grace),
            PodStall::Never
        );
        assert_eq!(
            pod_stall("ErrImagePull", None, grace),
            PodStall::Never,
            "no clock"
        );
        assert_eq!(
            pod_stall("ErrImagePull", secs(0), Duration::ZERO),
            PodStall::Now
        );
    }

    #[test]
    fn an_image_that_cannot_be_pulled_past_the_grace_stalls_the_start_with_the_kubelets_words() {
        let old = SandboxStatus::default();
        let mut st = old.clone();
        // Within the grace: Pending with the reason, and a look again when the grace ends.
        let out = served(
            &old,
            &mut st,
            &stuck("ErrImagePull", 5),
            Init::Skipped,
            Stamp {
                generation: Some(3),
                now: t(0),
            },
        );
        assert_eq!(stalled_reason(&st), None);
        assert_eq!(out.retry, Some(Duration::from_secs(15)));
        assert_eq!(
            out.problem.map(|n| n.reason).as_deref(),
            Some("ErrImagePull")
        );
        assert_eq!(reason(&st, READY), "ErrImagePull");
        // Past it: Stalled, with the reason and the kubelet's message, for this generation,
        // the Ready condition saying the same; announced once with a Warning.
        let before = st.clone();
        let out = served(
            &before,
            &mut st,
            &stuck("ImagePullBackOff", 21),
            Init::Skipped,
            Stamp {
                generation: Some(3),
                now: t(21),
            },
        );
        let c = conditions::get(&st.conditions, STALLED)
            .expect("stalled")
            .clone();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "ImagePullBackOff")
        );
        assert!(
            c.message.starts_with("ImagePullBackOff says why"),
            "{}",
            c.message
        );
        assert!(c.message.contains("20s"), "{}", c.message);
        assert_eq!(c.observed_generation, Some(3));
        assert_eq!(reason(&st, READY), "ImagePullBackOff");
        assert_eq!(st.phase, Some(SandboxPhase::Pending));
        assert_eq!(out.retry, None);
        let note = out.problem.expect("announced");
        assert_eq!(
            (note.type_, note.reason.as_str(), note.message.as_str()),
            (EventType::Warning, "ImagePullBackOff", c.message.as_str())
        );
        assert_eq!(
            note.action, "Stall",
            "not folded into the problem's own Events"
        );
        let mut sbx = sandbox(json!({}));
        sbx.status = Some(st.clone());
        assert!(sbx.stalled().is_some(), "what every client's wait ends on");
        // Still stuck, same reason: no write, no second Event.
        let before = st.clone();
        let out = served(
            &before,
            &mut st,
            &stuck("ImagePullBackOff", 60),
            Init::Skipped,
            Stamp {
                generation: Some(3),
                now: t(60),
            },
        );
        assert_eq!((before, out.problem), (st.clone(), None));
    }

    #[test]
    fn a_pod_stall_clears_when_the_pod_starts_after_all_and_a_refusal_stays() {
        let old = SandboxStatus::default();
        let mut st = old.clone();
        served(
            &old,
            &mut st,
            &stuck("Unschedulable", 30),
            Init::Skipped,
            Stamp {
                generation: Some(3),
                now: t(0),
            },
        );
        assert_eq!(stalled_reason(&st).as_deref(), Some("Unschedulable"));
        let before = st.clone();
        let out = served(
            &before,
            &mut st,
            &serving(PodState::Starting),
            Init::Skipped,
            Stamp {
                generation: Some(3),
                now: t(1),
            },
        );
        assert!(out.starting);
        assert_eq!(stalled_reason(&st), None, "scheduled: no longer stalled");
        served(
            &old,
            &mut st,
            &stuck("ErrImageNeverPull", 30),
            Init::Skipped,
            Stamp {
                generation: Some(3),
                now: t(2),
            },
        );
        let before = st.clone();
        served(
            &before,
            &mut st,
            &serving(PodState::Ready),
            ran(),
            Stamp {
                generation: Some(3),
                now: t(3),
            },
        );
        assert_eq!(
            (stalled_reason(&st), st.phase),
            (None, Some(SandboxPhase::Ready))
        );
        // Within the grace again (a new pod), and a problem that never stalls: cleared too.
        served(
            &old,
            &mut st,
            &stuck("InvalidImageName", 30),
            Init::Skipped,
            Stamp {
                generation: Some(3),
                now: t(4),
            },
        );
        served(
            &old,
            &mut st,
            &stuck("InvalidImageName", 1),
            Init::Skipped,
            Stamp {
                generation: Some(3),
                now: t(5),
            },
        );
        assert_eq!(stalled_reason(&st), None);
        served(
            &old,
            &mut st,
            &stuck("InvalidImageName", 30),
            Init::Skipped,
            Stamp {
                generation: Some(3),
                now: t(6),
            },
        );
        served(
            &old,
            &mut st,
            &stuck("CrashLoopBackOff", 300),
            Init::Skipped,
            Stamp {
                generation: Some(3),
                now: t(7),
            },
        );
        assert_eq!(stalled_reason(&st), None);
        // A start refused for its own reason is not the pod's to clear.
        let mut refused = SandboxStatus::default();
        conditions::set(
            &mut refused.conditions,
            STALLED,
            true,
            "CrossScopeRestore",
            "x",
            Some(3),
            t(0),
        );
        let before = refused.clone();
        served(
            &before,
            &mut refused,
            &serving(PodState::Starting),
            Init::Skipped,
            Stamp {
                generation: Some(3),
                now: t(1),
            },
        );
        assert_eq!(
            stalled_reason(&refused).as_deref(),
            Some("CrossScopeRestore")
        );
    }

    #[test]
    fn a_pod_stall_goes_with_the_pod_when_the_spec_changes_or_the_sandbox_is_suspended() {
        let mut w = world(Some(pod("sbx-uid")));
        conditions::set(
            &mut w.old.conditions,
            STALLED,
            true,
            "ErrImagePull",
            "x",
            Some(2),
            t(0),
        );
        w.desired_hash = Some("new-image".into());
        let plan = decide(&sandbox(json!({})), &w);
        assert_eq!(plan.step, Step::ReplacePod);
        assert_eq!(stalled_reason(&plan.status), None);
        let suspended = decide(&sandbox(json!({"lifecycle": {"mode": "Suspended"}})), &w);
        assert_eq!(stalled_reason(&suspended.status), None);
        // The serve step judges the pod it serves; nothing is cleared before it does.
        w.desired_hash = w.pod_hash.clone();
        let plan = decide(&sandbox(json!({})), &w);
        assert_eq!(plan.step, Step::Serve);
        assert_eq!(
            stalled_reason(&plan.status).as_deref(),
            Some("ErrImagePull")
        );
    }

    #[test]
    fn a_pod_made_for_a_sandbox_that_had_one_stops_it_saying_ready() {
        let old = SandboxStatus::default();
        let mut st = old.clone();
        assert!(
            !pod_created(
                &old,
                &mut st,
                "p",
                Stamp {
                    generation: None,
                    now: t(0)
                }
            ),
            "brand new: no write"
        );
        assert_eq!(st, old);
        let old = SandboxStatus {
            phase: Some(SandboxPhase::Ready),
            ..Default::default()
        };
        let mut st = old.clone();
        assert!(pod_created(
            &old,
            &mut st,
            "p",
            Stamp {
                generation: None,
                now: t(0)
            }
        ));
        assert_eq!(st.phase, Some(SandboxPhase::Pending));
        assert_eq!(st.pod_name.as_deref(), Some("p"));
        assert_eq!(
            st.workspace.and_then(|w| w.host_dir),
            None,
            "a cold pod's derived directory is not recorded"
        );
    }

    #[test]
    fn only_a_templated_sandboxs_first_start_may_claim_a_warm_pod() {
        let templated = sandbox(json!({"templateRef": {"name": "tpl"}}));
        assert!(may_claim(&templated, &SandboxStatus::default()));
        // Its first status came before a pod (a missing source held it): still the first.
        let held = SandboxStatus {
            phase: Some(SandboxPhase::Pending),
            ..Default::default()
        };
        assert!(may_claim(&templated, &held));
        assert!(
            !may_claim(&sandbox(json!({})), &SandboxStatus::default()),
            "no template, no pool"
        );
        let suspended = sandbox(json!({"templateRef": {"name": "tpl"},
            "lifecycle": {"mode": "Suspended"}}));
        assert!(!may_claim(&suspended, &SandboxStatus::default()));
        let with = |ws: WorkspaceStatus| SandboxStatus {
            workspace: Some(ws),
            ..Default::default()
        };
        // A resume: the directory is kept on its node.
        let kept = with(WorkspaceStatus {
            root_ready: true,
            host_dir: Some("/w/n/warm-abcde".into()),
            ..Default::default()
        });
        assert!(!may_claim(&templated, &kept));
        // After a node loss: branch B restores what was ready.
        let lost = with(WorkspaceStatus {
            root_ready: true,
            ..Default::default()
        });
        assert!(!may_claim(&templated, &lost));
        let pinned = SandboxStatus {
            node_name: Some("node-1".into()),
            ..Default::default()
        };
        assert!(!may_claim(&templated, &pinned));
    }

    #[test]
    fn a_held_pod_is_pending_with_a_warning() {
        let mut st = SandboxStatus {
            pod_name: Some("p".into()),
            ..Default::default()
        };
        let stamp = Stamp {
            generation: None,
            now: t(0),
        };
        let note = held(&mut st, "PodRejected", "refused", stamp);
        assert_eq!(st.pod_name, None);
        assert_eq!(st.phase, Some(SandboxPhase::Pending));
        assert_eq!((note.type_, note.action), (EventType::Warning, "CreatePod"));
    }

    #[test]
    fn the_guarded_condition_follows_the_lease() {
        let now = t(0);
        let lease = |holder: &str, renewed: i64| -> Lease {
            serde_json::from_value(json!({
                "metadata": {"name": "l"},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                    "acquireTime": t(-400).to_string(),
                    "renewTime": t(renewed).to_string()}
            }))
            .unwrap()
        };
        let read = |l: Option<&Lease>| guarded(&LeaseView::of(l, now));
        assert!(!read(None).1);
        let (g, held, reason, msg) = read(Some(&lease("harness-1", -10)));
        assert!(held);
        assert_eq!((reason, msg.as_str()), ("Held", "held by harness-1"));
        let g = g.unwrap();
        assert_eq!(g.holder.as_deref(), Some("harness-1"));
        assert_eq!(g.since.unwrap().0, t(-400));
        // Expired by the guard's own rule: duration plus the clock-skew allowance.
        let (_, held, _, _) = read(Some(&lease("harness-1", -16)));
        assert!(held, "within the skew allowance");
        let (g, held, reason, _) = read(Some(&lease("harness-1", -17)));
        assert!(!held && g.is_none());
        assert_eq!(reason, "Expired");
        let (_, held, reason, _) = read(Some(&lease("", -1)));
        assert!(!held);
        assert_eq!(reason, "Free");
    }

    #[test]
    fn a_new_sandbox_gets_no_status_while_its_pod_starts_briefly() {
        let young = Duration::from_millis(500);
        assert_eq!(
            defer_first_status(None, true, young),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(defer_first_status(None, true, FIRST_STATUS_GRACE), None);
        assert_eq!(
            defer_first_status(None, false, young),
            None,
            "problems show"
        );
        assert_eq!(
            defer_first_status(Some(SandboxPhase::Pending), true, young),
            None,
            "only the first status"
        );
    }
    #[test]
    fn a_claimed_pods_fresh_start_is_not_announced_and_every_other_start_is() {
        let with = |branch| SandboxStatus {
            workspace: Some(WorkspaceStatus {
                last_start_branch: Some(branch),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!announce_start(true, &with(StartBranch::Fresh)));
        assert!(announce_start(true, &with(StartBranch::Restored)));
        assert!(announce_start(false, &with(StartBranch::Fresh)));
        assert!(announce_start(false, &with(StartBranch::Restored)));
        assert!(announce_start(true, &SandboxStatus::default()));
    }
}
