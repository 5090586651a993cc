//! What one reconcile of a live Sandbox reads before it decides anything: its status as it
//! was, the scope's guard Lease, the problems of its spec, its pod, its deny-egress
//! NetworkPolicy, and — when that pod is not serving — the node it is bound to. Reads only
//! (the independent ones side by side: a first start waits for them); the decisions are in
//! [`super::plan`].

use k8s_openapi::api::coordination::v1::Lease;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;

use super::write::Apis;
use crate::controller::context::{Context, Error};
use crate::controller::pod::{self, PodConfig, SPEC_HASH};
use crate::controller::podstate::{self, PodState};
use crate::controller::{placement, runtime, validate};
use agentbox_api::crd::{Sandbox, SandboxStatus, TemplateUse};
use agentbox_api::labels;

/// The world as one reconcile found it.
#[derive(Clone, Debug)]
pub struct World {
    /// The key of the sandbox's scope (`labels::scope_key`), worked out once.
    pub scope_key: String,
    /// Whether [`World::pod`] is the sandbox's own: controlled by it.
    pub pod_ours: bool,
    /// When it looked.
    pub now: Timestamp,
    /// The Sandbox's status as read.
    pub old: SandboxStatus,
    /// The scope's guard Lease.
    pub lease: Option<Lease>,
    /// Why the operator cannot honour the spec (empty: it can).
    pub problems: Vec<String>,
    /// Why the namespace refuses the runtime class the pod would run under
    /// ([`runtime::REQUIRED_RUNTIME_CLASS`]); `None`: it takes it.
    pub runtime_refusal: Option<String>,
    /// How soon a refused sandbox is looked at again (the operator's permanent retry): a
    /// namespace's annotation is not watched.
    pub recheck: Duration,
    /// The sandbox's pod.
    pub pod: Option<Pod>,
    /// Its deny-egress NetworkPolicy, as read (what `act` makes agree with the spec).
    pub policy: Option<NetworkPolicy>,
    /// What that pod is doing ([`PodState::Starting`] without a pod).
    pub pod_state: PodState,
    /// The spec hash the pod would have if built now (when there is a pod).
    pub desired_hash: Option<String>,
    /// The spec hash the pod has.
    pub pod_hash: Option<String>,
    /// The node the pod is bound to, read only when the pod is not Ready, is marked not ready
    /// (the node lifecycle controller sets a lost node's pods' `Ready` condition False and
    /// leaves their container statuses as the kubelet last reported them) or is terminating:
    /// its name and the Node as read (`None`: the object is gone).
    pub node: Option<(String, Option<Node>)>,
    /// The operator's node-loss grace.
    pub node_loss_grace: Duration,
    /// With `spec.templateRef`: the template version the spec was resolved against.
    pub template: Option<TemplateUse>,
}

/// The reads that need only the Sandbox's name, UID, scope and status, none of which its
/// template sets: made beside the template's read.
pub struct Reads {
    scope_key: String,
    lease: Option<Lease>,
    pod: Option<Pod>,
    policy: Option<NetworkPolicy>,
    namespace: Option<Namespace>,
}

/// Reads the scope's guard Lease, the sandbox's pod, its NetworkPolicy and its Namespace (for
/// [`runtime::REQUIRED_RUNTIME_CLASS`]), side by side. The pod is read also for an invalid
/// spec: that step deletes it.
pub async fn read(sbx: &Sandbox, ctx: &Context, apis: &Apis) -> Result<Reads, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &ns);
    let scope_key = labels::scope_key(&sbx.spec.scope);
    let lease_name = labels::lease_name(&scope_key);
    // A templated sandbox's pod is under its template's policy (see `pod::build_template_policy`).
    let policy_name = match sbx.spec.template_ref.as_ref() {
        Some(t) => labels::template_policy_name(&t.name),
        None => labels::network_policy_name(&sbx.name_any()),
    };
    let namespaces: Api<Namespace> = Api::all(ctx.client.clone());
    if let Some(cache) = ctx.cache.as_ref() {
        // From the watch caches: a first start makes no read of these (see `cache`). A Lease
        // or policy written a moment ago by someone else comes with its own watch event,
        // which brings the sandbox back. The Namespace is read (its runtime-class
        // requirement): a Role watching one namespace may only get it, not watch it. It is
        // read from the API server's own watch cache (`resourceVersion=0`), as fresh as the
        // operator's caches are, without the etcd round trip a quorum read takes on the
        // claim's path (0.5 against 1.0 ms p50 on the test cluster, idle).
        let (lease, pod, policy, namespace) = tokio::try_join!(
            crate::controller::cache::get(&cache.leases, "Leases", &ns, &lease_name),
            find_pod(sbx, ctx, &apis.pods),
            crate::controller::cache::get(&cache.policies, "NetworkPolicies", &ns, &policy_name),
            cached_namespace(&namespaces, &ns),
        )?;
        return Ok(Reads {
            scope_key,
            lease,
            pod,
            policy,
            namespace,
        });
    }
    let (lease, pod, policy, namespace) = tokio::try_join!(
        async { Ok::<_, Error>(leases.get_opt(&lease_name).await?) },
        find_pod(sbx, ctx, &apis.pods),
        async { Ok::<_, Error>(apis.policies.get_opt(&policy_name).await?) },
        async { Ok::<_, Error>(namespaces.get_opt(&ns).await?) },
    )?;
    Ok(Reads {
        scope_key,
        lease,
        pod,
        policy,
        namespace,
    })
}

/// The Namespace `ns` as the API server's watch cache has it (`None`: there is none).
async fn cached_namespace(api: &Api<Namespace>, ns: &str) -> Result<Option<Namespace>, Error> {
    match api.get_with(ns, &kube::api::GetParams::any()).await {
        Ok(n) => Ok(Some(n)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The world of `sbx` (its effective spec), from `reads` and, when its pod is not serving,
/// the pod's node.
pub async fn observe(
    sbx: &Sandbox,
    ctx: &Context,
    podcfg: &PodConfig<'_>,
    template: Option<TemplateUse>,
    Reads {
        scope_key,
        lease,
        pod,
        policy,
        namespace,
    }: Reads,
) -> Result<World, Error> {
    let problems = validate::problems(&sbx.spec, &ctx.config.allowed_host_prefixes, podcfg);
    // Judged on the effective spec: a template's runtime class, else the operator's default.
    let runtime_refusal = runtime::refusal(
        runtime::effective(&sbx.spec, podcfg.default_runtime_class),
        runtime::required(namespace.as_ref()).as_deref(),
        &sbx.namespace().unwrap_or_default(),
        "this sandbox",
    );
    let pod_state = pod
        .as_ref()
        .map_or(PodState::Starting, podstate::observe_pod);
    let node = match pod.as_ref() {
        Some(p)
            if pod_state != PodState::Ready
                || !marked_ready(p)
                || p.metadata.deletion_timestamp.is_some() =>
        {
            match p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                Some(name) => {
                    let nodes: Api<Node> = Api::all(ctx.client.clone());
                    let node = nodes.get_opt(&name).await?;
                    Some((name, node))
                }
                None => None,
            }
        }
        _ => None,
    };
    Ok(World {
        scope_key,
        pod_ours: pod
            .as_ref()
            .is_some_and(|p| placement::controlled_by(p, sbx)),
        now: Timestamp::now(),
        old: sbx.status.clone().unwrap_or_default(),
        lease,
        pod_state,
        node,
        node_loss_grace: Duration::from_secs(ctx.config.node_loss_grace_seconds),
        pod_hash: pod
            .as_ref()
            .and_then(|p| p.annotations().get(SPEC_HASH).cloned()),
        // Built only to compare: a pod is made from the spec as the create step reads it,
        // in the directory the sandbox has (or, before its status says so, the pod mounts).
        desired_hash: pod.as_ref().and_then(|p| {
            let dir = placement::host_dir_with(sbx, Some(p), podcfg.node_root);
            pod::build_pod_in(sbx, podcfg, &dir, None)
                .metadata
                .annotations
                .and_then(|a| a.get(SPEC_HASH).cloned())
        }),
        problems,
        runtime_refusal,
        recheck: Duration::from_secs(ctx.config.permanent_retry_seconds),
        pod,
        policy,
        template,
    })
}

/// The sandbox's pod: the one its status names, else the one a cold start names (both read
/// from the API server), else one the operator's pod cache knows as made or adopted for it
/// (labelled for it, the sandbox its controller) whose name the status does not record yet —
/// an operator stopped between adopting a warm pod and writing the status. That one is read
/// again from the API server before anything acts on it, so it is never adopted twice nor
/// left behind.
///
/// With the watch caches ([`crate::controller::cache`]), a sandbox whose status names no pod
/// (a first start: the claim's hot path) is looked up without a read: a pod this process made
/// or adopted for it is read from the API server (the cache may trail its own write), else
/// the complete pod cache says whether any pod has the derived name or is the sandbox's; only
/// one found there is read again from the API server before anything acts on it. A pod with
/// the derived name that is not the operator's (not in the cache of managed pods) is found
/// when a cold start is about to make its pod (`act::create_pod`).
pub async fn find_pod(sbx: &Sandbox, ctx: &Context, pods: &Api<Pod>) -> Result<Option<Pod>, Error> {
    let recorded = placement::recorded_pod_name(sbx);
    let derived = placement::derived_pod_name(sbx);
    if recorded.is_none()
        && let Some(cache) = ctx.cache.as_ref()
    {
        let uid = sbx.uid().unwrap_or_default();
        if let Some(name) = cache.own_pods.of(&uid, std::time::Instant::now())
            && let Some(p) = pods.get_opt(&name).await?
        {
            return Ok(Some(p));
        }
        pods_listed(ctx).await?;
        let cached = ctx.pods.state();
        let ns = sbx.namespace().unwrap_or_default();
        if cached
            .iter()
            .any(|p| p.name_any() == derived && p.namespace().as_deref() == Some(ns.as_str()))
        {
            return Ok(pods.get_opt(&derived).await?);
        }
        let Some(name) = placement::find_owned(cached.iter().map(|p| p.as_ref()), sbx)
            .map(ResourceExt::name_any)
        else {
            return Ok(None);
        };
        return Ok(pods
            .get_opt(&name)
            .await?
            .filter(|p| placement::controlled_by(p, sbx)));
    }
    if let Some(name) = &recorded
        && let Some(p) = pods.get_opt(name).await?
    {
        return Ok(Some(p));
    }
    if recorded.as_ref() != Some(&derived)
        && let Some(p) = pods.get_opt(&derived).await?
    {
        return Ok(Some(p));
    }
    pods_listed(ctx).await?;
    let cached = ctx.pods.state();
    let Some(name) = placement::find_owned(cached.iter().map(|p| p.as_ref()), sbx)
        .map(ResourceExt::name_any)
        .filter(|n| Some(n) != recorded.as_ref() && n != &derived)
    else {
        return Ok(None);
    };
    Ok(pods
        .get_opt(&name)
        .await?
        .filter(|p| placement::controlled_by(p, sbx)))
}

/// How long a reconcile waits for the managed-pod watch's first listing (a process that has
/// just started, or whose watch restarts).
const POD_CACHE_WAIT: Duration = Duration::from_secs(10);

/// Waits until the managed-pod cache holds a complete listing: before it has, a pod adopted
/// for a sandbox by an operator that stopped before writing its status would look absent,
/// and a second pod would be made or adopted. A cache that no watch feeds (its writer gone:
/// the controller stopped) has nothing more to wait for.
async fn pods_listed(ctx: &Context) -> Result<(), Error> {
    if crate::controller::cache::listed(&ctx.pods, POD_CACHE_WAIT).await {
        Ok(())
    } else {
        Err(Error::PodCacheNotSynced(POD_CACHE_WAIT))
    }
}

/// Whether the pod's `Ready` condition is True (or absent: a pod the kubelet has not reported
/// on yet is judged by its container status alone).
fn marked_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_none_or(|c| c.status == "True")
}

/// What `node` looks like now against the operator's node-loss grace (see
/// [`crate::controller::nodeloss::judge`]).
pub(super) async fn node_health(
    ctx: &Context,
    node: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<crate::controller::nodeloss::NodeHealth, Error> {
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(ctx.client.clone());
    let seen = nodes.get_opt(node).await?;
    let grace = Duration::from_secs(ctx.config.node_loss_grace_seconds);
    Ok(crate::controller::nodeloss::judge(
        node,
        seen.as_ref(),
        now,
        grace,
    ))
}

/// The name of the pod `world` found (it may not have the recorded or derived name: see
/// [`find_pod`]), else the name the sandbox's pod is to have.
pub(super) fn pod_name(sbx: &Sandbox, world: &World) -> String {
    world
        .pod
        .as_ref()
        .map_or_else(|| placement::pod_name(sbx), |p| p.name_any())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_marked_not_ready_by_the_node_controller_is_not_ready() {
        let pod = |conditions: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({"status": {"conditions": conditions}}))
                .unwrap()
        };
        assert!(marked_ready(&pod(serde_json::json!([]))));
        assert!(marked_ready(&pod(
            serde_json::json!([{"type": "Ready", "status": "True"}])
        )));
        assert!(!marked_ready(&pod(
            serde_json::json!([{"type": "Ready", "status": "False"}])
        )));
    }
}
