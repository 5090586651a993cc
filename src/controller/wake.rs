//! Which sandboxes a watched object's change wakes: the sandbox controller's mappers, each
//! reading the controller's store of Sandboxes.

use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};

use crate::controller::sandbox;
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
/// (see [`sandbox::snapshot_concerns`]), so that a refused restore is judged again at once,
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
            .filter(|s| s.namespace() == ns && sandbox::snapshot_concerns(s, &name, key.as_deref()))
            .map(|s| ObjectRef::from_obj(s.as_ref()))
            .collect()
    }
}
