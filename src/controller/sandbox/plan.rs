//! The sandbox controller's plan, pure: from what [`super::observe`] saw to a [`Plan`] (a
//! [`Step`] and the status it leads to), and the one decision a step asks of it on the way
//! ([`may_claim`]). The transitions a step's outcome leads to are [`super::status`]'s.
//! Nothing here reads or writes the API.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::events::EventType;

use super::idle;
use super::observe::World;
use super::service;
use super::status::{
    Lost, Transition, clear_pod_stall, clear_stall, invalid, not_ready, runtime_refused, serving,
    suspended, suspended_because,
};
use crate::controller::conditions::{self, GUARDED};
use crate::controller::context::Note;
use crate::controller::nodeloss::{self, NodeHealth};
use crate::controller::podstate::PodState;
use crate::controller::sizelimit;
use crate::controller::{placement, runtime};
use agentbox_api::crd::{GuardStatus, LifecycleMode, Sandbox, SandboxPhase, SandboxStatus};
use agentbox_api::guard::LeaseView;

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

impl Plan {
    /// The step, the status to write with its Event, and when to look again.
    pub fn into_parts(self) -> (Step, Transition, Option<Duration>) {
        let t = Transition {
            status: self.status,
            note: self.note,
        };
        (self.step, t, self.requeue)
    }
}

/// Whether this reconcile may be a first start from a template, which may claim a warm pod
/// (asked before the template is resolved: its pools' refills wait for it, `pool::quiet`).
pub fn may_be_first_claim(sbx: &Sandbox) -> bool {
    sbx.spec.template_ref.is_some() && placement::recorded_pod_name(sbx).is_none()
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    use crate::controller::conditions::{POD_READY, READY, STALLED};
    use crate::controller::sandbox::status::Stamp;
    use crate::controller::sandbox::status::tests::{pod, reason, sandbox, stalled_reason, t};
    use crate::controller::sandbox::status::{idle_suspended, over_limit_suspended, pod_created};
    use agentbox_api::crd::WorkspaceStatus;
    use agentbox_api::labels;
    use k8s_openapi::jiff::Timestamp;

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
    fn a_current_pod_of_ours_is_served() {
        let plan = decide(&sandbox(json!({})), &world(Some(pod("sbx-uid"))));
        assert_eq!(plan.step, Step::Serve);
        assert_eq!(plan.status.pod_name.as_deref(), Some("s-sandbox"));
        assert_eq!(plan.note, None);
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
}
