//! The memos the operator keeps in-process between reconciles (what it remembers, not memory
//! limits), shared through the [`Context`](super::context::Context): the node-root checks,
//! the restore refusals this process made, and the directories deletions left to the sweep. A leaf: plain state, no I/O.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use agentbox_api::crd::RestoreRefusal;

// --- node roots (super::noderoot) ---------------------------------------------------------

/// What the helper found on one node for one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The directory is now 0700 root's; the mount flags as reported.
    Checked {
        /// The mount is `nosuid`.
        nosuid: bool,
        /// The mount is `nodev`.
        nodev: bool,
        /// Its mount point as the helper saw it.
        mount: String,
    },
    /// The helper failed; its message.
    Failed(String),
}

/// How long a failed check stands before the next sandbox there tries again (a helper image
/// that was missing may have arrived).
pub const RETRY_FAILED_AFTER: Duration = Duration::from_secs(300);

/// Results per (node, namespace), with when they were recorded.
#[derive(Debug, Default)]
pub struct Checks(Mutex<HashMap<(String, String), (Found, Instant)>>);

impl Checks {
    /// The result for a node and namespace, if the helper has reported (a failure only for
    /// [`RETRY_FAILED_AFTER`]).
    pub fn get(&self, node: &str, ns: &str, now: Instant) -> Option<Found> {
        let m = self.0.lock().ok()?;
        let (found, at) = m.get(&(node.to_string(), ns.to_string()))?;
        let stale = matches!(found, Found::Failed(_))
            && now.saturating_duration_since(*at) >= RETRY_FAILED_AFTER;
        (!stale).then(|| found.clone())
    }

    /// Records a result.
    pub fn record(&self, node: &str, ns: &str, found: Found, now: Instant) {
        if let Ok(mut m) = self.0.lock() {
            m.insert((node.to_string(), ns.to_string()), (found, now));
        }
    }

    /// Forgets the result for a node and namespace: its directory was removed (the namespace
    /// was deleted), so a namespace of that name made again is prepared again.
    pub fn forget(&self, node: &str, ns: &str) {
        if let Ok(mut m) = self.0.lock() {
            m.remove(&(node.to_string(), ns.to_string()));
        }
    }
}

// --- kills for memory (super::oomkill) -----------------------------------------------------

/// The last kill for memory this process announced, by sandbox UID, beside
/// `status.lastOOMKill`: a reconcile that follows the kill's status write closely can read the
/// Sandbox from a cache that has not caught up with it yet, and would announce the kill again.
#[derive(Debug, Default)]
pub struct OomKills(Mutex<HashMap<String, agentbox_api::crd::OomKill>>);

impl OomKills {
    /// The kill announced last for sandbox `uid`.
    pub fn get(&self, uid: &str) -> Option<agentbox_api::crd::OomKill> {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(uid).cloned()
    }

    /// Records the kill announced for sandbox `uid`.
    pub fn record(&self, uid: &str, kill: agentbox_api::crd::OomKill) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.insert(uid.to_string(), kill);
    }

    /// Forgets a deleted sandbox.
    pub fn forget(&self, uid: &str) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(uid);
    }
}

// --- restore refusals (super::restore) ----------------------------------------------------

/// The permanent refusals this process made, by sandbox UID. `status.restoreRefusal` is the
/// record that outlives the process; this one outlives a status that could not keep it — a
/// status write that failed, or a cluster whose Sandbox CRD predates the field and prunes it.
/// Without it such a sandbox would run its refused restore again, guard and exec, on every
/// event of its scope. An entry goes when a start succeeds or the sandbox is deleted.
#[derive(Debug, Default)]
pub struct Refusals(Mutex<HashMap<String, RestoreRefusal>>);

impl Refusals {
    /// The refusal recorded for sandbox `uid`.
    pub fn get(&self, uid: &str) -> Option<RestoreRefusal> {
        // A panic while holding the lock cannot leave a map half-written: use it as it is.
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(uid).cloned()
    }

    /// Records (`Some`) or forgets (`None`) the refusal of sandbox `uid`.
    pub fn set(&self, uid: &str, refusal: Option<&RestoreRefusal>) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match refusal {
            Some(r) => {
                map.insert(uid.to_string(), r.clone());
            }
            None => {
                map.remove(uid);
            }
        }
    }
}

/// When something was last done per sandbox (by uid): the reads of a limited workspace's
/// usage, at most one per interval.
#[derive(Debug, Default)]
pub struct Reads(Mutex<HashMap<String, Instant>>);

impl Reads {
    /// Whether sandbox `uid` is due (nothing done within `every` before `now`); if so, records
    /// `now`. Otherwise how long until it is.
    pub fn due(&self, uid: &str, every: Duration, now: Instant) -> Result<(), Duration> {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match map.get(uid) {
            Some(last) if now.saturating_duration_since(*last) < every => {
                Err(every - now.saturating_duration_since(*last))
            }
            _ => {
                map.insert(uid.to_string(), now);
                Ok(())
            }
        }
    }

    /// Forgets sandbox `uid` (it is gone).
    pub fn forget(&self, uid: &str) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.remove(uid);
    }
}

// --- sweep hints (super::sweep) -----------------------------------------------------------

/// One workspace directory a deletion left to the sweep.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Hint {
    /// The node it is on.
    pub node: String,
    /// The sandbox's (or warm pod's) namespace.
    pub namespace: String,
    /// The directory's name: the sandbox's UID, or a warm pod's `warm-<suffix>` (its own, or
    /// the one a sandbox adopted with it).
    pub dir: String,
}

/// The hints deletions leave, and the namespaces they came from (a pass sweeps those too).
#[derive(Default)]
pub struct Hints {
    pending: Mutex<Vec<Hint>>,
    namespaces: Mutex<BTreeSet<String>>,
    pub(super) wake: Notify,
}

impl Hints {
    /// Leaves a deleted sandbox's directory to the sweep.
    pub fn add(&self, hint: Hint) {
        if let Ok(mut ns) = self.namespaces.lock() {
            ns.insert(hint.namespace.clone());
        }
        if let Ok(mut p) = self.pending.lock() {
            p.push(hint);
        }
        self.wake.notify_one();
    }

    pub(super) fn take(&self) -> Vec<Hint> {
        self.pending
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default()
    }

    pub(super) fn namespaces(&self) -> BTreeSet<String> {
        self.namespaces
            .lock()
            .map(|n| n.clone())
            .unwrap_or_default()
    }

    /// Stops sweeping namespace `ns` in every pass: it is gone and its directories with it.
    pub(super) fn forget_namespace(&self, ns: &str) {
        if let Ok(mut n) = self.namespaces.lock() {
            n.remove(ns);
        }
    }
}
