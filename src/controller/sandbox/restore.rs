//! Restoring a workspace from a snapshot (start branches B and C), under the scope's guard.
//!
//! 1. Extract: the object is read once, through the validator, into `tar -x` in the pod, into
//!    `.agentbox/staging-<id>` inside the workspace. The bytes of a member are forwarded only
//!    after its header was validated, so a refused member never reaches `tar`; the digest and
//!    size of everything read must match the snapshot's before anything else happens. (An
//!    earlier version read the object twice, validating first, at a third of the speed; the
//!    staging directory already keeps a bad archive's early members out of the workspace.)
//! 2. Swap: the workspace's top-level entries move aside into `.agentbox/old-<id>`, the staged
//!    ones move in, the old ones are removed. The workspace root is a mount point, so it is the
//!    entries that move, not the root. If a move fails, the moves done so far are undone.
//!
//! Any failure leaves the existing workspace as it was and removes the staging directory.
//!
//! Under a runtime class (gVisor), step 1 does not run through the sandbox: the trusted
//! helper extracts the same stream into the staging directory on the node, in a pod of its
//! own bound there ([`helper_pod::build_restore_pod`], the helper's `extract` job, which
//! never follows a link), as snapshots read such a workspace
//! ([`snapshot_ctl::helper_for_running`]); every file the sandbox's own `tar -x` makes goes
//! through the runtime there. The swap still runs in the sandbox's container: a few renames.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use tracing::info;

use crate::controller::context::{Context, Error};
use crate::controller::placement::NodeDir;
use crate::controller::pod::{CONTAINER, PodConfig};
use crate::controller::reasons::RestoreReason;
use crate::controller::snapshot as snapshot_ctl;
use crate::controller::{exec_pod, helper_pod};
use crate::metrics::GuardOp;
use crate::progress;
use crate::snapshot::{self, SnapshotError, archive};
use agentbox_api::crd::{RestoreBasis, RestoreRefusal, Sandbox, SandboxSnapshot};
use agentbox_api::exec::{self, ExecRequest};
use agentbox_api::guard::GuardError;
use agentbox_api::remote::{
    self, DISCARD_SCRIPT, EXTRACT_SCRIPT, EXTRACT_STREAM_SCRIPT, SPOOL_SCRIPT, SWAP_SCRIPT,
};

/// Upper bound on the extracting exec.
const EXTRACT_TIMEOUT: Duration = Duration::from_secs(4 * 3600);
/// Upper bound on the swap and cleanup execs.
const SWAP_TIMEOUT: Duration = Duration::from_secs(600);
/// How long a restore pod may take to start (or a leftover of it to go).
const RESTORE_POD_START: Duration = Duration::from_secs(120);

fn fail(reason: RestoreReason, message: impl Into<String>) -> Error {
    Error::Restore {
        reason,
        message: message.into(),
        refusal: None,
    }
}

/// What a restore is judged against ([`RestoreBasis`]). A permanent refusal
/// ([`SnapshotError::is_permanent`]) is recorded with it on the Sandbox, and stands — no guard
/// taken, no exec run — while all of it is unchanged: otherwise every event of the scope (its
/// Lease changing as the restore takes the guard, among them) would run the same refused
/// restore again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Judged(pub RestoreBasis);

impl Judged {
    /// The refusal on record, if it was made against exactly this (pure).
    pub fn standing<'a>(&self, last: Option<&'a RestoreRefusal>) -> Option<&'a RestoreRefusal> {
        last.filter(|r| r.basis == self.0)
    }

    /// The error for a failed restore: a permanent one carries its record.
    fn error(&self, e: SnapshotError) -> Error {
        if !e.is_permanent() {
            return from_snapshot(e);
        }
        let (reason, message) = (RestoreReason::of(&e), e.to_string());
        Error::Restore {
            reason,
            message: message.clone(),
            refusal: Some(Box::new(RestoreRefusal {
                basis: self.0.clone(),
                reason: reason.as_str().to_string(),
                message,
                refused_at: Time(Timestamp::now()),
            })),
        }
    }
}

/// The error a standing refusal gives again: the same reason and message, so the sandbox's
/// status does not change and costs no write.
fn standing_error(r: &RestoreRefusal) -> Error {
    Error::Restore {
        reason: RestoreReason::Refused(snapshot::permanent_reason(&r.reason)),
        message: r.message.clone(),
        refusal: Some(Box::new(r.clone())),
    }
}

/// The restore limits as recorded with a refusal.
fn limits_label(l: &archive::Limits) -> String {
    format!(
        "input={} extracted={} members={} ratio={}",
        l.max_input_bytes, l.max_extracted_bytes, l.max_members, l.max_expansion_ratio
    )
}

fn from_snapshot(e: SnapshotError) -> Error {
    fail(RestoreReason::of(&e), e.to_string())
}

/// What a restore reads, checked before the guard is taken.
struct Source {
    keys: snapshot::store::SnapshotKeys,
    sha: String,
    size: Option<u64>,
    limits: archive::Limits,
    judged: Judged,
    /// The progress deadline of the stream into the pod.
    stall: Duration,
    /// How the archive reaches the pod's `tar`.
    via: Via,
}

/// How a restore's archive reaches the pod's `tar -x`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// Written whole into a spool file beside the staging directory ([`SPOOL_SCRIPT`]), its
    /// digest checked, then extracted from that file ([`EXTRACT_SCRIPT`]). busybox `tar`
    /// reading a pipe takes a member's header and data in reads of a few hundred bytes, and
    /// each read that frees room in the pipe wakes the container runtime's copy loop feeding
    /// it: for 20,000 files of 1 KiB that was ~22,000 wake-ups of the runtime's shim against
    /// ~2,700 through `cat` into a file (docs/benchmarks.md). Costs the archive's size on the
    /// workspace's disk while it lasts.
    Spool,
    /// Streamed straight into `tar -x` ([`EXTRACT_STREAM_SCRIPT`]): for archives of large
    /// members, where the pipe's cost per read is nothing beside the bytes, and a spool would
    /// write everything twice.
    Stream,
}

/// Largest mean member size (archive bytes per member) restored through a spool: the pipe's
/// cost is per member, so archives of small files take the spool and archives of large files
/// stream.
pub const SPOOL_MEAN_MEMBER_BYTES: u64 = 64 << 10;

impl Via {
    /// The transport for an archive of `size` bytes and `members` members, as the snapshot's
    /// status records them (pure). Unknown counts stream, as every restore did before.
    pub fn for_archive(size: Option<u64>, members: Option<u64>) -> Via {
        match (size, members) {
            (Some(size), Some(members))
                if members > 0 && size / members <= SPOOL_MEAN_MEMBER_BYTES =>
            {
                Via::Spool
            }
            _ => Via::Stream,
        }
    }
}

/// Restores `snapshot` into the sandbox's workspace in pod `pod_name`, and records its bytes
/// and duration or its failure by reason (a refusal standing from before is no new failure).
pub async fn restore(
    ctx: &Context,
    sbx: &Sandbox,
    pods: &Api<Pod>,
    pod_name: &str,
    snapshot_name: &str,
) -> Result<(), Error> {
    match attempt(ctx, sbx, pods, pod_name, snapshot_name).await {
        Ok(Checked::Go((staged, took))) => {
            ctx.metrics.restored(staged.size, took);
            Ok(())
        }
        Ok(Checked::Standing(r)) => Err(standing_error(&r)),
        Err(e) => {
            ctx.metrics.restore_failed(failure_reason(&e));
            Err(e)
        }
    }
}

/// The reason a failed restore is counted under: the condition's, else the failure's kind.
pub(crate) fn failure_reason(e: &Error) -> &'static str {
    match e.root() {
        Error::Restore { reason, .. } => reason.as_str(),
        Error::Guard(_) => "GuardLost",
        Error::Exec(_) => "ExecFailed",
        Error::Kube(_) => "KubeError",
        other => other.workspace_reason().as_str(),
    }
}

/// What checking a restore before doing it found.
enum Checked<T> {
    /// Go ahead (with what to read), or what was done.
    Go(T),
    /// A permanent refusal made before against the same basis stands.
    Standing(RestoreRefusal),
}

/// One restore: the checks, the scope's guard, extract and swap. What was restored and how
/// long it took under the guard.
async fn attempt(
    ctx: &Context,
    sbx: &Sandbox,
    pods: &Api<Pod>,
    pod_name: &str,
    snapshot_name: &str,
) -> Result<Checked<(archive::Summary, Duration)>, Error> {
    let store = ctx
        .store
        .as_ref()
        .ok_or_else(|| fail(RestoreReason::NoStore, "this operator has no object store"))?;
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let src = match source(ctx, sbx, store, snapshot_name).await? {
        Checked::Go(src) => src,
        Checked::Standing(r) => return Ok(Checked::Standing(r)),
    };
    let on_node = restore_pod(ctx, sbx, pods, pod_name).await?;
    let g = crate::controller::context::scope_guard(ctx, &ns, &sbx.spec.scope, GuardOp::Restore)
        .await
        .map_err(|e| match e {
            GuardError::Timeout { holder, .. } => fail(
                RestoreReason::GuardBusy,
                format!("the scope's guard is held by {holder}"),
            ),
            e => Error::Guard(e),
        })?;
    let started = Instant::now();
    let result = g
        .run(stage_and_swap(
            sbx,
            pods,
            pod_name,
            store,
            snapshot_name,
            &src,
            on_node.as_ref(),
        ))
        .await;
    let _ = g.release().await;
    match result {
        Ok(staged) => Ok(Checked::Go((staged?, started.elapsed()))),
        Err(e) => Err(Error::Guard(e)),
    }
}

/// Reads and checks the snapshot: Ready, of this sandbox's scope by the operator's own record
/// (or the namespace allows otherwise), complete, not refused before against the same basis,
/// its object present with the recorded size.
async fn source(
    ctx: &Context,
    sbx: &Sandbox,
    store: &snapshot::store::Store,
    snapshot_name: &str,
) -> Result<Checked<Source>, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let snaps: Api<SandboxSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
    let snap = snaps.get_opt(snapshot_name).await?.ok_or_else(|| {
        fail(
            RestoreReason::SnapshotNotFound,
            format!("SandboxSnapshot {snapshot_name} not found"),
        )
    })?;
    // Checked again here, on the object this restore reads.
    crate::controller::restore_source::verify(ctx, sbx, &snap, true).await?;
    let st = snap.status.clone().unwrap_or_default();
    let (Some(sha), Some(scope_key), Some(uid)) =
        (st.sha256.clone(), st.scope_key.clone(), snap.uid())
    else {
        return Err(fail(
            RestoreReason::SnapshotIncomplete,
            format!("SandboxSnapshot {snapshot_name} has no digest or scope key"),
        ));
    };
    let keys = store.keys(&ns, &scope_key, &uid);
    let size = st.size_bytes.and_then(|s| u64::try_from(s).ok());
    // A restore must fit the workspace's size limit: refused whole, before anything is
    // swapped in, when the files would take more (recorded in the basis, so a raised limit
    // judges the snapshot again).
    let size_limit = crate::controller::sizelimit::effective(&sbx.spec, &ctx.config.size_limits());
    let limits =
        crate::controller::sizelimit::restore_limits(ctx.config.restore_limits(), size_limit);
    let (object_version, object_size) = snapshot::object_version(store, &keys.object)
        .await
        .map_err(from_snapshot)?;
    let judged = Judged(RestoreBasis {
        snapshot: snapshot_name.to_string(),
        snapshot_uid: uid.clone(),
        snapshot_resource_version: snap.resource_version().unwrap_or_default(),
        generation: sbx.metadata.generation.unwrap_or(0),
        object_version,
        limits: limits_label(&limits),
    });
    let last = sbx.status.as_ref().and_then(|s| s.restore_refusal.as_ref());
    let remembered = ctx.refusals.get(&sbx.uid().unwrap_or_default());
    if let Some(r) = judged
        .standing(last)
        .or_else(|| judged.standing(remembered.as_ref()))
    {
        return Ok(Checked::Standing(r.clone()));
    }
    // What can be refused without reading the object is refused before taking the guard.
    match (object_size, size) {
        (None, _) => Err(judged.error(SnapshotError::Missing(keys.object.to_string()))),
        (Some(actual), Some(expected)) if actual != expected => {
            let r = archive::Refusal::SizeMismatch { expected, actual };
            Err(judged.error(r.into()))
        }
        _ => Ok(Checked::Go(Source {
            keys,
            sha,
            size,
            limits,
            judged,
            stall: ctx.config.stream_stall(),
            via: Via::for_archive(size, st.members.and_then(|m| u64::try_from(m).ok())),
        })),
    }
}

/// The pod in which the helper extracts this restore on the node, when that is the better
/// path: the sandbox's pod `pod_name` runs under a runtime class and the operator has a
/// helper image (as for snapshots, [`snapshot_ctl::helper_for_running`]). `None`: the
/// sandbox's own `tar -x`.
async fn restore_pod(
    ctx: &Context,
    sbx: &Sandbox,
    pods: &Api<Pod>,
    pod_name: &str,
) -> Result<Option<Pod>, Error> {
    let Some(pod) = pods.get_opt(pod_name).await? else {
        return Ok(None);
    };
    let cfg = PodConfig::from_config(&ctx.config);
    let helper = cfg.helper.is_some();
    let Some(at) = snapshot_ctl::helper_for_running(sbx, &pod, helper, &ctx.config.node_root)
    else {
        return Ok(None);
    };
    let dir = NodeDir {
        node: &at.node,
        dir: &at.host_dir,
    };
    let hold = EXTRACT_TIMEOUT.as_secs() + 300;
    Ok(helper_pod::build_restore_pod(sbx, &cfg, dir, hold))
}

/// Under the guard: extracts into a staging directory (in the sandbox's pod, or on the node
/// in `on_node`), then swaps it in. Either failing removes the staging directory and leaves
/// the workspace as it was.
async fn stage_and_swap(
    sbx: &Sandbox,
    pods: &Api<Pod>,
    pod_name: &str,
    store: &snapshot::store::Store,
    snapshot_name: &str,
    src: &Source,
    on_node: Option<&Pod>,
) -> Result<archive::Summary, Error> {
    let root = sbx.spec.workspace.root.trim_end_matches('/').to_string();
    let id = format!("{:016x}", rand::random::<u64>());
    info!(sandbox = %sbx.name_any(), snapshot = %snapshot_name, via = ?src.via, on_node = on_node.is_some(), "extracting into staging");
    let started = std::time::Instant::now();
    let into = Target {
        pods,
        pod_name,
        root: &root,
        id: &id,
        on_node,
    };
    let extracted = extract(into, store, src).await;
    let staged = match extracted {
        Ok(s) => s,
        Err(e) => {
            discard(pods, pod_name, &root, &id).await;
            return Err(e);
        }
    };
    info!(sandbox = %sbx.name_any(), snapshot = %snapshot_name, bytes = staged.size, members = staged.members, secs = started.elapsed().as_secs_f64(), "staged and verified; swapping in");
    let argv = remote::sh(SWAP_SCRIPT, remote::swap_args(&root, &id, &mount_tops(sbx)));
    let req = ExecRequest::argv(argv)
        .timeout(SWAP_TIMEOUT)
        .max_output(16 << 10);
    let out = exec::run(pods, pod_name, CONTAINER, req).await?;
    if !out.success() {
        discard(pods, pod_name, &root, &id).await;
        return Err(fail(
            RestoreReason::SwapFailed,
            format!(
                "swapping the restored workspace in failed ({}): {}",
                out.status,
                out.stderr_str().trim()
            ),
        ));
    }
    info!(sandbox = %sbx.name_any(), snapshot = %snapshot_name, secs = started.elapsed().as_secs_f64(), "restored");
    Ok(staged)
}

/// The top-level names of the workspace that hold host mounts: the swap leaves them alone.
fn mount_tops(sbx: &Sandbox) -> Vec<String> {
    let mut tops: Vec<String> = sbx
        .spec
        .workspace
        .mounts
        .iter()
        .filter_map(|m| {
            agentbox_api::paths::normalize(&m.path)
                .split('/')
                .next()
                .map(str::to_string)
        })
        .filter(|t| !t.is_empty())
        .collect();
    tops.sort();
    tops.dedup();
    tops
}

/// Where a restore extracts: the sandbox's pod `pod_name` (its workspace at `root`), or the
/// helper's pod `on_node`; the staging directory's `id`.
#[derive(Clone, Copy)]
struct Target<'a> {
    pods: &'a Api<Pod>,
    pod_name: &'a str,
    root: &'a str,
    id: &'a str,
    on_node: Option<&'a Pod>,
}

/// Moves the canonical re-encoding of `src`'s object into the pod and extracts it into a
/// fresh staging directory ([`Via`], or on the node by the helper), and checks that what was
/// read is the snapshot (its digest and, when recorded, size). Through a spool, that check
/// comes before the pod's `tar` reads a byte. Permanent refusals carry their record
/// (`src.judged`). Both execs are bounded by the progress deadline `src.stall`. A restore pod
/// is deleted however the extraction ends.
async fn extract(
    into: Target<'_>,
    store: &snapshot::store::Store,
    src: &Source,
) -> Result<archive::Summary, Error> {
    let Some(pod) = into.on_node else {
        return extract_in(into, store, src).await;
    };
    let name = pod.name_any();
    let result = async {
        exec_pod::start(into.pods, pod, RESTORE_POD_START)
            .await
            .map_err(|m| fail(RestoreReason::ExtractFailed, m))?;
        extract_in(into, store, src).await
    }
    .await;
    exec_pod::delete(into.pods, &name).await;
    result
}

/// [`extract`] once its pod runs.
async fn extract_in(
    into: Target<'_>,
    store: &snapshot::store::Store,
    src: &Source,
) -> Result<archive::Summary, Error> {
    let Target {
        pods,
        pod_name,
        root,
        id,
        on_node,
    } = into;
    let (judged, stall, via) = (&src.judged, src.stall, src.via);
    let (reader, task) = snapshot::canonical_reader(store, &src.keys.object, src.limits)
        .await
        .map_err(|e| judged.error(e))?;
    // The pod's `cat` or `tar -x` (the sandbox's) or the helper: when it stops reading, the
    // exec stops taking bytes from the reader, and the meter stops.
    let meter = progress::Meter::default();
    let reader = progress::Metered::new(Box::pin(reader), meter.clone());
    let what = match (on_node, via) {
        (Some(_), _) => "agentbox-helper extract on the node",
        (None, Via::Spool) => "writing the archive into the pod's spool",
        (None, Via::Stream) => "tar -x in the pod",
    };
    let run = async {
        if let Some(pod) = on_node {
            let name = pod.name_any();
            let argv = helper_pod::extract_argv(id);
            let container = helper_pod::RESTORE_CONTAINER;
            let events = exec::stream_unwrapped(pods, &name, container, argv, reader).await?;
            return until_exit(events, None).await;
        }
        let script = match via {
            Via::Spool => SPOOL_SCRIPT,
            Via::Stream => EXTRACT_STREAM_SCRIPT,
        };
        let req = ExecRequest::argv(remote::sh(script, [root, id]))
            .stdin_reader(reader)
            .timeout(EXTRACT_TIMEOUT)
            .max_output(16 << 10);
        exec::run(pods, pod_name, CONTAINER, req).await
    };
    let out = match progress::within(&meter, stall, run).await {
        Ok(out) => out,
        Err(stalled) => {
            task.abort();
            return Err(fail(
                RestoreReason::StreamStalled,
                format!("{what} stopped reading the archive: {stalled}"),
            ));
        }
    };
    let forwarded = task.await.map_err(|e| {
        fail(
            RestoreReason::RestoreFailed,
            format!("forwarding task: {e}"),
        )
    })?;
    let out = out?;
    let forwarded = match forwarded {
        // The pod's side stopped taking bytes because it failed (a full disk): its own
        // failure is the reason, not the forwarding it cut short.
        Err(SnapshotError::Source(_)) if !out.success() => return Err(pod_failed(what, &out)),
        other => other.map_err(|e| judged.error(e))?,
    };
    archive::verify(&forwarded, &src.sha, src.size).map_err(|r| judged.error(r.into()))?;
    if !out.success() {
        return Err(pod_failed(what, &out));
    }
    if via == Via::Spool && on_node.is_none() {
        extract_spool(pods, pod_name, root, id, stall).await?;
    }
    Ok(forwarded)
}

/// What the pod's stderr says when its disk (the workspace's filesystem) is full, or its
/// quota is (`EDQUOT`, from the helper on a node root with quotas).
const NO_SPACE: [&str; 2] = ["No space left on device", "Disk quota exceeded"];

/// The failure of an exec of the restore in the pod: `DiskFull` when it ran out of space,
/// `ExtractFailed` otherwise.
fn pod_failed(what: &str, out: &exec::ExecOutput) -> Error {
    let stderr = out.stderr_str();
    let reason = if NO_SPACE.iter().any(|m| stderr.contains(m)) {
        RestoreReason::DiskFull
    } else {
        RestoreReason::ExtractFailed
    };
    fail(
        reason,
        format!("{what} failed ({}): {}", out.status, stderr.trim()),
    )
}

/// Extracts the spool into the staging directory ([`EXTRACT_SCRIPT`], which removes the
/// spool however it ends). `tar -v` lists each member as it goes; that output is the
/// progress the deadline `stall` watches, as the bytes taken are for a stream.
async fn extract_spool(
    pods: &Api<Pod>,
    pod_name: &str,
    root: &str,
    id: &str,
    stall: Duration,
) -> Result<(), Error> {
    let what = "tar -x of the spooled archive in the pod";
    let meter = progress::Meter::default();
    let req = ExecRequest::argv(remote::sh(EXTRACT_SCRIPT, [root, id])).timeout(EXTRACT_TIMEOUT);
    let run = async {
        let events = exec::stream(pods, pod_name, CONTAINER, req).await?;
        until_exit(events, Some(&meter)).await
    };
    let out = match progress::within(&meter, stall, run).await {
        Ok(out) => out?,
        Err(stalled) => {
            return Err(fail(
                RestoreReason::StreamStalled,
                format!("{what} stopped: {stalled}"),
            ));
        }
    };
    if !out.success() {
        return Err(pod_failed(what, &out));
    }
    Ok(())
}

/// Reads `events` to the command's exit: its stderr (its first 16 KiB) and status, each
/// output counted by `meter` when given (the progress of a command whose input is not
/// metered). Its stdout is dropped.
async fn until_exit(
    mut events: exec::ExecStream,
    meter: Option<&progress::Meter>,
) -> Result<exec::ExecOutput, exec::ExecError> {
    use futures::StreamExt;
    let mut stderr = Vec::new();
    let count = |n: usize| {
        if let Some(m) = meter {
            m.add(n);
        }
    };
    while let Some(ev) = events.next().await {
        match ev? {
            exec::ExecEvent::Stdout(b) => count(b.len()),
            exec::ExecEvent::Stderr(b) => {
                count(b.len());
                let room = (16usize << 10).saturating_sub(stderr.len());
                stderr.extend_from_slice(&b[..b.len().min(room)]);
            }
            exec::ExecEvent::Exit { status, timed_out } => {
                return Ok(exec::ExecOutput {
                    stdout: Vec::new(),
                    stderr,
                    status,
                    stdout_truncated: false,
                    stderr_truncated: false,
                    timed_out,
                });
            }
        }
    }
    Err(exec::ExecError::Stream(
        "stream ended without an exit status".into(),
    ))
}

async fn discard(pods: &Api<Pod>, pod_name: &str, root: &str, id: &str) {
    let req = ExecRequest::argv(remote::sh(DISCARD_SCRIPT, [root, id]))
        .timeout(SWAP_TIMEOUT)
        .max_output(4096);
    if let Err(e) = exec::run(pods, pod_name, CONTAINER, req).await {
        tracing::warn!(pod = pod_name, "removing the staging directory failed: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::memos::Refusals;

    fn judged() -> Judged {
        Judged(RestoreBasis {
            snapshot: "s1".into(),
            snapshot_uid: "uid-1".into(),
            snapshot_resource_version: "41".into(),
            generation: 2,
            object_version: "etag-a".into(),
            limits: limits_label(&archive::Limits::default()),
        })
    }

    fn refused(j: &Judged, e: SnapshotError) -> RestoreRefusal {
        match j.error(e) {
            Error::Restore {
                refusal: Some(r), ..
            } => *r,
            other => panic!("not recorded: {other}"),
        }
    }

    #[test]
    fn archives_of_small_members_take_the_spool_and_the_rest_stream() {
        // 20,000 files of 1 KiB: 1,536 bytes of archive per member.
        assert_eq!(Via::for_archive(Some(30_720_000), Some(20_000)), Via::Spool);
        assert_eq!(
            Via::for_archive(Some(SPOOL_MEAN_MEMBER_BYTES), Some(1)),
            Via::Spool
        );
        // 1 GiB in four files.
        assert_eq!(Via::for_archive(Some(1 << 30), Some(4)), Via::Stream);
        assert_eq!(
            Via::for_archive(Some(SPOOL_MEAN_MEMBER_BYTES + 1), Some(1)),
            Via::Stream
        );
        // Counts not on record: as every restore did before.
        assert_eq!(Via::for_archive(None, Some(3)), Via::Stream);
        assert_eq!(Via::for_archive(Some(3), None), Via::Stream);
        assert_eq!(Via::for_archive(Some(3), Some(0)), Via::Stream);
    }

    #[test]
    fn a_permanent_refusal_stands_while_nothing_it_was_judged_against_changes() {
        let j = judged();
        let r = refused(&j, archive::Refusal::Fifo("p".into()).into());
        assert_eq!(r.reason, "Fifo");
        assert_eq!(j.standing(Some(&r)), Some(&r));
        // The error given again is the same as the first: same reason, same message.
        let (first, again) = (
            j.error(archive::Refusal::Fifo("p".into()).into()),
            standing_error(&r),
        );
        assert_eq!(first.reason_and_message(), again.reason_and_message());
        assert_eq!(again.restore_refusal(), Some(&r));
        assert!(again.is_permanent());
    }

    #[test]
    fn a_refusal_kept_in_the_process_stands_when_the_status_lost_it() {
        let j = judged();
        let r = refused(&j, archive::Refusal::Fifo("p".into()).into());
        let kept = Refusals::default();
        kept.set("sbx-1", Some(&r));
        assert_eq!(kept.get("sbx-1").as_ref(), Some(&r));
        assert_eq!(kept.get("sbx-2"), None, "kept per sandbox");
        // The status has no record (pruned, or its write failed): the kept one stands.
        let remembered = kept.get("sbx-1");
        assert_eq!(
            j.standing(None).or_else(|| j.standing(remembered.as_ref())),
            Some(&r)
        );
        // Judged against something else, it does not.
        let mut other = judged();
        other.0.object_version = "etag-b".into();
        assert_eq!(other.standing(remembered.as_ref()), None);
        kept.set("sbx-1", None);
        assert_eq!(kept.get("sbx-1"), None);
    }

    #[test]
    fn any_change_allows_another_attempt() {
        let r = refused(&judged(), SnapshotError::Missing("k".into()));
        assert_eq!(r.reason, "ObjectMissing");
        let changes: [fn(&mut RestoreBasis); 6] = [
            |b| b.snapshot = "s2".into(),
            |b| b.snapshot_uid = "uid-2".into(),
            |b| b.snapshot_resource_version = "42".into(),
            |b| b.generation = 3,
            |b| b.object_version = "etag-b".into(),
            |b| b.limits = "input=1".into(),
        ];
        for change in changes {
            let mut j = judged();
            change(&mut j.0);
            assert_eq!(j.standing(Some(&r)), None, "{j:?}");
        }
        assert_eq!(judged().standing(None), None);
    }

    #[test]
    fn only_permanent_failures_are_recorded() {
        let j = judged();
        for e in [
            SnapshotError::Source("the extracting side stopped".into()),
            SnapshotError::Store(crate::snapshot::store::StoreError::Io {
                path: "p".into(),
                source: std::io::Error::other("disk"),
            }),
        ] {
            assert!(j.error(e).restore_refusal().is_none());
        }
        let digest = archive::Refusal::DigestMismatch {
            expected: "a".into(),
            actual: "b".into(),
        };
        assert_eq!(refused(&j, digest.into()).reason, "DigestMismatch");
        for reason in archive::Refusal::REASONS
            .into_iter()
            .chain(["ObjectMissing"])
        {
            assert_eq!(snapshot::permanent_reason(reason), reason);
        }
    }
}
