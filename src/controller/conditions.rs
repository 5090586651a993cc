//! Status conditions: set one, keeping its transition time when its status did not change.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Condition type: the pod runs and its container is ready.
pub const POD_READY: &str = "PodReady";
/// Condition type: the workspace is initialised for the current pod.
pub const WORKSPACE_READY: &str = "WorkspaceReady";
/// Condition type: the sandbox accepts commands.
pub const READY: &str = "Ready";
/// Condition type: who holds the scope's execution guard.
pub const GUARDED: &str = "Guarded";
/// Condition type (while deleting): the workspace directory was removed from its node.
pub const WORKSPACE_REMOVED: &str = "WorkspaceRemoved";

/// Condition type: the start cannot go on without a change (a permanent refusal).
pub const STALLED: &str = agentbox_api::crd::STALLED;

/// Removes condition `type_`, if present.
pub fn remove(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

/// Sets condition `type_` to `status` with `reason` and `message`. The transition time moves only
/// when the status changes, as the Kubernetes API conventions ask.
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" }.to_string();
    let message = message.into();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            if c.status != status {
                c.last_transition_time = Time(now);
            }
            c.status = status;
            c.reason = reason.to_string();
            c.message = message;
            c.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_string(),
            status,
            reason: reason.to_string(),
            message,
            observed_generation: generation,
            last_transition_time: Time(now),
        }),
    }
}

/// The condition of a type, if present.
pub fn get<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the condition of a type is True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    get(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let mut c = Vec::new();
        set(&mut c, READY, false, "PodStarting", "waiting", Some(1), t0);
        set(
            &mut c,
            READY,
            false,
            "ErrImagePull",
            "pull failed",
            Some(2),
            t1,
        );
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time, Time(t0));
        assert_eq!(c[0].reason, "ErrImagePull");
        assert_eq!(c[0].observed_generation, Some(2));
        set(&mut c, READY, true, "Ready", "ok", Some(2), t1);
        assert_eq!(c[0].last_transition_time, Time(t1));
        assert!(is_true(&c, READY));
        assert!(!is_true(&c, POD_READY));
    }
}
