//! The sandbox controller: Sandbox → Pod, workspace initialisation, lifecycle, cleanup.
//!
//! Each reconcile observes the Sandbox and its pod, decides with the pure functions in
//! [`super::pod`], [`super::validate`] and [`super::workspace`], applies what is missing, and
//! patches status only when it changed. The writes one sandbox costs are kept few: the
//! finalizer, the pod, status at scheduling and at readiness, and an Event at each.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{debug, info, warn};

use super::conditions::{self, GUARDED, POD_READY, READY, WORKSPACE_READY};
use super::pod::{self, CONTAINER, PodConfig, SPEC_HASH};
use super::workspace::{self, Observed};
use super::{Context, Error, FIELD_MANAGER, noderoot, selection, sources};
use crate::crd::{
    Egress, GuardStatus, LifecycleMode, Sandbox, SandboxPhase, SandboxStatus, WorkspaceStatus,
};
use crate::exec::{self, ExecRequest};
use crate::labels;

/// Finalizer that keeps a Sandbox until its pod and workspace directory are gone.
pub const FINALIZER: &str = "agentbox.dev/workspace";

/// How long one workspace exec may take before it counts as failed.
const INIT_TIMEOUT: Duration = Duration::from_secs(120);

/// Reconciles one Sandbox.
pub async fn reconcile(sbx: Arc<Sandbox>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let api: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let name = sbx.name_any();
    let has_finalizer = sbx.finalizers().iter().any(|f| f == FINALIZER);
    if sbx.metadata.deletion_timestamp.is_some() {
        if !has_finalizer {
            return Ok(Action::await_change());
        }
        // The cache may trail the API server: a reconcile queued before the finalizer went
        // would otherwise clean up again (and leave a cleanup pod behind). Act only on what
        // the API server says now.
        let Some(fresh) = api.get_opt(&name).await? else {
            return Ok(Action::await_change());
        };
        if fresh.uid() != sbx.uid() || !fresh.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(Action::await_change());
        }
        cleanup(&fresh, &ctx).await?;
        // Applying our metadata without the finalizer removes it: we own that list entry.
        let _ = apply_metadata(&api, &name, &fresh, false).await?;
        return Ok(Action::await_change());
    }
    if SUPERSEDED.is_stale(&sbx, Instant::now()) {
        // The cache still holds the version this process already wrote over: acting on it
        // would write the same status (and Event) again. The newer version's watch event
        // brings us back; the requeue is the fallback.
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    let labels = labels::scope_labels(&sbx.spec.scope);
    let labelled = labels.iter().all(|(k, v)| sbx.labels().get(k) == Some(v));
    let sbx = if !has_finalizer || !labelled {
        // One write puts both the finalizer and the scope labels on the Sandbox, so
        // `kubectl get sbx -l agentbox.dev/user=alice` finds hand-written sandboxes too.
        // The rest of this reconcile works on the version that write returned, so a status
        // write after it marks that version written over too.
        let patched = apply_metadata(&api, &name, &sbx, true).await?;
        SUPERSEDED.record(&sbx, Instant::now());
        Arc::new(patched)
    } else {
        sbx
    };
    apply(&sbx, &ctx).await
}

/// How long a written-over version is remembered. Watch events arrive well within it; the
/// bound keeps a missed event (or a write that changed nothing) from stalling a sandbox.
const SUPERSEDED_FOR: Duration = Duration::from_secs(5);

/// Versions of Sandboxes (by UID) that this process has written over, so a reconcile that a
/// lagging cache hands an old version is skipped instead of repeating the writes. One
/// reconcile can write over several versions (the one it read, then the one its metadata
/// write returned).
#[derive(Default)]
pub struct Superseded(Mutex<HashMap<String, (Vec<String>, Instant)>>);

impl Superseded {
    /// Remembers that `sbx`, as read, has just been written over.
    pub fn record(&self, sbx: &Sandbox, now: Instant) {
        let (Some(uid), Some(rv)) = (sbx.uid(), sbx.resource_version()) else {
            return;
        };
        if let Ok(mut m) = self.0.lock() {
            m.retain(|_, (_, at)| now.duration_since(*at) < SUPERSEDED_FOR);
            let e = m.entry(uid).or_insert_with(|| (Vec::new(), now));
            if !e.0.contains(&rv) {
                e.0.push(rv);
            }
            e.1 = now;
        }
    }

    /// Whether `sbx` is a version this process wrote over less than [`SUPERSEDED_FOR`] ago.
    /// Any other version forgets the entry: the cache has caught up.
    pub fn is_stale(&self, sbx: &Sandbox, now: Instant) -> bool {
        let Some(uid) = sbx.uid() else {
            return false;
        };
        let Ok(mut m) = self.0.lock() else {
            return false;
        };
        match m.get(&uid) {
            Some((rvs, at))
                if sbx
                    .metadata
                    .resource_version
                    .as_ref()
                    .is_some_and(|rv| rvs.contains(rv))
                    && now.duration_since(*at) < SUPERSEDED_FOR =>
            {
                true
            }
            Some(_) => {
                m.remove(&uid);
                false
            }
            None => false,
        }
    }
}

static SUPERSEDED: LazyLock<Superseded> = LazyLock::new(Superseded::default);

/// Server-side applies the sandbox controller's part of a Sandbox's status and remembers the
/// version read as written over. Its part is all but `lastSnapshot`, which the snapshot
/// controller owns under its own field manager (applying a copy read from a lagging cache
/// would put back an older snapshot).
async fn write_status(api: &Api<Sandbox>, sbx: &Sandbox, st: &SandboxStatus) -> Result<(), Error> {
    let mut mine = st.clone();
    mine.last_snapshot = None;
    super::apply_status(api, &sbx.name_any(), &mine).await?;
    SUPERSEDED.record(sbx, Instant::now());
    Ok(())
}

/// Writes the status and publishes an Event about the transition, both only when the status
/// changed: a sandbox stuck in one state costs no writes on each retry.
async fn write_transition(
    ctx: &Context,
    sbx: &Sandbox,
    api: &Api<Sandbox>,
    old: &SandboxStatus,
    st: &SandboxStatus,
    (type_, reason, action, note): (EventType, &str, &str, &str),
) -> Result<(), Error> {
    if old == st {
        return Ok(());
    }
    super::publish(ctx, sbx, type_, reason, action, note).await;
    write_status(api, sbx, st).await
}

/// Server-side applies the metadata the operator owns on a Sandbox: its scope labels and,
/// while it lives, the finalizer.
async fn apply_metadata(
    api: &Api<Sandbox>,
    name: &str,
    sbx: &Sandbox,
    finalizer: bool,
) -> Result<Sandbox, Error> {
    let finalizers: Vec<&str> = if finalizer {
        vec![FINALIZER]
    } else {
        Vec::new()
    };
    let body = serde_json::json!({
        "apiVersion": Sandbox::api_version(&()),
        "kind": Sandbox::kind(&()),
        "metadata": {
            "name": name,
            "labels": labels::scope_labels(&sbx.spec.scope),
            "finalizers": finalizers,
        },
    });
    Ok(api
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?)
}

/// The API handles one reconcile needs.
struct Apis {
    sandboxes: Api<Sandbox>,
    pods: Api<Pod>,
    policies: Api<NetworkPolicy>,
}

impl Apis {
    fn new(ctx: &Context, ns: &str) -> Self {
        Apis {
            sandboxes: Api::namespaced(ctx.client.clone(), ns),
            pods: Api::namespaced(ctx.client.clone(), ns),
            policies: Api::namespaced(ctx.client.clone(), ns),
        }
    }
}

async fn apply(sbx: &Sandbox, ctx: &Context) -> Result<Action, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let name = sbx.name_any();
    let apis = Apis::new(ctx, &ns);
    let now = Timestamp::now();
    let generation = sbx.metadata.generation;
    let old = sbx.status.clone().unwrap_or_default();
    let mut st = old.clone();
    st.scope_key = Some(labels::scope_key(&sbx.spec.scope));
    st.observed_generation = generation;
    let pod_name = labels::pod_name(&name);
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &ns);
    let lease = leases
        .get_opt(&labels::lease_name(&labels::scope_key(&sbx.spec.scope)))
        .await?;
    let (guard, held, reason, message) = guard_state(lease.as_ref(), now);
    st.guard = guard;
    conditions::set(
        &mut st.conditions,
        GUARDED,
        held,
        reason,
        message,
        generation,
        now,
    );

    // Validate: a spec the operator cannot honour gets no pod.
    let podcfg = PodConfig::from_config(&ctx.config);
    let problems = super::validate::problems(&sbx.spec, &ctx.config.allowed_host_prefixes, &podcfg);
    if !problems.is_empty() {
        let message = problems.join("; ");
        delete_if_present(&apis.pods, &pod_name).await?;
        st.phase = Some(SandboxPhase::Failed);
        st.pod_name = None;
        conditions::set(
            &mut st.conditions,
            READY,
            false,
            "InvalidSpec",
            &message,
            generation,
            now,
        );
        conditions::set(
            &mut st.conditions,
            POD_READY,
            false,
            "InvalidSpec",
            "no pod for an invalid spec",
            generation,
            now,
        );
        write_transition(
            ctx,
            sbx,
            &apis.sandboxes,
            &old,
            &st,
            (EventType::Warning, "InvalidSpec", "Validate", &message),
        )
        .await?;
        return Ok(Action::await_change());
    }

    // Shutdown time: the sandbox ends itself.
    let mut requeue = None;
    if let Some(at) = sbx.spec.lifecycle.shutdown_time.as_ref() {
        if at.0 <= now {
            super::publish(
                ctx,
                sbx,
                EventType::Normal,
                "ShutdownTimeReached",
                "Delete",
                "shutdownTime passed; deleting the sandbox",
            )
            .await;
            apis.sandboxes
                .delete(&name, &DeleteParams::default())
                .await?;
            return Ok(Action::await_change());
        }
        let secs = at.0.as_second().saturating_sub(now.as_second()).max(1);
        requeue = Some(Duration::from_secs(secs as u64));
    }

    ensure_network_policy(sbx, &apis.policies).await?;
    // Exposed ports: the Service, and where each port is reached (the pod's IP added below).
    let services = Api::namespaced(ctx.client.clone(), &ns);
    if super::service::ensure(&services, sbx, &old).await? > 0 {
        debug!(sandbox = %name, "applied the Service of spec.ports");
    }
    st.endpoints = super::service::endpoints(sbx, None);

    if sbx.spec.lifecycle.mode == LifecycleMode::Suspended {
        // spec.snapshot.onStop: persist the workspace before its pod goes.
        if super::snapshot::on_stop(ctx, sbx).await? == super::snapshot::OnStop::Wait {
            return Ok(Action::requeue(Duration::from_secs(2)));
        }
        let gone = delete_if_present(&apis.pods, &pod_name).await?;
        st.phase = Some(SandboxPhase::Suspended);
        st.pod_name = None;
        conditions::set(
            &mut st.conditions,
            POD_READY,
            false,
            "Suspended",
            "the sandbox is suspended; its workspace is kept on its node",
            generation,
            now,
        );
        conditions::set(
            &mut st.conditions,
            READY,
            false,
            "Suspended",
            "the sandbox is suspended",
            generation,
            now,
        );
        write_transition(
            ctx,
            sbx,
            &apis.sandboxes,
            &old,
            &st,
            (
                EventType::Normal,
                "Suspended",
                "DeletePod",
                "pod deleted; workspace kept",
            ),
        )
        .await?;
        return Ok(if gone {
            requeue.map_or_else(Action::await_change, Action::requeue)
        } else {
            Action::requeue(Duration::from_secs(2))
        });
    }

    let Some(pod) = apis.pods.get_opt(&pod_name).await? else {
        // The kubelet reads what the environment names on the operator's word: only objects
        // that opted in, checked before each pod is made. (A running pod keeps what it got.)
        match sources::check_env(sbx, ctx).await {
            Ok(()) => {}
            Err(e @ (Error::SourceMissing(_) | Error::SourceNotReadable(_))) => {
                let (reason, message) = e.reason_and_message();
                hold_pod(ctx, sbx, &apis, (&old, st), (reason, &message), now).await?;
                return Err(e);
            }
            Err(e) => return Err(e),
        }
        let pin = pinned_node(ctx, &st).await?;
        if st.node_name.is_some() && pin.is_none() {
            // The workspace's node is gone: the workspace with it. The next start is B or D.
            st.node_name = None;
        }
        let desired = pod::build_pod(sbx, &podcfg, pin.as_deref());
        let created = apis
            .pods
            .patch(
                &pod_name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&desired),
            )
            .await;
        if let Err(kube::Error::Api(s)) = &created
            && matches!(s.code, 400 | 403 | 422)
        {
            // Refused by the API server: an unknown RuntimeClass, a policy (Pod Security
            // admission, a quota), a field it rejects. Say so instead of retrying blindly.
            let msg = format!("the API server refused the sandbox pod: {}", s.message);
            hold_pod(ctx, sbx, &apis, (&old, st), ("PodRejected", &msg), now).await?;
            return Ok(Action::requeue(Duration::from_secs(60)));
        }
        created?;
        let msg = match &pin {
            Some(n) => format!("created pod {pod_name} on node {n}, where the workspace is"),
            None => format!("created pod {pod_name}"),
        };
        info!(sandbox = %name, namespace = %ns, "{msg}");
        super::publish(ctx, sbx, EventType::Normal, "PodCreated", "CreatePod", &msg).await;
        // A brand-new sandbox gets its first status from the pod's own progress (one write
        // fewer); one that had a pod must stop saying Ready at once.
        if old.phase.is_some() {
            st.pod_name = Some(pod_name.clone());
            pod_starting(&mut st, generation, now);
        }
        if old.phase.is_some() && changed(&old, &st) {
            write_status(&apis.sandboxes, sbx, &st).await?;
        }
        return Ok(Action::requeue(Duration::from_secs(10)));
    };

    if pod.metadata.deletion_timestamp.is_some() {
        st.phase = Some(SandboxPhase::Pending);
        not_ready(
            &mut st,
            "PodTerminating",
            "the sandbox pod is terminating; a new one follows",
            generation,
            now,
        );
        if changed(&old, &st) {
            write_status(&apis.sandboxes, sbx, &st).await?;
        }
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    if !is_owned_by(&pod, sbx) {
        let msg = format!("a pod named {pod_name} exists and does not belong to this sandbox");
        st.phase = Some(SandboxPhase::Failed);
        not_ready(&mut st, "PodNameConflict", &msg, generation, now);
        write_transition(
            ctx,
            sbx,
            &apis.sandboxes,
            &old,
            &st,
            (EventType::Warning, "PodNameConflict", "CreatePod", &msg),
        )
        .await?;
        return Ok(Action::requeue(Duration::from_secs(60)));
    }
    let desired_hash = pod::build_pod(sbx, &podcfg, None)
        .metadata
        .annotations
        .and_then(|a| a.get(SPEC_HASH).cloned());
    let have_hash = pod.annotations().get(SPEC_HASH).cloned();
    let state = observe_pod(&pod);
    let replace = if desired_hash != have_hash {
        Some((
            "PodReplaced",
            "the sandbox spec changed; replacing the pod (the workspace is kept)".to_string(),
        ))
    } else if let PodState::Ended(reason) = &state {
        Some((
            "PodRecreated",
            format!("the pod ended ({reason}); replacing it (the workspace is kept)"),
        ))
    } else {
        None
    };
    if let Some((reason, msg)) = replace {
        super::publish(ctx, sbx, EventType::Normal, reason, "DeletePod", &msg).await;
        delete_if_present(&apis.pods, &pod_name).await?;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }

    st.pod_name = Some(pod_name.clone());
    st.endpoints = super::service::endpoints(sbx, Some(&pod));
    if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
        let seen = (&old, &mut st, now);
        if let Some(wait) = node_root(sbx, ctx, &podcfg, &apis.pods, &node, seen).await? {
            requeue = Some(requeue.map_or(wait, |r| r.min(wait)));
        }
        st.node_name = Some(node);
    }
    // The kubelet reports a started container on its next relist, up to a second later; exec
    // reaches the container runtime directly. So a bound pod whose container answers exec is
    // initialised and served at once instead of after that report.
    let early = state == PodState::Starting && may_answer_exec(&pod);
    let mut starting = false;
    // The start's Event goes out after the status write: Ready is what a harness waits for.
    let mut started = None;
    match (state, early) {
        (PodState::Ready, _) | (PodState::Starting, true) => {
            let pod_uid = pod.uid().unwrap_or_default();
            let ws = st.workspace.clone().unwrap_or_default();
            let initialised_here = ws.initialized_pod_uid.as_deref() == Some(pod_uid.as_str());
            let init = if initialised_here {
                Ok(None)
            } else {
                init_workspace(sbx, ctx, &apis.pods, &pod_name, &ws)
                    .await
                    .map(Some)
            };
            if early && init.as_ref().is_err_and(container_not_running) {
                if let Err(e) = &init {
                    debug!(sandbox = %name, "the container does not answer exec yet: {e}");
                }
                pod_starting(&mut st, generation, now);
                starting = true;
                let retry = early_retry(pod_age(&pod, now));
                requeue = Some(requeue.map_or(retry, |r| r.min(retry)));
            } else {
                conditions::set(
                    &mut st.conditions,
                    POD_READY,
                    true,
                    "PodRunning",
                    "the sandbox container is running",
                    generation,
                    now,
                );
                match init {
                    Ok(None) => {}
                    Ok(Some((new_ws, decision))) => {
                        st.workspace = Some(WorkspaceStatus {
                            initialized_pod_uid: Some(pod_uid),
                            ..new_ws
                        });
                        if decision.restore.is_some() {
                            st.restored_from = decision.restore.clone();
                        }
                        st.restore_refusal = None;
                        ctx.refusals.set(&sbx.uid().unwrap_or_default(), None);
                        conditions::set(
                            &mut st.conditions,
                            WORKSPACE_READY,
                            true,
                            decision.reason,
                            &decision.message,
                            generation,
                            now,
                        );
                        started = Some((
                            decision.reason,
                            format!("start branch {:?}: {}", decision.branch, decision.message),
                        ));
                    }
                    Err(e) => {
                        let (reason, msg) = e.reason_and_message();
                        if let Some(r) = e.restore_refusal() {
                            st.restore_refusal = Some(r.clone());
                            ctx.refusals.set(&sbx.uid().unwrap_or_default(), Some(r));
                        }
                        st.phase = Some(SandboxPhase::Initializing);
                        conditions::set(
                            &mut st.conditions,
                            WORKSPACE_READY,
                            false,
                            reason,
                            &msg,
                            generation,
                            now,
                        );
                        conditions::set(
                            &mut st.conditions,
                            READY,
                            false,
                            reason,
                            &msg,
                            generation,
                            now,
                        );
                        write_transition(
                            ctx,
                            sbx,
                            &apis.sandboxes,
                            &old,
                            &st,
                            (EventType::Warning, reason, "InitWorkspace", &msg),
                        )
                        .await?;
                        return Err(e);
                    }
                }
                st.phase = Some(SandboxPhase::Ready);
                conditions::set(
                    &mut st.conditions,
                    READY,
                    true,
                    "Ready",
                    "the sandbox accepts commands",
                    generation,
                    now,
                );
            }
        }
        (PodState::Starting, false) => {
            starting = true;
            pod_starting(&mut st, generation, now);
        }
        (PodState::Problem { reason, message }, _) => {
            st.phase = Some(SandboxPhase::Pending);
            not_ready(&mut st, &reason, &message, generation, now);
            if conditions::get(&old.conditions, POD_READY).map(|c| c.reason.as_str())
                != Some(reason.as_str())
            {
                super::publish(ctx, sbx, EventType::Warning, &reason, "StartPod", &message).await;
            }
        }
        // Ended pods were replaced above.
        (PodState::Ended(_), _) => {}
    }
    if let Some(wait) = defer_first_status(old.phase, starting, pod_age(&pod, now)) {
        return Ok(Action::requeue(requeue.map_or(wait, |r| r.min(wait))));
    }
    if changed(&old, &st) {
        write_status(&apis.sandboxes, sbx, &st).await?;
    }
    if let Some((reason, note)) = started {
        super::publish(ctx, sbx, EventType::Normal, reason, "InitWorkspace", &note).await;
    }
    Ok(requeue.map_or_else(Action::await_change, Action::requeue))
}

/// Sets the [`noderoot::CONDITION`] of a sandbox on `node`: from this process's record of the
/// namespace's directory there, else by starting (or reading, then deleting) the helper pod
/// that prepares it. Returns when to look again while that pod runs. A Warning Event goes out
/// when the condition turns False.
async fn node_root(
    sbx: &Sandbox,
    ctx: &Context,
    podcfg: &PodConfig<'_>,
    pods: &Api<Pod>,
    node: &str,
    (old, st, now): (&SandboxStatus, &mut SandboxStatus, Timestamp),
) -> Result<Option<Duration>, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let dir = pod::namespace_host_path(podcfg.node_root, &ns);
    let found = match ctx.node_roots.get(node, &ns, Instant::now()) {
        Some(found) => Some(found),
        None if podcfg.helper.is_none() => None,
        None => {
            let name = pod::prepare_pod_name(node);
            let Some(p) = pods.get_opt(&name).await? else {
                if let Some(desired) = pod::build_prepare_pod(sbx, podcfg, node) {
                    match pods.create(&PostParams::default(), &desired).await {
                        // 409: another sandbox's start made it first.
                        Err(kube::Error::Api(s)) if s.code == 409 => {}
                        other => {
                            other?;
                        }
                    }
                }
                return Ok(Some(Duration::from_secs(2)));
            };
            let Some(found) = noderoot::read_pod(&p) else {
                return Ok(Some(Duration::from_secs(2)));
            };
            info!(namespace = %ns, node, "workspace directory checked: {found:?}");
            ctx.node_roots
                .record(node, &ns, found.clone(), Instant::now());
            delete_if_present(pods, &name).await?;
            Some(found)
        }
    };
    let (ok, reason, message) = match &found {
        Some(f) => noderoot::condition(f, node, &dir),
        None => noderoot::no_helper(node, &dir),
    };
    let was = conditions::get(&old.conditions, noderoot::CONDITION)
        .map(|c| (c.status == "True", c.reason.clone()));
    conditions::set(
        &mut st.conditions,
        noderoot::CONDITION,
        ok,
        reason,
        &message,
        sbx.metadata.generation,
        now,
    );
    if !ok && was != Some((false, reason.to_string())) {
        super::publish(
            ctx,
            sbx,
            EventType::Warning,
            reason,
            "PrepareNode",
            &message,
        )
        .await;
    }
    Ok(None)
}

/// No pod for now: Pending, PodReady and Ready False with `reason`, and a Warning Event, both
/// only when that changes the status.
async fn hold_pod(
    ctx: &Context,
    sbx: &Sandbox,
    apis: &Apis,
    (old, mut st): (&SandboxStatus, SandboxStatus),
    (reason, message): (&str, &str),
    now: Timestamp,
) -> Result<(), Error> {
    st.phase = Some(SandboxPhase::Pending);
    st.pod_name = None;
    not_ready(&mut st, reason, message, sbx.metadata.generation, now);
    let event = (EventType::Warning, reason, "CreatePod", message);
    write_transition(ctx, sbx, &apis.sandboxes, old, &st, event).await
}

/// Pending: the pod is on its way.
fn pod_starting(st: &mut SandboxStatus, generation: Option<i64>, now: Timestamp) {
    st.phase = Some(SandboxPhase::Pending);
    not_ready(
        st,
        "PodStarting",
        "waiting for the sandbox pod to run",
        generation,
        now,
    );
}

/// Sets PodReady and Ready to False with one reason: the pod is not (yet) serving.
fn not_ready(
    st: &mut SandboxStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) {
    for type_ in [POD_READY, READY] {
        conditions::set(
            &mut st.conditions,
            type_,
            false,
            reason,
            message,
            generation,
            now,
        );
    }
}

/// The node the next pod must land on: the one holding the workspace, if it still exists.
async fn pinned_node(ctx: &Context, st: &SandboxStatus) -> Result<Option<String>, Error> {
    let Some(node) = st.node_name.clone() else {
        return Ok(None);
    };
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    Ok(nodes.get_opt(&node).await?.map(|_| node))
}

/// Probes the marker, decides the branch, resolves file sources, and writes.
///
/// The probe carries no stdin: it is also what finds out whether a starting container runs
/// yet, and an exec with stdin into one that does not can hang instead of failing.
async fn init_workspace(
    sbx: &Sandbox,
    ctx: &Context,
    pods: &Api<Pod>,
    pod_name: &str,
    ws: &WorkspaceStatus,
) -> Result<(WorkspaceStatus, workspace::Decision), Error> {
    let root = sbx.spec.workspace.root.trim_end_matches('/').to_string();
    let uid = sbx.uid().unwrap_or_default();
    let t0 = std::time::Instant::now();
    let probe = exec::run(
        pods,
        pod_name,
        CONTAINER,
        ExecRequest::argv(["sh", "-c", workspace::PROBE_SCRIPT, "sh", root.as_str()])
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
    let marker_present = !probe.stdout.is_empty();
    let probed = t0.elapsed();
    let snapshot = if marker_present {
        None
    } else {
        selection::candidate(ctx, sbx).await?
    };
    let decision = workspace::decide(Observed {
        marker_present,
        root_was_ready: ws.root_ready,
        snapshot: snapshot.as_deref(),
        can_restore: ctx.store.is_some(),
    });
    // Branches B and C: restore before any file is written. A failure leaves the workspace
    // as it was and surfaces as WorkspaceReady=False with the refusal's reason.
    if let Some(snap) = decision.restore.as_deref() {
        super::restore::restore(ctx, sbx, pods, pod_name, snap).await?;
    }

    let files = sources::resolve_files(sbx, ctx).await?;
    let projections = sources::resolve_projections(sbx, ctx).await?;
    let hash = workspace::projection_hash(&projections);
    let writes =
        workspace::plan_writes(&decision, &files, &projections, hash != ws.projection_hash);
    let prepared = t0.elapsed();
    if !writes.is_empty() || !marker_present {
        run_script(
            pods,
            pod_name,
            workspace::script_args(&root, &uid, &writes),
            &writes,
        )
        .await?;
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
    };
    Ok((new_ws, decision))
}

/// Runs the workspace script, with the archive of `writes` on stdin when it has files.
async fn run_script(
    pods: &Api<Pod>,
    pod_name: &str,
    args: Vec<String>,
    writes: &workspace::Writes,
) -> Result<(), Error> {
    let mut argv = vec![
        "sh".to_string(),
        "-c".into(),
        workspace::SCRIPT.into(),
        "sh".into(),
    ];
    argv.extend(args);
    let mut req = ExecRequest::argv(argv)
        .timeout(INIT_TIMEOUT)
        .max_output(16 * 1024);
    if !writes.files.is_empty() {
        let mtime = u64::try_from(Timestamp::now().as_second()).unwrap_or(0);
        req = req.stdin(workspace::archive(&writes.files, mtime)?);
    }
    let out = exec::run(pods, pod_name, CONTAINER, req).await?;
    if !out.status.success() {
        return Err(Error::Init(format!(
            "writing the workspace failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Creates the deny-egress policy when asked for, removes it when not; writes nothing when it
/// is already as wanted.
async fn ensure_network_policy(sbx: &Sandbox, api: &Api<NetworkPolicy>) -> Result<(), Error> {
    let desired = pod::build_deny_egress(sbx);
    let name = desired.metadata.name.clone().unwrap_or_default();
    let current = api.get_opt(&name).await?;
    match (sbx.spec.network.egress, current) {
        // Compare by the hash of what we asked for: the API server drops empty lists
        // (`egress: []`), so the stored spec never equals the desired one field by field.
        (Egress::Denied, Some(np))
            if np.annotations().get(SPEC_HASH) == desired.annotations().get(SPEC_HASH) =>
        {
            Ok(())
        }
        (Egress::Denied, _) => {
            api.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&desired),
            )
            .await?;
            Ok(())
        }
        (Egress::All, Some(_)) => {
            delete_if_present(api, &name).await?;
            Ok(())
        }
        (Egress::All, None) => Ok(()),
    }
}

/// Deleting a Sandbox: pod and workspace first, then the scope's idle guard Lease.
async fn cleanup(sbx: &Sandbox, ctx: &Context) -> Result<Action, Error> {
    ctx.refusals.set(&sbx.uid().unwrap_or_default(), None);
    let action = remove_pod_and_workspace(sbx, ctx).await?;
    forget_scope_lease(sbx, ctx).await?;
    Ok(action)
}

/// Deletes the scope's guard Lease when this was the last sandbox of the scope in the namespace
/// and nobody holds the guard, so leases do not pile up. The delete is conditioned on the
/// resourceVersion read, so a harness taking the guard meanwhile keeps it.
async fn forget_scope_lease(sbx: &Sandbox, ctx: &Context) -> Result<(), Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let sandboxes: Api<Sandbox> = Api::namespaced(ctx.client.clone(), &ns);
    let others = sandboxes
        .list_metadata(&ListParams::default().labels(&labels::scope_selector(&sbx.spec.scope)))
        .await?
        .items
        .into_iter()
        .filter(|o| o.metadata.uid != sbx.metadata.uid)
        .count();
    if others > 0 {
        return Ok(());
    }
    let leases: Api<Lease> = Api::namespaced(ctx.client.clone(), &ns);
    let name = labels::lease_name(&labels::scope_key(&sbx.spec.scope));
    let Some(lease) = leases.get_opt(&name).await? else {
        return Ok(());
    };
    let free = lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .is_none_or(str::is_empty);
    if !free {
        return Ok(());
    }
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            resource_version: lease.metadata.resource_version.clone(),
            uid: lease.metadata.uid.clone(),
        }),
        ..DeleteParams::default()
    };
    match leases.delete(&name, &dp).await {
        Ok(_) => Ok(()),
        // Gone already, or changed under us (someone took the guard): leave it.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deleting a Sandbox: onward only when its pod is gone and its workspace directory removed
/// from the node by a short-lived pod bound there.
async fn remove_pod_and_workspace(sbx: &Sandbox, ctx: &Context) -> Result<Action, Error> {
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let name = sbx.name_any();
    let apis = Apis::new(ctx, &ns);
    let pod_name = labels::pod_name(&name);

    if sbx.status.as_ref().and_then(|s| s.phase) != Some(SandboxPhase::Terminating) {
        let mut st = sbx.status.clone().unwrap_or_default();
        st.phase = Some(SandboxPhase::Terminating);
        // Best effort: a failed status write must not block deletion.
        if let Err(e) = write_status(&apis.sandboxes, sbx, &st).await {
            warn!(sandbox = %name, "could not mark the sandbox Terminating: {e}");
        }
    }
    // spec.snapshot.onStop: persist the workspace before its pod goes.
    if super::snapshot::on_stop(ctx, sbx).await? == super::snapshot::OnStop::Wait {
        return Err(Error::CleanupPending);
    }
    // Returning Ok lets the finalizer go, so every unfinished step returns CleanupPending.
    if !delete_if_present(&apis.pods, &pod_name).await? {
        return Err(Error::CleanupPending);
    }
    delete_if_present(&apis.policies, &labels::network_policy_name(&name)).await?;

    let Some(node) = sbx.status.as_ref().and_then(|s| s.node_name.clone()) else {
        return Ok(Action::await_change());
    };
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    if nodes.get_opt(&node).await?.is_none() {
        let msg = format!("node {node} is gone; its workspace directory cannot be removed");
        super::publish(
            ctx,
            sbx,
            EventType::Warning,
            "WorkspaceUnreachable",
            "DeleteWorkspace",
            &msg,
        )
        .await;
        return Ok(Action::await_change());
    }
    // The helper pod that prepares the namespace's directory, if this sandbox started it and it
    // still runs: it goes now rather than after the garbage collector notices.
    let prepare = pod::prepare_pod_name(&node);
    if let Some(p) = apis.pods.get_opt(&prepare).await?
        && p.owner_references()
            .iter()
            .any(|o| Some(&o.uid) == sbx.uid().as_ref())
    {
        delete_if_present(&apis.pods, &prepare).await?;
    }
    let podcfg = PodConfig::from_config(&ctx.config);
    let cleanup_name = pod::cleanup_pod_name(sbx);
    match apis.pods.get_opt(&cleanup_name).await? {
        None => {
            let Some(desired) = pod::build_cleanup_pod(sbx, &podcfg, &node) else {
                return Err(no_helper_for_cleanup(sbx, ctx, &apis, &node).await);
            };
            apis.pods
                .patch(
                    &cleanup_name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&desired),
                )
                .await?;
            Err(Error::CleanupPending)
        }
        Some(p) => match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => {
                delete_if_present(&apis.pods, &cleanup_name).await?;
                info!(sandbox = %name, namespace = %ns, node = %node, "workspace removed");
                Ok(Action::await_change())
            }
            Some("Failed") => {
                let msg = format!("removing the workspace on node {node} failed; retrying");
                super::publish(
                    ctx,
                    sbx,
                    EventType::Warning,
                    "WorkspaceCleanupFailed",
                    "DeleteWorkspace",
                    &msg,
                )
                .await;
                delete_if_present(&apis.pods, &cleanup_name).await?;
                Err(Error::Cleanup(msg))
            }
            _ => Err(Error::CleanupPending),
        },
    }
}

/// Without a helper image the workspace cannot be removed: the sandbox's own image is never run
/// for it (its `rm` is whatever the image author made it). The Sandbox stays, Terminating, with
/// the [`conditions::WORKSPACE_REMOVED`] condition and a Warning Event naming the directory, so
/// nothing is left behind unseen.
async fn no_helper_for_cleanup(sbx: &Sandbox, ctx: &Context, apis: &Apis, node: &str) -> Error {
    let ns = sbx.namespace().unwrap_or_default();
    let dir = pod::workspace_host_path(&ctx.config.node_root, &ns, &sbx.uid().unwrap_or_default());
    let msg = format!(
        "workspace directory {dir} on node {node} cannot be removed: this operator has no helper image (--helper-image). The Sandbox stays until an operator with one removes it; to let it go anyway, remove the finalizer {FINALIZER} and the directory by hand"
    );
    let old = sbx.status.clone().unwrap_or_default();
    let mut st = old.clone();
    st.phase = Some(SandboxPhase::Terminating);
    conditions::set(
        &mut st.conditions,
        conditions::WORKSPACE_REMOVED,
        false,
        "NoHelperImage",
        &msg,
        sbx.metadata.generation,
        Timestamp::now(),
    );
    let event = (
        EventType::Warning,
        "NoHelperImage",
        "DeleteWorkspace",
        msg.as_str(),
    );
    if let Err(e) = write_transition(ctx, sbx, &apis.sandboxes, &old, &st, event).await {
        warn!(sandbox = %sbx.name_any(), "could not record the stuck cleanup: {e}");
    }
    Error::NoHelper(msg)
}

/// Deletes an object if it exists. Returns true when it is gone (absent already).
async fn delete_if_present<K>(api: &Api<K>, name: &str) -> Result<bool, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    // Read first: deleting an object that is already terminating is a write that changes
    // nothing, and cleanup polls.
    match api.get_opt(name).await? {
        None => return Ok(true),
        Some(o) if o.meta().deletion_timestamp.is_some() => return Ok(false),
        Some(_) => {}
    }
    match api.delete(name, &DeleteParams::background()).await {
        Ok(either) => Ok(either.is_right()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(true),
        Err(e) => Err(e.into()),
    }
}

fn is_owned_by(pod: &Pod, sbx: &Sandbox) -> bool {
    let uid = sbx.uid();
    pod.owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && Some(&o.uid) == uid.as_ref())
}

/// Status changed in a way worth a write (ignores nothing: conditions keep their transition
/// times, so an unchanged world compares equal).
fn changed(old: &SandboxStatus, new: &SandboxStatus) -> bool {
    old != new
}

/// The scope's execution guard as the Sandbox reports it: holder and since when, whether it is
/// held, and the Guarded condition's reason and message. A lease past its duration counts as
/// free: anyone may take it over.
pub fn guard_state(
    lease: Option<&Lease>,
    now: Timestamp,
) -> (Option<GuardStatus>, bool, &'static str, String) {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return (None, false, "Free", "nobody holds the scope's guard".into());
    };
    let Some(holder) = spec.holder_identity.clone().filter(|h| !h.is_empty()) else {
        return (None, false, "Free", "nobody holds the scope's guard".into());
    };
    let renewed = spec
        .renew_time
        .as_ref()
        .or(spec.acquire_time.as_ref())
        .map(|t| t.0);
    let duration = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let expired = renewed.is_none_or(|t| t.as_second() + duration < now.as_second());
    if expired {
        return (
            None,
            false,
            "Expired",
            format!("{holder} held the guard but stopped renewing it"),
        );
    }
    let since = spec.acquire_time.as_ref().map(|t| Time(t.0));
    (
        Some(GuardStatus {
            holder: Some(holder.clone()),
            since,
        }),
        true,
        "Held",
        format!("held by {holder}"),
    )
}

/// What the sandbox pod is doing, as far as the sandbox cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodState {
    /// Running, container ready.
    Ready,
    /// On its way: scheduling, pulling, creating.
    Starting,
    /// Stuck in a way a user should see (image pull errors, crash loops, unschedulable).
    Problem {
        /// Kubernetes' reason.
        reason: String,
        /// Kubernetes' message.
        message: String,
    },
    /// Terminal: Succeeded or Failed (evicted, for example); a new pod is needed.
    Ended(String),
}

/// Whether a starting pod's container may already answer exec: the pod is bound to a node,
/// not terminating, and its container is not reported in any state but "being created" (or
/// "waiting for the init container", for a non-root sandbox's: the init container may have
/// finished before the kubelet says so).
pub fn may_answer_exec(pod: &Pod) -> bool {
    let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    let creating = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == CONTAINER))
        .is_none_or(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.waiting.as_ref())
                .is_some_and(|w| {
                    matches!(
                        w.reason.as_deref(),
                        None | Some("" | "ContainerCreating" | "PodInitializing")
                    )
                })
        });
    bound && creating && pod.metadata.deletion_timestamp.is_none()
}

/// How long ago the pod was created.
fn pod_age(pod: &Pod, now: Timestamp) -> Duration {
    let ms = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| now.as_millisecond().saturating_sub(t.0.as_millisecond()))
        .unwrap_or(0);
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// When to try exec again on a pod whose container did not answer yet: often while the pod is
/// young (a container whose image is present starts within a second), backing off to 1 s as
/// it ages (an image pull), so a slow start does not become a stream of exec attempts.
pub fn early_retry(pod_age: Duration) -> Duration {
    (pod_age / 8).clamp(Duration::from_millis(50), Duration::from_secs(1))
}

/// How long a brand-new sandbox whose pod is starting goes without a status.
pub const FIRST_STATUS_GRACE: Duration = Duration::from_secs(2);

/// Whether to hold back a brand-new sandbox's first status (and for how long): while its pod
/// starts, for the first [`FIRST_STATUS_GRACE`]. Most sandboxes are Ready by then, and Ready
/// becomes their first and only status write; a slow start still shows Pending after it.
pub fn defer_first_status(
    old_phase: Option<SandboxPhase>,
    starting: bool,
    pod_age: Duration,
) -> Option<Duration> {
    (old_phase.is_none() && starting && pod_age < FIRST_STATUS_GRACE)
        .then(|| FIRST_STATUS_GRACE - pod_age)
}

/// Whether an initialisation failed only because the container does not run yet (exec could
/// not reach it), as opposed to a failure inside a running container.
fn container_not_running(e: &Error) -> bool {
    matches!(
        e,
        Error::Exec(crate::exec::ExecError::Connect { .. } | crate::exec::ExecError::NotStarted(_))
    )
}

/// Reads a pod's status into a [`PodState`].
pub fn observe_pod(pod: &Pod) -> PodState {
    let Some(status) = pod.status.as_ref() else {
        return PodState::Starting;
    };
    if let Some(phase @ ("Succeeded" | "Failed")) = status.phase.as_deref() {
        return PodState::Ended(status.reason.clone().unwrap_or_else(|| phase.to_string()));
    }
    let container = status
        .container_statuses
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.name == CONTAINER));
    if let Some(c) = container {
        let running = c.state.as_ref().is_some_and(|s| s.running.is_some());
        if running && c.ready {
            return PodState::Ready;
        }
        if let Some(w) = c.state.as_ref().and_then(|s| s.waiting.as_ref()) {
            let reason = w.reason.clone().unwrap_or_default();
            if matches!(
                reason.as_str(),
                "" | "ContainerCreating" | "PodInitializing"
            ) {
                return PodState::Starting;
            }
            return PodState::Problem {
                message: w.message.clone().unwrap_or_else(|| reason.clone()),
                reason,
            };
        }
        if let Some(t) = c.state.as_ref().and_then(|s| s.terminated.as_ref()) {
            let reason = t.reason.clone().unwrap_or_else(|| "ContainerExited".into());
            return PodState::Problem {
                message: format!("the sandbox container exited with code {}", t.exit_code),
                reason,
            };
        }
        return PodState::Starting;
    }
    let unschedulable = status.conditions.as_ref().and_then(|cs| {
        cs.iter().find(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
    });
    match unschedulable {
        Some(c) => PodState::Problem {
            reason: "Unschedulable".into(),
            message: c
                .message
                .clone()
                .unwrap_or_else(|| "no node can run the pod".into()),
        },
        None => PodState::Starting,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_written_over_version_is_skipped_until_a_newer_one_or_the_bound() {
        let sbx = |rv: &str| -> Sandbox {
            let mut s: Sandbox = serde_json::from_value(serde_json::json!({
                "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
                "metadata": {"name": "s", "uid": "u1", "resourceVersion": rv},
                "spec": {"image": "i", "scope": {"kind": "Global"}},
            }))
            .unwrap();
            s.metadata.namespace = Some("n".into());
            s
        };
        let reg = Superseded::default();
        let t = Instant::now();
        assert!(!reg.is_stale(&sbx("1"), t), "nothing written yet");
        reg.record(&sbx("1"), t);
        assert!(reg.is_stale(&sbx("1"), t + Duration::from_millis(10)));
        assert!(
            !reg.is_stale(&sbx("2"), t + Duration::from_millis(20)),
            "newer version"
        );
        assert!(
            !reg.is_stale(&sbx("1"), t + Duration::from_millis(30)),
            "entry forgotten"
        );
        reg.record(&sbx("3"), t);
        reg.record(&sbx("4"), t);
        assert!(reg.is_stale(&sbx("3"), t), "every version written over");
        assert!(reg.is_stale(&sbx("4"), t));
        assert!(!reg.is_stale(&sbx("4"), t + SUPERSEDED_FOR), "bounded");
    }

    #[test]
    fn early_exec_is_tried_on_bound_pods_whose_container_is_being_created() {
        let bound = |status: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"nodeName": "n", "containers": [{"name": CONTAINER}]},
                "status": status,
            }))
            .unwrap()
        };
        let waiting = |reason: &str| {
            serde_json::json!({"phase": "Pending", "containerStatuses": [{
                "name": CONTAINER, "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": reason}}}]})
        };
        assert!(!may_answer_exec(&pod(serde_json::json!({}))), "not bound");
        assert!(may_answer_exec(&bound(
            serde_json::json!({"phase": "Pending"})
        )));
        assert!(may_answer_exec(&bound(waiting("ContainerCreating"))));
        assert!(may_answer_exec(&bound(waiting("PodInitializing"))));
        assert!(!may_answer_exec(&bound(waiting("ImagePullBackOff"))));
        let mut gone = bound(serde_json::json!({"phase": "Pending"}));
        gone.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::from_second(1).unwrap(),
            ));
        assert!(!may_answer_exec(&gone), "terminating");
    }

    #[test]
    fn early_exec_backs_off_as_the_pod_ages() {
        let ms = |m| early_retry(Duration::from_millis(m)).as_millis();
        assert_eq!(ms(0), 50);
        assert_eq!(ms(800), 100);
        assert_eq!(ms(4_000), 500);
        assert_eq!(ms(60_000), 1000);
    }

    #[test]
    fn a_new_sandbox_gets_no_status_while_its_pod_starts_briefly() {
        let young = Duration::from_millis(500);
        assert_eq!(
            defer_first_status(None, true, young),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(defer_first_status(None, true, FIRST_STATUS_GRACE), None);
        assert_eq!(
            defer_first_status(None, false, young),
            None,
            "problems show"
        );
        assert_eq!(
            defer_first_status(Some(SandboxPhase::Pending), true, young),
            None,
            "only the first status"
        );
    }

    #[test]
    fn guard_state_reads_the_lease() {
        let now = Timestamp::from_second(10_000).unwrap();
        assert!(!guard_state(None, now).1);
        let lease = |holder: &str, renewed: i64| -> Lease {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "l"},
                "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15,
                    "acquireTime": "1970-01-01T02:40:00Z",
                    "renewTime": Timestamp::from_second(renewed).unwrap().to_string()}
            }))
            .unwrap()
        };
        let (g, held, reason, msg) = guard_state(Some(&lease("harness-1", 9_990)), now);
        assert!(held);
        assert_eq!(reason, "Held");
        assert_eq!(msg, "held by harness-1");
        let g = g.unwrap();
        assert_eq!(g.holder.as_deref(), Some("harness-1"));
        assert_eq!(g.since.unwrap().0.as_second(), 9_600);
        let (g, held, reason, _) = guard_state(Some(&lease("harness-1", 9_980)), now);
        assert!(!held && g.is_none());
        assert_eq!(reason, "Expired");
        let (_, held, reason, _) = guard_state(Some(&lease("", 9_999)), now);
        assert!(!held);
        assert_eq!(reason, "Free");
    }

    #[test]
    fn pod_states() {
        assert_eq!(observe_pod(&pod(serde_json::json!({}))), PodState::Starting);
        let ready = pod(
            serde_json::json!({"phase": "Running", "containerStatuses": [{
            "name": "sandbox", "ready": true, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}),
        );
        assert_eq!(observe_pod(&ready), PodState::Ready);
        let creating = pod(
            serde_json::json!({"phase": "Pending", "containerStatuses": [{
            "name": "sandbox", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
        );
        assert_eq!(observe_pod(&creating), PodState::Starting);
        let pull = pod(
            serde_json::json!({"phase": "Pending", "containerStatuses": [{
            "name": "sandbox", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"waiting": {"reason": "ErrImageNeverPull", "message": "image not present"}}}]}),
        );
        assert_eq!(
            observe_pod(&pull),
            PodState::Problem {
                reason: "ErrImageNeverPull".into(),
                message: "image not present".into()
            }
        );
        let unsched = pod(serde_json::json!({"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes"}]}));
        assert_eq!(
            observe_pod(&unsched),
            PodState::Problem {
                reason: "Unschedulable".into(),
                message: "0/1 nodes".into()
            }
        );
        let evicted = pod(serde_json::json!({"phase": "Failed", "reason": "Evicted"}));
        assert_eq!(observe_pod(&evicted), PodState::Ended("Evicted".into()));
    }
}
