//! Which of the error kinds every client shares ([`agentbox_api::kinds`]) a [`ClientError`] is:
//! the names Python's `kind_of`, Go's `KindOf` and Java's `ErrorKind.of` give the same failure.

use agentbox_api::exec::ExecError;
use agentbox_api::guard::GuardError;
use agentbox_api::kinds::{self, ErrorKind};

use super::ClientError;

impl ClientError {
    /// The kind of this error, as every client names it (docs/protocol.md, "Error kinds");
    /// `None` for a local I/O or archive error ([`ClientError::Local`]), which no other client
    /// has. [`ClientError::NotFound`] is `NotFound` for a missing file too: the variant does not
    /// tell the two apart.
    pub fn kind(&self) -> Option<&'static ErrorKind> {
        kinds::kind(self.kind_name()?)
    }

    fn kind_name(&self) -> Option<&'static str> {
        Some(match self {
            ClientError::Kube(e) => kube_kind(e),
            ClientError::Exec(e) => match e {
                ExecError::Invalid(_) => "InvalidRequest",
                ExecError::Connect { .. } | ExecError::Stream(_) => "Transport",
                ExecError::NotStarted(_) => "CommandNotStarted",
                ExecError::Timeout(_) => "ExecTimeout",
                ExecError::Session(_) => "Session",
                ExecError::OutputCut { .. } => "OutputCut",
                ExecError::OutOfMemory { .. } => "OutOfMemory",
            },
            ClientError::Guard(e) => match e {
                GuardError::Timeout { .. } => "GuardTimeout",
                // A handed-over hold that is not the Lease's is one this side lost.
                GuardError::Lost(_) | GuardError::NotHeld { .. } => "GuardLost",
                GuardError::Api { source, .. } => kube_kind(source),
            },
            ClientError::Failed { .. } => "SandboxFailed",
            ClientError::NotReady { .. } => "SandboxNotReady",
            ClientError::NotDeleted { .. } => "SandboxNotDeleted",
            ClientError::NotFound(_) => "NotFound",
            ClientError::Path(_) => "Path",
            ClientError::TooLarge(..) => "FileTooLarge",
            ClientError::Remote { .. } => "Remote",
            ClientError::UploadSpool(_) => "UploadSpool",
            ClientError::UploadTooLarge(_) => "UploadTooLarge",
            ClientError::Protocol(_) => "Protocol",
            ClientError::Local(_) => return None,
            ClientError::Suspended(_) => "SandboxSuspended",
            ClientError::ScopeMismatch(_) => "ScopeMismatch",
        })
    }
}

/// A kube error's kind: a refusal by its status code, a body that does not parse `Protocol`,
/// anything else (no connection, TLS, a timeout) `Transport`.
fn kube_kind(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) => match s.code {
            404 => "NotFound",
            409 => "Conflict",
            422 => "InvalidSpec",
            _ => "Api",
        },
        kube::Error::SerdeError(_) => "Protocol",
        _ => "Transport",
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agentbox_api::exec::ExitStatus;
    use agentbox_api::kinds::KINDS;

    use super::*;
    use crate::client::PathError;

    fn refused(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            ..Default::default()
        }))
    }

    #[test]
    fn every_variant_names_a_kind_of_the_table() {
        let cases: Vec<(ClientError, Option<&str>)> = vec![
            (refused(404).into(), Some("NotFound")),
            (refused(409).into(), Some("Conflict")),
            (refused(422).into(), Some("InvalidSpec")),
            (refused(500).into(), Some("Api")),
            (
                ExecError::Invalid("empty argv".into()).into(),
                Some("InvalidRequest"),
            ),
            (ExecError::Stream("broke".into()).into(), Some("Transport")),
            (
                ExecError::NotStarted("no container".into()).into(),
                Some("CommandNotStarted"),
            ),
            (
                ExecError::Timeout(Duration::from_secs(1)).into(),
                Some("ExecTimeout"),
            ),
            (ExecError::Session("died".into()).into(), Some("Session")),
            (
                ExecError::OutOfMemory { container: true }.into(),
                Some("OutOfMemory"),
            ),
            (
                GuardError::Timeout {
                    name: "l".into(),
                    holder: "h".into(),
                }
                .into(),
                Some("GuardTimeout"),
            ),
            (GuardError::Lost("l".into()).into(), Some("GuardLost")),
            (
                GuardError::Api {
                    name: "l".into(),
                    source: refused(409),
                }
                .into(),
                Some("Conflict"),
            ),
            (
                ClientError::Failed {
                    name: "s".into(),
                    reason: "r".into(),
                    message: "m".into(),
                },
                Some("SandboxFailed"),
            ),
            (
                ClientError::NotReady {
                    name: "s".into(),
                    waited: Duration::from_secs(1),
                    phase: "Pending".into(),
                    reason: String::new(),
                    message: String::new(),
                },
                Some("SandboxNotReady"),
            ),
            (
                ClientError::NotDeleted {
                    name: "s".into(),
                    waited: Duration::from_secs(1),
                },
                Some("SandboxNotDeleted"),
            ),
            (ClientError::NotFound("sandbox s".into()), Some("NotFound")),
            (PathError::DotDot("../x".into()).into(), Some("Path")),
            (ClientError::TooLarge("f".into(), 1), Some("FileTooLarge")),
            (
                ClientError::Remote {
                    status: ExitStatus::Code(1),
                    stderr: String::new(),
                },
                Some("Remote"),
            ),
            (ClientError::UploadSpool("full".into()), Some("UploadSpool")),
            (
                ClientError::UploadTooLarge("limit".into()),
                Some("UploadTooLarge"),
            ),
            (ClientError::Protocol("?".into()), Some("Protocol")),
            (ClientError::Local("io".into()), None),
            (ClientError::Suspended("s".into()), Some("SandboxSuspended")),
            (
                ClientError::ScopeMismatch("s".into()),
                Some("ScopeMismatch"),
            ),
        ];
        for (e, want) in cases {
            let got = e.kind();
            assert_eq!(got.map(|k| k.name), want, "{e:?}");
            if let Some(k) = got {
                assert!(KINDS.contains(k));
            }
        }
    }
}
