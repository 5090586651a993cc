//! The node side of a namespace's workspaces: the first time this operator sees a sandbox of a
//! namespace running on a node, a helper pod makes `<nodeRoot>/<namespace>` root-only (`0700`,
//! so no other host user can reach a workspace below it) and reports whether the mount holding
//! it is `nosuid,nodev` (so a setuid file or device node left in a workspace has no power on
//! the node). The result is kept per node and namespace for the life of the process and shown
//! on every sandbox there as the [`CONDITION`] condition, with a Warning Event when it is not
//! hardened. The check runs beside the sandbox's start, not in its way.

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use tracing::info;

use super::helper_pod;
use super::helper_pod::helper_outcome;
use super::memos::Found;
use crate::controller::context::{Context, Error};

/// Condition type on a Sandbox: its workspace's directory on the node is hardened.
pub const CONDITION: &str = "NodeRootHardened";

/// The outcome of a prepare pod (see [`helper_outcome`](helper_pod::helper_outcome)). `None` while it runs.
pub fn read_pod(pod: &Pod) -> Option<Found> {
    Some(match helper_outcome(pod)? {
        Ok(r) if r.get("job") == Some("prepare") => Found::Checked {
            nosuid: r.flag("nosuid").unwrap_or(false),
            nodev: r.flag("nodev").unwrap_or(false),
            mount: r.get("mount").unwrap_or("unknown").to_string(),
        },
        Ok(r) => Found::Failed(format!("the helper pod reported another job: {}", r.line())),
        Err(m) => Found::Failed(m),
    })
}

/// Makes namespace `ns`'s directory on `node` root-only: starts the helper pod that prepares
/// it (`desired` builds it; `None`, without a helper image, starts nothing) when there is none,
/// and once it has finished records its outcome for the node and namespace and deletes it.
/// One pod per node and namespace whoever asks (a sandbox's start, a pool's warm pods): a 409
/// on its create is someone else's, read on the next call. A create the namespace refuses (a
/// ResourceQuota, a LimitRange, an admission policy: [`refused`]) is a failed check, recorded
/// like a helper that cannot start, so neither the sandbox nor the pool waits on it forever.
/// `None` while it runs.
pub async fn prepare(
    ctx: &Context,
    pods: &Api<Pod>,
    ns: &str,
    node: &str,
    desired: impl FnOnce() -> Option<Pod>,
) -> Result<Option<Found>, Error> {
    let name = helper_pod::prepare_pod_name(node);
    let Some(p) = pods.get_opt(&name).await? else {
        if let Some(desired) = desired() {
            match pods.create(&PostParams::default(), &desired).await {
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) if refused(&e) => {
                    let why = match &e {
                        kube::Error::Api(s) => s.message.clone(),
                        e => e.to_string(),
                    };
                    let found = Found::Failed(format!("the helper pod was refused: {why}"));
                    info!(namespace = %ns, node, "workspace directory not checked: {found:?}");
                    ctx.node_roots
                        .record(node, ns, found.clone(), Instant::now());
                    return Ok(Some(found));
                }
                other => {
                    other?;
                }
            }
        }
        return Ok(None);
    };
    let Some(found) = read_pod(&p) else {
        return Ok(None);
    };
    info!(namespace = %ns, node, "workspace directory checked: {found:?}");
    ctx.node_roots
        .record(node, ns, found.clone(), Instant::now());
    if p.metadata.deletion_timestamp.is_none() {
        match pods.delete(&name, &DeleteParams::background()).await {
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            other => {
                other?;
            }
        }
    }
    Ok(Some(found))
}

/// Whether the API server refused a helper pod for good, as far as this process can tell: a
/// 400, 403 or 422 (a quota, a LimitRange, an admission policy, RBAC), but not a namespace
/// being deleted (its sandboxes are going too: nothing to report).
pub fn refused(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if matches!(s.code, 400 | 403 | 422))
        && !helper_pod::namespace_takes_no_pods(e)
}

/// The condition (status, reason, message) for a result.
pub fn condition(found: &Found, node: &str, dir: &str) -> (bool, &'static str, String) {
    match found {
        Found::Checked {
            nosuid: true,
            nodev: true,
            mount,
        } => (
            true,
            "Hardened",
            format!(
                "{dir} on node {node} is root-only (0700) and its mount ({mount}) is nosuid,nodev"
            ),
        ),
        Found::Checked {
            nosuid,
            nodev,
            mount,
        } => {
            let missing: Vec<&str> = [(!nosuid, "nosuid"), (!nodev, "nodev")]
                .into_iter()
                .filter_map(|(m, f)| m.then_some(f))
                .collect();
            (
                false,
                "MountNotNosuidNodev",
                format!(
                    "{dir} on node {node} is root-only (0700), but its mount ({mount}) lacks {}: a setuid file or device node left in a workspace would work on the node for anyone who reaches it; mount the node root with nosuid,nodev (docs/security.md)",
                    missing.join(",")
                ),
            )
        }
        Found::Failed(m) => (
            false,
            "CheckFailed",
            format!("preparing {dir} on node {node} failed: {m}"),
        ),
    }
}

/// The condition when the operator has no helper image to check with.
pub fn no_helper(node: &str, dir: &str) -> (bool, &'static str, String) {
    (
        false,
        "NoHelperImage",
        format!(
            "{dir} on node {node} was not checked or closed: this operator has no helper image (--helper-image)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::memos::{Checks, RETRY_FAILED_AFTER};
    use agentbox_helper::Report;

    fn finished(phase: &str, message: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": phase, "containerStatuses": [{
                "name": "prepare", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"terminated": {"exitCode": 0, "message": message}}}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_helper_pod_refused_by_the_namespace_is_a_failed_check_and_a_transient_error_is_not() {
        let status = |code: u16, message: &str| {
            kube::Error::Api(Box::new(
                serde_json::from_value(serde_json::json!({
                    "status": "Failure", "code": code, "reason": "x", "message": message,
                }))
                .unwrap(),
            ))
        };
        for e in [
            status(
                403,
                "pods \"agentbox-prepare-n\" is forbidden: exceeded quota: q",
            ),
            status(
                403,
                "pods \"p\" is forbidden: minimum cpu usage per Pod is 1",
            ),
            status(422, "Pod \"p\" is invalid: spec.containers[0]"),
        ] {
            assert!(refused(&e), "{e}");
        }
        for e in [
            status(
                403,
                "unable to create new content in namespace team because it is being terminated",
            ),
            status(409, "already exists"),
            status(429, "too many requests"),
            status(500, "etcdserver: request timed out"),
            status(504, "timeout"),
        ] {
            assert!(!refused(&e), "{e}");
        }
    }

    #[test]
    fn a_pod_that_cannot_start_counts_as_failed() {
        let p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {"phase": "Pending", "containerStatuses": [{
                "name": "prepare", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "not present"}}}]},
        }))
        .unwrap();
        assert!(matches!(read_pod(&p), Some(Found::Failed(m)) if m.contains("ErrImageNeverPull")));
    }

    #[test]
    fn a_finished_pod_is_read_from_its_termination_message() {
        let ok = Report::default()
            .with("job", "prepare")
            .with("nosuid", true)
            .with("nodev", false)
            .with("mount", "/ns");
        assert_eq!(
            read_pod(&finished("Succeeded", &ok.line())),
            Some(Found::Checked {
                nosuid: true,
                nodev: false,
                mount: "/ns".into()
            })
        );
        assert_eq!(
            read_pod(&finished(
                "Failed",
                "agentbox-helper: /ns is owned by uid 5"
            )),
            Some(Found::Failed(
                "agentbox-helper: /ns is owned by uid 5".into()
            ))
        );
        assert!(matches!(
            read_pod(&finished("Succeeded", "")),
            Some(Found::Failed(_))
        ));
        let running: Pod = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "p"}, "status": {"phase": "Running"}}),
        )
        .unwrap();
        assert_eq!(read_pod(&running), None);
    }

    #[test]
    fn conditions_say_what_is_missing() {
        let (ok, reason, _) = condition(
            &Found::Checked {
                nosuid: true,
                nodev: true,
                mount: "/w".into(),
            },
            "n",
            "/w/ns",
        );
        assert!(ok && reason == "Hardened");
        let (ok, reason, msg) = condition(
            &Found::Checked {
                nosuid: false,
                nodev: true,
                mount: "/".into(),
            },
            "n",
            "/w/ns",
        );
        assert!(!ok && reason == "MountNotNosuidNodev");
        assert!(msg.contains("lacks nosuid:"), "{msg}");
    }

    #[test]
    fn results_stand_and_failures_are_retried_later() {
        let t = Instant::now();
        let checks = Checks::default();
        assert_eq!(checks.get("n", "ns", t), None);
        let ok = Found::Checked {
            nosuid: true,
            nodev: true,
            mount: "/".into(),
        };
        checks.record("n", "ns", ok.clone(), t);
        checks.record("n", "bad", Found::Failed("x".into()), t);
        let later = t + RETRY_FAILED_AFTER;
        assert_eq!(checks.get("n", "ns", later), Some(ok));
        assert_eq!(checks.get("n", "bad", t), Some(Found::Failed("x".into())));
        assert_eq!(checks.get("n", "bad", later), None);
        assert_eq!(checks.get("n", "other", t), None);
    }
}
