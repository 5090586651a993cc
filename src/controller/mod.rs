//! Controllers: observe → decide (pure) → act, with status written once, only when it
//! changed. A folder per controller ([`sandbox`], [`snapshot`]); what both need is beside them.

pub mod cache;
pub mod conditions;
pub mod context;
pub mod credential;
pub mod credential_status;
pub mod domain_egress;
pub mod effective;
pub mod error;
pub mod exec_pod;
pub mod helper_pod;
pub mod memos;
pub mod netcheck;
pub mod nodeloss;
pub mod noderoot;
pub mod oomkill;
pub mod paged;
pub mod pids;
pub mod placement;
pub mod pod;
pub mod podstate;
pub mod policy;
pub mod pool;
pub mod proxy;
pub mod proxy_address;
pub mod reasons;
pub mod refill_delay;
pub mod restore_source;
pub mod runtime;
pub mod sandbox;
pub mod security;
#[cfg(test)]
mod shape;
pub mod sizelimit;
pub mod snapshot;
pub mod startup;
pub mod sweep;
pub mod validate;
pub mod warm_shells;
pub mod watch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use rand::Rng;
use tracing::{Instrument, error, info, warn};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::snapshot::store::Store;
use agentbox_api::crd::{Sandbox, SandboxPhase, SandboxPool, SandboxSnapshot, SandboxTemplate};
use agentbox_api::labels;
use context::{Context, Error, retry_after};

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

/// The operator's context: the API client, the Event recorder, the configuration, the
/// metrics and store, the in-process memos and the pod cache's reader.
fn context(
    client: Client,
    config: Config,
    metrics: Arc<Metrics>,
    pods: reflector::Store<Pod>,
    caches: cache::Caches,
) -> Context {
    let reporter = Reporter {
        controller: "agentbox-operator".into(),
        instance: Some(config.identity.clone()),
    };
    Context {
        client: client.clone(),
        recorder: Recorder::new(client, reporter),
        store: build_store(&config),
        config,
        metrics,
        node_roots: memos::Checks::default(),
        refusals: memos::Refusals::default(),
        oom_kills: memos::OomKills::default(),
        usage_reads: memos::Reads::default(),
        sweep: memos::Hints::default(),
        shells: warm_shells::Shells::default(),
        pool_claims: refill_delay::Claims::default(),
        proofs: crate::controller::netcheck::Proofs::default(),
        pods,
        cache: Some(caches),
    }
}

/// Runs the sandbox and snapshot controllers until `shutdown` resolves.
pub async fn run(
    client: Client,
    config: Config,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    if config.helper_image.trim().is_empty() {
        warn!(
            "no helper image (--helper-image): workspaces of deleted sandboxes cannot be removed, namespace directories are not closed or checked, and non-root sandboxes are refused"
        );
    }
    let (pods, pods_writer) = reflector::store();
    let (caches, writers) = cache::Caches::new();
    let ctx = Arc::new(context(client, config, metrics, pods, caches));
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    futures::join!(
        run_sandboxes(ctx.clone(), pods_writer, writers, shutdown.clone()),
        run_snapshots(ctx.clone(), shutdown.clone()),
        run_pools(ctx.clone(), shutdown.clone()),
        run_proxy_feed(ctx.clone(), shutdown.clone()),
        sweep::run(ctx, shutdown)
    );
    info!("sandbox controller stopped");
}

/// Feeds the egress proxy its routes (see [`proxy`]), when there is one.
async fn run_proxy_feed(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let Some(p) = ctx.config.egress_proxy() else {
        return;
    };
    let templates = match ctx.cache.as_ref() {
        Some(c) => c.templates.clone(),
        None => reflector::store().0,
    };
    proxy::run(
        ctx.client.clone(),
        scoped(&ctx.client, &ctx.config.namespace),
        scoped(&ctx.client, &ctx.config.namespace),
        templates,
        p,
        ctx.config.default_egress(),
        credential_status::Reporter::new(ctx.clone()),
        shutdown,
    )
    .await;
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
    pods: reflector::store::Writer<Pod>,
    writers: cache::Writers,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    info!("sandbox controller starting");
    let first_starts = Arc::new(sandbox::first_start::FirstStarts::default());
    let first_pass = Arc::new(startup::FirstPass::new(Instant::now()));
    let (reader, writer) = reflector::store();
    let (listed_tx, listed) = tokio::sync::watch::channel(false);
    let events = watcher(
        scoped::<Sandbox>(&ctx.client, &ctx.config.namespace),
        watcher::Config::default(),
    )
    .backoff(watch::TriggerBackoff::default())
    .modify(cache::slim);
    let run_first = first_start_run(ctx.clone(), first_pass.clone());
    let sandboxes = reflector::reflector(writer, events);
    let sandboxes =
        sandbox::first_start::offered(sandboxes, listed_tx, first_starts.clone(), run_first);
    // Reconciles run `--reconcile-concurrency` at a time: a leader that starts with thousands
    // of Sandboxes listed reconciles them in bounded batches instead of all at once, each
    // with its reads and connections in flight (docs/operations.md, "Memory").
    let controller = Controller::for_stream(sandboxes, reader)
        .with_config(ControllerConfig::default().concurrency(ctx.config.reconcile_concurrency));
    let (pass, store) = (first_pass.clone(), controller.store());
    tokio::spawn(watch_first_pass(pass, store, listed, ctx.metrics.clone()));
    let counted = controller.store();
    ctx.metrics.count_phases_from(Box::new(move || {
        counted.state().iter().map(|s| counted_phase(s)).collect()
    }));
    sandbox_watches(controller, &ctx, pods, writers)
        .trigger_backoff(watch::TriggerBackoff::default())
        .graceful_shutdown_on(shutdown)
        .run(
            move |sbx, ctx| {
                let (starts, pass) = (first_starts.clone(), first_pass.clone());
                async move {
                    let uid = sbx.uid().unwrap_or_default();
                    let work = traced("sandbox", sbx, ctx, sandbox::reconcile);
                    let out = starts.serialised(&uid, work).await;
                    if out.is_ok() {
                        pass.reconciled(&uid);
                    }
                    out
                }
            },
            error_policy,
            ctx,
        )
        .for_each(|_| futures::future::ready(()))
        .await;
}

/// A first start's reconcile, run ahead of the controller's queue
/// ([`sandbox::first_start::offered`]). The controller's reconcile of the same event follows
/// it and retries a failure (at once, or after the short requeue of a version this one wrote
/// over); the failure is counted here as the controller counts its own.
fn first_start_run(
    ctx: Arc<Context>,
    pass: Arc<startup::FirstPass>,
) -> impl Fn(Arc<Sandbox>) -> futures::future::BoxFuture<'static, ()> + Send + 'static {
    move |sbx: Arc<Sandbox>| {
        let (ctx, pass) = (ctx.clone(), pass.clone());
        Box::pin(async move {
            let metrics = ctx.metrics.clone();
            let uid = sbx.uid().unwrap_or_default();
            match traced("sandbox", sbx, ctx, sandbox::reconcile).await {
                Ok(_) => pass.reconciled(&uid),
                Err(e) => metrics.failed("sandbox", e.kind()),
            }
        })
    }
}

/// What wakes a sandbox besides its own watch: its template, the snapshots of its scope, its
/// pods (whose watch fills the [`Context::pods`] cache), its policy, and its scope's guard
/// Lease. The templates, snapshots, policies and Leases come from the watch caches the first
/// start reads ([`cache`]).
fn sandbox_watches(
    controller: Controller<Sandbox>,
    ctx: &Arc<Context>,
    pods: reflector::store::Writer<Pod>,
    writers: cache::Writers,
) -> Controller<Sandbox> {
    use sandbox::triggers;
    let ns = ctx.config.namespace.clone();
    let owned =
        watcher::Config::default().labels(&format!("{}={}", labels::MANAGED_BY, labels::MANAGER));
    let (by_template, by_snapshot, by_scope) = (
        triggers::by_template(controller.store()),
        triggers::by_snapshot(controller.store()),
        triggers::by_scope(controller.store()),
    );
    let (orphans, pod_ctx) = (controller.store(), ctx.clone());
    let on_pod = move |p: &Pod| sandbox::orphan::on_pod(&pod_ctx, p, &orphans);
    let cache::Writers {
        templates,
        leases,
        policies,
        snapshots,
    } = writers;
    let wc = watcher::Config::default;
    let client = &ctx.client;
    controller
        .watches_stream(
            cache::reflect(scoped::<SandboxTemplate>(client, &ns), wc(), templates),
            by_template,
        )
        .watches_stream(
            cache::reflect(scoped::<SandboxSnapshot>(client, &ns), wc(), snapshots),
            by_snapshot,
        )
        .owns_stream(
            managed_pods(ctx, &ns, owned.clone(), pods).inspect(move |p| {
                if let Ok(p) = p {
                    on_pod(p);
                }
            }),
        )
        .owns_stream(cache::reflect(
            scoped::<NetworkPolicy>(client, &ns),
            owned,
            policies,
        ))
        .watches_stream(
            cache::reflect(scoped::<Lease>(client, &ns), guard_leases(), leases),
            by_scope,
        )
}

/// The watch of the scopes' guard Leases: every Lease that carries a scope key
/// (`agentbox.dev/scope-key`), whoever made it. A harness on the plain API that takes a
/// scope's guard by its documented name and scope-key label holds off the operator's
/// snapshots (they read the Lease by name), so the `Guarded` condition must see it too: a
/// selector on the operator's own `managed-by` label would hide it. A read then finds the
/// scope's Lease by its name ([`labels::lease_name`]).
fn guard_leases() -> watcher::Config {
    watcher::Config::default().labels(labels::SCOPE_KEY)
}

/// Follows this process's first pass over the Sandboxes (see [`startup`]) until it is
/// complete: the gauge of those left, then the time it took, in the metrics and the log.
/// It starts once `listed` says the first listing is in `store`. (Not by the store's own
/// `wait_until_ready`: that wakes only one of its waiters, and the controller's queue waits
/// on it too.)
async fn watch_first_pass(
    pass: Arc<startup::FirstPass>,
    store: reflector::Store<Sandbox>,
    mut listed: tokio::sync::watch::Receiver<bool>,
    metrics: Arc<Metrics>,
) {
    if listed.wait_for(|l| *l).await.is_err() {
        return; // the watch stopped before it listed: the controller is stopping
    }
    loop {
        let cached = store.state();
        let uids = cached.iter().filter_map(|s| s.metadata.uid.as_deref());
        let (pending, done) = pass.check(uids, Instant::now());
        drop(cached);
        metrics.startup(pending, done);
        if let Some(took) = done {
            info!(
                seconds = took.as_secs_f64(),
                "first pass complete: every Sandbox listed at the start has been reconciled"
            );
            return;
        }
        tokio::time::sleep(startup::CHECK_EVERY).await;
    }
}

/// The watch of the pods the operator manages, kept in `store` (the [`Context::pods`] cache):
/// it wakes the sandboxes that own them, and lets a reconcile find a sandbox's pod (or a warm
/// one) without a LIST. Kept [`cache::slim`]: managed fields are most of a pod's size, and
/// nothing reads them.
fn managed_pods(
    ctx: &Context,
    ns: &str,
    wc: watcher::Config,
    store: reflector::store::Writer<Pod>,
) -> impl futures::Stream<Item = Result<Pod, watcher::Error>> + Send + 'static {
    let pods = watcher(scoped::<Pod>(&ctx.client, ns), wc)
        .backoff(watch::TriggerBackoff::default())
        .modify(cache::slim);
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
    let (pod_store, hint_ctx) = (controller.store(), ctx.clone());
    let pod_to_pools = move |p: Pod| pool::on_pod(&hint_ctx, &p, pod_store.state().iter());
    let counted = controller.store();
    ctx.metrics
        .count_pools_from(Box::new(move || pool::counts(counted.state().iter())));
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

#[cfg(test)]
mod first_pass_tests {
    use super::*;
    use kube::runtime::watcher::Event;

    fn sandbox(uid: &str) -> Sandbox {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": uid, "namespace": "team", "uid": uid},
            "spec": {"image": "busybox", "scope": {"kind": "Global"}},
        }))
        .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_pass_is_followed_until_every_listed_sandbox_is_reconciled() {
        let (reader, mut writer) = reflector::store::<Sandbox>();
        let pass = Arc::new(startup::FirstPass::new(Instant::now()));
        let metrics = Arc::new(Metrics::default());
        let (listed_tx, listed) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(watch_first_pass(
            pass.clone(),
            reader,
            listed,
            metrics.clone(),
        ));
        writer.apply_watcher_event(&Event::Init);
        writer.apply_watcher_event(&Event::InitApply(sandbox("a")));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            metrics
                .render()
                .contains("agentbox_startup_reconciled_seconds 0.0\n"),
            "not listed yet: not done"
        );
        writer.apply_watcher_event(&Event::InitApply(sandbox("b")));
        writer.apply_watcher_event(&Event::InitDone);
        listed_tx.send_replace(true);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let text = metrics.render();
        assert!(
            text.contains("agentbox_startup_pending_sandboxes 2\n"),
            "{text}"
        );
        pass.reconciled("a");
        pass.reconciled("b");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(task.is_finished(), "done once both are");
        let text = metrics.render();
        assert!(
            text.contains("agentbox_startup_pending_sandboxes 0\n"),
            "{text}"
        );
        assert!(
            !text.contains("agentbox_startup_reconciled_seconds 0.0\n"),
            "the time it took: {text}"
        );
    }
}
