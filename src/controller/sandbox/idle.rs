//! `spec.lifecycle.idleTimeout`, pure: the idle clock kept in status and the decision it
//! leads to. A sandbox is idle while it is Ready and its scope's guard is free; the clock
//! restarts whenever the guard was taken, seen or not (its fencing token moved). The writes
//! are [`super::act`]'s: the clock rides along in status writes that happen anyway (Ready, the
//! Guarded condition changing), and the reconcile is requeued for the moment the sandbox
//! would become idle, so an idle sandbox costs no writes until it is suspended.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};

use agentbox_api::crd::{Sandbox, SandboxPhase, SandboxStatus};
use agentbox_api::guard::LeaseView;

/// Condition reason (on Ready and PodReady) and Event reason of an idle suspension.
pub const REASON: &str = "IdleTimeout";

/// What the idle timeout asks of a reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idle {
    /// No idle timeout, or the sandbox is not Ready: nothing to watch.
    Off,
    /// The guard is held: not idle. Look again when the holder's time would be up (a holder
    /// that died stops renewing, and no event says so); `None` when the lease has no
    /// `renewTime` (its renewals, watched, bring the reconciles).
    Busy(Option<Duration>),
    /// Idle, for less than the timeout: look again when it will have been idle that long.
    Wait(Duration),
    /// Idle for the whole timeout: suspend.
    Suspend,
}

/// The sandbox's idle timeout, if it has one (a negative duration, which admission refuses,
/// counts as none).
pub fn timeout(sbx: &Sandbox) -> Option<Duration> {
    sbx.spec
        .lifecycle
        .idle_timeout
        .filter(|d| !d.is_negative())
        .map(Duration::from)
}

/// Keeps the idle clock in `st` (the status a reconcile is about to leave) and decides.
///
/// While `st` says Ready and the guard is free, `idleSince` stays as it was unless the guard's
/// fencing token moved since it was set (someone took the guard in between: the clock
/// restarts now). A held guard, or any phase but Ready, clears it; Suspended keeps it (it says
/// when an idle-suspended sandbox went idle). Without a timeout nothing is recorded.
pub fn track(
    st: &mut SandboxStatus,
    timeout: Option<Duration>,
    guard: &LeaseView,
    now: Timestamp,
) -> Idle {
    let Some(timeout) = timeout else {
        st.idle_since = None;
        st.idle_guard_transitions = None;
        return Idle::Off;
    };
    match st.phase {
        Some(SandboxPhase::Ready) => {}
        Some(SandboxPhase::Suspended) => return Idle::Off,
        _ => {
            st.idle_since = None;
            st.idle_guard_transitions = None;
            return Idle::Off;
        }
    }
    if guard.is_held() {
        st.idle_since = None;
        st.idle_guard_transitions = None;
        let until = guard
            .expires_at
            .map(|e| Duration::try_from(e.duration_since(now)).unwrap_or_default());
        // Just past the expiry, so the look that follows sees it expired.
        return Idle::Busy(until.map(|d| d + Duration::from_millis(100)));
    }
    let since = match (st.idle_since.as_ref(), st.idle_guard_transitions) {
        (Some(since), Some(t)) if t == guard.transitions => since.0,
        // Whole seconds, as status stores times: the clock reads the same before and after
        // it is written. Rounded up, so a sandbox is never suspended before its timeout.
        _ => whole_second_up(now),
    };
    st.idle_since = Some(Time(since));
    st.idle_guard_transitions = Some(guard.transitions);
    // Time left until `since + timeout` (`since` may be a fraction of a second ahead).
    let timeout = SignedDuration::try_from(timeout).unwrap_or(SignedDuration::MAX);
    let left = timeout
        .checked_sub(now.duration_since(since))
        .unwrap_or(SignedDuration::MAX);
    match Duration::try_from(left) {
        Ok(left) if !left.is_zero() => Idle::Wait(left),
        _ => Idle::Suspend,
    }
}

/// `t`, or the next whole second when `t` has a fraction.
fn whole_second_up(t: Timestamp) -> Timestamp {
    let up = i64::from(t.subsec_nanosecond() > 0);
    Timestamp::from_second(t.as_second() + up).unwrap_or(t)
}

/// The message of an idle suspension.
pub fn message(timeout: Duration, since: Option<&Time>) -> String {
    let since = since.map_or_else(|| "unknown".to_string(), |t| t.0.to_string());
    format!(
        "suspended after lifecycle.idleTimeout ({}): idle since {since} (Ready, the scope's guard free); the workspace is kept, resume to start it again",
        humantime_secs(timeout)
    )
}

/// A duration as Go prints whole seconds (`90s`), which is how most timeouts are written.
fn humantime_secs(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{d:?}")
    }
}

/// Whether the status says the sandbox was suspended by its idle timeout (the reason the idle
/// suspension wrote on Ready, carried until the sandbox runs again).
pub fn suspended_for_idleness(st: &SandboxStatus) -> bool {
    crate::controller::conditions::get(&st.conditions, crate::controller::conditions::READY)
        .is_some_and(|c| c.reason == REASON)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn ready() -> SandboxStatus {
        SandboxStatus {
            phase: Some(SandboxPhase::Ready),
            ..Default::default()
        }
    }

    fn free(transitions: i32) -> LeaseView {
        LeaseView {
            holder: None,
            acquired: None,
            duration: Duration::from_secs(15),
            expired: false,
            expires_at: None,
            transitions,
        }
    }

    fn held(expires: Timestamp, now: Timestamp) -> LeaseView {
        LeaseView {
            holder: Some("harness".into()),
            acquired: Some(t(-30)),
            duration: Duration::from_secs(15),
            expired: expires <= now,
            expires_at: Some(expires),
            transitions: 3,
        }
    }

    const MINUTE: Option<Duration> = Some(Duration::from_secs(60));

    #[test]
    fn without_a_timeout_a_sandbox_is_never_idle_and_nothing_is_recorded() {
        let mut st = ready();
        st.idle_since = Some(Time(t(-600)));
        assert_eq!(track(&mut st, None, &free(1), t(0)), Idle::Off);
        assert_eq!((st.idle_since, st.idle_guard_transitions), (None, None));
    }

    #[test]
    fn a_held_guard_is_not_idle_and_wakes_at_the_holders_expiry() {
        let mut st = ready();
        st.idle_since = Some(Time(t(-600)));
        st.idle_guard_transitions = Some(2);
        let idle = track(&mut st, MINUTE, &held(t(7), t(0)), t(0));
        assert_eq!(idle, Idle::Busy(Some(Duration::from_millis(7_100))));
        assert_eq!(st.idle_since, None, "a held guard clears the clock");
    }

    #[test]
    fn an_expired_holder_counts_as_free_from_when_it_is_seen() {
        let mut st = ready();
        let idle = track(&mut st, MINUTE, &held(t(-1), t(0)), t(0));
        assert_eq!(idle, Idle::Wait(Duration::from_secs(60)));
        assert_eq!(st.idle_since, Some(Time(t(0))));
        assert_eq!(st.idle_guard_transitions, Some(3));
    }

    #[test]
    fn free_for_less_than_the_timeout_requeues_at_the_exact_remaining_time() {
        let mut st = ready();
        assert_eq!(
            track(&mut st, MINUTE, &free(4), t(0)),
            Idle::Wait(Duration::from_secs(60)),
            "the clock starts when idleness is first seen"
        );
        let recorded = st.clone();
        assert_eq!(
            track(&mut st, MINUTE, &free(4), t(42)),
            Idle::Wait(Duration::from_secs(18))
        );
        assert_eq!(st, recorded, "a running clock changes no status");
    }

    #[test]
    fn the_clock_starts_at_the_next_whole_second_so_it_never_suspends_early() {
        let now = t(10).checked_add(SignedDuration::from_millis(300)).unwrap();
        let mut st = ready();
        let idle = track(&mut st, Some(Duration::from_secs(60)), &free(1), now);
        assert_eq!(st.idle_since, Some(Time(t(11))));
        // 60.7 s from now: never less than the timeout.
        assert_eq!(idle, Idle::Wait(Duration::from_millis(60_700)));
    }

    #[test]
    fn free_for_the_whole_timeout_suspends() {
        let mut st = ready();
        track(&mut st, MINUTE, &free(4), t(0));
        assert_eq!(track(&mut st, MINUTE, &free(4), t(60)), Idle::Suspend);
        assert_eq!(track(&mut st, MINUTE, &free(4), t(3600)), Idle::Suspend);
    }

    #[test]
    fn a_take_of_the_guard_between_two_looks_restarts_the_clock() {
        let mut st = ready();
        track(&mut st, MINUTE, &free(4), t(0));
        // A harness took and released the guard; both events were missed.
        let idle = track(&mut st, MINUTE, &free(5), t(70));
        assert_eq!(idle, Idle::Wait(Duration::from_secs(60)));
        assert_eq!(st.idle_since, Some(Time(t(70))));
        assert_eq!(st.idle_guard_transitions, Some(5));
    }

    #[test]
    fn only_a_ready_sandbox_is_idle_and_a_suspended_one_keeps_its_record() {
        for phase in [
            SandboxPhase::Pending,
            SandboxPhase::Initializing,
            SandboxPhase::Failed,
        ] {
            let mut st = SandboxStatus {
                phase: Some(phase),
                idle_since: Some(Time(t(-600))),
                idle_guard_transitions: Some(1),
                ..Default::default()
            };
            assert_eq!(track(&mut st, MINUTE, &free(1), t(0)), Idle::Off);
            assert_eq!(st.idle_since, None, "{phase:?}");
        }
        let mut st = SandboxStatus {
            phase: Some(SandboxPhase::Suspended),
            idle_since: Some(Time(t(-600))),
            idle_guard_transitions: Some(1),
            ..Default::default()
        };
        assert_eq!(track(&mut st, MINUTE, &free(2), t(0)), Idle::Off);
        assert_eq!(st.idle_since, Some(Time(t(-600))));
    }

    #[test]
    fn the_message_names_the_timeout_and_when_it_went_idle() {
        let m = message(Duration::from_secs(90), Some(&Time(t(0))));
        assert!(m.contains("(90s)"), "{m}");
        assert!(m.contains(&t(0).to_string()), "{m}");
    }
}
