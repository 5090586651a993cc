//! File access in a sandbox's workspace, over exec: read, write (creating parents), list, and
//! directories as tar streamed over stdin/stdout.
//!
//! Every path is confined to the workspace root twice: here, without the pod ([`confine`]
//! refuses `..` and absolute paths outside the root), and in the pod, where the nearest
//! existing ancestor of the path is resolved with `readlink -f` and must still lie under the
//! resolved root, so a symlink cannot lead out of the workspace.

use std::path::Path;

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use super::ClientError;
use agentbox_api::exec::{self, ExecEvent, ExecOutput, ExecRequest, ExecStream, ExitStatus};

pub use agentbox_api::files::{DirEntry, EntryKind};
use agentbox_api::files::{file_argv, parse_listing};
pub use agentbox_api::paths::{PathError, confine};

use agentbox_api::remote::{
    DOWNLOAD, ESCAPES, LIST, MISSING, READ, SPOOL_FAILED, TOO_LARGE, UPLOAD, WRITE,
};

/// Maps a file script's exit to an error.
fn check(path: &str, status: &ExitStatus, stderr: &[u8]) -> Result<(), ClientError> {
    let msg = || String::from_utf8_lossy(stderr).trim().to_string();
    match status.code() {
        Some(0) => Ok(()),
        Some(ESCAPES) => Err(ClientError::Path(PathError::Escapes(path.to_string()))),
        Some(MISSING) => Err(ClientError::NotFound(msg())),
        Some(SPOOL_FAILED) => Err(ClientError::UploadSpool(msg())),
        Some(TOO_LARGE) => Err(ClientError::UploadTooLarge(msg())),
        _ => Err(ClientError::Remote {
            status: status.clone(),
            stderr: msg(),
        }),
    }
}

/// The workspace of one sandbox pod: file operations over exec, confined to `root`. Get one
/// from [`super::SandboxHandle::workspace`], or build one for any pod with [`Workspace::new`].
#[derive(Clone)]
pub struct Workspace {
    pods: Api<Pod>,
    pod: String,
    container: String,
    root: String,
}

impl Workspace {
    /// The workspace at `root` in `container` of `pod`.
    pub fn new(
        pods: Api<Pod>,
        pod: impl Into<String>,
        container: impl Into<String>,
        root: impl Into<String>,
    ) -> Self {
        Workspace {
            pods,
            pod: pod.into(),
            container: container.into(),
            root: root.into(),
        }
    }

    /// The workspace root.
    pub fn root(&self) -> &str {
        &self.root
    }

    async fn exec_raw(&self, req: ExecRequest) -> Result<ExecOutput, ClientError> {
        Ok(exec::run(&self.pods, &self.pod, &self.container, req).await?)
    }

    async fn exec_stream_raw(&self, req: ExecRequest) -> Result<ExecStream, ClientError> {
        Ok(exec::stream(&self.pods, &self.pod, &self.container, req).await?)
    }

    fn file_req(&self, script: &str, path: &str) -> Result<(ExecRequest, String), ClientError> {
        let (argv, p) = file_argv(script, &self.root, path)?;
        Ok((ExecRequest::argv(argv), p))
    }

    /// Reads a file of the workspace (at most `max` bytes; larger files are an error).
    pub async fn read_file_capped(&self, path: &str, max: usize) -> Result<Vec<u8>, ClientError> {
        let (req, p) = self.file_req(READ, path)?;
        let out = self.exec_raw(req.max_output(max)).await?;
        check(&p, &out.status, &out.stderr)?;
        if out.stdout_truncated {
            return Err(ClientError::TooLarge(p, max));
        }
        Ok(out.stdout)
    }

    /// Reads a file of the workspace (up to 64 MiB; see [`Self::read_file_capped`]).
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        self.read_file_capped(path, 64 << 20).await
    }

    /// Writes a file of the workspace atomically (temp file + rename), creating its parent
    /// directories.
    pub async fn write_file(
        &self,
        path: &str,
        content: impl Into<Bytes>,
    ) -> Result<(), ClientError> {
        let (req, p) = self.file_req(WRITE, path)?;
        let out = self
            .exec_raw(req.stdin(content).max_output(64 << 10))
            .await?;
        check(&p, &out.status, &out.stderr)
    }

    /// Lists a directory of the workspace (sorted by name; symlinks are not followed).
    pub async fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, ClientError> {
        let (req, p) = self.file_req(LIST, path)?;
        let out = self.exec_raw(req.max_output(64 << 20)).await?;
        check(&p, &out.status, &out.stderr)?;
        parse_listing(&out.stdout).map_err(ClientError::Protocol)
    }

    /// Uploads the local directory `local` into the workspace directory `remote` (created if
    /// missing; existing files are overwritten). The tar stream is built on the fly, so memory
    /// stays flat here whatever the size; in the pod it is spooled to a file beside the
    /// workspace (under its `.agentbox` state directory) and extracted from there, so the
    /// workspace's disk needs room for the archive as well as its files while the upload lasts
    /// ([`UPLOAD`]). A spool that cannot be written is [`ClientError::UploadSpool`], and an
    /// upload that would pass the workspace's size limit [`ClientError::UploadTooLarge`], each
    /// with nothing extracted. Symlinks are sent as symlinks, never followed.
    pub async fn upload_dir(&self, local: &Path, remote: &str) -> Result<(), ClientError> {
        self.upload_dir_counted(local, remote, |_| {}).await
    }

    /// [`Self::upload_dir`], calling `on_bytes` with each chunk's size as the tar stream is
    /// sent (for a progress display).
    pub async fn upload_dir_counted(
        &self,
        local: &Path,
        remote: &str,
        on_bytes: impl Fn(u64) + Send + 'static,
    ) -> Result<(), ClientError> {
        if !local.is_dir() {
            return Err(ClientError::Local(format!(
                "{} is not a directory",
                local.display()
            )));
        }
        // The destination is confined first by a command without stdin. The upload script
        // confines it again (a symlink may appear in between), but with a streamed stdin the
        // wrapper exits without its linger, so an upload refused at once may lose its trailer
        // (kubernetes/kubernetes#124571) and end in a transport error instead of the refusal
        // (seen once in CI, on a loaded machine); this check reports the refusal itself.
        let (confine, p) = self.file_req(":", remote)?;
        let out = self.exec_raw(confine).await?;
        check(&p, &out.status, &out.stderr)?;
        let (req, p) = self.file_req(UPLOAD, remote)?;
        let (reader, writer) = tokio::io::duplex(256 << 10);
        let src = local.to_path_buf();
        let builder = tokio::task::spawn_blocking(move || {
            let w = tokio_util::io::SyncIoBridge::new(writer);
            let mut b = tar::Builder::new(w);
            b.follow_symlinks(false);
            b.mode(tar::HeaderMode::Complete);
            b.append_dir_all(".", &src)?;
            let mut w = b.into_inner()?;
            std::io::Write::flush(&mut w)?;
            w.shutdown()
        });
        let out = self
            .exec_raw(
                req.stdin_reader(tokio_util::io::InspectReader::new(reader, move |b| {
                    on_bytes(b.len() as u64)
                }))
                .max_output(64 << 10),
            )
            .await;
        let built = builder
            .await
            .map_err(|e| ClientError::Local(format!("tar builder: {e}")))?;
        let out = out?;
        check(&p, &out.status, &out.stderr)?;
        built.map_err(|e| ClientError::Local(format!("archiving {}: {e}", local.display())))
    }

    /// Downloads the workspace directory `remote` into the local directory `local` (created
    /// if missing), streaming the tar archive. Entries that would land outside `local` are
    /// refused by the tar reader.
    pub async fn download_dir(&self, remote: &str, local: &Path) -> Result<(), ClientError> {
        self.download_dir_counted(remote, local, |_| {}).await
    }

    /// [`Self::download_dir`], calling `on_bytes` with each chunk's size as the tar stream
    /// arrives (for a progress display).
    pub async fn download_dir_counted(
        &self,
        remote: &str,
        local: &Path,
        on_bytes: impl Fn(u64),
    ) -> Result<(), ClientError> {
        let (req, p) = self.file_req(DOWNLOAD, remote)?;
        std::fs::create_dir_all(local)
            .map_err(|e| ClientError::Local(format!("{}: {e}", local.display())))?;
        let (reader, mut writer) = tokio::io::duplex(256 << 10);
        let dst = local.to_path_buf();
        let unpacker = tokio::task::spawn_blocking(move || {
            let r = tokio_util::io::SyncIoBridge::new(reader);
            let mut a = tar::Archive::new(r);
            a.set_overwrite(true);
            a.set_preserve_permissions(false);
            let res = a.unpack(&dst);
            // Drain what is left so the writer side never blocks on a failed unpack.
            let mut r = a.into_inner();
            let _ = std::io::copy(&mut r, &mut std::io::sink());
            res
        });
        let mut s = self.exec_stream_raw(req).await?;
        let mut stderr = agentbox_api::exec::Capped::new(64 << 10);
        let mut status = None;
        while let Some(ev) = s.next().await {
            match ev.map_err(ClientError::Exec)? {
                ExecEvent::Stdout(b) => {
                    on_bytes(b.len() as u64);
                    // A failed unpack still drains, so this only fails if the task died.
                    if writer.write_all(&b).await.is_err() {
                        break;
                    }
                }
                ExecEvent::Stderr(b) => stderr.push(&b),
                ExecEvent::Exit { status: st, .. } => status = Some(st),
            }
        }
        let _ = writer.shutdown().await;
        drop(writer);
        let unpacked = unpacker
            .await
            .map_err(|e| ClientError::Local(format!("tar reader: {e}")))?;
        let status = status
            .ok_or_else(|| ClientError::Exec(exec::ExecError::Stream("no exit status".into())))?;
        check(&p, &status, &stderr.buf)?;
        unpacked
            .map_err(|e| ClientError::Local(format!("extracting into {}: {e}", local.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_records_parse() {
        let out = b"81a4 12 1700000000 b file.txt\x0041ed 4096 1700000001 dir\x00a1ff 7 1700000002 link\x00";
        let v = parse_listing(out).unwrap();
        assert_eq!(v.len(), 3);
        assert_eq!(v[0].name, "b file.txt");
        assert_eq!(v[0].kind, EntryKind::File);
        assert_eq!(v[0].mode, 0o644);
        assert_eq!(v[0].size, 12);
        assert_eq!(v[1].kind, EntryKind::Dir);
        assert_eq!(v[1].mode, 0o755);
        assert_eq!(v[2].kind, EntryKind::Symlink);
        assert_eq!(v[2].mtime, 1_700_000_002);
        assert!(parse_listing(b"zz\0").is_err());
        assert!(parse_listing(b"").unwrap().is_empty());
    }

    #[test]
    fn an_upload_s_refusals_are_errors_of_their_own_kinds() {
        let said =
            b"agentbox: the upload would pass the workspace's size limit of 67108864 bytes\n";
        let e = check("/w/d", &ExitStatus::Code(TOO_LARGE), said).unwrap_err();
        assert!(
            matches!(&e, ClientError::UploadTooLarge(m) if m.contains("67108864")),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("size limit of 67108864 bytes"),
            "{e}"
        );
        let e = check("/w/d", &ExitStatus::Code(SPOOL_FAILED), b"No space").unwrap_err();
        assert!(matches!(e, ClientError::UploadSpool(_)), "{e:?}");
        let e = check("/w/d", &ExitStatus::Code(1), b"tar").unwrap_err();
        assert!(matches!(e, ClientError::Remote { .. }), "{e:?}");
    }
}
