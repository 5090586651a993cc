//! The operator's watch caches for the claim path (issue 32): everything a sandbox's first
//! start reads — its template, its scope's guard Lease, its deny-egress NetworkPolicy, its
//! scope's snapshots — comes from a reflector Store that a watch keeps, not from a GET or a
//! LIST on each reconcile. The same watches wake the sandboxes (they replace the controller's
//! own watches of those kinds, so there is one watch per kind, not two).
//!
//! What a cache may not know yet, and how each read copes:
//! - **before its first listing** (a process that has just started): every read waits for it
//!   ([`synced`]); after it, an object that existed before the watch is there. That is what
//!   makes a pod adopted just before a crash visible to the next operator.
//! - **an object written a moment ago by someone else**: a template missing from the cache is
//!   read from the API server before the sandbox is told it is missing (a miss costs a GET, a
//!   hit none); a Lease or NetworkPolicy a moment old is corrected by its own watch event,
//!   which brings the sandbox back; a snapshot that became Ready in the same instant as the
//!   Sandbox's create may be missed by a `Latest` restore (the restore then starts from the
//!   snapshot before it; docs/sandboxes.md says so).
//! - **this process's own writes**: the pods this process made or adopted for a sandbox whose
//!   status does not name them yet are remembered ([`OwnPods`]) and read from the API server,
//!   so a reconcile that runs before the watch has caught up never makes or adopts a second
//!   pod.
//!
//! Scenario tests (an in-process fake API server with no watches) run without caches: every
//! read then goes to the API server, as before.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::Stream;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};

use super::error::Error;
use super::watch;
use agentbox_api::crd::{SandboxSnapshot, SandboxTemplate};

/// How long a read waits for a cache's first listing.
pub const SYNC_WAIT: Duration = Duration::from_secs(10);

/// The caches the sandbox controller's watches keep.
pub struct Caches {
    /// SandboxTemplates.
    pub templates: Store<SandboxTemplate>,
    /// The scopes' guard Leases: every Lease labelled with a scope key
    /// (`agentbox.dev/scope-key`), the operator's and any harness's alike.
    pub leases: Store<Lease>,
    /// The operator's NetworkPolicies (same label): the sandboxes' deny-egress policies.
    pub policies: Store<NetworkPolicy>,
    /// SandboxSnapshots.
    pub snapshots: Store<SandboxSnapshot>,
    /// Pods this process made or adopted for sandboxes whose status may not name them yet.
    pub own_pods: OwnPods,
    /// Warm pods this process's claims are adopting or have just adopted.
    pub taking: Taking,
}

/// The writers that feed [`Caches`], handed to the watches.
pub struct Writers {
    /// Feeds [`Caches::templates`].
    pub templates: Writer<SandboxTemplate>,
    /// Feeds [`Caches::leases`].
    pub leases: Writer<Lease>,
    /// Feeds [`Caches::policies`].
    pub policies: Writer<NetworkPolicy>,
    /// Feeds [`Caches::snapshots`].
    pub snapshots: Writer<SandboxSnapshot>,
}

impl Caches {
    /// Empty caches and their writers.
    pub fn new() -> (Caches, Writers) {
        let (templates, tw) = reflector::store();
        let (leases, lw) = reflector::store();
        let (policies, pw) = reflector::store();
        let (snapshots, sw) = reflector::store();
        (
            Caches {
                templates,
                leases,
                policies,
                snapshots,
                own_pods: OwnPods::default(),
                taking: Taking::default(),
            },
            Writers {
                templates: tw,
                leases: lw,
                policies: pw,
                snapshots: sw,
            },
        )
    }
}

/// Waits until `store` holds a complete listing (see the module's documentation). A store no
/// watch feeds any more (the controller stopped) has nothing more to wait for.
pub async fn synced<K>(store: &Store<K>, what: &'static str) -> Result<(), Error>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    if listed(store, SYNC_WAIT).await {
        Ok(())
    } else {
        Err(Error::CacheNotSynced(what, SYNC_WAIT))
    }
}

/// How often a wait for a first listing looks again (see [`listed`]).
const REPOLL: Duration = Duration::from_millis(50);

/// Waits up to `wait` until `store` holds a complete listing (or no watch feeds it any more);
/// whether it does. kube's `Store::wait_until_ready` wakes only one of the tasks waiting at
/// once (its one-shot channel keeps the last waker it was polled with), so a start-up's
/// reconciles that waited side by side for a cache sat out the whole wait but one; each
/// waiter here looks again every [`REPOLL`].
pub async fn listed<K>(store: &Store<K>, wait: Duration) -> bool
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(left.min(REPOLL), store.wait_until_ready()).await {
            Ok(_) => return true,
            Err(_) if left <= REPOLL => return false,
            Err(_) => {}
        }
    }
}

/// The object `name` of namespace `ns` in `store`, once it has listed.
pub async fn get<K>(
    store: &Store<K>,
    what: &'static str,
    ns: &str,
    name: &str,
) -> Result<Option<K>, Error>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    synced(store, what).await?;
    Ok(store
        .get(&ObjectRef::new(name).within(ns))
        .map(|o| o.as_ref().clone()))
}

/// The annotation `kubectl apply` (client-side) keeps a copy of the whole applied object in.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// What a watch cache drops of every object before keeping it: its managed fields and
/// `kubectl apply`'s copy of the object ([`LAST_APPLIED`]). No controller reads either, and
/// together they are most of a small object's size: server-side apply's field sets of a
/// Sandbox written by its creator and by the operator's status take more memory, parsed,
/// than its spec and status together (docs/benchmarks.md, "Memory per Sandbox").
pub fn slim<K: Resource>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(LAST_APPLIED);
        if a.is_empty() {
            meta.annotations = None;
        }
    }
}

/// A watch of `api` kept in `writer`'s store, its objects as triggers; [`slim`]med first.
pub fn reflect<K>(
    api: Api<K>,
    wc: watcher::Config,
    writer: Writer<K>,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let objects = watcher(api, wc)
        .backoff(watch::TriggerBackoff::default())
        .modify(slim);
    reflector::reflector(writer, objects).touched_objects()
}

/// How long a pod written by this process is looked up from the API server for its sandbox:
/// far longer than a watch event takes, short enough that the map stays small.
const OWN_POD_FOR: Duration = Duration::from_secs(60);

/// Pods (by name) this process made or adopted, by the UID of the sandbox they are for: until
/// the status names them, a reconcile reads them from the API server (the pod cache may not
/// have seen the write yet).
#[derive(Default)]
pub struct OwnPods(Mutex<HashMap<String, (String, Instant)>>);

impl OwnPods {
    /// Remembers that this process wrote pod `pod` for the sandbox with UID `sandbox`.
    pub fn wrote(&self, sandbox: &str, pod: &str, now: Instant) {
        if let Ok(mut m) = self.0.lock() {
            m.retain(|_, (_, at)| now.saturating_duration_since(*at) < OWN_POD_FOR);
            m.insert(sandbox.to_string(), (pod.to_string(), now));
        }
    }

    /// The pod this process wrote for the sandbox with UID `sandbox` less than
    /// [`OWN_POD_FOR`] ago.
    pub fn of(&self, sandbox: &str, now: Instant) -> Option<String> {
        let m = self.0.lock().ok()?;
        m.get(sandbox)
            .filter(|(_, at)| now.saturating_duration_since(*at) < OWN_POD_FOR)
            .map(|(p, _)| p.clone())
    }
}

/// How long a pod this process adopted stays out of its claims' candidates: far longer than
/// the pod watch takes to show the adoption.
const TAKEN_FOR: Duration = Duration::from_secs(30);

/// Warm pods (by UID) this process's claims are adopting or have just adopted.
#[derive(Default)]
pub struct Taking(Mutex<HashMap<String, Instant>>);

impl Taking {
    /// Marks pod `uid` as being adopted; false when another claim of this process has it.
    pub fn take(&self, uid: &str, now: Instant) -> bool {
        let Ok(mut m) = self.0.lock() else {
            return true;
        };
        m.retain(|_, at| now.saturating_duration_since(*at) < TAKEN_FOR);
        if m.contains_key(uid) {
            return false;
        }
        m.insert(uid.to_string(), now);
        true
    }

    /// The adoption of pod `uid` failed: other claims may try it.
    pub fn release(&self, uid: &str) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::ResourceExt;

    #[test]
    fn a_written_pod_is_remembered_for_its_sandbox_for_a_while() {
        let own = OwnPods::default();
        let t = Instant::now();
        assert_eq!(own.of("u1", t), None);
        own.wrote("u1", "py-warm-abcde", t);
        assert_eq!(own.of("u1", t).as_deref(), Some("py-warm-abcde"));
        assert_eq!(own.of("u2", t), None, "per sandbox");
        own.wrote("u1", "sbx-s", t);
        assert_eq!(own.of("u1", t).as_deref(), Some("sbx-s"), "the latest");
        assert_eq!(own.of("u1", t + OWN_POD_FOR), None, "bounded");
        own.wrote("u2", "x", t + OWN_POD_FOR);
        assert_eq!(own.0.lock().unwrap().len(), 1, "old entries go");
    }

    #[test]
    fn a_pod_being_adopted_is_not_tried_by_another_claim_until_released_or_long_after() {
        let t = Taking::default();
        let now = Instant::now();
        assert!(t.take("p1", now));
        assert!(!t.take("p1", now), "taken");
        assert!(t.take("p2", now), "another pod");
        t.release("p1");
        assert!(t.take("p1", now), "released after a failed write");
        assert!(t.take("p1", now + TAKEN_FOR), "forgotten after the bound");
    }

    #[tokio::test(start_paused = true)]
    async fn every_task_waiting_for_a_first_listing_sees_it() {
        let (caches, mut w) = Caches::new();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let store = caches.templates.clone();
                tokio::spawn(async move { listed(&store, SYNC_WAIT).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(10)).await;
        w.templates.apply_watcher_event(&watcher::Event::Init);
        w.templates.apply_watcher_event(&watcher::Event::InitDone);
        let started = tokio::time::Instant::now();
        for waiter in waiters {
            assert!(waiter.await.unwrap(), "listed");
        }
        assert!(
            started.elapsed() <= REPOLL,
            "each within a re-poll, not the whole wait: {:?}",
            started.elapsed()
        );
        // A store that never lists: false after the wait.
        let (never, _w) = Caches::new();
        assert!(!listed(&never.leases, Duration::from_secs(1)).await);
    }

    #[tokio::test]
    async fn a_read_waits_for_the_first_listing_and_then_reads_the_store() {
        let (caches, mut w) = Caches::new();
        let t: SandboxTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxTemplate",
            "metadata": {"name": "tpl", "namespace": "team"}, "spec": {"image": "busybox"},
        }))
        .unwrap();
        let read = get(&caches.templates, "templates", "team", "tpl");
        tokio::pin!(read);
        assert!(
            futures::poll!(&mut read).is_pending(),
            "not listed yet: the read waits"
        );
        w.templates.apply_watcher_event(&watcher::Event::Init);
        w.templates
            .apply_watcher_event(&watcher::Event::InitApply(t.clone()));
        w.templates.apply_watcher_event(&watcher::Event::InitDone);
        assert_eq!(
            read.await.unwrap().map(|t| t.name_any()),
            Some("tpl".into())
        );
        assert!(
            get(&caches.templates, "templates", "other", "tpl")
                .await
                .unwrap()
                .is_none(),
            "by namespace"
        );
    }
}
