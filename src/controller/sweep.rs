//! The orphan sweep: removes workspace directories whose Sandbox is gone, off the delete path.
//!
//! Deleting a Sandbox does not wait for its workspace directory to be removed from its node
//! (a helper pod takes a second or more): the finalizer goes once what must happen before the
//! object disappears is done (the onStop snapshot, the pod asked to go), and the directory is
//! removed here. Two ways in:
//! - a **hint** from the deletion (node, namespace, directory name): removed as soon as no pod mounts it
//!   any more — the usual way, a second or two after the delete;
//! - a **pass** at the leader's start and every `--sweep-interval-seconds`: on each serving
//!   node, a helper pod names the entries of each watched namespace's directory; those that
//!   look like a workspace (`<nodeRoot>/<namespace>/<uid>`, or `warm-<suffix>`) and belong to no Sandbox and no
//!   pod are removed. This is what catches the directory of a sandbox whose operator stopped
//!   between removing the finalizer and removing the directory.
//!
//! A directory is removed only when it is named like a workspace (a UID, or `warm-<suffix>`
//! for a SandboxPool's warm pod), no Sandbox has that UID or records it as its
//! `status.workspace.hostDir` (a Suspended one keeps its directory, also one it adopted from a
//! pool) and no pod in the namespace mounts it (a pod still stopping, a warm pod, a helper). A warm pod's directory is hinted when the pod is seen being deleted (by its pool,
//! by hand, or with its pool), and a pass catches any other. The API is read **after** the listing, so a
//! sandbox created meanwhile is seen; UIDs are never reused, so one judged gone stays gone.
//! Failures are Warning Events on the helper pod; nothing is retried in a tight loop. Hinted
//! directories whose removal failed (the API server restarting, a helper pod that did not
//! finish) or whose pod is still stopping after [`HINT_PATIENCE`] (a kubelet that has not yet
//! heard of the deletion: after an API server restart one here took 90 s) are tried again
//! after 2 s, doubling up to the pass interval, not left to the next pass: that may be ten
//! minutes away, and a deleted tenant's files must not wait that long.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use agentbox_helper::Report;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::context::{LeaseFate, lease_fate};
use super::helper_pod::HELPER_LABEL;
use super::helper_pod::{self, namespace_takes_no_pods};
use super::memos::Hint;
use super::paged;
use super::pod::{self, PodConfig};
use super::{nodeloss, placement};
use crate::controller::context::{Context, Error};
use agentbox_api::crd::{Sandbox, SandboxPool};
use agentbox_api::guard::LeaseView;
use agentbox_api::labels;
use k8s_openapi::api::coordination::v1::Lease;

/// How long one round waits for a hinted directory's stopping pod; one still stopping then is
/// tried again later (see [`hint_retry_delay`]), so other hints do not wait behind it.
const HINT_PATIENCE: Duration = Duration::from_secs(15);
/// How often a hinted directory's pod is looked at while it stops.
const HINT_POLL: Duration = Duration::from_millis(200);
/// How often a running helper pod is looked at.
const HELPER_POLL: Duration = Duration::from_millis(100);
/// How long a helper pod may take (scheduling on its node, the image, the job).
const HELPER_TIMEOUT: Duration = Duration::from_secs(60);
/// The first wait before hinted directories whose removal failed are tried again.
const HINT_RETRY_FIRST: Duration = Duration::from_secs(2);

/// Whether `name` is laid out like a workspace directory: a UID as the API server makes them
/// (8-4-4-4-12 lower-case hex). Anything else in a namespace's directory is not agentbox's to
/// remove.
pub fn is_workspace_name(name: &str) -> bool {
    let groups: Vec<&str> = name.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// Whether `name` is a directory the sweep may remove when nothing uses it: a sandbox's
/// workspace ([`is_workspace_name`]) or a warm pod's ([`agentbox_api::labels::is_warm_dir_name`]).
pub fn is_sweepable(name: &str) -> bool {
    is_workspace_name(name) || agentbox_api::labels::is_warm_dir_name(name)
}

/// What the API says is in use in one namespace: the workspace directories of its Sandboxes
/// and those its pods mount. A warm pod's directory is in use while its pod (warm, or claimed
/// by a Sandbox) mounts it, and while a Sandbox records it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InUse {
    /// Directory names of the namespace's Sandboxes, whatever their phase (a Suspended one
    /// keeps its directory; a Terminating one still has its finalizer to run): each one's
    /// UID, and the directory its status records.
    pub sandboxes: BTreeSet<String>,
    /// Names of workspace directories (`<nodeRoot>/<namespace>/<name>`, or below) that a pod of
    /// the namespace mounts, on any node, whatever its phase.
    pub mounted: BTreeSet<String>,
    /// Those of `mounted` that only pods already being deleted mount: free soon.
    pub stopping: BTreeSet<String>,
}

impl InUse {
    /// From the namespace's Sandbox directory names (see [`sandbox_dirs`]) and pods.
    pub fn of(
        sandboxes: impl IntoIterator<Item = String>,
        pods: &[Pod],
        node_root: &str,
        ns: &str,
    ) -> InUse {
        let parent = format!("{}/", pod::namespace_host_path(node_root, ns));
        let names = |p: &Pod| -> BTreeSet<String> {
            p.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .filter_map(|v| v.host_path.as_ref())
                .filter_map(|h| h.path.strip_prefix(&parent))
                .filter_map(|rest| rest.split('/').next())
                .filter(|name| !name.is_empty())
                .map(str::to_string)
                .collect()
        };
        let (mut mounted, mut held) = (BTreeSet::new(), BTreeSet::new());
        for p in pods {
            let n = names(p);
            if p.metadata.deletion_timestamp.is_none() {
                held.extend(n.iter().cloned());
            }
            mounted.extend(n);
        }
        InUse {
            sandboxes: sandboxes.into_iter().collect(),
            stopping: mounted.difference(&held).cloned().collect(),
            mounted,
        }
    }

    /// Names a listing may leave out: everything known to be in use and not about to be free.
    pub fn skip(&self) -> Vec<String> {
        let held = self.mounted.difference(&self.stopping).cloned();
        let mut v: Vec<String> = self.sandboxes.iter().cloned().chain(held).collect();
        v.sort();
        v.dedup();
        v
    }

    /// The entries of `listed` whose only users are pods being deleted and whose Sandbox is
    /// gone: removable once those pods are (a hint waits for that).
    pub fn soon_orphans(&self, listed: &[String]) -> Vec<String> {
        listed
            .iter()
            .filter(|n| is_sweepable(n))
            .filter(|n| self.stopping.contains(*n) && !self.sandboxes.contains(*n))
            .cloned()
            .collect()
    }
}

/// The entries of `listed` that may be removed: laid out like a workspace, of no Sandbox,
/// mounted by no pod.
pub fn orphans(listed: &[String], in_use: &InUse) -> Vec<String> {
    let mut out: Vec<String> = listed
        .iter()
        .filter(|n| is_sweepable(n))
        .filter(|n| !in_use.sandboxes.contains(*n) && !in_use.mounted.contains(*n))
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

/// The entries of a node root's listing that may be the directories of namespaces not in
/// `known`: named like a namespace (a DNS-1123 label). Whether each is gone is for the API.
pub fn namespace_dirs(listed: &[String], known: &BTreeSet<String>) -> Vec<String> {
    listed
        .iter()
        .filter(|n| n.len() <= 63 && !n.contains('.') && agentbox_api::names::is_object_name(n))
        .filter(|n| !known.contains(*n))
        .cloned()
        .collect()
}

/// Names of a report's comma-separated value `key` (a `list` report's `names`, a `prune`
/// report's `kept`).
fn report_names(report: &Report, key: &str) -> Vec<String> {
    report
        .get(key)
        .unwrap_or_default()
        .split(',')
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect()
}

/// The names a `list` report carries.
pub fn listed_names(report: &Report) -> Vec<String> {
    report_names(report, "names")
}

/// Groups hints by (node, namespace), each group's directories once.
pub fn group(hints: Vec<Hint>) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for h in hints {
        let dirs = out.entry((h.node, h.namespace)).or_default();
        if !dirs.contains(&h.dir) {
            dirs.push(h.dir);
        }
    }
    out
}

/// The directory names a Sandbox keeps in its namespace's directory: its UID (the directory
/// of every pod the operator makes for it) and the directory its status records (another name
/// when it adopted a warm pod).
pub fn sandbox_dirs(sbx: &Sandbox, node_root: &str) -> Vec<String> {
    let ns = sbx.namespace().unwrap_or_default();
    let recorded = placement::recorded_host_dir(sbx);
    let named = recorded
        .as_deref()
        .and_then(|d| placement::dir_name(d, node_root, &ns));
    sbx.uid()
        .into_iter()
        .chain(named.map(str::to_string))
        .collect()
}

/// Runs the sweep until `shutdown` resolves: hints as they come (failed ones again after
/// [`hint_retry_delay`]), a pass at once and then every `--sweep-interval-seconds`.
pub async fn run(ctx: std::sync::Arc<Context>, shutdown: impl std::future::Future<Output = ()>) {
    if ctx.config.helper_image.trim().is_empty() {
        // Nothing can be removed without the helper; deletions keep their finalizer instead.
        return;
    }
    let interval = Duration::from_secs(ctx.config.sweep_interval_seconds.max(1));
    let mut next_pass = Instant::now();
    // Hints whose removal failed, when they are tried again, and how many rounds failed in a row.
    let mut failed: Vec<Hint> = Vec::new();
    let mut retry_at: Option<Instant> = None;
    let mut failures: u32 = 0;
    tokio::pin!(shutdown);
    loop {
        let retry = async {
            match retry_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = &mut shutdown => return,
            _ = ctx.sweep.wake.notified() => {}
            _ = tokio::time::sleep_until(next_pass) => {}
            _ = retry => {}
        }
        let mut hints = ctx.sweep.take();
        if retry_at.is_some_and(|at| Instant::now() >= at) {
            hints.append(&mut failed);
            retry_at = None;
        }
        for ((node, ns), dirs) in group(hints) {
            let again = match sweep_hinted(&ctx, &node, &ns, &dirs).await {
                Ok(stopping) => {
                    if !stopping.is_empty() {
                        debug!(node, namespace = %ns, dirs = ?stopping, "still mounted by pods being deleted: tried again shortly");
                    }
                    stopping
                }
                Err(e) => {
                    warn!(node, namespace = %ns, dirs = ?dirs, "removing the workspaces of deleted sandboxes: {e}; tried again shortly");
                    dirs
                }
            };
            failed.extend(again.into_iter().map(|dir| Hint {
                node: node.clone(),
                namespace: ns.clone(),
                dir,
            }));
        }
        if failed.is_empty() {
            failures = 0;
        } else if retry_at.is_none() {
            failures += 1;
            retry_at = Some(Instant::now() + hint_retry_delay(failures, interval));
        }
        if Instant::now() >= next_pass {
            // A pass may take a while (hundreds of deleted namespaces' directories): a stopping
            // operator does not wait for it. A helper pod it leaves is a leftover the next
            // process deletes.
            tokio::select! {
                _ = &mut shutdown => return,
                done = pass(&ctx) => {
                    if let Err(e) = done {
                        warn!("workspace sweep: {e}; retrying in {}s", interval.as_secs());
                    }
                }
            }
            next_pass = Instant::now() + interval;
        }
    }
}

/// How long hinted directories wait after their `failures`-th failed round in a row: 2 s,
/// doubling, never longer than the pass interval (a pass would look at them then anyway).
pub fn hint_retry_delay(failures: u32, interval: Duration) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    (HINT_RETRY_FIRST * 2u32.pow(doublings)).min(interval)
}

/// Removes the hinted directories of deleted sandboxes on `node` once no pod mounts them (their
/// own pod stops first). Returns those still mounted only by pods being deleted after
/// [`HINT_PATIENCE`], to be tried again; one a Sandbox or a running pod holds is left to the
/// passes (it is not a deleted sandbox's any more).
async fn sweep_hinted(
    ctx: &Context,
    node: &str,
    ns: &str,
    dirs: &[String],
) -> Result<Vec<String>, Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    if !nodes
        .get_opt(node)
        .await?
        .as_ref()
        .is_some_and(nodeloss::is_serving)
    {
        debug!(node, "not serving: its workspaces wait for a pass");
        return Ok(Vec::new());
    }
    let deadline = Instant::now() + HINT_PATIENCE;
    let (doomed, stopping) = loop {
        let in_use = in_use(ctx, ns).await?;
        let free = orphans(dirs, &in_use);
        if free.len() == dirs.len() || Instant::now() >= deadline {
            break (free, in_use.soon_orphans(dirs));
        }
        tokio::time::sleep(HINT_POLL).await;
    };
    remove(ctx, node, ns, doomed).await?;
    Ok(stopping)
}

/// One pass over every serving node and every namespace this operator has workspaces in.
async fn pass(ctx: &Context) -> Result<(), Error> {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let serving: Vec<String> = nodes
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|n| nodeloss::is_serving(n))
        .map(|n| n.name_any())
        .collect();
    let mut namespaces = ctx.sweep.namespaces();
    // Namespaces with a Sandbox or a SandboxPool now.
    let mut live = BTreeSet::new();
    if ctx.config.namespace.is_empty() {
        // Those, and those this process deleted from.
        let all: Api<Sandbox> = Api::all(ctx.client.clone());
        let all = &all;
        paged::fold(
            &ListParams::default(),
            |lp| async move { all.list_metadata(&lp).await },
            |s| live.extend(s.namespace()),
        )
        .await?;
        let pools: Api<SandboxPool> = Api::all(ctx.client.clone());
        for p in pools.list_metadata(&ListParams::default()).await?.items {
            live.extend(p.namespace());
        }
        namespaces.extend(live.iter().cloned());
    } else {
        namespaces = BTreeSet::from([ctx.config.namespace.clone()]);
    }
    for ns in &namespaces {
        if let Err(e) = forget_lapsed_leases(ctx, ns).await {
            warn!(namespace = %ns, "scope Lease sweep: {e}");
        }
        let before = in_use(ctx, ns).await?;
        for node in &serving {
            if let Err(e) = sweep_node(ctx, node, ns, &before).await {
                warn!(node, namespace = %ns, "workspace sweep: {e}");
            }
        }
    }
    if ctx.config.namespace.is_empty() && !ctx.config.helper_namespace.is_empty() {
        for node in &serving {
            if let Err(e) = sweep_deleted_namespaces(ctx, node, &live).await {
                warn!(node, "workspace sweep of deleted namespaces: {e}");
            }
        }
    }
    Ok(())
}

/// Deletes the scope guard Leases of namespace `ns` whose scope has no Sandbox left and that
/// nobody holds (free, or lapsed: [`lease_fate`]). A scope's last Sandbox deletes its Lease
/// itself, but not one a harness held through the deletion and released after it: without
/// this, such Leases would pile up. Each delete is conditioned on the version read, so a
/// guard taken meanwhile stays.
async fn forget_lapsed_leases(ctx: &Context, ns: &str) -> Result<(), Error> {
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), ns);
    let mut scopes: BTreeSet<String> = BTreeSet::new();
    let lp = ListParams::default().labels(labels::SCOPE_KEY);
    paged::fold(
        &lp,
        |lp| {
            let sandboxes = &sandboxes;
            async move { sandboxes.list_metadata(&lp).await }
        },
        |s| scopes.extend(s.labels().get(labels::SCOPE_KEY).cloned()),
    )
    .await?;
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), ns);
    let selector = format!(
        "{},{}={}",
        labels::SCOPE_KEY,
        labels::MANAGED_BY,
        labels::MANAGER
    );
    let now = k8s_openapi::jiff::Timestamp::now();
    for lease in leases
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
    {
        let orphan = lease
            .labels()
            .get(labels::SCOPE_KEY)
            .is_some_and(|k| !scopes.contains(k));
        if !orphan || lease_fate(&LeaseView::of(Some(&lease), now)) != LeaseFate::Delete {
            continue;
        }
        let dp = DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                resource_version: lease.metadata.resource_version.clone(),
                uid: lease.metadata.uid.clone(),
            }),
            ..DeleteParams::default()
        };
        match leases.delete(&lease.name_any(), &dp).await {
            Ok(_) => {
                info!(namespace = %ns, lease = %lease.name_any(), "scope Lease of no Sandbox deleted")
            }
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// How many namespace names one prune pod is given: its report names those it kept, and a
/// termination message holds 4 KiB (63-byte names and commas).
const PRUNE_BATCH: usize = 50;

/// Removes what deleted namespaces left on `node`: the node root's entries named like a
/// namespace that is not in `known` (those with a Sandbox or a SandboxPool) and not in the API. Those are the namespaces whose
/// directories no pass visits otherwise: deleted while no operator ran, or after a restart
/// lost the deletion's hints. Each is pruned if empty (`rmdir`: nothing in use can go); one that
/// is not is swept like any namespace (listed, the API read again, workspace-named orphans
/// removed, from `--helper-namespace`) and pruned again. Something else left in it (not named
/// like a workspace) keeps it, as in any namespace. Runs in `--helper-namespace` only: the
/// node root holds every tenant's directory.
async fn sweep_deleted_namespaces(
    ctx: &Context,
    node: &str,
    known: &BTreeSet<String>,
) -> Result<(), Error> {
    let helper_ns = ctx.config.helper_namespace.as_str();
    let podcfg = PodConfig::from_config(&ctx.config);
    let mut skip: Vec<String> = known
        .iter()
        .cloned()
        .chain([helper_ns.to_string()])
        .collect();
    // A listing holds as many names as fit in a termination message: list again, leaving out
    // the names seen, until none is left out.
    loop {
        let Some(list) = helper_pod::build_root_list_pod(helper_ns, &podcfg, node, skip.clone())
        else {
            return Ok(());
        };
        let report = run_helper(ctx, helper_ns, list).await?;
        let listed = listed_names(&report);
        let gone = gone_namespaces(ctx, namespace_dirs(&listed, known)).await?;
        let kept = prune(ctx, node, gone).await?;
        for ns in &kept {
            if let Err(e) = sweep_node(ctx, node, ns, &in_use(ctx, ns).await?).await {
                warn!(node, namespace = %ns, "workspace sweep of a deleted namespace: {e}");
            }
        }
        let left = prune(ctx, node, gone_namespaces(ctx, kept).await?).await?;
        if !left.is_empty() {
            debug!(node, namespaces = ?left, "directories of deleted namespaces keep entries not named like workspaces");
        }
        let more = report.get("more").and_then(|m| m.parse::<usize>().ok());
        if listed.is_empty() || more.unwrap_or(0) == 0 {
            return Ok(());
        }
        skip.extend(listed);
    }
}

/// Those of `names` that are not namespaces in the API (read now, not from a cache).
async fn gone_namespaces(ctx: &Context, names: Vec<String>) -> Result<Vec<String>, Error> {
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let mut gone = Vec::new();
    for ns in names {
        if api.get_opt(&ns).await?.is_none() {
            gone.push(ns);
        }
    }
    Ok(gone)
}

/// Removes the empty directories of the deleted namespaces `names` from the node root on
/// `node`; returns those that hold something.
async fn prune(ctx: &Context, node: &str, names: Vec<String>) -> Result<Vec<String>, Error> {
    let helper_ns = ctx.config.helper_namespace.as_str();
    let podcfg = PodConfig::from_config(&ctx.config);
    let mut kept = Vec::new();
    for batch in names.chunks(PRUNE_BATCH) {
        let Some(p) = helper_pod::build_prune_pod(helper_ns, &podcfg, node, batch.to_vec()) else {
            return Ok(Vec::new());
        };
        let report = run_helper(ctx, helper_ns, p).await?;
        let held = report_names(&report, "kept");
        for ns in batch.iter().filter(|n| !held.contains(*n)) {
            // A namespace of that name made again gets its directory prepared again.
            ctx.node_roots.forget(node, ns);
            ctx.sweep.forget_namespace(ns);
        }
        let pruned = report.get("pruned").unwrap_or("0");
        if pruned != "0" {
            info!(node, pruned, "directories of deleted namespaces removed");
        }
        kept.extend(held);
    }
    Ok(kept)
}

/// Lists namespace `ns`'s directory on `node` and removes the orphans in it. `before` is what
/// was in use before the listing (left out of it); the API is read again after it.
async fn sweep_node(ctx: &Context, node: &str, ns: &str, before: &InUse) -> Result<(), Error> {
    let podcfg = PodConfig::from_config(&ctx.config);
    let Some(list) = helper_pod::build_list_pod(ns, &podcfg, node, before.skip()) else {
        return Ok(());
    };
    let report = run_helper(ctx, ns, list).await?;
    let listed = listed_names(&report);
    // A deleted sandbox's pod still stopping (its hint lost with an earlier process): the
    // hint path waits for the pod.
    for dir in before.soon_orphans(&listed) {
        ctx.sweep.add(Hint {
            node: node.to_string(),
            namespace: ns.to_string(),
            dir,
        });
    }
    let candidates = orphans(&listed, before);
    if candidates.is_empty() {
        return Ok(());
    }
    // Read after the listing: a sandbox or pod made since is seen here.
    let doomed = orphans(&candidates, &in_use(ctx, ns).await?);
    remove(ctx, node, ns, doomed).await
}

/// Removes the directories `names` of namespace `ns` from `node` with a helper pod.
async fn remove(ctx: &Context, node: &str, ns: &str, names: Vec<String>) -> Result<(), Error> {
    if names.is_empty() {
        return Ok(());
    }
    let podcfg = PodConfig::from_config(&ctx.config);
    let Some(p) = helper_pod::build_sweep_pod(ns, &podcfg, node, names.clone()) else {
        return Ok(());
    };
    let report = run_helper(ctx, ns, p).await?;
    let removed: u64 = report
        .get("removed")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    ctx.metrics.workspaces_swept(removed);
    info!(node, namespace = %ns, removed, names = ?names, "workspace directories of deleted sandboxes removed");
    Ok(())
}

/// The directories of namespace `ns`'s Sandboxes and those its pods mount, read from the API
/// server (not a cache: the decision must not trail a create).
async fn in_use(ctx: &Context, ns: &str) -> Result<InUse, Error> {
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), ns);
    // Whole objects, not metadata: the recorded directory is in the status. A page at a time,
    // each reduced to its directories (paged: a single LIST of 10,000 was a restart's peak).
    let mut dirs: Vec<String> = Vec::new();
    paged::each(&sandboxes, &ListParams::default(), |s| {
        dirs.extend(sandbox_dirs(&s, &ctx.config.node_root))
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let mut kept = Vec::new();
    paged::each(&pods, &ListParams::default(), |p| kept.push(mounts_only(p))).await?;
    Ok(InUse::of(dirs, &kept, &ctx.config.node_root, ns))
}

/// Of a pod, what [`InUse::of`] reads: whether it is being deleted and its hostPath volumes.
fn mounts_only(p: Pod) -> Pod {
    let volumes = p.spec.and_then(|s| s.volumes).map(|vs| {
        vs.into_iter()
            .filter(|v| v.host_path.is_some())
            .collect::<Vec<_>>()
    });
    Pod {
        metadata: kube::api::ObjectMeta {
            deletion_timestamp: p.metadata.deletion_timestamp,
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PodSpec {
            volumes,
            ..Default::default()
        }),
        status: None,
    }
}

/// Selects the sweep's helper pods (both jobs, [`helper_pod::build_list_pod`] and
/// [`helper_pod::build_sweep_pod`]). The sweep runs one helper pod at a time, so any there when it
/// makes one is not this process's.
fn sweep_jobs() -> String {
    format!("{HELPER_LABEL} in (list,sweep)")
}

/// Creates the helper pod `desired` (in namespace `ns`, the workspace's), or, when `ns` takes
/// no new pods, the same pod in `--helper-namespace`: a deleted namespace's directories are
/// removed from there. Returns the pods API it was created in, and the pod.
async fn create_helper(ctx: &Context, ns: &str, desired: &Pod) -> Result<(Api<Pod>, Pod), Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    // Any sweep pod there now is a leftover, whatever its job: one that removed its directories
    // just before an earlier operator was killed would otherwise wait for the next removal.
    delete_leftovers(&pods, &sweep_jobs()).await;
    let err = match pods.create(&PostParams::default(), desired).await {
        Ok(p) => return Ok((pods, p)),
        Err(e) if namespace_takes_no_pods(&e) => e,
        Err(e) => return Err(e.into()),
    };
    let fallback = ctx.config.helper_namespace.as_str();
    if fallback.is_empty() || fallback == ns {
        let msg = format!(
            "namespace {ns} takes no new pods ({err}) and no --helper-namespace is set: its \
             workspace directories stay on the nodes until removed by hand"
        );
        warn!("{msg}");
        return Err(Error::Cleanup(msg));
    }
    debug!(namespace = %ns, helper_namespace = %fallback, "running the sweep's helper pod in the helper namespace");
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), fallback);
    // The helper namespace serves every namespace: only this one's leftovers.
    delete_leftovers(
        &pods,
        &format!("{},{}={ns}", sweep_jobs(), helper_pod::FOR_NAMESPACE_LABEL),
    )
    .await;
    let mut moved = desired.clone();
    moved.metadata.namespace = Some(fallback.to_string());
    let created = pods.create(&PostParams::default(), &moved).await?;
    Ok((pods, created))
}

/// Creates a helper pod, waits for its report and deletes it. A failure is a Warning Event on
/// the pod (and the error); the pod is deleted either way.
async fn run_helper(ctx: &Context, ns: &str, mut desired: Pod) -> Result<Report, Error> {
    let job = desired
        .labels()
        .get(HELPER_LABEL)
        .cloned()
        .unwrap_or_default();
    // A fresh name each time: a pod an earlier operator left behind is never taken for this
    // one's (leftovers are deleted below, by label, before the first pass of a process ends).
    let prefix = desired.name_any();
    desired.metadata.name = None;
    desired.metadata.generate_name = Some(format!("{prefix}-"));
    let (pods, created) = create_helper(ctx, ns, &desired).await?;
    let name = created.name_any();
    let outcome = tokio::time::timeout(HELPER_TIMEOUT, async {
        loop {
            let Some(p) = pods.get_opt(&name).await? else {
                return Ok(Err("it was deleted before it finished".to_string()));
            };
            if let Some(outcome) = helper_pod::helper_outcome(&p) {
                return Ok::<_, Error>(outcome);
            }
            tokio::time::sleep(HELPER_POLL).await;
        }
    })
    .await;
    let _ = pods.delete(&name, &DeleteParams::background()).await;
    let failed = match outcome {
        Ok(Ok(Ok(report))) => return Ok(report),
        Ok(Ok(Err(m))) => m,
        Ok(Err(e)) => return Err(e),
        Err(_) => format!("it did not finish within {}s", HELPER_TIMEOUT.as_secs()),
    };
    let msg = format!("workspace sweep: the helper pod {name} ({job}) failed: {failed}");
    crate::controller::context::publish(
        ctx,
        &created,
        EventType::Warning,
        "WorkspaceSweepFailed",
        "SweepWorkspaces",
        &msg,
    )
    .await;
    ctx.metrics.sweep_failed();
    Err(Error::Cleanup(msg))
}

/// Deletes the helper pods `selector` selects that an earlier operator left (the sweep runs
/// one at a time, so any there now is not this process's).
async fn delete_leftovers(pods: &Api<Pod>, selector: &str) {
    let lp = ListParams::default().labels(selector);
    let Ok(list) = pods.list_metadata(&lp).await else {
        return;
    };
    for p in list.items {
        if p.meta().deletion_timestamp.is_none() {
            let _ = pods
                .delete(&p.name_any(), &DeleteParams::background())
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::memos::Hints;

    const UID_A: &str = "0b6c1f4e-8f3a-4c2d-9e1f-123456789abc";
    const UID_B: &str = "1b6c1f4e-8f3a-4c2d-9e1f-123456789abc";
    const UID_C: &str = "2b6c1f4e-8f3a-4c2d-9e1f-123456789abc";

    fn pod_mounting(path: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {"containers": [], "volumes": [
                {"name": "w", "hostPath": {"path": path}},
                {"name": "e", "emptyDir": {}},
            ]},
        }))
        .unwrap()
    }

    fn api_error(body: serde_json::Value) -> kube::Error {
        kube::Error::Api(Box::new(serde_json::from_value(body).unwrap()))
    }

    #[test]
    fn a_namespace_being_deleted_or_gone_takes_no_pods_and_nothing_else_says_so() {
        // As the API server answers (NamespaceLifecycle admission; a missing namespace).
        let terminating = api_error(serde_json::json!({
            "status": "Failure", "code": 403, "reason": "Forbidden",
            "message": "pods \"agentbox-sweep-1-\" is forbidden: unable to create new content \
                        in namespace team because it is being terminated",
            "details": {"name": "agentbox-sweep-1-", "kind": "pods"},
        }));
        let gone = api_error(serde_json::json!({
            "status": "Failure", "code": 404, "reason": "NotFound",
            "message": "namespaces \"team\" not found",
            "details": {"name": "team", "kind": "namespaces"},
        }));
        assert!(namespace_takes_no_pods(&terminating));
        assert!(namespace_takes_no_pods(&gone));
        let rbac = api_error(serde_json::json!({
            "status": "Failure", "code": 403, "reason": "Forbidden",
            "message": "pods is forbidden: User \"x\" cannot create resource \"pods\"",
            "details": {"kind": "pods"},
        }));
        let quota = api_error(serde_json::json!({
            "status": "Failure", "code": 403, "reason": "Forbidden",
            "message": "pods \"p\" is forbidden: exceeded quota: q",
        }));
        let other_404 = api_error(serde_json::json!({
            "status": "Failure", "code": 404, "reason": "NotFound",
            "message": "pods \"p\" not found", "details": {"name": "p", "kind": "pods"},
        }));
        for e in [rbac, quota, other_404] {
            assert!(!namespace_takes_no_pods(&e), "{e}");
        }
    }

    #[test]
    fn only_names_laid_out_like_a_uid_count_as_workspaces() {
        assert!(is_workspace_name(UID_A));
        for not in [
            "",
            "lost+found",
            ".agentbox-staging",
            "0B6C1F4E-8F3A-4C2D-9E1F-123456789ABC",
            "0b6c1f4e-8f3a-4c2d-9e1f-123456789abc-x",
            "0b6c1f4e8f3a4c2d9e1f123456789abc",
            "0b6c1f4e-8f3a-4c2d-9e1f-123456789abg",
        ] {
            assert!(!is_workspace_name(not), "{not}");
        }
    }

    #[test]
    fn a_directory_of_a_live_or_suspended_sandbox_or_a_mounted_one_is_kept() {
        let pods = [
            pod_mounting(&format!("/w/ns/{UID_B}")),
            // Another namespace's directory of the same name does not count here.
            pod_mounting(&format!("/w/other/{UID_C}")),
        ];
        let in_use = InUse::of([UID_A.to_string()], &pods, "/w", "ns");
        assert_eq!(in_use.mounted, BTreeSet::from([UID_B.to_string()]));
        let listed = [UID_A, UID_B, UID_C, "notes"].map(String::from);
        assert_eq!(
            orphans(&listed, &in_use),
            vec![UID_C.to_string()],
            "the sandbox's (A), the mounted (B) and the unknown name are kept"
        );
        assert_eq!(
            in_use.skip(),
            vec![UID_A.to_string(), UID_B.to_string()],
            "a listing leaves out what is known to be in use"
        );
    }

    #[test]
    fn a_warm_pods_directory_is_kept_while_a_pod_mounts_it_and_removed_after() {
        let warm = "warm-ab12c";
        assert!(is_sweepable(warm) && !is_workspace_name(warm));
        assert!(!is_sweepable("warm-notes.txt") && !is_sweepable("lost+found"));
        let mounted = InUse::of([], &[pod_mounting(&format!("/w/ns/{warm}"))], "/w", "ns");
        let listed = [warm.to_string(), "warm-zz99z".to_string()];
        assert_eq!(
            orphans(&listed, &mounted),
            vec!["warm-zz99z".to_string()],
            "the mounted one (a warm or claimed pod's) stays; the other goes"
        );
        let mut stopping = pod_mounting(&format!("/w/ns/{warm}"));
        stopping.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().unwrap(),
            ));
        let in_use = InUse::of([], &[stopping], "/w", "ns");
        assert_eq!(in_use.soon_orphans(&listed[..1]), vec![warm.to_string()]);
    }

    #[test]
    fn a_warm_pods_directory_adopted_by_a_sandbox_is_kept_while_the_sandbox_records_it() {
        let claimed: Sandbox = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s", "namespace": "ns", "uid": UID_A},
            "spec": {"image": "busybox", "scope": {"kind": "Global"}},
            "status": {"workspace": {"hostDir": "/w/ns/warm-x7k2p"}},
        }))
        .unwrap();
        let dirs = sandbox_dirs(&claimed, "/w");
        assert_eq!(dirs, vec![UID_A.to_string(), "warm-x7k2p".to_string()]);
        let listed = ["warm-x7k2p", "warm-abcde", UID_A].map(String::from);
        assert_eq!(
            orphans(&listed, &InUse::of(dirs, &[], "/w", "ns")),
            vec!["warm-abcde".to_string()],
            "the recorded one is kept (a suspended claimed sandbox), an unrecorded one goes"
        );
        // A recorded directory outside the namespace's is nobody's name here.
        let mut elsewhere = claimed.clone();
        elsewhere
            .status
            .as_mut()
            .unwrap()
            .workspace
            .as_mut()
            .unwrap()
            .host_dir = Some("/w/other/warm-x7k2p".into());
        assert_eq!(sandbox_dirs(&elsewhere, "/w"), vec![UID_A.to_string()]);
    }

    #[test]
    fn a_mount_below_a_workspace_keeps_it_too() {
        let pods = [pod_mounting(&format!("/w/ns/{UID_A}/sub/dir"))];
        let in_use = InUse::of([], &pods, "/w", "ns");
        assert!(orphans(&[UID_A.to_string()], &in_use).is_empty());
        // The namespace's directory itself (a helper's mount) keeps nothing.
        let helper = [pod_mounting("/w/ns")];
        assert_eq!(
            orphans(&[UID_A.to_string()], &InUse::of([], &helper, "/w", "ns")),
            vec![UID_A.to_string()]
        );
    }

    #[test]
    fn a_directory_only_a_stopping_pod_mounts_is_listed_and_left_to_a_hint() {
        let mut stopping = pod_mounting(&format!("/w/ns/{UID_A}"));
        stopping.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().unwrap(),
            ));
        let in_use = InUse::of([], &[stopping.clone()], "/w", "ns");
        assert!(in_use.skip().is_empty(), "listed, so the pass sees it");
        let listed = [UID_A.to_string()];
        assert!(
            orphans(&listed, &in_use).is_empty(),
            "not removed under its pod"
        );
        assert_eq!(in_use.soon_orphans(&listed), listed.to_vec());
        // Also mounted by a pod that is not stopping, or its sandbox exists: not soon free.
        let held = InUse::of(
            [],
            &[stopping.clone(), pod_mounting(&format!("/w/ns/{UID_A}"))],
            "/w",
            "ns",
        );
        assert!(held.soon_orphans(&listed).is_empty());
        assert_eq!(held.skip(), listed.to_vec());
        let live = InUse::of([UID_A.to_string()], &[stopping], "/w", "ns");
        assert!(live.soon_orphans(&listed).is_empty());
    }

    #[test]
    fn failed_hints_wait_two_seconds_doubling_up_to_the_pass_interval() {
        let ten_minutes = Duration::from_secs(600);
        let waits: Vec<u64> = (1..=10)
            .map(|n| hint_retry_delay(n, ten_minutes).as_secs())
            .collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 64, 128, 256, 512, 600]);
        assert_eq!(hint_retry_delay(u32::MAX, ten_minutes), ten_minutes);
        // A short pass interval caps it from the start.
        assert_eq!(
            hint_retry_delay(1, Duration::from_secs(1)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn hints_are_grouped_by_node_and_namespace_once_each() {
        let h = |node: &str, dir: &str| Hint {
            node: node.into(),
            namespace: "ns".into(),
            dir: dir.into(),
        };
        let g = group(vec![
            h("n1", UID_A),
            h("n2", UID_B),
            h("n1", UID_A),
            h("n1", UID_C),
        ]);
        assert_eq!(
            g[&("n1".to_string(), "ns".to_string())],
            vec![UID_A.to_string(), UID_C.to_string()]
        );
        assert_eq!(g.len(), 2);
        let hints = Hints::default();
        hints.add(h("n1", UID_A));
        assert_eq!(hints.take().len(), 1);
        assert!(hints.take().is_empty(), "taken once");
        assert_eq!(hints.namespaces(), BTreeSet::from(["ns".to_string()]));
    }

    #[test]
    fn a_list_report_gives_its_names() {
        let r = Report::default()
            .with("job", "list")
            .with("names", format!("{UID_A},{UID_B}"))
            .with("more", 0);
        assert_eq!(
            listed_names(&Report::parse(&r.line()).unwrap()),
            vec![UID_A.to_string(), UID_B.to_string()]
        );
        let empty = Report::default().with("job", "list").with("names", "");
        assert!(listed_names(&Report::parse(&empty.line()).unwrap()).is_empty());
    }

    #[test]
    fn a_node_roots_entries_are_namespace_candidates_only_when_named_like_one_and_not_live() {
        let listed: Vec<String> = [
            "team-a",
            "live",
            "Upper",
            "has.dot",
            "-lead",
            "x".repeat(64).as_str(),
            "y".repeat(63).as_str(),
            "lost+found",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let live = BTreeSet::from(["live".to_string()]);
        assert_eq!(
            namespace_dirs(&listed, &live),
            vec!["team-a".to_string(), "y".repeat(63)]
        );
    }
}
