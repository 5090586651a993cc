//! `cp`: files or directories between this machine and a sandbox.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use super::Fail;
use super::progress::Progress;
use crate::client::{ClientError, Sandboxes};

#[derive(Args)]
pub(super) struct CpArgs {
    /// Source (`NAME:path` for a sandbox path).
    pub src: String,
    /// Destination (`NAME:path` for a sandbox path).
    pub dst: String,
}

/// `NAME:path` → (NAME, path); a plain local path → None. A leading `./` or `/` marks a
/// local path that contains a colon.
fn remote_spec(s: &str) -> Option<(&str, &str)> {
    if s.starts_with('/') || s.starts_with('.') {
        return None;
    }
    s.split_once(':').filter(|(n, _)| !n.is_empty())
}

/// `agentbox cp`. On a terminal, stderr shows the bytes copied so far.
pub(super) async fn cp(sbx: &Sandboxes, src: &str, dst: &str) -> Result<ExitCode, Fail> {
    match (remote_spec(src), remote_spec(dst)) {
        (Some((name, path)), None) => {
            let h = sbx.open(name).await?;
            let local = PathBuf::from(dst);
            let progress = Progress::on_stderr(format!("{src} → {dst}"), true);
            match h.read_file(path).await {
                Ok(bytes) => {
                    progress.counter()(bytes.len() as u64);
                    let target = if local.is_dir() {
                        let base = path.rsplit('/').find(|c| !c.is_empty()).unwrap_or("file");
                        local.join(base)
                    } else {
                        local
                    };
                    tokio::fs::write(&target, bytes).await?;
                }
                // Not a regular file: copy it as a directory.
                Err(ClientError::NotFound(_)) => {
                    h.download_dir_counted(path, &local, progress.counter())
                        .await?
                }
                Err(e) => return Err(e.into()),
            }
            progress.done();
            Ok(ExitCode::SUCCESS)
        }
        (None, Some((name, path))) => {
            let h = sbx.open(name).await?;
            let local = PathBuf::from(src);
            let progress = Progress::on_stderr(format!("{src} → {dst}"), true);
            if local.is_dir() {
                h.upload_dir_counted(&local, path, progress.counter())
                    .await?;
            } else {
                let bytes = tokio::fs::read(&local)
                    .await
                    .map_err(|e| Fail(format!("{src}: {e}")))?;
                let len = bytes.len() as u64;
                h.write_file(path, bytes).await?;
                progress.counter()(len);
            }
            progress.done();
            Ok(ExitCode::SUCCESS)
        }
        _ => Err(Fail(
            "cp needs exactly one side of the form NAME:path".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_specs() {
        assert_eq!(remote_spec("box:/a/b"), Some(("box", "/a/b")));
        assert_eq!(remote_spec("box:"), Some(("box", "")));
        assert_eq!(remote_spec("./a:b"), None);
        assert_eq!(remote_spec("/tmp/x"), None);
        assert_eq!(remote_spec("local"), None);
    }
}
