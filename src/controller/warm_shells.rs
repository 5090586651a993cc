//! Open shells in warm pods, for the claim: a pool opens one persistent shell
//! ([`agentbox_api::exec::session::Session`]) in each warm pod when it initialises it, and a sandbox
//! that adopts the pod takes that shell for its start's one command. A command over an open
//! shell costs a few milliseconds; a new exec (a WebSocket upgrade through the API server and
//! the kubelet, and a process the runtime starts in the container) costs most of a claim.
//!
//! A shell is taken at most once (a map removal), keyed by the pod's UID, so a pod made again
//! under the same name never gets another pod's shell. A claim takes it before its adopting
//! write (a pool reconcile that sees the pod claimed drops the shells of pods no longer warm)
//! and puts it back when the write fails. The taker drops it after its command:
//! the shell's stdin closes and it exits, so no process of the pool's outlives the claim in a
//! sandbox's pod. Shells of pods that are gone or no longer warm are dropped at each pool
//! reconcile ([`Shells::retain`]); only the leader, which runs the pools, holds any.

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use agentbox_api::exec::session::Session;

/// The open shells of warm pods, by pod UID.
#[derive(Default)]
pub struct Shells {
    open: Mutex<HashMap<String, Open>>,
}

struct Open {
    /// The pool (`namespace/name`) whose warm pod it is in.
    pool: String,
    shell: Session,
}

impl Shells {
    /// Keeps `shell`, open in warm pod `uid` of `pool` (`namespace/name`), replacing any older
    /// one; drops shells that have ended meanwhile (their pods are gone, perhaps with a pool
    /// whose reconciles ended with it).
    pub fn put(&self, pool: &str, uid: &str, shell: Session) {
        if let Ok(mut m) = self.open.lock() {
            m.retain(|_, o| !o.shell.has_ended());
            m.insert(
                uid.to_string(),
                Open {
                    pool: pool.to_string(),
                    shell,
                },
            );
        }
    }

    /// Takes the shell of the pod with UID `uid`, if one is open; nobody else gets it.
    pub fn take(&self, uid: &str) -> Option<Session> {
        self.take_with_pool(uid).map(|(_, shell)| shell)
    }

    /// [`Shells::take`], with the pool (`namespace/name`) it was kept for, to [`Shells::put`]
    /// it back.
    pub fn take_with_pool(&self, uid: &str) -> Option<(String, Session)> {
        self.open
            .lock()
            .ok()?
            .remove(uid)
            .map(|o| (o.pool, o.shell))
    }

    /// Whether the pod with UID `uid` has a shell.
    pub fn has(&self, uid: &str) -> bool {
        self.open.lock().is_ok_and(|m| m.contains_key(uid))
    }

    /// Drops the shells of `pool`'s pods whose UIDs are not in `warm` (claimed without taking
    /// it, deleted, replaced).
    pub fn retain_pool(&self, pool: &str, warm: &BTreeSet<String>) {
        if let Ok(mut m) = self.open.lock() {
            m.retain(|uid, o| o.pool != pool || warm.contains(uid));
        }
    }

    /// How many shells are open.
    pub fn len(&self) -> usize {
        self.open.lock().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::Api;

    fn session() -> Session {
        // A shell starts with its first command; none runs here, so no API server is needed.
        let client = kube::Client::try_from(kube::Config::new(
            "http://127.0.0.1:9".parse().expect("url"),
        ))
        .expect("client");
        Session::new(
            Api::<Pod>::namespaced(client, "team"),
            "py-warm-a",
            "sandbox",
        )
    }

    #[tokio::test]
    async fn a_shell_is_taken_once_by_uid() {
        let shells = Shells::default();
        shells.put("team/py", "uid-a", session());
        assert!(shells.has("uid-a"));
        assert!(shells.take("uid-b").is_none());
        assert!(shells.take("uid-a").is_some());
        assert!(shells.take("uid-a").is_none(), "taken twice");
        assert!(shells.is_empty());
    }

    #[tokio::test]
    async fn a_pools_shells_of_pods_no_longer_warm_are_dropped_and_other_pools_kept() {
        let shells = Shells::default();
        shells.put("team/py", "warm", session());
        shells.put("team/py", "claimed", session());
        shells.put("team/js", "other", session());
        shells.retain_pool("team/py", &BTreeSet::from(["warm".to_string()]));
        assert_eq!(shells.len(), 2);
        assert!(shells.has("warm") && shells.has("other"));
    }
}
