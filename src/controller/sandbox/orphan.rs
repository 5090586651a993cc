//! A Sandbox gone before its cleanup ran (deleted before its finalizer went on): its pod,
//! going with it, leaves its directory to the sweep. Its own cleanup hints the sweep too, and
//! marks the Sandbox so that its pod's events hint nothing more.

use std::sync::{LazyLock, Mutex};

use k8s_openapi::api::core::v1::Pod;
use kube::{Resource, ResourceExt};

use crate::controller::context::Context;
use crate::controller::placement;
use agentbox_api::crd::Sandbox;

/// The sweep hint for `pod` when it is the pod of a Sandbox that is gone already (no Sandbox
/// with its controller owner's UID in `sandboxes`) and is being deleted: the garbage
/// collector's work after a Sandbox deleted before its finalizer went on ([`super::reconcile`]). Its
/// directory (a UID or `warm-<suffix>` entry of its namespace's directory) is then no
/// cleanup's, so it is the sweep's. `None` for any other pod (a Sandbox that still exists
/// runs its own cleanup, which hints the sweep itself).
pub fn orphan_sweep_hint(
    pod: &Pod,
    node_root: &str,
    sandboxes: &kube::runtime::reflector::Store<Sandbox>,
) -> Option<crate::controller::memos::Hint> {
    pod.metadata.deletion_timestamp.as_ref()?;
    let ns = pod.namespace()?;
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == Sandbox::kind(&()))?;
    let live = sandboxes
        .get(&kube::runtime::reflector::ObjectRef::new(&owner.name).within(&ns))
        .is_some_and(|s| s.uid().as_deref() == Some(owner.uid.as_str()));
    if live {
        return None;
    }
    let node = pod.spec.as_ref()?.node_name.clone()?;
    let mounted = placement::pod_host_dir(pod)?;
    let dir = placement::dir_name(&mounted, node_root, &ns)?.to_string();
    Some(crate::controller::memos::Hint {
        node,
        namespace: ns,
        dir,
    })
}

/// UIDs of Sandboxes whose directory this process has left to the sweep (their cleanup did,
/// or [`orphan_hint`]): a pod event after that hints nothing more.
static SWEPT: LazyLock<Mutex<std::collections::HashSet<String>>> = LazyLock::new(Default::default);

/// Notes that the directory of the Sandbox with UID `uid` is the sweep's now; whether it was
/// not yet.
pub(super) fn swept(uid: &str) -> bool {
    SWEPT.lock().is_ok_and(|mut seen| {
        if seen.len() > 10_000 {
            seen.clear();
        }
        seen.insert(uid.to_string())
    })
}

/// Leaves the directory of a gone Sandbox's pod to the sweep ([`orphan_sweep_hint`]), once
/// per Sandbox. Whether it did.
pub fn orphan_hint(
    ctx: &Context,
    pod: &Pod,
    sandboxes: &kube::runtime::reflector::Store<Sandbox>,
) -> bool {
    let Some(hint) = orphan_sweep_hint(pod, &ctx.config.node_root, sandboxes) else {
        return false;
    };
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.clone())
        .unwrap_or_default();
    if !swept(&owner) {
        return false;
    }
    ctx.sweep.add(hint);
    true
}

/// What the sandbox controller does with each pod it manages as its watch sees it: a pod of
/// a Sandbox that is gone already, seen being deleted (the garbage collector after a Sandbox
/// deleted before its finalizer was on: see `write::with_metadata`), leaves its directory to
/// the sweep, once per pod.
pub fn on_pod(ctx: &Context, pod: &Pod, sandboxes: &kube::runtime::reflector::Store<Sandbox>) {
    if orphan_hint(ctx, pod, sandboxes) {
        tracing::debug!(pod = %pod.name_any(), "a deleted sandbox's pod is going: its directory is left to the sweep");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    #[test]
    fn the_pod_of_a_gone_sandbox_leaves_its_directory_to_the_sweep_when_it_goes() {
        let (store, mut writer) = kube::runtime::reflector::store::<Sandbox>();
        let pod = |deleting: bool, owner_uid: &str| -> Pod {
            let mut p: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "py-warm-abcde", "namespace": "team", "uid": "pod-1",
                    "ownerReferences": [{"apiVersion": "agentbox.dev/v1alpha1",
                        "kind": "Sandbox", "name": "s", "uid": owner_uid, "controller": true}]},
                "spec": {"nodeName": "n1", "containers": [], "volumes": [
                    {"name": crate::controller::pod::WORKSPACE_VOLUME,
                     "hostPath": {"path": "/w/team/warm-abcde"}}]},
            }))
            .unwrap();
            if deleting {
                p.metadata.deletion_timestamp = Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
                );
            }
            p
        };
        let hint = crate::controller::memos::Hint {
            node: "n1".into(),
            namespace: "team".into(),
            dir: "warm-abcde".into(),
        };
        assert_eq!(
            orphan_sweep_hint(&pod(false, "u1"), "/w", &store),
            None,
            "not going"
        );
        assert_eq!(
            orphan_sweep_hint(&pod(true, "u1"), "/w", &store),
            Some(hint.clone()),
            "its Sandbox is gone"
        );
        let sbx: Sandbox = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s", "namespace": "team", "uid": "u1"},
            "spec": {"image": "i", "scope": {"kind": "Global"}},
        }))
        .unwrap();
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(sbx));
        assert_eq!(
            orphan_sweep_hint(&pod(true, "u1"), "/w", &store),
            None,
            "its Sandbox exists: its own cleanup hints the sweep"
        );
        assert_eq!(
            orphan_sweep_hint(&pod(true, "u0"), "/w", &store),
            Some(hint),
            "a Sandbox of that name made again is another one"
        );
    }
}
