//! A pool's quiet beat after a claim: a pool that lost a warm pod to a claim made by this
//! process looks at its pods again (and refills) only [`QUIET`] later, so that its reads, the
//! new pod's create, its scheduling and its container's start do not share the CPUs with the
//! claim's last steps (the workspace command, the Ready status write) and the harness's first
//! commands. A timing aid, not a guard: a pool that misses it (a claim by another process, a
//! restart) refills at once, as it always did; burst claims each push the refill back, and
//! the misses start cold as before.
//!
//! Claims in flight hold every pool's refill back the same way ([`Claims::hold_for`]), up to
//! [`MAX_HOLD`].
//!
//! Not kube-runtime's controller `debounce`: that delays every event of every pool, so each
//! step of a refill (the pod made, Running, initialised) would wait as well.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a pool waits after a claim before it looks again. Measured on the 2-core test
/// machine (docs/benchmarks.md, footnote 7): the claim's create → Ready p50 lower with it in
/// every alternated run (−3.8 ms on average); its p95 unchanged on average.
pub const QUIET: Duration = Duration::from_millis(250);

/// The longest a pool's refill waits for claims in flight ([`Claims::in_flight`]): a steady
/// stream of starts does not keep a pool empty.
pub const MAX_HOLD: Duration = Duration::from_secs(2);

/// How often a pool held back by claims in flight looks again.
pub const HOLD_POLL: Duration = Duration::from_millis(50);

/// When each pool (`<namespace>/<name>`) last lost a warm pod to a claim, and how many first
/// starts that may claim one are in flight in this process (issue 32: the refill does not
/// share the CPUs with claims in flight; a burst of claims is served first, then the pools
/// refill).
#[derive(Debug, Default)]
pub struct Claims {
    last: Mutex<HashMap<String, Instant>>,
    in_flight: Arc<AtomicUsize>,
    /// Since when the refills have been held back by claims in flight.
    held_since: Mutex<Option<Instant>>,
}

/// A first start in flight, counted while it lives.
#[derive(Debug)]
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Claims {
    /// Counts a first start that may claim a warm pod until the guard is dropped.
    pub fn in_flight(&self) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.in_flight.clone())
    }

    /// How long a pool's refill is to wait for the claims in flight, if at all: while any is,
    /// up to [`MAX_HOLD`] since the refills were first held back.
    pub fn hold_for(&self, now: Instant) -> Option<Duration> {
        let busy = self.in_flight.load(Ordering::Acquire) > 0;
        let mut since = self.held_since.lock().ok()?;
        if !busy {
            *since = None;
            return None;
        }
        let first = *since.get_or_insert(now);
        if now.saturating_duration_since(first) >= MAX_HOLD {
            return None;
        }
        Some(HOLD_POLL)
    }

    /// Notes that a claim took a warm pod of `pool` at `now`.
    pub fn claimed(&self, pool: &str, now: Instant) {
        if let Ok(mut m) = self.last.lock() {
            m.insert(pool.to_string(), now);
        }
    }

    /// How long `pool` is to stay quiet still, if at all (the entry goes once it is over).
    pub fn quiet_for(&self, pool: &str, now: Instant) -> Option<Duration> {
        let mut m = self.last.lock().ok()?;
        let at = *m.get(pool)?;
        let left = QUIET.saturating_sub(now.saturating_duration_since(at));
        if left.is_zero() {
            m.remove(pool);
            return None;
        }
        Some(left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refills_wait_for_claims_in_flight_up_to_a_bound() {
        let claims = Claims::default();
        let t0 = Instant::now();
        assert_eq!(claims.hold_for(t0), None, "nothing in flight");
        let a = claims.in_flight();
        let b = claims.in_flight();
        assert_eq!(claims.hold_for(t0), Some(HOLD_POLL));
        drop(a);
        assert_eq!(
            claims.hold_for(t0 + HOLD_POLL),
            Some(HOLD_POLL),
            "one still is"
        );
        assert_eq!(claims.hold_for(t0 + MAX_HOLD), None, "not past the bound");
        drop(b);
        assert_eq!(claims.hold_for(t0 + MAX_HOLD), None);
        let _c = claims.in_flight();
        assert_eq!(
            claims.hold_for(t0 + MAX_HOLD + HOLD_POLL),
            Some(HOLD_POLL),
            "a new hold starts once none was in flight"
        );
    }

    #[test]
    fn a_pool_is_quiet_for_the_beat_after_its_last_claim_and_then_forgotten() {
        let claims = Claims::default();
        let t0 = Instant::now();
        assert_eq!(claims.quiet_for("team/py", t0), None, "no claim yet");
        claims.claimed("team/py", t0);
        assert_eq!(claims.quiet_for("team/py", t0), Some(QUIET));
        assert_eq!(claims.quiet_for("team/other", t0), None, "per pool");
        let later = t0 + Duration::from_millis(100);
        assert_eq!(
            claims.quiet_for("team/py", later),
            Some(QUIET - Duration::from_millis(100))
        );
        // A second claim pushes it back.
        claims.claimed("team/py", later);
        assert_eq!(
            claims.quiet_for("team/py", t0 + QUIET),
            Some(Duration::from_millis(100))
        );
        assert_eq!(claims.quiet_for("team/py", later + QUIET), None);
        assert!(
            claims.last.lock().unwrap().is_empty(),
            "an entry over is removed"
        );
    }
}
