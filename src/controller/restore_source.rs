//! Which snapshot a Sandbox may restore.
//!
//! A snapshot belongs to the scope recorded in its status (`status.scopeKey`), which only the
//! operator writes (through the status subresource, when it takes the snapshot). Its labels are
//! a convenience for `kubectl get -l` and a pre-filter for list requests: anyone who may patch
//! a SandboxSnapshot can change them. So:
//!
//! - `Latest` picks the newest Ready snapshot whose *recorded* scope key is the sandbox's,
//!   listed with the field selector `status.scopeKey` (a selectable field of the CRD); a
//!   snapshot relabelled into the scope is never picked, and one relabelled out of it still is.
//! - `Named` restores the named snapshot only when its recorded scope key is the sandbox's, or
//!   when the namespace allows cross-scope restores with the annotation [`ALLOW_CROSS_SCOPE`]
//!   (set on the Namespace, which tenants cannot edit; see docs/security.md). Otherwise the
//!   start is refused with reason `CrossScopeRestore`.
//!
//! The same check runs again at the top of the restore itself ([`verify`]).

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::events::EventType;

use super::reasons::RestoreReason;
use crate::controller::context::{Context, Error};
use agentbox_api::crd::{RestorePolicy, Sandbox, SandboxSnapshot, SnapshotPhase};
use agentbox_api::{labels, names};

/// Namespace annotation (value `"true"`) that lets Sandboxes of the namespace restore Named
/// snapshots of other scopes.
pub const ALLOW_CROSS_SCOPE: &str = "agentbox.dev/allow-cross-scope-restore";

/// Order of a scope's snapshots: completion time (whole seconds in the API), then the fencing
/// token (each snapshot of a scope is taken under a new acquisition of the scope's guard, so
/// the token orders snapshots completed within the same second), then the name.
pub type Age = (Option<Timestamp>, i64, String);

/// The [`Age`] of a snapshot.
pub fn age(s: &SandboxSnapshot) -> Age {
    let st = s.status.as_ref();
    (
        st.and_then(|st| st.completed_at.as_ref()).map(|t| t.0),
        st.and_then(|st| st.fencing_token).unwrap_or(0),
        s.name_any(),
    )
}

/// How a Ready snapshot relates to a sandbox's scope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Relation {
    /// Taken from a sandbox of the same scope.
    SameScope,
    /// Taken from a sandbox of the scope with this key.
    OtherScope(String),
}

fn refused(reason: RestoreReason, message: String) -> Error {
    // Selection needs no guard or exec, so it is not recorded as a standing refusal: its
    // inputs (the namespace's annotation among them) are cheap to read again.
    Error::Restore {
        reason,
        message,
        refusal: None,
    }
}

/// How `snap` relates to scope `scope_key`, by the operator's own record; refused when it is
/// not Ready or has no record.
pub fn relation(snap: &SandboxSnapshot, scope_key: &str) -> Result<Relation, Error> {
    let name = snap.name_any();
    let st = snap.status.clone().unwrap_or_default();
    if st.phase != Some(SnapshotPhase::Ready) {
        return Err(refused(
            RestoreReason::SnapshotNotReady,
            format!("SandboxSnapshot {name} is not Ready"),
        ));
    }
    match st.scope_key {
        None => Err(refused(
            RestoreReason::SnapshotIncomplete,
            format!("SandboxSnapshot {name} has no recorded scope key"),
        )),
        Some(k) if k == scope_key => Ok(Relation::SameScope),
        Some(k) => Ok(Relation::OtherScope(k)),
    }
}

/// Whether `snap` is a Ready snapshot the operator recorded for scope `scope_key`.
pub fn is_ready_of_scope(snap: &SandboxSnapshot, scope_key: &str) -> bool {
    matches!(relation(snap, scope_key), Ok(Relation::SameScope))
}

/// The newest Ready snapshot of scope `scope_key` among `snaps`, by the recorded scope key
/// (labels do not count), ordered by completion time, then fencing token.
pub fn latest<'a>(snaps: &'a [SandboxSnapshot], scope_key: &str) -> Option<&'a SandboxSnapshot> {
    snaps
        .iter()
        .filter(|s| is_ready_of_scope(s, scope_key))
        .max_by_key(|s| age(s))
}

/// The snapshots the operator recorded for scope `scope_key` in the namespace of `api`: a list
/// by the field selector `status.scopeKey`, or, where the installed CRD predates that
/// selectable field (the API server answers 400), by listing all and filtering here. Callers
/// check [`is_ready_of_scope`] on each anyway.
pub async fn recorded_for(
    api: &Api<SandboxSnapshot>,
    scope_key: &str,
) -> Result<Vec<SandboxSnapshot>, Error> {
    let lp = ListParams::default().fields(&format!("status.scopeKey={scope_key}"));
    let items = match api.list(&lp).await {
        Ok(l) => l.items,
        Err(kube::Error::Api(s)) if s.code == 400 => api.list(&ListParams::default()).await?.items,
        Err(e) => return Err(e.into()),
    };
    Ok(items
        .into_iter()
        .filter(|s| s.status.as_ref().and_then(|st| st.scope_key.as_deref()) == Some(scope_key))
        .collect())
}

/// Whether the namespace allows cross-scope restores (read only when one is asked for).
async fn cross_scope_allowed(ctx: &Context, ns: &str) -> Result<bool, Error> {
    let nss: Api<Namespace> = Api::all(ctx.client.clone());
    Ok(nss.get_opt(ns).await?.is_some_and(|n| {
        n.annotations()
            .get(ALLOW_CROSS_SCOPE)
            .is_some_and(|v| v == "true")
    }))
}

/// Refuses `snap` for `sbx` unless it is of the sandbox's scope or the namespace allows
/// cross-scope restores (then, when `announce`, a Normal Event records that it was used).
pub async fn verify(
    ctx: &Context,
    sbx: &Sandbox,
    snap: &SandboxSnapshot,
    announce: bool,
) -> Result<(), Error> {
    let key = labels::scope_key(&sbx.spec.scope);
    let Relation::OtherScope(theirs) = relation(snap, &key)? else {
        return Ok(());
    };
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let name = snap.name_any();
    if !cross_scope_allowed(ctx, &ns).await? {
        return Err(refused(
            RestoreReason::CrossScopeRestore,
            format!(
                "SandboxSnapshot {name} was taken in another scope (scope key {theirs}, this sandbox's is {key}); restoring it here would hand that scope's workspace to this one. A platform administrator can allow cross-scope restores in this namespace with the Namespace annotation {ALLOW_CROSS_SCOPE}=true"
            ),
        ));
    }
    if !announce {
        return Ok(());
    }
    crate::controller::context::publish(
        ctx,
        sbx,
        EventType::Normal,
        "CrossScopeRestore",
        "Restore",
        &format!(
            "restoring SandboxSnapshot {name} of scope key {theirs}, allowed by the namespace annotation {ALLOW_CROSS_SCOPE}"
        ),
    )
    .await;
    Ok(())
}

/// The snapshot the sandbox's restore policy points at, checked: the named one (refused when
/// missing, not Ready, or of another scope without the namespace's leave), or the newest Ready
/// one of the sandbox's scope. `None`: nothing to restore.
pub async fn candidate(ctx: &Context, sbx: &Sandbox) -> Result<Option<String>, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let snaps: Api<SandboxSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
    match sbx.spec.snapshot.restore {
        RestorePolicy::Never => Ok(None),
        RestorePolicy::Named => {
            let Some(name) = sbx.spec.snapshot.name.as_deref() else {
                return Ok(None);
            };
            if !names::is_object_name(name) {
                return Err(refused(
                    RestoreReason::InvalidReference,
                    names::refusal("snapshot.name", name),
                ));
            }
            let snap = snaps.get_opt(name).await?.ok_or_else(|| {
                refused(
                    RestoreReason::SnapshotNotFound,
                    format!("SandboxSnapshot {name} (snapshot.name) not found"),
                )
            })?;
            verify(ctx, sbx, &snap, false).await?;
            Ok(Some(name.to_string()))
        }
        RestorePolicy::Latest => {
            let key = labels::scope_key(&sbx.spec.scope);
            let recorded = recorded_for(&snaps, &key).await?;
            Ok(latest(&recorded, &key).map(|s| s.name_any()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(
        name: &str,
        label_key: &str,
        status_key: Option<&str>,
        ready: bool,
        t: i64,
    ) -> SandboxSnapshot {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxSnapshot",
            "metadata": {"name": name, "namespace": "n",
                "labels": {labels::SCOPE_KEY: label_key}},
            "spec": {"sandboxRef": {"name": "s"}},
            "status": {"phase": if ready { "Ready" } else { "Running" },
                "scopeKey": status_key,
                "completedAt": k8s_openapi::jiff::Timestamp::from_second(t).unwrap().to_string()},
        }))
        .unwrap()
    }

    #[test]
    fn latest_goes_by_the_recorded_scope_not_the_labels() {
        let mine = "a".repeat(40);
        let theirs = "b".repeat(40);
        let snaps = vec![
            snap("old", &mine, Some(&mine), true, 100),
            // Relabelled into this scope by someone who may patch labels: never picked.
            snap("planted", &mine, Some(&theirs), true, 300),
            // Relabelled out of this scope: still this scope's.
            snap("hidden", &theirs, Some(&mine), true, 200),
            snap("running", &mine, Some(&mine), false, 400),
            snap("unrecorded", &mine, None, true, 500),
        ];
        assert_eq!(
            latest(&snaps, &mine).map(|s| s.name_any()).as_deref(),
            Some("hidden")
        );
        assert_eq!(
            latest(&snaps, &theirs).map(|s| s.name_any()).as_deref(),
            Some("planted")
        );
        assert!(latest(&snaps, &"c".repeat(40)).is_none());
    }

    #[test]
    fn a_named_snapshot_relates_by_its_record() {
        let mine = "a".repeat(40);
        let theirs = "b".repeat(40);
        assert_eq!(
            relation(&snap("s", &theirs, Some(&mine), true, 1), &mine).unwrap(),
            Relation::SameScope
        );
        assert_eq!(
            relation(&snap("s", &mine, Some(&theirs), true, 1), &mine).unwrap(),
            Relation::OtherScope(theirs.clone())
        );
        let reason = |r: Result<Relation, Error>| match r {
            Err(Error::Restore { reason, .. }) => reason.as_str(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            reason(relation(&snap("s", &mine, Some(&mine), false, 1), &mine)),
            "SnapshotNotReady"
        );
        assert_eq!(
            reason(relation(&snap("s", &mine, None, true, 1), &mine)),
            "SnapshotIncomplete"
        );
    }
}
