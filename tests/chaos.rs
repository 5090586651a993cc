//! Chaos: the operator SIGKILLed at a random point of create, snapshot, restore, suspend,
//! delete, the claim of a warm pod, a pool's refill and a snapshot whose `tar` stalls, then
//! started again (issues 18 and 28). Each trial is seeded; its seed, operation and kill
//! delay are printed first, so a failure can be replayed with `CHAOS_SEED=<seed>
//! CHAOS_TRIALS=1`. After every trial the invariants are checked and counted:
//!
//! - the Sandbox converges to its spec (Ready, Suspended without a pod, or gone), and a pool to
//!   its replicas of claimable warm pods;
//! - a pod is adopted by at most one Sandbox, and a Ready Sandbox has exactly one pod, the one
//!   its status names;
//! - a snapshot whose `tar` stalls ends Failed with `StreamStalled`, and its scope's guard is
//!   free (at once, or once a killed holder's Lease expired);
//! - no Ready snapshot whose object does not match its status (digest, size, manifest), and a
//!   Failed one has no object;
//! - no multipart upload the killed operator started is left open;
//! - once the trial's objects are deleted: no pod, guard Lease or workspace directory (the
//!   sandboxes' and the warm pods' `warm-*`) left.
//!
//! `CHAOS_TRIALS` (default 5, as in `hack/test`: consecutive seeds, so five of the eight
//! operations, which five turning with the seed; `hack/chaos` runs 50) and `CHAOS_SEED`
//! (default: from the clock) choose the trials; `CHAOS_REPORT=<file>` writes the table.
//! The store is the s3s-fs server of `hack/s3`, so multipart uploads are part of the test.
//!
//! A second test kills the object store (an s3s-fs of its own) during a snapshot and a
//! restore and checks that nothing is marked Ready or served without its data, and that both
//! recover when the store returns.

mod common;

use std::fmt::Write as _;
use std::future::Future;
use std::time::{Duration, Instant};

use agentbox_api::crd::{
    Sandbox, SandboxPhase, SandboxPool, SandboxSnapshot, SandboxTemplate, SnapshotPhase,
};
use agentbox_api::guard::{self, GuardConfig};
use agentbox_api::labels;
use common::pools::{create_pool, create_template};
use common::store::{Backend, Kind, backend, object_digest, start, upload_alive, upload_forgotten};
use common::{NODE_ROOT, TestEnv, create_sandbox, sh};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

// Namespaces are short: s3s-fs keeps each upload's metadata in one file named after the
// base64 of the whole key (`<prefix = namespace>/<namespace>/<scope key>/<uid>.tar`), and a
// name over 255 bytes fails the upload with a 500.

/// One test of this binary restarts the API server, which the others must not meet by
/// accident: it runs alone (the write side); the others side by side (the read side). hack/test
/// runs it in a process of its own after the lanes anyway.
static SERIAL: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// What a trial does while the operator is killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Create,
    Snapshot,
    Restore,
    Suspend,
    Delete,
    /// A templated Sandbox claiming its pool's warm pod.
    Claim,
    /// A pool making two warm pods (one lost, one more wanted).
    PoolRefill,
    /// A snapshot whose `tar -c` (the sandbox's planted `sh`) sends a header and then nothing.
    Stall,
}

const OPS: [Op; 8] = [
    Op::Create,
    Op::Snapshot,
    Op::Restore,
    Op::Suspend,
    Op::Delete,
    Op::Claim,
    Op::PoolRefill,
    Op::Stall,
];

impl Op {
    /// Its name in the table.
    fn label(self) -> &'static str {
        match self {
            Op::Create => "Create",
            Op::Snapshot => "Snapshot",
            Op::Restore => "Restore",
            Op::Suspend => "Suspend",
            Op::Delete => "Delete",
            Op::Claim => "Claim of a warm pod",
            Op::PoolRefill => "Pool refill",
            Op::Stall => "Stalled snapshot",
        }
    }

    /// Longest delay before the kill: the stalled snapshot's first attempt fails after the
    /// progress deadline, so its kills land before, during and after that.
    fn max_kill_ms(self) -> u64 {
        match self {
            Op::Stall => MAX_KILL_MS + STALL_SECONDS * 1000,
            _ => MAX_KILL_MS,
        }
    }
}

/// The progress deadline (`--stream-stall-seconds`) of the kill trials' operators: short, so
/// that a stalled snapshot fails within the trial. Only time spent waiting for the sandbox
/// counts (not the store), so the 68 MiB snapshots of the other trials do not trip it.
const STALL_SECONDS: u64 = 3;

/// Longest delay between starting the operation and the kill: each operation takes about a
/// second or a few on the local cluster, so kills land before, during and after it.
const MAX_KILL_MS: u64 = 2500;

/// One trial's record, for the table.
struct Trial {
    seed: u64,
    op: Op,
    kill_ms: u64,
    /// The object's phase when the kill came (was the operation under way?).
    at_kill: String,
    outcome: String,
    violations: Vec<String>,
}

/// Polls `check` every 200 ms until it holds or `secs` pass.
async fn until<F, Fut>(secs: u64, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn spec(user: &str) -> serde_json::Value {
    json!({
        "image": common::BASE_IMAGE,
        "imagePullPolicy": "Never",
        "scope": {"kind": "User", "agent": "chaos", "user": user},
    })
}

fn scope_key(user: &str) -> String {
    labels::scope_key(&serde_json::from_value(spec(user)["scope"].clone()).expect("scope"))
}

/// A Sandbox of template `tpl` with a file of its own (written into the warm pod it claims),
/// in the same scope as [`spec`]'s.
fn templated(user: &str, tpl: &str) -> serde_json::Value {
    json!({
        "templateRef": {"name": tpl},
        "scope": spec(user)["scope"].clone(),
        "workspace": {"files": [{"path": "task.md", "content": format!("task of {user}\n")}]},
    })
}

/// Pool `pool`'s warm pods (labelled warm, not being deleted); empty when the list fails.
async fn warm_pods(env: &TestEnv, pool: &str) -> Vec<Pod> {
    let lp =
        ListParams::default().labels(&format!("{}={pool},{}=true", labels::POOL, labels::WARM));
    env.api::<Pod>()
        .list(&lp)
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

/// Waits (up to `secs`) until pool `pool` has exactly `n` warm pods, all claimable, none named
/// in `not`; returns them, or None with what it had last.
async fn wait_warm(
    env: &TestEnv,
    pool: &str,
    n: usize,
    not: &[String],
    secs: u64,
) -> Result<Vec<Pod>, Vec<String>> {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        let pods = warm_pods(env, pool).await;
        if pods.len() == n
            && pods
                .iter()
                .all(agentbox_operator::controller::pool::is_claimable)
            && !pods.iter().any(|p| not.contains(&p.name_any()))
        {
            return Ok(pods);
        }
        if Instant::now() > end {
            return Err(pods.iter().map(|p| p.name_any()).collect());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The template `tpl{i}` and its pool `p{i}` of `n` warm pods, all claimable; returns the
/// pool's name and its pods.
async fn warm_pool(env: &TestEnv, i: usize, n: usize) -> Result<(String, Vec<Pod>), String> {
    let tpl = format!("tpl{i}");
    let pool = format!("p{i}");
    create_template(env, &tpl, "chaos").await;
    create_pool(env, &pool, &tpl, n as i64, "Recreate")
        .await
        .map_err(|e| format!("create pool {pool}: {e}"))?;
    let warm = wait_warm(env, &pool, n, &[], 180)
        .await
        .map_err(|had| format!("{pool}: not {n} claimable warm pods before the fault: {had:?}"))?;
    Ok((pool, warm))
}

/// A pod is adopted by at most one Sandbox (and has at most one controller), and a Ready
/// Sandbox has exactly one live pod, the one its status names.
async fn check_adoptions(env: &TestEnv, v: &mut Vec<String>) {
    let (pods, sandboxes) = match (
        env.api::<Pod>().list(&common::not_the_beacon()).await,
        env.api::<Sandbox>().list(&ListParams::default()).await,
    ) {
        (Ok(p), Ok(s)) => (p.items, s.items),
        (p, s) => {
            v.push(format!(
                "listing pods and sandboxes failed: {:?} {:?}",
                p.err(),
                s.err()
            ));
            return;
        }
    };
    for p in &pods {
        let owners = p.owner_references();
        let controllers = owners.iter().filter(|o| o.controller == Some(true)).count();
        let sandbox_owners = owners.iter().filter(|o| o.kind == "Sandbox").count();
        if controllers > 1 || sandbox_owners > 1 {
            v.push(format!(
                "pod {} has {controllers} controllers and {sandbox_owners} Sandbox owners",
                p.name_any()
            ));
        }
    }
    for s in &sandboxes {
        let name = s.name_any();
        let st = s.status.clone().unwrap_or_default();
        if st.phase != Some(SandboxPhase::Ready) {
            continue;
        }
        let live: Vec<String> = pods
            .iter()
            .filter(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.labels().get(labels::SANDBOX) == Some(&name)
            })
            .map(|p| p.name_any())
            .collect();
        if live.len() != 1 || st.pod_name.as_ref() != live.first() {
            v.push(format!(
                "Ready sandbox {name} (podName {:?}) has the pods {live:?}",
                st.pod_name
            ));
        }
    }
}

/// Replaces `sh` in the sandbox's pod with one whose `tar -c -f -` sends the first header of
/// an archive that claims a 3 GiB member, then nothing, keeping the exec open (what code in
/// the sandbox can do: [`common::plant_shell`]). Everything else runs as before.
async fn plant_stalling_tar(env: &TestEnv, pod: &str) -> Result<(), String> {
    let head = common::raw_header("big", b'0', 3 << 30, "");
    let arms =
        r#"*"tar -""c -f -"*) /bin/busybox cat /tmp/told.tar; exec /bin/busybox sleep 100000;;"#;
    common::plant_shell(env, pod, &head, arms).await
}

/// The reason of a snapshot's Committed condition.
fn committed_reason(s: &SandboxSnapshot) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Committed"))
        .map(|c| c.reason.clone())
        .unwrap_or_default()
}

/// Whether a harness gets the scope's guard: at once ("at once"), or once a killed holder's
/// Lease expired ("after the dead holder's Lease"); None when it cannot.
async fn guard_free(env: &TestEnv, user: &str) -> Option<&'static str> {
    let scope = serde_json::from_value(spec(user)["scope"].clone()).expect("scope");
    let cfg = GuardConfig {
        holder: "a-harness".into(),
        ..GuardConfig::default()
    };
    // The longest wait: a dead holder's Lease is taken over after a full lease duration
    // without renewal, seen on the taker's own clock.
    let expiry = cfg.lease_duration * 2 + Duration::from_secs(5);
    for (wait, how) in [
        (Duration::ZERO, "at once"),
        (expiry, "after the dead holder's Lease"),
    ] {
        if let Ok(g) =
            guard::acquire_scope(env.client.clone(), &env.ns, &scope, &cfg, Some(wait)).await
        {
            let _ = g.release().await;
            return Some(how);
        }
    }
    None
}

async fn phase(env: &TestEnv, name: &str) -> Option<SandboxPhase> {
    env.api::<Sandbox>()
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|s| s.status)
        .and_then(|s| s.phase)
}

async fn pod_of(env: &TestEnv, name: &str) -> Option<String> {
    env.api::<Sandbox>()
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|s| s.status)
        .and_then(|s| s.pod_name)
}

/// The phase as the table shows it ("none" before the first status, "gone" once deleted).
async fn phase_name(env: &TestEnv, name: &str) -> String {
    match env.api::<Sandbox>().get_opt(name).await.ok().flatten() {
        None => "gone".into(),
        Some(s) => s
            .status
            .and_then(|s| s.phase)
            .map_or("none".into(), |p| format!("{p:?}")),
    }
}

async fn wait_phase(env: &TestEnv, name: &str, want: SandboxPhase, secs: u64) -> bool {
    until(secs, || async { phase(env, name).await == Some(want) }).await
}

/// Creates a Ready sandbox `name` of user `user` with a marker file; returns its marker.
async fn ready_sandbox(env: &TestEnv, name: &str, user: &str) -> Result<String, String> {
    create_sandbox(env, name, spec(user))
        .await
        .map_err(|e| format!("create {name}: {e}"))?;
    if !wait_phase(env, name, SandboxPhase::Ready, 300).await {
        return Err(format!("{name} never Ready before the fault"));
    }
    let pod = pod_of(env, name).await.ok_or("no pod")?;
    let marker = format!("{name}-{}", common::suffix());
    let (code, _) = sh(
        env,
        &pod,
        &format!(
            "echo {marker} > /workspace/marker && head -c 4194304 /dev/urandom > /workspace/blob"
        ),
    )
    .await;
    if code != Some(0) {
        return Err("filling the workspace failed".into());
    }
    Ok(marker)
}

fn snapshot_obj(name: &str, sandbox: &str) -> SandboxSnapshot {
    serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1",
        "kind": "SandboxSnapshot",
        "metadata": {"name": name},
        "spec": {"sandboxRef": {"name": sandbox}, "deletionPolicy": "Delete"},
    }))
    .expect("snapshot json")
}

async fn snapshot_finished(env: &TestEnv, name: &str, secs: u64) -> Option<SandboxSnapshot> {
    let api = env.api::<SandboxSnapshot>();
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        let s = api.get_opt(name).await.ok().flatten();
        if matches!(
            s.as_ref()
                .and_then(|s| s.status.as_ref())
                .and_then(|s| s.phase),
            Some(SnapshotPhase::Ready | SnapshotPhase::Failed)
        ) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// A finished snapshot tells the truth: Ready means the object is there and matches the
/// status; Failed means no object. Also: its upload is not left open.
async fn check_snapshot(
    b: &Backend,
    env: &TestEnv,
    s: &SandboxSnapshot,
    user: &str,
    upload: Option<&str>,
    v: &mut Vec<String>,
) -> String {
    let st = s.status.clone().unwrap_or_default();
    // From the scope, not the status: a snapshot that failed early may not have recorded it.
    let keys = b
        .store
        .keys(&env.ns, &scope_key(user), &s.uid().unwrap_or_default());
    let outcome = match st.phase {
        Some(SnapshotPhase::Ready) => {
            match b.store.size(&keys.object).await {
                Ok(Some(_)) => {
                    let (sha, size) = object_digest(&b.store, &keys.object).await;
                    if st.sha256.as_deref() != Some(sha.as_str())
                        || st.size_bytes != Some(size as i64)
                    {
                        v.push(format!(
                            "Ready snapshot {} does not match its object: status {:?}/{:?}, object {sha}/{size}",
                            s.name_any(),
                            st.sha256,
                            st.size_bytes
                        ));
                    }
                    match b.store.get_manifest(&keys.manifest).await {
                        Ok(Some(m)) if m.sha256 == sha => {}
                        other => v.push(format!(
                            "Ready snapshot {} has no matching manifest: {other:?}",
                            s.name_any()
                        )),
                    }
                }
                other => v.push(format!(
                    "Ready snapshot {} has no object: {other:?}",
                    s.name_any()
                )),
            }
            "snapshot Ready"
        }
        _ => {
            if !matches!(b.store.size(&keys.object).await, Ok(None)) {
                v.push(format!("Failed snapshot {} left an object", s.name_any()));
            }
            "snapshot Failed"
        }
    };
    if let Some(id) = upload
        && upload_alive(b, &keys.object, id)
    {
        if upload_forgotten(b, id) {
            // Not the operator's to clean: no S3 call reaches these parts (see
            // upload_forgotten); the operator said so in an UploadAbortRefused Event.
            eprintln!(
                "[chaos] note: s3s-fs stranded parts of upload {id} of {} (the killed \
                 operator's completion was cut short, and s3s-fs had already forgotten the \
                 upload)",
                s.name_any()
            );
        } else {
            v.push(format!("upload {id} of {} left open", s.name_any()));
        }
    }
    outcome.into()
}

/// Deletes the trial's snapshots and sandboxes (the operator runs) and checks that nothing
/// of them is left: pods, the scope's guard Lease, workspace directories.
async fn tidy_and_check(env: &TestEnv, user: &str, uids: &[String], v: &mut Vec<String>) {
    let snaps = env.api::<SandboxSnapshot>();
    let sbxs = env.api::<Sandbox>();
    let pools = env.api::<SandboxPool>();
    let _ = snaps
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    if !until(120, || async {
        snaps
            .list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await
    {
        v.push("snapshots not gone 120 s after delete".into());
    }
    // Pools before sandboxes (as a harness's teardown would): their warm pods go with them.
    let _ = pools
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    if !until(120, || async {
        pools
            .list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await
    {
        v.push("pools not gone 120 s after delete".into());
    }
    let _ = env
        .api::<SandboxTemplate>()
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    let _ = sbxs
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await;
    if !until(180, || async {
        sbxs.list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await
    {
        v.push("sandboxes not gone 180 s after delete".into());
    }
    let pods = env.api::<Pod>();
    if !until(60, || async {
        pods.list(&common::not_the_beacon())
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await
    {
        let left: Vec<String> = pods
            .list(&common::not_the_beacon())
            .await
            .map(|l| l.items.iter().map(|p| p.name_any()).collect())
            .unwrap_or_default();
        v.push(format!("orphaned pods: {left:?}"));
    }
    let leases = env.api::<Lease>();
    let guard = labels::lease_name(&scope_key(user));
    // A guard the killed operator held stays until it expires (seconds); then cleanup goes.
    if !until(60, || async {
        leases.get_opt(&guard).await.is_ok_and(|l| l.is_none())
    })
    .await
    {
        v.push(format!("orphaned guard Lease {guard}"));
    }
    // A deleted sandbox's directory is removed just after the object goes (the sweep; its
    // startup pass when the kill came in between).
    for uid in uids {
        let dir = agentbox_operator::controller::pod::workspace_host_path(NODE_ROOT, &env.ns, uid);
        if !until(60, || async { !std::path::Path::new(&dir).exists() }).await {
            v.push(format!("orphaned workspace directory {dir}"));
        }
    }
    // Any other: a claimed sandbox's (the warm pod's `warm-*`), a pool's.
    let ns_dir = format!("{NODE_ROOT}/{}", env.ns);
    if !until(60, || async { common::workspace_names(&ns_dir).is_empty() }).await {
        v.push(format!(
            "orphaned workspace directories in {ns_dir}: {:?}",
            common::workspace_names(&ns_dir)
        ));
    }
}

/// The fault: after `after`, the operator is SIGKILLed and started again; returns the
/// sandbox's phase at the kill.
async fn fault(env: &mut TestEnv, b: &Backend, after: Duration, name: &str) -> String {
    kill(env, after).await;
    let at_kill = phase_name(env, name).await;
    start(env, b);
    at_kill
}

/// After `after`, SIGKILLs the running operator (the caller starts the next one).
async fn kill(env: &mut TestEnv, after: Duration) {
    tokio::time::sleep(after).await;
    if let Some(op) = env.operators.last_mut() {
        op.kill();
    }
}

/// One trial: the operation, the kill after `kill_ms`, the restart, the checks.
async fn trial(env: &mut TestEnv, b: &Backend, i: usize, t: &mut Trial) {
    let user = format!("u{i}");
    let name = format!("t{i}");
    let v = &mut t.violations;
    let mut uids = Vec::new();
    let kill_after = Duration::from_millis(t.kill_ms);
    let uid_of = |env: &TestEnv, name: String| {
        let api = env.api::<Sandbox>();
        async move {
            api.get_opt(&name)
                .await
                .ok()
                .flatten()
                .and_then(|s| s.uid())
        }
    };
    // Every operation but create and the pool's starts from a Ready sandbox with a marker file.
    let mut marker = String::new();
    if !matches!(t.op, Op::Create | Op::Claim | Op::PoolRefill) {
        match ready_sandbox(env, &name, &user).await {
            Ok(m) => marker = m,
            Err(e) => {
                v.push(e);
                return;
            }
        }
        uids.extend(uid_of(env, name.clone()).await);
    }
    match t.op {
        Op::Create => {
            if let Err(e) = create_sandbox(env, &name, spec(&user)).await {
                v.push(format!("create: {e}"));
                return;
            }
            uids.extend(uid_of(env, name.clone()).await);
            t.at_kill = fault(env, b, kill_after, &name).await;
            t.outcome = if wait_phase(env, &name, SandboxPhase::Ready, 300).await {
                "Ready".into()
            } else {
                v.push(format!("{name} did not become Ready after the restart"));
                "stuck".into()
            };
        }
        Op::Snapshot => {
            // 64 MiB more, so that the upload takes long enough for kills to land in it.
            let pod = pod_of(env, &name).await.unwrap_or_default();
            let (code, _) = sh(env, &pod, "head -c 67108864 /dev/urandom > /workspace/big").await;
            if code != Some(0) {
                v.push("filling the workspace failed".into());
                return;
            }
            let snaps = env.api::<SandboxSnapshot>();
            let snap = format!("s{i}");
            if let Err(e) = snaps
                .create(&PostParams::default(), &snapshot_obj(&snap, &name))
                .await
            {
                v.push(format!("create snapshot: {e}"));
                return;
            }
            tokio::time::sleep(kill_after).await;
            if let Some(op) = env.operators.last_mut() {
                op.kill();
            }
            // The upload the killed operator may have left, as its last status recorded it.
            let st = snaps
                .get_opt(&snap)
                .await
                .ok()
                .flatten()
                .and_then(|s| s.status);
            t.at_kill = st
                .as_ref()
                .and_then(|s| s.phase)
                .map_or("Pending".into(), |p| format!("{p:?}"));
            let upload = st.and_then(|s| s.upload_id);
            start(env, b);
            match snapshot_finished(env, &snap, 600).await {
                Some(s) => {
                    t.outcome = check_snapshot(b, env, &s, &user, upload.as_deref(), v).await;
                }
                None => {
                    v.push(format!("{snap} never finished after the restart"));
                    t.outcome = "stuck".into();
                }
            }
        }
        Op::Restore => {
            let snaps = env.api::<SandboxSnapshot>();
            let snap = format!("s{i}");
            let _ = snaps
                .create(&PostParams::default(), &snapshot_obj(&snap, &name))
                .await;
            match snapshot_finished(env, &snap, 600).await {
                Some(s)
                    if s.status.as_ref().and_then(|s| s.phase) == Some(SnapshotPhase::Ready) => {}
                other => {
                    v.push(format!(
                        "the snapshot to restore did not become Ready: {other:?}"
                    ));
                    return;
                }
            }
            let _ = env
                .api::<Sandbox>()
                .delete(&name, &DeleteParams::default())
                .await;
            if !until(180, || async { phase(env, &name).await.is_none() }).await {
                v.push(format!("{name} not gone before the restore"));
                return;
            }
            let again = format!("r{i}");
            if let Err(e) = create_sandbox(env, &again, spec(&user)).await {
                v.push(format!("create {again}: {e}"));
                return;
            }
            uids.extend(uid_of(env, again.clone()).await);
            t.at_kill = fault(env, b, kill_after, &again).await;
            if !wait_phase(env, &again, SandboxPhase::Ready, 300).await {
                v.push(format!("{again} did not become Ready after the restart"));
                t.outcome = "stuck".into();
            } else {
                let pod = pod_of(env, &again).await.unwrap_or_default();
                let (_, got) = sh(env, &pod, "cat /workspace/marker 2>/dev/null").await;
                if got.trim() == marker {
                    t.outcome = "restored".into();
                } else {
                    // Serving a workspace without the snapshot's files as if restored is the
                    // one outcome that must never happen.
                    v.push(format!(
                        "{again} is Ready without the snapshot's marker (got {got:?})"
                    ));
                    t.outcome = "Ready, not restored".into();
                }
            }
        }
        Op::Suspend => {
            let patch = json!({"spec": {"lifecycle": {"mode": "Suspended"}}});
            if let Err(e) = env
                .api::<Sandbox>()
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                v.push(format!("suspend: {e}"));
                return;
            }
            t.at_kill = fault(env, b, kill_after, &name).await;
            // The phase turns Suspended first; whether the pod was still there at the restart
            // tells more.
            t.at_kill = format!(
                "{}, pod {}",
                t.at_kill,
                if env.sandbox_pods(&name).await.is_empty() {
                    "gone"
                } else {
                    "there"
                }
            );
            let pods_gone = || async { env.sandbox_pods(&name).await.is_empty() };
            if wait_phase(env, &name, SandboxPhase::Suspended, 300).await
                && until(120, pods_gone).await
            {
                t.outcome = "Suspended".into();
            } else {
                v.push(format!(
                    "{name} not Suspended without a pod after the restart"
                ));
                t.outcome = "stuck".into();
            }
        }
        Op::Delete => {
            let _ = env
                .api::<Sandbox>()
                .delete(&name, &DeleteParams::default())
                .await;
            t.at_kill = fault(env, b, kill_after, &name).await;
            if until(180, || async { phase(env, &name).await.is_none() }).await {
                t.outcome = "gone".into();
            } else {
                v.push(format!("{name} not gone after the restart"));
                t.outcome = "stuck".into();
            }
        }
        Op::Claim => uids.extend(claim_trial(env, b, i, kill_after, t).await),
        Op::PoolRefill => refill_trial(env, b, i, kill_after, t).await,
        Op::Stall => stall_trial(env, b, i, kill_after, t).await,
    }
    let v = &mut t.violations;
    tidy_and_check(env, &user, &uids, v).await;
}

/// The claim trial: a templated Sandbox `t{i}` created against a pool of one warm pod, the
/// operator killed mid-claim. It must end Ready on exactly one pod (the warm one, or a cold
/// start) with its own file, the warm pod adopted by no one else, and the pool refilled with
/// another. Returns the sandbox's UID.
async fn claim_trial(
    env: &mut TestEnv,
    b: &Backend,
    i: usize,
    after: Duration,
    t: &mut Trial,
) -> Option<String> {
    let (name, user) = (format!("t{i}"), format!("u{i}"));
    let v = &mut t.violations;
    let (pool, warm) = match warm_pool(env, i, 1).await {
        Ok(w) => w,
        Err(e) => {
            v.push(e);
            return None;
        }
    };
    let warm_name = warm[0].name_any();
    let uid = match create_sandbox(env, &name, templated(&user, &format!("tpl{i}"))).await {
        Ok(s) => s.uid(),
        Err(e) => {
            v.push(format!("create {name}: {e}"));
            return None;
        }
    };
    kill(env, after).await;
    let adopted_at_kill = env
        .api::<Pod>()
        .get_opt(&warm_name)
        .await
        .ok()
        .flatten()
        .is_some_and(|p| p.owner_references().iter().any(|o| o.kind == "Sandbox"));
    t.at_kill = format!(
        "{}, warm pod {}",
        phase_name(env, &name).await,
        if adopted_at_kill { "adopted" } else { "free" }
    );
    start(env, b);
    if !wait_phase(env, &name, SandboxPhase::Ready, 300).await {
        v.push(format!("{name} did not become Ready after the restart"));
        t.outcome = "stuck".into();
        return uid;
    }
    let pod = pod_of(env, &name).await.unwrap_or_default();
    t.outcome = if pod == warm_name { "adopted" } else { "cold" }.into();
    let (_, got) = sh(env, &pod, "cat /workspace/task.md 2>/dev/null").await;
    if got.trim() != format!("task of {user}") {
        v.push(format!("{name} is Ready without its file (got {got:?})"));
    }
    check_adoptions(env, v).await;
    if let Err(had) = wait_warm(env, &pool, 1, &[pod], 180).await {
        v.push(format!(
            "{pool} did not refill to one claimable warm pod after the claim: {had:?}"
        ));
    }
    uid
}

/// The refill trial: a pool of two loses a warm pod and is scaled to three, the operator is
/// killed while it makes them; it must converge to exactly three claimable warm pods.
async fn refill_trial(env: &mut TestEnv, b: &Backend, i: usize, after: Duration, t: &mut Trial) {
    let v = &mut t.violations;
    let (pool, warm) = match warm_pool(env, i, 2).await {
        Ok(w) => w,
        Err(e) => {
            v.push(e);
            return;
        }
    };
    let lost = warm[0].name_any();
    if let Err(e) = env
        .api::<Pod>()
        .delete(&lost, &DeleteParams::default())
        .await
    {
        v.push(format!("delete the warm pod {lost}: {e}"));
        return;
    }
    let patch = json!({"spec": {"replicas": 3}});
    if let Err(e) = env
        .api::<SandboxPool>()
        .patch(&pool, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        v.push(format!("scale {pool}: {e}"));
        return;
    }
    kill(env, after).await;
    let at_kill = warm_pods(env, &pool).await;
    let ready = at_kill
        .iter()
        .filter(|p| agentbox_operator::controller::pool::is_claimable(p))
        .count();
    t.at_kill = format!("{ready} of {} warm claimable", at_kill.len());
    start(env, b);
    match wait_warm(env, &pool, 3, &[lost], 180).await {
        Ok(_) => t.outcome = "3 warm".into(),
        Err(had) => {
            v.push(format!(
                "{pool} did not converge to 3 claimable warm pods: {had:?}"
            ));
            t.outcome = "stuck".into();
        }
    }
    check_adoptions(env, v).await;
}

/// The stalled-stream trial: the sandbox's `tar -c` sends a header and stops, the operator is
/// killed while the snapshot waits on it (or just before, or after its first attempt failed).
/// The snapshot must end Failed with `StreamStalled` (an interrupted attempt is taken again and
/// stalls again: docs/snapshots-and-guards.md), with no object and no upload left open, and
/// the scope's guard must be free.
async fn stall_trial(env: &mut TestEnv, b: &Backend, i: usize, after: Duration, t: &mut Trial) {
    let (name, user) = (format!("t{i}"), format!("u{i}"));
    let v = &mut t.violations;
    let pod = pod_of(env, &name).await.unwrap_or_default();
    if let Err(e) = plant_stalling_tar(env, &pod).await {
        v.push(e);
        return;
    }
    let snaps = env.api::<SandboxSnapshot>();
    let snap = format!("s{i}");
    if let Err(e) = snaps
        .create(&PostParams::default(), &snapshot_obj(&snap, &name))
        .await
    {
        v.push(format!("create snapshot: {e}"));
        return;
    }
    kill(env, after).await;
    let st = snaps
        .get_opt(&snap)
        .await
        .ok()
        .flatten()
        .and_then(|s| s.status);
    t.at_kill = st
        .as_ref()
        .and_then(|s| s.phase)
        .map_or("Pending".into(), |p| format!("{p:?}"));
    let upload = st.and_then(|s| s.upload_id);
    start(env, b);
    let Some(s) = snapshot_finished(env, &snap, 300).await else {
        v.push(format!("{snap} never finished after the restart"));
        t.outcome = "stuck".into();
        return;
    };
    let outcome = check_snapshot(b, env, &s, &user, upload.as_deref(), v).await;
    let reason = committed_reason(&s);
    let st = s.status.clone().unwrap_or_default();
    if st.phase != Some(SnapshotPhase::Failed) || reason != "StreamStalled" {
        v.push(format!(
            "{snap} ended {:?}/{reason}, not Failed/StreamStalled",
            st.phase
        ));
    }
    if st.upload_id.is_some() {
        v.push(format!(
            "{snap} still records the upload {:?}",
            st.upload_id
        ));
    }
    let guard = match guard_free(env, &user).await {
        Some(how) => how,
        None => {
            v.push(format!("{user}'s guard is still kept after {snap} failed"));
            "kept"
        }
    };
    t.outcome = format!("{outcome} {reason}, guard free {guard}");
}

/// "a ×2, b ×1" in order of first appearance.
fn tally<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for i in items {
        match counts.iter_mut().find(|(o, _)| *o == i) {
            Some((_, n)) => *n += 1,
            None => counts.push((i, 1)),
        }
    }
    let parts: Vec<String> = counts.iter().map(|(o, n)| format!("{o} ×{n}")).collect();
    parts.join(", ")
}

fn report(seed: u64, trials: &[Trial], secs: u64) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "| operation | trials | kill after (ms) | phase at the kill | outcome after the restart | invariant violations |\n|---|---|---|---|---|---|"
    );
    for op in OPS {
        let of: Vec<&Trial> = trials.iter().filter(|t| t.op == op).collect();
        if of.is_empty() {
            continue;
        }
        let (lo, hi) = of.iter().fold((u64::MAX, 0), |(lo, hi), t| {
            (lo.min(t.kill_ms), hi.max(t.kill_ms))
        });
        let at_kill = tally(of.iter().map(|t| t.at_kill.as_str()));
        let outcomes = tally(of.iter().map(|t| t.outcome.as_str()));
        let violations: usize = of.iter().map(|t| t.violations.len()).sum();
        let _ = writeln!(
            md,
            "| {} | {} | {lo}–{hi} | {at_kill} | {outcomes} | {violations} |",
            op.label(),
            of.len()
        );
    }
    let total: usize = trials.iter().map(|t| t.violations.len()).sum();
    let _ = writeln!(
        md,
        "| **all** | {} | | | | **{total}** |\n\nSeed {seed} (trial i uses seed {seed}+i), {secs} s.",
        trials.len()
    );
    for t in trials.iter().filter(|t| !t.violations.is_empty()) {
        let _ = writeln!(
            md,
            "\n- trial seed {} ({:?}, kill after {} ms): {}",
            t.seed,
            t.op,
            t.kill_ms,
            t.violations.join("; ")
        );
    }
    md
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn the_operator_killed_at_random_points_loses_nothing() {
    let _serial = SERIAL.read().await;
    let n: usize = std::env::var("CHAOS_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let seed: u64 = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(1)
        });
    eprintln!("[chaos] seed {seed}, {n} trials (replay: CHAOS_SEED={seed} CHAOS_TRIALS={n})");
    let mut env = TestEnv::new("chaos").await;
    let mut b = backend(Kind::S3, &env.ns);
    b.flags
        .push(format!("--stream-stall-seconds={STALL_SECONDS}"));
    start(&mut env, &b);
    let began = Instant::now();
    let mut trials = Vec::new();
    for i in 0..n {
        let trial_seed = seed.wrapping_add(i as u64);
        let mut rng = StdRng::seed_from_u64(trial_seed);
        let op = OPS[(trial_seed % OPS.len() as u64) as usize];
        let mut t = Trial {
            seed: trial_seed,
            // Consecutive seeds cycle through the operations, so each is tried equally often
            // and a trial replays from its own seed alone.
            op,
            kill_ms: rng.random_range(0..=op.max_kill_ms()),
            at_kill: String::new(),
            outcome: String::new(),
            violations: Vec::new(),
        };
        eprintln!(
            "[chaos] trial {i}: seed {trial_seed}, {:?}, SIGKILL after {} ms",
            t.op, t.kill_ms
        );
        trial(&mut env, &b, i, &mut t).await;
        eprintln!(
            "[chaos] trial {i}: {} ({} violations) {}",
            t.outcome,
            t.violations.len(),
            t.violations.join("; ")
        );
        // Keep only the running operator: the killed ones are reaped.
        let live = env.operators.len() - 1;
        env.operators.drain(..live);
        trials.push(t);
    }
    let md = report(seed, &trials, began.elapsed().as_secs());
    eprintln!("{md}");
    if let Ok(path) = std::env::var("CHAOS_REPORT") {
        std::fs::write(&path, &md).expect("write the chaos report");
    }
    let bad: Vec<&Trial> = trials.iter().filter(|t| !t.violations.is_empty()).collect();
    let logs = env.operator_logs();
    env.finish().await;
    assert!(bad.is_empty(), "invariant violations:\n{md}\n{logs}");
}

/// The condition `type_` of a Sandbox, as (status, reason, message).
async fn condition(env: &TestEnv, name: &str, type_: &str) -> Option<(String, String, String)> {
    env.api::<Sandbox>()
        .get_opt(name)
        .await
        .ok()
        .flatten()?
        .status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status, c.reason, c.message))
}

/// The object store unreachable (its server killed) during a snapshot and a restore: the
/// snapshot is never Ready without its object, the restore never serves a workspace without the
/// snapshot's files (the sandbox waits, saying why), and both recover when the store returns.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn the_object_store_unreachable_fails_or_waits_and_recovers() {
    let _serial = SERIAL.read().await;
    let mut s3 = common::store::PrivateS3::start();
    let mut env = TestEnv::new("chaos-st").await;
    let b = s3.backend(&env.ns);
    start(&mut env, &b);
    let marker = ready_sandbox(&env, "a", "store")
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", env.operator_logs()));
    let snaps = env.api::<SandboxSnapshot>();
    snaps
        .create(&PostParams::default(), &snapshot_obj("s1", "a"))
        .await
        .expect("create s1");
    let s1 = snapshot_finished(&env, "s1", 600)
        .await
        .expect("s1 finished");
    assert_eq!(
        s1.status.as_ref().and_then(|s| s.phase),
        Some(SnapshotPhase::Ready),
        "{s1:#?}"
    );

    // A snapshot while the store is down: never Ready.
    s3.stop();
    snaps
        .create(&PostParams::default(), &snapshot_obj("s2", "a"))
        .await
        .expect("create s2");
    // Long enough for the operator to try (and retry) the upload.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let s2 = snaps.get("s2").await.expect("get s2");
    let st2 = s2.status.clone().unwrap_or_default();
    assert_ne!(st2.phase, Some(SnapshotPhase::Ready), "{s2:#?}");
    eprintln!(
        "[chaos] snapshot with the store down: {:?}, {:?}",
        st2.phase,
        st2.conditions
            .iter()
            .map(|c| format!("{} {} {}: {}", c.type_, c.status, c.reason, c.message))
            .collect::<Vec<_>>()
    );
    // It waits, saying why (an outage uses up none of its attempts).
    assert_eq!(st2.phase, Some(SnapshotPhase::Pending), "{s2:#?}");
    let c = st2
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "StoreUnavailable"),
        "{c:?}"
    );
    assert!(c.message.contains("object store"), "{c:?}");

    // A restore while the store is down: the new sandbox of the scope waits, saying why, and
    // is not served without the snapshot's files.
    env.api::<Sandbox>()
        .delete("a", &DeleteParams::default())
        .await
        .expect("delete a");
    assert!(
        until(180, || async { phase(&env, "a").await.is_none() }).await,
        "a not gone\n{}",
        env.operator_logs()
    );
    create_sandbox(&env, "b", spec("store"))
        .await
        .expect("create b");
    let waiting = until(120, || async {
        condition(&env, "b", "WorkspaceReady")
            .await
            .is_some_and(|(status, _, message)| status == "False" && !message.is_empty())
    })
    .await;
    let why = condition(&env, "b", "WorkspaceReady").await;
    assert!(
        waiting,
        "b should wait with WorkspaceReady=False and a reason: {why:?}"
    );
    eprintln!("[chaos] restore with the store down: WorkspaceReady {why:?}");
    assert_ne!(phase(&env, "b").await, Some(SandboxPhase::Ready));

    // The store returns: the restore goes through (from s1, the newest Ready snapshot), and
    // the snapshot taken while it was down is Ready with a matching object, or Failed without.
    s3.resume();
    assert!(
        wait_phase(&env, "b", SandboxPhase::Ready, 300).await,
        "b not Ready after the store returned\n{}",
        env.operator_logs()
    );
    let pod = pod_of(&env, "b").await.expect("b's pod");
    let (_, got) = sh(&env, &pod, "cat /workspace/marker").await;
    assert_eq!(got.trim(), marker, "b restored from s1");
    let s2 = snapshot_finished(&env, "s2", 600).await;
    if let Some(s2) = s2 {
        let mut v = Vec::new();
        let outcome = check_snapshot(&b, &env, &s2, "store", None, &mut v).await;
        eprintln!(
            "[chaos] the snapshot taken while the store was down, after it returned: {outcome}"
        );
        assert!(v.is_empty(), "{v:?}");
    }
    snaps
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("delete snapshots");
    assert!(
        until(120, || async {
            snaps
                .list(&ListParams::default())
                .await
                .is_ok_and(|l| l.items.is_empty())
        })
        .await,
        "snapshots not gone"
    );
    env.finish().await;
    drop(s3);
}

/// The API server SIGKILLed and restarted (`hack/cluster restart-apiserver`) while sandboxes
/// start, two claim a pool's warm pods (and the pool refills), a snapshot runs and a sandbox is
/// deleted: every object converges, no pod is adopted twice, the pool refills, the snapshot
/// tells the truth, and nothing is left once the objects are deleted.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn the_api_server_restarted_mid_operations_loses_nothing() {
    let _serial = SERIAL.write().await;
    let mut env = TestEnv::new("chaos-api").await;
    let b = backend(Kind::S3, &env.ns);
    start(&mut env, &b);
    let mut uids = Vec::new();
    for (name, user) in [("a", "api-a"), ("d", "api-d")] {
        ready_sandbox(&env, name, user)
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", env.operator_logs()));
        let sbx = env.api::<Sandbox>().get(name).await.expect("get");
        uids.extend(sbx.uid());
    }
    // A pool of two warm pods, for the claims below.
    let (pool, _) = warm_pool(&env, 0, 2)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", env.operator_logs()));
    // Under way at once: two sandboxes starting, two claiming the pool's warm pods (and the
    // pool refilling), a snapshot of a, the deletion of d.
    for (name, user) in [("b", "api-b"), ("c", "api-c")] {
        create_sandbox(&env, name, spec(user))
            .await
            .expect("create");
    }
    for (name, user) in [("e", "api-e"), ("f", "api-f")] {
        create_sandbox(&env, name, templated(user, "tpl0"))
            .await
            .expect("create");
    }
    env.api::<SandboxSnapshot>()
        .create(&PostParams::default(), &snapshot_obj("s1", "a"))
        .await
        .expect("create s1");
    env.api::<Sandbox>()
        .delete("d", &DeleteParams::default())
        .await
        .expect("delete d");
    let restart = tokio::task::spawn_blocking(|| {
        std::process::Command::new(common::repo_root().join("hack/cluster"))
            .args(["restart-apiserver", "3"])
            .status()
    });
    let restarted = restart.await.expect("join").expect("run hack/cluster");
    assert!(restarted.success(), "hack/cluster restart-apiserver failed");
    // An operator that cannot renew its leader Lease for its duration stops and exits, for
    // its Deployment to start it again as a follower (a replica that may have lost leadership
    // must not keep writing). Here the test is that Deployment: for a while after the restart,
    // a stopped operator is started again.
    let mut restarts = 0;
    let watch_until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < watch_until {
        if !env.operators.last_mut().is_some_and(|o| o.is_running()) {
            start(&mut env, &b);
            restarts += 1;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("[chaos] operator restarts after the API server restart: {restarts}");

    let mut v = Vec::new();
    for name in ["a", "b", "c", "e", "f"] {
        if !wait_phase(&env, name, SandboxPhase::Ready, 300).await {
            v.push(format!("{name} not Ready after the restart"));
        }
        if let Some(uid) = env
            .api::<Sandbox>()
            .get_opt(name)
            .await
            .ok()
            .flatten()
            .and_then(|s| s.uid())
        {
            uids.push(uid);
        }
    }
    if !until(180, || async { phase(&env, "d").await.is_none() }).await {
        v.push("d not gone after the restart".into());
    }
    // The claims: each on one pod of its own (a warm one or a cold start) with its file, no
    // pod adopted twice, and the pool back to two claimable warm pods.
    let mut claimed = Vec::new();
    for (name, user) in [("e", "api-e"), ("f", "api-f")] {
        let Some(pod) = pod_of(&env, name).await else {
            continue;
        };
        let (_, got) = sh(&env, &pod, "cat /workspace/task.md 2>/dev/null").await;
        if got.trim() != format!("task of {user}") {
            v.push(format!("{name} is Ready without its file (got {got:?})"));
        }
        claimed.push(pod);
    }
    eprintln!("[chaos] the claims across the API server restart: pods {claimed:?}");
    check_adoptions(&env, &mut v).await;
    if let Err(had) = wait_warm(&env, &pool, 2, &claimed, 180).await {
        v.push(format!(
            "{pool} did not refill to two claimable warm pods: {had:?}"
        ));
    }
    match snapshot_finished(&env, "s1", 600).await {
        Some(s) => {
            let outcome = check_snapshot(&b, &env, &s, "api-a", None, &mut v).await;
            eprintln!("[chaos] the snapshot across the API server restart: {outcome}");
        }
        None => v.push("s1 never finished".into()),
    }
    for user in ["api-a", "api-b", "api-c", "api-d", "api-e", "api-f"] {
        tidy_and_check(&env, user, &uids, &mut v).await;
    }
    let logs = env.operator_logs();
    env.finish().await;
    assert!(v.is_empty(), "{v:#?}\n{logs}");
}

/// A harness that dies (SIGKILL) while it holds the scope's guard (`agentbox lock`): its Lease
/// is taken over only once it expired, with a higher fencing token — by the operator's
/// snapshot, which waits for it (GuardBusy) instead of reading a workspace the dead harness
/// may have been writing, and by the next harness.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_harness_dying_with_the_guard_is_fenced_out_once_its_lease_expires() {
    let _serial = SERIAL.read().await;
    let mut env = TestEnv::new("chaos-h").await;
    let b = backend(Kind::S3, &env.ns);
    start(&mut env, &b);
    ready_sandbox(&env, "h", "harness")
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", env.operator_logs()));
    let leases = env.api::<Lease>();
    let guard = labels::lease_name(&scope_key("harness"));

    // The harness: `agentbox lock h -- <a command that records its PID and waits>`.
    let dir =
        std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("harness-{}", env.ns));
    std::fs::create_dir_all(&dir).expect("dir");
    let pidfile = dir.join("cmd.pid");
    let mut harness = std::process::Command::new(common::cli_bin("agentbox"))
        .args(["-n", &env.ns, "lock", "h", "--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 300", pidfile.display()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start agentbox lock");
    let held = || async {
        leases
            .get_opt(&guard)
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .filter(|s| s.holder_identity.is_some())
    };
    assert!(
        until(60, || async { held().await.is_some() && pidfile.exists() }).await,
        "agentbox lock never held the guard"
    );
    let before = held().await.expect("held");
    let old_token = before.lease_transitions.unwrap_or(0);
    // The harness dies; the command it ran is stopped too (by its PID).
    harness.kill().expect("kill the harness");
    let _ = harness.wait();
    if let Ok(pid) = std::fs::read_to_string(&pidfile) {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", pid.trim()])
            .status();
    }
    let _ = std::fs::remove_dir_all(&dir);
    // Its last renewal, and when the Lease expires after it.
    let at_kill = held().await.expect("still held right after the kill");
    let renewed = at_kill.renew_time.expect("renewTime").0;
    let expires = renewed
        + std::time::Duration::from_secs(at_kill.lease_duration_seconds.unwrap_or(15) as u64);

    // The operator's snapshot waits for the expired Lease instead of reading under it.
    env.api::<SandboxSnapshot>()
        .create(&PostParams::default(), &snapshot_obj("hs", "h"))
        .await
        .expect("create hs");
    let s = snapshot_finished(&env, "hs", 300)
        .await
        .unwrap_or_else(|| panic!("hs never finished\n{}", env.operator_logs()));
    let st = s.status.clone().unwrap_or_default();
    assert_eq!(st.phase, Some(SnapshotPhase::Ready), "{s:#?}");
    let started = st.started_at.expect("startedAt").0;
    // startedAt has whole seconds (metav1.Time): compare at that precision.
    let expires = k8s_openapi::jiff::Timestamp::from_second(expires.as_second()).expect("time");
    assert!(
        started >= expires,
        "the snapshot started at {started}, before the dead harness's Lease expired at {expires}"
    );
    let token = st.fencing_token.unwrap_or(0);
    assert!(
        token > i64::from(old_token),
        "token {token} after {old_token}"
    );
    let mut v = Vec::new();
    check_snapshot(&b, &env, &s, "harness", None, &mut v).await;
    assert!(v.is_empty(), "{v:?}");

    // The next harness gets the guard with a higher token still.
    let out = std::process::Command::new(common::cli_bin("agentbox"))
        .args([
            "-n",
            &env.ns,
            "lock",
            "h",
            "--",
            "sh",
            "-c",
            "echo $AGENTBOX_FENCING_TOKEN",
        ])
        .output()
        .expect("run agentbox lock");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let next: i64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a token");
    assert!(next > token, "next harness token {next} after {token}");
    eprintln!(
        "[chaos] harness killed holding token {old_token}; snapshot took over with {token} after the Lease expired; next harness {next}"
    );
    let mut v = Vec::new();
    tidy_and_check(&env, "harness", &[], &mut v).await;
    assert!(v.is_empty(), "{v:?}");
    env.finish().await;
}
