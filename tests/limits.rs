//! One sandbox cannot take its node down: its process limit (a fork bomb stops at it while
//! another sandbox on the node starts and runs commands), `resources.limits.pids` refused at
//! admission, and a limit that cannot be set refused visibly (the pod does not start).
//!
//! Runs alone in hack/test (after the lanes): the fork bomb takes its sandbox's 256 process ids
//! and both cores for a while, which would slow the tests beside it past their waits.

mod common;

use std::time::Duration;

use agentbox_api::crd::Sandbox;
use common::{TestEnv, condition_message, create_sandbox, events, phase_is, sh, wait_condition};
use kube::ResourceExt;
use serde_json::json;

/// The kubelet's pods' pids cgroups on the test cluster's node (hack/cluster: cgroupRoot
/// `/agentbox`, cgroupfs driver, cgroup v1).
const PIDS_ROOT: &str = "/sys/fs/cgroup/pids/agentbox/kubepods";

fn spec(extra: serde_json::Value) -> serde_json::Value {
    let mut s = json!({"image": common::BASE_IMAGE, "imagePullPolicy": "Never",
        "scope": {"kind": "Agent", "agent": "limits-tests"}});
    for (k, v) in extra.as_object().into_iter().flatten() {
        s[k] = v.clone();
    }
    s
}

fn operator_flags() -> Vec<String> {
    vec!["--pids-cgroup-root".into(), PIDS_ROOT.into()]
}

fn pod_name(s: &Sandbox) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.pod_name.clone())
        .expect("pod name")
}

/// The pod's own pids cgroup directory on this host.
async fn pod_cgroup(env: &TestEnv, pod: &str) -> String {
    let p = env
        .api::<k8s_openapi::api::core::v1::Pod>()
        .get(pod)
        .await
        .expect("pod");
    format!("{PIDS_ROOT}/burstable/pod{}", p.uid().expect("uid"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .to_string()
}

/// Forks the limit refused in the pod: `max` of `pids.events` counts in the cgroup the fork
/// came from (the container's, below the pod's), so the pod's and its children's are summed.
fn refused_forks(cg: &str) -> u64 {
    let count = |dir: &std::path::Path| -> u64 {
        std::fs::read_to_string(dir.join("pids.events"))
            .ok()
            .and_then(|t| t.trim().strip_prefix("max ").and_then(|n| n.parse().ok()))
            .unwrap_or(0)
    };
    let dir = std::path::Path::new(cg);
    count(dir)
        + std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| count(&e.path()))
                    .sum()
            })
            .unwrap_or(0)
}

/// Processes on this host (the node), by /proc's numeric entries.
fn node_processes() -> usize {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .count()
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_fork_bomb_stops_at_its_sandboxs_process_limit_and_the_node_carries_on() {
    let mut env = TestEnv::new("limits").await;
    let flags = operator_flags();
    let mut args: Vec<&str> = flags.iter().map(String::as_str).collect();
    args.extend(["--process-limit", "1024"]);
    env.start_operator(&args);
    create_sandbox(&env, "bomb", spec(json!({"processLimit": 256})))
        .await
        .expect("create");
    env.wait_for::<Sandbox>("bomb", 180, phase_is("Ready"))
        .await;
    let bomb = wait_condition(&env, "bomb", "ProcessLimited", "True", "Limited").await;
    let msg = condition_message(&bomb, "ProcessLimited");
    assert!(msg.contains("at most 256"), "{msg}");
    // The shared test cluster's kubelet sets no podPidsLimit (hack/cluster's config sets one
    // from the next start): reported, with a Warning Event.
    let node = condition_message(&bomb, "NodePidsLimited");
    assert!(!node.is_empty(), "no NodePidsLimited condition");
    let pod = pod_name(&bomb);
    let cg = pod_cgroup(&env, &pod).await;
    assert_eq!(read(&format!("{cg}/pids.max")), "256", "{cg}");
    let refused_before = refused_forks(&cg);

    let baseline = node_processes();
    // The bomb: a loop that forks up to 600 processes (each sleeps 45 s, then exits) in a
    // session and process group of its own, as fast as it can; the first fork the limit
    // refuses ends it. So it is bounded in count (600) and time (~45 s) whatever the limit does.
    let (code, out) = sh(
        &env,
        &pod,
        "setsid sh -c 'i=0; while [ $i -lt 600 ]; do sleep 45 & i=$((i+1)); done' \
         </dev/null >/dev/null 2>&1 & echo started",
    )
    .await;
    assert_eq!((code, out.trim()), (Some(0), "started"));
    // It reaches the limit: the cgroup counts refused forks (pids.events `max`).
    let mut peak_node = baseline;
    let mut hit = false;
    for _ in 0..600 {
        peak_node = peak_node.max(node_processes());
        let current: u64 = read(&format!("{cg}/pids.current")).parse().unwrap();
        assert!(current <= 256, "pids.current {current} over the limit");
        if refused_forks(&cg) > refused_before && current >= 200 {
            hit = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        hit,
        "the bomb never reached its limit: {} forks refused, pids.current {}",
        refused_forks(&cg),
        read(&format!("{cg}/pids.current"))
    );

    // Meanwhile a second sandbox on the node starts and runs commands.
    create_sandbox(&env, "other", spec(json!({})))
        .await
        .expect("create");
    let other = env
        .wait_for::<Sandbox>("other", 180, phase_is("Ready"))
        .await;
    let other_pod = pod_name(&other);
    for i in 0..5 {
        let (code, out) = sh(&env, &other_pod, &format!("echo ok-{i}; ls / >/dev/null")).await;
        assert_eq!((code, out.trim().to_string()), (Some(0), format!("ok-{i}")));
        peak_node = peak_node.max(node_processes());
    }
    // ... while the bomb still holds its limit.
    let current: u64 = read(&format!("{cg}/pids.current")).parse().unwrap();
    assert!(
        current >= 200,
        "the bomb had ended before the second sandbox ran: {current}"
    );
    assert!(read(&format!("{cg}/pids.peak")).parse::<u64>().unwrap() <= 256);
    // The node's process count stayed within the bomb's limit of its baseline (plus the
    // second sandbox's pod and the machine's own coming and going).
    assert!(
        peak_node <= baseline + 256 + 150,
        "the node went from {baseline} to {peak_node} processes"
    );
    assert!(
        !events(&env, "bomb", "NoPodPidsLimit").await.is_empty()
            || condition_message(&bomb, "NodePidsLimited").contains("limits every pod"),
        "the kubelet's limit is reported"
    );
    // The bomb ends by itself (each sleeper after 45 s); the sandbox answers again after. Its
    // keep-alive shell may have been one of the forks refused (its `sleep` at the limit) and
    // exited: the kubelet restarts the container, the workspace stays.
    let mut answered = String::new();
    for _ in 0..120 {
        let ok = agentbox_api::exec::run(
            &env.api::<k8s_openapi::api::core::v1::Pod>(),
            &pod,
            "sandbox",
            agentbox_api::exec::ExecRequest::argv(["sh", "-c", "echo back"])
                .timeout(Duration::from_secs(20)),
        )
        .await;
        match ok {
            Ok(out) if out.status.code() == Some(0) && out.stdout_str().trim() == "back" => {
                answered.clear();
                break;
            }
            Ok(out) => answered = format!("{:?} {:?}", out.status, out.stdout_str()),
            Err(e) => answered = e.to_string(),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert!(
        answered.is_empty(),
        "the sandbox did not answer after the bomb: {answered}"
    );
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn pids_as_a_container_resource_is_refused_at_admission_naming_process_limit() {
    let env = TestEnv::new("limits").await;
    for which in ["limits", "requests"] {
        let e = create_sandbox(
            &env,
            "p",
            spec(json!({"resources": {which: {"pids": "100", "memory": "64Mi"}}})),
        )
        .await
        .expect_err("refused");
        let m = e.to_string();
        assert!(
            m.contains(&format!("resources.{which}.pids")) && m.contains("set processLimit"),
            "{m}"
        );
    }
    let e = create_sandbox(&env, "p", spec(json!({"processLimit": 8})))
        .await
        .expect_err("refused");
    assert!(e.to_string().contains("processLimit"), "{e}");
    let e = create_sandbox(
        &env,
        "p",
        json!({"templateRef": {"name": "t"}, "processLimit": 64,
            "scope": {"kind": "Agent", "agent": "limits-tests"}}),
    )
    .await
    .expect_err("refused");
    assert!(
        e.to_string()
            .contains("processLimit comes from the template"),
        "{e}"
    );
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_limit_that_cannot_be_set_keeps_the_pod_from_starting_and_says_why() {
    let mut env = TestEnv::new("limits").await;
    // A pids cgroup root that holds no pod: its `burstable` cgroup is one this test makes
    // (empty), so the kubelet makes an empty `pod<uid>` below it for the mount and the helper
    // finds no process in it.
    let root = format!("/sys/fs/cgroup/pids/agentbox-test-{}", env.ns);
    std::fs::create_dir_all(format!("{root}/burstable")).expect("make a pids cgroup");
    env.start_operator(&[
        "--pids-cgroup-root",
        &root,
        "--process-limit",
        "512",
        "--stall-grace-seconds",
        "5",
    ]);
    create_sandbox(&env, "s", spec(json!({})))
        .await
        .expect("create");
    let s = wait_condition(&env, "s", "ProcessLimited", "False", "NotEnforced").await;
    let msg = condition_message(&s, "ProcessLimited");
    assert!(
        msg.contains("512") && msg.contains("no process is in this cgroup"),
        "{msg}"
    );
    assert!(!events(&env, "s", "NotEnforced").await.is_empty());
    // The pod never ran the sandbox's code, and the wait for Ready ends: Stalled.
    let s = wait_condition(&env, "s", "Stalled", "True", "InitContainerFailed").await;
    assert_ne!(
        s.status.as_ref().and_then(|st| st.phase),
        Some(agentbox_api::crd::SandboxPhase::Ready)
    );
    let pods = env.sandbox_pods("s").await;
    let started = pods.iter().any(|p| {
        p.status
            .as_ref()
            .and_then(|st| st.container_statuses.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.name == "sandbox" && c.state.as_ref().is_some_and(|st| st.running.is_some()))
    });
    assert!(!started, "the sandbox container ran without its limit");
    env.finish().await;
    // The cgroups this test made (empty once the pod is gone).
    for _ in 0..50 {
        let pods: Vec<_> = std::fs::read_dir(format!("{root}/burstable"))
            .map(|d| {
                d.flatten()
                    .filter(|e| e.path().is_dir())
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        for p in &pods {
            let _ = std::fs::remove_dir(p);
        }
        if std::fs::remove_dir(format!("{root}/burstable")).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = std::fs::remove_dir(&root);
}
