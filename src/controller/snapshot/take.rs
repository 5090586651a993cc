//! Taking a snapshot: labels, the scope's guard, the Running write, the workspace's tar
//! streamed into the store (`tar -c` in the sandbox's pod, or the helper's `archive` job in a
//! pod on the workspace's node: see [`Reader`]), commit and manifest, Ready, the sandbox's
//! `lastSnapshot`, and retention.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use object_store::MultipartId;
use tracing::{info, warn};

use super::decide::retention_victims;
use super::decide::{AtRest, MAX_ATTEMPTS, Reader};
use super::write::{
    InFlight, LAST_SNAPSHOT_MANAGER, discard_attempt, set_committed, snapshot_err, write_failure,
};
use crate::controller::context::{Context, Error, scope_guard};
use crate::controller::placement::NodeDir;
use crate::controller::pod::CONTAINER;
use crate::controller::restore_source::{self, Age, age};
use crate::controller::{exec_pod, helper_pod};
use agentbox_api::crd::{
    LastSnapshot, Sandbox, SandboxSnapshot, SandboxSnapshotStatus, SnapshotPhase,
};
use agentbox_api::exec::{self, ExecEvent, ExecRequest};

/// Reason of a snapshot waiting for an unreachable or refusing object store.
const STORE_UNAVAILABLE: &str = "StoreUnavailable";
/// Reason of a snapshot whose `spec.guard` hold was not (or no longer) the scope's Lease's.
pub const GUARD_NOT_HELD: &str = "GuardNotHeld";
use crate::metrics::{ExecOp, GuardOp, Metrics};
use crate::progress::Deadline;
use crate::snapshot::archive::{Refusal, Summary};
use crate::snapshot::store::{Commit, Manifest, SnapshotKeys, Store};
use crate::snapshot::{self, SnapshotError};
use agentbox_api::guard::{Guard, GuardError, HandOff};
use agentbox_api::labels;
use agentbox_api::remote;

/// Upper bound on one `tar -c` run.
const TAR_TIMEOUT: Duration = Duration::from_secs(4 * 3600);

/// One snapshot being taken: where it goes and what it is of.
struct Taking<'a> {
    ctx: &'a Context,
    snap: &'a SandboxSnapshot,
    sbx: &'a Sandbox,
    store: &'a Store,
    api: Api<SandboxSnapshot>,
    ns: String,
    name: String,
    scope_key: String,
    keys: SnapshotKeys,
    reader: Reader,
}

/// Takes the snapshot: labels, guard, Running, stream, commit, manifest, Ready, retention.
pub(super) async fn take(
    ctx: &Context,
    snap: &SandboxSnapshot,
    sbx: &Sandbox,
    store: &Store,
    clean_first: bool,
    reader: Reader,
    mut st: SandboxSnapshotStatus,
) -> Result<Action, Error> {
    let ns = snap.namespace().ok_or(Error::NotNamespaced)?;
    let uid = snap.uid().unwrap_or_default();
    let scope_key = labels::scope_key(&sbx.spec.scope);
    let t = Taking {
        ctx,
        snap,
        sbx,
        store,
        api: Api::namespaced(ctx.client.clone(), &ns),
        name: snap.name_any(),
        keys: store.keys(&ns, &scope_key, &uid),
        ns,
        scope_key,
        reader,
    };
    ensure_labels(&t.api, snap, sbx).await?;
    if clean_first {
        info!(snapshot = %t.name, namespace = %t.ns, "interrupted snapshot: removing its objects and taking it again");
        discard_attempt(ctx, snap, store, &t.keys, st.upload_id.as_deref())
            .await
            .map_err(snapshot_err)?;
        store.delete_snapshot(&t.keys).await.map_err(snapshot_err)?;
        st.upload_id = None;
    }
    let g = match t.hold(&mut st).await? {
        Ok(g) => g,
        Err(action) => return Ok(action),
    };
    let _flight = InFlight::new(&uid);
    let attempts = st.attempts.unwrap_or(0) + 1;
    let upload_id = match t.start(&g, &mut st, attempts).await {
        Ok(id) => id,
        Err(e) => {
            let _ = g.release().await;
            return Err(e);
        }
    };
    let started = std::time::Instant::now();
    let outcome = t.upload_and_commit(&g, upload_id.as_ref()).await;
    // A harness's hold that went away does not come back: no second attempt under it.
    let handed_off = matches!(g, Hold::HandedOff(_));
    if let Err(e) = g.release().await {
        warn!(snapshot = %t.name, "releasing the scope guard: {e}");
    }
    match outcome {
        Ok(summary) => {
            info!(snapshot = %t.name, namespace = %t.ns, bytes = summary.size, secs = started.elapsed().as_secs_f64(), "committed");
            t.committed(st, summary, started.elapsed()).await
        }
        Err(e) => {
            let final_ = handed_off && matches!(e, SnapshotError::Guard(_));
            t.failed(st, e, attempts, final_, upload_id.as_deref())
                .await
        }
    }
}

impl Taking<'_> {
    /// The guard to take the snapshot under: the harness's hold handed over in `spec.guard`
    /// (checked), else the operator's own. `Err` with what to do when there is none now: the
    /// handed-over hold went (the snapshot failed for good, recorded; nothing was uploaded),
    /// or the scope's guard is busy (look again).
    async fn hold(&self, st: &mut SandboxSnapshotStatus) -> Result<Result<Hold, Action>, Error> {
        let Some(hold) = &self.snap.spec.guard else {
            return Ok(match self.guard(st).await? {
                Some(g) => Ok(Hold::Own(g)),
                None => Err(Action::requeue(Duration::from_secs(5))),
            });
        };
        let leases = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let lease = labels::lease_name(&self.scope_key);
        let h = HandOff::new(leases, &lease, &hold.holder, hold.token);
        match h.check().await {
            Ok(()) => Ok(Ok(Hold::HandedOff(h))),
            Err(e @ GuardError::NotHeld { .. }) => {
                // The harness let go before the snapshot could start: taking it now could
                // capture someone else's work.
                let msg = format!("the guard hold this snapshot names is not held: {e}");
                let (ctx, snap, failed) = (self.ctx, self.snap, st.clone());
                write_failure(ctx, snap, &self.api, failed, GUARD_NOT_HELD, &msg, true).await?;
                Ok(Err(Action::await_change()))
            }
            Err(e) => Err(Error::Guard(e)),
        }
    }
}

/// The guard a snapshot is taken under: the operator's own, or a harness's hold handed over
/// in `spec.guard` (checked, never taken or released here).
enum Hold {
    Own(Guard),
    HandedOff(HandOff),
}

impl Hold {
    fn token(&self) -> i64 {
        match self {
            Hold::Own(g) => g.token(),
            Hold::HandedOff(h) => h.token(),
        }
    }

    async fn run<F: std::future::Future>(&self, fut: F) -> Result<F::Output, GuardError> {
        match self {
            Hold::Own(g) => g.run(fut).await,
            Hold::HandedOff(h) => h.run(fut).await,
        }
    }

    /// Whether it is known lost (a hand-off is checked again by its `run`).
    fn is_lost(&self) -> bool {
        match self {
            Hold::Own(g) => g.is_lost(),
            Hold::HandedOff(_) => false,
        }
    }

    /// Releases the operator's own guard; a hand-off stays the harness's.
    async fn release(self) -> Result<(), GuardError> {
        match self {
            Hold::Own(g) => g.release().await,
            Hold::HandedOff(_) => Ok(()),
        }
    }
}

impl Taking<'_> {
    /// The scope's guard, waited for up to [`GUARD_WAIT`](crate::controller::context::GUARD_WAIT); `None` (and the snapshot Pending
    /// with reason `GuardBusy`) when someone else kept it that long.
    async fn guard(&self, st: &mut SandboxSnapshotStatus) -> Result<Option<Guard>, Error> {
        let scope = &self.sbx.spec.scope;
        match scope_guard(self.ctx, &self.ns, scope, GuardOp::Snapshot).await {
            Ok(g) => Ok(Some(g)),
            Err(GuardError::Timeout { holder, .. }) => {
                st.phase = Some(SnapshotPhase::Pending);
                let msg = format!("waiting for the scope's guard (held by {holder})");
                let now = Timestamp::now();
                set_committed(&mut st.conditions, false, "GuardBusy", &msg, None, now);
                crate::controller::context::apply_status(&self.api, &self.name, &*st).await?;
                Ok(None)
            }
            Err(e) => Err(Error::Guard(e)),
        }
    }

    /// Starts an attempt: the multipart upload, then the Running write that records its id.
    /// The upload is created before the write: whoever finds this attempt interrupted can then
    /// abort it (only a kill between the two calls loses it).
    async fn start(
        &self,
        g: &Hold,
        st: &mut SandboxSnapshotStatus,
        attempts: i32,
    ) -> Result<Option<MultipartId>, Error> {
        let now = Timestamp::now();
        st.phase = Some(SnapshotPhase::Running);
        st.attempts = Some(attempts);
        st.started_at = Some(Time(now));
        st.completed_at = None;
        st.fencing_token = Some(g.token());
        st.scope_key = Some(self.scope_key.clone());
        st.object_key = Some(self.keys.object.to_string());
        st.sha256 = None;
        st.size_bytes = None;
        st.members = None;
        let msg = "streaming the workspace to the object store";
        set_committed(&mut st.conditions, false, "Uploading", msg, None, now);
        let upload_id = match self.store.create_upload(&self.keys).await {
            Ok(id) => id,
            Err(e) => return Err(self.store_unavailable(e).await),
        };
        st.upload_id = upload_id.clone();
        if let Err(e) = crate::controller::context::apply_status(&self.api, &self.name, &*st).await
        {
            if let Some(id) = &upload_id {
                let _ = self.store.abort_upload(&self.keys, id).await;
            }
            return Err(e);
        }
        st.upload_id = None;
        Ok(upload_id)
    }

    /// The store refused or could not be reached before anything was sent: the snapshot is
    /// Pending with reason `StoreUnavailable` (written once per outage, not per retry) and the
    /// error goes back to the reconcile, whose backoff retries. An outage uses up no attempt.
    async fn store_unavailable(&self, e: crate::snapshot::store::StoreError) -> Error {
        let mut pending = self.snap.status.clone().unwrap_or_default();
        let already = pending.conditions.iter().any(|c| {
            c.type_ == crate::controller::conditions::READY && c.reason == STORE_UNAVAILABLE
        });
        pending.phase = Some(SnapshotPhase::Pending);
        let msg = format!("waiting for the object store: {e}");
        set_committed(
            &mut pending.conditions,
            false,
            STORE_UNAVAILABLE,
            &msg,
            None,
            Timestamp::now(),
        );
        if !already
            && let Err(w) =
                crate::controller::context::apply_status(&self.api, &self.name, &pending).await
        {
            warn!(snapshot = %self.name, "recording the store outage: {w}");
        }
        snapshot_err(e)
    }

    /// Streams the workspace into the store under the guard, then commits the object and
    /// writes its manifest, unless the guard was lost meanwhile (someone else may have changed
    /// the workspace while it was read).
    async fn upload_and_commit(
        &self,
        g: &Hold,
        upload_id: Option<&MultipartId>,
    ) -> Result<Summary, SnapshotError> {
        let ctx = self.ctx;
        let pod_name = crate::controller::placement::pod_name(self.sbx);
        let source = match &self.reader {
            Reader::Exec => Source::Sandbox { pod: &pod_name },
            Reader::Helper(at) => Source::Helper {
                snap: self.snap,
                at,
            },
        };
        let upload = stream_to_store(
            ctx, self.sbx, &self.ns, source, self.store, &self.keys, upload_id,
        );
        let (summary, commit) = g
            .run(upload)
            .await
            .unwrap_or_else(|e| Err(SnapshotError::Guard(e.to_string())))?;
        let manifest = Manifest {
            version: 1,
            object_key: self.keys.object.to_string(),
            sha256: summary.sha256.clone(),
            size_bytes: summary.size,
            members: summary.members,
            namespace: self.ns.clone(),
            snapshot: self.name.clone(),
            snapshot_uid: self.snap.uid().unwrap_or_default(),
            sandbox: self.sbx.name_any(),
            scope: self.sbx.spec.scope.kind.label_value().to_string(),
            scope_key: self.scope_key.clone(),
            created: Timestamp::now().to_string(),
            operator_version: env!("CARGO_PKG_VERSION").to_string(),
        };
        if g.is_lost() {
            return Err(SnapshotError::Guard("the scope's guard was lost".into()));
        }
        self.store.commit(&self.keys, commit).await?;
        self.store
            .put_manifest(&self.keys.manifest, &manifest)
            .await?;
        Ok(summary)
    }

    /// Ready: the status, the sandbox's `lastSnapshot`, an Event, and retention.
    async fn committed(
        &self,
        mut st: SandboxSnapshotStatus,
        summary: Summary,
        took: Duration,
    ) -> Result<Action, Error> {
        let now = Timestamp::now();
        st.phase = Some(SnapshotPhase::Ready);
        st.sha256 = Some(summary.sha256.clone());
        st.size_bytes = i64::try_from(summary.size).ok();
        st.members = i64::try_from(summary.members).ok();
        st.completed_at = Some(Time(now));
        let msg = format!(
            "{} bytes, {} members, sha256 {}",
            summary.size, summary.members, summary.sha256
        );
        set_committed(&mut st.conditions, true, "Committed", &msg, None, now);
        crate::controller::context::apply_status(&self.api, &self.name, &st).await?;
        // Counted once the status says Ready: a failed write retakes the snapshot.
        self.ctx.metrics.snapshot_committed(summary.size, took);
        info!(snapshot = %self.name, namespace = %self.ns, "{msg}");
        let last = LastSnapshot {
            name: self.name.clone(),
            completed_at: Time(now),
            sha256: summary.sha256.clone(),
            size_bytes: st.size_bytes.unwrap_or(0),
        };
        if let Err(e) = set_last_snapshot(self.ctx, &self.ns, &self.sbx.name_any(), last).await {
            warn!(snapshot = %self.name, "recording the snapshot on its sandbox: {e}");
        }
        let note = (EventType::Normal, "Committed", "Snapshot", msg.as_str());
        crate::controller::context::publish(self.ctx, self.snap, note.0, note.1, note.2, note.3)
            .await;
        if let Err(e) = apply_retention(self.ctx, &self.ns, self.sbx, &self.scope_key).await {
            warn!(snapshot = %self.name, "retention: {e}");
        }
        Ok(Action::await_change())
    }

    /// A failed attempt: its objects removed, Pending for another attempt or Failed (at once
    /// when `final_`).
    async fn failed(
        &self,
        st: SandboxSnapshotStatus,
        e: SnapshotError,
        attempts: i32,
        final_: bool,
        upload_id: Option<&str>,
    ) -> Result<Action, Error> {
        // The upload aborts itself on errors it sees, but not when a lost guard cancelled
        // it mid-way.
        let _ = discard_attempt(self.ctx, self.snap, self.store, &self.keys, upload_id).await;
        let _ = self.store.delete(&self.keys.manifest).await;
        let _ = self.store.delete(&self.keys.object).await;
        let reason = e.reason();
        let msg = format!("attempt {attempts} failed: {e}");
        warn!(snapshot = %self.name, namespace = %self.ns, "{msg}");
        // An archive the restore would refuse stays refused: no point in trying again (a
        // truncated one is a broken stream, which may not recur). A stream the sandbox let
        // stall would stall again, each attempt holding the scope's guard for the deadline.
        let refused = matches!(&e, SnapshotError::Refused(r) if *r != Refusal::Truncated);
        let stalled = matches!(&e, SnapshotError::Stalled(_));
        let give_up = attempts >= MAX_ATTEMPTS || refused || stalled || final_;
        write_failure(self.ctx, self.snap, &self.api, st, reason, &msg, give_up).await?;
        // A passing failure (a container restarting under the exec, a store hiccup) is
        // tried again after a pause that grows with the attempts.
        let pause = 5 * u64::try_from(attempts.max(1)).unwrap_or(1);
        Ok(Action::requeue(Duration::from_secs(pause)))
    }
}

/// Records a Ready snapshot in its Sandbox's `status.lastSnapshot` (one status write; a
/// sandbox deleted meanwhile is fine).
async fn set_last_snapshot(
    ctx: &Context,
    ns: &str,
    sandbox: &str,
    last: LastSnapshot,
) -> Result<(), Error> {
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), ns);
    let status = serde_json::json!({ "lastSnapshot": last });
    match crate::controller::context::apply_status_as(&api, sandbox, &status, LAST_SNAPSHOT_MANAGER)
        .await
    {
        Err(Error::Kube(kube::Error::Api(s))) if s.code == 404 => Ok(()),
        r => r,
    }
}

/// Who writes the workspace's tar.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// `TAR_SCRIPT` in the sandbox's pod `pod`.
    Sandbox { pod: &'a str },
    /// The helper's `archive` job in a pod of its own for snapshot `snap`, on the node and
    /// directory `at`.
    Helper {
        snap: &'a SandboxSnapshot,
        at: &'a AtRest,
    },
}

/// Longest wait for an archive pod to run (its image is the small helper image, usually on
/// the node already).
const ARCHIVE_POD_START: Duration = Duration::from_secs(120);

/// Streams the workspace's tar (from `source`) into the store's temporary key, through the
/// multipart upload `upload_id` when the store has them. A helper pod made for it is deleted
/// however the stream ends.
async fn stream_to_store(
    ctx: &Context,
    sbx: &Sandbox,
    ns: &str,
    source: Source<'_>,
    store: &Store,
    keys: &SnapshotKeys,
    upload_id: Option<&MultipartId>,
) -> Result<(Summary, Commit), SnapshotError> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    match source {
        Source::Sandbox { pod } => {
            let root = sbx.spec.workspace.root.trim_end_matches('/').to_string();
            let mounts: Vec<String> = sbx
                .spec
                .workspace
                .mounts
                .iter()
                .map(|m| m.path.clone())
                .collect();
            let argv = remote::sh(remote::TAR_SCRIPT, remote::tar_args(&root, &mounts));
            let run = Run {
                pods: &pods,
                pod,
                container: CONTAINER,
                argv,
                what: "tar -c",
                wrapped: true,
            };
            stream_from(ctx, run, store, keys, upload_id).await
        }
        Source::Helper { snap, at } => {
            let name = helper_pod::archive_pod_name(snap);
            let result = async {
                start_archive_pod(ctx, &pods, sbx, snap, at).await?;
                let run = Run {
                    pods: &pods,
                    pod: &name,
                    container: helper_pod::ARCHIVE_CONTAINER,
                    argv: helper_pod::archive_argv(),
                    what: "agentbox-helper archive",
                    wrapped: false,
                };
                stream_from(ctx, run, store, keys, upload_id).await
            }
            .await;
            // However the attempt ended: the pod is the attempt's alone (owned by the snapshot
            // too, should this delete not happen).
            exec_pod::delete(&pods, &name).await;
            result
        }
    }
}

/// Creates the archive pod of `snap` (a leftover of an earlier attempt is replaced: its
/// process may have been mid-archive) and waits until it runs.
async fn start_archive_pod(
    ctx: &Context,
    pods: &Api<Pod>,
    sbx: &Sandbox,
    snap: &SandboxSnapshot,
    at: &AtRest,
) -> Result<(), SnapshotError> {
    let cfg = crate::controller::pod::PodConfig::from_config(&ctx.config);
    let dir = NodeDir {
        node: &at.node,
        dir: &at.host_dir,
    };
    let hold = TAR_TIMEOUT.as_secs() + 300;
    let pod = helper_pod::build_archive_pod(sbx, snap, &cfg, dir, hold)
        .ok_or_else(|| SnapshotError::Source("this operator has no helper image".into()))?;
    exec_pod::start(pods, &pod, ARCHIVE_POD_START)
        .await
        .map_err(SnapshotError::Source)
}

/// A command whose stdout is a workspace's tar.
struct Run<'a> {
    pods: &'a Api<Pod>,
    pod: &'a str,
    container: &'a str,
    argv: Vec<String>,
    /// Its name in errors.
    what: &'static str,
    /// Through the exec wrapper (a shell in the container, a timeout); the helper's image
    /// has no shell.
    wrapped: bool,
}

/// Runs `run` and streams its stdout through the snapshot pipeline into the store.
async fn stream_from(
    ctx: &Context,
    Run {
        pods,
        pod,
        container,
        argv,
        what,
        wrapped,
    }: Run<'_>,
    store: &Store,
    keys: &SnapshotKeys,
    upload_id: Option<&MultipartId>,
) -> Result<(Summary, Commit), SnapshotError> {
    store.delete_temp(keys).await?;
    // The command waits for its stdin to end before it exits (see TAR_SCRIPT, and the
    // helper's `archive`); it ends when the archive's end marker has arrived here, by
    // dropping `release`.
    let (release, held) = tokio::io::duplex(64);
    let mut release = Some(release);
    let stream = if wrapped {
        let req = ExecRequest::argv(argv)
            .timeout(TAR_TIMEOUT)
            .stdin_reader(held);
        exec::stream(pods, pod, container, req).await
    } else {
        exec::stream_unwrapped(pods, pod, container, argv, held).await
    }
    .map_err(|e| {
        ctx.metrics.exec_failed(ExecOp::Snapshot, e.kind());
        SnapshotError::Source(format!("exec: {e}"))
    })?;
    // Only the time spent waiting for the source counts towards the deadline: a slow store
    // is not the sandbox stalling.
    let chunks = Deadline::new(
        Box::pin(archive_chunks(stream, ctx.metrics.clone(), what)),
        ctx.config.stream_stall(),
    )
    .map(|item| item.unwrap_or_else(|stalled| Err(stalled.into())));
    let chunks = Box::pin(chunks);
    let limits = ctx.config.restore_limits();
    let result = snapshot::upload(store, keys, upload_id, limits, chunks, || {
        release.take();
    })
    .await;
    if result.is_err() {
        let _ = store.delete_temp(keys).await;
    }
    result
}

/// The archive the command `what` writes to stdout, from its exec's events: its stderr kept
/// for the error when it fails, stream errors counted in `metrics`.
fn archive_chunks(
    stream: exec::ExecStream,
    metrics: Arc<Metrics>,
    what: &'static str,
) -> impl futures::Stream<Item = Result<Bytes, SnapshotError>> {
    let stderr = Arc::new(Mutex::new(exec::Capped::new(16 << 10)));
    stream.filter_map(move |ev| {
        let out = match ev {
            Ok(ExecEvent::Stdout(b)) => Some(Ok::<Bytes, SnapshotError>(b)),
            Ok(ExecEvent::Stderr(b)) => {
                if let Ok(mut c) = stderr.lock() {
                    c.push(&b);
                }
                None
            }
            Ok(ExecEvent::Exit { status, timed_out }) => {
                if status.success() && !timed_out {
                    None
                } else {
                    let text = stderr
                        .lock()
                        .map(|c| String::from_utf8_lossy(&c.buf).trim().to_string())
                        .unwrap_or_default();
                    Some(Err(SnapshotError::Source(format!(
                        "{what} ended with {status}{}: {text}",
                        if timed_out { " (timed out)" } else { "" }
                    ))))
                }
            }
            Err(e) => {
                metrics.exec_failed(ExecOp::Snapshot, e.kind());
                Some(Err(SnapshotError::Source(format!("exec: {e}"))))
            }
        };
        futures::future::ready(out)
    })
}

/// Puts the sandbox's scope labels and annotations (and a sandbox label) on the snapshot.
async fn ensure_labels(
    api: &Api<SandboxSnapshot>,
    snap: &SandboxSnapshot,
    sbx: &Sandbox,
) -> Result<(), Error> {
    let mut want = labels::scope_labels(&sbx.spec.scope);
    want.insert(
        labels::SANDBOX.into(),
        labels::sandbox_label_value(&sbx.name_any()),
    );
    let annotations = labels::scope_annotations(&sbx.spec.scope);
    let have = snap.labels();
    let have_ann = snap.annotations();
    if want.iter().all(|(k, v)| have.get(k) == Some(v))
        && annotations.iter().all(|(k, v)| have_ann.get(k) == Some(v))
    {
        return Ok(());
    }
    let patch = serde_json::json!({"metadata": {"labels": want, "annotations": annotations}});
    api.patch(
        &snap.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Deletes the Ready snapshots of a scope beyond the sandbox's `retention.keepLast` (their
/// finalizers remove the objects as their policies say).
async fn apply_retention(
    ctx: &Context,
    ns: &str,
    sbx: &Sandbox,
    scope_key: &str,
) -> Result<(), Error> {
    // The policy of a templated sandbox may be its template's.
    let sbx = &crate::controller::effective::resolved_or_own(&ctx.client, sbx).await?;
    let Some(keep) = sbx
        .spec
        .snapshot
        .retention
        .as_ref()
        .map(|r| r.keep_last as usize)
    else {
        return Ok(());
    };
    let api: Api<SandboxSnapshot> = Api::namespaced(ctx.client.clone(), ns);
    // By the recorded scope key, not labels: a snapshot of another scope relabelled into this
    // one is never deleted by this scope's retention.
    let ready: Vec<Age> = restore_source::recorded_for(&api, scope_key)
        .await?
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter(|s| restore_source::is_ready_of_scope(s, scope_key))
        .map(age)
        .collect();
    for victim in retention_victims(&ready, keep) {
        info!(namespace = %ns, snapshot = %victim, keep, "retention: deleting an older snapshot");
        match api.delete(&victim, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
