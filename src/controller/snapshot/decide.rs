//! The snapshot controller's decision, pure: what to do with a snapshot given its phase, its
//! attempts, its sandbox and whether this process is uploading it; and which snapshots a
//! scope's retention removes.

use crate::controller::restore_source::Age;
use agentbox_api::crd::{Sandbox, SnapshotPhase};
use k8s_openapi::api::core::v1::Pod;

/// Attempts before an interrupted or failing snapshot is marked Failed.
pub const MAX_ATTEMPTS: i32 = 3;

/// What the referenced sandbox looks like to the snapshot controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SandboxState {
    /// `sandboxRef.name` is not an object name (the message says so); it is never looked up.
    InvalidReference(String),
    /// No such Sandbox.
    Missing,
    /// The sandbox exists but its workspace cannot be read now (why).
    NotReady(String),
    /// The sandbox is suspended or being deleted and no pod serves its workspace: none will
    /// until someone resumes it (why).
    Stopped(String),
    /// Its pod runs and its workspace was initialised in that pod.
    Ready,
    /// [`SandboxState::Ready`], under a runtime class (a sandboxed runtime such as gVisor,
    /// whose exec path is slow), with its workspace on a node where the helper can read it.
    ReadyOnNode(AtRest),
    /// It is suspended, no pod of its runs, and its initialised workspace lies on a known
    /// node where the helper can read it (the operator has a helper image and the sandbox no
    /// `spec.workspace.mounts`, which only its pod sees).
    AtRest(AtRest),
}

/// Where a suspended sandbox's workspace lies, for the helper to read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AtRest {
    /// The node.
    pub node: String,
    /// The workspace's host directory there.
    pub host_dir: String,
}

/// How a snapshot reads the workspace. Both feed the same pipeline (stall deadline, limits,
/// canonicaliser, upload) under the scope's guard; they differ in who writes the tar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reader {
    /// `tar -c` in the sandbox's own pod, by exec (`TAR_SCRIPT`): the sandbox's code writes
    /// the stream, the canonicaliser checks it. The path for a running sandbox under the
    /// node's default runtime (runc), where it was measured faster than the helper's, whose
    /// pod starts per snapshot (see [`helper_for_running`]).
    Exec,
    /// The helper's `archive` job in a pod on the workspace's node: nothing of the sandbox
    /// takes part, and no sandbox pod is needed. The path for a suspended sandbox, and for a
    /// running one under a runtime class (gVisor).
    Helper(AtRest),
}

/// Everything [`decide`] needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// Current phase (`None` for a new snapshot).
    pub phase: Option<SnapshotPhase>,
    /// Attempts made so far.
    pub attempts: i32,
    /// The sandbox.
    pub sandbox: SandboxState,
    /// This process is uploading it now.
    pub in_flight: bool,
    /// The operator has a store.
    pub store: bool,
}

/// Why a snapshot is not (yet) committed: the Committed condition's reason for what
/// [`decide`] sees (an attempt's own failure carries the snapshot module's reason).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotCommitted {
    /// The operator has no object store.
    NoStore,
    /// The last of [`MAX_ATTEMPTS`] attempts was interrupted.
    Interrupted,
    /// The last of [`MAX_ATTEMPTS`] attempts failed.
    TooManyAttempts,
    /// `sandboxRef.name` is not an object name.
    InvalidReference,
    /// The referenced Sandbox does not exist.
    SandboxNotFound,
    /// The referenced Sandbox's workspace cannot be read now (transient: waited for).
    SandboxNotReady,
    /// The referenced Sandbox is suspended (or being deleted) and no pod serves its workspace.
    SandboxStopped,
}

impl NotCommitted {
    /// The CamelCase reason of the condition.
    pub fn as_str(self) -> &'static str {
        match self {
            NotCommitted::NoStore => "NoStore",
            NotCommitted::Interrupted => "Interrupted",
            NotCommitted::TooManyAttempts => "TooManyAttempts",
            NotCommitted::InvalidReference => "InvalidReference",
            NotCommitted::SandboxNotFound => "SandboxNotFound",
            NotCommitted::SandboxNotReady => "SandboxNotReady",
            NotCommitted::SandboxStopped => "SandboxStopped",
        }
    }

    /// Whether the snapshot fails for good (else it waits and is looked at again).
    pub fn is_permanent(self) -> bool {
        self != NotCommitted::SandboxNotReady
    }
}

/// What to do with a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Ready or Failed already, or being uploaded by this process: nothing to do.
    Done,
    /// Mark Failed with this (permanent) reason and message.
    Fail(NotCommitted, String),
    /// Stay Pending with this (transient) reason and message; look again later.
    Wait(NotCommitted, String),
    /// Take the snapshot now; `clean_first` when an interrupted attempt left objects behind.
    Take {
        /// Remove the objects of an interrupted attempt first.
        clean_first: bool,
        /// How to read the workspace.
        reader: Reader,
    },
}

/// Where the suspended sandbox `sbx` (no pod of its runs) keeps an initialised workspace
/// the helper can read, or why it cannot be read without its pod (pure). `helper`: the
/// operator has a helper image.
pub fn at_rest(sbx: &Sandbox, helper: bool, node_root: &str) -> Result<AtRest, &'static str> {
    let st = sbx.status.clone().unwrap_or_default();
    if !helper {
        return Err(
            "the sandbox is suspended and no pod serves its workspace, and this operator has no \
             helper image (--helper-image) to read it on its node: take snapshots before \
             suspending (under the scope's guard, see spec.guard), or resume it first",
        );
    }
    if !sbx.spec.workspace.mounts.is_empty() {
        return Err(
            "the sandbox is suspended and has spec.workspace.mounts, which only its pod sees: \
             take snapshots before suspending (under the scope's guard, see spec.guard), or \
             resume it first",
        );
    }
    let ready = st.workspace.as_ref().is_some_and(|w| w.root_ready);
    match st.node_name.filter(|n| !n.is_empty()) {
        Some(node) if ready => Ok(AtRest {
            node,
            host_dir: crate::controller::placement::host_dir(sbx, node_root),
        }),
        _ => Err("the sandbox is suspended and its workspace was never initialised on a node"),
    }
}

/// Where the helper can read the workspace of `sbx`, whose pod `pod` runs and serves it, when
/// reading it there is the better path (pure): the pod runs under a runtime class, the
/// operator has a helper image and the sandbox no `spec.workspace.mounts`. Under gVisor the
/// exec path's `tar -c` of 20,000 small files took 20.4 s and the helper path 2.4 s (its pod
/// start included, docs/benchmarks.md); under the node's default runtime (runc) exec took
/// 1.9 s and the helper 2.6 s, so runc keeps exec (`None`).
pub fn helper_for_running(
    sbx: &Sandbox,
    pod: &Pod,
    helper: bool,
    node_root: &str,
) -> Option<AtRest> {
    let spec = pod.spec.as_ref()?;
    spec.runtime_class_name.as_ref()?;
    if !helper || !sbx.spec.workspace.mounts.is_empty() {
        return None;
    }
    Some(AtRest {
        node: spec.node_name.clone().filter(|n| !n.is_empty())?,
        host_dir: crate::controller::placement::host_dir_with(sbx, Some(pod), node_root),
    })
}

/// Decides what to do with a snapshot (pure).
pub fn decide(o: &Observed) -> Plan {
    match o.phase {
        Some(SnapshotPhase::Ready | SnapshotPhase::Failed) => return Plan::Done,
        Some(SnapshotPhase::Running) if o.in_flight => return Plan::Done,
        _ => {}
    }
    if !o.store {
        return Plan::Fail(
            NotCommitted::NoStore,
            "this operator has no object store configured (--store-url)".into(),
        );
    }
    let interrupted = o.phase == Some(SnapshotPhase::Running);
    if o.attempts >= MAX_ATTEMPTS {
        let why = if interrupted {
            "the last attempt was interrupted"
        } else {
            "the last attempt failed"
        };
        return Plan::Fail(
            if interrupted {
                NotCommitted::Interrupted
            } else {
                NotCommitted::TooManyAttempts
            },
            format!("gave up after {} attempts; {why}", o.attempts),
        );
    }
    let (reason, message) = match &o.sandbox {
        SandboxState::InvalidReference(m) => (NotCommitted::InvalidReference, m.clone()),
        SandboxState::Missing => (
            NotCommitted::SandboxNotFound,
            "the referenced Sandbox does not exist".into(),
        ),
        SandboxState::NotReady(why) => (NotCommitted::SandboxNotReady, why.clone()),
        SandboxState::Stopped(why) => (NotCommitted::SandboxStopped, why.clone()),
        SandboxState::Ready => {
            return Plan::Take {
                clean_first: interrupted,
                reader: Reader::Exec,
            };
        }
        SandboxState::AtRest(at) | SandboxState::ReadyOnNode(at) => {
            return Plan::Take {
                clean_first: interrupted,
                reader: Reader::Helper(at.clone()),
            };
        }
    };
    if reason.is_permanent() {
        Plan::Fail(reason, message)
    } else {
        Plan::Wait(reason, message)
    }
}

/// Keeps the newest `keep` Ready snapshots (by [`Age`]) and returns the names of the others,
/// oldest first (pure).
pub fn retention_victims(ready: &[Age], keep: usize) -> Vec<String> {
    let mut v: Vec<&Age> = ready.iter().collect();
    v.sort_by(|a, b| b.cmp(a));
    let mut out: Vec<String> = v
        .into_iter()
        .skip(keep)
        .map(|(_, _, n)| n.clone())
        .collect();
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn obs(
        phase: Option<SnapshotPhase>,
        attempts: i32,
        sandbox: SandboxState,
        in_flight: bool,
    ) -> Plan {
        decide(&Observed {
            phase,
            attempts,
            sandbox,
            in_flight,
            store: true,
        })
    }

    #[test]
    fn a_new_snapshot_of_a_ready_sandbox_is_taken() {
        assert_eq!(
            obs(None, 0, SandboxState::Ready, false),
            Plan::Take {
                clean_first: false,
                reader: Reader::Exec
            }
        );
        assert_eq!(
            obs(Some(SnapshotPhase::Pending), 1, SandboxState::Ready, false),
            Plan::Take {
                clean_first: false,
                reader: Reader::Exec
            }
        );
    }

    #[test]
    fn a_suspended_sandbox_at_rest_is_read_by_the_helper_a_running_one_by_exec() {
        let at = AtRest {
            node: "node-a".into(),
            host_dir: "/w/team/uid".into(),
        };
        assert_eq!(
            obs(None, 0, SandboxState::AtRest(at.clone()), false),
            Plan::Take {
                clean_first: false,
                reader: Reader::Helper(at.clone())
            }
        );
        assert_eq!(
            obs(
                Some(SnapshotPhase::Running),
                1,
                SandboxState::AtRest(at.clone()),
                false
            ),
            Plan::Take {
                clean_first: true,
                reader: Reader::Helper(at)
            }
        );
        assert!(matches!(
            obs(None, 0, SandboxState::Ready, false),
            Plan::Take {
                reader: Reader::Exec,
                ..
            }
        ));
    }

    #[test]
    fn a_suspended_workspace_is_at_rest_only_where_the_helper_can_read_all_of_it() {
        use crate::controller::pod::tests::sandbox;
        let mut sbx = sandbox(serde_json::json!({"lifecycle": {"mode": "Suspended"}}));
        assert!(at_rest(&sbx, true, "/w").is_err(), "never initialised");
        sbx.status = Some(
            serde_json::from_value(serde_json::json!({
                "nodeName": "node-a",
                "workspace": {"rootReady": true}
            }))
            .unwrap(),
        );
        assert_eq!(
            at_rest(&sbx, true, "/w"),
            Ok(AtRest {
                node: "node-a".into(),
                host_dir: "/w/team/1234-uid".into()
            })
        );
        let no_helper = at_rest(&sbx, false, "/w").unwrap_err();
        assert!(no_helper.contains("--helper-image"), "{no_helper}");
        let mut mounted = sbx.clone();
        mounted.spec.workspace.mounts = serde_json::from_value(serde_json::json!([
            {"path": "data", "hostPath": "/srv/data"}
        ]))
        .unwrap();
        let why = at_rest(&mounted, true, "/w").unwrap_err();
        assert!(why.contains("spec.workspace.mounts"), "{why}");
    }

    #[test]
    fn a_running_sandbox_is_read_by_the_helper_only_under_a_runtime_class() {
        use crate::controller::pod::tests::sandbox;
        let sbx = sandbox(serde_json::json!({}));
        let pod = |rc: Option<&str>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "sbx-demo"},
                "spec": {"nodeName": "node-a", "runtimeClassName": rc, "containers": []}
            }))
            .unwrap()
        };
        assert_eq!(
            helper_for_running(&sbx, &pod(Some("gvisor")), true, "/w"),
            Some(AtRest {
                node: "node-a".into(),
                host_dir: "/w/team/1234-uid".into()
            })
        );
        assert_eq!(
            helper_for_running(&sbx, &pod(None), true, "/w"),
            None,
            "runc: exec"
        );
        assert_eq!(
            helper_for_running(&sbx, &pod(Some("gvisor")), false, "/w"),
            None
        );
        let mut mounted = sbx.clone();
        mounted.spec.workspace.mounts = serde_json::from_value(serde_json::json!([
            {"path": "data", "hostPath": "/srv/data"}
        ]))
        .unwrap();
        assert_eq!(
            helper_for_running(&mounted, &pod(Some("gvisor")), true, "/w"),
            None
        );
        assert!(matches!(
            obs(
                None,
                0,
                SandboxState::ReadyOnNode(AtRest {
                    node: "n".into(),
                    host_dir: "/d".into()
                }),
                false
            ),
            Plan::Take {
                reader: Reader::Helper(_),
                ..
            }
        ));
    }

    #[test]
    fn finished_or_in_flight_snapshots_are_left_alone() {
        for p in [SnapshotPhase::Ready, SnapshotPhase::Failed] {
            assert_eq!(obs(Some(p), 1, SandboxState::Missing, false), Plan::Done);
        }
        assert_eq!(
            obs(Some(SnapshotPhase::Running), 1, SandboxState::Ready, true),
            Plan::Done
        );
    }

    #[test]
    fn an_interrupted_snapshot_is_cleaned_and_retaken_then_given_up() {
        assert_eq!(
            obs(Some(SnapshotPhase::Running), 1, SandboxState::Ready, false),
            Plan::Take {
                clean_first: true,
                reader: Reader::Exec
            }
        );
        let p = obs(
            Some(SnapshotPhase::Running),
            MAX_ATTEMPTS,
            SandboxState::Ready,
            false,
        );
        assert!(
            matches!(p, Plan::Fail(NotCommitted::Interrupted, _)),
            "{p:?}"
        );
        let p = obs(
            Some(SnapshotPhase::Pending),
            MAX_ATTEMPTS,
            SandboxState::Ready,
            false,
        );
        assert!(
            matches!(p, Plan::Fail(NotCommitted::TooManyAttempts, _)),
            "{p:?}"
        );
    }

    #[test]
    fn sandbox_states_and_store() {
        assert!(matches!(
            obs(None, 0, SandboxState::Missing, false),
            Plan::Fail(NotCommitted::SandboxNotFound, _)
        ));
        assert!(matches!(
            obs(None, 0, SandboxState::InvalidReference("bad".into()), false),
            Plan::Fail(NotCommitted::InvalidReference, m) if m == "bad"
        ));
        assert!(matches!(
            obs(None, 0, SandboxState::NotReady("x".into()), false),
            Plan::Wait(NotCommitted::SandboxNotReady, _)
        ));
        // Never Pending for a pod that will not come: failed at once, with its reason.
        assert!(matches!(
            obs(Some(SnapshotPhase::Pending), 1, SandboxState::Stopped("s".into()), false),
            Plan::Fail(NotCommitted::SandboxStopped, m) if m == "s"
        ));
        let no_store = decide(&Observed {
            phase: None,
            attempts: 0,
            sandbox: SandboxState::Ready,
            in_flight: false,
            store: false,
        });
        assert!(matches!(no_store, Plan::Fail(NotCommitted::NoStore, _)));
    }

    #[test]
    fn only_a_sandbox_not_ready_yet_is_waited_for() {
        assert!(!NotCommitted::SandboxNotReady.is_permanent());
        for r in [
            NotCommitted::NoStore,
            NotCommitted::Interrupted,
            NotCommitted::TooManyAttempts,
            NotCommitted::InvalidReference,
            NotCommitted::SandboxNotFound,
            NotCommitted::SandboxStopped,
        ] {
            assert!(r.is_permanent(), "{r:?}");
            assert!(!r.as_str().is_empty());
        }
    }

    #[test]
    fn retention_keeps_the_newest() {
        let t = |s: i64| Some(Timestamp::from_second(s).unwrap());
        let ready = vec![
            (t(30), 3, "c".to_string()),
            (t(10), 1, "a".to_string()),
            (t(20), 2, "b".to_string()),
            (t(40), 4, "d".to_string()),
        ];
        assert_eq!(retention_victims(&ready, 2), vec!["a", "b"]);
        assert_eq!(retention_victims(&ready, 4), Vec::<String>::new());
        assert_eq!(retention_victims(&ready, 1), vec!["a", "b", "c"]);
        // Within one second the fencing token decides, not the name.
        let same = vec![
            (t(50), 7, "z-old".to_string()),
            (t(50), 8, "a-new".to_string()),
        ];
        assert_eq!(retention_victims(&same, 1), vec!["z-old"]);
    }
}
