//! The snapshot controller: SandboxSnapshot → `tar -c` in the sandbox pod → object store.
//!
//! observe (the snapshot, its sandbox and pod, whether this process is uploading it) →
//! [`decide`] (pure) → apply (take it under the scope's guard, or wait, or fail) → status.
//!
//! A snapshot is marked Ready only after its tarball is committed to its final key and the
//! manifest written. One found `Running` that this process is not uploading was interrupted
//! (operator restart, lost leadership): its objects are removed and it is taken again from
//! scratch, at most [`MAX_ATTEMPTS`] times in all, then Failed with the reason. Snapshots have
//! no owner, so they outlive their sandbox; a finalizer removes the object with the resource
//! when `deletionPolicy` is `Delete`.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use tracing::{info, warn};

use super::conditions;
use super::pod::CONTAINER;
use super::sandbox::{PodState, observe_pod};
use super::{Context, Error};
use crate::crd::{
    DeletionPolicy, LastSnapshot, Sandbox, SandboxRef, SandboxSnapshot, SandboxSnapshotSpec,
    SandboxSnapshotStatus, SnapshotPhase,
};
use crate::exec::{self, ExecEvent, ExecRequest};
use crate::guard::{self, GuardConfig, GuardError};
use crate::labels;
use crate::snapshot::archive::Refusal;
use crate::snapshot::store::{Commit, Manifest, SnapshotKeys, Store, StoreError};
use crate::snapshot::{self, SnapshotError};
use object_store::MultipartId;

/// Finalizer that removes a snapshot's object (policy `Delete`) before the resource goes.
pub const FINALIZER: &str = "agentbox.dev/snapshot-object";
/// Condition type on a SandboxSnapshot: its object is committed and verified.
pub const COMMITTED: &str = "Committed";
/// Attempts before an interrupted or failing snapshot is marked Failed.
pub const MAX_ATTEMPTS: i32 = 3;
/// How long to wait for the scope's guard before trying again later.
const GUARD_WAIT: Duration = Duration::from_secs(60);
/// Upper bound on one `tar -c` run.
const TAR_TIMEOUT: Duration = Duration::from_secs(4 * 3600);
/// Field manager of the Sandbox's `status.lastSnapshot`, the one Sandbox field this controller
/// writes (the sandbox controller applies the rest of the status under its own manager).
pub const LAST_SNAPSHOT_MANAGER: &str = "agentbox-operator-snapshots";
/// Label on snapshots taken by `spec.snapshot.onStop`.
pub const ON_STOP: &str = "agentbox.dev/on-stop";

/// Snapshots this process is uploading right now (by UID). A `Running` snapshot not in this
/// set was interrupted.
static IN_FLIGHT: LazyLock<Mutex<HashSet<String>>> = LazyLock::new(Default::default);

fn in_flight(uid: &str) -> bool {
    IN_FLIGHT.lock().map(|s| s.contains(uid)).unwrap_or(false)
}

/// Marks a UID in flight until dropped.
struct InFlight(String);

impl InFlight {
    fn new(uid: &str) -> Self {
        if let Ok(mut s) = IN_FLIGHT.lock() {
            s.insert(uid.to_string());
        }
        InFlight(uid.to_string())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Ok(mut s) = IN_FLIGHT.lock() {
            s.remove(&self.0);
        }
    }
}

/// What the referenced sandbox looks like to the snapshot controller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SandboxState {
    /// `sandboxRef.name` is not an object name (the message says so); it is never looked up.
    InvalidReference(String),
    /// No such Sandbox.
    Missing,
    /// The sandbox exists but its workspace cannot be read now (why).
    NotReady(String),
    /// Its pod runs and its workspace was initialised in that pod.
    Ready,
}

/// Everything [`decide`] needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// Current phase (`None` for a new snapshot).
    pub phase: Option<SnapshotPhase>,
    /// Attempts made so far.
    pub attempts: i32,
    /// The sandbox.
    pub sandbox: SandboxState,
    /// This process is uploading it now.
    pub in_flight: bool,
    /// The operator has a store.
    pub store: bool,
}

/// What to do with a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Ready or Failed already, or being uploaded by this process: nothing to do.
    Done,
    /// Mark Failed with this reason and message.
    Fail(&'static str, String),
    /// Stay Pending with this reason and message; look again later.
    Wait(&'static str, String),
    /// Take the snapshot now; `clean_first` when an interrupted attempt left objects behind.
    Take {
        /// Remove the objects of an interrupted attempt first.
        clean_first: bool,
    },
}

/// Decides what to do with a snapshot (pure).
pub fn decide(o: &Observed) -> Plan {
    match o.phase {
        Some(SnapshotPhase::Ready | SnapshotPhase::Failed) => return Plan::Done,
        Some(SnapshotPhase::Running) if o.in_flight => return Plan::Done,
        _ => {}
    }
    if !o.store {
        return Plan::Fail(
            "NoStore",
            "this operator has no object store configured (--store-url)".into(),
        );
    }
    let interrupted = o.phase == Some(SnapshotPhase::Running);
    if o.attempts >= MAX_ATTEMPTS {
        let why = if interrupted {
            "the last attempt was interrupted"
        } else {
            "the last attempt failed"
        };
        return Plan::Fail(
            if interrupted {
                "Interrupted"
            } else {
                "TooManyAttempts"
            },
            format!("gave up after {} attempts; {why}", o.attempts),
        );
    }
    match &o.sandbox {
        SandboxState::InvalidReference(m) => Plan::Fail("InvalidReference", m.clone()),
        SandboxState::Missing => Plan::Fail(
            "SandboxNotFound",
            "the referenced Sandbox does not exist".into(),
        ),
        SandboxState::NotReady(why) => Plan::Wait("SandboxNotReady", why.clone()),
        SandboxState::Ready => Plan::Take {
            clean_first: interrupted,
        },
    }
}

/// Order of a scope's snapshots: completion time (whole seconds in the API), then the fencing
/// token (each snapshot of a scope is taken under a new acquisition of the scope's guard, so
/// the token orders snapshots completed within the same second), then the name.
pub type Age = (Option<Timestamp>, i64, String);

/// The [`Age`] of a snapshot.
pub fn age(s: &SandboxSnapshot) -> Age {
    let st = s.status.as_ref();
    (
        st.and_then(|st| st.completed_at.as_ref()).map(|t| t.0),
        st.and_then(|st| st.fencing_token).unwrap_or(0),
        s.name_any(),
    )
}

/// Keeps the newest `keep` Ready snapshots (by [`Age`]) and returns the names of the others,
/// oldest first (pure).
pub fn retention_victims(ready: &[Age], keep: usize) -> Vec<String> {
    let mut v: Vec<&Age> = ready.iter().collect();
    v.sort_by(|a, b| b.cmp(a));
    let mut out: Vec<String> = v
        .into_iter()
        .skip(keep)
        .map(|(_, _, n)| n.clone())
        .collect();
    out.reverse();
    out
}

/// Reconciles one SandboxSnapshot.
pub async fn reconcile(snap: Arc<SandboxSnapshot>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = snap.namespace().ok_or(Error::NotNamespaced)?;
    let api: Api<SandboxSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
    finalizer(&api, FINALIZER, snap, |event| async {
        match event {
            Finalizer::Apply(s) => apply(&s, &ctx).await,
            Finalizer::Cleanup(s) => cleanup(&s, &ctx).await,
        }
    })
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)))
}

/// Observes the sandbox of a snapshot: the Sandbox and, if its workspace is initialised, its
/// pod.
async fn observe_sandbox(
    ctx: &Context,
    ns: &str,
    name: &str,
) -> Result<(SandboxState, Option<Sandbox>), Error> {
    // A name that is not one would change the request's path (kube does not escape it).
    if !crate::names::is_object_name(name) {
        let m = crate::names::refusal("sandboxRef.name", name);
        return Ok((SandboxState::InvalidReference(m), None));
    }
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), ns);
    let Some(sbx) = sandboxes.get_opt(name).await? else {
        return Ok((SandboxState::Missing, None));
    };
    let st = sbx.status.clone().unwrap_or_default();
    let Some(pod_name) = st.pod_name.clone() else {
        return Ok((
            SandboxState::NotReady("the sandbox has no pod".into()),
            Some(sbx),
        ));
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let Some(pod) = pods.get_opt(&pod_name).await? else {
        return Ok((
            SandboxState::NotReady("the sandbox pod does not exist".into()),
            Some(sbx),
        ));
    };
    // Starting counts too: a sandbox is served as soon as its container answers exec, which
    // can be before the kubelet reports it running (initialised-here is checked below).
    let serving = matches!(observe_pod(&pod), PodState::Ready | PodState::Starting);
    if !serving || pod.metadata.deletion_timestamp.is_some() {
        return Ok((
            SandboxState::NotReady("the sandbox pod is not ready".into()),
            Some(sbx),
        ));
    }
    let initialised = st
        .workspace
        .as_ref()
        .and_then(|w| w.initialized_pod_uid.as_deref())
        .is_some_and(|u| Some(u) == pod.metadata.uid.as_deref());
    if !initialised {
        return Ok((
            SandboxState::NotReady("the workspace is not initialised in the current pod".into()),
            Some(sbx),
        ));
    }
    Ok((SandboxState::Ready, Some(sbx)))
}

async fn apply(snap: &SandboxSnapshot, ctx: &Context) -> Result<Action, Error> {
    let ns = snap.namespace().ok_or(Error::NotNamespaced)?;
    let name = snap.name_any();
    let uid = snap.uid().unwrap_or_default();
    let api: Api<SandboxSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
    let old = snap.status.clone().unwrap_or_default();
    if matches!(
        old.phase,
        Some(SnapshotPhase::Ready | SnapshotPhase::Failed)
    ) {
        return Ok(Action::await_change());
    }
    let (sandbox, sbx) = observe_sandbox(ctx, &ns, &snap.spec.sandbox_ref.name).await?;
    let observed = Observed {
        phase: old.phase,
        attempts: old.attempts.unwrap_or(0),
        sandbox,
        in_flight: in_flight(&uid),
        store: ctx.store.is_some(),
    };
    let plan = decide(&observed);
    if matches!(plan, Plan::Take { .. } | Plan::Fail(..)) && !is_current(&api, snap).await? {
        // The cache lags our own last write (say, Ready): acting on it would take a finished
        // snapshot again. The watch event of the newer version brings us back.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let now = Timestamp::now();
    let mut st = old.clone();
    match plan {
        Plan::Done => Ok(Action::await_change()),
        Plan::Fail(reason, message) => {
            if let (Some(store), Some(keys)) = (ctx.store.as_ref(), keys_of(ctx, snap)) {
                discard_attempt(store, &keys, old.upload_id.as_deref())
                    .await
                    .map_err(snapshot_err)?;
            }
            st.upload_id = None;
            write_failure(ctx, snap, &api, st, reason, &message, true).await?;
            Ok(Action::await_change())
        }
        Plan::Wait(reason, message) => {
            st.phase = Some(SnapshotPhase::Pending);
            conditions::set(
                &mut st.conditions,
                COMMITTED,
                false,
                reason,
                &message,
                None,
                now,
            );
            if st != old {
                super::apply_status(&api, &name, &st).await?;
            }
            Ok(Action::requeue(Duration::from_secs(3)))
        }
        Plan::Take { clean_first } => {
            let (Some(store), Some(sbx)) = (ctx.store.clone(), sbx) else {
                return Ok(Action::requeue(Duration::from_secs(5)));
            };
            take(ctx, snap, &sbx, &store, clean_first, st).await
        }
    }
}

/// Records a failed attempt: Failed when `give_up`, else Pending for another attempt; the
/// Committed condition and a Warning Event carry the reason.
async fn write_failure(
    ctx: &Context,
    snap: &SandboxSnapshot,
    api: &Api<SandboxSnapshot>,
    mut st: SandboxSnapshotStatus,
    reason: &str,
    message: &str,
    give_up: bool,
) -> Result<(), Error> {
    let now = Timestamp::now();
    if give_up {
        st.phase = Some(SnapshotPhase::Failed);
        st.completed_at = Some(Time(now));
    } else {
        st.phase = Some(SnapshotPhase::Pending);
    }
    conditions::set(
        &mut st.conditions,
        COMMITTED,
        false,
        reason,
        message,
        None,
        now,
    );
    super::publish(ctx, snap, EventType::Warning, reason, "Snapshot", message).await;
    super::apply_status(api, &snap.name_any(), &st).await
}

/// Whether the cached snapshot is the API server's current version (a fresh read), so a
/// decision to take or fail it does not rest on a status this process already replaced.
async fn is_current(api: &Api<SandboxSnapshot>, snap: &SandboxSnapshot) -> Result<bool, Error> {
    let fresh = api.get_opt(&snap.name_any()).await?;
    Ok(fresh.is_some_and(|f| f.metadata.resource_version == snap.metadata.resource_version))
}

/// The keys of a snapshot, from the scope key in its status or labels.
fn keys_of(ctx: &Context, snap: &SandboxSnapshot) -> Option<SnapshotKeys> {
    let store = ctx.store.as_ref()?;
    let scope_key = snap
        .status
        .as_ref()
        .and_then(|s| s.scope_key.clone())
        .or_else(|| snap.labels().get(labels::SCOPE_KEY).cloned())?;
    Some(store.keys(&snap.namespace()?, &scope_key, &snap.uid()?))
}

fn snapshot_err(e: impl Into<SnapshotError>) -> Error {
    Error::Snapshot(e.into())
}

/// Removes what an unfinished attempt may have left: its multipart upload (by the id recorded
/// in the status; its parts are not objects and would stay in the bucket) and the temporary
/// object or staged files.
async fn discard_attempt(
    store: &Store,
    keys: &SnapshotKeys,
    upload_id: Option<&str>,
) -> Result<(), StoreError> {
    if let Some(id) = upload_id {
        store.abort_upload(keys, id).await?;
    }
    store.delete_temp(keys).await
}

/// Takes the snapshot: labels, guard, Running, stream, commit, manifest, Ready, retention.
async fn take(
    ctx: &Context,
    snap: &SandboxSnapshot,
    sbx: &Sandbox,
    store: &Store,
    clean_first: bool,
    mut st: SandboxSnapshotStatus,
) -> Result<Action, Error> {
    let ns = snap.namespace().ok_or(Error::NotNamespaced)?;
    let name = snap.name_any();
    let uid = snap.uid().unwrap_or_default();
    let api: Api<SandboxSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
    let scope_key = labels::scope_key(&sbx.spec.scope);
    let keys = store.keys(&ns, &scope_key, &uid);
    ensure_labels(&api, snap, sbx).await?;
    if clean_first {
        info!(snapshot = %name, namespace = %ns, "interrupted snapshot: removing its objects and taking it again");
        discard_attempt(store, &keys, st.upload_id.as_deref())
            .await
            .map_err(snapshot_err)?;
        store.delete_snapshot(&keys).await.map_err(snapshot_err)?;
        st.upload_id = None;
    }

    let gcfg = GuardConfig {
        holder: format!("{}/snapshot", ctx.config.identity),
        ..GuardConfig::default()
    };
    let g = match guard::acquire_scope(
        ctx.client.clone(),
        &ns,
        &sbx.spec.scope,
        &gcfg,
        Some(GUARD_WAIT),
    )
    .await
    {
        Ok(g) => g,
        Err(GuardError::Timeout { holder, .. }) => {
            let now = Timestamp::now();
            st.phase = Some(SnapshotPhase::Pending);
            let msg = format!("waiting for the scope's guard (held by {holder})");
            conditions::set(
                &mut st.conditions,
                COMMITTED,
                false,
                "GuardBusy",
                &msg,
                None,
                now,
            );
            super::apply_status(&api, &name, &st).await?;
            return Ok(Action::requeue(Duration::from_secs(5)));
        }
        Err(e) => return Err(Error::Guard(e)),
    };
    let _flight = InFlight::new(&uid);
    let now = Timestamp::now();
    let attempts = st.attempts.unwrap_or(0) + 1;
    st.phase = Some(SnapshotPhase::Running);
    st.attempts = Some(attempts);
    st.started_at = Some(Time(now));
    st.completed_at = None;
    st.fencing_token = Some(g.token());
    st.scope_key = Some(scope_key.clone());
    st.object_key = Some(keys.object.to_string());
    st.sha256 = None;
    st.size_bytes = None;
    st.members = None;
    conditions::set(
        &mut st.conditions,
        COMMITTED,
        false,
        "Uploading",
        "streaming the workspace to the object store",
        None,
        now,
    );
    // The upload is created before the Running write records its id: whoever finds this
    // attempt interrupted can then abort it (only a kill between the two calls loses it).
    let upload_id = match store.create_upload(&keys).await {
        Ok(id) => id,
        Err(e) => {
            let _ = g.release().await;
            return Err(snapshot_err(e));
        }
    };
    st.upload_id = upload_id.clone();
    if let Err(e) = super::apply_status(&api, &name, &st).await {
        if let Some(id) = &upload_id {
            let _ = store.abort_upload(&keys, id).await;
        }
        let _ = g.release().await;
        return Err(e);
    }
    st.upload_id = None;

    let pod_name = sbx
        .status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .unwrap_or_else(|| labels::pod_name(&sbx.name_any()));
    let started = std::time::Instant::now();
    let result = g
        .run(stream_to_store(
            ctx,
            sbx,
            (&ns, &pod_name),
            store,
            &keys,
            upload_id.as_ref(),
        ))
        .await
        .unwrap_or_else(|e| Err(SnapshotError::Source(format!("guard: {e}"))));
    let now = Timestamp::now();
    let outcome = match result {
        Ok((summary, commit)) => {
            info!(snapshot = %name, namespace = %ns, bytes = summary.size, secs = started.elapsed().as_secs_f64(), "uploaded; committing");
            let manifest = Manifest {
                version: 1,
                object_key: keys.object.to_string(),
                sha256: summary.sha256.clone(),
                size_bytes: summary.size,
                members: summary.members,
                namespace: ns.clone(),
                snapshot: name.clone(),
                snapshot_uid: uid.clone(),
                sandbox: sbx.name_any(),
                scope: sbx.spec.scope.kind.label_value().to_string(),
                scope_key: scope_key.clone(),
                created: now.to_string(),
                operator_version: env!("CARGO_PKG_VERSION").to_string(),
            };
            // Still the holder? A lost guard means someone else may have changed the
            // workspace while we read it: do not commit.
            if g.is_lost() {
                Err(SnapshotError::Source("the scope's guard was lost".into()))
            } else {
                match store.commit(&keys, commit).await {
                    Ok(()) => store
                        .put_manifest(&keys.manifest, &manifest)
                        .await
                        .map(|()| summary)
                        .map_err(SnapshotError::from),
                    Err(e) => Err(e.into()),
                }
            }
        }
        Err(e) => Err(e),
    };
    if let Err(e) = g.release().await {
        warn!(snapshot = %name, "releasing the scope guard: {e}");
    }
    match outcome {
        Ok(summary) => {
            st.phase = Some(SnapshotPhase::Ready);
            st.sha256 = Some(summary.sha256.clone());
            st.size_bytes = i64::try_from(summary.size).ok();
            st.members = i64::try_from(summary.members).ok();
            st.completed_at = Some(Time(now));
            let msg = format!(
                "{} bytes, {} members, sha256 {}",
                summary.size, summary.members, summary.sha256
            );
            conditions::set(
                &mut st.conditions,
                COMMITTED,
                true,
                "Committed",
                &msg,
                None,
                now,
            );
            super::apply_status(&api, &name, &st).await?;
            info!(snapshot = %name, namespace = %ns, "{msg}");
            let last = LastSnapshot {
                name: name.clone(),
                completed_at: Time(now),
                sha256: summary.sha256.clone(),
                size_bytes: st.size_bytes.unwrap_or(0),
            };
            if let Err(e) = set_last_snapshot(ctx, &ns, &sbx.name_any(), last).await {
                warn!(snapshot = %name, "recording the snapshot on its sandbox: {e}");
            }
            super::publish(ctx, snap, EventType::Normal, "Committed", "Snapshot", &msg).await;
            if let Err(e) = apply_retention(ctx, &ns, sbx, &scope_key).await {
                warn!(snapshot = %name, "retention: {e}");
            }
            Ok(Action::await_change())
        }
        Err(e) => {
            // The upload aborts itself on errors it sees, but not when a lost guard cancelled
            // it mid-way.
            let _ = discard_attempt(store, &keys, upload_id.as_deref()).await;
            let _ = store.delete(&keys.manifest).await;
            let _ = store.delete(&keys.object).await;
            let reason = e.reason();
            let msg = format!("attempt {attempts} failed: {e}");
            warn!(snapshot = %name, namespace = %ns, "{msg}");
            // An archive the restore would refuse stays refused: no point in trying again (a
            // truncated one is a broken stream, which may not recur).
            let refused = matches!(&e, SnapshotError::Refused(r) if *r != Refusal::Truncated);
            let give_up = attempts >= MAX_ATTEMPTS || refused;
            write_failure(ctx, snap, &api, st, reason, &msg, give_up).await?;
            Ok(Action::requeue(Duration::from_secs(5)))
        }
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
    match super::apply_status_as(&api, sandbox, &status, LAST_SNAPSHOT_MANAGER).await {
        Err(Error::Kube(kube::Error::Api(s))) if s.code == 404 => Ok(()),
        r => r,
    }
}

/// The `tar -c` script. `$1` root, `$2` number of expanded directories, then those
/// directories (ancestors of host mounts, listed entry by entry instead of archived whole),
/// then the excluded paths (host mounts). `.agentbox` is always excluded. busybox tar has no
/// `--exclude`, so the members are named one by one at the top and in expanded directories.
pub const TAR_SCRIPT: &str = r#"set -u
root=$1; n=$2; shift 2
nl='
'
anc=; i=0
while [ "$i" -lt "$n" ]; do anc="$anc$1$nl"; shift; i=$((i+1)); done
ex=".agentbox$nl"
for m in "$@"; do ex="$ex$m$nl"; done
cd "$root" || exit 1
# A workspace without its marker was lost or never initialised: archiving it would pass off
# an empty or partial tree as the sandbox's state.
[ -f .agentbox/marker ] || { echo "the workspace has no agentbox marker (lost or not initialised)" >&2; exit 1; }
listed() { case "$nl$2" in *"$nl$1$nl"*) return 0;; esac; return 1; }
set --
dirs=$anc
IFS=$nl
for d in "" $dirs; do
  IFS=' 	'
  p=${d:+$d/}
  for f in "$p"* "$p".[!.]* "$p"..?*; do
    { [ -e "$f" ] || [ -L "$f" ]; } || continue
    listed "$f" "$anc" && continue
    listed "$f" "$ex" && continue
    set -- "$@" "./$f"
  done
  IFS=$nl
done
IFS=' 	'
# Output still on its way when the exec's process exits can be dropped on the way out
# (kubernetes/kubernetes#124571: the streaming connection is closed right after the exit
# status, and a reader slower than tar loses the tail). So the script exits only when the
# operator ends its stdin, which it does once the archive's end marker has arrived; `read -t`
# caps the wait should that never come, and shells without `-t` skip it. (A v4 exec cannot end
# stdin without closing the connection, as for every exec with stdin: snapshots need v5.)
linger() { while read -r -t 600 _ 2>/dev/null; do :; done; }
if [ "$#" -eq 0 ]; then head -c 1024 /dev/zero; linger; exit 0; fi
# busybox tar writes a header, a file's bytes and its padding one write each; read straight
# from its pipe, a workspace of small files reaches the operator as a message per write. dd
# gathers the output into 64 KiB writes. sh has no pipefail: tar's exit status comes back
# through fd 3 (dd's failures show as a cut archive, which the operator refuses).
if command -v dd >/dev/null 2>&1; then
  exec 4>&1
  st=$( { { tar -c -f - "$@" 3>&- 4>&- </dev/null; echo $? >&3; } | dd ibs=131072 obs=65536 2>/dev/null >&4 3>&-; } 3>&1 )
else
  tar -c -f - "$@" </dev/null; st=$?
fi
# Only a whole archive has an end marker to wait for.
[ "${st:-1}" = 0 ] && linger
exit "${st:-1}"
"#;

/// Arguments of [`TAR_SCRIPT`] for a sandbox: its root, then the ancestors of its host mounts,
/// then the mounts.
pub fn tar_args(root: &str, mounts: &[String]) -> Vec<String> {
    let mounts: Vec<String> = mounts
        .iter()
        .map(|m| super::workspace::normalize(m))
        .filter(|m| !m.is_empty())
        .collect();
    let mut ancestors: Vec<String> = mounts
        .iter()
        .flat_map(|m| {
            let parts: Vec<&str> = m.split('/').collect();
            (1..parts.len()).map(move |i| parts[..i].join("/"))
        })
        .collect();
    ancestors.sort();
    ancestors.dedup();
    let mut args = vec![root.to_string(), ancestors.len().to_string()];
    args.extend(ancestors);
    args.extend(mounts);
    args
}

/// Runs `tar -c` in the pod and streams its stdout into the store's temporary key, through
/// the multipart upload `upload_id` when the store has them.
async fn stream_to_store(
    ctx: &Context,
    sbx: &Sandbox,
    (ns, pod): (&str, &str),
    store: &Store,
    keys: &SnapshotKeys,
    upload_id: Option<&MultipartId>,
) -> Result<(crate::snapshot::archive::Summary, Commit), SnapshotError> {
    store.delete_temp(keys).await?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let root = sbx.spec.workspace.root.trim_end_matches('/').to_string();
    let mounts: Vec<String> = sbx
        .spec
        .workspace
        .mounts
        .iter()
        .map(|m| m.path.clone())
        .collect();
    let mut argv = vec![
        "sh".to_string(),
        "-c".into(),
        TAR_SCRIPT.into(),
        "sh".into(),
    ];
    argv.extend(tar_args(&root, &mounts));
    // The script waits for its stdin to end before it exits (see TAR_SCRIPT); it ends when
    // the archive's end marker has arrived here, by dropping `release`.
    let (release, held) = tokio::io::duplex(64);
    let mut release = Some(release);
    let stream = exec::stream(
        &pods,
        pod,
        CONTAINER,
        ExecRequest::argv(argv)
            .timeout(TAR_TIMEOUT)
            .stdin_reader(held),
    )
    .await
    .map_err(|e| SnapshotError::Source(format!("exec: {e}")))?;
    let stderr = Arc::new(Mutex::new(exec::Capped::new(16 << 10)));
    let err_sink = stderr.clone();
    let chunks = stream.filter_map(move |ev| {
        let out = match ev {
            Ok(ExecEvent::Stdout(b)) => Some(Ok::<Bytes, SnapshotError>(b)),
            Ok(ExecEvent::Stderr(b)) => {
                if let Ok(mut c) = err_sink.lock() {
                    c.push(&b);
                }
                None
            }
            Ok(ExecEvent::Exit { status, timed_out }) => {
                if status.success() && !timed_out {
                    None
                } else {
                    let text = err_sink
                        .lock()
                        .map(|c| String::from_utf8_lossy(&c.buf).trim().to_string())
                        .unwrap_or_default();
                    Some(Err(SnapshotError::Source(format!(
                        "tar -c ended with {status}{}: {text}",
                        if timed_out { " (timed out)" } else { "" }
                    ))))
                }
            }
            Err(e) => Some(Err(SnapshotError::Source(format!("exec: {e}")))),
        };
        futures::future::ready(out)
    });
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
    let ready: Vec<Age> = super::selection::recorded_for(&api, scope_key)
        .await?
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter(|s| super::selection::is_ready_of_scope(s, scope_key))
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

/// Deleting a snapshot: with `Delete`, its objects go first; with `Retain`, only what an
/// unfinished attempt left (a multipart upload, a temporary object).
async fn cleanup(snap: &SandboxSnapshot, ctx: &Context) -> Result<Action, Error> {
    let (Some(store), Some(keys)) = (ctx.store.as_ref(), keys_of(ctx, snap)) else {
        return Ok(Action::await_change());
    };
    // An upload still recorded was cut short (a finished attempt clears it).
    let upload_id = snap.status.as_ref().and_then(|s| s.upload_id.as_deref());
    discard_attempt(store, &keys, upload_id)
        .await
        .map_err(snapshot_err)?;
    if snap.spec.deletion_policy == DeletionPolicy::Delete {
        store.delete_snapshot(&keys).await.map_err(snapshot_err)?;
    }
    Ok(Action::await_change())
}

/// Outcome of [`on_stop`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnStop {
    /// Nothing (more) to wait for: proceed with the suspend or delete.
    Proceed,
    /// A snapshot is being taken: look again shortly.
    Wait,
}

/// How long a stop waits for its snapshot before going ahead without it.
const ON_STOP_PATIENCE: Duration = Duration::from_secs(600);

/// The `spec.snapshot.onStop` hook, called before a sandbox's pod is deleted for a suspend or
/// a delete: creates (once per pod) a SandboxSnapshot of the running workspace and reports
/// whether to wait for it. A failed snapshot does not block the stop (a Warning Event says so).
pub async fn on_stop(ctx: &Context, sbx: &Sandbox) -> Result<OnStop, Error> {
    if !sbx.spec.snapshot.on_stop || ctx.store.is_none() {
        return Ok(OnStop::Proceed);
    }
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let st = sbx.status.clone().unwrap_or_default();
    let Some(pod_name) = st.pod_name.clone() else {
        return Ok(OnStop::Proceed);
    };
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(pod) = pods.get_opt(&pod_name).await? else {
        return Ok(OnStop::Proceed);
    };
    let pod_uid = pod.uid().unwrap_or_default();
    let initialised = st
        .workspace
        .as_ref()
        .and_then(|w| w.initialized_pod_uid.as_deref())
        == Some(pod_uid.as_str());
    if !initialised
        || observe_pod(&pod) != PodState::Ready
        || pod.metadata.deletion_timestamp.is_some()
    {
        return Ok(OnStop::Proceed);
    }
    let api: Api<SandboxSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
    let short: String = pod_uid.chars().filter(|c| *c != '-').take(10).collect();
    let name = labels::bounded_name(&format!("{}-stop-{short}", sbx.name_any()), 253);
    let snap = match api.get_opt(&name).await? {
        Some(s) => s,
        None => {
            let mut l: BTreeMap<String, String> = labels::scope_labels(&sbx.spec.scope);
            l.insert(
                labels::SANDBOX.into(),
                labels::sandbox_label_value(&sbx.name_any()),
            );
            l.insert(ON_STOP.into(), "true".into());
            let mut obj = SandboxSnapshot::new(
                &name,
                SandboxSnapshotSpec {
                    sandbox_ref: SandboxRef {
                        name: sbx.name_any(),
                    },
                    deletion_policy: DeletionPolicy::default(),
                },
            );
            obj.metadata.labels = Some(l);
            obj.metadata.annotations = Some(labels::scope_annotations(&sbx.spec.scope));
            match api.create(&PostParams::default(), &obj).await {
                Ok(s) => {
                    info!(sandbox = %sbx.name_any(), snapshot = %name, "onStop: taking a snapshot before stopping");
                    s
                }
                Err(kube::Error::Api(s)) if s.code == 409 => return Ok(OnStop::Wait),
                Err(e) => return Err(e.into()),
            }
        }
    };
    match snap.status.as_ref().and_then(|s| s.phase) {
        Some(SnapshotPhase::Ready) => Ok(OnStop::Proceed),
        Some(SnapshotPhase::Failed) => {
            warn!(sandbox = %sbx.name_any(), snapshot = %name, "onStop snapshot failed; stopping without it");
            Ok(OnStop::Proceed)
        }
        _ => {
            let age = snap
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| Timestamp::now().duration_since(t.0).unsigned_abs())
                .unwrap_or_default();
            if age > ON_STOP_PATIENCE {
                warn!(sandbox = %sbx.name_any(), snapshot = %name, "onStop snapshot not done in time; stopping without it");
                Ok(OnStop::Proceed)
            } else {
                Ok(OnStop::Wait)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(
        phase: Option<SnapshotPhase>,
        attempts: i32,
        sandbox: SandboxState,
        in_flight: bool,
    ) -> Plan {
        decide(&Observed {
            phase,
            attempts,
            sandbox,
            in_flight,
            store: true,
        })
    }

    #[test]
    fn a_new_snapshot_of_a_ready_sandbox_is_taken() {
        assert_eq!(
            obs(None, 0, SandboxState::Ready, false),
            Plan::Take { clean_first: false }
        );
        assert_eq!(
            obs(Some(SnapshotPhase::Pending), 1, SandboxState::Ready, false),
            Plan::Take { clean_first: false }
        );
    }

    #[test]
    fn finished_or_in_flight_snapshots_are_left_alone() {
        for p in [SnapshotPhase::Ready, SnapshotPhase::Failed] {
            assert_eq!(obs(Some(p), 1, SandboxState::Missing, false), Plan::Done);
        }
        assert_eq!(
            obs(Some(SnapshotPhase::Running), 1, SandboxState::Ready, true),
            Plan::Done
        );
    }

    #[test]
    fn an_interrupted_snapshot_is_cleaned_and_retaken_then_given_up() {
        assert_eq!(
            obs(Some(SnapshotPhase::Running), 1, SandboxState::Ready, false),
            Plan::Take { clean_first: true }
        );
        let p = obs(
            Some(SnapshotPhase::Running),
            MAX_ATTEMPTS,
            SandboxState::Ready,
            false,
        );
        assert!(matches!(p, Plan::Fail("Interrupted", _)), "{p:?}");
        let p = obs(
            Some(SnapshotPhase::Pending),
            MAX_ATTEMPTS,
            SandboxState::Ready,
            false,
        );
        assert!(matches!(p, Plan::Fail("TooManyAttempts", _)), "{p:?}");
    }

    #[test]
    fn sandbox_states_and_store() {
        assert!(matches!(
            obs(None, 0, SandboxState::Missing, false),
            Plan::Fail("SandboxNotFound", _)
        ));
        assert!(matches!(
            obs(None, 0, SandboxState::InvalidReference("bad".into()), false),
            Plan::Fail("InvalidReference", m) if m == "bad"
        ));
        assert!(matches!(
            obs(None, 0, SandboxState::NotReady("x".into()), false),
            Plan::Wait("SandboxNotReady", _)
        ));
        let no_store = decide(&Observed {
            phase: None,
            attempts: 0,
            sandbox: SandboxState::Ready,
            in_flight: false,
            store: false,
        });
        assert!(matches!(no_store, Plan::Fail("NoStore", _)));
    }

    #[test]
    fn retention_keeps_the_newest() {
        let t = |s: i64| Some(Timestamp::from_second(s).unwrap());
        let ready = vec![
            (t(30), 3, "c".to_string()),
            (t(10), 1, "a".to_string()),
            (t(20), 2, "b".to_string()),
            (t(40), 4, "d".to_string()),
        ];
        assert_eq!(retention_victims(&ready, 2), vec!["a", "b"]);
        assert_eq!(retention_victims(&ready, 4), Vec::<String>::new());
        assert_eq!(retention_victims(&ready, 1), vec!["a", "b", "c"]);
        // Within one second the fencing token decides, not the name.
        let same = vec![
            (t(50), 7, "z-old".to_string()),
            (t(50), 8, "a-new".to_string()),
        ];
        assert_eq!(retention_victims(&same, 1), vec!["z-old"]);
    }

    #[test]
    fn tar_args_expand_mount_ancestors() {
        assert_eq!(tar_args("/workspace", &[]), vec!["/workspace", "0"]);
        assert_eq!(
            tar_args("/w", &["data".into(), "./a/b/c/".into()]),
            vec!["/w", "2", "a", "a/b", "data", "a/b/c"]
        );
    }

    /// Runs [`TAR_SCRIPT`] with the host's `sh` and `tar` on a scratch workspace; returns the
    /// exit status, the member names, and stderr.
    fn run_tar_script(root: &std::path::Path, mounts: &[String]) -> (bool, Vec<String>, String) {
        let out = std::process::Command::new("sh")
            .args(["-c", TAR_SCRIPT, "sh"])
            .args(tar_args(&root.to_string_lossy(), mounts))
            .output()
            .expect("run sh");
        let mut names = Vec::new();
        if out.status.success() {
            let mut ar = tar::Archive::new(&out.stdout[..]);
            for e in ar.entries().expect("entries") {
                let e = e.expect("entry");
                names.push(e.path().expect("path").to_string_lossy().into_owned());
            }
            names.sort();
        }
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), names, err)
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("agentbox-tar-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[test]
    fn tar_script_keeps_tar_s_exit_status_through_its_dd_stage() {
        let dir = scratch("status");
        std::fs::create_dir_all(dir.join(".agentbox")).expect("mkdir");
        std::fs::write(dir.join(".agentbox/marker"), "m").expect("marker");
        std::fs::write(dir.join("f"), "x").expect("write");
        // A tar that prints a little and fails, first in PATH.
        let bin = scratch("status-bin");
        std::fs::write(bin.join("tar"), "#!/bin/sh\nprintf partial\nexit 3\n").expect("fake tar");
        std::process::Command::new("chmod")
            .args(["0755", &bin.join("tar").to_string_lossy()])
            .status()
            .expect("chmod");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = std::process::Command::new("sh")
            .args(["-c", TAR_SCRIPT, "sh"])
            .args(tar_args(&dir.to_string_lossy(), &[]))
            .env("PATH", path)
            .output()
            .expect("run sh");
        assert_eq!(
            out.status.code(),
            Some(3),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, b"partial");
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&bin);
    }

    #[test]
    fn tar_script_refuses_a_workspace_without_its_marker() {
        let dir = scratch("nomarker");
        std::fs::write(dir.join("f"), "x").expect("write");
        let (ok, _, err) = run_tar_script(&dir, &[]);
        assert!(!ok, "a workspace without a marker must not be archived");
        assert!(err.contains("no agentbox marker"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tar_script_archives_all_but_its_own_dir_and_mounts() {
        let dir = scratch("ok");
        std::fs::create_dir_all(dir.join(".agentbox")).expect("mkdir");
        std::fs::write(dir.join(".agentbox/marker"), "m").expect("marker");
        std::fs::create_dir_all(dir.join("a/mnt")).expect("mkdir");
        std::fs::write(dir.join("a/mnt/secret"), "s").expect("write");
        std::fs::write(dir.join("a/keep"), "k").expect("write");
        std::fs::write(dir.join(".hidden"), "h").expect("write");
        let (ok, names, err) = run_tar_script(&dir, &["a/mnt".into()]);
        assert!(ok, "{err}");
        assert_eq!(names, vec!["./.hidden", "./a/keep"]);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
