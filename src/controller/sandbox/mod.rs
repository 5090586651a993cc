//! The sandbox controller: Sandbox → Pod, workspace initialisation, lifecycle, cleanup.
//!
//! A live Sandbox's reconcile is [`observe`] (read the Sandbox's status, the scope's guard
//! Lease, the spec's problems and the pod) → [`decide`] (pure: a [`decide::Step`] and the
//! status it leads to) → `act` (the writes and execs, then the status, once, only when it
//! changed). A deleting one runs `cleanup`. Here: the entry point, which puts the finalizer and
//! scope labels on beside a first start (every status write waits for them: [`MetadataGate`]),
//! and the bookkeeping that keeps a lagging cache from repeating writes. The writes one
//! sandbox costs are kept few: the finalizer, the pod, status at scheduling and at readiness,
//! and an Event at each.

mod abandoned;
mod act;
pub mod claim;
mod cleanup;
mod create;
pub mod decide;
pub mod first_start;
mod hands;
pub mod idle;
mod init;
mod lost;
pub mod observe;
mod orphan;
#[cfg(test)]
mod scenarios;
mod serve;
mod suspend;
mod write;

pub use orphan::{orphan_hint, orphan_sweep_hint};
pub use write::{Apis, FINALIZER, MetadataGate, Superseded};
use write::{SUPERSEDED, Writer, apply_metadata, without_finalizer};

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;

use k8s_openapi::jiff::Timestamp;

use super::placement;
use super::pod::PodConfig;
use super::template::{self, Effective};
pub use crate::controller::context::Note;
use crate::controller::context::{Context, Error};
use agentbox_api::crd::Sandbox;
use agentbox_api::labels;
pub use decide::{FIRST_STATUS_GRACE, defer_first_status};

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

/// Reconciles one Sandbox.
pub async fn reconcile(sbx: Arc<Sandbox>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let name = sbx.name_any();
    let has_finalizer = sbx.finalizers().iter().any(|f| f == FINALIZER);
    if sbx.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Action::await_change());
        }
        // The cache may trail the API server: a reconcile queued before the finalizer went
        // would otherwise clean up again (and leave a cleanup pod behind). Act only on what
        // the API server says now.
        let Some(fresh) = api.get_opt(&name).await? else {
            return Ok(Action::await_change());
        };
        if fresh.uid() != sbx.uid() || !fresh.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(Action::await_change());
        }
        // The on-stop snapshot follows the template's policy when the Sandbox names one.
        let effective = template::resolved_or_own(&ctx.client, &fresh).await?;
        if cleanup::cleanup(&effective, &ctx).await? == cleanup::Cleanup::Pending {
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        // Applying our metadata without the finalizer gives up the operator's hold on it; a
        // finalizer someone else also set (a manifest that carries it) is theirs under
        // server-side apply too, so it goes by a patch of the list, conditioned on the version
        // just returned.
        let applied = apply_metadata(&api, &name, &fresh, false).await?;
        if let Some(patch) = without_finalizer(&applied) {
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        return Ok(Action::await_change());
    }
    if SUPERSEDED.is_stale(&sbx, Instant::now()) {
        // The cache still holds the version this process already wrote over: acting on it
        // would write the same status (and Event) again. The newer version's watch event
        // brings us back; the requeue is the fallback.
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let labels = labels::scope_labels(&sbx.spec.scope);
    let labelled = labels.iter().all(|(k, v)| sbx.labels().get(k) == Some(v));
    if has_finalizer && labelled {
        return start(sbx, ctx, MetadataGate::open()).await;
    }
    // One write puts both the finalizer and the scope labels on the Sandbox, so
    // `kubectl get sbx -l agentbox.dev/user=alice` finds hand-written sandboxes too. It
    // follows the start instead of preceding it or running beside it (issue 32): nothing the
    // start reads or decides depends on it, and on a warm claim it was a third write on the
    // way to Ready, sharing two cores with the adopting patch and the status. A Sandbox
    // deleted before it lands is gone at once, without the cleanup the finalizer runs: its pod
    // goes with it (the Sandbox is the pod's controller owner, so the garbage collector
    // deletes it) and its directory is left to the sweep when that pod is seen going
    // ([`orphan_hint`]), else by the sweep's next pass (docs/sandboxes.md). The write is a
    // server-side apply: on a Sandbox deleted meanwhile it would be a create, which the API
    // server refuses (a Sandbox needs a spec).
    let gate = MetadataGate::deferred();
    let started = start(sbx.clone(), ctx.clone(), gate.clone()).await;
    let written = if gate.pending() {
        apply_metadata(&api, &name, &sbx, true).await.map(drop)
    } else {
        Ok(())
    };
    match &written {
        Ok(()) => SUPERSEDED.record(&sbx, Instant::now()),
        // The versions the start wrote over are the latest there are: the retry acts on them.
        Err(_) => SUPERSEDED.forget(&sbx),
    }
    // The start's error says more than the metadata write's (which fails too when the
    // Sandbox went meanwhile).
    let action = started?;
    written?;
    Ok(action)
}

/// A live Sandbox's reconcile past its metadata: the template and the first reads side by
/// side, then observe → decide → act.
async fn start(sbx: Arc<Sandbox>, ctx: Arc<Context>, gate: MetadataGate) -> Result<Action, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let apis = Apis::new(&ctx, &ns, gate);
    // The template and the reads that need only the Sandbox's name, UID, scope and status
    // (none of which a template sets) go side by side: a first start waits for both.
    // A first start from a template may claim a warm pod: its pools' refills wait until it
    // is done (`pool::quiet`), so that they do not share the CPUs with it.
    let _claiming = (sbx.spec.template_ref.is_some()
        && placement::recorded_pod_name(&sbx).is_none())
    .then(|| ctx.pool_claims.in_flight());
    let (effective, reads) = tokio::join!(
        template::effective_cached(&ctx, &sbx),
        observe::read(&sbx, &ctx, &apis)
    );
    // From here on the sandbox is its effective spec: with a template, resolved against it.
    let (sbx, template) = match effective? {
        Effective::Own => (sbx, None),
        Effective::Templated(resolved, used) => (Arc::new(*resolved), Some(used)),
        Effective::Missing(name) => {
            let (old, st, note) = decide::template_missing(&sbx, &name, Timestamp::now());
            let writer = Writer {
                sbx: &sbx,
                ctx: &ctx,
                apis: &apis,
            };
            writer.transition(&old, &st, Some(note)).await?;
            // The template's watch brings the sandbox back when it is created.
            return Ok(Action::await_change());
        }
    };
    let podcfg = PodConfig::from_config(&ctx.config);
    let world = observe::observe(&sbx, &ctx, &podcfg, template, reads?).await?;
    let plan = decide::decide(&sbx, &world);
    let hands = hands::Hands {
        ctx: &ctx,
        apis: &apis,
        podcfg: &podcfg,
    };
    act::act(&hands, &sbx, world, plan).await
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
