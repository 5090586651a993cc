//! Prometheus metrics of the operator, all prefixed `agentbox_`: reconciles (counts, durations,
//! errors by kind), leadership, the operator's build, how long sandboxes take to become Ready
//! and by which start branch, sandboxes by phase, snapshot and restore bytes, durations and
//! failures by reason, the wait for scope guards, and the exec errors the operator saw.
//!
//! Label values are `&'static str` from closed sets (condition reasons, error kinds, branch
//! names), so no label can grow without bound.

use std::collections::BTreeSet;
use std::sync::RwLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Metric, Registry};

use agentbox_api::crd::{SandboxPhase, StartBranch};

/// Labels naming a controller.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `sandbox` or `snapshot`.
    pub controller: String,
}

/// Labels of a workspace limit's enforcement.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitModeLabels {
    /// `quota`, `measure` or `not_enforced`.
    mode: &'static str,
}

/// Labels naming a SandboxPool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    /// The pool's namespace.
    pub namespace: String,
    /// The pool's name.
    pub pool: String,
}

/// Labels of an error count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The controller.
    pub controller: String,
    /// The error's kind (see `controller::Error::kind`).
    pub kind: String,
}

/// Labels of a start that reached Ready.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StartLabels {
    /// [`branch_label`] of the start branch.
    branch: &'static str,
    /// How the pod was come by: `cold` (made for this start). Room for `warm` (a pooled pod).
    start: &'static str,
}

/// Labels of a claim try.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimLabels {
    /// [`ClaimResult::as_str`].
    result: &'static str,
}

/// Labels of a start count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StartKindLabels {
    /// [`COLD`] or [`WARM`].
    kind: &'static str,
}

/// What a try to claim a warm pod came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClaimResult {
    /// A warm pod was adopted.
    Claimed,
    /// No warm pod fitted: the start was cold.
    Miss,
    /// Every warm pod tried was taken by someone else first: the start was cold.
    Conflict,
}

impl ClaimResult {
    /// The `result` label.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimResult::Claimed => "claimed",
            ClaimResult::Miss => "miss",
            ClaimResult::Conflict => "conflict",
        }
    }
}

/// Labels of a sandbox count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

/// Labels of a failure count.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    /// The condition reason the failure was reported with.
    reason: &'static str,
}

/// Labels of a guard wait.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GuardLabels {
    /// What the guard was for ([`GuardOp`]).
    op: &'static str,
    /// `acquired`, `busy` (someone else kept it past the wait) or `error`.
    outcome: &'static str,
}

/// Labels of an exec error.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ExecLabels {
    /// What the exec was for ([`ExecOp`]).
    op: &'static str,
    /// The error's kind (see `exec::ExecError::kind`).
    kind: &'static str,
}

/// Labels of the build.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    git_commit: &'static str,
}

/// What the operator took a scope's guard for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardOp {
    /// Taking a snapshot.
    Snapshot,
    /// Restoring one.
    Restore,
    /// Suspending an idle sandbox (taken without waiting).
    IdleSuspend,
}

impl GuardOp {
    /// The label value (and the suffix of the guard's holder identity).
    pub fn as_str(self) -> &'static str {
        match self {
            GuardOp::Snapshot => "snapshot",
            GuardOp::Restore => "restore",
            GuardOp::IdleSuspend => "idle_suspend",
        }
    }
}

/// How a wait for a guard ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardOutcome {
    /// Taken.
    Acquired,
    /// Someone else kept it for the whole wait.
    Busy,
    /// The API server failed or refused.
    Error,
}

impl GuardOutcome {
    fn as_str(self) -> &'static str {
        match self {
            GuardOutcome::Acquired => "acquired",
            GuardOutcome::Busy => "busy",
            GuardOutcome::Error => "error",
        }
    }
}

/// What an exec of the operator's own was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExecOp {
    /// Initialising a workspace: the probe, a restore's extract and swap, the file writes.
    Workspace,
    /// The `tar -c` of a snapshot.
    Snapshot,
}

impl ExecOp {
    fn as_str(self) -> &'static str {
        match self {
            ExecOp::Workspace => "workspace",
            ExecOp::Snapshot => "snapshot",
        }
    }
}

/// The `branch` label of a start branch: `reattached` (A, the workspace was still there),
/// `recovered` (B, a lost workspace restored from a snapshot), `restored` (C, a fresh one
/// restored from a snapshot), `fresh` (D, initialised from the spec).
pub fn branch_label(b: StartBranch) -> &'static str {
    b.label()
}

/// The `start` label of a start whose pod was made for it.
pub const COLD: &str = "cold";
/// The `start` label of a start that adopted a pool's warm pod.
pub const WARM: &str = "warm";

/// The operator's git commit, set at build time (`AGENTBOX_GIT_COMMIT`), else `unknown`.
pub const GIT_COMMIT: &str = match option_env!("AGENTBOX_GIT_COMMIT") {
    Some(c) => c,
    None => "unknown",
};

/// Counts sandboxes by phase at scrape time (the sandbox controller's cache), so the gauge is
/// right however sandboxes come and go, and a reconcile never counts one twice.
pub type PhaseSource = Box<dyn Fn() -> Vec<SandboxPhase> + Send + Sync>;

/// Where the pool gauges come from at each scrape: each pool with its warm and ready pods.
pub type PoolSource = Box<dyn Fn() -> Vec<(PoolLabels, i32, i32)> + Send + Sync>;

/// Seconds, from 50 ms to about 14 min, doubling: starts, snapshots, restores, guard waits.
fn slow_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 15))
}

/// Seconds, from 1 ms to about 4 s, doubling: claims (a write or two).
fn fast_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 13))
}

/// The operator's metrics, registered once.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ControllerLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    durations: Family<ControllerLabels, Histogram>,
    /// 1 while this replica leads.
    pub leader: Gauge,
    ready: Family<StartLabels, Histogram>,
    starts: Family<StartKindLabels, Counter>,
    claims: Family<ClaimLabels, Counter>,
    claim_seconds: Histogram,
    phases: Family<PhaseLabels, Gauge>,
    phase_source: RwLock<Option<PhaseSource>>,
    snapshot_bytes: Counter,
    snapshot_seconds: Histogram,
    snapshot_failures: Family<ReasonLabels, Counter>,
    restore_bytes: Counter,
    restore_seconds: Histogram,
    restore_failures: Family<ReasonLabels, Counter>,
    guard_wait: Family<GuardLabels, Histogram>,
    exec_errors: Family<ExecLabels, Counter>,
    node_losses: Counter,
    idle_suspensions: Counter,
    over_limit_suspensions: Counter,
    workspace_used: Histogram,
    workspace_limit_modes: Family<LimitModeLabels, Counter>,
    workspaces_swept: Counter,
    sweep_failures: Counter,
    pool_replicas: Family<PoolLabels, Gauge>,
    pool_ready: Family<PoolLabels, Gauge>,
    pool_source: RwLock<Option<PoolSource>>,
    pool_created: Counter,
    pool_deleted: Counter,
    memory_rss: Gauge,
    memory_limit: Gauge,
    startup_pending: Gauge,
    startup_seconds: Gauge<f64, std::sync::atomic::AtomicU64>,
    names: BTreeSet<String>,
    catalogue: Vec<Described>,
}

/// The prefix of every metric.
const PREFIX: &str = "agentbox";

/// Registers metrics and records the sample names each one exposes.
struct Registrar {
    registry: Registry,
    names: BTreeSet<String>,
    catalogue: Vec<Described>,
}

impl Registrar {
    /// Registers `metric`; `labels` says which labels its series carry (and their values where
    /// the set is closed), for docs/operations.md's table.
    fn add(&mut self, name: &str, help: &str, labels: &'static str, metric: impl Metric) {
        let kind = metric.metric_type();
        let suffixes: &[&str] = match kind {
            MetricType::Counter => &["_total"],
            MetricType::Histogram => &["_bucket", "_sum", "_count"],
            MetricType::Gauge | MetricType::Info | MetricType::Unknown => &[""],
        };
        self.names
            .extend(suffixes.iter().map(|s| format!("{PREFIX}_{name}{s}")));
        let series = match kind {
            MetricType::Counter => format!("{PREFIX}_{name}_total"),
            _ => format!("{PREFIX}_{name}"),
        };
        self.catalogue.push(Described {
            series,
            kind: match kind {
                MetricType::Counter => "counter",
                MetricType::Histogram => "histogram",
                MetricType::Gauge => "gauge",
                MetricType::Info => "info",
                MetricType::Unknown => "unknown",
            },
            labels,
            help: help.to_string(),
        });
        self.registry.register(name, help, metric);
    }
}

/// One metric as docs/operations.md lists it (`cargo run --bin opsdoc`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    /// The series name a query uses (`agentbox_x_total` for a counter, the histogram's base
    /// name for a histogram).
    pub series: String,
    /// `counter`, `gauge`, `histogram`.
    pub kind: &'static str,
    /// Its labels, and their values where the set is closed.
    pub labels: &'static str,
    /// The `# HELP` text.
    pub help: String,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registrar {
            registry: Registry::with_prefix(PREFIX),
            names: BTreeSet::new(),
            catalogue: Vec::new(),
        };
        let m = Metrics {
            reconciles: Family::default(),
            errors: Family::default(),
            durations: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.005, 2.0, 14))
            }),
            leader: Gauge::default(),
            ready: Family::new_with_constructor(slow_buckets),
            starts: Family::default(),
            claims: Family::default(),
            claim_seconds: fast_buckets(),
            phases: Family::default(),
            phase_source: RwLock::new(None),
            snapshot_bytes: Counter::default(),
            snapshot_seconds: slow_buckets(),
            snapshot_failures: Family::default(),
            restore_bytes: Counter::default(),
            restore_seconds: slow_buckets(),
            restore_failures: Family::default(),
            guard_wait: Family::new_with_constructor(slow_buckets),
            exec_errors: Family::default(),
            node_losses: Counter::default(),
            idle_suspensions: Counter::default(),
            over_limit_suspensions: Counter::default(),
            // 1 MiB to 1 TiB.
            workspace_used: Histogram::new(exponential_buckets(f64::from(1u32 << 20), 4.0, 11)),
            workspace_limit_modes: Family::default(),
            workspaces_swept: Counter::default(),
            sweep_failures: Counter::default(),
            pool_replicas: Family::default(),
            pool_ready: Family::default(),
            pool_source: RwLock::new(None),
            pool_created: Counter::default(),
            pool_deleted: Counter::default(),
            memory_rss: Gauge::default(),
            memory_limit: Gauge::default(),
            startup_pending: Gauge::default(),
            startup_seconds: Gauge::default(),
            registry: Registry::default(),
            names: BTreeSet::new(),
            catalogue: Vec::new(),
        };
        r.add(
            "reconciles",
            "Reconciles run",
            "`controller`",
            m.reconciles.clone(),
        );
        r.add(
            "reconcile_errors",
            "Reconciles that failed, by error kind",
            "`controller`, `kind`",
            m.errors.clone(),
        );
        r.add(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            "`controller`",
            m.durations.clone(),
        );
        r.add(
            "leader",
            "Whether this replica is the leader",
            "",
            m.leader.clone(),
        );
        let build = Family::<BuildLabels, Gauge>::default();
        build
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                git_commit: GIT_COMMIT,
            })
            .set(1);
        r.add(
            "build_info",
            "The operator's version and commit",
            "`version`, `git_commit`",
            build,
        );
        r.add(
            "node_loss_recoveries",
            "Sandboxes moved off a lost node (not ready past the node-loss grace, or gone) to start on another",
            "",
            m.node_losses.clone(),
        );
        r.add(
            "sandbox_ready_seconds",
            "Seconds from a sandbox's creation (or the start of a resume or recovery) to Ready, by start branch",
            "`branch` (`fresh`, `reattached`, `restored`, `recovered`), `start` (`cold`, `warm`)",
            m.ready.clone(),
        );
        r.add(
            "sandbox_starts",
            "Starts that reached Ready, by kind: cold (a pod made for it) or warm (a pool's warm pod adopted)",
            "`kind` (`cold`, `warm`)",
            m.starts.clone(),
        );
        r.add(
            "pool_claims",
            "Tries to adopt a warm pod at a sandbox's first start, by result: claimed, miss (none fitted) or conflict (each one tried was taken first)",
            "`result` (`claimed`, `miss`, `conflict`)",
            m.claims.clone(),
        );
        r.add(
            "pool_claim_seconds",
            "Seconds a successful claim took: choosing a warm pod and the conditional write that adopts it",
            "",
            m.claim_seconds.clone(),
        );
        r.add(
            "sandboxes",
            "Sandboxes by phase (the leader's view)",
            "`phase`",
            m.phases.clone(),
        );
        r.add(
            "snapshot_bytes",
            "Bytes of committed snapshots",
            "",
            m.snapshot_bytes.clone(),
        );
        r.add(
            "snapshot_duration_seconds",
            "Seconds from the start of an upload to its commit, of committed snapshots",
            "",
            m.snapshot_seconds.clone(),
        );
        r.add(
            "snapshot_failures",
            "Failed snapshot attempts, by reason",
            "`reason`",
            m.snapshot_failures.clone(),
        );
        r.add(
            "restore_bytes",
            "Bytes of snapshots restored into workspaces",
            "",
            m.restore_bytes.clone(),
        );
        r.add(
            "restore_duration_seconds",
            "Seconds a restore took under the scope's guard (extract, verify, swap)",
            "",
            m.restore_seconds.clone(),
        );
        r.add(
            "restore_failures",
            "Restores that failed, by reason",
            "`reason`",
            m.restore_failures.clone(),
        );
        r.add(
            "guard_wait_seconds",
            "Seconds the operator waited for a scope's guard, by purpose and outcome",
            "`op` (`snapshot`, `restore`, `idle_suspend`), `outcome` (`acquired`, `busy`, `error`)",
            m.guard_wait.clone(),
        );
        // Every (purpose, kind) from 0, so a rate or an alert over them has data before
        // the first error.
        for op in [ExecOp::Workspace, ExecOp::Snapshot] {
            for kind in agentbox_api::exec::ExecError::KINDS {
                let l = ExecLabels {
                    op: op.as_str(),
                    kind,
                };
                m.exec_errors.get_or_create(&l).inc_by(0);
            }
        }
        r.add(
            "exec_errors",
            "Errors of the operator's own execs into sandboxes, by purpose and kind",
            "`op` (`workspace`, `snapshot`), `kind` (`connect`, `not_started`, `stream`, `timeout`…)",
            m.exec_errors.clone(),
        );
        r.add(
            "idle_suspensions",
            "Sandboxes the operator suspended because their lifecycle.idleTimeout passed",
            "",
            m.idle_suspensions.clone(),
        );
        r.add(
            "workspace_over_limit_suspensions",
            "Sandboxes the operator suspended because their workspace held more than workspace.sizeLimit",
            "",
            m.over_limit_suspensions.clone(),
        );
        r.add(
            "workspace_used_bytes",
            "Bytes a limited workspace held, as measured by its workspace-usage sidecar and read by the operator",
            "",
            m.workspace_used.clone(),
        );
        r.add(
            "workspace_limit_starts",
            "Starts of sandbox pods with a workspace size limit, by how the node enforced it (quota, measure, not_enforced)",
            "`mode` (`quota`, `measure`, `not_enforced`)",
            m.workspace_limit_modes.clone(),
        );
        r.add(
            "workspaces_swept",
            "Workspace directories of deleted sandboxes removed from their nodes by the sweep",
            "",
            m.workspaces_swept.clone(),
        );
        r.add(
            "workspace_sweep_failures",
            "Helper pods of the workspace sweep that failed or did not finish",
            "",
            m.sweep_failures.clone(),
        );
        r.add(
            "pool_replicas",
            "Warm pods of each SandboxPool (unclaimed, not being deleted), from its status at each scrape",
            "`namespace`, `pool`",
            m.pool_replicas.clone(),
        );
        r.add(
            "pool_ready",
            "Warm pods of each SandboxPool ready to be claimed, from its status at each scrape",
            "`namespace`, `pool`",
            m.pool_ready.clone(),
        );
        r.add(
            "pool_pods_created",
            "Warm pods the pool controller created",
            "",
            m.pool_created.clone(),
        );
        r.add(
            "pool_pods_deleted",
            "Warm pods the pool controller deleted (surplus, replaced, ended, or of a missing template)",
            "",
            m.pool_deleted.clone(),
        );
        r.add(
            "memory_resident_bytes",
            "The operator's resident set (VmRSS), sampled every 5 s",
            "",
            m.memory_rss.clone(),
        );
        r.add(
            "memory_limit_bytes",
            "The memory limit of the operator's cgroup (0: none found)",
            "",
            m.memory_limit.clone(),
        );
        r.add(
            "startup_pending_sandboxes",
            "Sandboxes of this leader's first listing not yet reconciled since it started (0 once every one has been)",
            "",
            m.startup_pending.clone(),
        );
        r.add(
            "startup_reconciled_seconds",
            "Seconds from this leader's start to every Sandbox of its first listing reconciled (0 until then)",
            "",
            m.startup_seconds.clone(),
        );
        Metrics {
            registry: r.registry,
            names: r.names,
            catalogue: r.catalogue,
            ..m
        }
    }
}

impl Metrics {
    /// Counts a finished reconcile and its duration.
    pub fn reconciled(&self, controller: &str, took: Duration) {
        let l = ControllerLabels {
            controller: controller.to_string(),
        };
        self.reconciles.get_or_create(&l).inc();
        self.durations.get_or_create(&l).observe(took.as_secs_f64());
    }

    /// Counts a failed reconcile by error kind.
    pub fn failed(&self, controller: &str, kind: &str) {
        let l = ErrorLabels {
            controller: controller.to_string(),
            kind: kind.to_string(),
        };
        self.errors.get_or_create(&l).inc();
    }

    /// A sandbox became Ready `took` after its creation or the start of its resume, by
    /// start branch; `start` is [`COLD`] or [`WARM`].
    pub fn became_ready(&self, branch: StartBranch, start: &'static str, took: Duration) {
        let l = StartLabels {
            branch: branch_label(branch),
            start,
        };
        self.ready.get_or_create(&l).observe(took.as_secs_f64());
        self.starts
            .get_or_create(&StartKindLabels { kind: start })
            .inc();
    }

    /// A sandbox's first start tried to claim a warm pod, with `result`, in `took`.
    pub fn claimed(&self, result: ClaimResult, took: Duration) {
        self.claims
            .get_or_create(&ClaimLabels {
                result: result.as_str(),
            })
            .inc();
        if result == ClaimResult::Claimed {
            self.claim_seconds.observe(took.as_secs_f64());
        }
    }

    /// A sandbox was moved off a lost node.
    pub fn node_lost(&self) {
        self.node_losses.inc();
    }

    /// Counts sandboxes by phase from `source` at every scrape (the leader sets it).
    pub fn count_phases_from(&self, source: PhaseSource) {
        if let Ok(mut s) = self.phase_source.write() {
            *s = Some(source);
        }
    }

    /// A snapshot of `bytes` was committed `took` after its upload started.
    pub fn snapshot_committed(&self, bytes: u64, took: Duration) {
        self.snapshot_bytes.inc_by(bytes);
        self.snapshot_seconds.observe(took.as_secs_f64());
    }

    /// A snapshot attempt failed with condition reason `reason`.
    pub fn snapshot_failed(&self, reason: &'static str) {
        self.snapshot_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// A restore of `bytes` finished in `took`.
    pub fn restored(&self, bytes: u64, took: Duration) {
        self.restore_bytes.inc_by(bytes);
        self.restore_seconds.observe(took.as_secs_f64());
    }

    /// A restore failed with condition reason `reason`.
    pub fn restore_failed(&self, reason: &'static str) {
        self.restore_failures
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// The operator waited `took` for a scope's guard.
    pub fn guard_waited(&self, op: GuardOp, outcome: GuardOutcome, took: Duration) {
        let l = GuardLabels {
            op: op.as_str(),
            outcome: outcome.as_str(),
        };
        self.guard_wait
            .get_or_create(&l)
            .observe(took.as_secs_f64());
    }

    /// A sandbox was suspended for its idle timeout.
    pub fn idle_suspended(&self) {
        self.idle_suspensions.inc();
    }

    /// A sandbox was suspended because its workspace held more than its size limit.
    pub fn over_limit_suspended(&self) {
        self.over_limit_suspensions.inc();
    }

    /// The operator read a measurement of a limited workspace: `bytes` held.
    pub fn workspace_used(&self, bytes: u64) {
        self.workspace_used.observe(bytes as f64);
    }

    /// A sandbox pod with a workspace size limit started its sandbox: how the limit is
    /// enforced (`quota`, `measure`, `not_enforced`).
    pub fn workspace_limited(&self, mode: &'static str) {
        self.workspace_limit_modes
            .get_or_create(&LimitModeLabels { mode })
            .inc();
    }

    /// The sweep removed `n` workspace directories of deleted sandboxes.
    pub fn workspaces_swept(&self, n: u64) {
        self.workspaces_swept.inc_by(n);
    }

    /// A helper pod of the sweep failed.
    pub fn sweep_failed(&self) {
        self.sweep_failures.inc();
    }

    /// Sets the pool gauges from `source` at every scrape (the leader sets it), so a deleted
    /// pool's series go with it.
    pub fn count_pools_from(&self, source: PoolSource) {
        if let Ok(mut s) = self.pool_source.write() {
            *s = Some(source);
        }
    }

    /// The pool controller created `n` warm pods.
    pub fn pool_pods_created(&self, n: u64) {
        self.pool_created.inc_by(n);
    }

    /// The pool controller deleted `n` warm pods.
    pub fn pool_pods_deleted(&self, n: u64) {
        self.pool_deleted.inc_by(n);
    }

    /// A sample of the operator's resident set and its cgroup's memory limit (`None`: none).
    pub fn memory(&self, rss: u64, limit: Option<u64>) {
        self.memory_rss.set(i64::try_from(rss).unwrap_or(i64::MAX));
        self.memory_limit
            .set(limit.map_or(0, |l| i64::try_from(l).unwrap_or(i64::MAX)));
    }

    /// How many Sandboxes of the first listing are still to be reconciled; with `took`, the
    /// first pass is complete and took that long.
    pub fn startup(&self, pending: usize, took: Option<Duration>) {
        self.startup_pending
            .set(i64::try_from(pending).unwrap_or(i64::MAX));
        if let Some(t) = took {
            self.startup_seconds.set(t.as_secs_f64());
        }
    }

    /// An exec of the operator's own failed with an error of `kind`.
    pub fn exec_failed(&self, op: ExecOp, kind: &'static str) {
        let l = ExecLabels {
            op: op.as_str(),
            kind,
        };
        self.exec_errors.get_or_create(&l).inc();
    }

    /// Sets the phase gauges from the phase source: every phase, those without sandboxes at 0
    /// (a gauge left at its last count would outlive the sandboxes it counted).
    fn refresh_phases(&self) {
        let Ok(source) = self.phase_source.read() else {
            return;
        };
        let Some(source) = source.as_ref() else {
            return;
        };
        let seen = source();
        for phase in SandboxPhase::ALL {
            let n = seen.iter().filter(|p| **p == phase).count();
            self.phases
                .get_or_create(&PhaseLabels {
                    phase: phase.as_str(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    fn refresh_pools(&self) {
        let Ok(source) = self.pool_source.read() else {
            return;
        };
        let Some(source) = source.as_ref() else {
            return;
        };
        self.pool_replicas.clear();
        self.pool_ready.clear();
        for (l, replicas, ready) in source() {
            self.pool_replicas
                .get_or_create(&l)
                .set(i64::from(replicas));
            self.pool_ready.get_or_create(&l).set(i64::from(ready));
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        self.refresh_phases();
        self.refresh_pools();
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Every sample name the registry exposes (`agentbox_snapshot_bytes_total`,
    /// `agentbox_sandbox_ready_seconds_bucket`...), recorded as each metric was registered,
    /// whether it has samples yet or not: what a dashboard or an alert may query.
    pub fn sample_names(&self) -> &BTreeSet<String> {
        &self.names
    }

    /// Every metric, in the order registered: docs/operations.md's metrics table.
    pub fn catalogue(&self) -> &[Described] {
        &self.catalogue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has(text: &str, line: &str) {
        assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
    }

    /// The label names a catalogue entry gives: its backquoted words outside parentheses.
    fn described_labels(labels: &str) -> BTreeSet<String> {
        let mut depth = 0;
        let mut out = BTreeSet::new();
        let mut parts = labels.split('`');
        let mut outside = parts.next().unwrap_or_default();
        while let (Some(word), Some(rest)) = (parts.next(), parts.next()) {
            depth += outside.matches('(').count();
            depth -= outside.matches(')').count();
            if depth == 0 {
                out.insert(word.to_string());
            }
            outside = rest;
        }
        out
    }

    #[test]
    fn the_catalogue_names_the_labels_each_series_carries() {
        let m = Metrics::default();
        m.reconciled("sandbox", Duration::from_millis(12));
        m.failed("sandbox", "kube");
        let text = m.render();
        let mut checked = 0;
        for d in m.catalogue() {
            let sample = text.lines().find(|l| {
                !l.starts_with('#')
                    && (l.starts_with(&format!("{}{{", d.series))
                        || l.starts_with(&format!("{}_count{{", d.series)))
            });
            let Some(sample) = sample else { continue };
            let inner = &sample[sample.find('{').unwrap() + 1..sample.find('}').unwrap()];
            let got: BTreeSet<String> = inner
                .split(',')
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k.to_string()))
                .collect();
            assert_eq!(got, described_labels(d.labels), "{}", d.series);
            checked += 1;
        }
        assert!(checked >= 4, "only {checked} series had samples");
        assert_eq!(
            described_labels("`op` (`a`, `b`), `kind` (`c`)"),
            ["kind", "op"].map(String::from).into()
        );
    }

    #[test]
    fn renders_counts_by_label() {
        let m = Metrics::default();
        m.reconciled("sandbox", Duration::from_millis(12));
        m.reconciled("sandbox", Duration::from_millis(30));
        m.failed("sandbox", "kube");
        let text = m.render();
        has(
            &text,
            r#"agentbox_reconciles_total{controller="sandbox"} 2"#,
        );
        has(
            &text,
            r#"agentbox_reconcile_errors_total{controller="sandbox",kind="kube"} 1"#,
        );
        has(
            &text,
            r#"agentbox_reconcile_duration_seconds_count{controller="sandbox"} 2"#,
        );
    }

    #[test]
    fn pool_gauges_follow_the_pools_there_are_at_each_scrape() {
        let m = Metrics::default();
        let pools = std::sync::Arc::new(RwLock::new(vec![(
            PoolLabels {
                namespace: "team".into(),
                pool: "py".into(),
            },
            3,
            2,
        )]));
        let seen = pools.clone();
        m.count_pools_from(Box::new(move || {
            seen.read().map(|p| p.clone()).unwrap_or_default()
        }));
        let text = m.render();
        has(
            &text,
            r#"agentbox_pool_replicas{namespace="team",pool="py"} 3"#,
        );
        has(
            &text,
            r#"agentbox_pool_ready{namespace="team",pool="py"} 2"#,
        );
        pools.write().unwrap().clear();
        assert!(
            !m.render().contains(r#"pool="py""#),
            "a deleted pool's series go"
        );
    }

    #[test]
    fn build_info_is_one_with_the_version_and_commit() {
        let text = Metrics::default().render();
        has(
            &text,
            &format!(
                r#"agentbox_build_info{{version="{}",git_commit="{GIT_COMMIT}"}} 1"#,
                env!("CARGO_PKG_VERSION")
            ),
        );
    }

    #[test]
    fn claims_are_counted_by_result_and_warm_starts_apart_from_cold_ones() {
        let m = Metrics::default();
        m.claimed(ClaimResult::Claimed, Duration::from_millis(3));
        m.claimed(ClaimResult::Miss, Duration::from_millis(1));
        m.claimed(ClaimResult::Conflict, Duration::from_millis(9));
        m.claimed(ClaimResult::Claimed, Duration::from_millis(5));
        m.became_ready(StartBranch::Fresh, WARM, Duration::from_millis(20));
        m.became_ready(StartBranch::Fresh, COLD, Duration::from_millis(700));
        m.became_ready(StartBranch::Restored, COLD, Duration::from_millis(900));
        let text = m.render();
        has(&text, r#"agentbox_pool_claims_total{result="claimed"} 2"#);
        has(&text, r#"agentbox_pool_claims_total{result="miss"} 1"#);
        has(&text, r#"agentbox_pool_claims_total{result="conflict"} 1"#);
        has(&text, "agentbox_pool_claim_seconds_count 2");
        has(&text, r#"agentbox_pool_claim_seconds_bucket{le="0.004"} 1"#);
        has(&text, r#"agentbox_sandbox_starts_total{kind="warm"} 1"#);
        has(&text, r#"agentbox_sandbox_starts_total{kind="cold"} 2"#);
    }

    #[test]
    fn starts_are_observed_by_branch_and_start() {
        let m = Metrics::default();
        m.became_ready(StartBranch::Fresh, COLD, Duration::from_millis(1500));
        m.became_ready(StartBranch::Fresh, COLD, Duration::from_millis(500));
        m.became_ready(StartBranch::Restored, COLD, Duration::from_secs(4));
        let text = m.render();
        has(
            &text,
            r#"agentbox_sandbox_ready_seconds_count{branch="fresh",start="cold"} 2"#,
        );
        has(
            &text,
            r#"agentbox_sandbox_ready_seconds_sum{branch="fresh",start="cold"} 2.0"#,
        );
        has(
            &text,
            r#"agentbox_sandbox_ready_seconds_count{branch="restored",start="cold"} 1"#,
        );
        // 0.5 s falls in the 0.8 bucket, 1.5 s does not.
        has(
            &text,
            r#"agentbox_sandbox_ready_seconds_bucket{le="0.8",branch="fresh",start="cold"} 1"#,
        );
    }

    #[test]
    fn every_branch_has_its_own_label() {
        let all = [
            StartBranch::Reattached,
            StartBranch::Recovered,
            StartBranch::Restored,
            StartBranch::Fresh,
        ];
        let labels: BTreeSet<_> = all.into_iter().map(branch_label).collect();
        assert_eq!(labels.len(), 4);
    }

    #[test]
    fn phases_are_counted_at_each_scrape_with_absent_ones_at_zero() {
        let m = Metrics::default();
        assert!(!m.render().contains("agentbox_sandboxes{"), "no source yet");
        let now = std::sync::Arc::new(RwLock::new(vec![
            SandboxPhase::Ready,
            SandboxPhase::Ready,
            SandboxPhase::Pending,
        ]));
        let seen = now.clone();
        m.count_phases_from(Box::new(move || {
            seen.read().map(|v| v.clone()).unwrap_or_default()
        }));
        let text = m.render();
        has(&text, r#"agentbox_sandboxes{phase="Ready"} 2"#);
        has(&text, r#"agentbox_sandboxes{phase="Pending"} 1"#);
        has(&text, r#"agentbox_sandboxes{phase="Failed"} 0"#);
        // A sandbox deleted, another suspended: the next scrape says so, nothing kept over.
        *now.write().unwrap() = vec![SandboxPhase::Suspended];
        let text = m.render();
        has(&text, r#"agentbox_sandboxes{phase="Ready"} 0"#);
        has(&text, r#"agentbox_sandboxes{phase="Pending"} 0"#);
        has(&text, r#"agentbox_sandboxes{phase="Suspended"} 1"#);
    }

    #[test]
    fn snapshots_and_restores_count_bytes_durations_and_failures_by_reason() {
        let m = Metrics::default();
        m.snapshot_committed(4096, Duration::from_secs(2));
        m.snapshot_committed(1024, Duration::from_secs(1));
        m.snapshot_failed("StoreError");
        m.restored(4096, Duration::from_secs(3));
        m.restore_failed("DigestMismatch");
        m.restore_failed("DigestMismatch");
        let text = m.render();
        has(&text, "agentbox_snapshot_bytes_total 5120");
        has(&text, "agentbox_snapshot_duration_seconds_count 2");
        has(&text, "agentbox_snapshot_duration_seconds_sum 3.0");
        has(
            &text,
            r#"agentbox_snapshot_failures_total{reason="StoreError"} 1"#,
        );
        has(&text, "agentbox_restore_bytes_total 4096");
        has(&text, "agentbox_restore_duration_seconds_count 1");
        has(
            &text,
            r#"agentbox_restore_failures_total{reason="DigestMismatch"} 2"#,
        );
    }

    #[test]
    fn guard_waits_and_exec_errors_carry_purpose_and_outcome() {
        let m = Metrics::default();
        let busy = Duration::from_secs(60);
        m.guard_waited(GuardOp::Snapshot, GuardOutcome::Acquired, Duration::ZERO);
        m.guard_waited(GuardOp::Restore, GuardOutcome::Busy, busy);
        let text = m.render();
        has(
            &text,
            r#"agentbox_exec_errors_total{op="workspace",kind="connect"} 0"#,
        );
        m.exec_failed(ExecOp::Snapshot, "stream");
        let text = m.render();
        has(
            &text,
            r#"agentbox_guard_wait_seconds_count{op="snapshot",outcome="acquired"} 1"#,
        );
        has(
            &text,
            r#"agentbox_guard_wait_seconds_sum{op="restore",outcome="busy"} 60.0"#,
        );
        has(
            &text,
            r#"agentbox_exec_errors_total{op="snapshot",kind="stream"} 1"#,
        );
    }

    #[test]
    fn sample_names_are_those_rendered() {
        let m = Metrics::default();
        let names = m.sample_names();
        for n in [
            "agentbox_build_info",
            "agentbox_leader",
            "agentbox_reconciles_total",
            "agentbox_sandbox_ready_seconds_bucket",
            "agentbox_snapshot_bytes_total",
            "agentbox_restore_duration_seconds_count",
            "agentbox_guard_wait_seconds_sum",
        ] {
            assert!(names.contains(n), "{n} not in {names:?}");
        }
        assert!(
            !names.contains("agentbox_snapshot_bytes"),
            "counters end in _total"
        );
        // Everything a scrape shows after use is among them.
        m.snapshot_failed("StoreError");
        m.exec_failed(ExecOp::Workspace, "connect");
        for line in m.render().lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap_or_default();
            assert!(names.contains(name), "{name} not in {names:?}");
        }
    }
}
