//! How the controllers' watches back off after errors.
//!
//! A kube `Controller` has ONE backoff for all its trigger watches together (its own
//! resource's and each `owns`/`watches`), and kube's default (client-go's: 0.8 s doubling to
//! 30 s with up to twice that in jitter, reset only after 120 s without an error) is made for
//! many clients sparing a struggling API server. Here it turned an API server restart into
//! minutes of deafness: every watch of a controller failed a few times while the server was
//! down and once more on its return (410 Gone: each resumes from a version the new server no
//! longer has, then lists again), each failure doubling the shared wait, so the Sandbox watch
//! sat out waits of 40-55 s and a Sandbox deleted just after the restart was noticed 2-4
//! minutes later (tests/chaos.rs). One operator's handful of watches retrying every few seconds
//! costs an API server nothing, so the wait here starts at a quarter second and stops growing
//! at four; any event that gets through starts it over.

use std::time::Duration;

use kube::runtime::utils::Backoff;

/// The first wait after an error.
const FIRST: Duration = Duration::from_millis(250);
/// The longest wait.
const LONGEST: Duration = Duration::from_secs(4);

/// Doubling waits from [`FIRST`] to [`LONGEST`], reset by any event that gets through.
#[derive(Clone, Debug)]
pub struct TriggerBackoff {
    next: Duration,
}

impl Default for TriggerBackoff {
    fn default() -> Self {
        TriggerBackoff { next: FIRST }
    }
}

impl Iterator for TriggerBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let now = self.next;
        self.next = (now * 2).min(LONGEST);
        Some(now)
    }
}

impl Backoff for TriggerBackoff {
    fn reset(&mut self) {
        self.next = FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_from_a_quarter_second_to_four_and_start_over_on_reset() {
        let mut b = TriggerBackoff::default();
        let waits: Vec<u128> = b.by_ref().take(8).map(|d| d.as_millis()).collect();
        assert_eq!(waits, [250, 500, 1000, 2000, 4000, 4000, 4000, 4000]);
        b.reset();
        assert_eq!(b.next(), Some(Duration::from_millis(250)));
    }
}
