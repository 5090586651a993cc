//! Which sandboxes a watched object's change triggers a reconcile of: the sandbox
//! controller's mappers, each reading the controller's store of Sandboxes.

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use agentbox_api::crd::{Sandbox, SandboxSnapshot, SandboxTemplate};
use agentbox_api::labels;

/// A scope's guard Lease changing holder updates the Guarded condition of the sandboxes of
/// that scope (renewals keep the holder, so they cost no status write).
pub fn by_scope(sandboxes: Store<Sandbox>) -> impl Fn(Lease) -> Vec<ObjectRef<Sandbox>> {
    move |lease: Lease| {
        let key = lease.labels().get(labels::SCOPE_KEY).cloned();
        let ns = lease.namespace();
        sandboxes
            .state()
            .into_iter()
            .filter(|s| {
                key.is_some()
                    && s.labels().get(labels::SCOPE_KEY) == key.as_ref()
                    && s.namespace() == ns
            })
            .map(|s| ObjectRef::from_obj(s.as_ref()))
            .collect()
    }
}

/// A template created or edited brings back the sandboxes that name it (one waiting for it
/// starts; the others keep their pods, see `template`).
pub fn by_template(
    sandboxes: Store<Sandbox>,
) -> impl Fn(SandboxTemplate) -> Vec<ObjectRef<Sandbox>> {
    move |t: SandboxTemplate| {
        let (name, ns) = (t.name_any(), t.namespace());
        sandboxes
            .state()
            .into_iter()
            .filter(|s| {
                s.namespace() == ns && s.spec.template_ref.as_ref().is_some_and(|r| r.name == name)
            })
            .map(|s| ObjectRef::from_obj(s.as_ref()))
            .collect()
    }
}

/// A snapshot created, changed or deleted brings back the sandboxes whose start it may decide
/// (see [`snapshot_concerns`]), so that a refused restore is judged again at once,
/// not at the next slow poll.
pub fn by_snapshot(
    sandboxes: Store<Sandbox>,
) -> impl Fn(SandboxSnapshot) -> Vec<ObjectRef<Sandbox>> {
    move |snap: SandboxSnapshot| {
        let (name, ns) = (snap.name_any(), snap.namespace());
        let key = snap
            .labels()
            .get(labels::SCOPE_KEY)
            .cloned()
            .or_else(|| snap.status.as_ref().and_then(|s| s.scope_key.clone()));
        sandboxes
            .state()
            .into_iter()
            .filter(|s| s.namespace() == ns && snapshot_concerns(s, &name, key.as_deref()))
            .map(|s| ObjectRef::from_obj(s.as_ref()))
            .collect()
    }
}

/// Whether a change to the SandboxSnapshot `name` (of scope `scope_key`, when known) may
/// change what `sbx`'s start does (pure): it is the snapshot the sandbox restores by name or
/// refused last, or a snapshot of its scope while the sandbox is not Ready (a `Latest` restore
/// waiting for one, or refused). A Ready sandbox of the scope does not care.
pub fn snapshot_concerns(sbx: &Sandbox, name: &str, scope_key: Option<&str>) -> bool {
    let policy = &sbx.spec.snapshot;
    let named = policy.restore == agentbox_api::crd::RestorePolicy::Named
        && policy.name.as_deref() == Some(name);
    let st = sbx.status.as_ref();
    let refused = st
        .and_then(|s| s.restore_refusal.as_ref())
        .is_some_and(|r| r.basis.snapshot == name);
    let ready = st.and_then(|s| s.phase) == Some(agentbox_api::crd::SandboxPhase::Ready);
    let same_scope =
        scope_key.is_some() && sbx.labels().get(labels::SCOPE_KEY).map(String::as_str) == scope_key;
    named || refused || (same_scope && !ready)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_concerns_the_sandboxes_that_name_it_refused_it_or_wait_in_its_scope() {
        let sbx = |snapshot: serde_json::Value, status: serde_json::Value| -> Sandbox {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
                "metadata": {"name": "s", "labels": {labels::SCOPE_KEY: "k1"}},
                "spec": {"image": "i", "scope": {"kind": "Global"}, "snapshot": snapshot},
                "status": status,
            }))
            .unwrap()
        };
        let named = sbx(
            serde_json::json!({"restore": "Named", "name": "snap"}),
            serde_json::json!({"phase": "Ready"}),
        );
        assert!(snapshot_concerns(&named, "snap", None));
        assert!(!snapshot_concerns(&named, "other", Some("k2")));
        assert!(
            !snapshot_concerns(&named, "other", Some("k1")),
            "Ready: a new snapshot of its scope changes nothing"
        );
        let refused = sbx(
            serde_json::json!({}),
            serde_json::json!({"phase": "Pending", "restoreRefusal": {
                "snapshot": "old", "snapshotUid": "u", "snapshotResourceVersion": "1",
                "generation": 1, "objectVersion": "v", "limits": "l",
                "reason": "Fifo", "message": "m", "refusedAt": "2026-01-01T00:00:00Z"}}),
        );
        assert!(snapshot_concerns(&refused, "old", None), "the refused one");
        assert!(
            snapshot_concerns(&refused, "new", Some("k1")),
            "Latest, not Ready: any snapshot of its scope"
        );
        assert!(!snapshot_concerns(&refused, "new", Some("k2")));
        assert!(!snapshot_concerns(&refused, "new", None));
    }
}
