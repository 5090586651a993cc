//! Out of memory, as the kubelet records it: whether a sandbox's container was killed for
//! memory (its `OOMKilled` terminated state), the rule every client applies when an exec
//! failed in a way a dead container explains (docs/protocol.md, "Out of memory").
//!
//! A command that the kernel's OOM killer ends while its container lives on is told by the
//! exec wrapper itself (its memory trailer, [`crate::remote::memory_trailer`]); this module is
//! for the whole container: under gVisor the sandbox's own runtime counts against
//! `limits.memory`, and running out kills it with every process in it, so the exec's
//! connection breaks and no wrapper is left to say why.

use std::time::Duration;

use k8s_openapi::api::core::v1::{ContainerStateTerminated, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Api;

use crate::exec::ExecError;

/// The kubelet's reason for a container the kernel killed for memory.
pub const OOM_KILLED: &str = "OOMKilled";

/// How far before an exec's start a container's `OOMKilled` may have finished and still be
/// taken for the exec's cause: the client's clock and the node's may differ by this much.
pub const CLOCK_SKEW: Duration = Duration::from_secs(5);

/// How long a client looks for the kubelet's record after an exec failed. The kubelet notices a
/// dead container on its next relist (a second) but may write the pod's status only once it
/// has started the container again: under gVisor, on the loaded 2-core test cluster, the
/// record appeared 3 to 5 s after the cut stream, past the 4 s this was before.
pub const SETTLE: Duration = Duration::from_secs(10);

/// How often it looks meanwhile.
pub const POLL: Duration = Duration::from_millis(400);

/// The container's `OOMKilled` termination that finished at or after `since` less
/// [`CLOCK_SKEW`] (one without a `finishedAt` counts), from its current state or its last:
/// restartPolicy `Always` restarts a killed container, and its kill moves to `lastState`.
pub fn oom_killed_since<'p>(
    pod: &'p Pod,
    container: &str,
    since: Timestamp,
) -> Option<&'p ContainerStateTerminated> {
    let status = pod
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == container)?;
    let skew = SignedDuration::try_from(CLOCK_SKEW).unwrap_or_default();
    let after = since.checked_sub(skew).unwrap_or(since);
    [status.state.as_ref(), status.last_state.as_ref()]
        .into_iter()
        .flatten()
        .filter_map(|s| s.terminated.as_ref())
        .find(|t| {
            t.reason.as_deref() == Some(OOM_KILLED)
                && t.finished_at.as_ref().is_none_or(|f| f.0 >= after)
        })
}

/// Whether the container was killed for memory since `since` (see [`oom_killed_since`]),
/// looking at the pod for up to [`SETTLE`]: the client's check after an exec that failed
/// without an exit status (a cut stream, a broken connection, a command that did not start).
/// A pod that cannot be read (gone, or the API server out of reach) is not known to be out of
/// memory: the answer is no at once.
pub async fn container_killed_since(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    since: Timestamp,
) -> bool {
    let until = tokio::time::Instant::now() + SETTLE;
    loop {
        match pods.get(pod).await {
            Ok(p) if oom_killed_since(&p, container, since).is_some() => return true,
            Ok(_) => {}
            // Gone, or the API server out of reach: not known to be out of memory (and an
            // unreachable server should not cost the caller the settle time too).
            Err(_) => return false,
        }
        if tokio::time::Instant::now() + POLL > until {
            return false;
        }
        tokio::time::sleep(POLL).await;
    }
}

/// An exec's failure as the caller should see it: one that a dead container explains (a cut
/// stream, a broken connection, a command or session that could not go on) is
/// [`ExecError::OutOfMemory`] (`container: true`) when the kubelet recorded the container
/// `OOMKilled` since `since`, the exec's start ([`container_killed_since`]); anything else is
/// returned as it is.
pub async fn explain(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    since: Timestamp,
    e: ExecError,
) -> ExecError {
    match e {
        ExecError::Stream(_)
        | ExecError::OutputCut { .. }
        | ExecError::NotStarted(_)
        | ExecError::Session(_)
            if container_killed_since(pods, pod, container, since).await =>
        {
            ExecError::OutOfMemory { container: true }
        }
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "p"}, "status": status}))
            .unwrap()
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_kill_for_memory_counts_from_the_state_or_the_last_state_when_recent() {
        let killed = |which: &str, finished: &str| {
            pod(serde_json::json!({"containerStatuses": [{
                "name": "sandbox", "ready": false, "restartCount": 1, "image": "i", "imageID": "",
                which: {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": finished}}}]}))
        };
        let since = at("2026-01-01T00:01:00Z");
        assert!(
            oom_killed_since(&killed("state", "2026-01-01T00:01:02Z"), "sandbox", since).is_some()
        );
        assert!(
            oom_killed_since(
                &killed("lastState", "2026-01-01T00:01:02Z"),
                "sandbox",
                since
            )
            .is_some()
        );
        assert!(
            oom_killed_since(
                &killed("lastState", "2026-01-01T00:00:56Z"),
                "sandbox",
                since
            )
            .is_some(),
            "within the clock skew"
        );
        assert!(
            oom_killed_since(
                &killed("lastState", "2026-01-01T00:00:50Z"),
                "sandbox",
                since
            )
            .is_none(),
            "an earlier kill is not this exec's"
        );
        assert!(
            oom_killed_since(&killed("state", "2026-01-01T00:01:02Z"), "other", since).is_none()
        );
        let error = pod(serde_json::json!({"containerStatuses": [{
            "name": "sandbox", "ready": false, "restartCount": 1, "image": "i", "imageID": "",
            "lastState": {"terminated": {"exitCode": 137, "reason": "Error", "finishedAt": "2026-01-01T00:01:02Z"}}}]}));
        assert!(
            oom_killed_since(&error, "sandbox", since).is_none(),
            "137 alone is not memory"
        );
        assert!(oom_killed_since(&pod(serde_json::json!({})), "sandbox", since).is_none());
    }
}
