//! Where a sandbox's pod and workspace directory are. Both are *recorded* in its status
//! (`status.podName`, `status.workspace.hostDir`) in the status write that records the pod,
//! not derived from the Sandbox: a pod adopted from a warm pool has the pool's name for it and
//! its own directory. The derived values (`sbx-<name>`, `<nodeRoot>/<namespace>/<uid>`) are
//! what the operator makes for a cold start, and the fallback for sandboxes whose status
//! predates the record (an upgrade: old objects have no `hostDir`) or has not been written yet.
//!
//! Everything that needs the pod or the directory — the sandbox controller's observe and act,
//! its cleanup, node-loss handling, snapshots, the orphan sweep — asks here.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::pod;
use agentbox_api::crd::{Sandbox, SandboxStatus};
use agentbox_api::labels;

/// A workspace directory on a node: what a cleanup removes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeDir<'a> {
    /// The node.
    pub node: &'a str,
    /// The directory there.
    pub dir: &'a str,
}

/// The pod and workspace directory of one sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The sandbox's pod: `status.podName`, else the name a cold start gives it.
    pub pod_name: String,
    /// Its workspace's host directory: `status.workspace.hostDir`, else the cold start's.
    pub host_dir: String,
}

/// The recorded pod and directory of `sbx`, with the derived ones as the fallback.
pub fn placement(sbx: &Sandbox, node_root: &str) -> Placement {
    Placement {
        pod_name: pod_name(sbx),
        host_dir: host_dir(sbx, node_root),
    }
}

/// The sandbox's pod name: `status.podName`, else the derived `sbx-<name>`.
pub fn pod_name(sbx: &Sandbox) -> String {
    recorded_pod_name(sbx).unwrap_or_else(|| derived_pod_name(sbx))
}

/// `status.podName`, when recorded.
pub fn recorded_pod_name(sbx: &Sandbox) -> Option<String> {
    sbx.status.as_ref().and_then(|s| s.pod_name.clone())
}

/// The name the operator gives a pod it makes for `sbx`.
pub fn derived_pod_name(sbx: &Sandbox) -> String {
    labels::pod_name(&sbx.name_any())
}

/// The sandbox's workspace directory: `status.workspace.hostDir`, else the derived
/// `<nodeRoot>/<namespace>/<uid>`.
pub fn host_dir(sbx: &Sandbox, node_root: &str) -> String {
    recorded_host_dir(sbx).unwrap_or_else(|| derived_host_dir(sbx, node_root))
}

/// `status.workspace.hostDir`, when recorded.
pub fn recorded_host_dir(sbx: &Sandbox) -> Option<String> {
    sbx.status.as_ref().and_then(recorded_in)
}

/// The `workspace.hostDir` a status records.
pub fn recorded_in(st: &SandboxStatus) -> Option<String> {
    st.workspace.as_ref().and_then(|w| w.host_dir.clone())
}

/// The directory the operator gives a workspace it makes for `sbx` (a cold start).
pub fn derived_host_dir(sbx: &Sandbox, node_root: &str) -> String {
    pod::workspace_host_path(
        node_root,
        &sbx.namespace().unwrap_or_default(),
        &sbx.uid().unwrap_or_default(),
    )
}

/// The workspace directory `pod` mounts (its workspace volume's host path), if it has one.
pub fn pod_host_dir(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find(|v| v.name == pod::WORKSPACE_VOLUME)?
        .host_path
        .as_ref()
        .map(|h| h.path.clone())
}

/// The directory of a sandbox whose pod is `pod` (if known): recorded, else the one the pod
/// mounts (a pod made or adopted before its status was written), else derived.
pub fn host_dir_with(sbx: &Sandbox, pod: Option<&Pod>, node_root: &str) -> String {
    recorded_host_dir(sbx)
        .or_else(|| pod.and_then(pod_host_dir))
        .unwrap_or_else(|| derived_host_dir(sbx, node_root))
}

/// The entry name of workspace directory `dir` inside namespace `ns`'s directory
/// (`<nodeRoot>/<ns>/<name>` → `<name>`): what a helper pod mounting the namespace's directory
/// removes. `None` for anything else (a path elsewhere, or deeper): never the operator's to
/// remove.
pub fn dir_name<'a>(dir: &'a str, node_root: &str, ns: &str) -> Option<&'a str> {
    let parent = pod::namespace_host_path(node_root, ns);
    let name = dir.strip_prefix(&parent)?.strip_prefix('/')?;
    (!name.is_empty() && !name.contains('/') && name != "." && name != "..").then_some(name)
}

/// Whether `pod` is controlled by `sbx` (its controller owner reference has the sandbox's UID).
pub fn controlled_by(pod: &Pod, sbx: &Sandbox) -> bool {
    let uid = sbx.uid();
    uid.is_some()
        && pod
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
}

/// Among `pods`, the one labelled for `sbx` (`agentbox.dev/sandbox=<name>`) and controlled by
/// it: a pod made or adopted for it whose name the status does not record yet (the operator
/// stopped before writing it). A live one is preferred over one being deleted; ties go to the
/// name, so every look picks the same.
pub fn find_owned<'a>(pods: impl IntoIterator<Item = &'a Pod>, sbx: &Sandbox) -> Option<&'a Pod> {
    let label = labels::sandbox_label_value(&sbx.name_any());
    pods.into_iter()
        .filter(|p| p.labels().get(labels::SANDBOX) == Some(&label) && controlled_by(p, sbx))
        .min_by_key(|p| (p.metadata.deletion_timestamp.is_some(), p.name_any()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sandbox(status: serde_json::Value) -> Sandbox {
        serde_json::from_value(json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s", "namespace": "team", "uid": "u-1"},
            "spec": {"image": "busybox", "scope": {"kind": "Global"}},
            "status": status,
        }))
        .unwrap()
    }

    fn pod(name: &str, sandbox_label: &str, owner: &str, controller: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {labels::SANDBOX: sandbox_label},
                "ownerReferences": [{"apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
                    "name": "s", "uid": owner, "controller": controller}]},
            "spec": {"containers": [], "volumes": [
                {"name": "scratch", "emptyDir": {}},
                {"name": pod::WORKSPACE_VOLUME, "hostPath": {"path": format!("/w/team/{name}")}},
            ]},
        }))
        .unwrap()
    }

    #[test]
    fn a_sandbox_without_a_record_has_the_derived_pod_and_directory() {
        let p = placement(&sandbox(json!({})), "/w");
        assert_eq!(p.pod_name, "sbx-s");
        assert_eq!(p.host_dir, "/w/team/u-1");
        // An upgrade: the pod recorded, the directory not yet.
        let old = sandbox(json!({"podName": "sbx-s", "workspace": {"rootReady": true}}));
        assert_eq!(placement(&old, "/w").host_dir, "/w/team/u-1");
    }

    #[test]
    fn the_recorded_pod_and_directory_win_over_the_derived_ones() {
        let s = sandbox(json!({"podName": "pool-warm-abcde",
            "workspace": {"hostDir": "/w/team/warm-abcde"}}));
        assert_eq!(
            placement(&s, "/w"),
            Placement {
                pod_name: "pool-warm-abcde".into(),
                host_dir: "/w/team/warm-abcde".into()
            }
        );
        let p = pod("other", "s", "u-1", true);
        assert_eq!(host_dir_with(&s, Some(&p), "/w"), "/w/team/warm-abcde");
    }

    #[test]
    fn before_its_status_is_written_the_directory_is_the_one_the_pod_mounts() {
        let s = sandbox(json!({}));
        let p = pod("pool-warm-abcde", "s", "u-1", true);
        assert_eq!(pod_host_dir(&p).as_deref(), Some("/w/team/pool-warm-abcde"));
        assert_eq!(host_dir_with(&s, Some(&p), "/w"), "/w/team/pool-warm-abcde");
        assert_eq!(host_dir_with(&s, None, "/w"), "/w/team/u-1");
    }

    #[test]
    fn only_a_direct_entry_of_the_namespace_directory_has_a_name() {
        assert_eq!(
            dir_name("/w/team/warm-abcde", "/w", "team"),
            Some("warm-abcde")
        );
        assert_eq!(dir_name("/w/team/u-1", "/w", "team"), Some("u-1"));
        for not in [
            "/w/other/u-1",
            "/w/team",
            "/w/team/",
            "/w/team/a/b",
            "/w/teamx/u-1",
            "/w/team/..",
            "/srv/team/u-1",
        ] {
            assert_eq!(dir_name(not, "/w", "team"), None, "{not}");
        }
    }

    #[test]
    fn the_owned_pod_is_labelled_for_the_sandbox_and_controlled_by_its_uid() {
        let s = sandbox(json!({}));
        let mine = pod("pool-warm-abcde", "s", "u-1", true);
        let pods = [
            pod("a-other-sandbox", "t", "u-1", true),
            pod("b-other-uid", "s", "u-2", true),
            pod("c-not-controller", "s", "u-1", false),
            mine.clone(),
        ];
        assert_eq!(find_owned(&pods, &s), Some(&mine));
        assert_eq!(find_owned(&pods[..3], &s), None);
        // A live pod before one being deleted, then by name.
        let mut going = pod("a-going", "s", "u-1", true);
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().unwrap(),
            ));
        let both = [going.clone(), mine.clone()];
        assert_eq!(find_owned(&both, &s), Some(&mine));
        assert_eq!(find_owned(&[going.clone()], &s), Some(&going));
    }
}
