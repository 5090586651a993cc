//! The guarantees of the warm claim path (issue 32), against the real local cluster: a warm
//! pod is adopted by at most one Sandbox when the operator is SIGKILLed between adoptions and
//! their status writes, and when two operators claim at once (both leaders, as during a leader
//! change); a Sandbox deleted right after its claim — before its finalizer, which now follows
//! the Ready status — leaves no pod and, after the sweep, no directory; a warm pod holds no
//! scope data before its adoption.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use agentbox_api::crd::{Sandbox, SandboxPhase, SandboxTemplate};
use agentbox_api::labels;
use agentbox_operator::controller::pod::PodConfig;
use agentbox_operator::controller::sandbox::claim;
use clap::Parser;
use common::pools::{create_pool, create_template, entries, host_dir, wait_claimable};
use common::{NODE_ROOT, TestEnv, create_sandbox, phase_is};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use serde_json::json;

/// The template `tpl` and its pool `py` of `size` warm pods, all ready to be claimed.
async fn pooled(env: &TestEnv, size: i64) -> Vec<Pod> {
    create_template(env, "tpl", "pooled").await;
    create_pool(env, "py", "tpl", size, "Recreate")
        .await
        .expect("create pool");
    wait_claimable(env, "py", usize::try_from(size).expect("size"), &[]).await
}

fn from_template(user: &str) -> serde_json::Value {
    json!({
        "templateRef": {"name": "tpl"},
        "scope": {"kind": "User", "agent": "coder", "user": user},
        "workspace": {"files": [{"path": "task.md", "content": format!("task of {user}\n")}]},
    })
}

/// The Sandboxes controlling each pod of the namespace (by controller owner reference) and
/// the sandbox each is labelled for.
async fn owners(env: &TestEnv) -> BTreeMap<String, (Vec<String>, Option<String>)> {
    env.api::<Pod>()
        .list(&ListParams::default())
        .await
        .expect("pods")
        .items
        .iter()
        .map(|p| {
            let controllers = p
                .owner_references()
                .iter()
                .filter(|o| o.controller == Some(true))
                .map(|o| format!("{}/{}", o.kind, o.name))
                .collect();
            (
                p.name_any(),
                (controllers, p.labels().get(labels::SANDBOX).cloned()),
            )
        })
        .collect()
}

/// The guarantee: every pod has at most one controller, and a pod labelled for a sandbox is
/// controlled by that sandbox; every sandbox named in `names` is Ready on a pod it controls,
/// which serves no other sandbox. Returns how many of them adopted a warm pod.
async fn assert_adopted_at_most_once(env: &TestEnv, names: &[String]) -> usize {
    let mut recorded = Vec::new();
    for name in names {
        let sbx = env.wait_for::<Sandbox>(name, 300, phase_is("Ready")).await;
        let pod = sbx
            .status
            .as_ref()
            .and_then(|s| s.pod_name.clone())
            .expect("podName");
        recorded.push((name.clone(), pod));
    }
    let owners = owners(env).await;
    for (pod, (controllers, label)) in &owners {
        assert!(
            controllers.len() <= 1,
            "{pod} has {} controllers: {controllers:?}",
            controllers.len()
        );
        if let Some(l) = label {
            assert_eq!(
                controllers,
                &vec![format!("Sandbox/{l}")],
                "{pod} is labelled for {l}"
            );
        }
    }
    let mut served = BTreeSet::new();
    let mut warm = 0;
    for (name, pod) in recorded {
        assert!(served.insert(pod.clone()), "{pod} serves two sandboxes");
        let (controllers, _) = owners.get(&pod).cloned().unwrap_or_default();
        assert_eq!(controllers, vec![format!("Sandbox/{name}")], "{pod}");
        if pod.starts_with("py-warm-") {
            warm += 1;
        }
    }
    warm
}

/// Waits until a pod of the namespace is labelled for a sandbox (an adoption, or a cold pod),
/// on a watch opened before `then` runs; returns that pod's name.
async fn first_adoption(env: &TestEnv, then: impl std::future::Future<Output = ()>) -> String {
    let pods = env.api::<Pod>();
    let mut stream = pods
        .watch(&WatchParams::default().labels(labels::SANDBOX), "0")
        .await
        .expect("watch pods")
        .boxed();
    then.await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("no adoption within 120 s");
        match next {
            Some(Ok(WatchEvent::Added(p) | WatchEvent::Modified(p))) => return p.name_any(),
            Some(Ok(_)) => {}
            Some(Err(e)) => panic!("pod watch: {e}"),
            None => panic!("pod watch ended"),
        }
    }
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn an_operator_sigkilled_between_adoptions_and_their_status_adopts_no_pod_twice() {
    let mut env = TestEnv::new("claim-sigkill").await;
    let first = env.start_operator(&[]);
    let size = 4;
    pooled(&env, size).await;
    let names: Vec<String> = (0..size).map(|i| format!("k{i}")).collect();
    // The operator is killed the moment the first adoption shows on a watch: the other
    // claims of the burst are in flight (adopted, not yet Ready) or not yet made.
    let killed_at = first_adoption(&env, async {
        let created = futures::future::join_all(
            names
                .iter()
                .map(|n| create_sandbox(&env, n, from_template(n))),
        )
        .await;
        for r in created {
            r.expect("create sandbox");
        }
    })
    .await;
    env.operators[first].kill();
    let ready_then: Vec<String> = {
        let mut v = Vec::new();
        for n in &names {
            let s = env.api::<Sandbox>().get(n).await.expect("sandbox");
            if s.status.and_then(|s| s.phase) == Some(SandboxPhase::Ready) {
                v.push(n.clone());
            }
        }
        v
    };
    eprintln!("[sigkill] killed at the adoption of {killed_at}; Ready then: {ready_then:?}");
    // The next operator finds what the killed one adopted and finishes it.
    env.start_operator(&[]);
    let warm = assert_adopted_at_most_once(&env, &names).await;
    eprintln!("[sigkill] {warm} of {size} adopted a warm pod");
    for n in &names {
        assert_eq!(env.sandbox_pods(n).await.len(), 1, "one pod for {n}");
    }
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn two_operators_claiming_at_once_adopt_no_pod_twice() {
    let mut env = TestEnv::new("claim-two-ops").await;
    // Each its own leader (a lease of its own): both reconcile every sandbox, as an old leader
    // that has not yet seen its lease go and the new one do during a leader change.
    env.start_operator(&["--leader-election-name", "leader-a"]);
    env.start_operator(&["--leader-election-name", "leader-b"]);
    let size = 4;
    pooled(&env, size).await;
    let names: Vec<String> = (0..6).map(|i| format!("t{i}")).collect();
    let created = futures::future::join_all(
        names
            .iter()
            .map(|n| create_sandbox(&env, n, from_template(n))),
    )
    .await;
    for r in created {
        r.expect("create sandbox");
    }
    let warm = assert_adopted_at_most_once(&env, &names).await;
    eprintln!(
        "[two operators] {warm} of {} adopted a warm pod",
        names.len()
    );
    assert!(warm > 0, "no warm pod adopted");
    // A sandbox both operators started may have got a pod from each before either saw the
    // other's write: the one its status does not name goes.
    for n in &names {
        let mut live = Vec::new();
        for _ in 0..600 {
            live = env
                .sandbox_pods(n)
                .await
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .map(|p| p.name_any())
                .collect::<Vec<_>>();
            if live.len() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(live.len(), 1, "{n}: {live:?}");
        let sbx = env.api::<Sandbox>().get(n).await.expect("sandbox");
        assert_eq!(
            sbx.status.and_then(|s| s.pod_name).as_ref(),
            live.first(),
            "{n} is served by the pod left"
        );
    }
    assert_adopted_at_most_once(&env, &names).await;
    env.finish().await;
}

/// Waits until `dir` is gone from the node's disk.
async fn wait_dir_removed(env: &TestEnv, dir: &str) {
    common::wait_removed(env, dir, 120).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_sandbox_deleted_right_after_its_claim_leaves_no_pod_and_no_directory() {
    let mut env = TestEnv::new("claim-deleted").await;
    let first = env.start_operator(&[]);
    pooled(&env, 2).await;

    // With the operator at work: deleted the moment its adoption shows.
    let pod = first_adoption(&env, async {
        create_sandbox(&env, "quick", from_template("quick"))
            .await
            .expect("create sandbox");
    })
    .await;
    let dir = host_dir(&env.api::<Pod>().get(&pod).await.expect("adopted pod"));
    env.api::<Sandbox>()
        .delete("quick", &DeleteParams::default())
        .await
        .expect("delete");
    env.wait_gone::<Sandbox>("quick", 60).await;
    env.wait_gone::<Pod>(&pod, 120).await;
    wait_dir_removed(&env, &dir).await;

    // In the window itself, made by hand: adopted, no status, no finalizer (the operator is
    // stopped), then deleted. The Sandbox goes at once; the garbage collector takes its pod
    // (the Sandbox is its controller owner) and the next operator's sweep its directory.
    let warm = wait_claimable(&env, "py", 2, std::slice::from_ref(&pod)).await;
    env.operators[first].kill();
    create_sandbox(&env, "window", from_template("dave"))
        .await
        .expect("create sandbox");
    let mut sbx = env.api::<Sandbox>().get("window").await.expect("sandbox");
    assert!(sbx.finalizers().is_empty(), "no operator has seen it");
    let template = env
        .api::<SandboxTemplate>()
        .get("tpl")
        .await
        .expect("template");
    sbx.spec = agentbox_api::template::resolve(&template.spec, &sbx.spec);
    let config = agentbox_operator::config::Config::parse_from(["agentbox-operator"]);
    let podcfg = PodConfig::from_config(&config);
    let shape = claim::shape_hash(&sbx, &podcfg);
    let candidates = claim::candidates(&warm, &env.ns, &shape, NODE_ROOT);
    let patch = claim::adopt_patch(&sbx, &podcfg, &candidates[0]);
    let adopted = env
        .api::<Pod>()
        .patch(
            &candidates[0].name,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .expect("adopt");
    let dir = host_dir(&adopted);
    env.api::<Sandbox>()
        .delete("window", &DeleteParams::default())
        .await
        .expect("delete");
    env.wait_gone::<Sandbox>("window", 30).await;
    env.start_operator(&[]);
    env.wait_gone::<Pod>(&adopted.name_any(), 120).await;
    wait_dir_removed(&env, &dir).await;
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_warm_pod_holds_no_scope_data_before_its_adoption() {
    let mut env = TestEnv::new("claim-scope-free").await;
    env.start_operator(&[]);
    let warm = pooled(&env, 2).await;
    let scoped_keys = [
        labels::SANDBOX,
        labels::SCOPE_KEY,
        labels::AGENT,
        labels::USER,
        labels::SESSION,
        labels::AGENT_ID,
        labels::USER_ID,
        labels::SESSION_ID,
    ];
    let check = |p: &Pod| {
        let name = p.name_any();
        for k in scoped_keys {
            assert!(!p.labels().contains_key(k), "{name}: label {k}");
            assert!(!p.annotations().contains_key(k), "{name}: annotation {k}");
        }
        assert!(
            p.owner_references().iter().all(|o| o.kind == "SandboxPool"),
            "{name}: {:?}",
            p.owner_references()
        );
        // Nothing in its directory but the operator's own dot-directory: no file of any scope.
        let dir = host_dir(p);
        let files = entries(&dir);
        assert!(
            files.iter().all(|e| e == ".agentbox"),
            "{name}: {dir} holds {files:?}"
        );
        let env_vars: Vec<String> = p
            .spec
            .as_ref()
            .map(|s| {
                s.containers
                    .iter()
                    .flat_map(|c| c.env.iter().flatten())
                    .map(|e| format!("{}={}", e.name, e.value.clone().unwrap_or_default()))
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            !env_vars.iter().any(|e| e.contains("erin")),
            "{name}: env {env_vars:?}"
        );
    };
    for p in &warm {
        check(p);
    }
    // One is adopted for erin: the other warm pod, and the refill, still hold nothing of hers.
    create_sandbox(&env, "e", from_template("erin"))
        .await
        .expect("create sandbox");
    let sbx = env.wait_for::<Sandbox>("e", 60, phase_is("Ready")).await;
    let taken = sbx
        .status
        .as_ref()
        .and_then(|s| s.pod_name.clone())
        .expect("podName");
    assert!(taken.starts_with("py-warm-"), "{taken}");
    for p in wait_claimable(&env, "py", 2, std::slice::from_ref(&taken)).await {
        check(&p);
    }
    let mine = host_dir(&env.api::<Pod>().get(&taken).await.expect("pod"));
    assert_eq!(
        std::fs::read_to_string(format!("{mine}/task.md")).expect("task.md"),
        "task of erin\n",
        "her file is in her pod only"
    );
    env.finish().await;
}
