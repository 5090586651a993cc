//! A templated Sandbox claiming a warm pod: create → Ready seen on a watch (opened before the
//! create), one at a time, against a SandboxPool of `BENCH_POOL` (default 5) warm pods, the
//! pool refilled to full before each create; the API writes each claim costs the operator and
//! where the time goes, both from the API server's audit log: the create, the adopting pod
//! patch (its reaction to the watch event; what it reads comes from its watch caches), the
//! status write that says Ready (after the workspace's command in the warm container, when it
//! has one: a claim with nothing to write runs none),
//! then Ready on the client's watch, and the operator's metadata write (finalizer and labels,
//! made after the Ready status since issue 32). `BENCH_OPERATOR_BIN` runs another build's operator (an A/B in one session).
//!
//! Each claim (and each of the peer's, and each of the floor's in benches/claim_floor.rs)
//! starts on a quiet machine (`common::quiet`: the CPUs 80 % idle over 200 ms, at most 5 s;
//! `BENCH_QUIET_IDLE` sets the percentage, 0 turns the wait off): the cluster shares the two
//! cores with the last claim's teardown and the pools' refills.
//!
//! `eval "$(hack/cluster env)"; cargo bench --bench claim` (release build). `BENCH_N` claims
//! (default 50); `BENCH_FILES` small workspace files in each Sandbox's spec (default 0: the
//! issue's second figure is with 3). The audit log is `$AGENTBOX_AUDIT_LOG` (set by
//! `hack/cluster env`).
//!
//! `BENCH_RESTORE=1`: a restore from a small snapshot into a warm pod next to the same restore
//! in a cold start instead. One sandbox of a scope writes three small files and is
//! snapshotted (a file store) and deleted; then `BENCH_N` sandboxes of that scope, one at a
//! time and each deleted before the next, alternate between claiming a warm pod and starting
//! cold (an env override: another pod shape), each restoring that snapshot (branch C, the
//! default `Latest` policy): create → Ready on a watch.
//!
//! `BENCH_RUNTIME_CLASS=gvisor` (issue 31): the warm pods run under that RuntimeClass (the
//! operator's `--default-runtime-class`) and the figures go under the bench name `claim_gvisor`.
//!
//! `BENCH_BURST=N` (issue 32's throughput figure, N = 100 in `hack/bench`): a pool of N warm
//! pods, then N templated Sandboxes created at once (each from its own task, over one client);
//! Ready seen on one watch of the namespace opened before them. Figures: claims per second (N
//! over first create → last Ready), p50/p95 per claim (its create call → its Ready), how many
//! adopted a warm pod, pods adopted twice (a pod named by two statuses, or with two controller
//! owners: must be 0), and the refill: the Sandboxes are deleted once all are Ready (a node
//! holds 110 pods, not 2N) and the time from the last Ready until the pool has N claimable warm
//! pods again.
//!
//! `BENCH_PEER_AGENT_SANDBOX=<path>` (issue 32, measured beside the peer): the path of a built
//! kubernetes-sigs/agent-sandbox controller (`hack/agent-sandbox build` prints it; its CRDs are
//! read from `crds/` beside its `bin/`, or from `BENCH_PEER_AGENT_SANDBOX_CRDS`). The plain
//! claim figures then run interleaved with its warm-pool claim in one run: its CRDs installed,
//! its controller started out of cluster, a SandboxWarmPool of `BENCH_POOL` sandboxes whose
//! template has the agentbox warm pod's shape (image, command, resources, security context,
//! runtime class), and per round one agentbox claim then one SandboxClaim, each with both pools
//! refilled to full (neither claims while a refill of either starts a pod) and timed the same
//! way (create → Ready on a watch opened before the create). Each claim is deleted, its pod
//! gone, before the next (2n claims would not fit on a node beside the pools otherwise), on
//! both sides. Figures `claim_peer_*` beside `claim_*`,
//! and the writes its controller made per claim window from the audit log. Unset, or with
//! `BENCH_FILES` (the peer has no workspace files), the peer column is skipped, said so on
//! stdout, and nothing is emitted for it. See benches/peer/mod.rs.

use std::time::{Duration, Instant};

use agentbox_api::crd::{
    Sandbox, SandboxPool, SandboxSnapshot, SandboxTemplate, SnapshotPhase, StartBranch,
};
use agentbox_api::labels;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

mod common;
mod peer;

use common::{
    OPERATOR_UA, Seen, audit_log, bench_name, create_until_ready, delete_until_gone, emit, env_num,
    p50_p95, read_audit, runtime_class,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Waits until the pool has `n` warm pods ready to be claimed.
async fn pool_full(pods: &Api<Pod>, pool: &str, n: usize) -> Res<()> {
    let lp =
        ListParams::default().labels(&format!("{}={pool},{}=true", labels::POOL, labels::WARM));
    let t = Instant::now();
    loop {
        let ready = pods
            .list(&lp)
            .await?
            .items
            .iter()
            .filter(|p| agentbox_operator::controller::pool::is_claimable(p))
            .count();
        if ready >= n {
            return Ok(());
        }
        if t.elapsed() > Duration::from_secs(120) {
            return Err(format!("{pool}: {ready} of {n} warm pods ready after 120 s").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A templated Sandbox `name` of the scope the restore figures share; `cold`: with an env
/// override, so that no warm pod fits it.
fn restoring(name: &str, cold: bool) -> Res<Sandbox> {
    let mut spec = json!({"templateRef": {"name": "tpl"},
        "scope": {"kind": "Session", "agent": "bench", "session": "restore"}});
    if cold {
        spec["env"] = json!([{"name": "COLD", "value": "1"}]);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": name},
        "spec": spec,
    }))?)
}

/// The restore figures (`BENCH_RESTORE=1`, see the module's documentation).
async fn restores(client: &Client, ns: &str, n: usize, size: usize) -> Res<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let sbxs: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let snaps: Api<SandboxSnapshot> = Api::namespaced(client.clone(), ns);
    pool_full(&pods, "bench", size).await?;
    let seed = create_until_ready(&sbxs, &restoring("seed", false)?).await?;
    let wrote = agentbox_api::exec::run(
        &pods,
        &seed.pod,
        "sandbox",
        agentbox_api::exec::ExecRequest::shell(
            "cd /workspace && mkdir -p notes && for i in 1 2 3; do echo \"note $i\" > notes/n$i.txt; done",
        ),
    )
    .await?;
    if !wrote.success() {
        return Err(format!("writing the seed's files: {}", wrote.stderr_str()).into());
    }
    let snap: SandboxSnapshot = serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxSnapshot",
        "metadata": {"name": "small"}, "spec": {"sandboxRef": {"name": "seed"}},
    }))?;
    snaps.create(&PostParams::default(), &snap).await?;
    for i in 0.. {
        let phase = snaps.get("small").await?.status.and_then(|s| s.phase);
        if phase == Some(SnapshotPhase::Ready) {
            break;
        }
        if i > 600 || phase == Some(SnapshotPhase::Failed) {
            return Err(format!("the seed's snapshot: {phase:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    delete_until_gone(&sbxs, "seed").await?;

    let mut took: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    for i in 0..n {
        let cold = i % 2 == 1;
        if !cold {
            pool_full(&pods, "bench", size).await?;
        }
        let name = format!("r-{i}");
        let seen = create_until_ready(&sbxs, &restoring(&name, cold)?).await?;
        let st = sbxs.get(&name).await?.status.unwrap_or_default();
        let branch = st.workspace.as_ref().and_then(|w| w.last_start_branch);
        if st.restored_from.as_deref() != Some("small") || branch != Some(StartBranch::Restored) {
            return Err(format!(
                "{name}: restored from {:?}, branch {branch:?}",
                st.restored_from
            )
            .into());
        }
        if seen.pod.starts_with("bench-warm-") == cold {
            return Err(format!("{name} (cold: {cold}) started in {}", seen.pod).into());
        }
        took[usize::from(cold)].push(seen.ready);
        delete_until_gone(&sbxs, &name).await?;
    }
    let [warm, cold] = took;
    let (nw, nc) = (warm.len() as u64, cold.len() as u64);
    let (w50, w95) = p50_p95(warm);
    let (c50, c95) = p50_p95(cold);
    println!("| restore of a small snapshot (3 files), create → Ready on a watch | p50 | p95 |");
    println!("|---|---|---|");
    println!("| into a warm pod (claimed), n={nw} (ms) | {w50:.1} | {w95:.1} |");
    println!("| cold start, n={nc} (ms) | {c50:.1} | {c95:.1} |");
    emit("claim", "claim_restore_warm_p50_ms", w50, "ms", nw);
    emit("claim", "claim_restore_warm_p95_ms", w95, "ms", nw);
    emit("claim", "claim_restore_cold_p50_ms", c50, "ms", nc);
    emit("claim", "claim_restore_cold_p95_ms", c95, "ms", nc);
    Ok(())
}

/// The burst figures (`BENCH_BURST=N`, see the module's documentation).
async fn burst(client: &Client, ns: &str, n: usize) -> Res<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let sbxs: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    let t_pool = Instant::now();
    pool_full(&pods, "bench", n).await?;
    println!(
        "pool of {n} ready in {:.1} s",
        t_pool.elapsed().as_secs_f64()
    );
    let sandbox = |i: usize| -> Res<Sandbox> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": format!("b-{i}")},
            "spec": {"templateRef": {"name": "tpl"},
                "scope": {"kind": "Session", "agent": "bench", "session": format!("b-{i}")}},
        }))?)
    };
    let wp = WatchParams::default().timeout(290);
    let mut stream = sbxs.watch(&wp, "0").await?.boxed();
    sbxs.list(&ListParams::default().limit(1)).await?;
    let t0 = Instant::now();
    let creates = futures::future::join_all((0..n).map(|i| {
        let sbxs = sbxs.clone();
        async move {
            let s = sandbox(i)?;
            let sent = t0.elapsed().as_secs_f64() * 1000.0;
            sbxs.create(&PostParams::default(), &s).await?;
            Ok::<_, Box<dyn std::error::Error>>((s.name_any(), sent))
        }
    }));
    // The watch is read while the creates go out: its events are not left to queue.
    let mut ready: std::collections::BTreeMap<String, (f64, String)> = Default::default();
    let mut sent: std::collections::BTreeMap<String, f64> = Default::default();
    let watch = async {
        while ready.len() < n {
            let Some(ev) = tokio::time::timeout(Duration::from_secs(300), stream.next())
                .await
                .map_err(|_| "no Ready within 300 s")?
            else {
                return Err::<(), Box<dyn std::error::Error>>("the watch ended".into());
            };
            if let WatchEvent::Added(o) | WatchEvent::Modified(o) = ev? {
                let st = o.status.clone().unwrap_or_default();
                if st.phase == Some(agentbox_api::crd::SandboxPhase::Ready) {
                    ready.entry(o.name_any()).or_insert((
                        t0.elapsed().as_secs_f64() * 1000.0,
                        st.pod_name.unwrap_or_default(),
                    ));
                }
            }
        }
        Ok(())
    };
    let (created, watched) = tokio::join!(creates, watch);
    for c in created {
        let (name, at) = c?;
        sent.insert(name, at);
    }
    watched?;
    let last = ready.values().map(|(t, _)| *t).fold(0.0, f64::max);
    let first = sent.values().copied().fold(f64::MAX, f64::min);
    let per: Vec<f64> = ready
        .iter()
        .map(|(name, (t, _))| t - sent.get(name).copied().unwrap_or(first))
        .collect();
    let rate = n as f64 / ((last - first) / 1000.0);
    let warm = ready
        .values()
        .filter(|(_, p)| p.starts_with("bench-warm-"))
        .count();
    // Adopted twice: a pod two statuses name, or a pod with two controller owners.
    let mut named: std::collections::BTreeMap<&str, usize> = Default::default();
    for (_, p) in ready.values() {
        *named.entry(p.as_str()).or_default() += 1;
    }
    let mut twice = named.values().filter(|k| **k > 1).count();
    for p in pods.list(&ListParams::default()).await?.items {
        let controllers = p
            .owner_references()
            .iter()
            .filter(|o| o.controller == Some(true))
            .count();
        if controllers > 1 {
            twice += 1;
        }
    }
    // Sandboxes with more than one pod of theirs (two adoptions for one sandbox).
    let mut extra = 0;
    for name in ready.keys() {
        let lp = ListParams::default().labels(&format!("{}={name}", labels::SANDBOX));
        if pods.list(&lp).await?.items.len() > 1 {
            extra += 1;
        }
    }
    // The refill: the sandboxes go (the node holds 110 pods), the pool comes back to n.
    sbxs.delete_collection(&kube::api::DeleteParams::default(), &ListParams::default())
        .await?;
    let deleted_at = t0.elapsed().as_secs_f64() * 1000.0;
    pool_full(&pods, "bench", n).await?;
    let refilled = t0.elapsed().as_secs_f64() * 1000.0 - last;
    let (p50, p95) = p50_p95(per);
    let n64 = n as u64;
    println!("| burst: {n} creates at once against a pool of {n} | value |");
    println!("|---|---|");
    println!("| claims per second (first create → last Ready) | {rate:.1} |");
    println!(
        "| per claim, create call → Ready on the watch, p50 / p95 (ms) | {p50:.1} / {p95:.1} |"
    );
    println!("| first create → last Ready (ms) | {:.1} |", last - first);
    println!("| adopted a warm pod | {warm} of {n} |");
    println!("| pods adopted twice | {twice} |");
    println!("| sandboxes with more than one pod | {extra} |");
    println!(
        "| pool back to {n} claimable, from the last Ready (sandboxes deleted {:.1} s after it) (s) | {:.1} |",
        (deleted_at - last) / 1000.0,
        refilled / 1000.0
    );
    emit("claim", "claim_burst_per_s", rate, "claims/s", n64);
    emit("claim", "claim_burst_p50_ms", p50, "ms", n64);
    emit("claim", "claim_burst_p95_ms", p95, "ms", n64);
    emit("claim", "claim_burst_warm", warm as f64, "starts", n64);
    emit(
        "claim",
        "claim_burst_adopted_twice",
        twice as f64,
        "pods",
        n64,
    );
    emit("claim", "claim_burst_refill_s", refilled / 1000.0, "s", n64);
    Ok(())
}

/// Milliseconds between two audit timestamps.
fn ms(a: Timestamp, b: Timestamp) -> f64 {
    b.duration_since(a).as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> Res<()> {
    let n = env_num("BENCH_N", 50) as usize;
    let size = env_num("BENCH_POOL", 5) as usize;
    let files: Vec<serde_json::Value> = (0..env_num("BENCH_FILES", 0))
        .map(|f| json!({"path": format!("notes/file-{f}.txt"), "content": format!("file {f}\n")}))
        .collect();
    let restore = env_num("BENCH_RESTORE", 0) == 1;
    let burst_n = env_num("BENCH_BURST", 0) as usize;
    let size = if burst_n > 0 { burst_n } else { size };
    let audit = audit_log()?;
    let client = Client::try_default().await?;
    let store = |ns: &str| format!("/var/lib/agentbox/bench-snapshots/{ns}");
    // Under BENCH_RUNTIME_CLASS the operator's default runtime class puts the warm pods (and
    // so every claim) under it; the figures go under `claim_<class>`.
    let rc = runtime_class();
    let bench = bench_name("claim");
    let (cleanup, _op) = common::namespace_with_operator_args(&client, "bench-claim", |ns| {
        let mut args = Vec::new();
        if restore {
            args.extend(["--store-url".into(), format!("file://{}", store(ns))]);
        }
        if let Some(rc) = &rc {
            args.extend(["--default-runtime-class".into(), rc.clone()]);
        }
        args
    })
    .await?;
    let ns = cleanup.1.clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let sbxs: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    let delete_all = common::DeleteAll::of(&client, &ns);
    let tpl: SandboxTemplate = serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxTemplate",
        "metadata": {"name": "tpl"},
        "spec": {"image": "docker.io/library/busybox:1.37", "imagePullPolicy": "IfNotPresent"},
    }))?;
    Api::<SandboxTemplate>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &tpl)
        .await?;
    let pool: SandboxPool = serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxPool",
        "metadata": {"name": "bench"},
        "spec": {"templateRef": {"name": "tpl"}, "replicas": size},
    }))?;
    Api::<SandboxPool>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &pool)
        .await?;

    if burst_n > 0 {
        return burst(&client, &ns, burst_n).await;
    }
    if restore {
        let result = restores(&client, &ns, n, size).await;
        // The snapshot's finalizer removes its object from the store: before the store goes.
        drop(delete_all);
        let _ = std::fs::remove_dir_all(store(&ns));
        return result;
    }

    // The peer beside (BENCH_PEER_AGENT_SANDBOX): its pool's pods copy a warm pod of ours.
    let mut peer = match peer::config() {
        Err(why) => {
            println!("agent-sandbox column skipped: {why} (see benches/claim.rs)");
            None
        }
        Ok(_) if !files.is_empty() => {
            println!(
                "agent-sandbox column skipped: BENCH_FILES is set and the peer has no workspace files"
            );
            None
        }
        Ok(cfg) => {
            pool_full(&pods, "bench", size).await?;
            let lp = ListParams::default().labels(&format!(
                "{}=bench,{}=true",
                labels::POOL,
                labels::WARM
            ));
            let warm_pod = pods
                .list(&lp)
                .await?
                .items
                .into_iter()
                .find(agentbox_operator::controller::pool::is_claimable)
                .ok_or("no claimable warm pod to copy the shape of")?;
            let shape = peer::pod_template(&warm_pod)?;
            println!(
                "agent-sandbox pod shape (from {}): {shape}",
                warm_pod.name_any()
            );
            Some(peer::Peer::start(&client, &cfg, shape, size).await?)
        }
    };

    let (mut ready, mut created, mut warm, mut windows) =
        (Vec::new(), Vec::new(), 0usize, Vec::new());
    let mut quiets = Vec::new();
    for i in 0..n {
        // Both pools full before either side's claim: neither claims while the other's refill
        // still starts a pod on the same two cores.
        pool_full(&pods, "bench", size).await?;
        if let Some(peer) = peer.as_mut() {
            peer.pool_full(Duration::from_secs(120)).await?;
        }
        let name = format!("c-{i}");
        let mut spec = json!({"templateRef": {"name": "tpl"},
            "scope": {"kind": "Session", "agent": "bench", "session": name}});
        if !files.is_empty() {
            spec["workspace"] = json!({"files": files});
        }
        let sbx: Sandbox = serde_json::from_value(json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox", "metadata": {"name": name},
            "spec": spec,
        }))?;
        quiets.push(common::quiet().await.as_secs_f64() * 1000.0);
        let start = Timestamp::now();
        let Seen {
            ready: took,
            created: create_rtt,
            pod,
        } = create_until_ready(&sbxs, &sbx).await?;
        if pod.starts_with("bench-warm-") {
            warm += 1;
        }
        ready.push(took);
        created.push(create_rtt);
        // Let in-flight writes of this start land before the next window opens.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        windows.push((name.clone(), pod.clone(), start, Timestamp::now()));
        if let Some(peer) = peer.as_mut() {
            // Room on the node for 2n claims: this one goes (its pod too) before the peer's.
            delete_until_gone(&sbxs, &name).await?;
            peer::pod_gone(&pods, &pod).await?;
            pool_full(&pods, "bench", size).await?;
            peer.claim(i).await?;
        }
    }

    // From the audit log: per claim, the operator's writes on the sandbox, its pod and its
    // Events (the pool's refill writes — new warm pods, their readiness marks, the pool's
    // status — are the pool's, counted apart), and the timeline of one start.
    let writes = read_audit(&audit, &ns);
    let (mut per_claim, mut refill) = (Vec::new(), Vec::new());
    let (mut react, mut adopt, mut init_status, mut total_server) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for (i, (name, pod, from, to)) in windows.iter().enumerate() {
        let in_window = |w: &&common::Write| w.at >= *from && w.at < *to;
        let ours = |w: &&common::Write| {
            (w.resource == "sandboxes" && &w.name == name)
                || (w.resource == "pods" && &w.name == pod)
                || (w.resource == "events" && w.name.starts_with(&format!("{name}.")))
        };
        let op: Vec<&common::Write> = writes
            .iter()
            .filter(in_window)
            .filter(|w| w.user_agent.starts_with(OPERATOR_UA))
            .collect();
        let mine: Vec<&&common::Write> = op.iter().filter(|w| ours(w)).collect();
        per_claim.push(mine.len() as f64);
        refill.push((op.len() - mine.len()) as f64);
        if i == 0 {
            for w in &mine {
                *kinds.entry(w.kind()).or_default() += 1;
            }
        }
        let create = writes
            .iter()
            .find(|w| w.verb == "create" && w.resource == "sandboxes" && &w.name == name);
        let first = mine
            .iter()
            .find(|w| w.resource == "sandboxes" && w.subresource != "status");
        let patch = mine.iter().find(|w| w.resource == "pods");
        let status = mine
            .iter()
            .find(|w| w.resource == "sandboxes" && w.subresource == "status");
        if let (Some(c), Some(f), Some(p), Some(s)) = (create, first, patch, status) {
            react.push(ms(c.at, f.at));
            adopt.push(ms(c.at, p.at));
            init_status.push(ms(p.at, s.at));
            total_server.push(ms(c.at, s.at));
        }
    }
    let (p50, p95) = p50_p95(ready);
    let (w50, wmax) = (
        p50_p95(per_claim.clone()).0,
        per_claim.iter().copied().fold(0.0, f64::max),
    );
    let q = |v: &Vec<f64>| p50_p95(v.clone());
    let nfiles = files.len();
    println!("| measure (n={n}, pool of {size}, {nfiles} files) | p50 | p95 |");
    println!("|---|---|---|");
    println!("| Sandbox create → Ready on a watch, warm (ms) | {p50:.1} | {p95:.1} |");
    let (a, b) = p50_p95(created);
    println!("| create call → its response (ms) | {a:.1} | {b:.1} |");
    for row in peer.iter().flat_map(|p| p.rows()) {
        println!("{row}");
    }
    let (a, b) = q(&react);
    println!(
        "| create → operator's metadata write (finalizer, labels; after the Ready status) (ms) | {a:.1} | {b:.1} |"
    );
    let (a, b) = q(&adopt);
    println!(
        "| create → adopting pod patch (the operator's reaction; reads from its caches) (ms) | {a:.1} | {b:.1} |"
    );
    let (a, b) = q(&init_status);
    println!(
        "| pod patch → Ready status write (the workspace's command in the warm pod, if any) (ms) | {a:.1} | {b:.1} |"
    );
    let (a, b) = q(&total_server);
    println!("| create → Ready status write, server side (ms) | {a:.1} | {b:.1} |");
    println!();
    let (a, b) = q(&quiets);
    println!(
        "wait for a quiet machine before each claim (BENCH_QUIET_IDLE, benches/common), p50 / p95: {a:.0} / {b:.0} ms"
    );
    println!("starts that adopted a warm pod: {warm} of {n}");
    println!("operator writes per claim (sandbox, its pod, its Events): {per_claim:?}");
    println!("first claim's writes: {kinds:?}");
    println!("pool refill writes in each window: {refill:?}");
    // The peer's count takes in its pool's refill (its writes are not told apart by object):
    // ours with the refill too, to set beside it.
    let all: Vec<f64> = per_claim.iter().zip(&refill).map(|(a, b)| a + b).collect();
    println!("operator writes per claim window, the refill included: {all:?}");
    if let Some(peer) = &peer {
        peer.report(&audit, &bench);
    }
    let n64 = n as u64;
    // Keys of a run with files name them, so both runs' figures sit side by side in a report
    // (hack/bench runs both).
    let with = if nfiles == 0 {
        String::new()
    } else {
        format!("_{nfiles}files")
    };
    emit(&bench, &format!("claim_ready{with}_p50_ms"), p50, "ms", n64);
    emit(&bench, &format!("claim_ready{with}_p95_ms"), p95, "ms", n64);
    let (s50, s95) = q(&total_server);
    let server = total_server.len() as u64;
    emit(
        &bench,
        &format!("claim_status_server{with}_p50_ms"),
        s50,
        "ms",
        server,
    );
    emit(
        &bench,
        &format!("claim_status_server{with}_p95_ms"),
        s95,
        "ms",
        server,
    );
    emit(
        &bench,
        &format!("claim_writes{with}_p50"),
        w50,
        "writes",
        n64,
    );
    emit(
        &bench,
        &format!("claim_writes{with}_max"),
        wmax,
        "writes",
        n64,
    );
    if !all.is_empty() {
        emit(
            &bench,
            &format!("claim_writes_all{with}_p50"),
            p50_p95(all).0,
            "writes",
            n64,
        );
    }
    emit(
        &bench,
        &format!("claim_warm_starts{with}"),
        warm as f64,
        "starts",
        n64,
    );
    Ok(())
}
