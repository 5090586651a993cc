//! The operator's object store: built once from a URL, with the snapshot key layout.
//!
//! `file://` (the default, a directory on the operator's host), `s3://bucket` (any
//! S3-compatible server; endpoint, region, path-style and plain HTTP configurable),
//! `gs://bucket` and `az://container`. Credentials come from the operator's environment
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `GOOGLE_SERVICE_ACCOUNT`,
//! `AZURE_STORAGE_ACCOUNT_KEY`, ...), as `object_store`'s `from_env` builders read them; they
//! never pass through specs, statuses, Events or logs ([`Store`]'s `Display` shows only the
//! scheme, bucket and prefix).
//!
//! Key layout, below the configured prefix:
//! `<prefix>/<namespace>/<scope-key>/<snapshot-uid>.tar` and `<...>.json` (the [`Manifest`]),
//! A multipart upload (S3, GCS, Azure) goes straight to `<...>.tar`: it is invisible until
//! completed, and completing it is the commit. Stores without a multipart API (`file://`)
//! write `<...>.tar.tmp` and rename it.

use std::path::PathBuf;
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::multipart::MultipartStore;
use object_store::path::Path;
use object_store::{MultipartId, ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};

/// Default store: a directory on the operator's host.
pub const DEFAULT_STORE_URL: &str = "file:///var/lib/agentbox/snapshots";

/// How to reach the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// `file:///dir`, `s3://bucket`, `gs://bucket`, `az://container` or `memory://` (tests).
    pub url: String,
    /// Key prefix below which everything is written (may be empty).
    pub prefix: String,
    /// S3 endpoint for S3-compatible servers (empty: AWS).
    pub s3_endpoint: String,
    /// S3 region.
    pub s3_region: String,
    /// Path-style S3 requests (`endpoint/bucket/key`) instead of virtual-hosted ones.
    pub s3_path_style: bool,
    /// Allow plain HTTP to the endpoint.
    pub s3_allow_http: bool,
    /// Sign request bodies (SigV4 signed payload) instead of sending `UNSIGNED-PAYLOAD`.
    pub s3_sign_payload: bool,
}

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The URL cannot be used.
    #[error("store URL {url:?}: {why}")]
    BadUrl {
        /// The URL, without any credentials.
        url: String,
        /// What is wrong.
        why: String,
    },
    /// The object store refused or failed.
    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),
    /// A local directory could not be prepared.
    #[error("store directory {path}: {source}")]
    Io {
        /// Directory.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A manifest could not be encoded or decoded.
    #[error("manifest: {0}")]
    Manifest(#[from] serde_json::Error),
}

/// How [`Store::abort_upload`] went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AbortOutcome {
    /// Aborted, or nothing was left to abort.
    Done,
    /// The store answered 403 Forbidden. S3 answers an unknown upload id with 404, but some
    /// S3-compatible servers (s3s-fs) with 403, and s3s-fs forgets an upload before it has
    /// written the object, so a completion cut short (its operator killed) leaves an id that
    /// only ever gets 403. A 403 may also be a bucket policy without
    /// `s3:AbortMultipartUpload`. Retrying tells the two apart no better and changes neither,
    /// so the caller goes on and says so (an Event); the message is the store's answer.
    Refused(String),
}

/// The JSON manifest written beside each tarball.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Manifest format version.
    pub version: u32,
    /// Key of the tarball.
    pub object_key: String,
    /// Hex SHA-256 of the tarball.
    pub sha256: String,
    /// Tarball size in bytes.
    pub size_bytes: u64,
    /// Archive members.
    pub members: u64,
    /// Namespace of the snapshot and sandbox.
    pub namespace: String,
    /// Name of the SandboxSnapshot.
    pub snapshot: String,
    /// UID of the SandboxSnapshot.
    pub snapshot_uid: String,
    /// Name of the Sandbox.
    pub sandbox: String,
    /// Scope kind (`session`, `user`, `agent`, `global`).
    pub scope: String,
    /// Scope key.
    pub scope_key: String,
    /// RFC 3339 time the snapshot was committed.
    pub created: String,
    /// Version of the operator that wrote it.
    pub operator_version: String,
}

/// Where one snapshot's objects live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotKeys {
    /// The committed tarball.
    pub object: Path,
    /// The manifest.
    pub manifest: Path,
    /// The upload target before commit.
    pub temp: Path,
}

/// How an uploaded snapshot becomes visible ([`Store::commit`]).
#[derive(Debug, Clone)]
pub enum Commit {
    /// Complete the multipart upload `id` at the final key with these parts, in order.
    Complete {
        /// The upload.
        id: MultipartId,
        /// Its parts, in order.
        parts: Vec<object_store::multipart::PartId>,
    },
    /// Rename the temporary object to the final key.
    Rename,
}

/// One object store per operator, with the key layout.
#[derive(Clone)]
pub struct Store {
    inner: Arc<dyn ObjectStore>,
    /// The same store's multipart API, for stores that have one (S3, GCS, Azure, memory):
    /// uploads are created by id, so an upload a killed operator left can be aborted by that
    /// id. `None` for `file://`, whose staged part files are removed by name instead.
    multipart: Option<Arc<dyn MultipartStore>>,
    prefix: String,
    /// For `file://`: the directory, to clean up staged multipart files a crash left behind.
    local_root: Option<PathBuf>,
    display: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("inner", &self.inner)
            .field("multipart", &self.multipart.is_some())
            .field("prefix", &self.prefix)
            .field("local_root", &self.local_root)
            .finish()
    }
}

impl std::fmt::Display for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display)
    }
}

/// The URL without user info, query or fragment, for messages.
fn redact(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    format!("{scheme}://{rest}")
}

impl Store {
    /// Builds the store. `file://` directories are created.
    pub fn new(cfg: &StoreConfig) -> Result<Store, StoreError> {
        // The cloud clients speak rustls with whatever provider the process installed; use
        // ring, as the Kubernetes client does. Installing twice is harmless (the first wins).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let shown = redact(&cfg.url);
        let bad = |why: &str| StoreError::BadUrl {
            url: shown.clone(),
            why: why.to_string(),
        };
        let (scheme, rest) = cfg
            .url
            .split_once("://")
            .ok_or_else(|| bad("expected scheme://..."))?;
        let bucket = || {
            let b = rest.split('/').next().unwrap_or_default();
            if b.is_empty() || b.contains('@') {
                Err(bad(
                    "expected scheme://bucket (credentials go in the environment)",
                ))
            } else {
                Ok(b.to_string())
            }
        };
        // A path after the bucket joins the prefix.
        let url_path = rest
            .split_once('/')
            .map(|(_, p)| p.trim_matches('/').to_string())
            .unwrap_or_default();
        let mut local_root = None;
        let mut multipart: Option<Arc<dyn MultipartStore>> = None;
        let (inner, url_prefix): (Arc<dyn ObjectStore>, String) = match scheme {
            "file" => {
                let dir = PathBuf::from(if rest.is_empty() { "/" } else { rest });
                if !dir.is_absolute() {
                    return Err(bad("file:// needs an absolute path"));
                }
                std::fs::create_dir_all(&dir).map_err(|source| StoreError::Io {
                    path: dir.display().to_string(),
                    source,
                })?;
                local_root = Some(dir.clone());
                (
                    Arc::new(LocalFileSystem::new_with_prefix(&dir)?),
                    String::new(),
                )
            }
            "memory" => {
                let m = Arc::new(InMemory::new());
                multipart = Some(m.clone());
                (m, String::new())
            }
            "s3" => {
                let mut b = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket()?)
                    .with_virtual_hosted_style_request(!cfg.s3_path_style)
                    .with_allow_http(cfg.s3_allow_http)
                    // Unsigned unless asked: the archive's digest is checked end to end.
                    .with_unsigned_payload(!cfg.s3_sign_payload);
                if !cfg.s3_region.is_empty() {
                    b = b.with_region(&cfg.s3_region);
                }
                if !cfg.s3_endpoint.is_empty() {
                    b = b.with_endpoint(&cfg.s3_endpoint);
                }
                let s = Arc::new(b.build()?);
                multipart = Some(s.clone());
                (s, url_path)
            }
            "gs" => {
                let b = GoogleCloudStorageBuilder::from_env().with_bucket_name(bucket()?);
                let s = Arc::new(b.build()?);
                multipart = Some(s.clone());
                (s, url_path)
            }
            "az" | "azure" => {
                let b = MicrosoftAzureBuilder::from_env().with_container_name(bucket()?);
                let s = Arc::new(b.build()?);
                multipart = Some(s.clone());
                (s, url_path)
            }
            _ => return Err(bad("supported schemes: file, s3, gs, az")),
        };
        let prefix = [url_prefix.as_str(), cfg.prefix.trim_matches('/')]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("/");
        Ok(Store {
            inner,
            multipart,
            display: if prefix.is_empty() {
                shown
            } else {
                format!("{shown} (prefix {prefix})")
            },
            prefix,
            local_root,
        })
    }

    /// A store over an already built object store (tests, tools).
    pub fn from_object_store(inner: Arc<dyn ObjectStore>, prefix: &str) -> Store {
        Store {
            inner,
            multipart: None,
            prefix: prefix.trim_matches('/').to_string(),
            local_root: None,
            display: "custom".into(),
        }
    }

    /// A store over an already built object store with a multipart API (tests, tools).
    pub fn from_multipart_store<T: ObjectStore + MultipartStore>(
        inner: Arc<T>,
        prefix: &str,
    ) -> Store {
        Store {
            multipart: Some(inner.clone()),
            ..Store::from_object_store(inner, prefix)
        }
    }

    /// An in-memory store (tests), with its multipart API.
    pub fn memory(prefix: &str) -> Store {
        let m = Arc::new(InMemory::new());
        Store {
            inner: m.clone(),
            multipart: Some(m),
            prefix: prefix.trim_matches('/').to_string(),
            local_root: None,
            display: "memory://".into(),
        }
    }

    /// The underlying object store.
    pub fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    /// The multipart API, when the store has one.
    pub fn multipart(&self) -> Option<&Arc<dyn MultipartStore>> {
        self.multipart.as_ref()
    }

    /// Where an upload writes: the final key for stores with a multipart API (an unfinished
    /// multipart upload is invisible, so no copy is needed to commit it — S3 has no rename,
    /// and its single copy stops at 5 GB), else the temporary key, renamed on commit.
    pub fn upload_key<'a>(&self, keys: &'a SnapshotKeys) -> &'a Path {
        if self.multipart.is_some() {
            &keys.object
        } else {
            &keys.temp
        }
    }

    /// Starts a multipart upload to [`Store::upload_key`] and returns its id, for stores with a
    /// multipart API (`None` otherwise). Record the id before uploading parts, so that an
    /// upload cut short can be aborted ([`Store::abort_upload`]) by whoever finds it.
    pub async fn create_upload(
        &self,
        keys: &SnapshotKeys,
    ) -> Result<Option<MultipartId>, StoreError> {
        match &self.multipart {
            Some(m) => Ok(Some(m.create_multipart(&keys.object).await?)),
            None => Ok(None),
        }
    }

    /// Aborts the multipart upload `id` to [`Store::upload_key`], freeing its parts. An upload that no
    /// longer exists (completed or aborted before) is fine.
    pub async fn abort_upload(
        &self,
        keys: &SnapshotKeys,
        id: &str,
    ) -> Result<AbortOutcome, StoreError> {
        let Some(m) = &self.multipart else {
            return Ok(AbortOutcome::Done);
        };
        // Uploads go straight to the final key, where the object appears only when its upload
        // completes: an object there means this upload completed (an operator killed between
        // the completion and its status write), and its id is no longer open. S3 answers an
        // abort of it with 404, some S3-compatible servers (s3s-fs) with 403.
        if self.size(&keys.object).await?.is_some() {
            return Ok(AbortOutcome::Done);
        }
        match m.abort_multipart(&keys.object, &id.to_string()).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(AbortOutcome::Done),
            Err(e @ object_store::Error::PermissionDenied { .. }) => {
                Ok(AbortOutcome::Refused(e.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The keys of a snapshot.
    pub fn keys(&self, namespace: &str, scope_key: &str, snapshot_uid: &str) -> SnapshotKeys {
        let base = [self.prefix.as_str(), namespace, scope_key]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("/");
        SnapshotKeys {
            object: Path::from(format!("{base}/{snapshot_uid}.tar")),
            manifest: Path::from(format!("{base}/{snapshot_uid}.json")),
            temp: Path::from(format!("{base}/{snapshot_uid}.tar.tmp")),
        }
    }

    /// Size of an object, `None` when it does not exist.
    pub async fn size(&self, key: &Path) -> Result<Option<u64>, StoreError> {
        match self.inner.head(key).await {
            Ok(m) => Ok(Some(m.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes an object; absent is fine.
    pub async fn delete(&self, key: &Path) -> Result<(), StoreError> {
        match self.inner.delete(key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Removes an upload's temporary object, and for `file://` the staged part files a killed
    /// upload leaves beside it (`<temp>#<n>`). The parts of an S3-style multipart upload are
    /// not objects: they go with [`Store::abort_upload`].
    pub async fn delete_temp(&self, keys: &SnapshotKeys) -> Result<(), StoreError> {
        self.delete(&keys.temp).await?;
        if let Some(root) = &self.local_root {
            let file = root.join(keys.temp.as_ref());
            if let (Some(dir), Some(name)) = (file.parent(), file.file_name()) {
                let staged = format!("{}#", name.to_string_lossy());
                if let Ok(entries) = std::fs::read_dir(dir) {
                    for e in entries.flatten() {
                        if e.file_name().to_string_lossy().starts_with(&staged) {
                            let _ = std::fs::remove_file(e.path());
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Makes an upload visible at its final key: completes a multipart upload there, or
    /// renames the temporary object.
    pub async fn commit(&self, keys: &SnapshotKeys, c: Commit) -> Result<(), StoreError> {
        match (c, &self.multipart) {
            (Commit::Complete { id, parts }, Some(m)) => {
                m.complete_multipart(&keys.object, &id, parts).await?;
            }
            (Commit::Complete { .. }, None) => {
                return Err(object_store::Error::NotSupported {
                    source: "multipart completion on a store without a multipart API".into(),
                }
                .into());
            }
            (Commit::Rename, _) => self.inner.rename(&keys.temp, &keys.object).await?,
        }
        Ok(())
    }

    /// Writes a manifest.
    pub async fn put_manifest(&self, key: &Path, m: &Manifest) -> Result<(), StoreError> {
        let body = serde_json::to_vec_pretty(m)?;
        self.inner.put(key, PutPayload::from(body)).await?;
        Ok(())
    }

    /// Reads a manifest, `None` when absent.
    pub async fn get_manifest(&self, key: &Path) -> Result<Option<Manifest>, StoreError> {
        match self.inner.get(key).await {
            Ok(r) => {
                let bytes = r.bytes().await?;
                Ok(Some(serde_json::from_slice(&bytes)?))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes a snapshot's tarball, manifest and any temporary object.
    pub async fn delete_snapshot(&self, keys: &SnapshotKeys) -> Result<(), StoreError> {
        self.delete_temp(keys).await?;
        self.delete(&keys.object).await?;
        self.delete(&keys.manifest).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(url: &str, prefix: &str) -> StoreConfig {
        StoreConfig {
            url: url.into(),
            prefix: prefix.into(),
            s3_endpoint: "http://127.0.0.1:9".into(),
            s3_region: "us-east-1".into(),
            s3_path_style: true,
            s3_allow_http: true,
            s3_sign_payload: false,
        }
    }

    #[test]
    fn key_layout() {
        let s = Store::memory("/snaps/");
        let k = s.keys("team-a", "abc123", "uid-1");
        assert_eq!(k.object.as_ref(), "snaps/team-a/abc123/uid-1.tar");
        assert_eq!(k.manifest.as_ref(), "snaps/team-a/abc123/uid-1.json");
        assert_eq!(k.temp.as_ref(), "snaps/team-a/abc123/uid-1.tar.tmp");
        let bare = Store::memory("");
        assert_eq!(bare.keys("n", "k", "u").object.as_ref(), "n/k/u.tar");
    }

    #[test]
    fn urls() {
        let s3 = Store::new(&cfg("s3://bucket/extra", "p")).unwrap();
        assert_eq!(s3.keys("n", "k", "u").object.as_ref(), "extra/p/n/k/u.tar");
        assert!(s3.to_string().starts_with("s3://bucket/extra"));
        for bad in ["nope", "ftp://x", "s3://", "s3://user:secret@bucket"] {
            let e = Store::new(&cfg(bad, "")).unwrap_err().to_string();
            assert!(!e.contains("secret"), "{e}");
        }
        assert_eq!(redact("s3://key:secret@bucket/p?token=x"), "s3://bucket/p");
    }

    #[tokio::test]
    async fn file_store_commit_manifest_and_cleanup() {
        let dir = std::env::temp_dir().join(format!("agentbox-store-{}", std::process::id()));
        let url = format!("file://{}", dir.display());
        let s = Store::new(&cfg(&url, "pre")).unwrap();
        let k = s.keys("ns", "key", "uid");
        s.inner()
            .put(&k.temp, PutPayload::from_static(b"data"))
            .await
            .unwrap();
        // A staged part file as a killed multipart upload leaves it.
        let staged = dir.join("pre/ns/key/uid.tar.tmp#1");
        std::fs::write(&staged, b"partial").unwrap();
        s.commit(&k, Commit::Rename).await.unwrap();
        assert_eq!(s.size(&k.object).await.unwrap(), Some(4));
        assert_eq!(s.size(&k.temp).await.unwrap(), None);
        let m = Manifest {
            version: 1,
            object_key: k.object.to_string(),
            sha256: "ab".into(),
            size_bytes: 4,
            members: 1,
            namespace: "ns".into(),
            snapshot: "s".into(),
            snapshot_uid: "uid".into(),
            sandbox: "sbx".into(),
            scope: "user".into(),
            scope_key: "key".into(),
            created: "2026-01-01T00:00:00Z".into(),
            operator_version: "0.1.0".into(),
        };
        s.put_manifest(&k.manifest, &m).await.unwrap();
        assert_eq!(s.get_manifest(&k.manifest).await.unwrap(), Some(m));
        s.delete_snapshot(&k).await.unwrap();
        assert!(!staged.exists());
        assert_eq!(s.size(&k.object).await.unwrap(), None);
        assert_eq!(s.get_manifest(&k.manifest).await.unwrap(), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
