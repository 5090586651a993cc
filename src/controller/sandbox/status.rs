//! The status transitions of the sandbox controller, pure: what the status becomes after what
//! a step's I/O found (a pod held or made, a node lost, a suspension, a template missing).
//! The plan ([`super::plan`]) starts from them too; the serve step's own are
//! [`super::readiness`]'s. A leaf: of the sandbox controller it uses only two leaves, `idle`
//! and `service`'s endpoints; no step, and not the plan.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::idle;
use super::service;
use crate::controller::conditions::{self, POD_READY, READY, STALLED, WORKSPACE_READY};
use crate::controller::context::Note;
use crate::controller::podstate;
use crate::controller::sizelimit;
use crate::controller::{placement, runtime};
use agentbox_api::crd::{
    AbandonedWorkspace, NodeLoss, Sandbox, SandboxPhase, SandboxStatus, TemplateUse,
};
use agentbox_api::labels;

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

/// A status to write with the Event that says why.
pub struct Transition {
    /// The status after the step.
    pub status: SandboxStatus,
    /// The Event that goes with it.
    pub note: Option<Note>,
}

/// What a condition written now is stamped with: the generation it was decided for, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The Sandbox's `metadata.generation`.
    pub generation: Option<i64>,
    /// Now.
    pub now: Timestamp,
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

/// No pod, and no pod wanted: `phase`, with PodReady and Ready False for `reason` with their
/// messages (in the order given).
pub(super) fn no_pod(
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
pub(super) fn set_false(
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
pub(super) fn invalid(
    st: &mut SandboxStatus,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
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
pub(super) fn runtime_refused(
    st: &mut SandboxStatus,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
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
pub(super) fn suspended(
    st: &mut SandboxStatus,
    generation: Option<i64>,
    now: Timestamp,
    idle: Option<&str>,
) {
    let why = idle.map(|message| (idle::REASON, message));
    suspended_because(st, generation, now, why);
}

/// [`suspended`] with the reason and message of an operator's suspension (`None`: the
/// spec's).
pub(super) fn suspended_because(
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
    let message = crate::controller::effective::missing_message(name);
    let stamp = Stamp {
        generation: sbx.metadata.generation,
        now,
    };
    let note = held(
        &mut st,
        crate::controller::effective::NOT_FOUND,
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
pub(super) fn is_derived(sbx: &Sandbox, dir: &str) -> bool {
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
pub(super) fn pod_starting(st: &mut SandboxStatus, generation: Option<i64>, now: Timestamp) {
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
pub(super) fn not_ready(
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

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    pub(crate) fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    pub(crate) fn sandbox(spec: serde_json::Value) -> Sandbox {
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

    pub(crate) fn pod(owner: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "s-sandbox", "uid": "pod-uid",
                "ownerReferences": [{"apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
                    "name": "s", "uid": owner, "controller": true}]},
        }))
        .unwrap()
    }

    pub(crate) fn reason(st: &SandboxStatus, type_: &str) -> String {
        conditions::get(&st.conditions, type_)
            .map(|c| c.reason.clone())
            .unwrap_or_default()
    }

    pub(crate) fn stalled_reason(st: &SandboxStatus) -> Option<String> {
        conditions::get(&st.conditions, STALLED)
            .filter(|c| c.status == "True")
            .map(|c| c.reason.clone())
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
}
