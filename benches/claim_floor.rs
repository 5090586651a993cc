//! The floor under a claim on this cluster: what create → Ready on a watch costs when the
//! reacting side does nothing but the writes a claim cannot do without, and no operator runs.
//!
//! A minimal reactor in this process (its own client, so its own connections, as an operator
//! process has) watches the namespace's Sandboxes and keeps a reflector of its pods, as the
//! operator does. On a new Sandbox it makes, with no read on the way:
//! - `2 writes`: the adopting patch of a running pod from its cache (conditioned on the
//!   cached resourceVersion, the Sandbox as its controller), then the Ready status write;
//! - `1 write`: the Ready status write alone (no pod: below what a claim can be).
//!
//! Against these, `benches/claim.rs` is the operator's claim: the same two writes and the
//! same watches, plus its first metadata write beside the start, one round of reads, the
//! workspace command in the warm pod, and the pool's refill. The client side is the claim
//! bench's (`common::create_until_ready`), one Sandbox at a time, a second between them.
//!
//! `eval "$(hack/cluster env)"; cargo bench --bench claim_floor` (release build). `BENCH_N`
//! Sandboxes per mode (default 50), the modes alternating.

use std::collections::BTreeMap;
use std::time::Duration;

use agentbox_api::crd::Sandbox;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

mod common;

use common::{create_until_ready, emit, env_num, p50_p95};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The label of a pod the reactor may adopt.
const FREE: &str = "bench.agentbox.dev/free";
/// Pods kept running for the reactor (the claim bench's pool size).
const PODS: usize = 5;

/// The reactor's errors cross a task boundary.
type SendRes<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The reactor: adopts a free pod for each new Sandbox whose name starts with `2w-`, and
/// writes every new Sandbox's status Ready. Runs until the task is dropped.
async fn react(client: Client, ns: String) -> SendRes<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let sbxs: Api<Sandbox> = Api::namespaced(client, &ns);
    let (cache, writer) = reflector::store::<Pod>();
    let pod_cache = watcher(pods.clone(), watcher::Config::default())
        .reflect(writer)
        .applied_objects()
        .for_each(|_| async {});
    tokio::spawn(pod_cache);
    cache.wait_until_ready().await?;
    let pp = PatchParams::default();
    let mut new = watcher(sbxs.clone(), watcher::Config::default())
        .applied_objects()
        .boxed();
    while let Some(sbx) = new.try_next().await? {
        if sbx.status.is_some() {
            continue;
        }
        let name = sbx.name_any();
        let mut pod_name = String::new();
        if name.starts_with("2w-") {
            let free = cache
                .state()
                .into_iter()
                .find(|p| p.labels().contains_key(FREE))
                .ok_or("no free pod in the reactor's cache")?;
            pod_name = free.name_any();
            let adopt = json!({"metadata": {
                "resourceVersion": free.resource_version(),
                "labels": {FREE: null, "agentbox.dev/sandbox": name},
                "ownerReferences": [sbx.controller_owner_ref(&())],
            }});
            pods.patch(&pod_name, &pp, &Patch::Merge(&adopt)).await?;
        }
        let ready = if pod_name.is_empty() {
            json!({"status": {"phase": "Ready"}})
        } else {
            json!({"status": {"phase": "Ready", "podName": pod_name}})
        };
        sbxs.patch_status(&name, &pp, &Patch::Merge(&ready)).await?;
    }
    Err("the Sandbox watch ended".into())
}

/// A pod that sleeps, free for the reactor.
fn free_pod(i: usize) -> Res<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("free-{i}"), "labels": {FREE: "true"}},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{
            "name": "c", "image": "docker.io/library/busybox:1.37",
            "imagePullPolicy": "IfNotPresent", "command": ["sleep", "3600"]}]},
    }))?)
}

/// Waits until the namespace's `PODS` pods run.
async fn pods_running(pods: &Api<Pod>) -> Res<()> {
    for _ in 0..1200 {
        let running = pods
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running >= PODS {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("the free pods did not run within 120 s".into())
}

#[tokio::main]
async fn main() -> Res<()> {
    let n = env_num("BENCH_N", 50) as usize;
    let client = Client::try_default().await?;
    let cleanup = common::namespace(&client, "bench-floor").await?;
    let ns = cleanup.1.clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let sbxs: Api<Sandbox> = Api::namespaced(client.clone(), &ns);
    for i in 0..PODS {
        pods.create(&PostParams::default(), &free_pod(i)?).await?;
    }
    pods_running(&pods).await?;
    // The reactor's own client: its own connection pool, as a separate process would have.
    let reactor = tokio::spawn(react(Client::try_default().await?, ns.clone()));
    // Let its caches fill.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut took: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for i in 0..n {
        for mode in ["2w", "1w"] {
            let name = format!("{mode}-{i}");
            let sbx: Sandbox = serde_json::from_value(json!({
                "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
                "metadata": {"name": name},
                "spec": {"image": "docker.io/library/busybox:1.37",
                    "scope": {"kind": "Session", "agent": "bench", "session": name}},
            }))?;
            // On a quiet machine, as the claim bench's claims start.
            common::quiet().await;
            let seen = create_until_ready(&sbxs, &sbx).await?;
            took.entry(mode).or_default().push(seen.ready);
            if !seen.pod.is_empty() {
                // Free it again (no owner, the free label back) before the next Sandbox
                // that adopts; the second below lets the reactor's cache see it.
                let free = json!({"metadata": {"labels": {FREE: "true"}, "ownerReferences": null}});
                pods.patch(&seen.pod, &PatchParams::default(), &Patch::Merge(&free))
                    .await?;
            }
            tokio::time::sleep(Duration::from_millis(1000)).await;
            if reactor.is_finished() {
                return Err(format!("the reactor stopped: {:?}", reactor.await).into());
            }
        }
    }
    reactor.abort();

    println!("| floor (n={n} each, no operator, nothing else running) | p50 | p95 |");
    println!("|---|---|---|");
    for (mode, label) in [
        (
            "2w",
            "create → Ready on a watch, adopting patch + status write (ms)",
        ),
        ("1w", "create → Ready on a watch, status write alone (ms)"),
    ] {
        let (p50, p95) = p50_p95(took.remove(mode).unwrap_or_default());
        println!("| {label} | {p50:.1} | {p95:.1} |");
        emit(
            "claim_floor",
            &format!("claim_floor_{mode}_p50_ms"),
            p50,
            "ms",
            n as u64,
        );
        emit(
            "claim_floor",
            &format!("claim_floor_{mode}_p95_ms"),
            p95,
            "ms",
            n as u64,
        );
    }
    Ok(())
}
