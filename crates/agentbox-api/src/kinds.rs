//! The error kinds every client raises, in one table: each kind's name, the kind it refines,
//! what it means, and its name in Python, Go and Java. The clients' copies (Python's kind →
//! class map, Go's sentinel errors, Java's `ErrorKind` enum) are written from it by
//! `cargo run --bin clientgen`, and the protocol vectors carry it (`error_kinds`) so each
//! client's own tests fail when a kind has no error of its own there. Rust's `ClientError`
//! (agentbox-client) keeps its own variants and names each one's kind with `kind()`.
//!
//! A new kind is added here first; then the generator, the vectors, and the hand-written
//! class or typed error a language needs for its fields (Python's `errors.py`, Java's
//! `XException.java`; Go's sentinels are generated whole).

/// One kind of error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorKind {
    /// Its name, the same in every client's table (`SandboxNotReady`).
    pub name: &'static str,
    /// The kind it refines (a subclass of its class in Python and Java), or `None` for a kind
    /// directly under the clients' root error (`AgentboxError`, `AgentboxException`).
    pub parent: Option<&'static str>,
    /// What it means, one sentence, language-neutral.
    pub doc: &'static str,
    /// Its Python exception class (exported by the `agentbox` package); `None` where the
    /// Python client never raises it (the feature is not there).
    pub python: Option<&'static str>,
    /// Its Go sentinel error; `None` for a kind that only groups others (Go's errors are flat:
    /// `errors.Is` matches the refined kind's sentinel) or one the Go client never returns.
    pub go: Option<GoSentinel>,
    /// Its Java exception class (package `dev.agentbox`); `None` where the Java client never
    /// throws it.
    pub java: Option<&'static str>,
}

/// A Go sentinel error: `var Name = errors.New(Message)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoSentinel {
    /// The variable (`ErrSandboxNotReady`).
    pub name: &'static str,
    /// Its `Error()` text.
    pub message: &'static str,
    /// What Go's doc comment says beyond [`ErrorKind::doc`]: the typed error that carries the
    /// details, the options that lead to it. Empty when nothing.
    pub note: &'static str,
}

const fn go(name: &'static str, message: &'static str, note: &'static str) -> Option<GoSentinel> {
    Some(GoSentinel {
        name,
        message,
        note,
    })
}

/// Every kind, parents before the kinds that refine them.
pub const KINDS: &[ErrorKind] = &[
    ErrorKind {
        name: "InvalidRequest",
        parent: None,
        doc: "a request refused before anything was sent (bad scope, argv, environment name, timeout...).",
        python: Some("InvalidRequestError"),
        go: go("ErrInvalid", "agentbox: invalid request", ""),
        java: Some("InvalidRequestException"),
    },
    ErrorKind {
        name: "Path",
        parent: Some("InvalidRequest"),
        doc: "a workspace path refused: DotDot, OutsideRoot, Invalid (by the client, before any request) or Escapes (in the pod: a symlink leads out).",
        python: Some("PathError"),
        go: go("ErrPath", "agentbox: path refused", "PathError says why."),
        java: Some("PathException"),
    },
    ErrorKind {
        name: "Api",
        parent: None,
        doc: "the API server refused a request, in its own words (a refusal no narrower kind names).",
        python: Some("ApiError"),
        go: go("ErrAPI", "agentbox: API error", "APIError has the status."),
        java: Some("ApiException"),
    },
    ErrorKind {
        name: "InvalidSpec",
        parent: Some("Api"),
        doc: "the API server refused an object as invalid (HTTP 422): its schema or CEL rules.",
        python: Some("InvalidSpecError"),
        go: go(
            "ErrInvalidSpec",
            "agentbox: invalid spec",
            "An APIError of status 422, which is ErrAPI too.",
        ),
        java: Some("InvalidSpecException"),
    },
    ErrorKind {
        name: "Conflict",
        parent: Some("Api"),
        doc: "the API server refused a write that lost a race (HTTP 409): the object exists already, or changed since it was read.",
        python: Some("ConflictError"),
        go: go("ErrConflict", "agentbox: conflict", ""),
        java: Some("ConflictException"),
    },
    ErrorKind {
        name: "NotFound",
        parent: None,
        doc: "the object (Sandbox, snapshot, template, pod) does not exist.",
        python: Some("NotFoundError"),
        go: go(
            "ErrNotFound",
            "agentbox: not found",
            "An APIError of status 404.",
        ),
        java: Some("NotFoundException"),
    },
    ErrorKind {
        name: "FileNotFound",
        parent: Some("NotFound"),
        doc: "a workspace path is missing or of the wrong type (not a file, not a directory).",
        python: Some("RemoteFileNotFoundError"),
        go: go("ErrFileNotFound", "agentbox: file not found", ""),
        java: Some("RemoteFileNotFoundException"),
    },
    ErrorKind {
        name: "Transport",
        parent: None,
        doc: "the API server or the exec connection could not be reached, or broke mid-way (a command may or may not have run).",
        python: Some("TransportError"),
        go: go("ErrTransport", "agentbox: transport error", ""),
        java: Some("TransportException"),
    },
    ErrorKind {
        name: "Protocol",
        parent: None,
        doc: "the API server or the pod answered something this client cannot read.",
        python: Some("ProtocolError"),
        go: go("ErrProtocol", "agentbox: protocol error", ""),
        java: Some("ProtocolException"),
    },
    ErrorKind {
        name: "SandboxNotReady",
        parent: None,
        doc: "the wait for a Sandbox to become Ready timed out, with its phase and the condition that says why.",
        python: Some("SandboxNotReadyError"),
        go: go(
            "ErrSandboxNotReady",
            "agentbox: sandbox not ready",
            "SandboxError has the details.",
        ),
        java: Some("SandboxNotReadyException"),
    },
    ErrorKind {
        name: "SandboxFailed",
        parent: Some("SandboxNotReady"),
        doc: "the Sandbox failed, or its start is Stalled: waiting will not make it Ready.",
        python: Some("SandboxFailedError"),
        go: go(
            "ErrSandboxFailed",
            "agentbox: sandbox failed",
            "SandboxError has the details.",
        ),
        java: Some("SandboxFailedException"),
    },
    ErrorKind {
        name: "SandboxSuspended",
        parent: Some("SandboxNotReady"),
        doc: "the Sandbox's spec suspends it: resume it rather than wait.",
        python: Some("SandboxSuspendedError"),
        go: go(
            "ErrSandboxSuspended",
            "agentbox: sandbox suspended",
            "SandboxError has the details.",
        ),
        java: Some("SandboxSuspendedException"),
    },
    ErrorKind {
        name: "SandboxNotDeleted",
        parent: None,
        doc: "a deleted Sandbox still existed when the wait stopped (its finalizer's cleanup, the on-stop snapshot among it, was not done).",
        python: Some("SandboxNotDeletedError"),
        go: go(
            "ErrSandboxNotDeleted",
            "agentbox: sandbox not deleted",
            "SandboxError has the details.",
        ),
        java: Some("SandboxNotDeletedException"),
    },
    ErrorKind {
        name: "SnapshotFailed",
        parent: None,
        doc: "a snapshot failed, was not Ready in time, or cannot be restored.",
        python: Some("SnapshotFailedError"),
        go: go(
            "ErrSnapshotFailed",
            "agentbox: snapshot failed",
            "SnapshotError has the details.",
        ),
        java: Some("SnapshotFailedException"),
    },
    ErrorKind {
        name: "ScopeMismatch",
        parent: None,
        doc: "the scope's Sandbox name holds a Sandbox of another scope (made by hand).",
        python: Some("ScopeMismatchError"),
        go: go("ErrScopeMismatch", "agentbox: scope mismatch", ""),
        java: Some("ScopeMismatchException"),
    },
    ErrorKind {
        name: "Exec",
        parent: None,
        doc: "a command could not be run or its result not read whole (the kinds that refine it say how).",
        python: Some("ExecError"),
        go: None,
        java: Some("ExecException"),
    },
    ErrorKind {
        name: "CommandNotStarted",
        parent: Some("Exec"),
        doc: "the runtime could not start the command (the container is not running; a program that does not exist is exit code 127 instead).",
        python: Some("CommandNotStartedError"),
        go: go("ErrCommandNotStarted", "agentbox: command not started", ""),
        java: Some("CommandNotStartedException"),
    },
    ErrorKind {
        name: "Command",
        parent: Some("Exec"),
        doc: "a command exited non-zero where success was required; the error carries its result.",
        python: Some("CommandError"),
        go: go(
            "ErrCommand",
            "agentbox: command failed",
            "CommandError has the result.",
        ),
        java: Some("CommandException"),
    },
    ErrorKind {
        name: "ExecTimeout",
        parent: Some("Exec"),
        doc: "the command's timeout passed and it was killed with its whole process group; the error carries the output until then.",
        python: Some("ExecTimeoutError"),
        go: go(
            "ErrExecTimeout",
            "agentbox: command timed out",
            "ExecTimeoutError has the result.",
        ),
        java: Some("ExecTimeoutException"),
    },
    ErrorKind {
        name: "OutputCut",
        parent: Some("Exec"),
        doc: "a stream of the command's output ended without its trailer: output was lost on the way (kubernetes/kubernetes#124571), never a short result instead.",
        python: Some("OutputCutError"),
        go: go(
            "ErrOutputCut",
            "agentbox: output cut",
            "OutputCutError names the stream.",
        ),
        java: Some("OutputCutException"),
    },
    ErrorKind {
        name: "OutputTruncated",
        parent: Some("Exec"),
        doc: "a command printed more than its output cap and the caller asked for an error rather than a truncated result.",
        python: None,
        go: go(
            "ErrOutputTruncated",
            "agentbox: output truncated",
            "Asked for by ExecOptions.FailTruncated beyond ExecOptions.MaxOutput; OutputTruncatedError has the result.",
        ),
        java: None,
    },
    ErrorKind {
        name: "OutOfMemory",
        parent: Some("Exec"),
        doc: "the command was killed for memory: by the kernel's OOM killer when its container reached its memory limit, or with the whole sandbox container (the kubelet's OOMKilled) while it ran.",
        python: Some("OutOfMemoryError"),
        go: go(
            "ErrOutOfMemory",
            "agentbox: out of memory",
            "OutOfMemoryError says which.",
        ),
        java: Some("OutOfMemoryException"),
    },
    ErrorKind {
        name: "Session",
        parent: Some("Exec"),
        doc: "a persistent session's shell died or its framing broke while a command ran (the command may have run).",
        python: Some("SessionError"),
        go: go("ErrSession", "agentbox: session error", ""),
        java: Some("SessionException"),
    },
    ErrorKind {
        name: "Remote",
        parent: None,
        doc: "a file operation's script failed in the pod, with its exit code and stderr.",
        python: Some("RemoteError"),
        go: go(
            "ErrRemote",
            "agentbox: remote error",
            "RemoteError has the exit code.",
        ),
        java: Some("RemoteException"),
    },
    ErrorKind {
        name: "UploadSpool",
        parent: Some("Remote"),
        doc: "a directory upload's archive could not be written to its spool in the pod, most often because the workspace's disk is full: nothing was extracted and no spool is left.",
        python: Some("UploadSpoolError"),
        go: go(
            "ErrUploadSpool",
            "agentbox: upload could not be spooled (is the workspace's disk full?)",
            "A RemoteError with ExitSpoolFailed, so also ErrRemote.",
        ),
        java: Some("UploadSpoolException"),
    },
    ErrorKind {
        name: "UploadTooLarge",
        parent: Some("Remote"),
        doc: "a directory upload would pass the workspace's size limit (the workspace's use, its spool and what extraction needs, against workspace.sizeLimit): refused before anything was extracted, and no spool is left.",
        python: Some("UploadTooLargeError"),
        go: go(
            "ErrUploadTooLarge",
            "agentbox: upload would pass the workspace's size limit",
            "A RemoteError with ExitUploadTooLarge, so also ErrRemote.",
        ),
        java: Some("UploadTooLargeException"),
    },
    ErrorKind {
        name: "FileTooLarge",
        parent: None,
        doc: "a workspace file is larger than the read cap.",
        python: Some("FileTooLargeError"),
        go: go("ErrFileTooLarge", "agentbox: file too large", ""),
        java: Some("FileTooLargeException"),
    },
    ErrorKind {
        name: "Guard",
        parent: None,
        doc: "the scope's execution guard could not be taken or was lost (the kinds that refine it say which).",
        python: Some("GuardError"),
        go: None,
        java: Some("GuardException"),
    },
    ErrorKind {
        name: "GuardTimeout",
        parent: Some("Guard"),
        doc: "the scope's guard stayed held by another until the deadline; the error names who held it last.",
        python: Some("GuardTimeoutError"),
        go: go(
            "ErrGuardTimeout",
            "agentbox: guard timeout",
            "GuardError names the holder.",
        ),
        java: Some("GuardTimeoutException"),
    },
    ErrorKind {
        name: "GuardLost",
        parent: Some("Guard"),
        doc: "the guard was lost (taken over, deleted, or not renewed in time): the guarded work must stop.",
        python: Some("GuardLostError"),
        go: go(
            "ErrGuardLost",
            "agentbox: guard lost",
            "GuardError names the lease.",
        ),
        java: Some("GuardLostException"),
    },
];

/// The kind of this name.
pub fn kind(name: &str) -> Option<&'static ErrorKind> {
    KINDS.iter().find(|k| k.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_parent_is_a_kind_listed_before_the_kinds_it_groups() {
        for (i, k) in KINDS.iter().enumerate() {
            if let Some(p) = k.parent {
                let at = KINDS.iter().position(|x| x.name == p);
                assert!(at.is_some_and(|at| at < i), "{}: parent {p}", k.name);
            }
        }
    }

    #[test]
    fn every_name_is_unique_in_each_language() {
        let picks: [fn(&ErrorKind) -> Option<&'static str>; 4] = [
            |k| Some(k.name),
            |k| k.python,
            |k| k.go.map(|g| g.name),
            |k| k.java,
        ];
        for pick in picks {
            let mut names: Vec<&str> = KINDS.iter().filter_map(pick).collect();
            let n = names.len();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), n);
        }
    }

    #[test]
    fn a_kind_without_a_go_sentinel_groups_others() {
        // Go's errors are flat: a kind with no sentinel must be one that groups others (its
        // refinements have theirs), not one Go would report as something vaguer.
        for k in KINDS.iter().filter(|k| k.go.is_none()) {
            assert!(
                KINDS.iter().any(|x| x.parent == Some(k.name)),
                "{} has no Go sentinel and groups nothing",
                k.name
            );
        }
        // A kind no client raises is dead.
        for k in KINDS {
            let n = [k.python.is_some(), k.go.is_some(), k.java.is_some()]
                .iter()
                .filter(|b| **b)
                .count();
            assert!(n >= 1, "{} is raised by no client", k.name);
        }
    }

    #[test]
    fn a_name_finds_its_kind() {
        assert_eq!(
            kind("SandboxFailed").and_then(|k| k.parent),
            Some("SandboxNotReady")
        );
        assert!(kind("Nope").is_none());
    }
}
