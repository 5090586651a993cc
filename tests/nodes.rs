//! Two nodes on one machine (`hack/cluster up --nodes 2`; hack/test starts the second node for
//! this binary only): each node has a workspace root of its own, the same kind of mount on both
//! (nosuid,nodev, root-only), and `hack/cluster stop-node` / `start-node` lose a node abruptly
//! (it goes NotReady/unreachable) and bring it back Ready with its state. A Sandbox on a node
//! that is lost is recovered on the other one from its snapshot (branch B), and what it left on
//! the lost node is removed when that node returns.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use agentbox_api::crd::{Sandbox, SandboxPhase, StartBranch};
use agentbox_api::exec::{self, ExecRequest};
use common::TestEnv;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::conditions::is_pod_running;
use serde_json::json;

/// Tests here stop node 2 or need it Ready: one at a time.
static NODE2: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Where each probe pod sees its node's workspace root (`hostPath` of the operator's nodeRoot).
const ROOT_IN_POD: &str = "/nodes";

/// The node names `hack/cluster env` exports: node 1, node 2.
fn node_names() -> (String, String) {
    let names = std::env::var("AGENTBOX_NODE_NAMES").unwrap_or_default();
    let mut it = names.split_whitespace().map(str::to_owned);
    match (it.next(), it.next()) {
        (Some(a), Some(b)) => (a, b),
        _ => panic!(
            "two nodes needed (AGENTBOX_NODE_NAMES={names:?}): \
             hack/cluster up --nodes 2 && eval \"$(hack/cluster env)\""
        ),
    }
}

/// Runs `hack/cluster ARGS`, panicking with its output when it fails.
fn cluster(args: &[&str]) {
    let out = Command::new(common::repo_root().join("hack/cluster"))
        .args(args)
        .output()
        .expect("run hack/cluster");
    assert!(
        out.status.success(),
        "hack/cluster {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A keep-alive pod bound to `node` with the node's workspace root mounted at ROOT_IN_POD. It
/// tolerates node 2's test taint, and a lost node for ever (so a stop/start does not evict it).
fn probe_pod(name: &str, node: &str) -> Pod {
    let tolerate = |key: &str, effect: &str| serde_json::json!({"key": key, "operator": "Exists", "effect": effect});
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "tolerations": [
                tolerate("agentbox.dev/test-node", "NoSchedule"),
                tolerate("node.kubernetes.io/unreachable", "NoExecute"),
                tolerate("node.kubernetes.io/not-ready", "NoExecute"),
            ],
            "containers": [{
                "name": "sandbox",
                "image": common::BASE_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", agentbox_operator::controller::pod::KEEP_ALIVE],
                "volumeMounts": [{"name": "root", "mountPath": ROOT_IN_POD}],
                "securityContext": {"allowPrivilegeEscalation": false}
            }],
            "volumes": [{"name": "root", "hostPath": {"path": common::NODE_ROOT, "type": "Directory"}}]
        }
    }))
    .expect("pod")
}

async fn start_probe(env: &TestEnv, name: &str, node: &str) {
    env.api::<Pod>()
        .create(&PostParams::default(), &probe_pod(name, node))
        .await
        .expect("create probe pod");
    env.wait_for::<Pod>(name, 120, is_pod_running()).await;
}

/// Runs `script` in the probe pod; (exit code, stdout).
async fn sh(env: &TestEnv, pod: &str, script: &str) -> (Option<i32>, String) {
    common::sh(env, pod, script).await
}

fn ready_status(node: &Node) -> Option<String> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status.clone())
}

fn has_taint(node: &Node, key: &str) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == key))
}

/// Polls the Node until `cond` holds; panics with its last state after `secs`.
async fn wait_node(
    nodes: &Api<Node>,
    name: &str,
    secs: u64,
    what: &str,
    cond: impl Fn(&Node) -> bool,
) {
    let mut last = None;
    for _ in 0..secs {
        if let Ok(n) = nodes.get(name).await {
            if cond(&n) {
                return;
            }
            last = Some((ready_status(&n), n.spec.and_then(|s| s.taints)));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!("node {name} not {what} after {secs}s; last (Ready, taints): {last:?}");
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_workspace_on_one_node_is_invisible_on_the_other() {
    let _one_at_a_time = NODE2.lock().await;
    let (node1, node2) = node_names();
    let env = TestEnv::new("nodes").await;
    start_probe(&env, "on-node-1", &node1).await;
    start_probe(&env, "on-node-2", &node2).await;
    let ws = format!("{ROOT_IN_POD}/{}/ws", env.ns);

    for (pod, file) in [("on-node-1", "from-node-1"), ("on-node-2", "from-node-2")] {
        let (code, _) = sh(
            &env,
            pod,
            &format!("mkdir -p {ws} && echo {file} > {ws}/{file}"),
        )
        .await;
        assert_eq!(code, Some(0), "write {file}");
    }
    // Same path, two nodes: each sees only its own file.
    for (pod, file) in [("on-node-1", "from-node-1"), ("on-node-2", "from-node-2")] {
        let (code, listing) = sh(&env, pod, &format!("ls -A {ws}")).await;
        assert_eq!(
            (code, listing.as_str()),
            (Some(0), format!("{file}\n").as_str()),
            "{pod}"
        );
    }
    // This process runs on the host, node 1: it sees node 1's file and never node 2's.
    let on_host = std::path::Path::new(common::NODE_ROOT)
        .join(&env.ns)
        .join("ws");
    assert!(
        on_host.join("from-node-1").exists(),
        "node 1's file on the host"
    );
    assert!(
        !on_host.join("from-node-2").exists(),
        "node 2's file leaked to the host"
    );

    // Both roots are the same kind of mount: nosuid,nodev, root-only.
    for pod in ["on-node-1", "on-node-2"] {
        let (code, out) = sh(
            &env,
            pod,
            &format!("awk '$5 == \"{ROOT_IN_POD}\" {{print $6}}' /proc/self/mountinfo; stat -c %a {ROOT_IN_POD}"),
        )
        .await;
        assert_eq!(code, Some(0));
        let mut lines = out.lines();
        let opts = format!(",{},", lines.next().unwrap_or_default());
        assert!(
            opts.contains(",nosuid,") && opts.contains(",nodev,"),
            "{pod}: mount options {opts}"
        );
        assert_eq!(
            lines.next(),
            Some("700"),
            "{pod}: mode of the workspace root"
        );
    }

    for pod in ["on-node-1", "on-node-2"] {
        let (code, _) = sh(&env, pod, &format!("rm -rf {ROOT_IN_POD}/{}", env.ns)).await;
        assert_eq!(code, Some(0), "clean up on {pod}");
    }
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_stopped_node_goes_not_ready_and_comes_back_with_its_state() {
    let _one_at_a_time = NODE2.lock().await;
    let (_, node2) = node_names();
    let grace: u64 = std::env::var("AGENTBOX_NODE_GRACE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let env = TestEnv::new("nodes").await;
    let nodes: Api<Node> = Api::all(env.client.clone());
    start_probe(&env, "keeper", &node2).await;
    let dir = format!("{ROOT_IN_POD}/{}", env.ns);
    let (code, _) = sh(
        &env,
        "keeper",
        &format!("mkdir -p {dir} && echo kept > {dir}/keep"),
    )
    .await;
    assert_eq!(code, Some(0));

    cluster(&["stop-node", &node2]);
    // The controller-manager notices after its node grace (plus its 5 s monitor period): Ready
    // is no longer True and the node carries the unreachable taint the node-loss logic keys on.
    wait_node(&nodes, &node2, grace + 60, "unreachable", |n| {
        ready_status(n).as_deref() != Some("True") && has_taint(n, "node.kubernetes.io/unreachable")
    })
    .await;
    // Exec is refused while the node is down (its kubelet is gone).
    let pods = env.api::<Pod>();
    let req =
        || ExecRequest::argv(["cat", &format!("{dir}/keep")]).timeout(Duration::from_secs(10));
    assert!(
        exec::run(&pods, "keeper", "sandbox", req()).await.is_err(),
        "exec on a stopped node"
    );

    cluster(&["start-node", &node2]);
    wait_node(
        &nodes,
        &node2,
        120,
        "Ready without the unreachable taint",
        |n| {
            ready_status(n).as_deref() == Some("True")
                && !has_taint(n, "node.kubernetes.io/unreachable")
        },
    )
    .await;
    // The kubelet starts the pod's sandbox again; the node's disk kept the file.
    let mut last = String::new();
    let mut kept = false;
    for _ in 0..120 {
        match exec::run(&pods, "keeper", "sandbox", req()).await {
            Ok(out) if out.stdout_str() == "kept\n" => {
                kept = true;
                break;
            }
            Ok(out) => last = format!("{:?} {:?}", out.status, out.stdout_str()),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        kept,
        "the file on node 2's disk after start-node; last: {last}"
    );

    let (code, _) = sh(&env, "keeper", &format!("rm -rf {dir}")).await;
    assert_eq!(code, Some(0));
    env.finish().await;
}

/// The node grace of the cluster's controller-manager (`hack/cluster env` exports it).
fn node_grace() -> u64 {
    std::env::var("AGENTBOX_NODE_GRACE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50)
}

/// Polls the Sandbox until `cond` holds; panics with its last state and the operator's log
/// after `secs`.
async fn wait_sandbox(
    env: &TestEnv,
    name: &str,
    secs: u64,
    what: &str,
    cond: impl Fn(&Sandbox) -> bool,
) -> Sandbox {
    let api = env.api::<Sandbox>();
    let mut last = None;
    for _ in 0..secs * 2 {
        if let Ok(s) = api.get(name).await {
            if cond(&s) {
                return s;
            }
            last = s.status;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!(
        "sandbox {name} not {what} after {secs}s; last status: {last:#?}\n{}",
        env.operator_logs()
    );
}

/// Runs `ctr` against node 2's container runtime (`AGENTBOX_CONTAINERD_ADDRESSES` lists each
/// node's socket); its stdout split into words.
fn ctr_on_node2(args: &[&str]) -> Vec<String> {
    let socks = std::env::var("AGENTBOX_CONTAINERD_ADDRESSES").unwrap_or_default();
    let sock = socks
        .split_whitespace()
        .nth(1)
        .expect("node 2's containerd socket in AGENTBOX_CONTAINERD_ADDRESSES");
    let out = Command::new("ctr")
        .args(["--address", sock, "-n", "k8s.io"])
        .args(args)
        .output()
        .expect("run ctr");
    assert!(
        out.status.success(),
        "ctr {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The containers of the pod with UID `pod_uid` in node 2's runtime (by the label the kubelet
/// puts on each), and those of them that run.
fn containers_on_node2(pod_uid: &str) -> (Vec<String>, Vec<String>) {
    let filter = format!("labels.\"io.kubernetes.pod.uid\"=={pod_uid}");
    let ids = ctr_on_node2(&["containers", "ls", "-q", &filter]);
    // `tasks ls`: TASK PID STATUS, one line per task.
    let running = ctr_on_node2(&["tasks", "ls"])
        .into_iter()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == "RUNNING" && ids.iter().any(|i| i == f[0]))
                .then(|| f[0].to_string())
        })
        .collect();
    (ids, running)
}

fn is_ready_on(s: &Sandbox, node: &str) -> bool {
    s.status.as_ref().is_some_and(|st| {
        st.phase == Some(SandboxPhase::Ready) && st.node_name.as_deref() == Some(node)
    })
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_sandbox_on_a_lost_node_is_ready_on_the_other_with_its_snapshot_and_nothing_stays_behind()
{
    let _one_at_a_time = NODE2.lock().await;
    let (node1, node2) = node_names();
    let mut env = TestEnv::new("nodeloss").await;
    let (flags, _store, store_dir) = common::file_store(&env.ns);
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.extend(["--node-loss-grace-seconds", "5"]);
    env.start_operator(&args);
    let sandboxes = env.api::<Sandbox>();
    let pods = env.api::<Pod>();

    // On node 2: selected by name, tolerating its test taint. Then the selector goes; the
    // workspace keeps the sandbox on node 2 (its pod is pinned there) until the node is lost.
    let spec = json!({
        "image": common::BASE_IMAGE,
        "imagePullPolicy": "Never",
        "scope": {"kind": "Agent", "agent": format!("nodeloss-{}", env.ns)},
        "nodeSelector": {"kubernetes.io/hostname": node2},
        "tolerations": [{"key": "agentbox.dev/test-node", "operator": "Exists", "effect": "NoSchedule"}],
    });
    common::create_sandbox(&env, "moved", spec)
        .await
        .expect("create sandbox");
    wait_sandbox(&env, "moved", 300, "Ready on node 2", |s| {
        is_ready_on(s, &node2)
    })
    .await;
    sandboxes
        .patch(
            "moved",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"nodeSelector": null}})),
        )
        .await
        .expect("drop the node selector");
    let pod_name = agentbox_api::labels::pod_name("moved");
    let mut stale_uid = String::new();
    for _ in 0..600 {
        let s = sandboxes.get("moved").await.expect("sandbox");
        if let Ok(p) = pods.get(&pod_name).await
            && p.spec.as_ref().is_some_and(|ps| ps.node_selector.is_none())
            && is_ready_on(&s, &node2)
            && s.status
                .as_ref()
                .and_then(|st| st.workspace.as_ref())
                .and_then(|w| w.initialized_pod_uid.clone())
                == p.uid()
        {
            stale_uid = p.uid().unwrap_or_default();
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        !stale_uid.is_empty(),
        "Ready again on node 2 without the selector\n{}",
        env.operator_logs()
    );

    let (code, _) = common::sh(&env, &pod_name, "echo saved > /workspace/saved.txt").await;
    assert_eq!(code, Some(0));
    common::take_snapshot(&env, "before-loss", "moved", "Delete").await;
    // Work after the snapshot: what a node loss costs.
    let (code, _) = common::sh(&env, &pod_name, "echo unsaved > /workspace/unsaved.txt").await;
    assert_eq!(code, Some(0));
    let uid = sandboxes
        .get("moved")
        .await
        .expect("sandbox")
        .uid()
        .expect("uid");

    // What "never resurrected" is checked against below: the stale pod's containers, as node
    // 2's runtime lists them.
    let (ids, running) = containers_on_node2(&stale_uid);
    assert!(
        !ids.is_empty() && !running.is_empty(),
        "the pod's containers run in node 2's runtime: {ids:?}, running {running:?}"
    );

    let stopped = Instant::now();
    cluster(&["stop-node", &node2]);
    let recovered = wait_sandbox(&env, "moved", node_grace() + 300, "Ready on node 1", |s| {
        is_ready_on(s, &node1)
    })
    .await;
    println!(
        "node loss: stop-node {node2} → Sandbox Ready on {node1} in {:.1}s (node grace {}s, node-loss grace 5s)",
        stopped.elapsed().as_secs_f64(),
        node_grace()
    );
    let st = recovered.status.clone().expect("status");
    assert_eq!(
        st.workspace.as_ref().and_then(|w| w.last_start_branch),
        Some(StartBranch::Recovered),
        "{st:#?}"
    );
    assert_eq!(st.restored_from.as_deref(), Some("before-loss"));
    let loss = st.node_loss.clone().expect("nodeLoss recorded");
    assert_eq!(loss.node, node2);
    assert_eq!(loss.snapshot.as_deref(), Some("before-loss"));
    assert!(loss.lost_seconds.is_some_and(|s| s >= 0), "{loss:?}");
    assert!(loss.not_ready_since.is_some(), "{loss:?}");
    let dir =
        agentbox_operator::controller::pod::workspace_host_path(common::NODE_ROOT, &env.ns, &uid);
    assert_eq!(
        st.abandoned
            .iter()
            .map(|a| (a.node.as_str(), a.directory.as_str()))
            .collect::<Vec<_>>(),
        vec![(node2.as_str(), dir.as_str())],
        "the directory left on node 2 is recorded while node 2 is down"
    );
    // The pod a harness reaches is the new one, on node 1, with the snapshot's files only.
    let p = pods.get(&pod_name).await.expect("pod");
    assert_ne!(p.uid().as_deref(), Some(stale_uid.as_str()));
    assert_eq!(
        p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node1.as_str())
    );
    let (code, out) = common::sh(&env, &pod_name, "cat /workspace/saved.txt; ls /workspace").await;
    assert_eq!(code, Some(0));
    assert!(out.starts_with("saved\n"), "{out}");
    assert!(
        !out.contains("unsaved.txt"),
        "work after the snapshot cannot come back: {out}"
    );
    assert!(
        common::workspace_entries(&recovered).contains(&"saved.txt".to_string()),
        "on node 1's disk"
    );
    // One Event says so.
    let events = env
        .api::<Event>()
        .list(&ListParams::default())
        .await
        .expect("events");
    let lost: Vec<_> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("NodeLost"))
        .collect();
    assert_eq!(lost.len(), 1, "{lost:#?}");
    assert_eq!(lost[0].count.unwrap_or(1), 1, "{lost:#?}");
    let metrics = env.operators[0]
        .get("/metrics")
        .await
        .map(|(_, b)| b)
        .unwrap_or_default();
    assert!(
        metrics.contains("agentbox_node_loss_recoveries_total 1"),
        "{metrics}"
    );

    // Node 2 returns: its stale pod is not resurrected, its directory is removed.
    cluster(&["start-node", &node2]);
    let nodes: Api<Node> = Api::all(env.client.clone());
    wait_node(
        &nodes,
        &node2,
        180,
        "Ready without the unreachable taint",
        |n| {
            ready_status(n).as_deref() == Some("True")
                && !has_taint(n, "node.kubernetes.io/unreachable")
        },
    )
    .await;
    wait_sandbox(&env, "moved", 180, "without abandoned directories", |s| {
        s.status.as_ref().is_some_and(|st| st.abandoned.is_empty())
    })
    .await;
    let on_node2 = pods
        // (but the network check's beacon: the test operator's check namespace is this one)
        .list(&common::not_the_beacon().fields(&format!("spec.nodeName={node2}")))
        .await
        .expect("pods");
    assert!(
        on_node2.items.is_empty(),
        "no pod of the namespace on node 2: {:?}",
        on_node2
            .items
            .iter()
            .map(|p| p.name_any())
            .collect::<Vec<_>>()
    );
    // The returning kubelet has synced its pods (the cleanup pod ran there): the stale pod,
    // whose API object is gone, is not started again.
    let (ids, running) = containers_on_node2(&stale_uid);
    assert!(
        running.is_empty(),
        "the stale pod runs again on node 2: {running:?} of {ids:?}"
    );
    start_probe(&env, "look-on-node-2", &node2).await;
    let rel = format!("{ROOT_IN_POD}/{}/{uid}", env.ns);
    let (code, out) = sh(&env, "look-on-node-2", &format!("test -e {rel}; echo $?")).await;
    assert_eq!((code, out.as_str()), (Some(0), "1\n"), "{rel} on node 2");
    let s = sandboxes.get("moved").await.expect("sandbox");
    assert!(
        is_ready_on(&s, &node1),
        "still served from node 1: {:#?}",
        s.status
    );

    sandboxes
        .delete("moved", &Default::default())
        .await
        .expect("delete sandbox");
    env.wait_gone::<Sandbox>("moved", 120).await;
    common::finish_with_snapshots(env, Some(&store_dir)).await;
}

/// Egress on node 2 (kube-router runs there too): the operator's check proves NetworkPolicy
/// enforced on node 2 itself, a sandbox pinned there with `None` reaches neither a pod nor the
/// API server's address, an allowlist reaches its address and port and nothing next to them,
/// while a sandbox with `All` on the same node reaches them all (the control).
#[tokio::test]
#[ignore = "needs a cluster"]
async fn egress_on_node_two_is_proven_there_and_holds() {
    use common::net::{condition, listener, reaches, until_reaches};
    let _one_at_a_time = NODE2.lock().await;
    let (_, node2) = node_names();
    let mut env = TestEnv::new("net-node2").await;
    common::ensure_crds(&env.client).await;
    env.start_operator(&[]);
    let (l1, l2) = tokio::join!(
        listener(&env, "outside-1", &[8080, 8081], Some(&node2)),
        listener(&env, "outside-2", &[8080], Some(&node2))
    );
    let on_node2 = |network: serde_json::Value| {
        json!({
            "image": common::BASE_IMAGE,
            "imagePullPolicy": "Never",
            "scope": {"kind": "Global"},
            "nodeSelector": {"kubernetes.io/hostname": node2},
            "tolerations": [{"key": "agentbox.dev/test-node", "operator": "Exists", "effect": "NoSchedule"}],
            "network": network,
        })
    };
    for (name, network) in [
        ("open", json!({"egress": "All"})),
        ("closed", json!({"egress": "None"})),
        (
            "listed",
            json!({"egress": "Allowlist", "allow": [{"cidr": format!("{l1}/32"), "ports": [{"port": 8080}]}]}),
        ),
    ] {
        common::create_sandbox(&env, name, on_node2(network))
            .await
            .expect("create sandbox");
    }
    for name in ["open", "closed", "listed"] {
        let s = wait_sandbox(&env, name, 300, "Ready on node 2", |s| {
            is_ready_on(s, &node2)
        })
        .await;
        let c = condition(&s, "NetworkEnforced");
        if name == "open" {
            assert!(c.is_none(), "egress All relies on nothing: {c:?}");
        } else {
            let c = c.expect("NetworkEnforced");
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("True", "Proven"),
                "{name}: {c:?}"
            );
        }
    }
    until_reaches(&env, "open", &l1, 8080, true).await;
    until_reaches(&env, "open", &l1, 8081, true).await;
    until_reaches(&env, "open", &l2, 8080, true).await;
    until_reaches(&env, "closed", &l1, 8080, false).await;
    until_reaches(&env, "listed", &l1, 8081, false).await;
    for (ip, port) in [
        (l1.as_str(), 8080),
        (l1.as_str(), 8081),
        (l2.as_str(), 8080),
    ] {
        assert!(
            !reaches(&env, "closed", ip, port).await,
            "None on node 2 reached {ip}:{port}"
        );
    }
    let kubernetes: k8s_openapi::api::core::v1::Service =
        Api::namespaced(env.client.clone(), "default")
            .get("kubernetes")
            .await
            .unwrap();
    let api_ip = kubernetes.spec.unwrap().cluster_ip.unwrap();
    assert!(
        !reaches(&env, "closed", &api_ip, 443).await,
        "None on node 2 reached the API server's address"
    );
    until_reaches(&env, "listed", &l1, 8080, true).await;
    assert!(
        !reaches(&env, "listed", &l1, 8081).await,
        "another port of the allowlisted address"
    );
    assert!(!reaches(&env, "listed", &l2, 8080).await, "another address");
    env.finish().await;
}
