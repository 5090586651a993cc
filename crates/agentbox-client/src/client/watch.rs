//! Waiting on one object with a watch that outlives the API server's hiccups.
//!
//! kube's `await_condition` ends at the watcher's first error, and the watcher reports a watch
//! the API server expired (410 Gone, "too old resource version", common on a loaded server) or
//! a dropped connection as an error before it lists again on its own. Here those are skipped,
//! with the watcher's default backoff, so that only the caller's timeout ends the wait; errors
//! that another try cannot mend (refused, not found, bad request) end it at once.

use std::fmt::Debug;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watch_object};
use serde::de::DeserializeOwned;
use tracing::debug;

/// Watches `name` until `done` holds for it (`None`: it does not exist) and returns it as it
/// was then. Wrap in a timeout: transient watch errors do not end the wait.
pub async fn until<K>(
    api: Api<K>,
    name: &str,
    mut done: impl FnMut(Option<&K>) -> bool,
) -> Result<Option<K>, watcher::Error>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let events = watch_object(api, name).default_backoff();
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(obj) if done(obj.as_ref()) => return Ok(obj),
            Ok(_) => {}
            Err(e) if transient(&e) => debug!(object = name, "watch: {e}; watching again"),
            Err(e) => return Err(e),
        }
    }
    // The watcher's stream does not end by itself.
    Ok(None)
}

/// Whether a watch error may go away by watching again: an expired watch (410), the API
/// server unreachable or failing (5xx, 429, a dropped connection); not a refusal (401, 403),
/// an unknown kind (404) or a bad request.
fn transient(e: &watcher::Error) -> bool {
    let code = match e {
        watcher::Error::WatchError(s) => Some(s.code),
        watcher::Error::InitialListFailed(k)
        | watcher::Error::WatchStartFailed(k)
        | watcher::Error::WatchFailed(k) => match k {
            kube::Error::Api(s) => Some(s.code),
            _ => None,
        },
        watcher::Error::NoResourceVersion => return false,
    };
    code.is_none_or(|c| c == 410 || c == 429 || c >= 500)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn status(code: u16) -> Box<Status> {
        Box::new(Status::failure("m", "r").with_code(code))
    }

    #[test]
    fn an_expired_watch_or_a_failing_server_is_watched_again_a_refusal_is_not() {
        assert!(transient(&watcher::Error::WatchError(status(410))));
        assert!(transient(&watcher::Error::WatchFailed(kube::Error::Api(
            status(503)
        ))));
        assert!(!transient(&watcher::Error::InitialListFailed(
            kube::Error::Api(status(403))
        )));
        assert!(!transient(&watcher::Error::WatchStartFailed(
            kube::Error::Api(status(404))
        )));
        assert!(!transient(&watcher::Error::NoResourceVersion));
    }
}
