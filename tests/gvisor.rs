//! Sandboxes under gVisor (`runtimeClassName: gvisor`, the RuntimeClass `hack/cluster up`
//! creates: Debian's runsc through containerd's runc v2 shim). One sandbox's whole life under
//! runsc — workspace init and hostPath workspace, exec (exit codes, stdin, the timeout that
//! kills the command), the file API, a snapshot restored into a new gVisor sandbox of the
//! scope, suspend and resume — and what holds only under gVisor: the kernel the sandbox sees is
//! gVisor's, where a runc sandbox of the same test sees the host's.

mod common;

use std::time::Duration;

use agentbox_api::crd::{Sandbox, StartBranch};
use agentbox_api::exec::{ExecOutput, ExecRequest, SANDBOX_CONTAINER};
use agentbox_client::client::Workspace;
use common::{TestEnv, create_sandbox, listing, phase_is, sh, take_snapshot};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

fn spec(user: &str, runtime_class: Option<&str>) -> serde_json::Value {
    let mut s = json!({
        "image": common::BASE_IMAGE,
        "imagePullPolicy": "Never",
        "scope": {"kind": "User", "agent": "gvisor-tests", "user": user},
    });
    if let (Some(rc), Some(o)) = (runtime_class, s.as_object_mut()) {
        o.insert("runtimeClassName".into(), json!(rc));
    }
    s
}

fn pod_of(s: &Sandbox) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.pod_name.clone())
        .expect("pod name")
}

async fn ready(env: &TestEnv, name: &str) -> Sandbox {
    env.wait_for::<Sandbox>(name, 300, phase_is("Ready")).await
}

async fn run(pods: &Api<Pod>, pod: &str, req: ExecRequest) -> ExecOutput {
    agentbox_api::exec::run(pods, pod, SANDBOX_CONTAINER, req)
        .await
        .expect("exec")
}

async fn set_mode(env: &TestEnv, name: &str, mode: &str) {
    env.api::<Sandbox>()
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"lifecycle": {"mode": mode}}})),
        )
        .await
        .expect("patch lifecycle mode");
}

#[tokio::test]
async fn a_sandbox_lives_its_whole_life_under_gvisor() {
    let mut env = TestEnv::new("gvisor").await;
    let (flags, _store, dir) = common::file_store(&env.ns);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    env.start_operator(&flags);
    let pods = env.api::<Pod>();

    create_sandbox(&env, "g", spec("alice", Some("gvisor")))
        .await
        .expect("create g");
    create_sandbox(&env, "r", spec("bob", None))
        .await
        .expect("create r");
    // Ready: the operator's workspace init (hostPath workspace, own-workspace) ran under runsc.
    let g = ready(&env, "g").await;
    let r = ready(&env, "r").await;
    let (pod_g, pod_r) = (pod_of(&g), pod_of(&r));
    let pod = pods.get(&pod_g).await.expect("pod of g");
    assert_eq!(
        pod.spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref()),
        Some("gvisor")
    );

    // The kernel each one sees: gVisor's under runsc, the host's under runc.
    let host = std::fs::read_to_string("/proc/version").expect("host /proc/version");
    let (code, seen_g) = sh(&env, &pod_g, "cat /proc/version; dmesg | head -n 3").await;
    assert_eq!(code, Some(0), "{seen_g}");
    assert!(seen_g.contains("gVisor"), "not gVisor's kernel: {seen_g}");
    assert!(!seen_g.contains(host.trim()), "{seen_g}");
    let (code, seen_r) = sh(&env, &pod_r, "cat /proc/version").await;
    assert_eq!(code, Some(0), "{seen_r}");
    assert_eq!(
        seen_r.trim(),
        host.trim(),
        "runc sandbox sees the host kernel"
    );
    assert!(!seen_r.contains("gVisor"));

    // Exec: exit codes, stdin, stdout and stderr apart.
    let out = run(
        &pods,
        &pod_g,
        ExecRequest::shell("echo out; echo err >&2; exit 7"),
    )
    .await;
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    assert_eq!(out.stdout_str(), "out\n");
    assert_eq!(out.stderr_str(), "err\n");
    let blob: Vec<u8> = (0..=255u8).cycle().take(200_000).collect();
    let out = run(
        &pods,
        &pod_g,
        ExecRequest::argv(["cat"])
            .stdin(blob.clone())
            .timeout(Duration::from_secs(60)),
    )
    .await;
    assert!(out.status.success() && !out.timed_out, "{out:?}");
    assert_eq!(out.stdout, blob);

    // The timeout kills the command and its children (gVisor's process table: no 311x left).
    let out = run(
        &pods,
        &pod_g,
        ExecRequest::shell("echo started; sleep 3117 & sleep 3118; echo never")
            .timeout(Duration::from_secs(2)),
    )
    .await;
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.stdout_str(), "started\n");
    assert_eq!(out.status.signal(), Some(9), "{out:?}");
    let scan = "ps -o pid,args | grep 'sleep 31[01][0-9]' | grep -v grep; true";
    run(
        &pods,
        &pod_g,
        ExecRequest::shell("setsid sleep 3116 </dev/null >/dev/null 2>&1 &"),
    )
    .await;
    let (_, left) = sh(&env, &pod_g, scan).await;
    assert!(
        left.contains("sleep 3116"),
        "scan missed a live process: {left}"
    );
    assert!(
        !left.contains("sleep 3117") && !left.contains("sleep 3118"),
        "processes survived the timeout:\n{left}"
    );

    // The file API (tar and cat over exec) on the hostPath workspace.
    let ws = Workspace::new(pods.clone(), &pod_g, SANDBOX_CONTAINER, "/workspace");
    ws.write_file("a/b/c.bin", blob.clone())
        .await
        .expect("write");
    assert_eq!(ws.read_file("a/b/c.bin").await.expect("read"), blob);
    // Written through gVisor's gofer, it is on the node's disk.
    let (code, out) = sh(
        &env,
        &pod_g,
        "set -e; cd /workspace; mkdir -p d/e; echo hi > d/e/f; ln -s e/f d/l; \
         head -c 3000000 /dev/urandom > big; chmod 0600 big; echo ok",
    )
    .await;
    assert_eq!((code, out.as_str()), (Some(0), "ok\n"));
    let before = listing(&env, &pod_g).await;
    assert!(before.contains("L ./d/l e/f"), "{before}");

    // A snapshot, restored into a new gVisor sandbox of the same scope (branch C).
    take_snapshot(&env, "s1", "g", "Delete").await;
    create_sandbox(&env, "g2", spec("alice", Some("gvisor")))
        .await
        .expect("create g2");
    let g2 = ready(&env, "g2").await;
    let st = g2.status.as_ref().expect("status");
    assert_eq!(
        st.workspace.as_ref().and_then(|w| w.last_start_branch),
        Some(StartBranch::C),
        "{g2:#?}"
    );
    assert_eq!(st.restored_from.as_deref(), Some("s1"));
    let pod_g2 = pod_of(&g2);
    assert_eq!(
        listing(&env, &pod_g2).await,
        before,
        "restored workspace differs"
    );
    let (_, k) = sh(&env, &pod_g2, "dmesg | head -n 1").await;
    assert!(k.contains("gVisor"), "{k}");

    // Suspend and resume: the pod goes, the workspace stays, the new pod runs under gVisor.
    sh(&env, &pod_g2, "echo kept > /workspace/after-restore").await;
    set_mode(&env, "g2", "Suspended").await;
    env.wait_for::<Sandbox>("g2", 300, phase_is("Suspended"))
        .await;
    set_mode(&env, "g2", "Running").await;
    let back = ready(&env, "g2").await;
    let pod_back = pod_of(&back);
    let (code, out) = sh(
        &env,
        &pod_back,
        "cat /workspace/after-restore /workspace/d/e/f; dmesg | head -n 1",
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("kept\nhi\n"), "{out}");
    assert!(out.contains("gVisor"), "{out}");
    let pod = pods.get(&pod_back).await.expect("resumed pod");
    assert_eq!(
        pod.spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref()),
        Some("gvisor")
    );

    common::finish_with_snapshots(env, Some(&dir)).await;
}
