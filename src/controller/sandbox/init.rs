//! Workspace initialisation in the sandbox's pod: probe the marker, decide the start branch
//! ([`init_plan::decide`]), restore a snapshot (branches B and C), write the files.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use tracing::debug;

use super::init_plan::{self, Observed};
use super::{restore, sources};
use crate::controller::context::{Context, Error};
use crate::controller::pod::CONTAINER;
use crate::controller::restore_source;
use agentbox_api::crd::{Sandbox, WorkspaceStatus};
use agentbox_api::exec::session::Session;
use agentbox_api::exec::{self, ExecRequest};
use agentbox_api::remote::{self, FilesVia};

/// How long one workspace exec may take before it counts as failed.
const INIT_TIMEOUT: Duration = Duration::from_secs(120);

/// The snapshot a fresh workspace restores ([`restore_source::candidate`]), looked up ahead.
pub type Lookup = Result<Option<String>, Error>;

/// What is known of the workspace's marker before the start.
#[derive(Debug)]
pub enum Marker {
    /// Nothing: probe it.
    Probe,
    /// No sandbox's marker: a warm pod adopted just now (its pool's scope-free initialisation
    /// refuses a directory with a sandbox's marker), so the probe's exec is saved; with the
    /// snapshot lookup made beside the adopting write.
    Absent {
        /// The snapshot lookup.
        lookup: Lookup,
        /// The directory holds its pool's marker ([`remote::WARM_MARKER`]): with nothing to
        /// restore or write, it stands as this workspace's and no command runs.
        warm: bool,
    },
}

/// What a start brings to the workspace's initialisation.
pub struct Start<'a> {
    /// The workspace status so far.
    pub ws: &'a WorkspaceStatus,
    /// What is known of the marker.
    pub marker: Marker,
    /// A claimed warm pod's open shell, if its pool left one.
    pub shell: Option<&'a Session>,
}

/// The snapshot a workspace without its marker restores, if any: the lookup made already
/// (beside a warm pod's adoption), else made now.
async fn restore_candidate(
    ctx: &Context,
    sbx: &Sandbox,
    lookup: Option<Lookup>,
) -> Result<Option<String>, Error> {
    let found = match lookup {
        Some(found) => found,
        None => restore_source::candidate(ctx, sbx).await,
    };
    // A snapshot named but not restorable (missing, of another scope) is a failed restore.
    found.inspect_err(|e| {
        if let Error::Restore { .. } = e {
            ctx.metrics.restore_failed(restore::failure_reason(e));
        }
    })
}

/// Probes the marker (unless known absent), decides the branch, resolves file sources, and
/// writes. With `shell` (a claimed warm pod's, [`crate::controller::warm_shells`]), a write
/// without files runs over it instead of a new exec.
///
/// The probe carries no stdin: it is also what finds out whether a starting container runs
/// yet, and an exec with stdin into one that does not can hang instead of failing.
pub async fn init_workspace(
    sbx: &Sandbox,
    ctx: &Context,
    pods: &Api<Pod>,
    pod_name: &str,
    start: Start<'_>,
) -> Result<(WorkspaceStatus, init_plan::Decision), Error> {
    let Start { ws, marker, shell } = start;
    let root = sbx.spec.workspace.root.trim_end_matches('/').to_string();
    let uid = sbx.uid().unwrap_or_default();
    let t0 = std::time::Instant::now();
    let (marker_present, lookup, warm) = match marker {
        Marker::Absent { lookup, warm } => (false, Some(lookup), warm),
        Marker::Probe => {
            let found = probe(pods, pod_name, &root).await?;
            (marked(&found, ws.root_ready), None, false)
        }
    };
    let probed = t0.elapsed();
    let snapshot = if marker_present {
        None
    } else {
        restore_candidate(ctx, sbx, lookup).await?
    };
    let decision = init_plan::decide(Observed {
        marker_present,
        root_was_ready: ws.root_ready,
        snapshot: snapshot.as_deref(),
        can_restore: ctx.store.is_some(),
    });
    if let Some(why) =
        init_plan::refused_when_lost(&decision, ws.root_ready, sbx.spec.snapshot.when_lost)
    {
        return Err(Error::WorkspaceLost(why));
    }
    // Branches B and C: restore before any file is written. A failure leaves the workspace
    // as it was and surfaces as WorkspaceReady=False with the refusal's reason.
    if let Some(snap) = decision.restore.as_deref() {
        restore::restore(ctx, sbx, pods, pod_name, snap).await?;
    }

    let files = sources::resolve_files(sbx, ctx).await?;
    let projections = sources::resolve_projections(sbx, ctx).await?;
    let hash = init_plan::projection_hash(&projections);
    let writes =
        init_plan::plan_writes(&decision, &files, &projections, hash != ws.projection_hash);
    let prepared = t0.elapsed();
    if warm && decision.restore.is_none() && writes.is_empty() {
        // The pool's marker stands as this fresh workspace's (see `marked`): nothing runs on
        // the claim's path.
        debug!(
            pod = pod_name,
            "the pool's marker stands: no workspace command"
        );
    } else if !writes.is_empty() || !marker_present {
        let via = init_plan::files_via(&writes, shell.is_some());
        let args = init_plan::script_args(&root, &uid, &writes, via);
        run_script(pods, pod_name, shell, args, &writes, via).await?;
    }
    debug!(
        sandbox = %sbx.name_any(),
        "workspace initialised: probe {probed:?}, lookups and restore until {prepared:?}, written at {:?}",
        t0.elapsed()
    );
    let new_ws = WorkspaceStatus {
        root_ready: true,
        last_start_branch: Some(decision.branch),
        projection_hash: hash,
        initialized_pod_uid: None,
        host_dir: ws.host_dir.clone(),
        used_bytes: ws.used_bytes,
        limit_bytes: ws.limit_bytes,
    };
    Ok((new_ws, decision))
}

/// The content of the marker of the workspace at `root` in the pod (empty: none).
async fn probe(pods: &Api<Pod>, pod_name: &str, root: &str) -> Result<Vec<u8>, Error> {
    let probe = exec::run(
        pods,
        pod_name,
        CONTAINER,
        ExecRequest::argv(remote::sh(remote::PROBE_SCRIPT, [root]))
            .timeout(INIT_TIMEOUT)
            .max_output(4096),
    )
    .await?;
    if !probe.status.success() {
        return Err(Error::Init(format!(
            "probing the workspace failed ({}): {}",
            probe.status,
            String::from_utf8_lossy(&probe.stderr).trim()
        )));
    }
    Ok(probe.stdout)
}

/// Whether the marker content the probe `found` says the workspace is initialised, for a
/// sandbox whose status has (`root_ready`) or has not recorded its workspace ready. The pool's
/// marker ([`remote::WARM_MARKER`]) counts only once that status went out: it is written with
/// Ready, after the start's command (or, when a claim had nothing to write, instead of it), so
/// a start that stopped between the adoption and that status initialises the workspace again.
pub fn marked(found: &[u8], root_ready: bool) -> bool {
    !found.is_empty() && (found != remote::WARM_MARKER.as_bytes() || root_ready)
}

/// Runs the workspace script, with the archive of `writes` on stdin when its files go `via`
/// one; over `shell` when there is one and no archive (a session command takes no stdin).
async fn run_script(
    pods: &Api<Pod>,
    pod_name: &str,
    shell: Option<&Session>,
    args: Vec<String>,
    writes: &init_plan::Writes,
    via: FilesVia,
) -> Result<(), Error> {
    let out = match shell {
        // Inline in the shell: its one fork and the script's `mv`, where `sh -c` under the
        // timeout's watchdog cost five more processes, most of a claim's time. The shell is
        // dropped after this command, so one stuck past the timeout goes with it.
        Some(shell) if via != FilesVia::Archive => {
            debug!(
                pod = pod_name,
                "workspace written over the warm pod's open shell"
            );
            shell
                .run_script(remote::INIT_SCRIPT, &args, INIT_TIMEOUT, 16 * 1024)
                .await?
        }
        _ => {
            let mut req = ExecRequest::argv(remote::sh(remote::INIT_SCRIPT, args))
                .timeout(INIT_TIMEOUT)
                .max_output(16 * 1024);
            if via == FilesVia::Archive {
                let mtime = u64::try_from(Timestamp::now().as_second()).unwrap_or(0);
                req = req.stdin(init_plan::archive(&writes.files, mtime)?);
            }
            exec::run(pods, pod_name, CONTAINER, req).await?
        }
    };
    if !out.status.success() {
        return Err(Error::Init(format!(
            "writing the workspace failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pools_marker_counts_only_once_the_status_recorded_the_workspace_ready() {
        assert!(!marked(b"", false) && !marked(b"", true), "no marker");
        assert!(
            marked(b"uid-1", false) && marked(b"uid-1", true),
            "a sandbox's"
        );
        let warm = remote::WARM_MARKER.as_bytes();
        assert!(
            !marked(warm, false),
            "adopted, stopped before Ready: initialise"
        );
        assert!(
            marked(warm, true),
            "claimed with nothing to write, Ready: reattach"
        );
    }
}
