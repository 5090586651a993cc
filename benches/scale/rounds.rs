//! The scale bench's deletion of every Sandbox it made: `deletecollection` sent again until
//! every one is marked deleted, a bounded number of rounds (issue 44).
//!
//! The API server ends a request after its timeout (`--request-timeout`, 60 s by default), and
//! a `deletecollection` of 10,000 Sandboxes takes longer than that: it was cut off after about
//! 2,875 deletions, the rest left untouched. So the bench looks after each round: Sandboxes
//! not yet marked deleted (no `deletionTimestamp`) get another round; the ones marked are
//! waited for (their finalizers are the operator's to remove).
//!
//! Kept free of the cluster so `tests/bench_report.rs` tests it (`#[path]`), as the report's
//! renderer.

/// How many `deletecollection` requests the bench sends at most: 10,000 Sandboxes took four
/// (about 2,875 each before the API server's timeout); ten leave room for a slower server.
pub const MAX_ROUNDS: u32 = 10;

/// What the bench does after looking at what is left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// None is left: the deletion is complete.
    Done,
    /// Every one left is marked deleted: wait for the finalizers to go.
    Wait,
    /// Some are not marked deleted: send `deletecollection` again.
    Send,
    /// Some are not marked deleted and the rounds are spent: why the bench stops.
    GiveUp(String),
}

/// The decision after `sent` rounds (of at most `max`), with `left` Sandboxes still there, of
/// which `unmarked` have no `deletionTimestamp`; `last_error` is the last round's error, if it
/// ended in one (the API server's timeout, typically), for the message.
pub fn next(left: usize, unmarked: usize, sent: u32, max: u32, last_error: Option<&str>) -> Next {
    if left == 0 {
        return Next::Done;
    }
    if unmarked == 0 {
        return Next::Wait;
    }
    if sent < max {
        return Next::Send;
    }
    let why = last_error.map_or(String::new(), |e| format!(" (the last one: {e})"));
    Next::GiveUp(format!(
        "{unmarked} of {left} sandboxes left are not marked deleted after {sent} deletecollection requests{why}"
    ))
}

#[cfg(test)]
mod tests {
    // The imports are inside each test: `cargo bench` builds this file with cfg(test) set and
    // the #[test] functions dropped, where a module-level import would be unused.

    #[test]
    fn a_collection_cut_off_by_the_server_is_sent_again_until_every_one_is_marked() {
        use super::{MAX_ROUNDS, Next, next};
        // 10,000, about 2,875 marked per round before the server's timeout.
        let mut left_unmarked = 10_000usize;
        let mut sent = 0;
        loop {
            match next(10_000, left_unmarked, sent, MAX_ROUNDS, Some("timeout")) {
                Next::Send => {
                    sent += 1;
                    left_unmarked = left_unmarked.saturating_sub(2_875);
                }
                Next::Wait => break,
                other => panic!("unexpected {other:?} after {sent} rounds"),
            }
        }
        assert_eq!(sent, 4);
    }

    #[test]
    fn marked_ones_are_waited_for_and_none_left_is_done() {
        use super::{MAX_ROUNDS, Next, next};
        assert_eq!(next(7, 0, 1, MAX_ROUNDS, None), Next::Wait);
        assert_eq!(next(0, 0, 1, MAX_ROUNDS, None), Next::Done);
        // None there to begin with: nothing to send.
        assert_eq!(next(0, 0, 0, MAX_ROUNDS, None), Next::Done);
        assert_eq!(next(3, 3, 0, MAX_ROUNDS, None), Next::Send);
    }

    #[test]
    fn the_rounds_are_bounded_and_the_error_says_what_is_left_and_why() {
        use super::{Next, next};
        let Next::GiveUp(msg) = next(500, 20, 3, 3, Some("the server timed out")) else {
            panic!("not given up");
        };
        assert!(msg.contains("20 of 500"), "{msg}");
        assert!(msg.contains("after 3 deletecollection requests"), "{msg}");
        assert!(msg.contains("the server timed out"), "{msg}");
        let Next::GiveUp(msg) = next(500, 20, 3, 3, None) else {
            panic!("not given up");
        };
        assert!(!msg.contains("the last one"), "{msg}");
    }
}
