//! What a sandbox pod is doing, read from its status: shared by the sandbox controller (which
//! starts and serves the pod) and the snapshot controller (which reads the workspace through
//! it), so neither imports the other.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

use super::pod::CONTAINER;
use agentbox_api::crd::SandboxStatus;

/// What the sandbox pod is doing, as far as the sandbox cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// Running, its container running and ready, as the kubelet reports it: the only state
    /// in which a sandbox is initialised and Ready.
    Ready,
    /// On its way: scheduling, pulling, creating.
    Starting,
    /// Stuck in a way a user should see (image pull errors, crash loops, unschedulable).
    Problem {
        /// Kubernetes' reason.
        reason: String,
        /// Kubernetes' message.
        message: String,
    },
    /// Terminal: Succeeded or Failed (evicted, for example); a new pod is needed.
    Ended(String),
}

/// How long ago the pod was created.
pub fn pod_age(pod: &Pod, now: Timestamp) -> Duration {
    let ms = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| now.as_millisecond().saturating_sub(t.0.as_millisecond()))
        .unwrap_or(0);
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// Reads a pod's status into a [`PodState`].
pub fn observe_pod(pod: &Pod) -> PodState {
    let Some(status) = pod.status.as_ref() else {
        return PodState::Starting;
    };
    if let Some(phase @ ("Succeeded" | "Failed")) = status.phase.as_deref() {
        return PodState::Ended(status.reason.clone().unwrap_or_else(|| phase.to_string()));
    }
    let container = status
        .container_statuses
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.name == CONTAINER));
    if let Some(c) = container {
        let running = c.state.as_ref().is_some_and(|s| s.running.is_some());
        // The pod's phase with it: what `kubectl get pods` shows a harness as Running.
        if running && c.ready && status.phase.as_deref() == Some("Running") {
            return PodState::Ready;
        }
        if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            let reason = w.reason.clone().unwrap_or_default();
            if reason == "PodInitializing"
                && let Some(problem) = init_problem(status)
            {
                return problem;
            }
            if matches!(
                reason.as_str(),
                "" | "ContainerCreating" | "PodInitializing"
            ) {
                return PodState::Starting;
            }
            return PodState::Problem {
                message: w.message.clone().unwrap_or_else(|| reason.clone()),
                reason,
            };
        }
        if let Some(t) = c.state.as_ref().and_then(|s| s.terminated.as_ref()) {
            let reason = t.reason.clone().unwrap_or_else(|| "ContainerExited".into());
            let message = if reason == agentbox_api::oom::OOM_KILLED {
                format!(
                    "the sandbox container was killed for memory (OOMKilled, exit code {}): it reached its memory limit",
                    t.exit_code
                )
            } else {
                format!("the sandbox container exited with code {}", t.exit_code)
            };
            return PodState::Problem { message, reason };
        }
        return PodState::Starting;
    }
    let unschedulable = status.conditions.as_ref().and_then(|cs| {
        cs.iter().find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
    });
    match unschedulable {
        Some(c) => PodState::Problem {
            reason: "Unschedulable".into(),
            message: c
                .message
                .clone()
                .unwrap_or_else(|| "no node can run the pod".into()),
        },
        None => PodState::Starting,
    }
}

/// The problem of an init container (the trusted helper's: the process limit, the workspace's
/// owner) that failed or cannot be created: reason [`INIT_FAILED`], the container's name and
/// what it said. The kubelet retries it, but what failed it (a cgroup that is not there, a
/// directory the helper refuses) rarely passes by itself.
fn init_problem(status: &k8s_openapi::api::core::v1::PodStatus) -> Option<PodState> {
    status
        .init_container_statuses
        .iter()
        .flatten()
        .find_map(|c| {
            let state = c.state.as_ref()?;
            let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
            let said = |t: &k8s_openapi::api::core::v1::ContainerStateTerminated| {
                format!(
                    "init container {} exited with code {}: {}",
                    c.name,
                    t.exit_code,
                    t.message.as_deref().unwrap_or("").trim()
                )
            };
            let message = match (&state.terminated, &state.waiting) {
                (Some(t), _) if t.exit_code != 0 => said(t),
                (_, Some(w)) => match w.reason.as_deref().unwrap_or("") {
                    "" | "PodInitializing" | "ContainerCreating" => return None,
                    _ => match last {
                        Some(t) if t.exit_code != 0 => said(t),
                        _ => format!(
                            "init container {}: {}: {}",
                            c.name,
                            w.reason.as_deref().unwrap_or(""),
                            w.message.as_deref().unwrap_or("")
                        ),
                    },
                },
                _ => return None,
            };
            Some(PodState::Problem {
                reason: INIT_FAILED.into(),
                message,
            })
        })
}

/// Reason of a pod problem: an init container failed or cannot be created.
pub const INIT_FAILED: &str = "InitContainerFailed";

/// The pod problems that stall a start once they outlast the operator's stall grace: the
/// image cannot be pulled (or must not be), the container's configuration names something
/// that is not there, or no node can take the pod. Each may still pass by itself (the kubelet
/// and the scheduler keep trying), but rarely within the minutes a harness would otherwise
/// wait, so a waiting client is told soon instead; `Stalled` clears if the pod runs after all.
pub const STALL_REASONS: [&str; 7] = [
    INIT_FAILED,
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
    "Unschedulable",
];

/// Whether a pod problem of `reason` stalls the start once it outlasts the grace.
pub fn stalls(reason: &str) -> bool {
    STALL_REASONS.contains(&reason)
}

/// Since when the pod has been in its problem of `reason`, as far as its status tells (the
/// kubelet gives a waiting container no timestamp of its own): for `Unschedulable` since the
/// scheduler said so (its `PodScheduled` condition), for a container since the latest of the
/// pod's creation, its scheduling and its container last stopping being ready. `None`: no
/// timestamp at all.
pub fn problem_since(pod: &Pod, reason: &str) -> Option<Timestamp> {
    let conditions = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let changed = |type_: &str, status: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .and_then(|c| c.last_transition_time.as_ref())
            .map(|t| t.0)
    };
    let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    if reason == "Unschedulable" {
        return changed("PodScheduled", "False").or(created);
    }
    [
        created,
        changed("PodScheduled", "True"),
        changed("ContainersReady", "False"),
    ]
    .into_iter()
    .flatten()
    .max()
}

/// Whether the sandbox's workspace was initialised in `pod`, the current pod (status records
/// the UID of the pod it was initialised in; a new pod must be initialised again).
pub fn initialised_in(st: &SandboxStatus, pod: &Pod) -> bool {
    st.workspace
        .as_ref()
        .and_then(|w| w.initialized_pod_uid.as_deref())
        .is_some_and(|u| Some(u) == pod.metadata.uid.as_deref())
}

/// Whether `pod` serves the sandbox's workspace, so a snapshot can read it: initialised in this
/// pod and not going. Starting counts: an operator before issue 42 served a sandbox (and made
/// it Ready) as soon as its container answered exec, before the kubelet reported it running;
/// this one initialises a workspace only in a pod the kubelet reports running and ready.
pub fn serves_workspace(st: &SandboxStatus, pod: &Pod) -> bool {
    matches!(observe_pod(pod), PodState::Ready | PodState::Starting)
        && pod.metadata.deletion_timestamp.is_none()
        && initialised_in(st, pod)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_failed_init_container_is_a_problem_that_stalls() {
        let with_init = |init: serde_json::Value| {
            pod(serde_json::json!({"phase": "Pending",
                "initContainerStatuses": [init],
                "containerStatuses": [{
                    "name": "sandbox", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                    "state": {"waiting": {"reason": "PodInitializing"}}}]}))
        };
        let init = |state: serde_json::Value, last: serde_json::Value| {
            serde_json::json!({"name": "limit-processes", "ready": false, "restartCount": 1,
                "image": "h", "imageID": "", "state": state, "lastState": last})
        };
        let looping = with_init(init(
            serde_json::json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}),
            serde_json::json!({"terminated": {"exitCode": 1, "message": "agentbox-helper: no process"}}),
        ));
        match observe_pod(&looping) {
            PodState::Problem { reason, message } => {
                assert_eq!(reason, INIT_FAILED);
                assert!(stalls(&reason));
                assert!(
                    message.contains(
                        "limit-processes exited with code 1: agentbox-helper: no process"
                    ),
                    "{message}"
                );
            }
            other => panic!("{other:?}"),
        }
        let config = with_init(init(
            serde_json::json!({"waiting": {"reason": "CreateContainerConfigError", "message": "subPath"}}),
            serde_json::json!({}),
        ));
        assert!(
            matches!(observe_pod(&config), PodState::Problem { message, .. } if message.contains("subPath"))
        );
        let running = with_init(init(
            serde_json::json!({"running": {}}),
            serde_json::json!({}),
        ));
        assert_eq!(observe_pod(&running), PodState::Starting);
        let done = with_init(init(
            serde_json::json!({"terminated": {"exitCode": 0}}),
            serde_json::json!({}),
        ));
        assert_eq!(observe_pod(&done), PodState::Starting);
    }

    #[test]
    fn pod_states() {
        assert_eq!(observe_pod(&pod(serde_json::json!({}))), PodState::Starting);
        let ready = pod(
            serde_json::json!({"phase": "Running", "containerStatuses": [{
            "name": "sandbox", "ready": true, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}),
        );
        assert_eq!(observe_pod(&ready), PodState::Ready);
        let mut reported_pending = ready.clone();
        if let Some(st) = reported_pending.status.as_mut() {
            st.phase = Some("Pending".into());
        }
        assert_eq!(
            observe_pod(&reported_pending),
            PodState::Starting,
            "Ready only with the pod's phase Running too"
        );
        let creating = pod(
            serde_json::json!({"phase": "Pending", "containerStatuses": [{
            "name": "sandbox", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
        );
        assert_eq!(observe_pod(&creating), PodState::Starting);
        let pull = pod(
            serde_json::json!({"phase": "Pending", "containerStatuses": [{
            "name": "sandbox", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "image not present"}}}]}),
        );
        assert_eq!(
            observe_pod(&pull),
            PodState::Problem {
                reason: "ErrImageNeverPull".into(),
                message: "image not present".into()
            }
        );
        let unsched = pod(serde_json::json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}]}));
        assert_eq!(
            observe_pod(&unsched),
            PodState::Problem {
                reason: "Unschedulable".into(),
                message: "0/1 nodes".into()
            }
        );
        let evicted = pod(serde_json::json!({"phase": "Failed", "reason": "Evicted"}));
        assert_eq!(observe_pod(&evicted), PodState::Ended("Evicted".into()));
    }

    #[test]
    fn a_problem_is_dated_from_the_pods_own_timestamps() {
        let at = |s: &str| s.parse::<Timestamp>().unwrap();
        let mut p = pod(serde_json::json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "True",
                "lastTransitionTime": "2026-01-01T00:00:02Z"},
            {"type": "ContainersReady", "status": "False",
                "lastTransitionTime": "2026-01-01T00:00:03Z"}]}));
        p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            at("2026-01-01T00:00:00Z"),
        ));
        // A container's problem: from when its container last stopped being ready.
        assert_eq!(
            problem_since(&p, "ErrImagePull"),
            Some(at("2026-01-01T00:00:03Z"))
        );
        let unsched = pod(serde_json::json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "lastTransitionTime": "2026-01-01T00:00:01Z"}]}));
        assert_eq!(
            problem_since(&unsched, "Unschedulable"),
            Some(at("2026-01-01T00:00:01Z"))
        );
        // Without conditions: from the pod's creation; without any timestamp: unknown.
        let mut bare = pod(serde_json::json!({"phase": "Pending"}));
        assert_eq!(problem_since(&bare, "ImagePullBackOff"), None);
        bare.metadata.creation_timestamp = p.metadata.creation_timestamp.clone();
        assert_eq!(
            problem_since(&bare, "ImagePullBackOff"),
            Some(at("2026-01-01T00:00:00Z"))
        );
        assert!(stalls("CreateContainerConfigError") && !stalls("CrashLoopBackOff"));
    }

    #[test]
    fn the_workspace_counts_as_initialised_only_in_the_pod_it_was_initialised_in() {
        let mut p = pod(serde_json::json!({}));
        p.metadata.uid = Some("pod-1".into());
        let st = |uid: Option<&str>| SandboxStatus {
            workspace: Some(agentbox_api::crd::WorkspaceStatus {
                initialized_pod_uid: uid.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(initialised_in(&st(Some("pod-1")), &p));
        assert!(!initialised_in(&st(Some("pod-0")), &p), "an earlier pod");
        assert!(!initialised_in(&st(None), &p), "never initialised");
        assert!(!initialised_in(&SandboxStatus::default(), &p));
        p.metadata.uid = None;
        assert!(!initialised_in(&st(None), &p), "no UID matches nothing");
    }

    #[test]
    fn a_workspace_initialised_through_an_early_exec_is_served_before_the_kubelet_says_running() {
        let st = SandboxStatus {
            workspace: Some(agentbox_api::crd::WorkspaceStatus {
                initialized_pod_uid: Some("pod-1".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let with = |status: serde_json::Value| {
            let mut p = pod(status);
            p.metadata.uid = Some("pod-1".into());
            p
        };
        let creating = with(
            serde_json::json!({"phase": "Pending", "containerStatuses": [{
            "name": CONTAINER, "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
        );
        assert!(
            serves_workspace(&st, &creating),
            "Ready through exec, kubelet behind"
        );
        let running = with(
            serde_json::json!({"phase": "Running", "containerStatuses": [{
            "name": CONTAINER, "ready": true, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"running": {}}}]}),
        );
        assert!(serves_workspace(&st, &running));
        let mut going = running.clone();
        going.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
        );
        assert!(!serves_workspace(&st, &going), "a terminating pod");
        let ended = with(serde_json::json!({"phase": "Failed", "reason": "Evicted"}));
        assert!(!serves_workspace(&st, &ended));
        let mut other = running;
        other.metadata.uid = Some("pod-2".into());
        assert!(
            !serves_workspace(&st, &other),
            "not initialised in this pod"
        );
    }
}
