//! Controllers: observe → decide (pure) → act, with status written once, only when it
//! changed. A folder per controller ([`sandbox`], [`snapshot`]); what both need is beside them.

pub mod cache;
pub mod conditions;
pub mod nodeloss;
pub mod noderoot;
pub mod placement;
pub mod pod;
pub mod podstate;
pub mod pool;
pub mod reasons;
pub mod restore;
pub mod sandbox;
#[cfg(test)]
mod scenarios;
pub mod security;
pub mod selection;
pub mod service;
pub mod snapshot;
pub mod sources;
pub mod sweep;
pub mod template;
pub mod validate;
pub mod watch;
pub mod workspace;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use rand::Rng;
use tracing::{Instrument, debug, error, info, warn};

use crate::config::Config;
use crate::metrics::{GuardOp, GuardOutcome, Metrics};
use crate::snapshot::store::Store;
use agentbox_api::crd::{Sandbox, SandboxPhase, SandboxPool, SandboxSnapshot, SandboxTemplate};
use agentbox_api::guard::{self, Guard, GuardConfig, GuardError};
use agentbox_api::labels;

/// Field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "agentbox-operator";

/// Shared state of the reconcilers.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// Operator configuration.
    pub config: Config,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Publishes Events as the operator; one recorder, so repeats of an Event become a series.
    pub recorder: Recorder,
    /// The snapshot store; `None` when snapshots are off or the store could not be built.
    pub store: Option<Store>,
    /// What the helper found on each node's workspace directory of each namespace.
    pub node_roots: noderoot::Checks,
    /// Permanent restore refusals this process made, by sandbox (beside `status.restoreRefusal`).
    pub refusals: restore::Refusals,
    /// Workspace directories of deleted sandboxes, left to the sweep.
    pub sweep: sweep::Hints,
    /// The pods the operator manages (label `app.kubernetes.io/managed-by: agentbox`), as its
    /// watch last saw them: where a sandbox's pod not named in its status is found, without a
    /// LIST on each reconcile.
    pub pods: reflector::Store<Pod>,
    /// Open shells in warm pods, kept by the pools for the claims.
    pub shells: pool::shells::Shells,
    /// When each pool last lost a warm pod to a claim of this process (its refill waits).
    pub pool_claims: pool::quiet::Claims,
    /// The watch caches a first start reads instead of the API server ([`cache`]); `None`
    /// where no watch runs (the scenario tests): reads then go to the API server.
    pub cache: Option<cache::Caches>,
}

/// Reconcile errors. [`Error::is_permanent`] decides the retry pace.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused or failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An exec into the sandbox failed.
    #[error("exec: {0}")]
    Exec(#[from] agentbox_api::exec::ExecError),
    /// The finalizer helper failed (wraps the inner error).
    #[error("{0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),
    /// Workspace initialisation ran but failed.
    #[error("workspace initialisation: {0}")]
    Init(String),
    /// A ConfigMap or Secret a file, projection or environment variable needs is missing.
    #[error("{0}")]
    SourceMissing(String),
    /// A ConfigMap or Secret a file, projection or environment variable names has not been
    /// made readable by sandboxes (label `agentbox.dev/sandbox-readable: "true"`).
    #[error("{0}")]
    SourceNotReadable(String),
    /// Building the file archive failed.
    #[error("building the file archive: {0}")]
    Archive(#[from] std::io::Error),
    /// The workspace cleanup pod failed.
    #[error("{0}")]
    Cleanup(String),
    /// Work on a node needs the helper image, and the operator has none.
    #[error("{0}")]
    NoHelper(String),
    /// The workspace was lost with nothing to restore, and `snapshot.whenLost` is `Fail`.
    #[error("{0}")]
    WorkspaceLost(String),
    /// A namespaced object without a namespace.
    #[error("object has no namespace")]
    NotNamespaced,
    /// A status write waited for the reconcile's metadata write (finalizer and scope
    /// labels), which failed: the reconcile returns that write's own error instead.
    #[error("the Sandbox's finalizer and scope labels were not written")]
    MetadataNotWritten,
    /// A write did not finish in time.
    #[error("a write to the API server did not finish within {}s", .0.as_secs())]
    Timeout(Duration),
    /// The watch of managed pods has not listed them yet: a sandbox's pod not named in its
    /// status cannot be looked for, so nothing is made or adopted until it has.
    #[error("the watch of the operator's pods has not synced within {}s", .0.as_secs())]
    PodCacheNotSynced(Duration),
    /// A watch cache ([`cache`]) has not listed its objects yet: what it holds is not read
    /// until it has.
    #[error("the watch of {0} has not synced within {secs}s", secs = .1.as_secs())]
    CacheNotSynced(&'static str, Duration),
    /// Taking or storing a snapshot failed.
    #[error("snapshot: {0}")]
    Snapshot(#[source] crate::snapshot::SnapshotError),
    /// The scope's guard could not be taken or was lost.
    #[error("guard: {0}")]
    Guard(#[source] agentbox_api::guard::GuardError),
    /// Restoring a workspace from a snapshot failed; the workspace is as it was.
    #[error("restore refused or failed ({reason}): {message}")]
    Restore {
        /// The WorkspaceReady condition's reason; says whether the failure is permanent.
        reason: reasons::RestoreReason,
        /// What happened.
        message: String,
        /// Set when the refusal is permanent: recorded on the Sandbox so the restore is not
        /// attempted again until what it was judged against changes.
        refusal: Option<Box<agentbox_api::crd::RestoreRefusal>>,
    },
}

impl Error {
    /// The error inside the finalizer helper's wrapping, or this one.
    pub fn root(&self) -> &Error {
        match self {
            Error::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.root(),
                _ => self,
            },
            _ => self,
        }
    }

    /// A short kind for metrics.
    pub fn kind(&self) -> &'static str {
        match self.root() {
            Error::Kube(_) => "kube",
            Error::Exec(_) => "exec",
            Error::Finalizer(_) => "finalizer",
            Error::Init(_) => "init",
            Error::SourceMissing(_) => "source_missing",
            Error::SourceNotReadable(_) => "source_not_readable",
            Error::Archive(_) => "archive",
            Error::Cleanup(_) => "cleanup",
            Error::NoHelper(_) => "no_helper",
            Error::WorkspaceLost(_) => "workspace_lost",
            Error::NotNamespaced => "not_namespaced",
            Error::MetadataNotWritten => "metadata_not_written",
            Error::Timeout(_) => "timeout",
            Error::PodCacheNotSynced(_) => "pod_cache_not_synced",
            Error::CacheNotSynced(..) => "cache_not_synced",
            Error::Snapshot(_) => "snapshot",
            Error::Guard(_) => "guard",
            Error::Restore { .. } => "restore",
        }
    }

    /// The permanent restore refusal this error records, if it is one.
    pub fn restore_refusal(&self) -> Option<&agentbox_api::crd::RestoreRefusal> {
        match self.root() {
            Error::Restore {
                refusal: Some(r), ..
            } => Some(r),
            _ => None,
        }
    }

    /// The reason a workspace initialisation that failed with this error gives.
    pub fn workspace_reason(&self) -> reasons::WorkspaceReason {
        use reasons::WorkspaceReason as W;
        match self {
            Error::SourceMissing(_) => W::SourceMissing,
            Error::SourceNotReadable(_) => W::SourceNotReadable,
            Error::Exec(_) => W::ExecFailed,
            Error::Restore { reason, .. } => W::Restore(*reason),
            Error::WorkspaceLost(_) => W::WorkspaceLost,
            _ => W::InitFailed,
        }
    }

    /// Condition reason and message for a failed workspace initialisation.
    pub fn reason_and_message(&self) -> (&'static str, String) {
        (self.workspace_reason().as_str(), self.to_string())
    }

    /// Errors that will not go away by retrying soon (they wait for a spec or source change,
    /// polled slowly).
    pub fn is_permanent(&self) -> bool {
        match self.root() {
            Error::Exec(e) => !e.is_transient(),
            Error::NotNamespaced | Error::NoHelper(_) | Error::WorkspaceLost(_) => true,
            Error::Restore { reason, .. } => reason.is_permanent(),
            _ => false,
        }
    }
}

/// Retry pace after a failed reconcile: backoff with jitter for transient errors, a slow poll
/// (`permanent`, `--permanent-retry-seconds`) for permanent ones.
pub fn retry_after(err: &Error, jitter: f64, permanent: Duration) -> Duration {
    let base = match err.root() {
        // Waits for someone to create or label an object (no watch on those): a slow poll.
        Error::SourceMissing(_) | Error::SourceNotReadable(_) => 30.0,
        Error::Restore {
            reason: reasons::RestoreReason::SnapshotNotFound,
            ..
        } => 30.0,
        e if e.is_permanent() => permanent.as_secs_f64().max(1.0),
        _ => 5.0,
    };
    Duration::from_secs_f64(base * (1.0 + jitter.clamp(0.0, 1.0) * 0.5))
}

/// The requeue after a failed reconcile, at [`retry_after`]'s pace with fresh jitter.
fn retry(err: &Error, ctx: &Context) -> Action {
    Action::requeue(retry_after(
        err,
        rand::rng().random(),
        Duration::from_secs(ctx.config.permanent_retry_seconds),
    ))
}

// The failure itself is logged inside the reconcile's span (see `traced`).
fn error_policy(_sbx: Arc<Sandbox>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed("sandbox", err.kind());
    retry(err, &ctx)
}

/// An `Api` over the operator's namespace, or every namespace when it watches all.
fn scoped<K>(client: &Client, namespace: &str) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    if namespace.is_empty() {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), namespace)
    }
}

/// The snapshot store the configuration names; `None` when there is none or it is unusable
/// (snapshots are then off, and say so).
fn build_store(config: &Config) -> Option<Store> {
    match config.store().map(|c| Store::new(&c)) {
        None => {
            info!("no snapshot store configured: snapshots are off");
            None
        }
        Some(Ok(s)) => {
            info!(store = %s, "snapshot store ready");
            Some(s)
        }
        Some(Err(e)) => {
            error!("snapshot store unusable, snapshots are off: {e}");
            None
        }
    }
}

/// Runs the sandbox and snapshot controllers until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let store = build_store(&config);
    if config.helper_image.trim().is_empty() {
        warn!(
            "no helper image (--helper-image): workspaces of deleted sandboxes cannot be removed, namespace directories are not closed or checked, and non-root sandboxes are refused"
        );
    }
    let (pods, pods_writer) = reflector::store();
    let (caches, writers) = cache::Caches::new();
    let ctx = Arc::new(Context {
        client: client.clone(),
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "agentbox-operator".into(),
                instance: Some(config.identity.clone()),
            },
        ),
        config,
        metrics,
        store,
        node_roots: noderoot::Checks::default(),
        refusals: restore::Refusals::default(),
        sweep: sweep::Hints::default(),
        shells: pool::shells::Shells::default(),
        pool_claims: pool::quiet::Claims::default(),
        pods,
        cache: Some(caches),
    });
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    futures::join!(
        run_sandboxes(ctx.clone(), (pods_writer, writers), shutdown.clone()),
        run_snapshots(ctx.clone(), shutdown.clone()),
        run_pools(ctx.clone(), shutdown.clone()),
        sweep::run(ctx, shutdown)
    );
    info!("sandbox controller stopped");
}

/// Runs one reconcile of `obj` in a span that carries a reconcile id of its own and the
/// object's namespace, name (`object`) and generation, so every log line of it (JSON logs included) says
/// which reconcile and object it belongs to; records how long it took and logs its failure
/// inside that span.
async fn traced<K, F>(
    controller: &'static str,
    obj: Arc<K>,
    ctx: Arc<Context>,
    reconcile: impl FnOnce(Arc<K>, Arc<Context>) -> F,
) -> Result<Action, Error>
where
    K: kube::Resource,
    F: std::future::Future<Output = Result<Action, Error>>,
{
    let meta = obj.meta();
    let span = tracing::info_span!(
        "reconcile",
        controller,
        reconcile_id = %format!("{:016x}", rand::random::<u64>()),
        namespace = meta.namespace.as_deref().unwrap_or_default(),
        // Not `name`: JSON logs write the span's own name under that key.
        object = meta.name.as_deref().unwrap_or_default(),
        generation = meta.generation.unwrap_or_default(),
    );
    let metrics = ctx.metrics.clone();
    async move {
        let start = Instant::now();
        let out = reconcile(obj, ctx).await;
        metrics.reconciled(controller, start.elapsed());
        if let Err(e) = &out {
            warn!("{controller} reconcile failed: {e}");
        }
        out
    }
    .instrument(span)
    .await
}

/// The phase a sandbox counts under in `agentbox_sandboxes`: Terminating once deleted, Pending
/// before its first status.
fn counted_phase(sbx: &Sandbox) -> SandboxPhase {
    if sbx.metadata.deletion_timestamp.is_some() {
        return SandboxPhase::Terminating;
    }
    sbx.status
        .as_ref()
        .and_then(|s| s.phase)
        .unwrap_or(SandboxPhase::Pending)
}

/// Takes the scope's guard for `op`, waiting up to [`GUARD_WAIT`], and records the wait.
pub(crate) async fn scope_guard(
    ctx: &Context,
    ns: &str,
    scope: &agentbox_api::crd::Scope,
    op: GuardOp,
) -> Result<Guard, GuardError> {
    let gcfg = GuardConfig {
        holder: format!("{}/{}", ctx.config.identity, op.as_str()),
        ..GuardConfig::default()
    };
    let started = Instant::now();
    let got = guard::acquire_scope(ctx.client.clone(), ns, scope, &gcfg, Some(GUARD_WAIT)).await;
    let outcome = match &got {
        Ok(_) => GuardOutcome::Acquired,
        Err(GuardError::Timeout { .. }) => GuardOutcome::Busy,
        Err(_) => GuardOutcome::Error,
    };
    ctx.metrics.guard_waited(op, outcome, started.elapsed());
    got
}

/// The hold of the scope's guard that a harness handed over in `spec.lifecycle.guard`, when it
/// still stands (the Lease held by that holder with that token); `None` when there is none or
/// it no longer stands (the operator then takes the guard itself).
pub(crate) async fn handed_off_hold(
    ctx: &Context,
    sbx: &Sandbox,
) -> Result<Option<(agentbox_api::crd::GuardHold, guard::HandOff)>, Error> {
    let Some(hold) = sbx.spec.lifecycle.guard.clone() else {
        return Ok(None);
    };
    let ns = sbx.namespace().ok_or(Error::NotNamespaced)?;
    let lease = labels::lease_name(&labels::scope_key(&sbx.spec.scope));
    let h = guard::HandOff::new(
        Api::namespaced(ctx.client.clone(), &ns),
        &lease,
        &hold.holder,
        hold.token,
    );
    match h.check().await {
        Ok(()) => Ok(Some((hold, h))),
        Err(GuardError::NotHeld { seen, .. }) => {
            debug!(sandbox = %sbx.name_any(), "the handed-over guard hold no longer stands ({seen}); the operator takes the guard itself");
            Ok(None)
        }
        Err(e) => Err(Error::Guard(e)),
    }
}

/// How long the operator waits for a scope's guard (a snapshot or a restore) before trying
/// again later.
pub const GUARD_WAIT: Duration = Duration::from_secs(60);

/// The snapshot controller.
async fn run_snapshots(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    info!("snapshot controller starting");
    let snapshots: Api<SandboxSnapshot> = scoped(&ctx.client, &ctx.config.namespace);
    Controller::new(snapshots, watcher::Config::default())
        // Uploads hold a few multipart parts in memory each: bound how many run at once.
        .with_config(ControllerConfig::default().concurrency(4))
        .trigger_backoff(watch::TriggerBackoff::default())
        .graceful_shutdown_on(shutdown)
        .run(
            |snap, ctx| traced("snapshot", snap, ctx, snapshot::reconcile),
            snapshot_error_policy,
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
    info!("snapshot controller stopped");
}

/// The sandbox controller: Sandboxes, the pods and policies they own, and the scope Leases
/// whose holder their Guarded condition shows.
async fn run_sandboxes(
    ctx: Arc<Context>,
    (pods, writers): (reflector::store::Writer<Pod>, cache::Writers),
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    info!("sandbox controller starting");
    let ns = ctx.config.namespace.clone();
    let owned =
        watcher::Config::default().labels(&format!("{}={}", labels::MANAGED_BY, labels::MANAGER));
    let controller = Controller::new(
        scoped::<Sandbox>(&ctx.client, &ns),
        watcher::Config::default(),
    );
    // A scope's guard Lease changing holder updates the Guarded condition of the sandboxes of
    // that scope (renewals keep the holder, so they cost no status write).
    let sandbox_store = controller.store();
    let counted = controller.store();
    ctx.metrics.count_phases_from(Box::new(move || {
        counted.state().iter().map(|s| counted_phase(s)).collect()
    }));
    let guard_to_sandboxes = move |lease: Lease| {
        let key = lease.labels().get(labels::SCOPE_KEY).cloned();
        let ns = lease.namespace();
        sandbox_store
            .state()
            .into_iter()
            .filter(|s| {
                key.is_some()
                    && s.labels().get(labels::SCOPE_KEY) == key.as_ref()
                    && s.namespace() == ns
            })
            .map(|s| ObjectRef::from_obj(s.as_ref()))
            .collect::<Vec<_>>()
    };
    // A template created or edited brings back the sandboxes that name it (one waiting for
    // it starts; the others keep their pods, see `template`).
    let template_store = controller.store();
    let template_to_sandboxes = move |t: SandboxTemplate| {
        let (name, ns) = (t.name_any(), t.namespace());
        template_store
            .state()
            .into_iter()
            .filter(|s| {
                s.namespace() == ns && s.spec.template_ref.as_ref().is_some_and(|r| r.name == name)
            })
            .map(|s| ObjectRef::from_obj(s.as_ref()))
            .collect::<Vec<_>>()
    };
    // A snapshot created, changed or deleted brings back the sandboxes whose start it may
    // decide (see `sandbox::snapshot_concerns`), so that a refused restore is judged again at
    // once, not at the next slow poll.
    let snapshot_store = controller.store();
    let snapshot_to_sandboxes = move |snap: SandboxSnapshot| {
        let (name, ns) = (snap.name_any(), snap.namespace());
        let key = snap
            .labels()
            .get(labels::SCOPE_KEY)
            .cloned()
            .or_else(|| snap.status.as_ref().and_then(|s| s.scope_key.clone()));
        snapshot_store
            .state()
            .into_iter()
            .filter(|s| s.namespace() == ns && sandbox::snapshot_concerns(s, &name, key.as_deref()))
            .map(|s| ObjectRef::from_obj(s.as_ref()))
            .collect::<Vec<_>>()
    };
    // A pod of a Sandbox that is gone already, seen being deleted (the garbage collector
    // after a Sandbox deleted before its finalizer was on: see `sandbox::reconcile`), leaves
    // its directory to the sweep, once per pod.
    let orphans = controller.store();
    let orphan_ctx = ctx.clone();
    let on_pod = move |p: &Pod| {
        if sandbox::orphan_hint(&orphan_ctx, p, &orphans) {
            debug!(pod = %p.name_any(), "a deleted sandbox's pod is going: its directory is left to the sweep");
        }
    };
    // The templates, snapshots, policies and Leases come from the watch caches the first
    // start reads ([`cache`]); the same watches wake the sandboxes.
    let cache::Writers {
        templates,
        leases,
        policies,
        snapshots,
    } = writers;
    let wc = watcher::Config::default;
    controller
        .watches_stream(
            cache::reflect(scoped::<SandboxTemplate>(&ctx.client, &ns), wc(), templates),
            template_to_sandboxes,
        )
        .watches_stream(
            cache::reflect(scoped::<SandboxSnapshot>(&ctx.client, &ns), wc(), snapshots),
            snapshot_to_sandboxes,
        )
        .owns_stream(
            managed_pods(&ctx, &ns, owned.clone(), pods).inspect(move |p| {
                if let Ok(p) = p {
                    on_pod(p);
                }
            }),
        )
        .owns_stream(cache::reflect(
            scoped::<NetworkPolicy>(&ctx.client, &ns),
            owned.clone(),
            policies,
        ))
        .watches_stream(
            cache::reflect(scoped::<Lease>(&ctx.client, &ns), owned, leases),
            guard_to_sandboxes,
        )
        .trigger_backoff(watch::TriggerBackoff::default())
        .graceful_shutdown_on(shutdown)
        .run(
            |sbx, ctx| traced("sandbox", sbx, ctx, sandbox::reconcile),
            error_policy,
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// The watch of the pods the operator manages, kept in `store` (the [`Context::pods`] cache):
/// it wakes the sandboxes that own them, and lets a reconcile find a sandbox's pod (or a warm
/// one) without a LIST. Managed fields are dropped: nothing reads them, and they are most of a
/// pod's size.
fn managed_pods(
    ctx: &Context,
    ns: &str,
    wc: watcher::Config,
    store: reflector::store::Writer<Pod>,
) -> impl futures::Stream<Item = Result<Pod, watcher::Error>> + Send + 'static {
    let pods = watcher(scoped::<Pod>(&ctx.client, ns), wc)
        .backoff(watch::TriggerBackoff::default())
        .modify(|p| p.managed_fields_mut().clear());
    reflector::reflector(store, pods).touched_objects()
}

/// The pool controller: SandboxPools, their pods (by the pool label: a claimed pod keeps it,
/// so a claim brings its pool back to refill) and the templates they name.
async fn run_pools(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    info!("pool controller starting");
    let ns = ctx.config.namespace.clone();
    let controller = Controller::new(
        scoped::<SandboxPool>(&ctx.client, &ns),
        watcher::Config::default(),
    );
    let pod_store = controller.store();
    let hinted = Arc::new(std::sync::Mutex::new(
        std::collections::HashSet::<String>::new(),
    ));
    let hint_ctx = ctx.clone();
    let pod_to_pools = move |p: Pod| {
        // A warm pod being deleted (by its pool, by hand, or with its pool) leaves its
        // directory to the sweep, once per pod.
        if pool::is_deleting_warm_pod(&p) {
            let first = p.uid().is_some_and(|uid| {
                hinted.lock().is_ok_and(|mut seen| {
                    if seen.len() > 10_000 {
                        seen.clear();
                    }
                    seen.insert(uid)
                })
            });
            if first {
                pool::hint_removal(&hint_ctx, &p);
            }
        }
        pool::pools_of_pod(&p, pod_store.state().iter())
    };
    let counted = controller.store();
    ctx.metrics.count_pools_from(Box::new(move || {
        counted
            .state()
            .iter()
            .map(|p| {
                let st = p.status.clone().unwrap_or_default();
                let l = crate::metrics::PoolLabels {
                    namespace: p.namespace().unwrap_or_default(),
                    pool: p.name_any(),
                };
                (l, st.replicas, st.ready_replicas)
            })
            .collect()
    }));
    let template_store = controller.store();
    let template_to_pools =
        move |t: SandboxTemplate| pool::pools_of_template(&t, template_store.state().iter());
    controller
        .watches(
            scoped::<Pod>(&ctx.client, &ns),
            watcher::Config::default().labels(labels::POOL),
            pod_to_pools,
        )
        .watches(
            scoped::<SandboxTemplate>(&ctx.client, &ns),
            watcher::Config::default(),
            template_to_pools,
        )
        .trigger_backoff(watch::TriggerBackoff::default())
        .graceful_shutdown_on(shutdown)
        .run(
            |p, ctx| traced("pool", p, ctx, pool::reconcile),
            pool_error_policy,
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
    info!("pool controller stopped");
}

fn pool_error_policy(_pool: Arc<SandboxPool>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed("pool", err.kind());
    retry(err, &ctx)
}

fn snapshot_error_policy(_snap: Arc<SandboxSnapshot>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failed("snapshot", err.kind());
    retry(err, &ctx)
}

/// Server-side applies an object's whole status with the operator's field manager, so fields
/// it stops setting are removed.
pub(crate) async fn apply_status<K>(
    api: &Api<K>,
    name: &str,
    status: &impl serde::Serialize,
) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    apply_status_as(api, name, status, FIELD_MANAGER).await
}

/// Server-side applies the status fields in `status` with field manager `manager`.
pub(crate) async fn apply_status_as<K>(
    api: &Api<K>,
    name: &str,
    status: &impl serde::Serialize,
    manager: &str,
) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let body = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(
        name,
        &kube::api::PatchParams::apply(manager).force(),
        &kube::api::Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

/// Publishes an Event about `obj`. Best effort: a failed Event is logged, never fatal.
pub(crate) async fn publish<K>(
    ctx: &Context,
    obj: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) where
    K: kube::Resource<DynamicType = ()>,
{
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &obj.object_ref(&())).await {
        warn!(object = %obj.name_any(), "could not publish event {reason}: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SLOW: Duration = Duration::from_secs(300);

    #[test]
    fn retry_pace() {
        assert_eq!(
            retry_after(&Error::Init("x".into()), 0.0, SLOW),
            Duration::from_secs(5)
        );
        assert!(retry_after(&Error::Init("x".into()), 1.0, SLOW) <= Duration::from_secs_f64(7.5));
        assert_eq!(
            retry_after(&Error::NotNamespaced, 0.0, SLOW),
            Duration::from_secs(300)
        );
        assert_eq!(
            retry_after(&Error::SourceMissing("cm".into()), 0.0, SLOW),
            Duration::from_secs(30)
        );
        assert_eq!(
            retry_after(&Error::SourceNotReadable("secret".into()), 0.0, SLOW),
            Duration::from_secs(30)
        );
        use reasons::RestoreReason::*;
        let refused = |reason| Error::Restore {
            reason,
            message: String::new(),
            refusal: None,
        };
        assert_eq!(
            retry_after(&refused(CrossScopeRestore), 0.0, SLOW),
            Duration::from_secs(300),
            "waits for a change"
        );
        assert_eq!(
            retry_after(&refused(SnapshotNotReady), 0.0, SLOW),
            Duration::from_secs(5)
        );
        let short = Duration::from_secs(20);
        assert_eq!(
            retry_after(&refused(CrossScopeRestore), 0.0, short),
            short,
            "the permanent pace is --permanent-retry-seconds"
        );
        assert_eq!(
            retry_after(&Error::Init("x".into()), 0.0, short),
            Duration::from_secs(5),
            "transient errors keep their backoff"
        );
    }
}
