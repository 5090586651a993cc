//! The snapshot controller's writes and the bookkeeping its steps share: the Committed
//! condition, a failed attempt recorded, what an unfinished attempt left removed, and the
//! snapshots this process is uploading now.

use std::collections::HashSet;
use std::sync::{LazyLock, Mutex};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;
use tracing::warn;

use crate::controller::conditions;
use crate::controller::context::{Context, Error};
use crate::snapshot::SnapshotError;
use crate::snapshot::store::{AbortOutcome, SnapshotKeys, Store, StoreError};
use agentbox_api::crd::{SandboxSnapshot, SandboxSnapshotStatus, SnapshotPhase};

/// Condition type on a SandboxSnapshot: its object is committed and verified.
pub const COMMITTED: &str = "Committed";

/// Sets the Committed condition and `Ready`, its twin (the condition every agentbox kind has,
/// so `kubectl wait --for=condition=Ready` works on snapshots too).
pub fn set_committed(
    conds: &mut Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    for type_ in [COMMITTED, conditions::READY] {
        conditions::set(conds, type_, status, reason, message, generation, now);
    }
}

/// Field manager of the Sandbox's `status.lastSnapshot`, the one Sandbox field this controller
/// writes (the sandbox controller applies the rest of the status under its own manager).
pub const LAST_SNAPSHOT_MANAGER: &str = "agentbox-operator-snapshots";

/// Snapshots this process is uploading right now (by UID). A `Running` snapshot not in this
/// set was interrupted.
static IN_FLIGHT: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Default::default);

pub(super) fn in_flight(uid: &str) -> bool {
    IN_FLIGHT.lock().map(|s| s.contains(uid)).unwrap_or(false)
}

/// Marks a UID in flight until dropped.
pub(super) struct InFlight(String);

impl InFlight {
    pub(super) fn new(uid: &str) -> Self {
        if let Ok(mut s) = IN_FLIGHT.lock() {
            s.insert(uid.to_string());
        }
        InFlight(uid.to_string())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut s) = IN_FLIGHT.lock() {
            s.remove(&self.0);
        }
    }
}

/// Records a failed attempt: Failed when `give_up`, else Pending for another attempt; the
/// Committed condition and a Warning Event carry the reason.
pub(super) async fn write_failure(
    ctx: &Context,
    snap: &SandboxSnapshot,
    api: &Api<SandboxSnapshot>,
    mut st: SandboxSnapshotStatus,
    reason: &'static str,
    message: &str,
    give_up: bool,
) -> Result<(), Error> {
    let now = Timestamp::now();
    if give_up {
        st.phase = Some(SnapshotPhase::Failed);
        st.completed_at = Some(Time(now));
    } else {
        st.phase = Some(SnapshotPhase::Pending);
    }
    set_committed(&mut st.conditions, false, reason, message, None, now);
    crate::controller::context::publish(ctx, snap, EventType::Warning, reason, "Snapshot", message)
        .await;
    crate::controller::context::apply_status(api, &snap.name_any(), &st).await?;
    // Counted once recorded: a failed write brings the same failure back.
    ctx.metrics.snapshot_failed(reason);
    Ok(())
}

/// A store error as the controller's.
pub(super) fn snapshot_err(e: impl Into<SnapshotError>) -> Error {
    Error::Snapshot(e.into())
}

/// Removes what an unfinished attempt may have left: its multipart upload (by the id recorded
/// in the status; its parts are not objects and would stay in the bucket) and the temporary
/// object or staged files. An abort the store refuses is said in a Warning Event and not
/// retried (see [`AbortOutcome::Refused`]): the snapshot goes on.
pub(super) async fn discard_attempt(
    ctx: &Context,
    snap: &SandboxSnapshot,
    store: &Store,
    keys: &SnapshotKeys,
    upload_id: Option<&str>,
) -> Result<(), StoreError> {
    if let Some(id) = upload_id
        && let AbortOutcome::Refused(why) = store.abort_upload(keys, id).await?
    {
        let msg = format!(
            "the store refused to abort multipart upload {id} of {}: {why}; if that upload \
             still exists, its parts stay in the bucket until removed (a lifecycle rule with \
             AbortIncompleteMultipartUpload removes them)",
            keys.object
        );
        warn!(snapshot = %snap.name_any(), "{msg}");
        crate::controller::context::publish(
            ctx,
            snap,
            EventType::Warning,
            "UploadAbortRefused",
            "Cleanup",
            &msg,
        )
        .await;
    }
    store.delete_temp(keys).await
}
