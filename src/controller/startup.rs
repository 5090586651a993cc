//! A leader's first pass: every Sandbox of its first listing reconciled once. Until then the
//! gauge `agentbox_startup_pending_sandboxes` says how many are left; when the pass is
//! complete `agentbox_startup_reconciled_seconds` says how long it took from the start, and the
//! log says so once. The benches time a restart by it (benches/scale.rs), and an operator
//! that comes back after an upgrade or a node drain can be seen catching up.
//!
//! The pass is remembered as the UIDs reconciled since the start, only until it is complete:
//! then the set is dropped, so nothing here grows with the number of Sandboxes at rest.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How often the pass is checked against the cache.
pub const CHECK_EVERY: Duration = Duration::from_millis(250);

/// The first pass of this process's sandbox controller.
pub struct FirstPass {
    started: Instant,
    done: AtomicBool,
    reconciled: Mutex<HashSet<String>>,
}

impl FirstPass {
    /// A pass that starts now.
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            done: AtomicBool::new(false),
            reconciled: Mutex::new(HashSet::new()),
        }
    }

    /// The Sandbox with UID `uid` has been reconciled (without an error).
    pub fn reconciled(&self, uid: &str) {
        if self.done.load(Ordering::Relaxed) || uid.is_empty() {
            return;
        }
        if let Ok(mut set) = self.reconciled.lock() {
            set.insert(uid.to_string());
        }
    }

    /// How many of the Sandboxes `uids` (the cache's, now) have not been reconciled yet; once
    /// none is left the pass is complete for good (and its set is dropped): `Some(took)` is
    /// returned with the count that one time.
    pub fn check<'a>(
        &self,
        uids: impl Iterator<Item = &'a str>,
        now: Instant,
    ) -> (usize, Option<Duration>) {
        if self.done.load(Ordering::Relaxed) {
            return (0, None);
        }
        let Ok(mut set) = self.reconciled.lock() else {
            return (0, None);
        };
        let pending = uids.filter(|u| !set.contains(*u)).count();
        if pending > 0 {
            return (pending, None);
        }
        self.done.store(true, Ordering::Relaxed);
        *set = HashSet::new();
        (0, Some(now.saturating_duration_since(self.started)))
    }

    /// Whether the pass is complete.
    pub fn is_done(&self) -> bool {
        self.done.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pass_is_complete_once_every_cached_sandbox_was_reconciled() {
        let t0 = Instant::now();
        let pass = FirstPass::new(t0);
        let cached = ["a", "b", "c"];
        assert_eq!(pass.check(cached.iter().copied(), t0), (3, None));
        pass.reconciled("a");
        pass.reconciled("b");
        pass.reconciled("gone-since");
        assert_eq!(pass.check(cached.iter().copied(), t0), (1, None));
        // "c" was deleted meanwhile: it is no longer in the cache and not waited for.
        let later = t0 + Duration::from_secs(7);
        assert_eq!(
            pass.check(["a", "b"].into_iter(), later),
            (0, Some(Duration::from_secs(7)))
        );
        assert!(pass.is_done());
        assert_eq!(
            pass.check(["x"].into_iter(), later),
            (0, None),
            "complete for good: reported once"
        );
        pass.reconciled("x");
        assert!(
            pass.reconciled.lock().unwrap().is_empty(),
            "nothing kept after it"
        );
    }
}
