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

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use tracing::info;

use super::pod::CONTAINER;
use super::{Context, Error};
use crate::crd::{Sandbox, SandboxSnapshot, SnapshotPhase};
use crate::exec::{self, ExecRequest};
use crate::guard::{self, GuardConfig, GuardError};
use crate::snapshot::{self, SnapshotError, archive};

/// How long to wait for the scope's guard.
const GUARD_WAIT: Duration = Duration::from_secs(60);
/// Upper bound on the extracting exec.
const EXTRACT_TIMEOUT: Duration = Duration::from_secs(4 * 3600);
/// Upper bound on the swap and cleanup execs.
const SWAP_TIMEOUT: Duration = Duration::from_secs(600);

/// Extraction into a new staging directory: `$1` root, `$2` id; the archive on stdin.
pub const EXTRACT_SCRIPT: &str = r#"set -eu
cd "$1"
mkdir -p .agentbox
st=".agentbox/staging-$2"
rm -rf -- "$st"
mkdir -- "$st"
tar -x -f - -C "$st"
"#;

/// Removes a staging directory: `$1` root, `$2` id.
pub const DISCARD_SCRIPT: &str =
    r#"cd "$1" && rm -rf -- ".agentbox/staging-$2" ".agentbox/old-$2""#;

/// The swap: `$1` root, `$2` id, then top-level names to leave alone (they hold host mounts).
/// Undoes its own moves when one fails.
pub const SWAP_SCRIPT: &str = r#"set -u
root=$1; id=$2; shift 2
nl='
'
keep=".agentbox$nl"
for k in "$@"; do keep="$keep$k$nl"; done
kept() { case "$nl$keep" in *"$nl$1$nl"*) return 0;; esac; return 1; }
cd "$root" || exit 1
st=".agentbox/staging-$id"; old=".agentbox/old-$id"
[ -d "$st" ] || { echo "no staging directory" >&2; exit 1; }
rm -rf -- "$old"; mkdir -- "$old" || exit 1
back() {
  for f in "$old"/* "$old"/.[!.]* "$old"/..?*; do
    { [ -e "$f" ] || [ -L "$f" ]; } || continue
    mv -- "$f" ./ || echo "could not move back $f" >&2
  done
  rmdir -- "$old" 2>/dev/null
}
for f in * .[!.]* ..?*; do
  { [ -e "$f" ] || [ -L "$f" ]; } || continue
  kept "$f" && continue
  mv -- "$f" "$old/" || { echo "moving $f aside failed" >&2; back; exit 1; }
done
for f in "$st"/* "$st"/.[!.]* "$st"/..?*; do
  { [ -e "$f" ] || [ -L "$f" ]; } || continue
  b=${f##*/}
  kept "$b" && continue
  if ! mv -- "$f" "./$b"; then
    echo "moving $b in failed" >&2
    for g in * .[!.]* ..?*; do
      { [ -e "$g" ] || [ -L "$g" ]; } || continue
      kept "$g" && continue
      rm -rf -- "$g"
    done
    back; exit 1
  fi
done
rm -rf -- "$st" "$old"
"#;

fn fail(reason: &'static str, message: impl Into<String>) -> Error {
    Error::Restore {
        reason,
        message: message.into(),
    }
}

fn from_snapshot(e: SnapshotError) -> Error {
    let reason = e.reason();
    fail(reason, e.to_string())
}

/// Restores `snapshot` into the sandbox's workspace in pod `pod_name`.
pub async fn restore(
    ctx: &Context,
    sbx: &Sandbox,
    pods: &Api<Pod>,
    pod_name: &str,
    snapshot_name: &str,
) -> Result<(), Error> {
    let store = ctx
        .store
        .as_ref()
        .ok_or_else(|| fail("NoStore", "this operator has no object store"))?;
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let snaps: Api<SandboxSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
    let snap = snaps.get_opt(snapshot_name).await?.ok_or_else(|| {
        fail(
            "SnapshotNotFound",
            format!("SandboxSnapshot {snapshot_name} not found"),
        )
    })?;
    let st = snap.status.clone().unwrap_or_default();
    if st.phase != Some(SnapshotPhase::Ready) {
        return Err(fail(
            "SnapshotNotReady",
            format!("SandboxSnapshot {snapshot_name} is not Ready"),
        ));
    }
    let (Some(sha), Some(scope_key), Some(uid)) =
        (st.sha256.clone(), st.scope_key.clone(), snap.uid())
    else {
        return Err(fail(
            "SnapshotIncomplete",
            format!("SandboxSnapshot {snapshot_name} has no digest or scope key"),
        ));
    };
    let keys = store.keys(&ns, &scope_key, &uid);
    let size = st.size_bytes.and_then(|s| u64::try_from(s).ok());
    let limits = ctx.config.restore_limits();

    let gcfg = GuardConfig {
        holder: format!("{}/restore", ctx.config.identity),
        ..GuardConfig::default()
    };
    let g = guard::acquire_scope(
        ctx.client.clone(),
        &ns,
        &sbx.spec.scope,
        &gcfg,
        Some(GUARD_WAIT),
    )
    .await
    .map_err(|e| match e {
        GuardError::Timeout { holder, .. } => fail(
            "GuardBusy",
            format!("the scope's guard is held by {holder}"),
        ),
        e => Error::Guard(e),
    })?;
    let root = sbx.spec.workspace.root.trim_end_matches('/').to_string();
    let id = format!("{:016x}", rand::random::<u64>());
    let work = async {
        info!(sandbox = %sbx.name_any(), snapshot = %snapshot_name, "extracting into staging");
        let started = std::time::Instant::now();
        let extracted = extract(
            pods,
            pod_name,
            &root,
            &id,
            store,
            &keys.object,
            limits,
            (&sha, size),
        )
        .await;
        let staged = match extracted {
            Ok(s) => s,
            Err(e) => {
                discard(pods, pod_name, &root, &id).await;
                return Err(e);
            }
        };
        info!(sandbox = %sbx.name_any(), snapshot = %snapshot_name, bytes = staged.size, members = staged.members, secs = started.elapsed().as_secs_f64(), "staged and verified; swapping in");
        let mut argv = vec![
            "sh".to_string(),
            "-c".into(),
            SWAP_SCRIPT.into(),
            "sh".into(),
            root.clone(),
            id.clone(),
        ];
        let mut tops: Vec<String> = sbx
            .spec
            .workspace
            .mounts
            .iter()
            .filter_map(|m| {
                super::workspace::normalize(&m.path)
                    .split('/')
                    .next()
                    .map(str::to_string)
            })
            .filter(|t| !t.is_empty())
            .collect();
        tops.sort();
        tops.dedup();
        argv.extend(tops);
        let out = exec::run(
            pods,
            pod_name,
            CONTAINER,
            ExecRequest::argv(argv)
                .timeout(SWAP_TIMEOUT)
                .max_output(16 << 10),
        )
        .await?;
        if !out.success() {
            discard(pods, pod_name, &root, &id).await;
            return Err(fail(
                "SwapFailed",
                format!(
                    "swapping the restored workspace in failed ({}): {}",
                    out.status,
                    out.stderr_str().trim()
                ),
            ));
        }
        info!(sandbox = %sbx.name_any(), snapshot = %snapshot_name, secs = started.elapsed().as_secs_f64(), "restored");
        Ok(())
    };
    let result = g.run(work).await;
    let _ = g.release().await;
    match result {
        Ok(r) => r,
        Err(e) => Err(Error::Guard(e)),
    }
}

/// Streams the object through the validator into `tar -x` in a fresh staging directory and
/// checks that what was read is the snapshot (`expected`: digest and, when recorded, size).
#[allow(clippy::too_many_arguments)]
async fn extract(
    pods: &Api<Pod>,
    pod_name: &str,
    root: &str,
    id: &str,
    store: &snapshot::store::Store,
    key: &object_store::path::Path,
    limits: archive::Limits,
    expected: (&str, Option<u64>),
) -> Result<archive::Summary, Error> {
    let (reader, task) = snapshot::canonical_reader(store, key, limits)
        .await
        .map_err(from_snapshot)?;
    let req = ExecRequest::argv(["sh", "-c", EXTRACT_SCRIPT, "sh", root, id])
        .stdin_reader(reader)
        .timeout(EXTRACT_TIMEOUT)
        .max_output(16 << 10);
    let out = exec::run(pods, pod_name, CONTAINER, req).await;
    let forwarded = task
        .await
        .map_err(|e| fail("RestoreFailed", format!("forwarding task: {e}")))?
        .map_err(from_snapshot)?;
    let out = out?;
    archive::verify(&forwarded, expected.0, expected.1)
        .map_err(|r| from_snapshot(SnapshotError::Refused(r)))?;
    if !out.success() {
        return Err(fail(
            "ExtractFailed",
            format!(
                "tar -x in the pod failed ({}): {}",
                out.status,
                out.stderr_str().trim()
            ),
        ));
    }
    Ok(forwarded)
}

async fn discard(pods: &Api<Pod>, pod_name: &str, root: &str, id: &str) {
    let req = ExecRequest::argv(["sh", "-c", DISCARD_SCRIPT, "sh", root, id])
        .timeout(SWAP_TIMEOUT)
        .max_output(4096);
    if let Err(e) = exec::run(pods, pod_name, CONTAINER, req).await {
        tracing::warn!(pod = pod_name, "removing the staging directory failed: {e}");
    }
}
