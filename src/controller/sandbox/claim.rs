//! Claiming a warm pod: a Sandbox made from a template adopts one of a SandboxPool's warm pods
//! instead of making a pod, on its first start (see [`super::plan::may_claim`]).
//!
//! Candidates come from the operator's watch cache of managed pods ([`Context::pods`]): no
//! LIST on the hot path. A candidate is a warm pod of the namespace that is ready to be
//! claimed (labelled warm, initialised by its pool, running, not being deleted), controlled by
//! a SandboxPool, mounting its own `warm-*` directory, whose pod shape hash equals the
//! Sandbox's resolved spec's (its pod would be the one a cold start makes, but for the
//! directory). The adoption is ONE merge patch on the pod conditioned on the resourceVersion
//! the cache holds: the warm label and the pool's readiness mark go, the sandbox's labels,
//! scope annotations and spec hash come, and the Sandbox becomes the pod's sole controller
//! owner. A 409 means someone else (another sandbox, another operator during a leader change,
//! the pool) changed the pod first: the next candidate is tried, and after [`MAX_TRIES`] the
//! start is cold at once — it never waits for a refill.
//!
//! No warm pod holds a scope's data before it is claimed: a warm pod has nothing but what its
//! pool's scope-free initialisation made, and the claiming start writes the scope's files (and
//! restores its snapshot) only after the adopting patch succeeded.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use tracing::debug;

use super::init;
use crate::controller::context::{Context, Error, FIELD_MANAGER};
use crate::controller::pod::{self, PodConfig, SPEC_HASH};
use crate::controller::{placement, pool};
use crate::metrics::ClaimResult;
use agentbox_api::crd::{Sandbox, SandboxPool, SandboxStatus};
use agentbox_api::exec::session::Session;
use agentbox_api::labels;

/// How many warm pods one start tries to adopt before it starts cold. Each miss is a pod
/// someone else took a moment ago; trying on would race the same crowd.
pub const MAX_TRIES: usize = 2;

/// The pod shape hash of a resolved spec ([`pod::shape_hash`]): its pod's spec hash with the
/// workspace directory (and the node pin) left out.
pub fn shape_hash(sbx: &Sandbox, cfg: &PodConfig<'_>) -> String {
    pod::shape_hash(&sbx.spec, cfg)
}

/// The spec hash ([`SPEC_HASH`]) of the sandbox's pod with its workspace in `dir`: what the
/// sandbox controller compares a pod against (see `observe`).
fn spec_hash_in(sbx: &Sandbox, cfg: &PodConfig<'_>, dir: &str) -> String {
    pod::build_pod_spec(&sbx.spec, cfg, dir, None).1
}

/// A warm pod a sandbox may adopt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Its name.
    pub name: String,
    /// Its resourceVersion as the cache holds it: the adopting patch's precondition.
    pub resource_version: String,
    /// Its UID (whose pool shell the claim takes).
    pub uid: String,
    /// Its workspace directory (`<nodeRoot>/<namespace>/warm-<suffix>`).
    pub host_dir: String,
    /// The SandboxPool that controls it, by name.
    pub pool: String,
    /// Whether its pool wrote the pool's marker in its directory ([`labels::WARM_MARKED`]).
    pub marked: bool,
}

/// Whether `pod` is a warm pod ready to be claimed ([`pool::is_claimable`]) and controlled by a
/// SandboxPool (what the pool made; a pod labelled warm by anyone else is not taken).
pub fn is_claimable(pod: &Pod) -> bool {
    pool::is_claimable(pod) && pool_of(pod).is_some()
}

/// The SandboxPool controlling `pod`, by name.
fn pool_of(pod: &Pod) -> Option<&str> {
    pod.owner_references()
        .iter()
        .find(|o| {
            o.controller == Some(true) && o.kind == SandboxPool::kind(&()) && !o.uid.is_empty()
        })
        .map(|o| o.name.as_str())
}

/// The warm pods of namespace `ns` among `pods` that a sandbox whose pod shape hash is `shape`
/// may adopt, by name. A pod whose annotated directory is not the one it mounts, or not a
/// `warm-*` entry of the namespace's directory, is passed over: its directory would become
/// the sandbox's.
pub fn candidates<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    ns: &str,
    shape: &str,
    node_root: &str,
) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = pods
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns) && is_claimable(p))
        .filter(|p| {
            p.annotations()
                .get(labels::POD_SHAPE_HASH)
                .map(String::as_str)
                == Some(shape)
        })
        .filter_map(|p| {
            let dir = p.annotations().get(labels::WORKSPACE_HOST_DIR)?;
            let mounted = placement::pod_host_dir(p)?;
            let name = placement::dir_name(&mounted, node_root, ns)?;
            let pool = pool_of(p)?.to_string();
            (dir == &mounted && labels::is_warm_dir_name(name)).then(|| Candidate {
                name: p.name_any(),
                resource_version: p.resource_version().unwrap_or_default(),
                uid: p.uid().unwrap_or_default(),
                host_dir: mounted.clone(),
                pool,
                marked: p.annotations().get(labels::WARM_MARKED).map(String::as_str)
                    == Some("true"),
            })
        })
        .filter(|c| !c.resource_version.is_empty())
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The merge patch that adopts a warm pod (`candidate`) for `sbx`: conditioned on the pod's
/// resourceVersion; the warm label and readiness mark removed (the pool lets go of it); the
/// sandbox's labels, scope annotations and the spec hash of its pod in that directory added;
/// the Sandbox as the sole controller owner (a merge patch replaces the whole list). The pool
/// label stays: the pool's watch sees the claim and refills.
pub fn adopt_patch(sbx: &Sandbox, cfg: &PodConfig<'_>, candidate: &Candidate) -> serde_json::Value {
    let mut labels = serde_json::Map::new();
    labels.insert(labels::WARM.into(), serde_json::Value::Null);
    for (k, v) in pod::owned_labels(sbx) {
        labels.insert(k, v.into());
    }
    labels.insert(labels::MANAGED_BY.into(), labels::MANAGER.into());
    let mut annotations = serde_json::Map::new();
    annotations.insert(labels::WARM_READY.into(), serde_json::Value::Null);
    annotations.insert(labels::WARM_MARKED.into(), serde_json::Value::Null);
    for (k, v) in labels::scope_annotations(&sbx.spec.scope) {
        annotations.insert(k, v.into());
    }
    annotations.insert(
        SPEC_HASH.into(),
        spec_hash_in(sbx, cfg, &candidate.host_dir).into(),
    );
    serde_json::json!({
        "metadata": {
            "resourceVersion": candidate.resource_version,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": sbx.controller_owner_ref(&()).map(|o| vec![o]),
        }
    })
}

/// Where a sandbox with UID `uid` starts among `n` candidates (sorted by name): a hash of
/// its UID, the same in every operator process.
pub fn start_at(uid: &str, n: usize) -> usize {
    // FNV-1a: stable across processes and builds (std's hasher is seeded per process).
    let h = uid.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    usize::try_from(h % n.max(1) as u64).unwrap_or(0)
}

/// What a start that adopted a warm pod brings to the serve step: the snapshot lookup made
/// beside the adoption, the shell its pool left open in the pod, and whether its pool marked
/// the directory.
pub(super) struct Adopted {
    /// The restore's snapshot lookup.
    pub lookup: init::Lookup,
    /// The pool's open shell, if it left one.
    pub shell: Option<Box<Session>>,
    /// Whether the directory holds its pool's marker (`remote::WARM_MARKER`).
    pub marked: bool,
}

impl Adopted {
    /// What the workspace's start takes (the lookup, and whether the pool marked the
    /// directory), and the pool's shell, which the serve step closes once the status is
    /// written.
    pub fn split(self) -> (Option<(init::Lookup, bool)>, Option<Box<Session>>) {
        (Some((self.lookup, self.marked)), self.shell)
    }
}

/// A warm pod the create step adopted, for the serve step to serve at once.
pub(super) struct Claimed {
    /// The pod, as the adopting write returned it.
    pub pod: Box<Pod>,
    /// What the adoption brings.
    pub adopted: Adopted,
    /// The planned status, with the pod recorded.
    pub status: SandboxStatus,
}

/// What one try to claim came to.
pub enum Claim {
    /// The pod was adopted (as the API server returned it), with the shell its pool left open
    /// in it, if one was, and whether its directory holds its pool's marker
    /// ([`Candidate::marked`]; `false` when not known).
    Adopted(Box<Pod>, Option<Box<Session>>, bool),
    /// No warm pod was taken: none fitted, or every one tried was taken by someone else first
    /// (`conflicts` of them).
    Miss {
        /// Candidates lost to someone else's write.
        conflicts: usize,
    },
}

impl Claim {
    /// How the try is counted in `agentbox_pool_claims_total`.
    pub fn result(&self) -> ClaimResult {
        match self {
            Claim::Adopted(..) => ClaimResult::Claimed,
            Claim::Miss { conflicts: 0 } => ClaimResult::Miss,
            Claim::Miss { .. } => ClaimResult::Conflict,
        }
    }
}

/// Tries to adopt a warm pod for `sbx` (see the module's documentation).
pub async fn claim(
    sbx: &Sandbox,
    ctx: &Context,
    pods: &Api<Pod>,
    cfg: &PodConfig<'_>,
) -> Result<Claim, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let shape = shape_hash(sbx, cfg);
    let cached = ctx.pods.state();
    let mut found = candidates(cached.iter().map(AsRef::as_ref), &ns, &shape, cfg.node_root);
    // Each sandbox starts at its own place among the ready ones (by its UID): two sandboxes
    // starting together rarely try the same pod first, and two operators starting the same
    // sandbox (a leader change) try the same pod first, so one of them adopts it and the
    // other finds it adopted (below) instead of adopting a second one.
    let uid = sbx.uid().unwrap_or_default();
    if !found.is_empty() {
        let at = start_at(&uid, found.len());
        found.rotate_left(at);
    }
    let mut conflicts = 0;
    let mut tried = 0;
    for c in &found {
        if tried == MAX_TRIES {
            break;
        }
        // A pod another start of this process is adopting (or has adopted, and the cache
        // has not seen it yet) is not tried: its write would only fail.
        if let Some(cache) = ctx.cache.as_ref()
            && !cache.taking.take(&c.uid, std::time::Instant::now())
        {
            continue;
        }
        tried += 1;
        match adopt(sbx, ctx, pods, cfg, c).await? {
            Some(claimed) => return Ok(claimed),
            None => conflicts += 1,
        }
    }
    Ok(Claim::Miss { conflicts })
}

/// Tries to adopt the candidate `c` by the conditional patch: the claim when it is this
/// sandbox's now, `None` when someone else took it first or it went.
async fn adopt(
    sbx: &Sandbox,
    ctx: &Context,
    pods: &Api<Pod>,
    cfg: &PodConfig<'_>,
    c: &Candidate,
) -> Result<Option<Claim>, Error> {
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let patch = adopt_patch(sbx, cfg, c);
    // The pool's shell is taken before the write (once the pod is claimed, the pool's next
    // reconcile drops the shells of pods no longer warm) and put back if the write fails.
    let shell = ctx.shells.take_with_pool(&c.uid);
    let e = match pods.patch(&c.name, &pp, &Patch::Merge(&patch)).await {
        Ok(p) => {
            let now = std::time::Instant::now();
            if let Some(cache) = ctx.cache.as_ref() {
                cache
                    .own_pods
                    .wrote(&sbx.uid().unwrap_or_default(), &c.name, now);
            }
            // Its pool refills a beat later, off this start's remaining steps.
            let ns = sbx.namespace().unwrap_or_default();
            ctx.pool_claims.claimed(&format!("{ns}/{}", c.pool), now);
            return Ok(Some(Claim::Adopted(
                Box::new(p),
                shell.map(|(_, s)| Box::new(s)),
                c.marked,
            )));
        }
        Err(e) => e,
    };
    if let Some(cache) = ctx.cache.as_ref() {
        cache.taking.release(&c.uid);
    }
    if let Some((pool, s)) = shell {
        ctx.shells.put(&pool, &c.uid, s);
    }
    match e {
        // Changed or taken since the cache saw it: read again. Adopted for this very sandbox
        // (by another operator during a leader change), it is this start's pod; else the
        // next one.
        kube::Error::Api(s) if s.code == 409 => {
            if let Some(p) = pods.get_opt(&c.name).await?
                && placement::controlled_by(&p, sbx)
            {
                debug!(sandbox = %sbx.name_any(), pod = %c.name, "warm pod adopted for this sandbox by someone else");
                // What the other start wrote is not known: the marker is written again.
                return Ok(Some(Claim::Adopted(Box::new(p), None, false)));
            }
            debug!(sandbox = %sbx.name_any(), pod = %c.name, "warm pod taken first (409)");
            Ok(None)
        }
        // Gone: the next one.
        kube::Error::Api(s) if s.code == 404 => {
            debug!(sandbox = %sbx.name_any(), pod = %c.name, "warm pod gone (404)");
            Ok(None)
        }
        e => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::security;
    use serde_json::json;

    const NODE_ROOT: &str = "/w";

    fn cfg() -> PodConfig<'static> {
        PodConfig {
            node_root: NODE_ROOT,
            helper: None,
            security: security::Defaults {
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
        }
    }

    fn sandbox(env: serde_json::Value) -> Sandbox {
        serde_json::from_value(json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s", "namespace": "team", "uid": "sbx-uid"},
            "spec": {"image": "busybox", "env": env, "templateRef": {"name": "tpl"},
                "scope": {"kind": "User", "agent": "coder", "user": "alice@example.com"}},
        }))
        .unwrap()
    }

    /// A warm pod of pool `py` as its pool makes it, for a spec of shape `shape`.
    fn warm(suffix: &str, shape: &str) -> Pod {
        let dir = format!("{NODE_ROOT}/team/warm-{suffix}");
        serde_json::from_value(json!({
            "metadata": {"name": format!("py-warm-{suffix}"), "namespace": "team",
                "resourceVersion": "7", "uid": format!("uid-{suffix}"),
                "labels": {labels::WARM: "true", labels::POOL: "py", labels::MANAGED_BY: labels::MANAGER},
                "annotations": {labels::WARM_READY: "true", labels::POD_SHAPE_HASH: shape,
                    labels::WORKSPACE_HOST_DIR: dir},
                "ownerReferences": [{"apiVersion": "agentbox.dev/v1alpha1",
                    "kind": "SandboxPool", "name": "py", "uid": "pool-uid", "controller": true}]},
            "spec": {"containers": [], "volumes": [
                {"name": pod::WORKSPACE_VOLUME, "hostPath": {"path": dir}}]},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": pod::CONTAINER, "ready": true, "restartCount": 0, "image": "busybox",
                "imageID": "", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]},
        }))
        .unwrap()
    }

    #[test]
    fn only_ready_warm_pods_of_the_same_shape_and_namespace_are_candidates() {
        let sbx = sandbox(json!([]));
        let shape = shape_hash(&sbx, &cfg());
        let ok = warm("aaaaa", &shape);
        let mut other_shape = warm("bbbbb", "other");
        let mut claimed = warm("ccccc", &shape);
        claimed.labels_mut().remove(labels::WARM);
        let mut unready = warm("ddddd", &shape);
        unready.annotations_mut().remove(labels::WARM_READY);
        let mut elsewhere = warm("eeeee", &shape);
        elsewhere.metadata.namespace = Some("other".into());
        let mut going = warm("fffff", &shape);
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().unwrap(),
            ));
        let mut lying = warm("ggggg", &shape);
        lying
            .annotations_mut()
            .insert(labels::WORKSPACE_HOST_DIR.into(), "/w/team/some-uid".into());
        let mut stray_dir = warm("hhhhh", &shape);
        stray_dir.spec.as_mut().unwrap().volumes.as_mut().unwrap()[0]
            .host_path
            .as_mut()
            .unwrap()
            .path = "/etc".into();
        let mut not_pools = warm("iiiii", &shape);
        not_pools.owner_references_mut()[0].kind = "Sandbox".into();
        let mut starting = warm("jjjjj", &shape);
        starting.status = None;
        other_shape.metadata.name = Some("py-warm-bbbbb".into());
        let pods = [
            ok.clone(),
            other_shape,
            claimed,
            unready,
            elsewhere,
            going,
            lying,
            stray_dir,
            not_pools,
            starting,
        ];
        let found = candidates(&pods, "team", &shape, NODE_ROOT);
        assert_eq!(
            found,
            vec![Candidate {
                name: "py-warm-aaaaa".into(),
                resource_version: "7".into(),
                uid: "uid-aaaaa".into(),
                host_dir: "/w/team/warm-aaaaa".into(),
                pool: "py".into(),
                marked: false,
            }]
        );
        // Its pool's marker is known from the pool's annotation.
        let mut marked = warm("kkkkk", &shape);
        marked
            .annotations_mut()
            .insert(labels::WARM_MARKED.into(), "true".into());
        let found = candidates(&[marked], "team", &shape, NODE_ROOT);
        assert!(found[0].marked);
    }

    #[test]
    fn a_sandbox_starts_at_the_same_candidate_in_every_process_and_sandboxes_spread() {
        assert_eq!(start_at("uid-1", 5), start_at("uid-1", 5));
        assert!(start_at("uid-1", 5) < 5);
        assert_eq!(start_at("uid-1", 0), 0, "no candidates");
        let spread: std::collections::BTreeSet<usize> =
            (0..50).map(|i| start_at(&format!("uid-{i}"), 10)).collect();
        assert!(spread.len() > 5, "{spread:?}");
    }

    #[test]
    fn an_env_override_changes_the_shape_and_files_or_scope_do_not() {
        let base = shape_hash(&sandbox(json!([])), &cfg());
        let env = sandbox(json!([{"name": "EXTRA", "value": "1"}]));
        assert_ne!(shape_hash(&env, &cfg()), base);
        let mut files = sandbox(json!([]));
        files.spec.workspace.files =
            serde_json::from_value(json!([{"path": "task.md", "content": "t"}])).unwrap();
        files.spec.scope.user = Some("bob".into());
        files.metadata.uid = Some("another-uid".into());
        assert_eq!(shape_hash(&files, &cfg()), base);
    }

    #[test]
    fn the_adopting_patch_is_conditional_and_hands_the_pod_to_the_sandbox_alone() {
        let sbx = sandbox(json!([]));
        let c = Candidate {
            name: "py-warm-aaaaa".into(),
            resource_version: "42".into(),
            uid: "uid-aaaaa".into(),
            host_dir: "/w/team/warm-aaaaa".into(),
            pool: "py".into(),
            marked: true,
        };
        let p = adopt_patch(&sbx, &cfg(), &c);
        let meta = &p["metadata"];
        assert_eq!(meta["resourceVersion"], json!("42"));
        assert_eq!(
            meta["labels"][labels::WARM],
            json!(null),
            "the pool lets go"
        );
        assert!(
            meta["labels"].get(labels::POOL).is_none(),
            "the pool label stays"
        );
        assert_eq!(meta["labels"][labels::SANDBOX], json!("s"));
        assert_eq!(meta["labels"][labels::SCOPE], json!("user"));
        assert_eq!(meta["annotations"][labels::WARM_READY], json!(null));
        assert_eq!(meta["annotations"][labels::WARM_MARKED], json!(null));
        assert_eq!(
            meta["annotations"][labels::USER_ID],
            json!("alice@example.com")
        );
        // The spec hash the sandbox controller will compare the pod with, in its directory.
        let want = pod::build_pod_in(&sbx, &cfg(), &c.host_dir, None)
            .metadata
            .annotations
            .unwrap()[SPEC_HASH]
            .clone();
        assert_eq!(meta["annotations"][SPEC_HASH], json!(want));
        let owners = meta["ownerReferences"].as_array().unwrap();
        assert_eq!(owners.len(), 1, "the sole owner");
        assert_eq!(owners[0]["kind"], json!("Sandbox"));
        assert_eq!(owners[0]["uid"], json!("sbx-uid"));
        assert_eq!(owners[0]["controller"], json!(true));
        // Once adopted, the pod is the sandbox's in every check that follows.
        let mut adopted = warm("aaaaa", "x");
        let merged = {
            let mut v = serde_json::to_value(&adopted).unwrap();
            json_merge(&mut v, &p);
            v
        };
        adopted = serde_json::from_value(merged).unwrap();
        assert!(placement::controlled_by(&adopted, &sbx));
        assert!(!is_claimable(&adopted));
        assert_eq!(
            placement::find_owned([&adopted], &sbx).map(ResourceExt::name_any),
            Some("py-warm-aaaaa".to_string())
        );
    }

    /// RFC 7386 merge, as the API server applies a merge patch.
    fn json_merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
        match (target, patch) {
            (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        json_merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                    }
                }
            }
            (t, p) => *t = p.clone(),
        }
    }
}
