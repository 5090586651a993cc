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
//!
//! **Fair hand-off.** A contender that finds the lease held queues in a one-place slot on the
//! Lease (annotations [`NEXT_ANNOTATION`], [`NEXT_RENEW_ANNOTATION`]) and refreshes its claim
//! while it waits; when the lease is free, only the slot's owner takes it while the claim is
//! fresh. A holder that releases keeps the slot, so it cannot take the guard again ahead of
//! the contender queued behind it. Waiters learn of a release from a watch on the one Lease
//! (polling only as a slow fallback). A contender writes the slot only while the holder is one
//! that expects it ([`FAIR_HOLDER_ANNOTATION`] names it), since the write changes the
//! `resourceVersion` its renewal is conditioned on: a holder that expects it re-reads on a 409
//! and renews again if the Lease is still its own; one that does not would take the 409 as a
//! loss. A holder whose hold was shared (its acquisition waited, or it took the Lease from
//! another holder or created it) leaves the free Lease to others after releasing it until the
//! Lease shows another party acting (a take or a claim), for at most [`YIELD`]: the waiter's
//! claim races a short turn and may not have landed. A client unaware of the slot still
//! excludes everyone by the conditioned writes; it only ignores the queue.

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
    /// Whether this contender queues for the Lease while it waits (the fair hand-off of
    /// docs/protocol.md). Off for a leader election: its standby waits for a holder that does
    /// not release, and a claim refreshed every third of the duration would only cost writes
    /// (and the leader a conflict and a read on each).
    pub queue: bool,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            lease_duration: Duration::from_secs(15),
            renew_interval: None,
            retry_interval: Duration::from_millis(200),
            clock_skew: Duration::from_secs(2),
            holder: holder_identity(),
            queue: true,
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
    /// No holder, or the holder's time is up, and nobody else is queued: try the conditioned
    /// takeover (which clears the queue slot).
    Take,
    /// Someone holds it, or another contender is queued for it: wait.
    Wait,
    /// Someone holds it and the queue slot is free, stale or this contender's: claim (or
    /// refresh) the slot with a conditioned update, then wait.
    Queue,
}

impl Verdict {
    /// The verdict's name in the vectors and the docs.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Take => "Take",
            Verdict::Wait => "Wait",
            Verdict::Queue => "Queue",
        }
    }
}

/// Annotation on a guard Lease: the holder identity of the contender queued next.
pub const NEXT_ANNOTATION: &str = "agentbox.dev/guard-next";
/// Annotation on a guard Lease: when the queued contender last claimed or refreshed its place
/// (RFC 3339 with microseconds, as a `MicroTime`).
pub const NEXT_RENEW_ANNOTATION: &str = "agentbox.dev/guard-next-renew";
/// Annotation on a guard Lease: the holder identity of the holder that took it knowing the
/// queue slot (it re-reads on a 409 instead of taking it as a loss). Contenders write the slot
/// only while the Lease's holder is the one named here.
pub const FAIR_HOLDER_ANNOTATION: &str = "agentbox.dev/guard-fair-holder";

/// A contender's reading of a lease: what it read, when, and for how long (on its own
/// monotonic clock) it has seen the parts that matter unchanged.
#[derive(Clone, Copy, Debug)]
pub struct Reading<'a> {
    /// The lease's spec (`None`: no lease).
    pub spec: Option<&'a LeaseSpec>,
    /// The lease's annotations (the queue slot).
    pub annotations: Option<&'a BTreeMap<String, String>>,
    /// The contender's wall clock.
    pub now: Timestamp,
    /// How long `holderIdentity` and `renewTime` have been unchanged. Not the
    /// `resourceVersion`: queue claims change that while the holder is gone.
    pub unchanged_for: Duration,
    /// How long the queue slot (its owner and renew time) has been unchanged.
    pub slot_unchanged_for: Duration,
}

/// The queue slot's owner if its claim is fresh (pure): named, and neither its renew time plus
/// `duration` plus `clock_skew` is past nor has it been unchanged for `duration`. A claim
/// without a readable renew time is stale.
pub fn fresh_slot(
    annotations: Option<&BTreeMap<String, String>>,
    now: Timestamp,
    slot_unchanged_for: Duration,
    duration: Duration,
    clock_skew: Duration,
) -> Option<&str> {
    let a = annotations?;
    let owner = a
        .get(NEXT_ANNOTATION)
        .map(String::as_str)
        .filter(|o| !o.is_empty())?;
    let renew: Timestamp = a.get(NEXT_RENEW_ANNOTATION)?.parse().ok()?;
    let until = renew
        .checked_add(SignedDuration::try_from(duration + clock_skew).ok()?)
        .ok()?;
    (until > now && slot_unchanged_for < duration).then_some(owner)
}

/// Decides what a contender may do with a lease it has just read (pure).
///
/// `me` is the contender's holder identity; `None` gives the verdict of a contender that does
/// not take part in the queue (the rule before the queue slot, and what a client unaware of it
/// does): `Take` when the lease is free or expired, else `Wait`. The lease is held while it has
/// a holder, its time is not up by [`LeaseView`]'s rule, and its holder and renew time have not
/// been seen unchanged for a full duration. Then:
/// - free (or expired): `Take`, unless another contender's claim on the slot is fresh: `Wait`;
/// - held by a holder that expects the queue ([`FAIR_HOLDER_ANNOTATION`]): `Queue` when the
///   slot is empty, stale or `me`'s, else `Wait`;
/// - held by any other holder: `Wait` (writing the slot would make its renewal fail).
pub fn judge(
    r: &Reading<'_>,
    me: Option<&str>,
    clock_skew: Duration,
    default_duration: Duration,
) -> Verdict {
    let view = LeaseView::read(r.spec, r.now, clock_skew, default_duration);
    let held = view.is_held() && r.unchanged_for < view.duration;
    let Some(me) = me else {
        return if held { Verdict::Wait } else { Verdict::Take };
    };
    let slot = fresh_slot(
        r.annotations,
        r.now,
        r.slot_unchanged_for,
        view.duration,
        clock_skew,
    );
    let others_queued = slot.is_some_and(|o| o != me);
    if !held {
        return if others_queued {
            Verdict::Wait
        } else {
            Verdict::Take
        };
    }
    let fair = r
        .annotations
        .and_then(|a| a.get(FAIR_HOLDER_ANNOTATION))
        .is_some_and(|f| Some(f.as_str()) == view.holder.as_deref());
    if fair && !others_queued {
        Verdict::Queue
    } else {
        Verdict::Wait
    }
}

/// A `MicroTime` as the API server writes it (RFC 3339, UTC, six fraction digits).
pub fn micro_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// The annotations written when taking a lease (pure): the queue slot cleared (it was empty,
/// stale or the taker's) and the taker named as a holder that expects the queue.
pub fn taken_annotations(
    old: Option<&BTreeMap<String, String>>,
    me: &str,
) -> BTreeMap<String, String> {
    let mut a = old.cloned().unwrap_or_default();
    a.remove(NEXT_ANNOTATION);
    a.remove(NEXT_RENEW_ANNOTATION);
    a.insert(FAIR_HOLDER_ANNOTATION.into(), me.into());
    a
}

/// The annotations written when claiming or refreshing the queue slot at `now` (pure).
pub fn claimed_annotations(
    old: Option<&BTreeMap<String, String>>,
    me: &str,
    now: Timestamp,
) -> BTreeMap<String, String> {
    let mut a = old.cloned().unwrap_or_default();
    a.insert(NEXT_ANNOTATION.into(), me.into());
    a.insert(NEXT_RENEW_ANNOTATION.into(), micro_time(now));
    a
}

/// The annotations written by a contender that gives up waiting (pure): the slot cleared if it
/// is still `me`'s; `None` when it is not (nothing to write).
pub fn withdrawn_annotations(
    old: Option<&BTreeMap<String, String>>,
    me: &str,
) -> Option<BTreeMap<String, String>> {
    let a = old?;
    if a.get(NEXT_ANNOTATION).map(String::as_str) != Some(me) {
        return None;
    }
    let mut a = a.clone();
    a.remove(NEXT_ANNOTATION);
    a.remove(NEXT_RENEW_ANNOTATION);
    Some(a)
}

/// The spec written when releasing a lease (pure): no holder and no times, the duration and
/// `leaseTransitions` (the fencing token) kept. The annotations are kept as they are: the
/// queue slot stays, so the releaser cannot take the guard again ahead of the contender in it.
pub fn released_spec(spec: &LeaseSpec) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        acquire_time: None,
        renew_time: None,
        ..spec.clone()
    }
}

/// Whether a hold is shared (pure), so that its holder yields after releasing it ([`YIELD`]):
/// its acquisition had to wait for another party (`waited`; waiting out its own yield does not
/// count), or the Lease it took did not name `me` as its last fair holder (`before`: the
/// Lease's annotations as taken, `None` when it created the Lease), so someone else used it
/// last. A contender outside the queue (a leader election) never yields.
pub fn shared_hold(
    queue: bool,
    waited: bool,
    before: Option<&BTreeMap<String, String>>,
    me: &str,
) -> bool {
    let last_was_me = before
        .and_then(|a| a.get(FAIR_HOLDER_ANNOTATION))
        .is_some_and(|f| f == me);
    queue && (waited || !last_was_me)
}

/// How much longer a contender whose verdict is [`Verdict::Take`] leaves the free Lease to
/// others (pure): what is left of its yield (`yield_left`: [`YIELD`] less the time since its
/// last release of a shared hold, zero without one), if the Lease still names `me` as its last
/// fair holder and the queue slot is not `me`'s; else zero. Only the last holder yields, so two
/// harnesses that both released recently never both stand back.
pub fn yield_for(
    annotations: Option<&BTreeMap<String, String>>,
    me: &str,
    yield_left: Duration,
) -> Duration {
    let get = |k: &str| annotations.and_then(|a| a.get(k)).map(String::as_str);
    if get(NEXT_ANNOTATION) == Some(me) || get(FAIR_HOLDER_ANNOTATION) != Some(me) {
        return Duration::ZERO;
    }
    yield_left
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

/// The longest a holder whose hold was shared leaves a free Lease without a claim to others
/// after releasing it. The one that waited meanwhile may not have claimed the queue slot yet
/// (its claim races the holder's turn, and loses to a short one), and without this the
/// releaser, wanting the guard again at once, would take it first. The yield ends as soon as
/// the Lease shows another party acting (it takes the Lease or claims the slot), so this bound
/// only matters when nobody else wants the guard any more; it is long enough for a waiter's
/// watch to deliver the release and its take to land on a loaded machine (100 ms was not: a
/// hand-over was lost whenever the waiter's reaction took longer).
pub const YIELD: Duration = Duration::from_secs(1);

/// When each holder of this process last released a Lease after a contended hold.
static RELEASED: std::sync::LazyLock<Mutex<std::collections::HashMap<String, Instant>>> =
    std::sync::LazyLock::new(Default::default);

fn release_key(leases: &Api<Lease>, name: &str, holder: &str) -> String {
    format!("{}/{name}\n{holder}", leases.resource_url())
}

fn record_release(leases: &Api<Lease>, name: &str, holder: &str) {
    if let Ok(mut r) = RELEASED.lock() {
        r.retain(|_, at| at.elapsed() < YIELD);
        r.insert(release_key(leases, name, holder), Instant::now());
    }
}

/// How much longer `holder` yields the free Lease `name` after its last contended release.
fn yield_left(leases: &Api<Lease>, name: &str, holder: &str) -> Duration {
    let at = RELEASED
        .lock()
        .ok()
        .and_then(|r| r.get(&release_key(leases, name, holder)).copied());
    at.map(|at| YIELD.saturating_sub(at.elapsed()))
        .unwrap_or_default()
}

/// How long a waiting contender goes at most without reading the Lease again while it
/// watches it (a third of the lease duration when that is shorter): the fallback for a watch
/// that missed an event, and the pace at which expiry and stale claims are noticed.
pub const WATCH_FALLBACK: Duration = Duration::from_secs(2);

/// Acquires the Lease `name` (creating it with `labels` if missing), waiting up to `wait`
/// (`None` = indefinitely) while someone else holds it.
///
/// While it waits, it holds the Lease's queue slot (see the module docs) when it can, watches
/// the Lease to learn of a release at once, and gives the slot up if it stops waiting.
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
    let mut w = Waiter {
        leases: leases.clone(),
        name: name.to_string(),
        me: cfg.holder.clone(),
        holder_seen: None,
        slot_seen: None,
        waited: false,
        took_from: None,
        yield_until: None,
        last_holder: String::new(),
        claimed_at: None,
        watch: None,
    };
    loop {
        let attempt = Instant::now();
        let may_queue = cfg.queue && deadline.is_none_or(|d| attempt < d);
        let pause = match w.step(&labels, cfg, may_queue).await {
            Ok(Step::Took(lease)) => {
                w.claimed_at = None;
                let mut g = Guard::start(leases.clone(), name, *lease, cfg, attempt);
                g.contended = shared_hold(cfg.queue, w.waited, w.took_from.as_ref(), &cfg.holder);
                return Ok(g);
            }
            Ok(Step::Again) => {
                w.waited = true;
                // Lost a race: contended. Watch from now on, so that the next change is seen
                // at once (without it, a waiter's first claim kept losing to a holder taking
                // turns of a few milliseconds); but read the Lease itself next: what the watch
                // delivered so far may be what the 409 was about (the watch trails the API
                // server, and a waiter that trusted it kept losing to a fast holder).
                w.watch_from("", cfg.retry_interval);
                if let Some(rx) = w.watch.as_mut() {
                    rx.borrow_and_update();
                }
                continue;
            }
            Ok(Step::Wait { rv, lease_duration }) => {
                // Waiting out its own yield is not contention: a harness whose partner left
                // would otherwise yield again after every turn.
                if w.yield_until.is_none() {
                    w.waited = true;
                }
                w.watch_from(&rv, cfg.retry_interval);
                let mut pause = WATCH_FALLBACK.min(cfg.renew_every());
                if let Some(y) = w.yield_until.take() {
                    pause = pause.min(y.saturating_duration_since(Instant::now()));
                }
                if let Some(at) = w.claimed_at {
                    // Refresh the claim every third of the shorter of the two durations, so
                    // that it stays fresh by the Lease's duration whoever wrote it.
                    let every = refresh_every(cfg, lease_duration);
                    pause = pause.min((at + every).saturating_duration_since(Instant::now()));
                }
                pause
            }
            Err(e) if is_retryable(&e) => {
                tracing::debug!(lease = name, error = %e, "lease acquire attempt failed");
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    w.withdraw().await;
                    return Err(api_err(name)(e));
                }
                jittered(cfg.retry_interval)
            }
            Err(e) => {
                w.withdraw().await;
                return Err(api_err(name)(e));
            }
        };
        let mut until = Instant::now() + pause;
        if let Some(d) = deadline {
            if Instant::now() >= d {
                w.withdraw().await;
                return Err(GuardError::Timeout {
                    name: name.to_string(),
                    holder: std::mem::take(&mut w.last_holder),
                });
            }
            until = until.min(d);
        }
        tokio::select! {
            _ = w.changed() => {}
            _ = tokio::time::sleep_until(until) => {}
        }
    }
}

/// The queue claim's refresh period: a third of the shorter of the contender's own lease
/// duration and the Lease's.
fn refresh_every(cfg: &GuardConfig, lease_duration: Duration) -> Duration {
    let own = Duration::from_secs(u64::from(cfg.duration_secs().unsigned_abs()));
    own.min(lease_duration) / 3
}

/// What one attempt came to.
enum Step {
    /// The lease is ours.
    Took(Box<Lease>),
    /// Read again at once (a conditioned write lost a race).
    Again,
    /// Wait for a change of the Lease, watched from `rv`.
    Wait {
        rv: String,
        lease_duration: Duration,
    },
}

/// A contender's state while it waits for one Lease.
struct Waiter {
    leases: Api<Lease>,
    name: String,
    me: String,
    /// The holder and renew time last seen, and since when (monotonic).
    holder_seen: Option<(String, Instant)>,
    /// The queue slot last seen, and since when (monotonic).
    slot_seen: Option<(String, Instant)>,
    /// Whether this acquisition had to wait for another party (the guard is contended).
    waited: bool,
    /// The annotations of the Lease as it took it (`None`: it created it), for [`shared_hold`].
    took_from: Option<BTreeMap<String, String>>,
    /// Until when this contender yields a free Lease to others (see [`YIELD`]).
    yield_until: Option<Instant>,
    last_holder: String,
    /// When this contender last wrote its claim on the queue slot (`None`: it holds none).
    claimed_at: Option<Instant>,
    /// This waiter's subscription to the process's watch of the Lease: each new value is the
    /// Lease as the watch delivered it (`None`: deleted, or read it again), read instead of a
    /// GET (a waiter that reacts one request sooner claims the slot before a short turn ends).
    watch: Option<tokio::sync::watch::Receiver<Seen>>,
}

/// How long `key` has been seen unchanged, restarting the count when it changed.
fn unchanged(seen: &mut Option<(String, Instant)>, key: String) -> Duration {
    match seen {
        Some((k, t)) if *k == key => t.elapsed(),
        _ => {
            *seen = Some((key, Instant::now()));
            Duration::ZERO
        }
    }
}

impl Waiter {
    /// One attempt: read the Lease, judge it, and take it, claim the slot, or wait.
    async fn step(
        &mut self,
        labels: &BTreeMap<String, String>,
        cfg: &GuardConfig,
        may_queue: bool,
    ) -> Result<Step, kube::Error> {
        let now = Timestamp::now();
        let delivered = match self.watch.as_mut() {
            Some(rx) if rx.has_changed().unwrap_or(false) => rx.borrow_and_update().1.clone(),
            _ => None,
        };
        let read = match delivered {
            Some(l) => Some(l),
            None => self.leases.get_opt(&self.name).await?,
        };
        let Some(mut lease) = read else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    labels: Some(labels.clone()).filter(|l| !l.is_empty()),
                    annotations: Some(taken_annotations(None, &self.me)),
                    ..Default::default()
                },
                spec: Some(taken_spec(None, cfg, now)),
            };
            self.took_from = None;
            return match self.leases.create(&PostParams::default(), &lease).await {
                Ok(l) => Ok(Step::Took(Box::new(l))),
                Err(e) if is_conflict(&e) => Ok(Step::Again),
                Err(e) => Err(e),
            };
        };
        let rv = lease.metadata.resource_version.clone().unwrap_or_default();
        let spec = lease.spec.clone();
        let holder = spec
            .as_ref()
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default();
        let renew = spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| micro_time(t.0))
            .unwrap_or_default();
        let unchanged_for = unchanged(&mut self.holder_seen, format!("{holder}\n{renew}"));
        let ann = lease.metadata.annotations.clone();
        let slot_key = ann
            .as_ref()
            .map(|a| {
                let g = |k: &str| a.get(k).cloned().unwrap_or_default();
                format!("{}\n{}", g(NEXT_ANNOTATION), g(NEXT_RENEW_ANNOTATION))
            })
            .unwrap_or_default();
        let slot_unchanged_for = unchanged(&mut self.slot_seen, slot_key);
        self.last_holder = holder;
        let reading = Reading {
            spec: spec.as_ref(),
            annotations: ann.as_ref(),
            now,
            unchanged_for,
            slot_unchanged_for,
        };
        let verdict = judge(&reading, Some(&self.me), cfg.clock_skew, cfg.lease_duration);
        let lease_duration =
            LeaseView::read(spec.as_ref(), now, cfg.clock_skew, cfg.lease_duration).duration;
        let own_slot = ann
            .as_ref()
            .and_then(|a| a.get(NEXT_ANNOTATION))
            .is_some_and(|o| *o == self.me);
        if !own_slot {
            self.claimed_at = None;
        }
        let wait = Step::Wait { rv, lease_duration };
        match verdict {
            Verdict::Wait => Ok(wait),
            Verdict::Queue => {
                let due = match self.claimed_at {
                    Some(at) => at.elapsed() >= refresh_every(cfg, lease_duration),
                    None => true,
                };
                if !may_queue || !due {
                    return Ok(wait);
                }
                let at = Instant::now();
                lease.metadata.annotations = Some(claimed_annotations(
                    ann.as_ref(),
                    &self.me,
                    Timestamp::now(),
                ));
                // Conditioned on the resourceVersion read: a 409 means the Lease changed
                // (released, taken, renewed, or claimed by another): read it again.
                match self
                    .leases
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(l) => {
                        self.claimed_at = Some(at);
                        Ok(Step::Wait {
                            rv: l.metadata.resource_version.unwrap_or_default(),
                            lease_duration,
                        })
                    }
                    Err(e) if is_conflict(&e) => Ok(Step::Again),
                    Err(e) => Err(e),
                }
            }
            Verdict::Take => {
                let left = yield_left(&self.leases, &self.name, &self.me);
                let grace = yield_for(ann.as_ref(), &self.me, left);
                if !grace.is_zero() {
                    // Just released after a shared hold: give whoever waited for it the time to
                    // claim the slot or take it; a watch event showing it act ends this early
                    // (module docs, "yield").
                    self.yield_until = Some(Instant::now() + grace);
                    return Ok(wait);
                }
                self.took_from = Some(ann.clone().unwrap_or_default());
                lease.spec = Some(taken_spec(spec.as_ref(), cfg, now));
                lease.metadata.annotations = Some(taken_annotations(ann.as_ref(), &self.me));
                // Keep the scope labels current on an existing lease too.
                if !labels.is_empty() {
                    let l = lease.metadata.labels.get_or_insert_with(BTreeMap::new);
                    l.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
                // `replace` sends metadata.resourceVersion: the API server refuses (409) if
                // anyone wrote the lease since we read it.
                match self
                    .leases
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    Ok(l) => Ok(Step::Took(Box::new(l))),
                    Err(e) if is_conflict(&e) => Ok(Step::Again),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Subscribes (once) to the process's watch of the Lease, started from `rv` if there is
    /// none yet.
    fn watch_from(&mut self, rv: &str, retry: Duration) {
        if self.watch.is_none() {
            let mut rx = subscribe(&self.leases, &self.name, rv, retry);
            // Something newer than what this waiter read already went by: look again.
            let seen = rx
                .borrow_and_update()
                .1
                .as_ref()
                .map(|l| l.metadata.resource_version.clone().unwrap_or_default());
            if seen.is_some_and(|v| v != rv) {
                rx.mark_changed();
            }
            self.watch = Some(rx);
        }
    }

    /// Resolves when the watch delivered something new (never without a watch).
    async fn changed(&mut self) {
        match self.watch.as_mut() {
            Some(rx) => {
                if rx.changed().await.is_err() {
                    // The watch task ended: subscribe again on the next wait.
                    self.watch = None;
                    std::future::pending::<()>().await
                }
            }
            None => std::future::pending::<()>().await,
        }
    }

    /// Gives up the queue slot if this contender holds it (best effort: a claim left behind
    /// goes stale within a lease duration anyway).
    async fn withdraw(&mut self) {
        if self.claimed_at.take().is_none() {
            return;
        }
        withdraw(&self.leases, &self.name, &self.me).await;
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // An acquire dropped while it waited (its caller gave up): give the slot back.
        if self.claimed_at.take().is_some()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let (leases, name, me) = (self.leases.clone(), self.name.clone(), self.me.clone());
            rt.spawn(async move { withdraw(&leases, &name, &me).await });
        }
    }
}

async fn withdraw(leases: &Api<Lease>, name: &str, me: &str) {
    for _ in 0..3 {
        let Ok(Some(mut lease)) = leases.get_opt(name).await else {
            return;
        };
        let Some(a) = withdrawn_annotations(lease.metadata.annotations.as_ref(), me) else {
            return;
        };
        lease.metadata.annotations = Some(a);
        match leases.replace(name, &PostParams::default(), &lease).await {
            Err(e) if is_conflict(&e) => continue,
            _ => return,
        }
    }
}

/// What a Lease watch delivers: a sequence number and the Lease as delivered (`None`:
/// deleted, or the watch broke and the waiter should read it).
type Seen = (u64, Option<Lease>);

/// The Lease watches of this process, one per Lease, shared by every waiter on it and kept
/// open a while after the last one left: harnesses taking turns wait again at once, and a
/// watch opened anew each time (a new connection under HTTP/1.1) is slower than their turns.
static WATCHES: std::sync::LazyLock<
    Mutex<std::collections::HashMap<String, tokio::sync::watch::Sender<Seen>>>,
> = std::sync::LazyLock::new(Default::default);

/// How long a Lease watch stays open with nobody waiting on it.
const WATCH_LINGER: Duration = Duration::from_secs(60);

/// A subscription to the process's watch of the Lease `name`, started from `rv` if none is
/// open.
fn subscribe(
    leases: &Api<Lease>,
    name: &str,
    rv: &str,
    retry: Duration,
) -> tokio::sync::watch::Receiver<Seen> {
    let key = format!("{}/{name}", leases.resource_url());
    let mut all = match WATCHES.lock() {
        Ok(w) => w,
        Err(p) => p.into_inner(),
    };
    if let Some(tx) = all.get(&key) {
        return tx.subscribe();
    }
    let (tx, rx) = tokio::sync::watch::channel((0, None));
    all.insert(key.clone(), tx.clone());
    tokio::spawn(watch_lease(
        leases.clone(),
        name.to_string(),
        rv.to_string(),
        tx,
        key,
        retry,
    ));
    rx
}

/// Watches the one Lease `name` from `rv` and sends every event to `tx`; opened again when
/// the server ends it, and from the newest state when it refuses the version (410). When it
/// cannot be opened at all (no `watch` permission, no API server), it sends `None` every
/// `retry` (jittered): the waiters poll instead. Ends once nobody has subscribed for
/// [`WATCH_LINGER`].
async fn watch_lease(
    leases: Api<Lease>,
    name: String,
    mut rv: String,
    tx: tokio::sync::watch::Sender<Seen>,
    key: String,
    retry: Duration,
) {
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};
    let wp = WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(240);
    let mut seq = 0u64;
    let mut send = |l: Option<Lease>| {
        seq += 1;
        tx.send_replace((seq, l));
    };
    let mut idle_since: Option<Instant> = None;
    loop {
        // Ends when nobody waited for a while; the registry forgets it first, so a new waiter
        // starts a new watch rather than subscribe to one about to end.
        if tx.receiver_count() == 0 {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= WATCH_LINGER
                && let Ok(mut all) = WATCHES.lock()
                && tx.receiver_count() == 0
            {
                all.remove(&key);
                return;
            }
        } else {
            idle_since = None;
        }
        match leases.watch(&wp, &rv).await {
            Ok(stream) => {
                let mut stream = std::pin::pin!(stream);
                loop {
                    let next = tokio::time::timeout(WATCH_LINGER, stream.next()).await;
                    let ev = match next {
                        Ok(Some(ev)) => ev,
                        Ok(None) => break,
                        // Quiet for a while: look at the subscribers again.
                        Err(_) if tx.receiver_count() == 0 => break,
                        Err(_) => continue,
                    };
                    match ev {
                        Ok(WatchEvent::Added(l) | WatchEvent::Modified(l)) => {
                            rv = l.metadata.resource_version.clone().unwrap_or_default();
                            send(Some(l));
                        }
                        Ok(WatchEvent::Deleted(l)) => {
                            rv = l.metadata.resource_version.unwrap_or_default();
                            send(None);
                        }
                        Ok(WatchEvent::Bookmark(b)) => rv = b.metadata.resource_version,
                        Ok(WatchEvent::Error(_)) | Err(_) => {
                            // Too old a version (410) or a broken stream: start from now, and
                            // let the waiters read what they may have missed.
                            rv.clear();
                            send(None);
                            break;
                        }
                    }
                }
            }
            Err(e) => {
                tracing::debug!(lease = %name, error = %e, "cannot watch the lease; polling");
                tokio::time::sleep(jittered(retry)).await;
                send(None);
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
    /// This hold was shared (its acquisition waited, or it took the Lease from another holder
    /// or created it): on release, yield the next turn (see [`YIELD`]).
    contended: bool,
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
            token,
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
            contended: false,
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
        // Released or failed, the guard is no longer ours to use.
        self.lost.cancel();
        let res = release_lease(
            &self.leases,
            &self.name,
            &self.lease,
            &self.holder,
            self.token,
        )
        .await;
        if self.contended && res.is_ok() {
            record_release(&self.leases, &self.name, &self.holder);
        }
        res
    }
}

/// Whether a Lease as read is still held by `holder` with fencing token `token` (whatever else
/// changed: a contender's claim on the queue slot changes the `resourceVersion` only).
fn still_ours(lease: &Lease, holder: &str, token: i64) -> bool {
    lease.spec.as_ref().is_some_and(|s| {
        s.holder_identity.as_deref() == Some(holder)
            && i64::from(s.lease_transitions.unwrap_or(0)) == token
    })
}

/// Clears the holder with an update conditioned on the resourceVersion last seen; on a 409,
/// reads the Lease again and, if it is still ours, releases that (a queued contender wrote
/// its claim meanwhile). `Err(Lost)` if someone else took it or it is gone.
async fn release_lease(
    leases: &Api<Lease>,
    name: &str,
    shared: &Arc<Mutex<Lease>>,
    holder: &str,
    token: i64,
) -> Result<(), GuardError> {
    let mut lease = match shared.lock() {
        Ok(l) => l.clone(),
        Err(p) => p.into_inner().clone(),
    };
    for _ in 0..5 {
        let mut body = lease.clone();
        body.spec = body.spec.as_ref().map(released_spec);
        match leases.replace(name, &PostParams::default(), &body).await {
            Ok(_) => return Ok(()),
            Err(e) if is_gone(&e) => return Err(GuardError::Lost(name.to_string())),
            Err(e) if is_conflict(&e) => {
                match leases.get_opt(name).await.map_err(api_err(name))? {
                    Some(cur) if still_ours(&cur, holder, token) => lease = cur,
                    _ => return Err(GuardError::Lost(name.to_string())),
                }
            }
            Err(e) => return Err(api_err(name)(e)),
        }
    }
    Err(GuardError::Lost(name.to_string()))
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
            let (holder, token) = (self.holder.clone(), self.token);
            rt.spawn(async move {
                let _ = renewer.await;
                let _ = release_lease(&leases, &name, &shared, &holder, token).await;
            });
        }
    }
}

/// Renews the lease until stopped; on losing it, cancels `lost`.
#[allow(clippy::too_many_arguments)]
async fn renew_loop(
    leases: Api<Lease>,
    name: String,
    shared: Arc<Mutex<Lease>>,
    cfg: GuardConfig,
    token: i64,
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
            Ok(Err(e)) if is_conflict(&e) => {
                // Someone wrote the Lease: a contender's claim on the queue slot leaves it
                // ours (renew the fresh copy at once), anything else means it was taken.
                let read = tokio::time::timeout_at(trusted_until, leases.get_opt(&name)).await;
                match read {
                    Ok(Ok(Some(cur))) if still_ours(&cur, &cfg.holder, token) => {
                        if let Ok(mut l) = shared.lock() {
                            *l = cur;
                        }
                        next = Instant::now();
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(lease = %name, error = %e, "lease read failed; retrying");
                        next = Instant::now() + every / 4;
                    }
                    _ => {
                        tracing::warn!(lease = %name, "lease lost: taken by another");
                        lost.cancel();
                        return;
                    }
                }
            }
            Ok(Err(e)) if is_gone(&e) => {
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

    /// The verdict of a contender outside the queue (the rule before the queue slot).
    fn old_rule(spec: Option<&LeaseSpec>, now: Timestamp, unchanged_for: Duration) -> Verdict {
        let r = Reading {
            spec,
            annotations: None,
            now,
            unchanged_for,
            slot_unchanged_for: Duration::ZERO,
        };
        judge(&r, None, SKEW, DEF)
    }

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The verdict for `me` on a lease with annotations `a`, everything seen just now.
    fn fair(spec: Option<&LeaseSpec>, a: &BTreeMap<String, String>, me: &str, now: i64) -> Verdict {
        let r = Reading {
            spec,
            annotations: Some(a),
            now: ts(now),
            unchanged_for: Duration::ZERO,
            slot_unchanged_for: Duration::ZERO,
        };
        judge(&r, Some(me), SKEW, DEF)
    }

    #[test]
    fn a_held_lease_queues_a_contender_only_behind_a_holder_that_expects_it() {
        let s = held(0, 10);
        let at = micro_time(ts(0));
        // The holder took it knowing the queue: the first contender claims the slot, the owner
        // refreshes it, a third waits while the claim is fresh and claims it once it is stale.
        let fair_holder = ann(&[(FAIR_HOLDER_ANNOTATION, "other")]);
        assert_eq!(fair(Some(&s), &fair_holder, "a", 1), Verdict::Queue);
        let mut queued = fair_holder.clone();
        queued.extend(ann(&[(NEXT_ANNOTATION, "a"), (NEXT_RENEW_ANNOTATION, &at)]));
        assert_eq!(fair(Some(&s), &queued, "a", 1), Verdict::Queue);
        assert_eq!(fair(Some(&s), &queued, "b", 1), Verdict::Wait);
        assert_eq!(fair(Some(&s), &queued, "b", 11), Verdict::Wait);
        let later = held(12, 10);
        assert_eq!(fair(Some(&later), &queued, "b", 12), Verdict::Queue);
        // A holder that does not expect it (the marker names an earlier holder, or none): no
        // one writes the slot, since its renewal would take the 409 as a loss.
        let unaware = ann(&[(FAIR_HOLDER_ANNOTATION, "earlier")]);
        assert_eq!(fair(Some(&s), &unaware, "a", 1), Verdict::Wait);
        assert_eq!(fair(Some(&s), &ann(&[]), "a", 1), Verdict::Wait);
    }

    #[test]
    fn a_free_lease_goes_to_the_fresh_claim_and_to_anyone_once_it_is_stale() {
        let mut s = held(0, 10);
        s.holder_identity = None;
        let at = micro_time(ts(0));
        let queued = ann(&[(NEXT_ANNOTATION, "a"), (NEXT_RENEW_ANNOTATION, &at)]);
        assert_eq!(fair(Some(&s), &queued, "a", 1), Verdict::Take);
        // The releaser (or anyone else) waits for the contender queued before it...
        assert_eq!(fair(Some(&s), &queued, "releaser", 1), Verdict::Wait);
        assert_eq!(fair(Some(&s), &queued, "releaser", 11), Verdict::Wait);
        // ...for at most the claim's renew time + duration + skew,
        assert_eq!(fair(Some(&s), &queued, "releaser", 12), Verdict::Take);
        // or a full duration of seeing it unchanged, whatever the clocks say.
        let ahead = ann(&[
            (NEXT_ANNOTATION, "a"),
            (NEXT_RENEW_ANNOTATION, &micro_time(ts(1000))),
        ]);
        let r = |slot_unchanged_for: Duration| Reading {
            spec: Some(&s),
            annotations: Some(&ahead),
            now: ts(1),
            unchanged_for: Duration::ZERO,
            slot_unchanged_for,
        };
        let d = Duration::from_secs(10);
        assert_eq!(
            judge(&r(d - Duration::from_millis(1)), Some("b"), SKEW, DEF),
            Verdict::Wait
        );
        assert_eq!(judge(&r(d), Some("b"), SKEW, DEF), Verdict::Take);
        // A claim without a readable time is stale; an expired holder counts as free.
        let bad = ann(&[(NEXT_ANNOTATION, "a"), (NEXT_RENEW_ANNOTATION, "soon")]);
        assert_eq!(fair(Some(&s), &bad, "b", 1), Verdict::Take);
        assert_eq!(fair(Some(&held(0, 10)), &queued, "b", 12), Verdict::Take);
        assert_eq!(fair(Some(&held(0, 10)), &queued, "b", 11), Verdict::Wait);
        // Outside the queue, the slot is not looked at.
        let r = Reading {
            spec: Some(&s),
            annotations: Some(&queued),
            now: ts(1),
            unchanged_for: Duration::ZERO,
            slot_unchanged_for: Duration::ZERO,
        };
        assert_eq!(judge(&r, None, SKEW, DEF), Verdict::Take);
    }

    #[test]
    fn taking_clears_the_slot_claiming_fills_it_withdrawing_empties_only_ones_own() {
        let at = micro_time(ts(3));
        let queued = ann(&[
            ("keep", "x"),
            (NEXT_ANNOTATION, "a"),
            (NEXT_RENEW_ANNOTATION, &at),
        ]);
        assert_eq!(
            taken_annotations(Some(&queued), "a"),
            ann(&[("keep", "x"), (FAIR_HOLDER_ANNOTATION, "a")])
        );
        assert_eq!(
            claimed_annotations(None, "b", ts(3)),
            ann(&[(NEXT_ANNOTATION, "b"), (NEXT_RENEW_ANNOTATION, &at)])
        );
        assert_eq!(withdrawn_annotations(Some(&queued), "b"), None);
        assert_eq!(
            withdrawn_annotations(Some(&queued), "a"),
            Some(ann(&[("keep", "x")]))
        );
        assert_eq!(micro_time(ts(0)), "2027-01-15T08:00:00.000000Z");
        let r = released_spec(&held(0, 10));
        assert_eq!(r.holder_identity, None);
        assert_eq!(r.renew_time, None);
        assert_eq!(r.lease_transitions, Some(4));
        assert_eq!(r.lease_duration_seconds, Some(10));
    }

    #[test]
    fn a_shared_hold_yields_once_and_only_its_last_holder_stands_back() {
        let me = "me";
        let mine = ann(&[(FAIR_HOLDER_ANNOTATION, me)]);
        let theirs = ann(&[(FAIR_HOLDER_ANNOTATION, "other")]);
        // Waited, created, or taken from another: shared. Taken back from itself without a
        // wait: not (a harness whose partner left yields once, not after every turn).
        assert!(shared_hold(true, true, Some(&mine), me));
        assert!(shared_hold(true, false, None, me));
        assert!(shared_hold(true, false, Some(&theirs), me));
        assert!(shared_hold(true, false, Some(&ann(&[])), me));
        assert!(!shared_hold(true, false, Some(&mine), me));
        // A leader election never yields.
        assert!(!shared_hold(false, true, Some(&theirs), me));
        let left = Duration::from_millis(700);
        assert_eq!(yield_for(Some(&mine), me, left), left);
        assert_eq!(yield_for(Some(&mine), me, Duration::ZERO), Duration::ZERO);
        // Someone else was last (it released after this one): it does not stand back.
        assert_eq!(yield_for(Some(&theirs), me, left), Duration::ZERO);
        assert_eq!(yield_for(None, me, left), Duration::ZERO);
        // Its own claim: it is the one the Lease waits for.
        let mut queued = mine.clone();
        queued.insert(NEXT_ANNOTATION.into(), me.into());
        assert_eq!(yield_for(Some(&queued), me, left), Duration::ZERO);
    }

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
        assert_eq!(old_rule(None, ts(0), Duration::ZERO), Verdict::Take);
        let mut s = held(0, 10);
        s.holder_identity = None;
        assert_eq!(old_rule(Some(&s), ts(0), Duration::ZERO), Verdict::Take);
        s.holder_identity = Some(String::new());
        assert_eq!(old_rule(Some(&s), ts(0), Duration::ZERO), Verdict::Take);
    }

    #[test]
    fn held_lease_waits_until_renew_time_plus_duration_plus_skew() {
        let s = held(0, 10);
        let z = Duration::ZERO;
        assert_eq!(old_rule(Some(&s), ts(5), z), Verdict::Wait);
        assert_eq!(old_rule(Some(&s), ts(10), z), Verdict::Wait);
        assert_eq!(old_rule(Some(&s), ts(11), z), Verdict::Wait);
        assert_eq!(old_rule(Some(&s), ts(12), z), Verdict::Take);
    }

    #[test]
    fn unchanged_for_a_full_duration_is_expired_whatever_the_clocks_say() {
        // The holder's clock runs ahead: renewTime is in our future.
        let s = held(1000, 10);
        assert_eq!(
            old_rule(Some(&s), ts(0), Duration::from_secs(9)),
            Verdict::Wait
        );
        assert_eq!(
            old_rule(Some(&s), ts(0), Duration::from_secs(10)),
            Verdict::Take
        );
    }

    #[test]
    fn default_duration_applies_when_the_lease_has_none() {
        let mut s = held(0, 10);
        s.lease_duration_seconds = None;
        assert_eq!(old_rule(Some(&s), ts(16), Duration::ZERO), Verdict::Wait);
        assert_eq!(old_rule(Some(&s), ts(17), Duration::ZERO), Verdict::Take);
        s.renew_time = None;
        assert_eq!(old_rule(Some(&s), ts(100), Duration::ZERO), Verdict::Wait);
        assert_eq!(old_rule(Some(&s), ts(100), DEF), Verdict::Take);
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
