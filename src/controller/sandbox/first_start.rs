//! A new Sandbox's first reconcile, begun from its watch event at once (issue 32).
//!
//! kube-runtime's controller hands every event to its scheduler, a `DelayQueue` that rounds a
//! request due now up to the next whole millisecond of the timer wheel, and tokio's timer fires
//! on its own millisecond tick after that: 1–2 ms between a Sandbox's watch event and its
//! reconcile, on a warm claim's path of about 15. So the sandbox controller's watch stream
//! offers each Sandbox that has never been reconciled (no status yet) to [`FirstStarts`], which
//! starts its reconcile in a task of its own right away.
//!
//! The controller still gets the same event and reconciles the same object; [`FirstStarts`]
//! serialises the two by the Sandbox's UID ([`FirstStarts::serialised`], which the controller's
//! reconcile goes through too), so they never run side by side. Whichever comes second sees the
//! version the first wrote over ([`super::write::Superseded`]) and only requeues; after a failed first
//! start it is the retry (at once, or after that short requeue when the failed start wrote).
//! The first starts in flight are bounded ([`MAX_IN_FLIGHT`]): beyond that a new Sandbox waits
//! for the controller's queue, as before.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Semaphore;

use agentbox_api::crd::Sandbox;

/// How many first starts may run from watch events at once. A burst beyond it goes through the
/// controller's queue (a millisecond or two later), which has no bound of its own.
pub const MAX_IN_FLIGHT: usize = 16;

/// Whether the watch event of `sbx` may start its reconcile at once: a live Sandbox that no
/// reconcile has written yet (no status: the API server ignores a status sent with the create).
pub fn is_first(sbx: &Sandbox) -> bool {
    sbx.metadata.deletion_timestamp.is_none() && sbx.status.is_none() && sbx.uid().is_some()
}

/// The first starts in flight and the per-Sandbox locks that keep them apart from the
/// controller's own reconciles (see the module's documentation).
pub struct FirstStarts {
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    permits: Arc<Semaphore>,
}

impl Default for FirstStarts {
    fn default() -> Self {
        Self::new(MAX_IN_FLIGHT)
    }
}

impl FirstStarts {
    /// At most `max` first starts in flight.
    pub fn new(max: usize) -> Self {
        Self {
            locks: Mutex::new(HashMap::new()),
            permits: Arc::new(Semaphore::new(max)),
        }
    }

    /// Starts `reconcile` for `sbx` in a task of its own when `sbx` is a first start
    /// ([`is_first`]) and fewer than the bound are in flight; whether it did. The task runs
    /// under the Sandbox's lock ([`Self::serialised`]).
    pub fn offer<F>(self: &Arc<Self>, sbx: &Sandbox, reconcile: impl FnOnce() -> F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Some(uid) = sbx.uid().filter(|_| is_first(sbx)) else {
            return false;
        };
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return false;
        };
        let this = self.clone();
        let run = reconcile();
        tokio::spawn(async move {
            this.serialised(&uid, run).await;
            drop(permit);
        });
        true
    }

    /// Runs `work` while holding the lock of the Sandbox with UID `uid`: a first start and the
    /// controller's reconcile of the same Sandbox never run at once. The lock goes from the map
    /// when nobody else holds or waits for it.
    pub async fn serialised<T>(&self, uid: &str, work: impl Future<Output = T>) -> T {
        let lock = self.map().entry(uid.to_string()).or_default().clone();
        let out = {
            let _held = lock.lock().await;
            work.await
        };
        let mut map = self.map();
        // The map's and this one: clones are only made under the map's lock, so nobody waits.
        if Arc::strong_count(&lock) == 2 {
            map.remove(uid);
        }
        out
    }

    /// How many Sandboxes have a lock now (held or waited for).
    pub fn locked(&self) -> usize {
        self.map().len()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<tokio::sync::Mutex<()>>>> {
        // A panic while the map was held leaves it consistent (every change is one call).
        self.locks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The Sandboxes' own watch as the controller's stream, kept by the sandbox controller (not
/// by `Controller::new`) so that a new Sandbox's event starts its first reconcile at once,
/// ahead of the controller's queue: each Sandbox applied is offered to `starts`
/// ([`FirstStarts::offer`]), which runs `run` on it. `listed` is told once the first listing
/// has passed the reflector (the first pass counts from then).
pub fn offered<S, R, F>(
    events: S,
    listed: tokio::sync::watch::Sender<bool>,
    starts: Arc<FirstStarts>,
    run: R,
) -> impl Stream<Item = Result<Sandbox, watcher::Error>> + Send + 'static
where
    S: Stream<Item = Result<watcher::Event<Sandbox>, watcher::Error>> + Send + 'static,
    R: Fn(Arc<Sandbox>) -> F + Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    events
        .inspect(move |e| {
            if let Ok(watcher::Event::InitDone) = e {
                listed.send_replace(true);
            }
        })
        .applied_objects()
        .inspect(move |s| {
            if let Ok(sbx) = s {
                starts.offer(sbx, || run(Arc::new(sbx.clone())));
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    fn sandbox(extra: serde_json::Value) -> Sandbox {
        let mut v = json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s", "namespace": "team", "uid": "u-1"},
            "spec": {"image": "busybox", "scope": {"kind": "Session", "session": "a"}},
        });
        if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
            for (k, x) in extra {
                if k == "metadata" {
                    for (mk, mx) in x.as_object().into_iter().flatten() {
                        v["metadata"][mk] = mx.clone();
                    }
                } else {
                    v.insert(k.clone(), x.clone());
                }
            }
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_a_live_sandbox_without_a_status_is_a_first_start() {
        assert!(is_first(&sandbox(json!({}))));
        assert!(!is_first(&sandbox(json!({"status": {"phase": "Pending"}}))));
        assert!(!is_first(&sandbox(
            json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}})
        )));
        assert!(!is_first(&sandbox(json!({"metadata": {"uid": null}}))));
    }

    // Paused clocks: the sleeps order the tasks, not the machine's speed.
    #[tokio::test(start_paused = true)]
    async fn a_first_start_and_the_controllers_reconcile_of_one_sandbox_never_overlap() {
        let starts = Arc::new(FirstStarts::new(4));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let work = |running: Arc<AtomicUsize>, most: Arc<AtomicUsize>| async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            running.fetch_sub(1, Ordering::SeqCst);
        };
        let (r, m) = (running.clone(), most.clone());
        assert!(starts.offer(&sandbox(json!({})), || work(r, m)));
        // The controller's reconcile of the same UID, a moment later, waits for the first.
        tokio::task::yield_now().await;
        starts
            .serialised("u-1", work(running.clone(), most.clone()))
            .await;
        assert_eq!(most.load(Ordering::SeqCst), 1, "never two at once");
        // Another Sandbox's reconcile is not held up by it.
        let (r, m) = (running.clone(), most.clone());
        let other = sandbox(json!({"metadata": {"uid": "u-2"}}));
        assert!(starts.offer(&other, || work(r, m)));
        tokio::task::yield_now().await;
        starts
            .serialised("u-3", work(running.clone(), most.clone()))
            .await;
        assert_eq!(most.load(Ordering::SeqCst), 2, "two sandboxes side by side");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(starts.locked(), 0, "no lock is kept once nobody holds it");
    }

    #[tokio::test(start_paused = true)]
    async fn beyond_the_bound_and_for_a_sandbox_with_a_status_the_controller_does_it() {
        let starts = Arc::new(FirstStarts::new(1));
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        assert!(starts.offer(&sandbox(json!({})), || async move {
            let _ = rx.await;
        }));
        let mut ran = false;
        assert!(
            !starts.offer(&sandbox(json!({"metadata": {"uid": "u-2"}})), || {
                ran = true;
                async {}
            }),
            "the bound is reached"
        );
        assert!(!ran, "a refused offer does not even build the reconcile");
        assert!(!starts.offer(&sandbox(json!({"status": {}})), || async {}));
        tx.send(()).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            starts.offer(&sandbox(json!({"metadata": {"uid": "u-3"}})), || async {}),
            "a permit is back once the first start ended"
        );
    }
}
