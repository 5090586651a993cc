//! The sandbox controller's writes: the metadata write (finalizer and scope labels) and the
//! gate that says when it is made, the status and transition writes with the versions they
//! wrote over, and deletes. The steps, `cleanup` and `abandoned` write through these.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};

use crate::controller::context::{Context, Error, FIELD_MANAGER, Note};
use agentbox_api::crd::{Sandbox, SandboxStatus};
use agentbox_api::labels;

/// Finalizer that keeps a Sandbox until what needs it is done: the onStop snapshot, its pod
/// asked to go, directories on lost nodes, and its workspace handed to the sweep (which
/// removes the directory just after; without a helper image the finalizer stays).
pub const FINALIZER: &str = "agentbox.dev/workspace";

/// When a reconcile's metadata write (finalizer and scope labels) is made: on already (or
/// not this reconcile's business: the cleanup), or following this reconcile's start
/// ([`with_metadata`]), whose status writes then do not wait for it; a step that needs the
/// finalizer on makes it first ([`MetadataGate::needed`]). Clones share whether it is made.
#[derive(Clone, Debug)]
pub struct MetadataGate(Option<Arc<AtomicBool>>);

impl MetadataGate {
    /// Nothing to wait for.
    pub fn open() -> Self {
        MetadataGate(None)
    }

    /// The metadata write follows the start.
    pub fn deferred() -> Self {
        MetadataGate(Some(Arc::new(AtomicBool::new(false))))
    }

    /// Whether the metadata write is still to come.
    pub(super) fn pending(&self) -> bool {
        self.0.as_ref().is_some_and(|w| !w.load(Ordering::Acquire))
    }

    /// Puts the finalizer and scope labels on now when they are still to come: for a step
    /// whose cleanup needs the finalizer (a shutdown's delete).
    pub async fn needed(&self, api: &Api<Sandbox>, sbx: &Sandbox) -> Result<(), Error> {
        if let Some(written) = &self.0
            && !written.load(Ordering::Acquire)
        {
            apply_metadata(api, &sbx.name_any(), sbx, true).await?;
            written.store(true, Ordering::Release);
        }
        Ok(())
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

    /// Forgets what this process wrote over of the Sandbox `sbx` is a version of.
    pub fn forget(&self, sbx: &Sandbox) {
        if let (Some(uid), Ok(mut m)) = (sbx.uid(), self.0.lock()) {
            m.remove(&uid);
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

pub(super) static SUPERSEDED: LazyLock<Superseded> = LazyLock::new(Superseded::default);

/// One Sandbox's status and Events in one reconcile: what `act`'s steps, `cleanup` and
/// `abandoned` write through.
#[derive(Clone, Copy)]
pub(super) struct Writer<'a> {
    /// The Sandbox as read (its version is the one the status writes over).
    pub sbx: &'a Sandbox,
    /// The operator's context (the Event recorder).
    pub ctx: &'a Context,
    /// The namespace's API handles.
    pub apis: &'a Apis,
}

impl Writer<'_> {
    /// Server-side applies the sandbox controller's part of the status and remembers the
    /// version read as written over. Its part is all but `lastSnapshot`, which the snapshot
    /// controller owns under its own field manager (applying a copy read from a lagging cache
    /// would put back an older snapshot). On a first reconcile, whose metadata write follows
    /// ([`MetadataGate::deferred`]), the version this write returns is written over too: seen
    /// without the finalizer, it would start the sandbox again.
    pub async fn status(&self, st: &SandboxStatus) -> Result<(), Error> {
        write_status(self.apis, self.sbx, st).await
    }

    /// Writes the status and publishes an Event about the transition, both only when the
    /// status changed: a sandbox stuck in one state costs no writes on each retry.
    pub async fn transition(
        &self,
        old: &SandboxStatus,
        st: &SandboxStatus,
        note: Option<Note>,
    ) -> Result<(), Error> {
        if old == st {
            return Ok(());
        }
        self.publish(note).await;
        self.status(st).await
    }

    /// Publishes `note`, if any, about the sandbox.
    pub async fn publish(&self, note: Option<Note>) {
        if let Some(n) = note {
            crate::controller::context::publish(
                self.ctx, self.sbx, n.type_, &n.reason, n.action, &n.message,
            )
            .await;
        }
    }
}

/// [`Writer::status`] of `sbx` (also of a version other than the reconciled one: the idle
/// suspension's, written over the version its mode change returned).
pub(super) async fn write_status(
    apis: &Apis,
    sbx: &Sandbox,
    st: &SandboxStatus,
) -> Result<(), Error> {
    let mut mine = st.clone();
    mine.last_snapshot = None;
    let named = apis.named.lock().ok().and_then(|n| n.clone());
    let condition = naming_precondition(sbx, st, named.as_deref());
    let mut body = serde_json::json!({
        "apiVersion": Sandbox::api_version(&()),
        "kind": Sandbox::kind(&()),
        "status": mine,
    });
    if let Some(rv) = condition {
        // Server-side apply takes a resourceVersion in the object as a precondition.
        body["metadata"] = serde_json::json!({"resourceVersion": rv});
    }
    let written = match apis
        .sandboxes
        .patch_status(
            &sbx.name_any(),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
    {
        Ok(w) => w,
        Err(kube::Error::Api(e)) if e.code == 409 && condition.is_some() => {
            return Err(Error::PodNamedElsewhere(
                st.pod_name.clone().unwrap_or_default(),
            ));
        }
        Err(e) => return Err(e.into()),
    };
    if let (Some(pod), Ok(mut n)) = (&st.pod_name, apis.named.lock()) {
        *n = Some(pod.clone());
    }
    let now = Instant::now();
    SUPERSEDED.record(sbx, now);
    if apis.metadata.pending() {
        SUPERSEDED.record(&written, now);
    }
    Ok(())
}

/// The resourceVersion a status write is conditioned on: the version read, when the write
/// names a pod that neither that version's status nor an earlier write of this reconcile
/// named. Two operators starting one sandbox at once (a leader change) can each adopt a
/// warm pod, or one adopt and the other make the cold pod; unconditioned, the later status
/// write would name its own pod over a Ready status that named the other, and the pod the
/// first named (that a harness may be running in) would be deleted as the second. With the
/// precondition only one write names a pod; the other gets a conflict and its pod goes as
/// the second ([`super::serve`]).
pub(super) fn naming_precondition<'a>(
    read: &'a Sandbox,
    st: &SandboxStatus,
    named: Option<&str>,
) -> Option<&'a str> {
    let pod = st.pod_name.as_deref()?;
    let was = read.status.as_ref().and_then(|s| s.pod_name.as_deref());
    if was == Some(pod) || named == Some(pod) {
        return None;
    }
    read.metadata.resource_version.as_deref()
}

/// Server-side applies the metadata the operator owns on a Sandbox: its scope labels and,
/// while it lives, the finalizer.
pub(super) async fn apply_metadata(
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

/// Runs a live Sandbox's `start` with its metadata (finalizer and scope labels) in place:
/// when both are on already, with the gate open; else with a deferred gate, and the one
/// write that puts both on follows the start instead of preceding it or running beside it
/// (issue 32): nothing the start reads or decides depends on it, and on a warm claim it was
/// a third write on the way to Ready, sharing two cores with the adopting patch and the
/// status. This way `kubectl get sbx -l agentbox.dev/user=alice` finds hand-written
/// sandboxes too. A Sandbox deleted before it lands is gone at once, without the cleanup the
/// finalizer runs: its pod goes with it (the Sandbox is the pod's controller owner, so the
/// garbage collector deletes it) and its directory is left to the sweep when that pod is
/// seen going (`orphan_hint`), else by the sweep's next pass (docs/sandboxes.md). The write
/// is a server-side apply: on a Sandbox deleted meanwhile it would be a create, which the API
/// server refuses (a Sandbox needs a spec).
pub(super) async fn with_metadata<F, Fut>(
    sbx: &Sandbox,
    ctx: &Context,
    start: F,
) -> Result<kube::runtime::controller::Action, Error>
where
    F: FnOnce(MetadataGate) -> Fut,
    Fut: std::future::Future<Output = Result<kube::runtime::controller::Action, Error>>,
{
    let has_finalizer = sbx.finalizers().iter().any(|f| f == FINALIZER);
    let wanted = labels::scope_labels(&sbx.spec.scope);
    let labelled = wanted.iter().all(|(k, v)| sbx.labels().get(k) == Some(v));
    if has_finalizer && labelled {
        return start(MetadataGate::open()).await;
    }
    let gate = MetadataGate::deferred();
    let started = start(gate.clone()).await;
    let written = match (gate.pending(), sbx.namespace()) {
        (true, Some(ns)) => {
            let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
            apply_metadata(&api, &sbx.name_any(), sbx, true)
                .await
                .map(drop)
        }
        (true, None) => Err(Error::NotNamespaced),
        (false, _) => Ok(()),
    };
    match &written {
        Ok(()) => SUPERSEDED.record(sbx, Instant::now()),
        // The versions the start wrote over are the latest there are: the retry acts on them.
        Err(_) => SUPERSEDED.forget(sbx),
    }
    // The start's error says more than the metadata write's (which fails too when the
    // Sandbox went meanwhile).
    let action = started?;
    written?;
    Ok(action)
}

/// The merge patch that takes [`FINALIZER`] off `sbx` and leaves every other finalizer,
/// conditioned on its resourceVersion (a merge patch replaces the whole list); `None` when it
/// has none.
pub(super) fn without_finalizer(sbx: &Sandbox) -> Option<serde_json::Value> {
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
    /// The pod a status write of this reconcile has named ([`naming_precondition`]).
    named: Mutex<Option<String>>,
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
            named: Mutex::new(None),
        }
    }
}

/// Deletes an object if it exists. Returns true when it is gone (absent already).
pub(super) async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<bool, Error>
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
pub(super) async fn force_delete(
    pods: &Api<Pod>,
    name: &str,
    uid: Option<String>,
) -> Result<(), Error> {
    delete_by_uid(pods, name, uid, Some(0)).await
}

/// Deletes pod `name` with `grace` seconds (`None`: its usual grace), conditioned on its UID
/// (a pod made since under the same name is never hit); gone, or another pod by now, counts
/// as done.
pub(super) async fn delete_by_uid(
    pods: &Api<Pod>,
    name: &str,
    uid: Option<String>,
    grace: Option<u32>,
) -> Result<(), Error> {
    let dp = DeleteParams {
        grace_period_seconds: grace,
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn only_a_write_that_names_a_new_pod_is_conditioned_on_the_version_read() {
        let read = |pod: Option<&str>| -> Sandbox {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
                "metadata": {"name": "s", "resourceVersion": "7"},
                "spec": {"image": "i", "scope": {"kind": "Global"}},
                "status": {"podName": pod},
            }))
            .unwrap()
        };
        let naming = |pod: Option<&str>| SandboxStatus {
            pod_name: pod.map(String::from),
            ..SandboxStatus::default()
        };
        // A claim's or a cold start's first naming of its pod.
        assert_eq!(
            naming_precondition(&read(None), &naming(Some("warm-a")), None),
            Some("7")
        );
        // Another pod than the one read: a pod found again after the named one went.
        assert_eq!(
            naming_precondition(&read(Some("warm-a")), &naming(Some("warm-b")), None),
            Some("7")
        );
        // The pod the status names already, or none: nothing to lose to another writer.
        assert_eq!(
            naming_precondition(&read(Some("warm-a")), &naming(Some("warm-a")), None),
            None
        );
        assert_eq!(
            naming_precondition(&read(Some("warm-a")), &naming(None), None),
            None
        );
        // This reconcile's own write named it: its next status write builds on that one.
        assert_eq!(
            naming_precondition(&read(None), &naming(Some("warm-a")), Some("warm-a")),
            None
        );
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
