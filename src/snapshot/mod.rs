//! Workspace snapshots: tar archives in object storage.
//!
//! - [`archive`]: the operator's tar parser, rules and canonical re-encoding (pure).
//! - [`store`]: the object store and its key layout.
//! - here: the streaming pipelines between the two and an exec stream. Memory stays flat
//!   whatever the archive's size: the sandbox's `tar -c` output flows through the
//!   canonicaliser, whose output is hashed and sent into a multipart upload with at most
//!   [`MAX_PARTS_IN_FLIGHT`] parts of [`PART_SIZE`] buffered; a restore's download flows chunk
//!   by chunk through the canonicaliser, and only its output goes on to the pod.

pub mod archive;
pub mod store;

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use futures::stream::BoxStream;
use futures::{SinkExt, Stream, StreamExt};
use object_store::multipart::{MultipartStore, PartId};
use object_store::path::Path;
use object_store::{
    GetResultPayload, MultipartId, MultipartUpload, ObjectStoreExt, PutPayload, PutResult,
    UploadPart, WriteMultipart,
};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::io::ReaderStream;

use archive::{Canonicalizer, Limits, Refusal, Summary};
use store::{Commit, SnapshotKeys, Store, StoreError};

/// Size of each multipart part (the S3 minimum is 5 MiB).
pub const PART_SIZE: usize = 5 << 20;
/// Parts uploading at once; with the part being filled this bounds buffered data at
/// `(MAX_PARTS_IN_FLIGHT + 1) * PART_SIZE`.
pub const MAX_PARTS_IN_FLIGHT: usize = 2;
/// Canonical output is handed on in pieces of at least this size (a stream of small files
/// arrives in small chunks; one upload put or one stdin frame per chunk would cost more).
const OUTPUT_CHUNK: usize = 256 << 10;

/// Snapshot and restore failures.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The archive was refused.
    #[error("archive refused: {0}")]
    Refused(#[from] Refusal),
    /// The source of the archive (the `tar -c` in the pod) failed.
    #[error("archive source: {0}")]
    Source(String),
    /// The object to restore does not exist.
    #[error("snapshot object {0} is missing")]
    Missing(String),
    /// The scope's guard (the operator's, or the hold a harness handed over) was lost or not
    /// held while the archive was read.
    #[error("guard: {0}")]
    Guard(String),
    /// The stream between the operator and the sandbox stopped moving.
    #[error("the sandbox's stream stalled: {0}")]
    Stalled(#[from] crate::progress::Stalled),
}

impl From<object_store::Error> for SnapshotError {
    fn from(e: object_store::Error) -> Self {
        SnapshotError::Store(StoreError::ObjectStore(e))
    }
}

/// The reason of a stream between the operator and a sandbox that stopped moving.
pub const STREAM_STALLED: &str = "StreamStalled";

/// The object version of an object that does not exist.
pub const ABSENT: &str = "absent";

/// The version of a stored object (its ETag, else size and modification time), or [`ABSENT`]:
/// what a permanently refused restore was judged against, so that a new object is tried.
pub async fn object_version(
    store: &Store,
    key: &Path,
) -> Result<(String, Option<u64>), SnapshotError> {
    match store.inner().head(key).await {
        Ok(m) => {
            let mut v = m
                .e_tag
                .clone()
                .unwrap_or_else(|| format!("{}@{}", m.size, m.last_modified.to_rfc3339()));
            if let Some(version) = &m.version {
                v = format!("{v}/{version}");
            }
            Ok((v, Some(m.size)))
        }
        Err(object_store::Error::NotFound { .. }) => Ok((ABSENT.to_string(), None)),
        Err(e) => Err(e.into()),
    }
}

/// The static reason of a permanent refusal read back from a status by name.
pub fn permanent_reason(name: &str) -> &'static str {
    Refusal::REASONS
        .iter()
        .chain(&["ObjectMissing"])
        .find(|r| **r == name)
        .copied()
        .unwrap_or("RestoreRefused")
}

impl SnapshotError {
    /// Whether the error stands until the object, the record or the rules change: a refused
    /// archive (digest and size mismatches included) or a missing object. Store and stream
    /// errors may pass.
    pub fn is_permanent(&self) -> bool {
        matches!(self, SnapshotError::Refused(_) | SnapshotError::Missing(_))
    }

    /// A CamelCase reason for conditions.
    pub fn reason(&self) -> &'static str {
        match self {
            SnapshotError::Store(_) => "StoreError",
            SnapshotError::Refused(r) => r.reason(),
            SnapshotError::Source(_) => "ArchiveFailed",
            SnapshotError::Missing(_) => "ObjectMissing",
            SnapshotError::Stalled(_) => STREAM_STALLED,
            SnapshotError::Guard(_) => "GuardLost",
        }
    }
}

/// Streams `chunks` (the sandbox's tar archive) through the canonicaliser into a multipart
/// upload: the upload `id` made by [`Store::create_upload`] when the store has a multipart API
/// (at the final key, left uncompleted: the returned [`Commit`] completes it), else a new one
/// at `keys.temp` (renamed by the commit). Every member is checked by the restore's rules with
/// `limits`, so an archive that could not be restored (an absolute symlink, too many
/// members...) is refused now rather than stored as a snapshot that can never come back; what
/// is stored is the operator's own canonical re-encoding, and the summary (digest, size,
/// members) is that of the stored bytes. On any error the upload is aborted and the error
/// returned; the caller commits ([`Store::commit`]) only after success.
///
/// `on_end` runs once, as soon as the archive's end-of-archive marker has been read: the
/// source may stop then (see the snapshot controller's `TAR_SCRIPT`, which waits for it).
pub async fn upload<S>(
    store: &Store,
    keys: &SnapshotKeys,
    id: Option<&MultipartId>,
    limits: Limits,
    mut chunks: S,
    on_end: impl FnOnce(),
) -> Result<(Summary, Commit), SnapshotError>
where
    S: Stream<Item = Result<Bytes, SnapshotError>> + Unpin,
{
    let mut on_end = Some(on_end);
    let finished = Arc::new(Mutex::new(None));
    let up: Box<dyn MultipartUpload> = match (id, store.multipart()) {
        (Some(id), Some(m)) => Box::new(KnownUpload {
            store: m.clone(),
            path: store.upload_key(keys).clone(),
            id: id.clone(),
            parts: Arc::default(),
            next: 0,
            finished: finished.clone(),
        }),
        _ => store.inner().put_multipart(&keys.temp).await?,
    };
    let mut w = WriteMultipart::new_with_chunk_size(up, PART_SIZE);
    let mut canon = Canonicalizer::snapshot(limits);
    let mut out = BytesMut::new();
    let failed = loop {
        let Some(next) = chunks.next().await else {
            break None;
        };
        let chunk = match next {
            Ok(c) => c,
            Err(e) => break Some(e),
        };
        if let Err(r) = canon.feed(&chunk, &mut out) {
            break Some(r.into());
        }
        if canon.ended()
            && let Some(f) = on_end.take()
        {
            f();
        }
        if out.len() >= OUTPUT_CHUNK {
            if let Err(e) = w.wait_for_capacity(MAX_PARTS_IN_FLIGHT).await {
                break Some(e.into());
            }
            w.put(out.split().freeze());
        }
    };
    if let Some(e) = failed {
        let _ = w.abort().await;
        return Err(e);
    }
    let summary = match canon.finish(&mut out) {
        Ok(s) => s,
        Err(r) => {
            let _ = w.abort().await;
            return Err(r.into());
        }
    };
    w.put(out.freeze());
    w.finish().await?;
    let commit = match (id, finished.lock().map_err(|_| poisoned())?.take()) {
        (Some(id), Some(parts)) => Commit::Complete {
            id: id.clone(),
            parts,
        },
        _ => Commit::Rename,
    };
    Ok((summary, commit))
}

/// A multipart upload continued by its id (object_store's own `put_multipart` hides the id,
/// so an upload cut short by a kill could not be aborted later). "Completing" it only hands
/// its parts to `finished`: the upload is at the final key, and completing it there is the
/// snapshot's commit, made once the caller knows the snapshot is good.
struct KnownUpload {
    store: Arc<dyn MultipartStore>,
    path: Path,
    id: MultipartId,
    /// Finished parts by index (they may finish out of order).
    parts: Arc<Mutex<Vec<(usize, PartId)>>>,
    next: usize,
    /// The parts in order, once every one is uploaded.
    finished: Arc<Mutex<Option<Vec<PartId>>>>,
}

impl std::fmt::Debug for KnownUpload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KnownUpload")
            .field("path", &self.path)
            .field("id", &self.id)
            .field("next", &self.next)
            .finish()
    }
}

/// A part upload panicked while holding the part list.
fn poisoned() -> object_store::Error {
    object_store::Error::Generic {
        store: "snapshot",
        source: "part list poisoned".into(),
    }
}

#[async_trait::async_trait]
impl MultipartUpload for KnownUpload {
    fn put_part(&mut self, data: PutPayload) -> UploadPart {
        let idx = self.next;
        self.next += 1;
        let (store, path, id, parts) = (
            self.store.clone(),
            self.path.clone(),
            self.id.clone(),
            self.parts.clone(),
        );
        Box::pin(async move {
            let part = store.put_part(&path, &id, idx, data).await?;
            parts.lock().map_err(|_| poisoned())?.push((idx, part));
            Ok(())
        })
    }

    async fn complete(&mut self) -> object_store::Result<PutResult> {
        let mut done = self.parts.lock().map_err(|_| poisoned())?.clone();
        done.sort_by_key(|(i, _)| *i);
        if done.len() != self.next {
            return Err(object_store::Error::Generic {
                store: "snapshot",
                source: format!("{} of {} parts uploaded", done.len(), self.next).into(),
            });
        }
        let parts = done.into_iter().map(|(_, p)| p).collect();
        *self.finished.lock().map_err(|_| poisoned())? = Some(parts);
        Ok(PutResult {
            e_tag: None,
            version: None,
            extensions: Default::default(),
        })
    }

    async fn abort(&mut self) -> object_store::Result<()> {
        self.store.abort_multipart(&self.path, &self.id).await
    }
}

/// Read size for objects of a `file://` store. object_store's own stream reads a local file
/// 8 KiB at a time, each read a blocking-pool task: 275 MiB/s where 1 MiB reads give 1.2 GiB/s
/// (512 MiB, download and validation alone, on the development machine).
const FILE_READ_CHUNK: usize = 1 << 20;

/// An object's bytes as a stream, and its size. Missing objects are [`SnapshotError::Missing`].
pub async fn object_stream(
    store: &Store,
    key: &Path,
) -> Result<(u64, BoxStream<'static, Result<Bytes, SnapshotError>>), SnapshotError> {
    let got = match store.inner().get(key).await {
        Ok(g) => g,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(SnapshotError::Missing(key.to_string()));
        }
        Err(e) => return Err(e.into()),
    };
    let size = got.meta.size;
    let stream = match got.payload {
        GetResultPayload::File(file, path) => {
            let shown = path.display().to_string();
            // A fresh whole-object get: the file is open at offset 0.
            let reader = tokio::fs::File::from_std(file).take(size);
            ReaderStream::with_capacity(reader, FILE_READ_CHUNK)
                .map(move |r| {
                    r.map_err(|source| {
                        SnapshotError::Store(StoreError::Io {
                            path: shown.clone(),
                            source,
                        })
                    })
                })
                .boxed()
        }
        GetResultPayload::Stream(s) => s.map(|r| r.map_err(SnapshotError::from)).boxed(),
    };
    Ok((size, stream))
}

/// The handle of a restore's download: the task that reads, re-encodes and forwards.
pub type ForwardTask = tokio::task::JoinHandle<Result<Summary, SnapshotError>>;

/// The one pass of a restore: a reader of the *canonical re-encoding* of the object, not of
/// the object itself, so whatever the store holds, only bytes the operator wrote reach the
/// extracting `tar`, and each member only after the rules accepted it (the members before a
/// refused one do reach it, into a staging directory the caller discards). The task's result
/// is the summary of the object read: the caller checks its digest and size
/// ([`archive::verify`]) before using anything that was extracted.
pub async fn canonical_reader(
    store: &Store,
    key: &Path,
    limits: Limits,
) -> Result<(impl AsyncRead + Send + 'static, ForwardTask), SnapshotError> {
    let (total, mut body) = object_stream(store, key).await?;
    let mut canon = Canonicalizer::restore(limits, total);
    canon.check_size(total)?;
    let (mut tx, rx) = futures::channel::mpsc::channel::<std::io::Result<Bytes>>(4);
    let task = tokio::spawn(async move {
        let mut out = BytesMut::new();
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    let _ = tx.send(Err(std::io::Error::other("download failed"))).await;
                    return Err(e);
                }
            };
            if let Err(r) = canon.feed(&chunk, &mut out) {
                let _ = tx.send(Err(std::io::Error::other("archive refused"))).await;
                return Err(r.into());
            }
            if out.len() >= OUTPUT_CHUNK && tx.send(Ok(out.split().freeze())).await.is_err() {
                return Err(SnapshotError::Source("the extracting side stopped".into()));
            }
        }
        let summary = match canon.finish(&mut out) {
            Ok(s) => s,
            Err(r) => {
                let _ = tx.send(Err(std::io::Error::other("archive refused"))).await;
                return Err(r.into());
            }
        };
        if tx.send(Ok(out.freeze())).await.is_err() {
            return Err(SnapshotError::Source("the extracting side stopped".into()));
        }
        Ok(summary)
    });
    Ok((tokio_util::io::StreamReader::new(rx), task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::Digest;
    use store::AbortOutcome;
    use tokio::io::AsyncReadExt;

    fn sample(n_bytes: usize) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let data: Vec<u8> = (0..n_bytes).map(|i| (i * 31 % 251) as u8).collect();
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, "big.bin", data.as_slice()).unwrap();
        let mut d = tar::Header::new_gnu();
        d.set_entry_type(tar::EntryType::Directory);
        d.set_size(0);
        b.append_data(&mut d, "empty", std::io::empty()).unwrap();
        b.into_inner().unwrap()
    }

    /// The canonical re-encoding of an archive.
    fn canonical(bytes: &[u8]) -> Vec<u8> {
        let mut c = Canonicalizer::snapshot(Limits::default());
        let mut out = BytesMut::new();
        c.feed(bytes, &mut out).unwrap();
        c.finish(&mut out).unwrap();
        out.to_vec()
    }

    fn chunks(bytes: &[u8]) -> impl Stream<Item = Result<Bytes, SnapshotError>> + Unpin {
        let v: Vec<Result<Bytes, SnapshotError>> = bytes
            .chunks(64 << 10)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        futures::stream::iter(v)
    }

    #[tokio::test]
    async fn upload_commit_verify_and_read_back() {
        let store = Store::memory("p");
        let keys = store.keys("ns", "key", "uid");
        let bytes = sample(12 << 20);
        let (s, commit) = upload(
            &store,
            &keys,
            None,
            Limits::default(),
            chunks(&bytes),
            || (),
        )
        .await
        .unwrap();
        assert!(
            matches!(commit, Commit::Rename),
            "no upload id: a temporary object"
        );
        // What is stored is the canonical re-encoding, and the summary is its.
        let stored = canonical(&bytes);
        assert_ne!(stored, bytes, "the tar crate's GNU headers are re-encoded");
        assert_eq!(s.size, stored.len() as u64);
        assert_eq!(s.sha256, hex::encode(sha2::Sha256::digest(&stored)));
        assert_eq!(s.members, 2);
        store.commit(&keys, commit).await.unwrap();
        assert_eq!(store.size(&keys.temp).await.unwrap(), None);
        let (mut r, task) = canonical_reader(&store, &keys.object, Limits::default())
            .await
            .unwrap();
        let mut back = Vec::new();
        r.read_to_end(&mut back).await.unwrap();
        assert!(back == stored, "the canonical form re-encodes to itself");
        let read = task.await.unwrap().unwrap();
        assert_eq!(read, s);
        assert!(archive::verify(&read, &s.sha256, Some(s.size)).is_ok());
        assert_eq!(
            archive::verify(&read, &"0".repeat(64), None)
                .unwrap_err()
                .reason(),
            "DigestMismatch"
        );
        let missing = store.keys("ns", "key", "nope").object;
        assert_eq!(
            canonical_reader(&store, &missing, Limits::default())
                .await
                .err()
                .map(|e| e.reason()),
            Some("ObjectMissing")
        );
    }

    /// A `file://` store's objects are read in large chunks, and read back whole.
    #[tokio::test]
    async fn file_objects_are_read_in_large_chunks() {
        let dir = std::env::temp_dir().join(format!("agentbox-read-{}", std::process::id()));
        let store = Store::new(&store::StoreConfig {
            url: format!("file://{}", dir.display()),
            prefix: String::new(),
            s3_endpoint: String::new(),
            s3_region: String::new(),
            s3_path_style: false,
            s3_allow_http: false,
            s3_sign_payload: false,
        })
        .unwrap();
        let key = store.keys("ns", "key", "uid").object;
        let bytes = sample(3 << 20);
        store.inner().put(&key, bytes.clone().into()).await.unwrap();
        let (size, mut body) = object_stream(&store, &key).await.unwrap();
        assert_eq!(size, bytes.len() as u64);
        let mut back = Vec::new();
        let mut chunks = 0;
        while let Some(c) = body.next().await {
            back.extend_from_slice(&c.unwrap());
            chunks += 1;
        }
        assert_eq!(back, bytes);
        assert!(chunks <= 4, "{chunks} chunks for 3 MiB");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The source hears of the archive's end as soon as its marker is read, before what
    /// follows it (tar's record padding) arrives.
    #[tokio::test]
    async fn the_end_of_the_archive_is_announced_when_its_marker_is_read() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let store = Store::memory("");
        let keys = store.keys("ns", "key", "uid");
        let bytes = sample(1 << 20);
        let pulled = Arc::new(AtomicUsize::new(0));
        let at_end = Arc::new(AtomicUsize::new(0));
        // The archive's chunks, then one of padding.
        let n = bytes.len().div_ceil(64 << 10) + 1;
        let p = pulled.clone();
        let source = chunks(&bytes)
            .chain(futures::stream::iter(vec![Ok(Bytes::from(vec![
                0u8;
                8192
            ]))]))
            .inspect(move |_| {
                p.fetch_add(1, Ordering::SeqCst);
            });
        let (a, p) = (at_end.clone(), pulled.clone());
        upload(
            &store,
            &keys,
            None,
            Limits::default(),
            Box::pin(source),
            move || {
                a.fetch_add(p.load(Ordering::SeqCst), Ordering::SeqCst);
            },
        )
        .await
        .unwrap();
        let announced_after = at_end.load(Ordering::SeqCst);
        assert!(announced_after > 0, "never announced");
        assert!(
            announced_after < n,
            "announced only after the padding ({announced_after} of {n} chunks)"
        );
    }

    #[tokio::test]
    async fn a_failing_source_aborts_the_upload() {
        let store = Store::memory("");
        let keys = store.keys("ns", "key", "uid");
        let bytes = sample(1 << 20);
        let half = bytes.len() / 2;
        let s = chunks(&bytes[..half]).chain(futures::stream::iter(vec![Err(
            SnapshotError::Source("tar exited 1".into()),
        )]));
        let e = upload(&store, &keys, None, Limits::default(), s, || ())
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "ArchiveFailed");
        assert_eq!(store.size(&keys.temp).await.unwrap(), None);
        // A truncated archive is refused, not stored.
        let e = upload(
            &store,
            &keys,
            None,
            Limits::default(),
            chunks(&bytes[..half]),
            || (),
        )
        .await
        .unwrap_err();
        assert_eq!(e.reason(), "Truncated");
        assert_eq!(store.size(&keys.temp).await.unwrap(), None);
    }

    #[tokio::test]
    async fn an_upload_by_id_goes_to_the_final_key_unseen_until_committed_or_aborted() {
        let store = Store::memory("");
        let keys = store.keys("ns", "key", "uid");
        let bytes = sample(11 << 20);
        let id = store.create_upload(&keys).await.unwrap().expect("an id");
        let (s, commit) = upload(
            &store,
            &keys,
            Some(&id),
            Limits::default(),
            chunks(&bytes),
            || (),
        )
        .await
        .unwrap();
        assert!(matches!(&commit, Commit::Complete { parts, .. } if parts.len() == 3));
        // Uploaded, but nothing visible until the commit completes the upload in place.
        assert_eq!(store.size(&keys.object).await.unwrap(), None);
        assert_eq!(store.size(&keys.temp).await.unwrap(), None);
        store.commit(&keys, commit).await.unwrap();
        let back = store.inner().get(&keys.object).await.unwrap().bytes().await;
        assert!(back.unwrap() == canonical(&bytes));
        assert_eq!(s.size, canonical(&bytes).len() as u64);
        assert_eq!(store.size(&keys.temp).await.unwrap(), None, "no copy made");
        // Aborting the completed upload by its recorded id (its operator killed between the
        // completion and the status write) is fine and keeps the object.
        assert_eq!(
            store.abort_upload(&keys, &id).await.unwrap(),
            AbortOutcome::Done
        );
        assert!(store.size(&keys.object).await.unwrap().is_some());
        store.delete_snapshot(&keys).await.unwrap();
        // An upload left behind (its operator killed) is aborted by its recorded id: its
        // parts are gone and it can no longer be completed.
        let m = store.multipart().unwrap().clone();
        let left = store.create_upload(&keys).await.unwrap().expect("an id");
        m.put_part(store.upload_key(&keys), &left, 0, bytes.clone().into())
            .await
            .unwrap();
        assert_eq!(
            store.abort_upload(&keys, &left).await.unwrap(),
            AbortOutcome::Done
        );
        assert!(
            m.complete_multipart(store.upload_key(&keys), &left, vec![])
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn an_archive_restore_would_refuse_is_not_stored() {
        let store = Store::memory("");
        let keys = store.keys("ns", "key", "uid");
        let mut b = tar::Builder::new(Vec::new());
        let mut l = tar::Header::new_gnu();
        l.set_entry_type(tar::EntryType::Symlink);
        l.set_size(0);
        b.append_link(&mut l, "python", "/usr/bin/python3").unwrap();
        let bytes = b.into_inner().unwrap();
        let id = store.create_upload(&keys).await.unwrap();
        let e = upload(
            &store,
            &keys,
            id.as_ref(),
            Limits::default(),
            chunks(&bytes),
            || (),
        )
        .await
        .unwrap_err();
        assert_eq!(e.reason(), "SymlinkEscapes");
        assert!(e.to_string().contains("python"), "{e}");
        assert_eq!(store.size(&keys.temp).await.unwrap(), None);
        assert_eq!(store.size(&keys.object).await.unwrap(), None);
        // So are archives over the restore's limits.
        let small = Limits {
            max_input_bytes: 1000,
            ..Limits::default()
        };
        let e = upload(&store, &keys, None, small, chunks(&sample(4096)), || ())
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "InputTooLarge");
    }

    #[tokio::test]
    async fn the_forwarder_stops_before_a_refused_member() {
        let store = Store::memory("");
        let keys = store.keys("ns", "key", "uid");
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(3);
        b.append_data(&mut h, "ok.txt", &b"abc"[..]).unwrap();
        let mut l = tar::Header::new_gnu();
        l.set_entry_type(tar::EntryType::Symlink);
        l.set_size(0);
        b.append_link(&mut l, "etc", "/etc").unwrap();
        let bytes = b.into_inner().unwrap();
        store
            .inner()
            .put(&keys.object, bytes.clone().into())
            .await
            .unwrap();
        let (mut r, task) = canonical_reader(&store, &keys.object, Limits::default())
            .await
            .unwrap();
        let mut back = Vec::new();
        assert!(r.read_to_end(&mut back).await.is_err());
        assert!(back.len() < 1024, "the symlink header was forwarded");
        assert_eq!(task.await.unwrap().unwrap_err().reason(), "SymlinkEscapes");
    }
}
