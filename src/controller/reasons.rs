//! Condition reasons as types: one enum per condition family, rendered to the API's CamelCase
//! strings only at the edge ([`RestoreReason::as_str`], [`WorkspaceReason::as_str`]). Whether a
//! failure stands until something changes (permanent) or may pass by itself (transient) is a
//! property of the reason, not a match on its string.

use crate::snapshot::{self, SnapshotError};

/// Why a start that restores a snapshot did not (WorkspaceReady and Ready carry it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestoreReason {
    /// The operator has no object store.
    NoStore,
    /// The SandboxSnapshot does not exist.
    SnapshotNotFound,
    /// The SandboxSnapshot is not Ready (yet).
    SnapshotNotReady,
    /// The SandboxSnapshot has no digest or scope key on record.
    SnapshotIncomplete,
    /// The snapshot is of another scope and the namespace does not allow that.
    CrossScopeRestore,
    /// `snapshot.name` is not an object name.
    InvalidReference,
    /// Someone else holds the scope's guard.
    GuardBusy,
    /// The restore failed on the operator's side (its forwarding task).
    RestoreFailed,
    /// `tar -x` in the pod failed.
    ExtractFailed,
    /// The workspace's disk filled up while the archive was written into the pod (its spool)
    /// or extracted; what was written is removed and the workspace is as it was. Tried again
    /// later: space may be freed.
    DiskFull,
    /// Swapping the restored workspace in failed (and was undone).
    SwapFailed,
    /// The object store failed.
    StoreError,
    /// Reading the archive failed.
    ArchiveFailed,
    /// The stream into the sandbox's `tar -x` stopped moving for the progress deadline.
    StreamStalled,
    /// The archive or its object was refused: the snapshot module's reason
    /// ([`snapshot::permanent_reason`]).
    Refused(&'static str),
}

impl RestoreReason {
    /// The CamelCase reason of the condition.
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreReason::NoStore => "NoStore",
            RestoreReason::SnapshotNotFound => "SnapshotNotFound",
            RestoreReason::SnapshotNotReady => "SnapshotNotReady",
            RestoreReason::SnapshotIncomplete => "SnapshotIncomplete",
            RestoreReason::CrossScopeRestore => "CrossScopeRestore",
            RestoreReason::InvalidReference => "InvalidReference",
            RestoreReason::GuardBusy => "GuardBusy",
            RestoreReason::RestoreFailed => "RestoreFailed",
            RestoreReason::ExtractFailed => "ExtractFailed",
            RestoreReason::DiskFull => "DiskFull",
            RestoreReason::SwapFailed => "SwapFailed",
            RestoreReason::StoreError => "StoreError",
            RestoreReason::ArchiveFailed => "ArchiveFailed",
            RestoreReason::StreamStalled => snapshot::STREAM_STALLED,
            RestoreReason::Refused(r) => r,
        }
    }

    /// The reason of a snapshot module error.
    pub fn of(e: &SnapshotError) -> Self {
        match e {
            SnapshotError::Store(_) => RestoreReason::StoreError,
            SnapshotError::Source(_) | SnapshotError::Guard(_) => RestoreReason::ArchiveFailed,
            SnapshotError::Stalled(_) => RestoreReason::StreamStalled,
            SnapshotError::Refused(_) | SnapshotError::Missing(_) => {
                RestoreReason::Refused(snapshot::permanent_reason(e.reason()))
            }
        }
    }

    /// Whether it waits for a change (a refused archive, a missing snapshot, a reference or
    /// scope the operator will not follow) rather than passing by itself (a busy guard, a store
    /// hiccup, a failed exec, a snapshot not Ready yet).
    pub fn is_permanent(self) -> bool {
        !matches!(
            self,
            RestoreReason::GuardBusy
                | RestoreReason::StoreError
                | RestoreReason::RestoreFailed
                | RestoreReason::ExtractFailed
                | RestoreReason::DiskFull
                | RestoreReason::SwapFailed
                | RestoreReason::StreamStalled
                | RestoreReason::SnapshotNotReady
        )
    }
}

impl std::fmt::Display for RestoreReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a workspace could not be initialised (WorkspaceReady and Ready carry it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkspaceReason {
    /// A ConfigMap or Secret that a file, projection or environment variable names is missing.
    SourceMissing,
    /// Such an object has not been made readable by sandboxes.
    SourceNotReadable,
    /// A `network.allow` credential's Secret is missing or does not allow the domain.
    CredentialRefused,
    /// An exec into the sandbox failed.
    ExecFailed,
    /// Restoring a snapshot did not happen.
    Restore(RestoreReason),
    /// The workspace was lost, there is nothing to restore, and the policy forbids a fresh one.
    WorkspaceLost,
    /// Anything else.
    InitFailed,
}

impl WorkspaceReason {
    /// The CamelCase reason of the condition.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkspaceReason::SourceMissing => "SourceMissing",
            WorkspaceReason::SourceNotReadable => "SourceNotReadable",
            WorkspaceReason::CredentialRefused => "CredentialRefused",
            WorkspaceReason::ExecFailed => "ExecFailed",
            WorkspaceReason::Restore(r) => r.as_str(),
            WorkspaceReason::WorkspaceLost => "WorkspaceLost",
            WorkspaceReason::InitFailed => "InitFailed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::archive::Refusal;

    #[test]
    fn what_may_pass_by_itself_is_transient_and_the_rest_waits_for_a_change() {
        use RestoreReason::*;
        for r in [
            GuardBusy,
            StoreError,
            RestoreFailed,
            ExtractFailed,
            DiskFull,
            SwapFailed,
        ] {
            assert!(!r.is_permanent(), "{r:?}");
        }
        assert!(!SnapshotNotReady.is_permanent(), "it may become Ready");
        for r in [
            NoStore,
            SnapshotNotFound,
            SnapshotIncomplete,
            CrossScopeRestore,
            InvalidReference,
            ArchiveFailed,
            Refused("Fifo"),
        ] {
            assert!(r.is_permanent(), "{r:?}");
        }
    }

    #[test]
    fn snapshot_errors_keep_the_snapshot_module_s_reason() {
        let refused = SnapshotError::Refused(Refusal::Fifo("p".into()));
        assert_eq!(RestoreReason::of(&refused), RestoreReason::Refused("Fifo"));
        let missing = SnapshotError::Missing("k".into());
        assert_eq!(RestoreReason::of(&missing).as_str(), "ObjectMissing");
        let source = SnapshotError::Source("cut".into());
        assert_eq!(RestoreReason::of(&source).as_str(), "ArchiveFailed");
        for e in [refused, missing, source] {
            assert_eq!(RestoreReason::of(&e).as_str(), e.reason());
        }
    }

    #[test]
    fn reasons_render_as_the_api_s_strings() {
        assert_eq!(
            RestoreReason::CrossScopeRestore.as_str(),
            "CrossScopeRestore"
        );
        assert_eq!(
            WorkspaceReason::Restore(RestoreReason::GuardBusy).as_str(),
            "GuardBusy"
        );
        assert_eq!(
            WorkspaceReason::SourceNotReadable.as_str(),
            "SourceNotReadable"
        );
    }
}
