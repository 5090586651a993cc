//! Execution guard: one `coordination.k8s.io/v1` Lease per scope key, so that at most one
//! party (a harness, a CLI, the operator's snapshot/restore/suspend) works in a scope's
//! sandbox at a time. The operator also uses it, on a fixed lease name, for leader election.
//!
//! - **Acquire** waits up to a deadline: create the Lease, or take over a free or expired one
//!   with an update conditioned on its `resourceVersion`. A 409 means someone else won the
//!   race: keep waiting.
//! - **Fencing token**: every acquisition bumps `leaseTransitions`; [`Guard::token`] returns it,
//!   so work done under the guard can be stamped and stale holders refused.
//! - **Renew** in the background every `duration / 3` with conditioned updates. A 409 or 404,
//!   or no successful renewal for long enough that another party could take over, means the
//!   guard is **lost**: its cancellation token fires and [`Guard::run`] returns
//!   [`GuardError::Lost`]. Nothing is ever assumed held: if the API server is unreachable the
//!   guard fails closed.
//! - **Release** is a conditioned update that clears the holder but keeps the Lease (and its
//!   `leaseTransitions`), so fencing tokens stay monotonic; deleting the Lease would restart
//!   the count.
//!
//! Expiry is judged two ways, and either suffices: the holder's `renewTime` plus
//! `leaseDurationSeconds` (plus a clock-skew allowance) is in the past, or this contender has
//! seen the same `resourceVersion` for a full lease duration on its own monotonic clock (which
//! needs no clock agreement at all, as in client-go's leader election).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::crd::Scope;
use crate::labels;

/// Settings of a guard.
#[derive(Clone, Debug)]
pub struct GuardConfig {
    /// How long a lease stays valid without renewal (`leaseDurationSeconds`, whole seconds,
    /// at least 1).
    pub lease_duration: Duration,
    /// Renewal period; `None` means a third of the lease duration.
    pub renew_interval: Option<Duration>,
    /// Polling period while waiting for a held lease (jittered ±50%).
    pub retry_interval: Duration,
    /// Allowance for clock differences when judging expiry from `renewTime`.
    pub clock_skew: Duration,
    /// Identity written to `holderIdentity`.
    pub holder: String,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            lease_duration: Duration::from_secs(15),
            renew_interval: None,
            retry_interval: Duration::from_millis(200),
            clock_skew: Duration::from_secs(2),
            holder: holder_identity(),
        }
    }
}

impl GuardConfig {
    /// The default settings with another lease duration.
    pub fn with_duration(d: Duration) -> Self {
        GuardConfig {
            lease_duration: d,
            ..Default::default()
        }
    }

    pub(crate) fn duration_secs(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }

    pub(crate) fn renew_every(&self) -> Duration {
        self.renew_interval
            .unwrap_or(Duration::from_secs(u64::from(self.duration_secs().unsigned_abs())) / 3)
    }

    /// How long after the start of the last successful renewal we still trust that we hold
    /// the lease: the duration less a margin, since others may take over right at the
    /// duration.
    pub(crate) fn trust_window(&self) -> Duration {
        let d = Duration::from_secs(u64::from(self.duration_secs().unsigned_abs()));
        let margin = (d / 5).max(Duration::from_millis(500)).min(d / 2);
        d - margin
    }
}

/// A holder identity: `hostname/pid/random`, unique per guard user.
pub fn holder_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    format!(
        "{host}/{}/{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// Guard failures.
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// The deadline passed while another holder had the lease.
    #[error("timed out waiting for lease {name} (held by {holder})")]
    Timeout {
        /// Lease name.
        name: String,
        /// Holder seen last.
        holder: String,
    },
    /// The lease was lost (taken over, deleted, or not renewed in time): the guarded work
    /// must stop.
    #[error("lost lease {0}")]
    Lost(String),
    /// A hold handed over by its holder ([`HandOff`]) is not (or no longer) the Lease's.
    #[error("lease {name} is not held by {holder} with fencing token {token}: {seen}")]
    NotHeld {
        /// Lease name.
        name: String,
        /// The holder the hand-off named.
        holder: String,
        /// The fencing token it named.
        token: i64,
        /// What the Lease says instead.
        seen: String,
    },
    /// The API server refused or could not be reached.
    #[error("lease {name}: {source}")]
    Api {
        /// Lease name.
        name: String,
        /// Underlying error.
        #[source]
        source: kube::Error,
    },
}

/// What a contender may do with a lease it has just read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// No holder, or the holder's time is up: try the conditioned takeover.
    Take,
    /// Someone holds it: wait.
    Wait,
}

/// A lease as read at one moment, by the one clock rule everything in agentbox judges leases
/// by: the guard deciding whether it may take a lease over ([`judge`]) and the sandbox
/// controller reporting who holds a scope's guard (the `Guarded` condition).
///
/// A lease is expired when its `renewTime` plus its duration (`leaseDurationSeconds`, else the
/// default) plus a clock-skew allowance is not in the future. Without a `renewTime` the clock
/// cannot tell, and the lease counts as held (a contender then goes by how long it has seen
/// the lease unchanged).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseView {
    /// Who holds it; `None` when nobody does (no lease, or released).
    pub holder: Option<String>,
    /// When the holder took it.
    pub acquired: Option<Timestamp>,
    /// Its duration, as written or the default.
    pub duration: Duration,
    /// The holder's time is up by the clocks.
    pub expired: bool,
    /// When the holder's time is up by the clocks (its `renewTime` plus duration plus the
    /// skew allowance); `None` without a holder or a `renewTime`.
    pub expires_at: Option<Timestamp>,
    /// `leaseTransitions`: the fencing token of the last acquisition (0 without a lease).
    pub transitions: i32,
}

impl LeaseView {
    /// Reads a lease spec at `now` (this reader's wall clock).
    pub fn read(
        spec: Option<&LeaseSpec>,
        now: Timestamp,
        clock_skew: Duration,
        default_duration: Duration,
    ) -> Self {
        let holder = spec
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty());
        let duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .filter(|d| *d > 0)
            .map(|d| Duration::from_secs(u64::from(d.unsigned_abs())))
            .unwrap_or(default_duration);
        let expires_at = spec
            .and_then(|s| s.renew_time.as_ref())
            .and_then(|renew| {
                SignedDuration::try_from(duration + clock_skew)
                    .ok()
                    .and_then(|d| renew.0.checked_add(d).ok())
            })
            .filter(|_| holder.is_some());
        LeaseView {
            acquired: spec.and_then(|s| s.acquire_time.as_ref()).map(|t| t.0),
            holder,
            duration,
            expired: expires_at.is_some_and(|e| e <= now),
            expires_at,
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
        }
    }

    /// Reads a scope's guard Lease with the guard's default duration and skew allowance.
    pub fn of(lease: Option<&Lease>, now: Timestamp) -> Self {
        let cfg = GuardConfig::default();
        Self::read(
            lease.and_then(|l| l.spec.as_ref()),
            now,
            cfg.clock_skew,
            cfg.lease_duration,
        )
    }

    /// Someone holds it and their time is not up.
    pub fn is_held(&self) -> bool {
        self.holder.is_some() && !self.expired
    }
}

/// Decides whether a lease may be taken over (pure, for tests).
///
/// `now` is this contender's wall clock; `unchanged_for` is how long it has seen the current
/// `resourceVersion` on its monotonic clock; `default_duration` applies when the lease has
/// none. Taken when free or expired by [`LeaseView`]'s rule, or unchanged for a full duration.
pub fn judge(
    spec: Option<&LeaseSpec>,
    now: Timestamp,
    unchanged_for: Duration,
    clock_skew: Duration,
    default_duration: Duration,
) -> Verdict {
    let view = LeaseView::read(spec, now, clock_skew, default_duration);
    if view.is_held() && unchanged_for < view.duration {
        Verdict::Wait
    } else {
        Verdict::Take
    }
}

/// The spec written when taking a lease: this holder, times now, transitions bumped.
pub(crate) fn taken_spec(old: Option<&LeaseSpec>, cfg: &GuardConfig, now: Timestamp) -> LeaseSpec {
    let transitions = old.and_then(|s| s.lease_transitions).unwrap_or(0);
    LeaseSpec {
        holder_identity: Some(cfg.holder.clone()),
        lease_duration_seconds: Some(cfg.duration_secs()),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions.saturating_add(1)),
        ..Default::default()
    }
}

fn api_err(name: &str) -> impl Fn(kube::Error) -> GuardError + '_ {
    move |source| GuardError::Api {
        name: name.to_string(),
        source,
    }
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn is_gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Errors worth retrying while waiting: server-side trouble and transport failures. Client
/// errors (forbidden, invalid) come back at once.
fn is_retryable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code >= 500 || s.code == 429 || s.code == 409,
        _ => true,
    }
}

fn jittered(d: Duration) -> Duration {
    let f: f64 = 0.5 + rand::random::<f64>();
    d.mul_f64(f)
}

/// Acquires the guard of a scope in `namespace`: the Lease named
/// [`labels::lease_name`] of the scope key, labelled with [`labels::scope_labels`].
/// `wait` bounds the wait for a held lease (`None` waits indefinitely).
pub async fn acquire_scope(
    client: kube::Client,
    namespace: &str,
    scope: &Scope,
    cfg: &GuardConfig,
    wait: Option<Duration>,
) -> Result<Guard, GuardError> {
    let leases: Api<Lease> = Api::namespaced(client, namespace);
    let name = labels::lease_name(&labels::scope_key(scope));
    acquire(&leases, &name, labels::scope_labels(scope), cfg, wait).await
}

/// Acquires the Lease `name` (creating it with `labels` if missing), waiting up to `wait`
/// (`None` = indefinitely) while someone else holds it.
///
/// For leader election, call it with a fixed name and `wait = None`, then stop leading when
/// [`Guard::lost`] resolves.
pub async fn acquire(
    leases: &Api<Lease>,
    name: &str,
    labels: BTreeMap<String, String>,
    cfg: &GuardConfig,
    wait: Option<Duration>,
) -> Result<Guard, GuardError> {
    let deadline = wait.map(|w| Instant::now() + w);
    // The resourceVersion last seen and since when (monotonic).
    let mut seen: Option<(String, Instant)> = None;
    let mut last_holder = String::new();
    loop {
        let attempt = Instant::now();
        match try_take(leases, name, &labels, cfg, &mut seen, &mut last_holder).await {
            Ok(Some(lease)) => return Ok(Guard::start(leases.clone(), name, lease, cfg, attempt)),
            Ok(None) => {}
            Err(e) if is_retryable(&e) => {
                tracing::debug!(lease = name, error = %e, "lease acquire attempt failed");
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(api_err(name)(e));
                }
            }
            Err(e) => return Err(api_err(name)(e)),
        }
        let mut pause = jittered(cfg.retry_interval);
        if let Some(d) = deadline {
            let now = Instant::now();
            if now >= d {
                return Err(GuardError::Timeout {
                    name: name.to_string(),
                    holder: last_holder,
                });
            }
            pause = pause.min(d - now);
        }
        tokio::time::sleep(pause).await;
    }
}

/// One attempt: `Ok(Some(lease))` when we now hold it, `Ok(None)` when it is held or we lost a
/// race.
async fn try_take(
    leases: &Api<Lease>,
    name: &str,
    labels: &BTreeMap<String, String>,
    cfg: &GuardConfig,
    seen: &mut Option<(String, Instant)>,
    last_holder: &mut String,
) -> Result<Option<Lease>, kube::Error> {
    let now = Timestamp::now();
    match leases.get_opt(name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    labels: Some(labels.clone()).filter(|l| !l.is_empty()),
                    ..Default::default()
                },
                spec: Some(taken_spec(None, cfg, now)),
            };
            match leases.create(&PostParams::default(), &lease).await {
                Ok(l) => Ok(Some(l)),
                Err(e) if is_conflict(&e) => Ok(None),
                Err(e) => Err(e),
            }
        }
        Some(mut lease) => {
            let rv = lease.metadata.resource_version.clone().unwrap_or_default();
            let since = match seen {
                Some((v, t)) if *v == rv => *t,
                _ => {
                    let t = Instant::now();
                    *seen = Some((rv, t));
                    t
                }
            };
            *last_holder = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.clone())
                .unwrap_or_default();
            let verdict = judge(
                lease.spec.as_ref(),
                now,
                since.elapsed(),
                cfg.clock_skew,
                cfg.lease_duration,
            );
            if verdict == Verdict::Wait {
                return Ok(None);
            }
            lease.spec = Some(taken_spec(lease.spec.as_ref(), cfg, now));
            // Keep the scope labels current on an existing lease too.
            if !labels.is_empty() {
                let l = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
                l.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
            // `replace` sends metadata.resourceVersion: the API server refuses (409) if anyone
            // wrote the lease since we read it.
            match leases.replace(name, &PostParams::default(), &lease).await {
                Ok(l) => Ok(Some(l)),
                Err(e) if is_conflict(&e) => Ok(None),
                Err(e) => Err(e),
            }
        }
    }
}

/// A held execution guard. Renews itself in the background until released or lost; dropping
/// it releases it (best effort) when a tokio runtime is available.
pub struct Guard {
    leases: Api<Lease>,
    name: String,
    holder: String,
    token: i64,
    acquired_at: Option<Timestamp>,
    lease: Arc<Mutex<Lease>>,
    lost: CancellationToken,
    stop: CancellationToken,
    renewer: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("name", &self.name)
            .field("holder", &self.holder)
            .field("token", &self.token)
            .field("lost", &self.lost.is_cancelled())
            .finish()
    }
}

impl Guard {
    fn start(
        leases: Api<Lease>,
        name: &str,
        lease: Lease,
        cfg: &GuardConfig,
        sent: Instant,
    ) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        let token = i64::from(spec.lease_transitions.unwrap_or(0));
        let acquired_at = spec.acquire_time.map(|t| t.0);
        let shared = Arc::new(Mutex::new(lease));
        let lost = CancellationToken::new();
        let stop = CancellationToken::new();
        let renewer = tokio::spawn(renew_loop(
            leases.clone(),
            name.to_string(),
            shared.clone(),
            cfg.clone(),
            sent,
            lost.clone(),
            stop.clone(),
        ));
        Guard {
            leases,
            name: name.to_string(),
            holder: cfg.holder.clone(),
            token,
            acquired_at,
            lease: shared,
            lost,
            stop,
            renewer: Some(renewer),
        }
    }

    /// The fencing token: the lease's `leaseTransitions` after this acquisition. Strictly
    /// greater than the token of any earlier holder of the same lease.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// Name of the Lease.
    pub fn lease_name(&self) -> &str {
        &self.name
    }

    /// This holder's identity.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// When the lease was acquired (the lease's `acquireTime`).
    pub fn acquired_at(&self) -> Option<Timestamp> {
        self.acquired_at
    }

    /// Whether the guard has been lost.
    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Resolves when the guard is lost.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    /// A token cancelled when the guard is lost, to hand to guarded work.
    pub fn cancellation(&self) -> CancellationToken {
        self.lost.child_token()
    }

    /// Runs `fut` under the guard: `Err(Lost)` (and `fut` dropped) if the guard is lost before
    /// it finishes.
    pub async fn run<F: Future>(&self, fut: F) -> Result<F::Output, GuardError> {
        if self.is_lost() {
            return Err(GuardError::Lost(self.name.clone()));
        }
        tokio::select! {
            biased;
            _ = self.lost.cancelled() => Err(GuardError::Lost(self.name.clone())),
            out = fut => if self.is_lost() {
                Err(GuardError::Lost(self.name.clone()))
            } else {
                Ok(out)
            },
        }
    }

    /// Releases the guard: stops renewing and clears the holder with an update conditioned on
    /// the last resourceVersion. `Err(Lost)` if it had been lost or someone wrote the lease
    /// in between.
    pub async fn release(mut self) -> Result<(), GuardError> {
        self.stop.cancel();
        if let Some(r) = self.renewer.take() {
            let _ = r.await;
        }
        if self.lost.is_cancelled() {
            return Err(GuardError::Lost(self.name.clone()));
        }
        let lease = cleared(&self.lease);
        // Released or failed, the guard is no longer ours to use.
        self.lost.cancel();
        match self
            .leases
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_conflict(&e) || is_gone(&e) => Err(GuardError::Lost(self.name.clone())),
            Err(e) => Err(api_err(&self.name)(e)),
        }
    }
}

/// A hold of a scope's guard that its holder handed over (a harness that holds the guard and
/// asks the operator to snapshot or suspend under it): work done under it neither takes nor
/// releases the Lease, and stops as soon as the Lease is no longer held by that holder with
/// that fencing token, so nobody else can work in the scope between the holder's last command
/// and that work. The holder keeps renewing the Lease meanwhile.
#[derive(Clone, Debug)]
pub struct HandOff {
    leases: Api<Lease>,
    name: String,
    holder: String,
    token: i64,
}

impl HandOff {
    /// The hold `holder`/`token` of the Lease `name`.
    pub fn new(leases: Api<Lease>, name: &str, holder: &str, token: i64) -> Self {
        HandOff {
            leases,
            name: name.to_string(),
            holder: holder.to_string(),
            token,
        }
    }

    /// The fencing token of the hold.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// Reads the Lease and checks the hold: `Err(NotHeld)` when it no longer stands.
    pub async fn check(&self) -> Result<(), GuardError> {
        let lease = self
            .leases
            .get_opt(&self.name)
            .await
            .map_err(api_err(&self.name))?;
        match hold_refusal(&self.holder, self.token, lease.as_ref(), Timestamp::now()) {
            None => Ok(()),
            Some(seen) => Err(GuardError::NotHeld {
                name: self.name.clone(),
                holder: self.holder.clone(),
                token: self.token,
                seen,
            }),
        }
    }

    /// Runs `fut` while the hold stands (checked now, then every [`HANDOFF_CHECK`] and once
    /// more when `fut` ends): `Err(NotHeld)` (and `fut` dropped) as soon as it does not.
    pub async fn run<F: Future>(&self, fut: F) -> Result<F::Output, GuardError> {
        self.check().await?;
        let watch = async {
            loop {
                tokio::time::sleep(HANDOFF_CHECK).await;
                if let Err(e) = self.check().await {
                    return e;
                }
            }
        };
        let out = tokio::select! {
            e = watch => return Err(e),
            out = fut => out,
        };
        self.check().await?;
        Ok(out)
    }
}

/// What stands against the hold `holder`/`token` in a Lease as read at `now` (pure); `None`
/// when the Lease is held, unexpired, by that holder with that fencing token.
pub fn hold_refusal(
    holder: &str,
    token: i64,
    lease: Option<&Lease>,
    now: Timestamp,
) -> Option<String> {
    let Some(lease) = lease else {
        return Some("there is no Lease".into());
    };
    let view = LeaseView::of(Some(lease), now);
    match view.holder.as_deref() {
        None => Some("nobody holds it".into()),
        Some(h) if h != holder => Some(format!("it is held by {h}")),
        Some(_) if i64::from(view.transitions) != token => Some(format!(
            "its fencing token is {} (the guard was released and taken again since)",
            view.transitions
        )),
        Some(_) if view.expired => Some("the holder's time ran out".into()),
        Some(_) => None,
    }
}

/// How often work under a [`HandOff`] reads the Lease again (a fifth of the default lease
/// duration: a holder that stops renewing is noticed well before another could take over).
pub const HANDOFF_CHECK: Duration = Duration::from_secs(3);

/// The held lease with its holder cleared (`leaseTransitions` kept).
fn cleared(shared: &Arc<Mutex<Lease>>) -> Lease {
    let mut lease = match shared.lock() {
        Ok(l) => l.clone(),
        Err(p) => p.into_inner().clone(),
    };
    if let Some(spec) = lease.spec.as_mut() {
        spec.holder_identity = None;
        spec.acquire_time = None;
        spec.renew_time = None;
    }
    lease
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.stop.cancel();
        let Some(renewer) = self.renewer.take() else {
            return;
        };
        if self.lost.is_cancelled() {
            return;
        }
        self.lost.cancel();
        // Best effort: without a runtime the lease simply expires.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let leases = self.leases.clone();
            let name = self.name.clone();
            let shared = self.lease.clone();
            rt.spawn(async move {
                let _ = renewer.await;
                let lease = cleared(&shared);
                let _ = leases.replace(&name, &PostParams::default(), &lease).await;
            });
        }
    }
}

/// Renews the lease until stopped; on losing it, cancels `lost`.
async fn renew_loop(
    leases: Api<Lease>,
    name: String,
    shared: Arc<Mutex<Lease>>,
    cfg: GuardConfig,
    mut last_ok: Instant,
    lost: CancellationToken,
    stop: CancellationToken,
) {
    let every = cfg.renew_every();
    let trust = cfg.trust_window();
    let mut next = last_ok + every;
    loop {
        let trusted_until = last_ok + trust;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep_until(next.min(trusted_until)) => {}
        }
        if Instant::now() >= trusted_until {
            tracing::warn!(lease = %name, "lease not renewed in time; treating it as lost");
            lost.cancel();
            return;
        }
        let attempt = Instant::now();
        let mut lease = match shared.lock() {
            Ok(l) => l.clone(),
            Err(p) => p.into_inner().clone(),
        };
        if let Some(spec) = lease.spec.as_mut() {
            spec.renew_time = Some(MicroTime(Timestamp::now()));
        }
        let pp = PostParams::default();
        // Not cut short by `stop`: a renewal the API server applied but whose answer was
        // dropped would leave a stale resourceVersion, and the release's conditioned update
        // would then fail (409) as if someone else had taken the lease. A command ending just
        // as a renewal went out under load did exactly that.
        let req = leases.replace(&name, &pp, &lease);
        let res = tokio::time::timeout_at(trusted_until, req).await;
        match res {
            Ok(Ok(new)) => {
                if let Ok(mut l) = shared.lock() {
                    *l = new;
                }
                last_ok = attempt;
                next = attempt + every;
            }
            Ok(Err(e)) if is_conflict(&e) || is_gone(&e) => {
                tracing::warn!(lease = %name, error = %e, "lease lost");
                lost.cancel();
                return;
            }
            Ok(Err(e)) => {
                tracing::debug!(lease = %name, error = %e, "lease renewal failed; retrying");
                next = Instant::now() + every / 4;
            }
            Err(_) => {
                tracing::warn!(lease = %name, "lease renewal timed out; treating it as lost");
                lost.cancel();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn held(renew: i64, dur: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some("other".into()),
            lease_duration_seconds: Some(dur),
            renew_time: Some(MicroTime(ts(renew))),
            lease_transitions: Some(4),
            ..Default::default()
        }
    }

    const SKEW: Duration = Duration::from_secs(2);
    const DEF: Duration = Duration::from_secs(15);

    #[test]
    fn a_handed_over_hold_stands_only_for_its_holder_token_and_time() {
        let lease = |spec: LeaseSpec| Lease {
            spec: Some(spec),
            ..Default::default()
        };
        let l = lease(held(0, 10));
        assert_eq!(hold_refusal("other", 4, Some(&l), ts(5)), None);
        let why = |h: &str, t: i64, l: Option<&Lease>, at: i64| {
            hold_refusal(h, t, l, ts(at)).unwrap_or_default()
        };
        assert!(why("other", 4, None, 0).contains("no Lease"));
        assert!(why("me", 4, Some(&l), 5).contains("held by other"));
        assert!(why("other", 3, Some(&l), 5).contains("fencing token is 4"));
        assert!(why("other", 4, Some(&l), 13).contains("time ran out"));
        let mut free = held(0, 10);
        free.holder_identity = None;
        assert!(why("other", 4, Some(&lease(free)), 5).contains("nobody"));
    }

    #[test]
    fn missing_or_released_lease_is_free() {
        assert_eq!(judge(None, ts(0), Duration::ZERO, SKEW, DEF), Verdict::Take);
        let mut s = held(0, 10);
        s.holder_identity = None;
        assert_eq!(
            judge(Some(&s), ts(0), Duration::ZERO, SKEW, DEF),
            Verdict::Take
        );
        s.holder_identity = Some(String::new());
        assert_eq!(
            judge(Some(&s), ts(0), Duration::ZERO, SKEW, DEF),
            Verdict::Take
        );
    }

    #[test]
    fn held_lease_waits_until_renew_time_plus_duration_plus_skew() {
        let s = held(0, 10);
        let z = Duration::ZERO;
        assert_eq!(judge(Some(&s), ts(5), z, SKEW, DEF), Verdict::Wait);
        assert_eq!(judge(Some(&s), ts(10), z, SKEW, DEF), Verdict::Wait);
        assert_eq!(judge(Some(&s), ts(11), z, SKEW, DEF), Verdict::Wait);
        assert_eq!(judge(Some(&s), ts(12), z, SKEW, DEF), Verdict::Take);
    }

    #[test]
    fn unchanged_for_a_full_duration_is_expired_whatever_the_clocks_say() {
        // The holder's clock runs ahead: renewTime is in our future.
        let s = held(1000, 10);
        assert_eq!(
            judge(Some(&s), ts(0), Duration::from_secs(9), SKEW, DEF),
            Verdict::Wait
        );
        assert_eq!(
            judge(Some(&s), ts(0), Duration::from_secs(10), SKEW, DEF),
            Verdict::Take
        );
    }

    #[test]
    fn default_duration_applies_when_the_lease_has_none() {
        let mut s = held(0, 10);
        s.lease_duration_seconds = None;
        assert_eq!(
            judge(Some(&s), ts(16), Duration::ZERO, SKEW, DEF),
            Verdict::Wait
        );
        assert_eq!(
            judge(Some(&s), ts(17), Duration::ZERO, SKEW, DEF),
            Verdict::Take
        );
        s.renew_time = None;
        assert_eq!(
            judge(Some(&s), ts(100), Duration::ZERO, SKEW, DEF),
            Verdict::Wait
        );
        assert_eq!(judge(Some(&s), ts(100), DEF, SKEW, DEF), Verdict::Take);
    }

    #[test]
    fn taking_bumps_transitions_and_sets_holder() {
        let cfg = GuardConfig {
            holder: "me".into(),
            lease_duration: Duration::from_secs(3),
            ..Default::default()
        };
        let t = taken_spec(Some(&held(0, 10)), &cfg, ts(20));
        assert_eq!(t.lease_transitions, Some(5));
        assert_eq!(t.holder_identity.as_deref(), Some("me"));
        assert_eq!(t.lease_duration_seconds, Some(3));
        assert_eq!(t.acquire_time, Some(MicroTime(ts(20))));
        assert_eq!(taken_spec(None, &cfg, ts(0)).lease_transitions, Some(1));
    }

    #[test]
    fn trust_window_ends_before_the_lease_could_expire() {
        for secs in [1, 3, 15, 60] {
            let cfg = GuardConfig::with_duration(Duration::from_secs(secs));
            let d = Duration::from_secs(secs);
            assert!(cfg.trust_window() < d);
            assert!(cfg.renew_every() < cfg.trust_window());
        }
        let sub = GuardConfig::with_duration(Duration::from_millis(200));
        assert_eq!(sub.duration_secs(), 1);
    }

    #[test]
    fn holder_identity_is_unique() {
        let a = holder_identity();
        assert_ne!(a, holder_identity());
        assert_eq!(a.matches('/').count(), 2);
    }
}
