//! The execution guard against the real API server: mutual exclusion under contention,
//! takeover of a vanished holder only after the lease duration, losing on a stale update,
//! fencing tokens, failing closed, and a fair hand-off between harnesses taking turns.

mod barepod;
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use agentbox_api::exec::{self, ExecRequest, SANDBOX_CONTAINER};
use agentbox_api::guard::{self, GuardConfig, GuardError};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

fn cfg(holder: &str, secs: u64) -> GuardConfig {
    GuardConfig {
        holder: holder.to_string(),
        lease_duration: Duration::from_secs(secs),
        retry_interval: Duration::from_millis(50),
        ..Default::default()
    }
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn four_clients_never_interleave() {
    let env = common::TestEnv::new("guard-mutex").await;
    let pods = barepod::start(&env.client, &env.ns, "box").await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    let mut tasks = Vec::new();
    for c in 0..4 {
        let leases = leases.clone();
        let pods = pods.clone();
        tasks.push(tokio::spawn(async move {
            let cfg = cfg(&format!("client-{c}"), 10);
            let mut tokens = Vec::new();
            for i in 0..25 {
                let g = guard::acquire(
                    &leases,
                    "mutex",
                    BTreeMap::new(),
                    &cfg,
                    Some(Duration::from_secs(300)),
                )
                .await
                .expect("acquire");
                let tok = g.token();
                tokens.push(tok);
                // Two separate execs inside the critical section: anyone else writing between
                // them would show up as interleaving.
                g.run(async {
                    for what in ["start", "end"] {
                        let line = format!("{what} {c} {i} {tok}");
                        let out = exec::run(
                            &pods,
                            "box",
                            SANDBOX_CONTAINER,
                            ExecRequest::argv(["sh", "-c", "echo \"$0\" >> /tmp/log", &line]),
                        )
                        .await
                        .expect("append");
                        assert!(out.status.success());
                    }
                })
                .await
                .expect("guard held throughout");
                g.release().await.expect("release");
            }
            tokens
        }));
    }
    let mut all_tokens = Vec::new();
    for t in tasks {
        all_tokens.extend(t.await.expect("client task"));
    }
    let out = exec::run(
        &pods,
        "box",
        SANDBOX_CONTAINER,
        ExecRequest::argv(["cat", "/tmp/log"]),
    )
    .await
    .expect("read log");
    let text = out.stdout_str();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 200, "{text}");
    let mut last_token = 0i64;
    for pair in lines.chunks(2) {
        let s: Vec<&str> = pair[0].split(' ').collect();
        let e: Vec<&str> = pair[1].split(' ').collect();
        assert_eq!(s[0], "start", "interleaved:\n{text}");
        assert_eq!(e[0], "end", "interleaved:\n{text}");
        assert_eq!(s[1..], e[1..], "interleaved:\n{text}");
        // Fencing tokens strictly increase in the order the critical sections ran.
        let tok: i64 = s[3].parse().expect("token");
        assert!(tok > last_token, "token {tok} after {last_token}");
        last_token = tok;
    }
    all_tokens.sort();
    all_tokens.dedup();
    assert_eq!(all_tokens.len(), 100);
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn vanished_holder_is_taken_over_after_the_duration_not_before() {
    let env = common::TestEnv::new("guard-takeover").await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    // A holder that renewed once and vanished without releasing.
    let ghost_renew = Timestamp::now();
    let ghost = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some("scope".into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("ghost".into()),
            lease_duration_seconds: Some(3),
            acquire_time: Some(MicroTime(ghost_renew)),
            renew_time: Some(MicroTime(ghost_renew)),
            lease_transitions: Some(7),
            ..Default::default()
        }),
    };
    leases
        .create(&PostParams::default(), &ghost)
        .await
        .expect("ghost lease");

    // A short wait fails while the ghost's lease is still valid.
    let early = guard::acquire(
        &leases,
        "scope",
        BTreeMap::new(),
        &cfg("early", 3),
        Some(Duration::from_millis(500)),
    )
    .await;
    assert!(
        matches!(early, Err(GuardError::Timeout { ref holder, .. }) if holder == "ghost"),
        "{early:?}"
    );

    let g = guard::acquire(
        &leases,
        "scope",
        BTreeMap::new(),
        &cfg("heir", 3),
        Some(Duration::from_secs(30)),
    )
    .await
    .expect("take over");
    let got = g.acquired_at().expect("acquire time");
    let waited = got.duration_since(ghost_renew);
    assert!(
        waited >= k8s_openapi::jiff::SignedDuration::from_secs(3),
        "taken over {waited:?} after the ghost's last renewal, before its 3 s lease ran out"
    );
    assert_eq!(g.token(), 8, "takeover bumps leaseTransitions");
    let now = leases.get("scope").await.expect("lease");
    let spec = now.spec.expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("heir"));
    assert_eq!(spec.lease_transitions, Some(8));

    // Release keeps the lease and its counter; the next holder gets a higher token at once.
    g.release().await.expect("release");
    let after = leases
        .get("scope")
        .await
        .expect("lease")
        .spec
        .expect("spec");
    assert_eq!(after.holder_identity, None);
    let g2 = guard::acquire(
        &leases,
        "scope",
        BTreeMap::new(),
        &cfg("next", 3),
        Some(Duration::from_secs(5)),
    )
    .await
    .expect("free lease");
    assert_eq!(g2.token(), 9);
    g2.release().await.expect("release");
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn stale_update_gets_409_and_the_holder_knows_it_lost() {
    let env = common::TestEnv::new("guard-stale").await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    // A long lease renewed every second: the holder renews often enough to make our copy
    // stale quickly, and a renewal slowed by a loaded API server (CI's parallel lanes) stays
    // inside the trust window, so the only way to lose it here is the takeover below. With
    // a 3 s lease a renewal slower than 1.4 s lost it, correctly, before the assertion.
    let holder = GuardConfig {
        renew_interval: Some(Duration::from_secs(1)),
        ..cfg("holder", 20)
    };
    let g = guard::acquire(
        &leases,
        "scope",
        BTreeMap::new(),
        &holder,
        Some(Duration::from_secs(10)),
    )
    .await
    .expect("acquire");
    let stale = leases.get("scope").await.expect("lease");
    // Let the holder renew at least once (every second): our copy is now stale.
    let start = Instant::now();
    loop {
        let cur = leases.get("scope").await.expect("lease");
        if cur.metadata.resource_version != stale.metadata.resource_version {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "holder never renewed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut stolen = stale.clone();
    stolen.spec.as_mut().expect("spec").holder_identity = Some("intruder".into());
    let err = leases
        .replace("scope", &PostParams::default(), &stolen)
        .await
        .expect_err("stale update must be refused");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 409),
        "{err:?}"
    );
    assert!(!g.is_lost());

    // Someone overwrites the lease with a current resourceVersion (a forced takeover): the
    // holder's next renewal gets the 409 and it cancels its guarded work.
    let mut cur = leases.get("scope").await.expect("lease");
    cur.spec.as_mut().expect("spec").holder_identity = Some("intruder".into());
    leases
        .replace("scope", &PostParams::default(), &cur)
        .await
        .expect("forced takeover");
    let work = g.run(std::future::pending::<()>());
    let res = tokio::time::timeout(Duration::from_secs(30), work)
        .await
        .expect("lost in time");
    assert!(matches!(res, Err(GuardError::Lost(_))), "{res:?}");
    assert!(g.is_lost());
    assert!(matches!(g.release().await, Err(GuardError::Lost(_))));
    // The intruder's hold was not disturbed by the loser's release.
    let spec = leases
        .get("scope")
        .await
        .expect("lease")
        .spec
        .expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some("intruder"));
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn unreachable_api_server_fails_closed() {
    // Nothing listens on port 1.
    let mut config = kube::Config::new("https://127.0.0.1:1".parse().expect("url"));
    config.connect_timeout = Some(Duration::from_millis(200));
    let client = kube::Client::try_from(config).expect("client");
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let res = guard::acquire(
        &leases,
        "x",
        BTreeMap::new(),
        &cfg("c", 3),
        Some(Duration::from_secs(1)),
    )
    .await;
    assert!(matches!(res, Err(GuardError::Api { .. })), "{res:?}");
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn acquire_release_latency_figures() {
    let env = common::TestEnv::new("guard-bench").await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    let c = cfg("bench", 15);
    let mut acq = Vec::new();
    let mut rel = Vec::new();
    for _ in 0..40 {
        let t = Instant::now();
        let g = guard::acquire(
            &leases,
            "bench",
            BTreeMap::new(),
            &c,
            Some(Duration::from_secs(10)),
        )
        .await
        .expect("acquire");
        acq.push(t.elapsed());
        let t = Instant::now();
        g.release().await.expect("release");
        rel.push(t.elapsed());
    }
    // The max shows the one yield of a holder alone with a Lease it created (its second
    // acquisition, within YIELD of its first release, waits the yield out).
    println!(
        "guard acquire p50 {:.1} ms p95 {:.1} ms max {:.1} ms; release p50 {:.1} ms p95 {:.1} ms",
        barepod::pct(&mut acq, 50),
        barepod::pct(&mut acq, 95),
        barepod::pct(&mut acq, 100),
        barepod::pct(&mut rel, 50),
        barepod::pct(&mut rel, 95)
    );
    env.finish().await;
}

/// One turn of a harness: who, with which fencing token, how long it waited for the guard and
/// how long it then held it.
struct Turn {
    who: &'static str,
    /// Its harness's first turn (its wait includes the client's first connections).
    first: bool,
    token: i64,
    waited: Duration,
    held: Duration,
    /// When it got the guard.
    took: Instant,
}

/// Issue 42, finding 3: two harnesses take one scope's guard back to back, 20 turns each (take
/// the guard, read a counter from a ConfigMap, write it back incremented with an unconditioned
/// update, release, and want the guard again at once). Before the queue slot, the releaser
/// took it again ahead of the waiter's next poll: 1-3 hand-overs in 40 turns; with a 100 ms
/// yield, a hand-over was lost whenever the waiter reacted more slowly than that.
///
/// The figures: at least 35 hand-overs of 40, no wait longer than two turns, and the
/// exact count. A waiter waits for one turn of the other's (the hand-over to it and its hold)
/// and its own hand-over, so "one turn" is the longest hold plus the longest hand-over of the
/// run: on a loaded machine either stretches tenfold now and then (an API server stalling
/// 150 ms under a 15 ms turn), and a wait behind that is no unfairness. A wait through a yield
/// or a missed wake-up (1-2 s) exceeds two turns; an overtaken waiter fails the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster"]
async fn two_harnesses_back_to_back_take_turns() {
    let env = common::TestEnv::new("guard-fair").await;
    let maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.ns);
    let counter = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("counter".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("n".to_string(), "0".to_string())])),
        ..Default::default()
    };
    maps.create(&PostParams::default(), &counter)
        .await
        .expect("counter");
    let mut tasks = Vec::new();
    // Both harnesses start asking at once, their clients connected: a harness still opening its
    // first connection does not want the guard yet, and the other's turns meanwhile are not
    // unfair (under hack/test's lanes one harness once took four turns before the other asked).
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    for who in ["a", "b"] {
        // Two harnesses: two clients (connections) of their own, as two processes would have.
        let client = kube::Client::try_default().await.expect("client");
        let leases: Api<Lease> = Api::namespaced(client.clone(), &env.ns);
        let maps: Api<ConfigMap> = Api::namespaced(client, &env.ns);
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            maps.get("counter").await.expect("connect");
            start.wait().await;
            // The defaults a harness gets (a 15 s lease, 200 ms polls before the hand-off).
            let cfg = GuardConfig {
                holder: format!("harness-{who}"),
                ..Default::default()
            };
            let mut turns = Vec::new();
            for i in 0..20 {
                let asked = Instant::now();
                let g = guard::acquire(
                    &leases,
                    "fair",
                    BTreeMap::new(),
                    &cfg,
                    Some(Duration::from_secs(60)),
                )
                .await
                .expect("acquire");
                let waited = asked.elapsed();
                let took = Instant::now();
                let cm = maps.get("counter").await.expect("read the counter");
                let n: u64 = cm
                    .data
                    .and_then(|d| d.get("n").and_then(|n| n.parse().ok()))
                    .expect("a count");
                // Unconditioned: only the guard keeps the count exact.
                let patch = serde_json::json!({"data": {"n": (n + 1).to_string()}});
                maps.patch("counter", &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .expect("write the counter");
                let token = g.token();
                g.release().await.expect("release");
                turns.push(Turn {
                    who,
                    first: i == 0,
                    token,
                    waited,
                    held: took.elapsed(),
                    took,
                });
            }
            turns
        }));
    }
    let mut turns = Vec::new();
    for t in tasks {
        turns.extend(t.await.expect("harness"));
    }
    turns.sort_by_key(|t| t.token);
    let hand_overs = turns.windows(2).filter(|w| w[0].who != w[1].who).count();
    let n = maps
        .get("counter")
        .await
        .expect("counter")
        .data
        .and_then(|d| d.get("n").cloned())
        .unwrap_or_default();
    let longest = turns.iter().map(|t| t.waited).max().unwrap_or_default();
    let steady = turns
        .iter()
        .filter(|t| !t.first)
        .map(|t| t.waited)
        .max()
        .unwrap_or_default();
    let mut held: Vec<Duration> = turns.iter().map(|t| t.held).collect();
    // The pace: the median time from one acquisition to the next (a hold and a hand-over).
    let mut gaps: Vec<Duration> = turns
        .windows(2)
        .map(|w| w[1].took.duration_since(w[0].took))
        .collect();
    let pace = barepod::pct(&mut gaps, 50);
    // A hand-over's latency: from one harness's release to the other's acquisition (what the
    // releaser's yield has to cover).
    let mut handoff: Vec<Duration> = turns
        .windows(2)
        .filter(|w| w[0].who != w[1].who)
        .map(|w| w[1].took.saturating_duration_since(w[0].took + w[0].held))
        .collect();
    let turn = barepod::pct(&mut held, 100) + barepod::pct(&mut handoff, 100);
    let ratio = longest.as_secs_f64() * 1000.0 / turn;
    println!(
        "guard fairness (rust): {hand_overs} hand-overs in {} turns; longest wait {:.1} ms \
         ({:.1} ms after each harness's first turn) = {ratio:.2} turns of {turn:.1} ms; hold \
         p50 {:.1} ms, max {:.1} ms; one acquisition to the next p50 {pace:.1} ms; hand-over \
         p50 {:.1} ms, max {:.1} ms; counter {n}; order {}",
        turns.len(),
        longest.as_secs_f64() * 1000.0,
        steady.as_secs_f64() * 1000.0,
        barepod::pct(&mut held, 50),
        barepod::pct(&mut held, 100),
        barepod::pct(&mut handoff, 50),
        barepod::pct(&mut handoff, 100),
        turns.iter().map(|t| t.who).collect::<String>(),
    );
    assert_eq!(n, "40", "a lost update");
    // An unfair guard gave 1-3 hand-overs; 39 is every one there can be.
    assert!(
        hand_overs >= 35,
        "only {hand_overs} hand-overs in 40 turns: the releaser took the guard again ahead of the waiter"
    );
    assert!(
        ratio <= 2.0,
        "a wait of {ratio:.2} turns: someone was overtaken or the guard stood free"
    );
    env.finish().await;
}
