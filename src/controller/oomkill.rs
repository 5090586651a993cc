//! A sandbox's container killed for memory, from the pod status the operator already watches:
//! the kubelet's `OOMKilled` termination (in the container's state while it is down, in its
//! last state once restarted). Pure: what the kill was, and whether it is one not announced
//! yet (`status.lastOOMKill` holds the last one, so an operator restart does not announce it
//! again).

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};

use super::pod::CONTAINER;
use agentbox_api::crd::OomKill;
use agentbox_api::oom::OOM_KILLED;

/// Reason of the Warning Event published once per kill.
pub const REASON: &str = OOM_KILLED;

/// The newest kill for memory of the sandbox container that `pod`'s status records, if any.
pub fn observed(pod: &Pod) -> Option<OomKill> {
    let uid = pod.metadata.uid.clone()?;
    let c = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == CONTAINER)?;
    let oom = |t: &&ContainerStateTerminated| t.reason.as_deref() == Some(OOM_KILLED);
    // The current state first: a container that is down now was killed after its last state.
    let t = c
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .filter(oom)
        .or_else(|| {
            c.last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .filter(oom)
        })?;
    let limit = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|k| k.name == CONTAINER))
        .and_then(|k| k.resources.as_ref())
        .and_then(|r| r.limits.as_ref())
        .and_then(|l| l.get("memory"))
        .map(|q| q.0.clone());
    Some(OomKill {
        at: t.finished_at.clone(),
        pod_uid: uid,
        restart_count: c.restart_count,
        limit,
    })
}

/// Whether `seen` is a kill not announced yet: `last` is the one the status recorded. One
/// kill shows first in the container's state (restart count N) and then, restarted, in its
/// last state (N+1): the pod and the time it ended say which kill it is; the restart count
/// tells kills apart only where the kubelet gave no time.
pub fn is_new(last: Option<&OomKill>, seen: &OomKill) -> bool {
    match last {
        None => true,
        Some(l) if l.pod_uid != seen.pod_uid => true,
        Some(l) => match (&l.at, &seen.at) {
            (Some(a), Some(b)) => a.0 < b.0,
            _ => l.restart_count < seen.restart_count,
        },
    }
}

/// The Event's message: what happened, the limit, and, for a pod under a RuntimeClass (gVisor,
/// Kata), that the runtime's own memory counts against the limit too.
pub fn message(kill: &OomKill, runtime_class: Option<&str>) -> String {
    let limit = kill
        .limit
        .as_deref()
        .map_or("its memory limit".to_string(), |l| {
            format!("its memory limit (limits.memory {l})")
        });
    let mut m = format!(
        "the sandbox's container was killed for memory (OOMKilled) when it reached {limit}: every process in it ended, sessions too, and the kubelet restarted it (restart {}); the workspace is kept. Raise the sandbox's resources.limits.memory or make its commands use less",
        kill.restart_count
    );
    if let Some(rc) = runtime_class {
        m.push_str(&format!(
            "; under RuntimeClass {rc} the sandbox's own runtime (gVisor's Sentry, a Kata VM) counts against the limit too (docs/limits.md)"
        ));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, state: serde_json::Value, last: serde_json::Value, restarts: i32) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "uid": uid},
            "spec": {"containers": [{"name": CONTAINER, "resources": {"limits": {"memory": "64Mi"}}}]},
            "status": {"containerStatuses": [{"name": CONTAINER, "ready": false,
                "restartCount": restarts, "image": "i", "imageID": "",
                "state": state, "lastState": last}]},
        }))
        .unwrap()
    }

    fn killed(at: &str) -> serde_json::Value {
        serde_json::json!({"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": at}})
    }

    #[test]
    fn one_kill_is_announced_once_as_it_moves_from_state_to_last_state() {
        let running = serde_json::json!({"running": {"startedAt": "2026-01-01T00:00:09Z"}});
        let down = pod(
            "u1",
            killed("2026-01-01T00:00:05Z"),
            serde_json::json!({}),
            0,
        );
        let up = pod("u1", running.clone(), killed("2026-01-01T00:00:05Z"), 1);
        let first = observed(&down).expect("a kill in the state");
        assert_eq!(first.limit.as_deref(), Some("64Mi"));
        assert!(is_new(None, &first));
        let again = observed(&up).expect("the same kill in the last state");
        assert_eq!(again.restart_count, 1);
        assert!(!is_new(Some(&first), &again), "the same kill, restarted");
        assert!(!is_new(Some(&again), &first), "seen out of order");
        // The next kill in the same pod, and one in another pod of the same name.
        let next = observed(&pod(
            "u1",
            running.clone(),
            killed("2026-01-01T00:01:00Z"),
            2,
        ))
        .unwrap();
        assert!(is_new(Some(&again), &next));
        let other = observed(&pod(
            "u2",
            running.clone(),
            killed("2026-01-01T00:00:05Z"),
            1,
        ))
        .unwrap();
        assert!(is_new(Some(&again), &other));
        // Without times, the restart count tells kills apart.
        let bare = |n| OomKill {
            at: None,
            pod_uid: "u1".into(),
            restart_count: n,
            limit: None,
        };
        assert!(is_new(Some(&bare(1)), &bare(2)) && !is_new(Some(&bare(2)), &bare(2)));
    }

    #[test]
    fn only_a_kill_for_memory_counts() {
        let running = serde_json::json!({"running": {}});
        let error = serde_json::json!({"terminated": {"exitCode": 137, "reason": "Error"}});
        assert!(observed(&pod("u", running.clone(), error.clone(), 1)).is_none());
        assert!(observed(&pod("u", error, serde_json::json!({}), 0)).is_none());
        assert!(observed(&pod("u", running, serde_json::json!({}), 0)).is_none());
        let msg = message(
            &observed(&pod(
                "u",
                killed("2026-01-01T00:00:05Z"),
                serde_json::json!({}),
                0,
            ))
            .unwrap(),
            Some("gvisor"),
        );
        assert!(
            msg.contains("limits.memory 64Mi") && msg.contains("RuntimeClass gvisor"),
            "{msg}"
        );
    }
}
