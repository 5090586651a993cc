//! The create step: no pod. The environment's sources checked, then a warm pod claimed when
//! this start may and one fits (and served at once), else the sandbox's own pod applied,
//! pinned to the workspace's node while that node lives.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use tracing::{debug, info};

use super::claim::{self, Adopted, Claimed};
use super::observe::World;
use super::plan;
use super::sources;
use super::status::{self, Stamp};
use super::tools::Tools;
use crate::controller::context::{Error, FIELD_MANAGER, Note};
use crate::controller::{credential, placement, pod, restore_source, runtime};
use agentbox_api::crd::{Sandbox, SandboxStatus};

/// How soon a sandbox whose RuntimeClass does not exist looks again (RuntimeClasses are not
/// watched).
const RUNTIME_CLASS_POLL: Duration = Duration::from_secs(30);

/// How the create step's first half ended.
pub(super) enum Created {
    /// Done for now (a source or the runtime class is missing): look again as the action says.
    Done(Action),
    /// A warm pod adopted: the serve step serves it at once.
    Claimed(Claimed),
    /// No warm pod: the sandbox's own pod is to be made ([`apply_pod`]), once its node is
    /// known (the lost step's `pin`), with this status.
    Unplaced(SandboxStatus),
}

/// No pod: checks the sources the environment names, then adopts a warm pod when this
/// start may ([`plan::may_claim`]) and one fits; else checks the runtime class, and the
/// sandbox's own pod is to be made.
pub(super) async fn create_pod(
    h: &Tools<'_>,
    sbx: &Sandbox,
    world: &World,
    mut st: SandboxStatus,
) -> Result<Created, Error> {
    let old = &world.old;
    check_sources(h, sbx, old, &mut st).await?;
    if plan::may_claim(sbx, old)
        && let Some((pod, adopted)) = claim_warm(h, sbx).await?
    {
        debug!(pod = %pod.name_any(), "adopted warm pod {}", pod.name_any());
        status::serving(sbx, &mut st, &pod, world.template.as_ref());
        let claimed = Claimed {
            pod,
            adopted,
            status: st,
        };
        return Ok(Created::Claimed(claimed));
    }
    if let Some(wait) = check_runtime_class(h, sbx, old, &mut st).await? {
        return Ok(Created::Done(Action::requeue(wait)));
    }
    Ok(Created::Unplaced(st))
}

/// The kubelet reads what the environment names on the operator's word: only objects
/// that opted in, checked before each pod is made (a running pod keeps what it got). A
/// source missing or not readable is recorded before its error goes back.
async fn check_sources(
    h: &Tools<'_>,
    sbx: &Sandbox,
    old: &SandboxStatus,
    st: &mut SandboxStatus,
) -> Result<(), Error> {
    let checked = match sources::check_env(sbx, h.ctx).await {
        Ok(()) => credential::check(sbx, &sbx.spec.pod.network, h.ctx).await,
        e => e,
    };
    let Err(e) = checked else {
        return Ok(());
    };
    if let Error::SourceMissing(_) | Error::SourceNotReadable(_) | Error::CredentialRefused(_) = e {
        let (reason, message) = e.reason_and_message();
        let generation = sbx.metadata.generation;
        let stamp = Stamp {
            generation,
            now: Timestamp::now(),
        };
        let note = status::held(st, reason, &message, stamp);
        h.writer(sbx).transition(old, st, Some(note)).await?;
    }
    Err(e)
}

/// Adopts a warm pod that fits, if one does: the pod as the adopting write returned it,
/// with the restore's snapshot lookup (made beside the adopting write, as it needs no pod:
/// one read wasted when no warm pod is taken) and the shell its pool left open in it.
async fn claim_warm(h: &Tools<'_>, sbx: &Sandbox) -> Result<Option<(Box<Pod>, Adopted)>, Error> {
    let started = Instant::now();
    let ((claimed, patched), (lookup, looked)) = tokio::join!(
        async {
            let pods = &h.apis.pods;
            let claimed = claim::claim(sbx, h.ctx, pods, h.podcfg).await;
            (claimed, started.elapsed())
        },
        async {
            let lookup = restore_source::candidate(h.ctx, sbx).await;
            (lookup, started.elapsed())
        }
    );
    // Which of the two the start waited for (a profile's question).
    debug!(sandbox = %sbx.name_any(), "claim answered at {patched:?}, restore lookup at {looked:?}");
    let claimed = claimed?;
    h.ctx.metrics.claimed(claimed.result(), started.elapsed());
    Ok(match claimed {
        claim::Claim::Adopted(pod, shell, marked) => Some((
            pod,
            Adopted {
                lookup,
                shell,
                marked,
            },
        )),
        claim::Claim::Miss { .. } => None,
    })
}

/// A runtime class that does not exist would leave the pod refused (or, where the API
/// server does not check, Pending for ever): said at once, and looked at again after the
/// returned wait.
async fn check_runtime_class(
    h: &Tools<'_>,
    sbx: &Sandbox,
    old: &SandboxStatus,
    st: &mut SandboxStatus,
) -> Result<Option<Duration>, Error> {
    let Some(rc) = runtime::effective(&sbx.spec, h.podcfg.default_runtime_class) else {
        return Ok(None);
    };
    let classes: Api<RuntimeClass> = Api::all(h.ctx.client.clone());
    match classes.get_opt(rc).await {
        Ok(Some(_)) => status::clear_stall(st, runtime::NOT_FOUND),
        Ok(None) => {
            let generation = sbx.metadata.generation;
            let note = status::runtime_class_missing(st, rc, generation, Timestamp::now());
            h.writer(sbx).transition(old, st, Some(note)).await?;
            return Ok(Some(RUNTIME_CLASS_POLL));
        }
        // An operator without the right to read RuntimeClasses: the API server's own
        // refusal of the pod (PodRejected) says it instead.
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        Err(e) => return Err(e.into()),
    }
    Ok(None)
}

/// The create step's second half: applies the sandbox's own pod, on `pin`'s node if any, mounting the workspace's
/// directory (kept across a suspend or a pod's loss; the derived one when there is none).
pub(super) async fn apply_pod(
    h: &Tools<'_>,
    sbx: &Sandbox,
    world: &World,
    mut st: SandboxStatus,
    pin: Option<String>,
) -> Result<Action, Error> {
    let old = &world.old;
    let (generation, now) = (sbx.metadata.generation, Timestamp::now());
    // A pod the operator makes has the derived name, whatever pod the sandbox had before.
    let pod_name = placement::derived_pod_name(sbx);
    let dir = placement::recorded_in(&st)
        .unwrap_or_else(|| placement::derived_host_dir(sbx, h.podcfg.node_root));
    let uid = sbx.uid().unwrap_or_default();
    if let Some(cache) = h.ctx.cache.as_ref()
        && world.pod.is_none()
        && placement::recorded_pod_name(sbx).is_none()
        && h.apis.pods.get_opt(&pod_name).await?.is_some()
    {
        // The first start's lookup came from the cache of the operator's pods: a pod of
        // this name that is not one of them (someone else's) is read from the API server
        // on the next look, which reports the conflict instead of writing over it.
        cache.own_pods.wrote(&uid, &pod_name, Instant::now());
        return Ok(Action::requeue(Duration::ZERO));
    }
    let desired = pod::build_pod_in(sbx, h.podcfg, &dir, pin.as_deref());
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let created = h
        .apis
        .pods
        .patch(&pod_name, &pp, &Patch::Apply(&desired))
        .await;
    if let Err(kube::Error::Api(s)) = &created
        && matches!(s.code, 400 | 403 | 422)
    {
        // Refused by the API server: an unknown RuntimeClass, a policy (Pod Security
        // admission, a quota), a field it rejects. Say so instead of retrying blindly.
        let msg = format!("the API server refused the sandbox pod: {}", s.message);
        let note = status::held(&mut st, "PodRejected", &msg, Stamp { generation, now });
        h.writer(sbx).transition(old, &st, Some(note)).await?;
        return Ok(Action::requeue(Duration::from_secs(60)));
    }
    created?;
    if let Some(cache) = h.ctx.cache.as_ref() {
        cache.own_pods.wrote(&uid, &pod_name, Instant::now());
    }
    let msg = match &pin {
        Some(n) => format!("created pod {pod_name} on node {n}, where the workspace is"),
        None => format!("created pod {pod_name}"),
    };
    // The reconcile span names the sandbox and its namespace.
    info!("{msg}");
    let note = Note {
        type_: kube::runtime::events::EventType::Normal,
        reason: "PodCreated".into(),
        action: "CreatePod",
        message: msg,
    };
    h.writer(sbx).publish(Some(note)).await;
    if status::pod_created(old, &mut st, &pod_name, Stamp { generation, now }) {
        h.writer(sbx).status(&st).await?;
    }
    Ok(Action::requeue(Duration::from_secs(10)))
}
