//! The error a reconcile ends with, and the pace at which it is retried. A leaf: every
//! controller and the watch caches use it.

use std::time::Duration;

use super::reasons;

/// Reconcile errors. [`Error::is_permanent`] decides the retry pace.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused or failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An exec into the sandbox failed.
    #[error("exec: {0}")]
    Exec(#[from] agentbox_api::exec::ExecError),
    /// The finalizer helper failed (wraps the inner error).
    #[error("{0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// Workspace initialisation ran but failed.
    #[error("workspace initialisation: {0}")]
    Init(String),
    /// A ConfigMap or Secret a file, projection or environment variable needs is missing.
    #[error("{0}")]
    SourceMissing(String),
    /// A ConfigMap or Secret a file, projection or environment variable names has not been
    /// made readable by sandboxes (label `agentbox.dev/sandbox-readable: "true"`).
    #[error("{0}")]
    SourceNotReadable(String),
    /// A `network.allow` credential the operator may not hand to the egress proxy: its
    /// Secret or key is missing, or the Secret's `agentbox.dev/credential-domains` does not
    /// allow the entry's domain. The message names the Secret, key and domain, never a value.
    #[error("{0}")]
    CredentialRefused(String),
    /// Building the file archive failed.
    #[error("building the file archive: {0}")]
    Archive(#[from] std::io::Error),
    /// The workspace cleanup pod failed.
    #[error("{0}")]
    Cleanup(String),
    /// Work on a node needs the helper image, and the operator has none.
    #[error("{0}")]
    NoHelper(String),
    /// The workspace was lost with nothing to restore, and `snapshot.whenLost` is `Fail`.
    #[error("{0}")]
    WorkspaceLost(String),
    /// A namespaced object without a namespace.
    #[error("object has no namespace")]
    NotNamespaced,
    /// A status write waited for the reconcile's metadata write (finalizer and scope
    /// labels), which failed: the reconcile returns that write's own error instead.
    #[error("the Sandbox's finalizer and scope labels were not written")]
    MetadataNotWritten,
    /// A status write that would have named this pod as the sandbox's found the Sandbox
    /// changed since it was read: another writer (an operator during a leader change) may
    /// have named its own. The reconcile looks again; a pod the status does not name goes.
    #[error("the Sandbox changed before its status named pod {0}; looking again")]
    PodNamedElsewhere(String),
    /// A write did not finish in time.
    #[error("a write to the API server did not finish within {}s", .0.as_secs())]
    Timeout(Duration),
    /// The watch of managed pods has not listed them yet: a sandbox's pod not named in its
    /// status cannot be looked for, so nothing is made or adopted until it has.
    #[error("the watch of the operator's pods has not synced within {}s", .0.as_secs())]
    PodCacheNotSynced(Duration),
    /// A watch cache ([`super::cache`]) has not listed its objects yet: what it holds is not
    /// read until it has.
    #[error("the watch of {0} has not synced within {secs}s", secs = .1.as_secs())]
    CacheNotSynced(&'static str, Duration),
    /// Taking or storing a snapshot failed.
    #[error("snapshot: {0}")]
    Snapshot(#[source] crate::snapshot::SnapshotError),
    /// The scope's guard could not be taken or was lost.
    #[error("guard: {0}")]
    Guard(#[source] agentbox_api::guard::GuardError),
    /// Restoring a workspace from a snapshot failed; the workspace is as it was.
    #[error("restore refused or failed ({reason}): {message}")]
    Restore {
        /// The WorkspaceReady condition's reason; says whether the failure is permanent.
        reason: reasons::RestoreReason,
        /// What happened.
        message: String,
        /// Set when the refusal is permanent: recorded on the Sandbox so the restore is not
        /// attempted again until what it was judged against changes.
        refusal: Option<Box<agentbox_api::crd::RestoreRefusal>>,
    },
}

impl Error {
    /// The error inside the finalizer helper's wrapping, or this one.
    pub fn root(&self) -> &Error {
        match self {
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.root(),
                _ => self,
            },
            _ => self,
        }
    }

    /// A short kind for metrics.
    pub fn kind(&self) -> &'static str {
        match self.root() {
            Error::Kube(_) => "kube",
            Error::Exec(_) => "exec",
            Error::Finalizer(_) => "finalizer",
            Error::Init(_) => "init",
            Error::SourceMissing(_) => "source_missing",
            Error::SourceNotReadable(_) => "source_not_readable",
            Error::CredentialRefused(_) => "credential_refused",
            Error::Archive(_) => "archive",
            Error::Cleanup(_) => "cleanup",
            Error::NoHelper(_) => "no_helper",
            Error::WorkspaceLost(_) => "workspace_lost",
            Error::NotNamespaced => "not_namespaced",
            Error::MetadataNotWritten => "metadata_not_written",
            Error::Timeout(_) => "timeout",
            Error::PodNamedElsewhere(_) => "pod_named_elsewhere",
            Error::PodCacheNotSynced(_) => "pod_cache_not_synced",
            Error::CacheNotSynced(..) => "cache_not_synced",
            Error::Snapshot(_) => "snapshot",
            Error::Guard(_) => "guard",
            Error::Restore { .. } => "restore",
        }
    }

    /// The permanent restore refusal this error records, if it is one.
    pub fn restore_refusal(&self) -> Option<&agentbox_api::crd::RestoreRefusal> {
        match self.root() {
            Error::Restore {
                refusal: Some(r), ..
            } => Some(r),
            _ => None,
        }
    }

    /// The reason a workspace initialisation that failed with this error gives.
    pub fn workspace_reason(&self) -> reasons::WorkspaceReason {
        use reasons::WorkspaceReason as W;
        match self {
            Error::SourceMissing(_) => W::SourceMissing,
            Error::SourceNotReadable(_) => W::SourceNotReadable,
            Error::CredentialRefused(_) => W::CredentialRefused,
            Error::Exec(_) => W::ExecFailed,
            Error::Restore { reason, .. } => W::Restore(*reason),
            Error::WorkspaceLost(_) => W::WorkspaceLost,
            _ => W::InitFailed,
        }
    }

    /// Condition reason and message for a failed workspace initialisation.
    pub fn reason_and_message(&self) -> (&'static str, String) {
        (self.workspace_reason().as_str(), self.to_string())
    }

    /// Errors that will not go away by retrying soon (they wait for a spec or source change,
    /// polled slowly).
    pub fn is_permanent(&self) -> bool {
        match self.root() {
            Error::Exec(e) => !e.is_transient(),
            Error::NotNamespaced | Error::NoHelper(_) | Error::WorkspaceLost(_) => true,
            Error::Restore { reason, .. } => reason.is_permanent(),
            _ => false,
        }
    }
}

/// Retry pace after a failed reconcile: backoff with jitter for transient errors, a slow poll
/// (`permanent`, `--permanent-retry-seconds`) for permanent ones.
pub fn retry_after(err: &Error, jitter: f64, permanent: Duration) -> Duration {
    let base = match err.root() {
        // Waits for someone to create or label an object (no watch on those): a slow poll.
        Error::SourceMissing(_) | Error::SourceNotReadable(_) => 30.0,
        // Waits for the Secret's owner (or the Sandbox's author) to fix it: polled sooner,
        // as a credential usually is fixed while someone waits for the sandbox.
        Error::CredentialRefused(_) => 10.0,
        Error::Restore {
            reason: reasons::RestoreReason::SnapshotNotFound,
            ..
        } => 30.0,
        e if e.is_permanent() => permanent.as_secs_f64().max(1.0),
        // The other writer's status is on its way through the watch, which brings the
        // sandbox back sooner; this is the fallback.
        Error::PodNamedElsewhere(_) => 0.5,
        _ => 5.0,
    };
    Duration::from_secs_f64(base * (1.0 + jitter.clamp(0.0, 1.0) * 0.5))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOW: Duration = Duration::from_secs(300);

    #[test]
    fn retry_pace() {
        assert_eq!(
            retry_after(&Error::Init("x".into()), 0.0, SLOW),
            Duration::from_secs(5)
        );
        assert!(retry_after(&Error::Init("x".into()), 1.0, SLOW) <= Duration::from_secs_f64(7.5));
        assert_eq!(
            retry_after(&Error::NotNamespaced, 0.0, SLOW),
            Duration::from_secs(300)
        );
        assert_eq!(
            retry_after(&Error::SourceMissing("cm".into()), 0.0, SLOW),
            Duration::from_secs(30)
        );
        assert_eq!(
            retry_after(&Error::SourceNotReadable("secret".into()), 0.0, SLOW),
            Duration::from_secs(30)
        );
        assert_eq!(
            retry_after(&Error::CredentialRefused("secret".into()), 0.0, SLOW),
            Duration::from_secs(10)
        );
        use reasons::RestoreReason::*;
        let refused = |reason| Error::Restore {
            reason,
            message: String::new(),
            refusal: None,
        };
        assert_eq!(
            retry_after(&refused(CrossScopeRestore), 0.0, SLOW),
            Duration::from_secs(300),
            "waits for a change"
        );
        assert_eq!(
            retry_after(&refused(SnapshotNotReady), 0.0, SLOW),
            Duration::from_secs(5)
        );
        let short = Duration::from_secs(20);
        assert_eq!(
            retry_after(&refused(CrossScopeRestore), 0.0, short),
            short,
            "the permanent pace is --permanent-retry-seconds"
        );
        assert_eq!(
            retry_after(&Error::Init("x".into()), 0.0, short),
            Duration::from_secs(5),
            "transient errors keep their backoff"
        );
    }
}
