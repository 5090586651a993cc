//! The snapshot stores the integration tests run against: a `file://` directory or one of the
//! S3-compatible servers of `hack/s3`, with a client of the same store and the checks a
//! committed snapshot must pass.

use std::path::PathBuf;
use std::sync::Arc;

use agentbox_api::crd::SandboxSnapshot;
use agentbox_operator::snapshot::store::Store;
use futures::StreamExt;
use kube::ResourceExt;
use object_store::ObjectStoreExt;
use sha2::{Digest, Sha256};

use super::{TestEnv, repo_root};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    /// The fast S3-compatible server of `hack/s3` (s3s-fs).
    S3,
    /// moto's server, the one the first S3 tests were written against: kept for two
    /// scenarios, so the operator keeps working with more than one S3 implementation.
    S3Moto,
}

/// Where a scenario's operator stores snapshots, and a client of the same store.
pub struct Backend {
    pub flags: Vec<String>,
    pub envs: Vec<(String, String)>,
    pub store: Store,
    pub dir: Option<PathBuf>,
    /// The s3s-fs server's data directory, when the backend is s3s-fs: where a test looks for
    /// what its API cannot show (see [`upload_forgotten`]).
    pub s3s_fs_dir: Option<PathBuf>,
}

pub fn s3_env() -> Vec<(String, String)> {
    let s3 = repo_root().join("hack/s3");
    let up = std::process::Command::new(&s3)
        .arg("up")
        .status()
        .expect("run hack/s3 up");
    assert!(up.success(), "hack/s3 up failed");
    let out = std::process::Command::new(&s3)
        .arg("env")
        .output()
        .expect("run hack/s3 env");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// One of `hack/s3 env`'s variables.
pub fn var(vars: &[(String, String)], k: &str) -> String {
    vars.iter()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("hack/s3 env has no {k}"))
}

pub fn backend(kind: Kind, ns: &str) -> Backend {
    let _ = rustls::crypto::ring::default_provider().install_default();
    match kind {
        Kind::File => {
            let (flags, store, dir) = super::file_store(ns);
            Backend {
                flags,
                envs: Vec::new(),
                store,
                dir: Some(dir),
                s3s_fs_dir: None,
            }
        }
        Kind::S3 | Kind::S3Moto => {
            let vars = s3_env();
            let get = |k: &str| var(&vars, k);
            let endpoint = get(if kind == Kind::S3 {
                "AGENTBOX_TEST_S3_ENDPOINT"
            } else {
                "AGENTBOX_TEST_S3_MOTO_ENDPOINT"
            });
            // Both request-signing modes run: the default (unsigned payload) against s3s-fs,
            // which checks every request's signature, signed against moto.
            let mut b = s3_backend(&vars, endpoint, ns, kind == Kind::S3Moto);
            if kind == Kind::S3 {
                b.s3s_fs_dir = Some(PathBuf::from(get("AGENTBOX_TEST_S3_FS_DIR")));
            }
            b
        }
    }
}

/// A store on the S3-compatible server at `endpoint`, with `hack/s3 env`'s bucket and
/// credentials (`vars`); `sign`: the operator signs request bodies.
pub fn s3_backend(vars: &[(String, String)], endpoint: String, ns: &str, sign: bool) -> Backend {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let get = |k: &str| var(vars, k);
    let bucket = get("AGENTBOX_TEST_S3_BUCKET");
    let s3 = object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(&bucket)
        .with_endpoint(&endpoint)
        .with_region(get("AWS_REGION"))
        .with_access_key_id(get("AWS_ACCESS_KEY_ID"))
        .with_secret_access_key(get("AWS_SECRET_ACCESS_KEY"))
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .build()
        .expect("s3 client");
    Backend {
        flags: vec![
            "--store-url".into(),
            format!("s3://{bucket}"),
            "--store-prefix".into(),
            ns.to_string(),
            "--s3-endpoint".into(),
            endpoint,
            "--s3-path-style".into(),
            "true".into(),
            "--s3-allow-http".into(),
            "true".into(),
            "--s3-sign-payload".into(),
            sign.to_string(),
        ],
        envs: vars
            .iter()
            .filter(|(k, _)| k.starts_with("AWS_"))
            .cloned()
            .collect(),
        store: Store::from_multipart_store(Arc::new(s3), ns),
        dir: None,
        s3s_fs_dir: None,
    }
}

/// An s3s-fs server of a test's own (the binary `hack/s3` builds), on a free loopback port
/// with its own directory, so the test can stop it — the store unreachable — without
/// disturbing other tests. Stopped by its PID; the directory is removed on drop.
pub struct PrivateS3 {
    bin: String,
    /// Its directory (the bucket is a directory in it).
    pub dir: PathBuf,
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    port: u16,
    child: Option<std::process::Child>,
    vars: Vec<(String, String)>,
}

impl PrivateS3 {
    /// Starts one; `hack/s3 up` builds the binary if needed.
    pub fn start() -> PrivateS3 {
        let vars = s3_env();
        let get = |k: &str| var(&vars, k);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("s3-{port}"));
        std::fs::create_dir_all(dir.join(get("AGENTBOX_TEST_S3_BUCKET"))).expect("bucket dir");
        let mut s = PrivateS3 {
            bin: get("AGENTBOX_S3S_FS_BIN"),
            dir,
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
            child: None,
            vars,
        };
        s.resume();
        s
    }

    /// A store client and the operator's flags for it.
    pub fn backend(&self, ns: &str) -> Backend {
        Backend {
            s3s_fs_dir: Some(self.dir.clone()),
            ..s3_backend(&self.vars, self.endpoint.clone(), ns, false)
        }
    }

    /// Kills the server (SIGKILL, by PID): the store is unreachable.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port and directory; waits until it answers.
    pub fn resume(&mut self) {
        let get = |k: &str| var(&self.vars, k);
        let child = std::process::Command::new(&self.bin)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", &get("AWS_ACCESS_KEY_ID")])
            .args(["--secret-key", &get("AWS_SECRET_ACCESS_KEY")])
            .arg(&self.dir)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start s3s-fs");
        self.child = Some(child);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("s3s-fs did not listen on {}", self.endpoint);
    }
}

impl Drop for PrivateS3 {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// SHA-256 and size of an object, streamed.
pub async fn object_digest(store: &Store, key: &object_store::path::Path) -> (String, u64) {
    let mut body = store
        .inner()
        .get(key)
        .await
        .expect("get object")
        .into_stream();
    let mut h = Sha256::new();
    let mut n = 0u64;
    while let Some(c) = body.next().await {
        let c = c.expect("read object");
        n += c.len() as u64;
        h.update(&c);
    }
    (hex::encode(h.finalize()), n)
}

pub fn keys_of(
    b: &Backend,
    env: &TestEnv,
    s: &SandboxSnapshot,
) -> agentbox_operator::snapshot::store::SnapshotKeys {
    let st = s.status.as_ref().expect("status");
    b.store.keys(
        &env.ns,
        st.scope_key.as_deref().expect("scope key"),
        &s.uid().expect("uid"),
    )
}

/// Checks a Ready snapshot against its object and manifest.
pub async fn check_committed(b: &Backend, env: &TestEnv, s: &SandboxSnapshot) {
    let st = s.status.as_ref().expect("status");
    let keys = keys_of(b, env, s);
    assert_eq!(st.object_key.as_deref(), Some(keys.object.as_ref()));
    let (sha, size) = object_digest(&b.store, &keys.object).await;
    assert_eq!(st.sha256.as_deref(), Some(sha.as_str()));
    assert_eq!(st.size_bytes, Some(size as i64));
    assert!(st.members.unwrap_or(0) > 0);
    assert!(st.fencing_token.unwrap_or(0) > 0);
    assert!(st.started_at.is_some() && st.completed_at.is_some());
    let m = b
        .store
        .get_manifest(&keys.manifest)
        .await
        .expect("manifest")
        .expect("manifest present");
    assert_eq!((m.sha256.as_str(), m.size_bytes), (sha.as_str(), size));
    assert_eq!(m.members as i64, st.members.unwrap_or(0));
    assert_eq!(b.store.size(&keys.temp).await.expect("head temp"), None);
}

/// Whether s3s-fs has forgotten upload `id` (its record is gone) although parts of it may
/// remain on its disk. s3s-fs drops the record when a completion starts and removes each part
/// only once copied into the object, all in the request's task: a client gone mid-completion
/// (an operator killed) leaves parts that no S3 call can list, abort or complete (an abort
/// gets 403). S3 and MinIO complete an upload on the server whatever the client does. `false`
/// for other backends.
pub fn upload_forgotten(b: &Backend, id: &str) -> bool {
    b.s3s_fs_dir
        .as_ref()
        .is_some_and(|d| !d.join(format!(".upload-{id}.json")).exists())
}

/// Whether multipart upload `id` to `key` still holds parts in the backend's bucket: ListParts
/// (both servers have it; s3s-fs has no ListMultipartUploads) answers 200 with a part. s3s-fs
/// answers 200 with no parts for an unknown id, moto 404. Asked with curl's SigV4 signing,
/// since s3s-fs checks signatures.
pub fn upload_alive(b: &Backend, key: &object_store::path::Path, id: &str) -> bool {
    let get = |k: &str| {
        b.envs
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let endpoint = b
        .flags
        .iter()
        .skip_while(|f| *f != "--s3-endpoint")
        .nth(1)
        .expect("an S3 backend");
    let bucket = b
        .flags
        .iter()
        .find_map(|f| f.strip_prefix("s3://"))
        .expect("an S3 backend");
    let url = format!(
        "{endpoint}/{bucket}/{key}?uploadId={id}",
        key = key.as_ref()
    );
    let out = std::process::Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code}", "--max-time", "10"])
        .arg("--aws-sigv4")
        .arg(format!("aws:amz:{}:s3", get("AWS_REGION")))
        .arg("--user")
        .arg(format!(
            "{}:{}",
            get("AWS_ACCESS_KEY_ID"),
            get("AWS_SECRET_ACCESS_KEY")
        ))
        .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
        .arg(&url)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
    assert!(
        code == "200" || code == "404",
        "ListParts {url}: HTTP {code} {body} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    code == "200" && body.contains("<Part>")
}

/// Starts an operator for the test's namespace with this store.
pub fn start(env: &mut TestEnv, b: &Backend) -> usize {
    let flags: Vec<&str> = b.flags.iter().map(String::as_str).collect();
    env.start_operator_env(&flags, &b.envs)
}
