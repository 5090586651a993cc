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
pub mod decide;
pub mod idle;
mod init;
pub mod observe;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use k8s_openapi::jiff::Timestamp;

use super::pod::PodConfig;
use super::template::{self, Effective};
use crate::controller::context::{Context, Error, FIELD_MANAGER};
use agentbox_api::crd::{Sandbox, SandboxStatus};
use agentbox_api::labels;
pub use decide::{FIRST_STATUS_GRACE, Note, defer_first_status, early_retry};

/// Finalizer that keeps a Sandbox until what needs it is done: the onStop snapshot, its pod
/// asked to go, directories on lost nodes, and its workspace handed to the sweep (which
/// removes the directory just after; without a helper image the finalizer stays).
pub const FINALIZER: &str = "agentbox.dev/workspace";

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
    // `kubectl get sbx -l agentbox.dev/user=alice` finds hand-written sandboxes too. It runs
    // beside the start instead of before it (it is most of a warm claim's first 10 ms):
    // nothing the start reads or decides depends on it, and what the start makes before it
    // lands is not lost if the Sandbox goes meanwhile (its pod is the Sandbox's, garbage
    // collected with it; its directory is the sweep's). Every status write waits for it, so
    // a status the operator wrote always comes with the finalizer on.
    let (tx, rx) = tokio::sync::watch::channel(None);
    let written = async {
        let patched = apply_metadata(&api, &name, &sbx, true).await;
        let landing = match &patched {
            Ok(p) => {
                SUPERSEDED.record(&sbx, Instant::now());
                Landing::Written(Box::new(p.clone()))
            }
            Err(_) => Landing::Failed,
        };
        tx.send_replace(Some(landing));
        patched
    };
    let (written, started) = tokio::join!(written, start(sbx.clone(), ctx, MetadataGate(Some(rx))));
    // The write's own error says more than the start's (which only waited for it).
    written?;
    started
}

/// A live Sandbox's reconcile past its metadata: the template and the first reads side by
/// side, then observe → decide → act.
async fn start(sbx: Arc<Sandbox>, ctx: Arc<Context>, gate: MetadataGate) -> Result<Action, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let apis = Apis::new(&ctx, &ns, gate);
    // The template and the reads that need only the Sandbox's name, UID, scope and status
    // (none of which a template sets) go side by side: a first start waits for both.
    let (effective, reads) = tokio::join!(
        template::effective(&ctx.client, &sbx),
        observe::read(&sbx, &ctx, &apis)
    );
    // From here on the sandbox is its effective spec: with a template, resolved against it.
    let (sbx, template) = match effective? {
        Effective::Own => (sbx, None),
        Effective::Templated(resolved, used) => (Arc::new(*resolved), Some(used)),
        Effective::Missing(name) => {
            let (old, st, note) = decide::template_missing(&sbx, &name, Timestamp::now());
            write_transition(&ctx, &sbx, &apis, &old, &st, Some(note)).await?;
            // The template's watch brings the sandbox back when it is created.
            return Ok(Action::await_change());
        }
    };
    let podcfg = PodConfig::from_config(&ctx.config);
    let world = observe::observe(&sbx, &ctx, &podcfg, template, reads?).await?;
    let plan = decide::decide(&sbx, &world);
    act::act(&sbx, &ctx, &apis, &podcfg, world, plan).await
}

/// How a first reconcile's metadata write ended, for the status writes waiting on it.
#[derive(Clone)]
enum Landing {
    /// Written: the version the API server returned.
    Written(Box<Sandbox>),
    /// Failed: the reconcile returns the write's error.
    Failed,
}

/// What a reconcile's status writes wait for: its metadata write, when it makes one beside
/// the start (see [`reconcile`]).
#[derive(Clone)]
pub struct MetadataGate(Option<tokio::sync::watch::Receiver<Option<Landing>>>);

impl MetadataGate {
    /// No metadata write to wait for.
    pub fn open() -> Self {
        MetadataGate(None)
    }

    /// Waits for the metadata write; returns the version it wrote (`None`: no write).
    pub async fn landed(&self) -> Result<Option<Sandbox>, Error> {
        let Some(rx) = &self.0 else {
            return Ok(None);
        };
        let mut rx = rx.clone();
        let landing = rx
            .wait_for(Option::is_some)
            .await
            .map_err(|_| Error::MetadataNotWritten)?
            .clone();
        match landing {
            Some(Landing::Written(s)) => Ok(Some(*s)),
            _ => Err(Error::MetadataNotWritten),
        }
    }
}

/// How long a written-over version is remembered. Watch events arrive well within it; the
/// bound keeps a missed event (or a write that changed nothing) from stalling a sandbox.
const SUPERSEDED_FOR: Duration = Duration::from_secs(5);

/// Versions of Sandboxes (by UID) that this process has written over, so a reconcile that a
/// lagging cache hands an old version is skipped instead of repeating the writes. One
/// reconcile can write over several versions (the one it read, then the one its metadata
/// write returned).
#[derive(Default)]
pub struct Superseded(Mutex<HashMap<String, (Vec<String>, Instant)>>);

impl Superseded {
    /// Remembers that `sbx`, as read, has just been written over.
    pub fn record(&self, sbx: &Sandbox, now: Instant) {
        let (Some(uid), Some(rv)) = (sbx.uid(), sbx.resource_version()) else {
            return;
        };
        if let Ok(mut m) = self.0.lock() {
            m.retain(|_, (_, at)| now.duration_since(*at) < SUPERSEDED_FOR);
            let e = m.entry(uid).or_insert_with(|| (Vec::new(), now));
            if !e.0.contains(&rv) {
                e.0.push(rv);
            }
            e.1 = now;
        }
    }

    /// Whether `sbx` is a version this process wrote over less than [`SUPERSEDED_FOR`] ago.
    /// Any other version forgets the entry: the cache has caught up.
    pub fn is_stale(&self, sbx: &Sandbox, now: Instant) -> bool {
        let Some(uid) = sbx.uid() else {
            return false;
        };
        let Ok(mut m) = self.0.lock() else {
            return false;
        };
        match m.get(&uid) {
            Some((rvs, at))
                if sbx
                    .metadata
                    .resource_version
                    .as_ref()
                    .is_some_and(|rv| rvs.contains(rv))
                    && now.duration_since(*at) < SUPERSEDED_FOR =>
            {
                true
            }
            Some(_) => {
                m.remove(&uid);
                false
            }
            None => false,
        }
    }
}

static SUPERSEDED: LazyLock<Superseded> = LazyLock::new(Superseded::default);

/// Server-side applies the sandbox controller's part of a Sandbox's status and remembers the
/// version read as written over. Its part is all but `lastSnapshot`, which the snapshot
/// controller owns under its own field manager (applying a copy read from a lagging cache
/// would put back an older snapshot).
/// Waits for the reconcile's metadata write first ([`MetadataGate`]).
async fn write_status(apis: &Apis, sbx: &Sandbox, st: &SandboxStatus) -> Result<(), Error> {
    let written = apis.metadata.landed().await?;
    let mut mine = st.clone();
    mine.last_snapshot = None;
    crate::controller::context::apply_status(&apis.sandboxes, &sbx.name_any(), &mine).await?;
    let now = Instant::now();
    SUPERSEDED.record(sbx, now);
    // The metadata write's version is written over too: seen without this status, it
    // would start the sandbox again.
    if let Some(w) = written {
        SUPERSEDED.record(&w, now);
    }
    Ok(())
}

/// Writes the status and publishes an Event about the transition, both only when the status
/// changed: a sandbox stuck in one state costs no writes on each retry.
async fn write_transition(
    ctx: &Context,
    sbx: &Sandbox,
    apis: &Apis,
    old: &SandboxStatus,
    st: &SandboxStatus,
    note: Option<Note>,
) -> Result<(), Error> {
    if old == st {
        return Ok(());
    }
    if let Some(n) = note {
        crate::controller::context::publish(ctx, sbx, n.type_, &n.reason, n.action, &n.message)
            .await;
    }
    write_status(apis, sbx, st).await
}

/// Server-side applies the metadata the operator owns on a Sandbox: its scope labels and,
/// while it lives, the finalizer.
async fn apply_metadata(
    api: &Api<Sandbox>,
    name: &str,
    sbx: &Sandbox,
    finalizer: bool,
) -> Result<Sandbox, Error> {
    let finalizers: Vec<&str> = if finalizer {
        vec![FINALIZER]
    } else {
        Vec::new()
    };
    let body = serde_json::json!({
        "apiVersion": Sandbox::api_version(&()),
        "kind": Sandbox::kind(&()),
        "metadata": {
            "name": name,
            "labels": labels::scope_labels(&sbx.spec.scope),
            "finalizers": finalizers,
        },
    });
    Ok(api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?)
}

/// The merge patch that takes [`FINALIZER`] off `sbx` and leaves every other finalizer,
/// conditioned on its resourceVersion (a merge patch replaces the whole list); `None` when it
/// has none.
fn without_finalizer(sbx: &Sandbox) -> Option<serde_json::Value> {
    let fs = sbx.finalizers();
    if !fs.iter().any(|f| f == FINALIZER) {
        return None;
    }
    let rest: Vec<&String> = fs.iter().filter(|f| *f != FINALIZER).collect();
    Some(serde_json::json!({
        "metadata": {"resourceVersion": sbx.resource_version(), "finalizers": rest},
    }))
}

/// The API handles one reconcile needs, in the sandbox's namespace.
pub struct Apis {
    /// Sandboxes.
    pub sandboxes: Api<Sandbox>,
    /// Pods: the sandbox's, and the helper pods that work on its node.
    pub pods: Api<Pod>,
    /// NetworkPolicies: the sandbox's deny-egress policy.
    pub policies: Api<NetworkPolicy>,
    /// Services: the one that exposes `spec.ports`.
    pub services: Api<Service>,
    /// The metadata write the status writes wait for.
    pub metadata: MetadataGate,
}

impl Apis {
    /// The handles for namespace `ns`, status writes waiting for `metadata`.
    pub fn new(ctx: &Context, ns: &str, metadata: MetadataGate) -> Self {
        Apis {
            sandboxes: Api::namespaced(ctx.client.clone(), ns),
            pods: Api::namespaced(ctx.client.clone(), ns),
            policies: Api::namespaced(ctx.client.clone(), ns),
            services: Api::namespaced(ctx.client.clone(), ns),
            metadata,
        }
    }
}

/// Deletes an object if it exists. Returns true when it is gone (absent already).
async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<bool, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    // Read first: deleting an object that is already terminating is a write that changes
    // nothing, and cleanup polls.
    match api.get_opt(name).await? {
        None => return Ok(true),
        Some(o) if o.meta().deletion_timestamp.is_some() => return Ok(false),
        Some(_) => {}
    }
    match api.delete(name, &DeleteParams::background()).await {
        Ok(either) => Ok(either.is_right()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(true),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the pod at once (grace 0), without waiting for its kubelet: the pod is on a lost
/// node, whose kubelet cannot confirm anything. Conditioned on its UID, so a pod made since
/// under the same name is never hit. Gone already counts as done.
async fn force_delete(pods: &Api<Pod>, name: &str, uid: Option<String>) -> Result<(), Error> {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid,
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match pods.delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// What `node` looks like now against the operator's node-loss grace (see
/// [`crate::controller::nodeloss::judge`]).
async fn node_health(
    ctx: &Context,
    node: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<crate::controller::nodeloss::NodeHealth, Error> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(ctx.client.clone());
    let seen = nodes.get_opt(node).await?;
    let grace = Duration::from_secs(ctx.config.node_loss_grace_seconds);
    Ok(crate::controller::nodeloss::judge(
        node,
        seen.as_ref(),
        now,
        grace,
    ))
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

    #[test]
    fn the_finalizer_comes_off_by_a_conditioned_patch_that_keeps_the_others() {
        let mut s: Sandbox = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s", "resourceVersion": "9",
                "finalizers": ["example.com/keep", FINALIZER]},
            "spec": {"image": "i", "scope": {"kind": "Global"}},
        }))
        .unwrap();
        assert_eq!(
            without_finalizer(&s),
            Some(serde_json::json!({"metadata": {"resourceVersion": "9",
                "finalizers": ["example.com/keep"]}}))
        );
        s.metadata.finalizers = Some(vec!["example.com/keep".into()]);
        assert_eq!(without_finalizer(&s), None);
    }

    #[test]
    fn a_written_over_version_is_skipped_until_a_newer_one_or_the_bound() {
        let sbx = |rv: &str| -> Sandbox {
            let mut s: Sandbox = serde_json::from_value(serde_json::json!({
                "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
                "metadata": {"name": "s", "uid": "u1", "resourceVersion": rv},
                "spec": {"image": "i", "scope": {"kind": "Global"}},
            }))
            .unwrap();
            s.metadata.namespace = Some("n".into());
            s
        };
        let reg = Superseded::default();
        let t = Instant::now();
        assert!(!reg.is_stale(&sbx("1"), t), "nothing written yet");
        reg.record(&sbx("1"), t);
        assert!(reg.is_stale(&sbx("1"), t + Duration::from_millis(10)));
        assert!(
            !reg.is_stale(&sbx("2"), t + Duration::from_millis(20)),
            "newer version"
        );
        assert!(
            !reg.is_stale(&sbx("1"), t + Duration::from_millis(30)),
            "entry forgotten"
        );
        reg.record(&sbx("3"), t);
        reg.record(&sbx("4"), t);
        assert!(reg.is_stale(&sbx("3"), t), "every version written over");
        assert!(reg.is_stale(&sbx("4"), t));
        assert!(!reg.is_stale(&sbx("4"), t + SUPERSEDED_FOR), "bounded");
    }
}
