//! The status a served pod leads to, pure: PodReady, WorkspaceReady and Ready from the pod's
//! state and the workspace's initialisation, a pod problem's stall, the network gate, and
//! whether the first status and the start's Event are held back. Uses [`super::status`]'s
//! transitions and nothing else of the sandbox controller.

use std::time::Duration;

use kube::runtime::events::EventType;

use super::init_plan;
use super::status::{Stamp, clear_pod_stall, not_ready, pod_starting, set_false};
use crate::controller::conditions::{self, POD_READY, READY, STALLED, WORKSPACE_READY};
use crate::controller::context::Note;
use crate::controller::netcheck;
use crate::controller::podstate::{self, PodState};
use agentbox_api::crd::{
    RestoreRefusal, SandboxPhase, SandboxStatus, StartBranch, WorkspaceStatus,
};

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
        decision: init_plan::Decision,
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
    decision: &init_plan::Decision,
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
    use serde_json::json;

    use crate::controller::sandbox::status::tests::{reason, sandbox, stalled_reason, t};

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
            decision: init_plan::decide(init_plan::Observed {
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
