//! The pool controller: keeps a SandboxPool's warm pods.
//!
//! A reconcile observes the pool's template (resolved for a Sandbox without overrides,
//! [`agentbox_api::template::for_pool`], and checked as a sandbox's spec is) and its warm pods, read
//! from the API server (not a cache: a pool must not count pods twice or miss ones it just
//! made) → [`decide`] (pure) → acts: deletes, creates (all at once), prepares the namespace's
//! directory on a node (once per node and namespace: [`noderoot::prepare`]) before it
//! initialises the running pods there → writes the status once, only when it changed, and a
//! Warning Event only when the pool turns to a problem (template missing or refused).
//!
//! A warm pod is the pool's while it carries [`labels::WARM`] and its controller owner is the
//! pool; everything else with the pool's label (a claimed pod, owned by its Sandbox) is never
//! deleted or patched here. Deletes and patches are conditioned on the pod's resourceVersion,
//! so a pod claimed between the listing and the write is left alone (the write fails with a
//! conflict, and the next reconcile sees the claim).

pub mod decide;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::join_all;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::pod::{self, CONTAINER, PodConfig};
use super::podstate::{PodState, observe_pod};
use super::{noderoot, policy, runtime, validate};
use crate::controller::context::{Context, Error};
use crate::controller::helper_pod;
use agentbox_api::crd::{SandboxPool, SandboxTemplate};
use agentbox_api::exec::ExecRequest;
use agentbox_api::exec::session::Session;
use agentbox_api::labels;
use agentbox_api::remote;
use decide::{Plan, Want, WarmPod};

/// How long one write (or the initialising exec) may take before the reconcile gives up on it
/// and retries later.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a pool is looked at without any event: the fallback for a missed one.
const RESYNC: Duration = Duration::from_secs(60);
/// How soon a pool whose warm pods wait for their node's directory to be prepared looks again
/// (the helper pod's end is not one of its events).
const PREPARE_POLL: Duration = Duration::from_secs(1);

/// Whether `pod` is a warm pod ready to be claimed: labelled warm, not being deleted, Running
/// with its sandbox container ready, and initialised by its pool ([`labels::WARM_READY`]: the
/// scope-free part of a start, [`remote::WARM_INIT_SCRIPT`], run by an exec, so the container
/// is known to answer exec). The pod's own Ready condition alone says nothing about exec or
/// the workspace, hence the annotation.
pub fn is_claimable(pod: &Pod) -> bool {
    has_true(pod.metadata.labels.as_ref(), labels::WARM)
        && has_true(pod.metadata.annotations.as_ref(), labels::WARM_READY)
        && pod.metadata.deletion_timestamp.is_none()
        && observe_pod(pod) == PodState::Ready
}

fn has_true(m: Option<&std::collections::BTreeMap<String, String>>, key: &str) -> bool {
    m.and_then(|m| m.get(key)).is_some_and(|v| v == "true")
}

/// Whether `pod` is one of `pool`'s warm pods: labelled warm and controlled by the pool (by
/// UID: a pool deleted and made again under the same name has other pods).
pub fn is_warm_pod_of(pod: &Pod, pool: &SandboxPool) -> bool {
    has_true(pod.metadata.labels.as_ref(), labels::WARM)
        && pod
            .owner_references()
            .iter()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == pool.metadata.uid.as_ref())
}

/// The directory name (`warm-<suffix>`) of a warm pod's workspace, from its annotation.
pub fn warm_dir_of(pod: &Pod) -> Option<String> {
    let dir = pod.annotations().get(labels::WORKSPACE_HOST_DIR)?;
    let name = dir.rsplit('/').next()?;
    labels::is_warm_dir_name(name).then(|| name.to_string())
}

/// Reconciles one SandboxPool.
pub async fn reconcile(pool: Arc<SandboxPool>, ctx: Arc<Context>) -> Result<Action, Error> {
    if pool.metadata.deletion_timestamp.is_some() {
        // Its warm pods go with it (owner references); their directories, after them.
        return Ok(Action::await_change());
    }
    let ns = pool.namespace().ok_or(Error::NotNamespaced)?;
    let name = pool.name_any();
    let key = format!("{ns}/{name}");
    if let Some(left) = ctx.pool_claims.quiet_for(&key, Instant::now()) {
        debug!(pool = %name, "a claim took a warm pod just now: looking again in {left:?}");
        return Ok(Action::requeue(left));
    }
    if let Some(left) = ctx.pool_claims.hold_for(Instant::now()) {
        debug!(pool = %name, "claims in flight: looking again in {left:?}");
        return Ok(Action::requeue(left));
    }
    let podcfg = PodConfig::from_config(&ctx.config);
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);

    let (want, resolved) = observe_template(&ctx, &pool, &ns, &podcfg).await?;
    let pods = observe_pods(&pods_api, &pool).await?;
    ctx.shells
        .retain_pool(&key, &pods.iter().filter_map(|p| p.uid()).collect());
    let node_prepared = |node: &str| {
        podcfg.helper.is_none() || ctx.node_roots.get(node, &ns, Instant::now()).is_some()
    };
    let summaries: Vec<WarmPod> = pods.iter().map(|p| summary(p, &node_prepared)).collect();
    let plan = decide::decide(&pool, &want, &summaries, Timestamp::now());
    debug!(
        pool = %name,
        create = plan.create,
        delete = ?plan.delete,
        initialise = ?plan.initialise,
        reason = plan.reason.0.as_str(),
        "pool plan"
    );

    let prepared_now = act(
        &ctx,
        &pool,
        &pods_api,
        &pods,
        &podcfg,
        resolved.as_ref(),
        &plan,
    )
    .await;

    if pool.status.as_ref() != Some(&plan.status) {
        let problem = plan.reason.0.is_problem()
            && decide::ready_reason(pool.status.as_ref()) != Some(plan.reason.0.as_str());
        if problem {
            crate::controller::context::publish(
                &ctx,
                pool.as_ref(),
                EventType::Warning,
                plan.reason.0.as_str(),
                "KeepWarmPods",
                &plan.reason.1,
            )
            .await;
        }
        let api: Api<SandboxPool> = Api::namespaced(ctx.client.clone(), &ns);
        timed(crate::controller::context::apply_status(
            &api,
            &name,
            &plan.status,
        ))
        .await?;
    }
    Ok(Action::requeue(if prepared_now {
        // Its pods there are initialised now, not a poll later.
        Duration::ZERO
    } else if plan.prepare.is_empty() {
        RESYNC
    } else {
        PREPARE_POLL
    }))
}

/// The spec the pool's pods are made from and what it wants of them.
async fn observe_template(
    ctx: &Context,
    pool: &SandboxPool,
    ns: &str,
    podcfg: &PodConfig<'_>,
) -> Result<(Want, Option<(agentbox_api::crd::SandboxSpec, i64)>), Error> {
    let templates: Api<SandboxTemplate> = Api::namespaced(ctx.client.clone(), ns);
    let tname = &pool.spec.template_ref.name;
    let Some(t) = templates.get_opt(tname).await? else {
        return Ok((Want::Missing(tname.clone()), None));
    };
    let spec = agentbox_api::template::for_pool(tname, &t.spec);
    let problems = validate::problems(&spec, &ctx.config.allowed_host_prefixes, podcfg);
    if !problems.is_empty() {
        return Ok((Want::Invalid(problems), None));
    }
    // No warm pod under a runtime class the namespace refuses: none would ever be claimed,
    // and code must not run there under it.
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    let required = runtime::required(namespaces.get_opt(ns).await?.as_ref());
    if let Some(why) = runtime::refusal(
        runtime::effective(&spec, podcfg.default_runtime_class),
        required.as_deref(),
        ns,
        "the pool's template",
    ) {
        return Ok((Want::Refused(why), None));
    }
    let generation = t.metadata.generation.unwrap_or_default();
    // The template's egress policy before any warm pod: a warm pod is under it from its
    // start, so a claim writes no policy and waits for no rule.
    let used = agentbox_api::crd::TemplateUse {
        name: tname.clone(),
        uid: t.uid().unwrap_or_default(),
        generation,
    };
    let policy_name = labels::template_policy_name(tname);
    let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
    let current = policy::current(ctx, &policies, ns, &policy_name).await?;
    let desired = pod::build_template_policy(
        &used,
        Some(ns.to_string()),
        &spec,
        podcfg.default_egress,
        podcfg.proxy.as_ref(),
    );
    policy::apply(&policies, &policy_name, desired, current.as_ref()).await?;
    let want = Want::Pods {
        shape_hash: pod::shape_hash(&spec, podcfg),
        generation,
    };
    Ok((want, Some((spec, generation))))
}

/// The pool's warm pods that are not being deleted, read from the API server.
async fn observe_pods(pods: &Api<Pod>, pool: &SandboxPool) -> Result<Vec<Pod>, Error> {
    let lp = ListParams::default().labels(&decide::selector(pool));
    Ok(pods
        .list(&lp)
        .await?
        .items
        .into_iter()
        .filter(|p| is_warm_pod_of(p, pool) && p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// What [`decide`] needs of a warm pod, with whether a node's directory is prepared.
fn summary(p: &Pod, node_prepared: &impl Fn(&str) -> bool) -> WarmPod {
    let state = observe_pod(p);
    let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
    WarmPod {
        node_prepared: node.as_deref().is_some_and(node_prepared),
        node,
        name: p.name_any(),
        created: p.metadata.creation_timestamp.as_ref().map(|t| t.0),
        shape_hash: p
            .annotations()
            .get(labels::POD_SHAPE_HASH)
            .cloned()
            .unwrap_or_default(),
        running: state == PodState::Ready,
        initialised: has_true(p.metadata.annotations.as_ref(), labels::WARM_READY),
        ended: matches!(state, PodState::Ended(_)),
        problem: match state {
            PodState::Problem { reason, message } => Some(format!("{reason}: {message}")),
            _ => None,
        },
    }
}

/// Makes the plan's writes. Each failure is logged and left to the next reconcile (a pod
/// claimed meanwhile fails a conditional write, as it should). True when a node's directory
/// was prepared just now (its running pods are to be initialised).
async fn act(
    ctx: &Context,
    pool: &SandboxPool,
    api: &Api<Pod>,
    pods: &[Pod],
    podcfg: &PodConfig<'_>,
    resolved: Option<&(agentbox_api::crd::SandboxSpec, i64)>,
    plan: &Plan,
) -> bool {
    let pool_name = pool.name_any();
    let doomed = pods.iter().filter(|p| plan.delete.contains(&p.name_any()));
    let deleted = join_all(doomed.map(|p| delete_warm(ctx, api, p))).await;
    let n = deleted.iter().filter(|ok| **ok).count();
    if n > 0 {
        ctx.metrics.pool_pods_deleted(n as u64);
        info!(pool = %pool_name, deleted = n, "warm pods deleted");
    }
    let Some((spec, generation)) = resolved else {
        return false;
    };
    let ns = pool.namespace().unwrap_or_default();
    let (ns, pool_name) = (ns.as_str(), pool_name.as_str());
    let prepared = join_all(plan.prepare.iter().map(|node| async move {
        let desired = || helper_pod::build_pool_prepare_pod(pool, spec, podcfg, node);
        match timed(noderoot::prepare(ctx, api, ns, node, desired)).await {
            Ok(found) => found.is_some(),
            Err(e) => {
                warn!(pool = %pool_name, node = %node, "preparing the namespace's directory: {e}; the next reconcile retries");
                false
            }
        }
    }))
    .await;
    let made = join_all((0..plan.create).map(|_| {
        let p = pod::build_warm_pod(pool, spec, podcfg, &labels::warm_suffix(), *generation);
        create_warm(api, p)
    }))
    .await;
    let n = made.iter().filter(|ok| **ok).count();
    if n > 0 {
        ctx.metrics.pool_pods_created(n as u64);
        info!(pool = %pool_name, created = n, "warm pods created");
    }
    let root = spec.workspace.root.trim_end_matches('/').to_string();
    let key = format!("{ns}/{pool_name}");
    let starting = pods
        .iter()
        .filter(|p| plan.initialise.contains(&p.name_any()));
    // Ready ones without a shell (initialised by an earlier leader, or whose shell
    // ended): one is opened for the claim.
    let shell_less = pods
        .iter()
        .filter(|p| is_claimable(p) && !p.uid().is_some_and(|uid| ctx.shells.has(&uid)));
    join_all(
        starting
            .map(|p| initialise(ctx, &key, api, p, &root).boxed())
            .chain(shell_less.map(|p| open_shell(ctx, &key, api, p).boxed())),
    )
    .await;
    prepared.into_iter().any(|p| p)
}

/// Creates one warm pod; false (logged) when it could not be made.
async fn create_warm(api: &Api<Pod>, p: Pod) -> bool {
    let name = p.name_any();
    match timed(async { Ok(api.create(&PostParams::default(), &p).await?) }).await {
        Ok(_) => true,
        Err(e) => {
            warn!(pod = %name, "creating a warm pod: {e}; the next reconcile retries");
            false
        }
    }
}

/// Deletes one warm pod, conditioned on its UID and resourceVersion (a pod claimed since it
/// was listed is not the pool's any more), and leaves its directory to the sweep. False when
/// it was not deleted.
async fn delete_warm(ctx: &Context, api: &Api<Pod>, p: &Pod) -> bool {
    let name = p.name_any();
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: p.metadata.uid.clone(),
            resource_version: p.metadata.resource_version.clone(),
        }),
        ..DeleteParams::background()
    };
    match timed(async { Ok(api.delete(&name, &dp).await?) }).await {
        Ok(_) => {
            hint_removal(ctx, p);
            true
        }
        Err(Error::Kube(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => {
            debug!(pod = %name, "warm pod changed or gone before its deletion: left alone");
            false
        }
        Err(e) => {
            warn!(pod = %name, "deleting a warm pod: {e}; the next reconcile retries");
            false
        }
    }
}

/// UIDs of the warm pods whose directory this process has left to the sweep: a later event of
/// the same pod hints nothing more.
static HINTED: std::sync::LazyLock<std::sync::Mutex<std::collections::HashSet<String>>> =
    std::sync::LazyLock::new(Default::default);

/// What the pool controller does with each pod of a pool its watch sees: a warm pod being
/// deleted (by its pool, by hand, or with its pool) leaves its directory to the sweep, once
/// per pod; then the pools it wakes.
pub fn on_pod<'a>(
    ctx: &Context,
    p: &Pod,
    pools: impl IntoIterator<Item = &'a Arc<SandboxPool>>,
) -> Vec<kube::runtime::reflector::ObjectRef<SandboxPool>> {
    if is_deleting_warm_pod(p) {
        let first = p.uid().is_some_and(|uid| {
            HINTED.lock().is_ok_and(|mut seen| {
                if seen.len() > 10_000 {
                    seen.clear();
                }
                seen.insert(uid)
            })
        });
        if first {
            hint_removal(ctx, p);
        }
    }
    pools_of_pod(p, pools)
}

/// Each pool's replicas and ready replicas, as `agentbox_pool_*` counts them.
pub fn counts<'a>(
    pools: impl IntoIterator<Item = &'a Arc<SandboxPool>>,
) -> Vec<(crate::metrics::PoolLabels, i32, i32)> {
    pools
        .into_iter()
        .map(|p| {
            let st = p.status.clone().unwrap_or_default();
            let l = crate::metrics::PoolLabels {
                namespace: p.namespace().unwrap_or_default(),
                pool: p.name_any(),
            };
            (l, st.replicas, st.ready_replicas)
        })
        .collect()
}

/// Leaves a deleted warm pod's workspace directory to the sweep, which removes it once the
/// pod has stopped mounting it.
fn hint_removal(ctx: &Context, p: &Pod) {
    let (Some(node), Some(dir), Some(ns)) = (
        p.spec.as_ref().and_then(|s| s.node_name.clone()),
        warm_dir_of(p),
        p.namespace(),
    ) else {
        return;
    };
    ctx.sweep.add(super::memos::Hint {
        node,
        namespace: ns,
        dir,
    });
}

/// Runs the scope-free part of a start in a running warm pod, in a persistent shell that stays
/// open for the claim ([`shells`]), and marks the pod ready to claim, the mark conditioned on
/// the pod's resourceVersion (a pod claimed meanwhile keeps its labels as the claim left
/// them).
async fn initialise(ctx: &Context, pool: &str, api: &Api<Pod>, p: &Pod, root: &str) {
    let name = p.name_any();
    let shell = Session::new(api.clone(), &name, CONTAINER);
    let req = ExecRequest::argv(remote::sh(remote::WARM_INIT_SCRIPT, [root]))
        .timeout(WRITE_TIMEOUT)
        .max_output(4096);
    match shell.run(req).await {
        Ok(out) if out.status.success() => {}
        Ok(out) => {
            warn!(pod = %name, "initialising a warm pod failed ({}): {}", out.status, out.stderr_str().trim());
            return;
        }
        Err(e) => {
            debug!(pod = %name, "initialising a warm pod: {e}; the next reconcile retries");
            return;
        }
    }
    // The shell is kept before the mark goes out: a claim may follow the mark at once (no
    // claim takes an unmarked pod, so it is not taken early).
    let uid = p.uid().unwrap_or_default();
    ctx.shells.put(pool, &uid, shell);
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": p.metadata.resource_version,
            "annotations": {labels::WARM_READY: "true", labels::WARM_MARKED: "true"},
        }
    });
    let r = timed(async {
        Ok(api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?)
    })
    .await;
    let Err(e) = r else { return };
    // Not marked: not claimable, so its shell goes.
    drop(ctx.shells.take(&uid));
    match e {
        Error::Kube(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
            debug!(pod = %name, "warm pod changed before it was marked ready: the next reconcile looks again");
        }
        e => warn!(pod = %name, "marking a warm pod ready: {e}"),
    }
}

/// Opens the claim's shell in a warm pod that is ready but has none. Without one, a claim
/// runs its command in a new exec (slower, not wrong).
async fn open_shell(ctx: &Context, pool: &str, api: &Api<Pod>, p: &Pod) {
    let name = p.name_any();
    let shell = Session::new(api.clone(), &name, CONTAINER);
    match tokio::time::timeout(WRITE_TIMEOUT, shell.start()).await {
        Ok(Ok(())) => {
            if let Some(uid) = p.uid() {
                ctx.shells.put(pool, &uid, shell);
            }
        }
        Ok(Err(e)) => debug!(pod = %name, "opening a warm pod's shell: {e}"),
        Err(_) => debug!(pod = %name, "opening a warm pod's shell timed out"),
    }
}

/// `fut` with [`WRITE_TIMEOUT`]; running out is a timeout error of the client's kind.
async fn timed<T>(fut: impl std::future::Future<Output = Result<T, Error>>) -> Result<T, Error> {
    match tokio::time::timeout(WRITE_TIMEOUT, fut).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout(WRITE_TIMEOUT)),
    }
}

/// The pools a pod event concerns: those whose label value the pod carries, in its namespace
/// (a claimed pod keeps the label, so the claim wakes its pool).
pub fn pools_of_pod<'a>(
    pod: &Pod,
    pools: impl IntoIterator<Item = &'a Arc<SandboxPool>>,
) -> Vec<kube::runtime::reflector::ObjectRef<SandboxPool>> {
    let Some(v) = pod.labels().get(labels::POOL) else {
        return Vec::new();
    };
    pools
        .into_iter()
        .filter(|p| {
            p.namespace() == pod.namespace() && &labels::pool_label_value(&p.name_any()) == v
        })
        .map(|p| kube::runtime::reflector::ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// The pools a template event concerns: those naming it.
pub fn pools_of_template<'a>(
    t: &SandboxTemplate,
    pools: impl IntoIterator<Item = &'a Arc<SandboxPool>>,
) -> Vec<kube::runtime::reflector::ObjectRef<SandboxPool>> {
    pools
        .into_iter()
        .filter(|p| p.namespace() == t.namespace() && p.spec.template_ref.name == t.name_any())
        .map(|p| kube::runtime::reflector::ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// Whether a pod event is a warm pod being deleted (by the pool, by hand, or by the garbage
/// collector after its pool): its directory is then left to the sweep.
pub fn is_deleting_warm_pod(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        && has_true(pod.metadata.labels.as_ref(), labels::WARM)
        && pod.meta().owner_references.as_ref().is_some_and(|os| {
            os.iter()
                .any(|o| o.controller == Some(true) && o.kind == "SandboxPool")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(name: &str, uid: &str) -> SandboxPool {
        let mut p = SandboxPool::new(
            name,
            serde_json::from_value(
                serde_json::json!({"templateRef": {"name": "tpl"}, "replicas": 1}),
            )
            .unwrap(),
        );
        p.metadata.namespace = Some("team".into());
        p.metadata.uid = Some(uid.into());
        p
    }

    fn warm(pool: &SandboxPool) -> Pod {
        let spec = agentbox_api::template::for_pool(
            "tpl",
            &serde_json::from_value(serde_json::json!({"image": "busybox"})).unwrap(),
        );
        let cfg = PodConfig {
            node_root: "/w",
            helper: None,
            security: super::super::security::Defaults {
                allowed_capabilities: &[],
                run_as_non_root: false,
                default_run_as_user: 65532,
            },
            default_runtime_class: None,
            processes: crate::controller::pids::ProcessLimits::NONE,
            sizes: crate::controller::sizelimit::SizeLimits::NONE,
            default_egress: agentbox_api::crd::Egress::All,
            network_wait: None,
            proxy: None,
        };
        pod::build_warm_pod(pool, &spec, &cfg, "ab12c", 1)
    }

    fn running(mut p: Pod) -> Pod {
        p.status = serde_json::from_value(serde_json::json!({
            "phase": "Running",
            "containerStatuses": [{"name": "sandbox", "ready": true, "restartCount": 0,
                "image": "busybox", "imageID": "", "state": {"running": {}}}],
        }))
        .unwrap();
        p
    }

    #[test]
    fn only_a_running_initialised_unclaimed_warm_pod_is_claimable() {
        let p = pool("py", "u1");
        let mut pod = running(warm(&p));
        assert!(!is_claimable(&pod), "not initialised yet");
        pod.annotations_mut()
            .insert(labels::WARM_READY.into(), "true".into());
        assert!(is_claimable(&pod));
        let mut claimed = pod.clone();
        claimed.labels_mut().remove(labels::WARM);
        assert!(!is_claimable(&claimed));
        let mut deleting = pod.clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
        );
        assert!(!is_claimable(&deleting));
        let mut starting = pod.clone();
        starting.status = None;
        assert!(!is_claimable(&starting));
    }

    #[test]
    fn a_pool_manages_only_its_own_unclaimed_pods() {
        let p = pool("py", "u1");
        let pod = warm(&p);
        assert!(is_warm_pod_of(&pod, &p));
        assert!(
            !is_warm_pod_of(&pod, &pool("py", "u2")),
            "a pool made again under the same name"
        );
        let mut claimed = pod.clone();
        claimed.labels_mut().remove(labels::WARM);
        assert!(!is_warm_pod_of(&claimed, &p), "claimed: no warm label");
        let mut adopted = pod.clone();
        adopted.metadata.owner_references = Some(vec![
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "agentbox.dev/v1alpha1".into(),
                kind: "Sandbox".into(),
                name: "s".into(),
                uid: "sbx-uid".into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        ]);
        assert!(!is_warm_pod_of(&adopted, &p), "another controller owner");
        assert_eq!(warm_dir_of(&pod).as_deref(), Some("warm-ab12c"));
    }

    #[test]
    fn pod_and_template_events_map_to_their_pools() {
        let a = Arc::new(pool("py", "u1"));
        let b = Arc::new(pool("other", "u2"));
        let pools = [a.clone(), b.clone()];
        let pod = warm(&a);
        let hit = pools_of_pod(&pod, pools.iter());
        assert_eq!(hit.len(), 1);
        assert_eq!(hit[0].name, "py");
        let mut claimed = pod.clone();
        claimed.labels_mut().remove(labels::WARM);
        assert_eq!(
            pools_of_pod(&claimed, pools.iter()).len(),
            1,
            "a claim wakes the pool"
        );
        let t: SandboxTemplate = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxTemplate",
            "metadata": {"name": "tpl", "namespace": "team"},
            "spec": {"image": "busybox"},
        }))
        .unwrap();
        assert_eq!(pools_of_template(&t, pools.iter()).len(), 2);
        let mut deleting = pod;
        assert!(!is_deleting_warm_pod(&deleting));
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
        );
        assert!(is_deleting_warm_pod(&deleting));
    }
}
