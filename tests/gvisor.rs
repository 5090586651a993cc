//! Sandboxes under gVisor (`runtimeClassName: gvisor`, the RuntimeClass `hack/cluster up`
//! creates: the pinned gVisor it builds, or Debian's runsc until that is built, through
//! containerd's runc v2 shim). One sandbox's whole life under
//! runsc — workspace init and hostPath workspace, exec (exit codes, stdin, the timeout that
//! kills the command), the file API, a snapshot restored into a new gVisor sandbox of the
//! scope, suspend and resume — and what holds only under gVisor: the kernel the sandbox sees is
//! gVisor's, where a runc sandbox of the same test sees the host's, and the pod's seccomp
//! profile (`RuntimeDefault`) filters the sandbox's system calls under gVisor as under runc.
//!
//! And the runtime-class policy: the operator's `--default-runtime-class` reaching cold,
//! templated and warm pods (and the status and `kubectl get sbx -o wide`), a namespace's
//! `agentbox.dev/required-runtime-class` refusing sandboxes and pools that would run under
//! another runtime (in the operator, and at admission through the chart's
//! ValidatingAdmissionPolicy), and a RuntimeClass that does not exist said at once.

mod common;

use std::time::Duration;

use agentbox_api::crd::{Sandbox, SandboxPhase, SandboxPool, StartBranch};
use agentbox_api::exec::{ExecOutput, ExecRequest, SANDBOX_CONTAINER};
use agentbox_client::client::Workspace;
use common::pools::{create_pool, create_template, wait_ready, warm_pods};
use common::{
    TestEnv, condition_message, create_sandbox, kubectl, listing, phase_is, sh, take_snapshot,
    wait_condition,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
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

/// What tells gVisor's kernel from the host's in a sandbox: `/proc/version` (the built gVisor's
/// says `4.19.0-gvisor`) and the kernel log (Debian's runsc writes gVisor's boot lines there;
/// the built one runs with the pod's seccomp profile, which refuses `syslog`).
const KERNEL: &str = "cat /proc/version; dmesg 2>&1 | head -n 3";

fn gvisors_kernel(seen: &str) -> bool {
    seen.to_lowercase().contains("gvisor")
}

/// hack/cluster's gVisor flavour (`hack/cluster env`): `debian` (Debian's runsc, which is not
/// given the pod's seccomp profile) or, by default, the built one.
fn debian_runsc() -> bool {
    std::env::var("AGENTBOX_GVISOR_FLAVOUR").is_ok_and(|f| f == "debian")
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
#[ignore = "needs a cluster"]
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
    let (code, seen_g) = sh(&env, &pod_g, KERNEL).await;
    assert_eq!(code, Some(0), "{seen_g}");
    assert!(gvisors_kernel(&seen_g), "not gVisor's kernel: {seen_g}");
    assert!(!seen_g.contains(host.trim()), "{seen_g}");
    let (code, seen_r) = sh(&env, &pod_r, "cat /proc/version").await;
    assert_eq!(code, Some(0), "{seen_r}");
    assert_eq!(
        seen_r.trim(),
        host.trim(),
        "runc sandbox sees the host kernel"
    );
    assert!(!gvisors_kernel(&seen_r), "{seen_r}");
    // A host-kernel interface runc passes through is not the host's under gVisor (absent under
    // runsc 2022-12, gVisor's own release under the current one): the kernel's sysctl tree (/proc/sys/kernel/osrelease is the host's release under runc).
    let (code, release) = sh(&env, &pod_r, "cat /proc/sys/kernel/osrelease").await;
    assert_eq!(code, Some(0), "{release}");
    assert!(host.contains(release.trim()), "{release} / {host}");
    let (code, out) = sh(&env, &pod_g, "cat /proc/sys/kernel/osrelease").await;
    assert!(
        code != Some(0) || !host.contains(out.trim()),
        "the host's sysctl under gVisor: {out}"
    );

    // Seccomp: the pod's RuntimeDefault profile refuses unshare(CLONE_NEWUSER) to a container
    // without CAP_SYS_ADMIN, under runc by the node's kernel and under the built gVisor by the
    // Sentry (runsc --oci-seccomp). Without a profile gVisor lets it pass (Debian's runsc, which
    // hack/cluster runs until its build is there, is not given the profile).
    let userns = "unshare -U true 2>&1; echo rc=$?";
    let (_, out) = sh(&env, &pod_r, userns).await;
    assert!(
        out.contains("Operation not permitted") && out.contains("rc=1"),
        "runc: {out}"
    );
    let (_, out) = sh(&env, &pod_g, userns).await;
    if debian_runsc() {
        assert!(out.contains("rc=0"), "Debian's runsc, no profile: {out}");
    } else {
        assert!(
            out.contains("Operation not permitted") && out.contains("rc=1"),
            "gVisor with the pod's seccomp profile: {out}"
        );
    }

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

    // A snapshot, restored into a new gVisor sandbox of the same scope (branch C), extracted
    // on the node by the helper's restore pod, not by the sandbox's `tar` through gVisor.
    take_snapshot(&env, "s1", "g", "Delete").await;
    let restore_pods = {
        use futures::StreamExt;
        use kube::runtime::watcher;
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let (seen2, pods) = (seen.clone(), pods.clone());
        let selector = format!(
            "{}=restore",
            agentbox_operator::controller::helper_pod::HELPER_LABEL
        );
        let task = tokio::spawn(async move {
            let config = watcher::Config::default().labels(&selector);
            let mut w = watcher(pods, config).boxed();
            while let Some(ev) = w.next().await {
                if let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev {
                    let mut s = seen2.lock().expect("seen");
                    let n = kube::ResourceExt::name_any(&p);
                    if !s.contains(&n) {
                        s.push(n);
                    }
                }
            }
        });
        (seen, task)
    };
    create_sandbox(&env, "g2", spec("alice", Some("gvisor")))
        .await
        .expect("create g2");
    let g2 = ready(&env, "g2").await;
    restore_pods.1.abort();
    let seen = restore_pods.0.lock().expect("seen").clone();
    let uid = kube::ResourceExt::uid(&g2).expect("uid");
    let restore_pod = format!("sbx-restore-{uid}");
    assert_eq!(seen, vec![restore_pod.clone()], "restore pods seen");
    // The restore pod goes with the restore.
    let gone =
        kube::runtime::wait::await_condition(pods.clone(), &restore_pod, |p: Option<&Pod>| {
            p.is_none()
        });
    tokio::time::timeout(Duration::from_secs(60), gone)
        .await
        .expect("the restore pod is deleted")
        .expect("watch");
    let st = g2.status.as_ref().expect("status");
    assert_eq!(
        st.workspace.as_ref().and_then(|w| w.last_start_branch),
        Some(StartBranch::Restored),
        "{g2:#?}"
    );
    assert_eq!(st.restored_from.as_deref(), Some("s1"));
    let pod_g2 = pod_of(&g2);
    assert_eq!(
        listing(&env, &pod_g2).await,
        before,
        "restored workspace differs"
    );
    let (_, k) = sh(&env, &pod_g2, KERNEL).await;
    assert!(gvisors_kernel(&k), "{k}");

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
        &format!("cat /workspace/after-restore /workspace/d/e/f; {KERNEL}"),
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.starts_with("kept\nhi\n"), "{out}");
    assert!(gvisors_kernel(&out), "{out}");
    let pod = pods.get(&pod_back).await.expect("resumed pod");
    assert_eq!(
        pod.spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref()),
        Some("gvisor")
    );

    common::finish_with_snapshots(env, Some(&dir)).await;
}

/// The runtime class the pod names.
fn runtime_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.runtime_class_name.as_deref()
}

/// Annotates the test's namespace to require runtime class `rc`.
async fn require(env: &TestEnv, rc: &str) {
    let nss: Api<Namespace> = Api::all(env.client.clone());
    nss.patch(
        &env.ns,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {
            "agentbox.dev/required-runtime-class": rc}}})),
    )
    .await
    .expect("annotate namespace");
}

fn templated(user: &str, template: &str) -> serde_json::Value {
    json!({
        "templateRef": {"name": template},
        "scope": {"kind": "User", "agent": "gvisor-tests", "user": user},
    })
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn the_operators_default_runtime_class_reaches_cold_templated_and_warm_pods() {
    let mut env = TestEnv::new("gvisor-default").await;
    env.start_operator(&["--default-runtime-class", "gvisor"]);
    let pods = env.api::<Pod>();
    create_template(&env, "tpl", "a").await;
    create_pool(&env, "warm", "tpl", 1, "Recreate")
        .await
        .expect("create pool");
    create_sandbox(&env, "cold", spec("alice", None))
        .await
        .expect("create cold");

    // A cold sandbox that names no runtime class runs under the operator's default, and says so.
    let cold = ready(&env, "cold").await;
    let pod = pods.get(&pod_of(&cold)).await.expect("pod of cold");
    assert_eq!(runtime_of(&pod), Some("gvisor"));
    assert_eq!(
        cold.status
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref()),
        Some("gvisor")
    );
    let (_, k) = sh(&env, &pod_of(&cold), KERNEL).await;
    assert!(gvisors_kernel(&k), "{k}");
    let (ok, out, err) = kubectl(&["get", "sbx", "-n", &env.ns, "-o", "wide"], "");
    assert!(ok, "{err}");
    let header = out.lines().next().unwrap_or_default();
    assert!(header.contains("RUNTIME"), "{out}");
    let row = out
        .lines()
        .find(|l| l.starts_with("cold "))
        .unwrap_or_default();
    assert!(row.split_whitespace().any(|w| w == "gvisor"), "{out}");
    let (_, narrow, _) = kubectl(&["get", "sbx", "-n", &env.ns], "");
    assert!(
        !narrow.contains("RUNTIME"),
        "priority 1: only with -o wide\n{narrow}"
    );

    // The pool's warm pods of a template that names none run under it too, and a sandbox of
    // the template that takes one says so.
    wait_ready(&env, "warm", 1).await;
    let warm = warm_pods(&env, "warm").await;
    assert_eq!(warm.len(), 1);
    assert_eq!(runtime_of(&warm[0]), Some("gvisor"));
    let warm_name = kube::ResourceExt::name_any(&warm[0]);
    create_sandbox(&env, "claimed", templated("bob", "tpl"))
        .await
        .expect("create claimed");
    let claimed = ready(&env, "claimed").await;
    assert_eq!(pod_of(&claimed), warm_name, "the warm pod was claimed");
    assert_eq!(
        claimed
            .status
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref()),
        Some("gvisor")
    );
    let (_, k) = sh(&env, &warm_name, KERNEL).await;
    assert!(gvisors_kernel(&k), "{k}");
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_namespace_that_requires_gvisor_refuses_sandboxes_and_pools_that_would_run_otherwise() {
    let mut env = TestEnv::new("gvisor-required").await;
    require(&env, "gvisor").await;
    // No default: a sandbox that names nothing would run under the node's runtime (runc).
    env.start_operator(&["--default-runtime-class="]);
    create_template(&env, "tpl", "a").await;
    create_pool(&env, "warm", "tpl", 1, "Recreate")
        .await
        .expect("create pool");
    create_sandbox(&env, "plain", spec("alice", None))
        .await
        .expect("create plain");
    create_sandbox(&env, "other", spec("bob", Some("runc")))
        .await
        .expect("create other");
    create_sandbox(&env, "from-tpl", templated("carol", "tpl"))
        .await
        .expect("create from-tpl");
    create_sandbox(&env, "g", spec("dave", Some("gvisor")))
        .await
        .expect("create g");

    // What names gVisor runs.
    let g = ready(&env, "g").await;
    assert_eq!(
        g.status
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref()),
        Some("gvisor")
    );
    // Everything else is refused, visibly, and never started.
    for (name, runs) in [
        ("plain", "the node's default runtime"),
        ("other", "runtime class \"runc\""),
        ("from-tpl", "the node's default runtime"),
    ] {
        let s = wait_condition(&env, name, "Ready", "False", "RuntimeClassRequired").await;
        let st = s.status.as_ref().expect("status");
        assert_eq!(st.phase, Some(SandboxPhase::Failed), "{name}");
        let stalled = s.stalled().expect("Stalled: every client's wait ends");
        assert_eq!(stalled.reason, "RuntimeClassRequired");
        let msg = condition_message(&s, "Ready");
        assert!(
            msg.contains("agentbox.dev/required-runtime-class") && msg.contains(runs),
            "{name}: {msg}"
        );
        let evs = common::events(&env, name, "RuntimeClassRequired").await;
        assert!(
            evs.iter().any(|e| e.type_.as_deref() == Some("Warning")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("agentbox.dev/required-runtime-class"))),
            "{name}: {evs:?}"
        );
        assert!(env.sandbox_pods(name).await.is_empty(), "{name} got a pod");
    }
    // The pool keeps no warm pod under runc, and says why.
    let pool = env
        .wait_for::<SandboxPool>("warm", 60, |p: Option<&SandboxPool>| {
            p.and_then(|p| p.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.reason == "RuntimeClassRequired")
            })
        })
        .await;
    let ready_cond = pool
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .cloned()
        .expect("Ready");
    assert_eq!(ready_cond.status, "False");
    assert!(
        ready_cond
            .message
            .contains("agentbox.dev/required-runtime-class"),
        "{}",
        ready_cond.message
    );
    let evs = common::events(&env, "warm", "RuntimeClassRequired").await;
    assert!(
        evs.iter().any(|e| e.type_.as_deref() == Some("Warning")),
        "{evs:?}"
    );
    assert!(warm_pods(&env, "warm").await.is_empty());
    // Refused means never started: no pod under runc ever existed in the namespace.
    for p in env
        .api::<Pod>()
        .list(&Default::default())
        .await
        .expect("pods")
        .items
    {
        let labels = p.metadata.labels.clone().unwrap_or_default();
        if labels.contains_key(agentbox_api::labels::SANDBOX)
            || labels.contains_key(agentbox_api::labels::POOL)
        {
            assert_eq!(runtime_of(&p), Some("gvisor"), "{:?}", p.metadata.name);
        }
    }
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_runtime_class_that_does_not_exist_stalls_the_sandbox_at_once_without_a_pod() {
    let mut env = TestEnv::new("gvisor-missing").await;
    env.start_operator(&[]);
    create_sandbox(&env, "nowhere", spec("alice", Some("no-such-class")))
        .await
        .expect("create");
    let s = wait_condition(&env, "nowhere", "Stalled", "True", "RuntimeClassNotFound").await;
    assert_eq!(
        s.status.as_ref().and_then(|st| st.phase),
        Some(SandboxPhase::Pending)
    );
    assert!(s.stalled().is_some(), "every client's wait for Ready ends");
    let msg = condition_message(&s, "Ready");
    assert!(
        msg.contains("RuntimeClass \"no-such-class\" does not exist"),
        "{msg}"
    );
    let evs = common::events(&env, "nowhere", "RuntimeClassNotFound").await;
    assert!(
        evs.iter().any(|e| e.type_.as_deref() == Some("Warning")),
        "{evs:?}"
    );
    assert!(env.sandbox_pods("nowhere").await.is_empty());
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn the_charts_admission_policy_refuses_at_admission_what_the_namespace_does_not_take() {
    let env = TestEnv::new("gvisor-vap").await;
    // The chart's policy, named after and bound to this namespace only (watchNamespace).
    let rendered = common::helm_template(&[
        "--show-only",
        "templates/admissionpolicy.yaml",
        "--set",
        &format!("fullnameOverride={}", env.ns),
        "--set",
        &format!("watchNamespace={}", env.ns),
    ])
    .expect("helm template");
    let (ok, out, err) = kubectl(&["apply", "-f", "-"], &rendered);
    assert!(ok, "{out}{err}");
    require(&env, "gvisor").await;
    let sandbox = |name: &str, extra: serde_json::Value| {
        let mut o = json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": name, "namespace": env.ns},
            "spec": spec(name, None),
        });
        if let (Some(s), Some(e)) = (o["spec"].as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        o.to_string()
    };
    // The binding takes effect once the API server has loaded it: until then a create may
    // pass (deleted again), so try until refused.
    let mut refused = String::new();
    for i in 0..300 {
        let (ok, _, err) = kubectl(
            &["create", "-f", "-"],
            &sandbox(&format!("plain-{i}"), json!({})),
        );
        if !ok {
            refused = err;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        refused.contains("agentbox.dev/required-runtime-class")
            && refused.contains("requires runtime class gvisor")
            && refused.contains("node default runtime"),
        "{refused}"
    );
    let (ok, _, err) = kubectl(
        &["create", "-f", "-"],
        &sandbox("other", json!({"runtimeClassName": "runc"})),
    );
    assert!(!ok && err.contains("runtime class runc"), "{err}");
    let (ok, _, err) = kubectl(
        &["create", "-f", "-"],
        &sandbox("g", json!({"runtimeClassName": "gvisor"})),
    );
    assert!(ok, "{err}");
    // A template is checked the same way; a sandbox of a template is left to the template.
    let tpl = |name: &str, rc: Option<&str>| {
        let mut o = json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxTemplate",
            "metadata": {"name": name, "namespace": env.ns},
            "spec": {"image": common::BASE_IMAGE},
        });
        if let Some(rc) = rc {
            o["spec"]["runtimeClassName"] = json!(rc);
        }
        o.to_string()
    };
    let (ok, _, err) = kubectl(&["create", "-f", "-"], &tpl("plain", None));
    assert!(!ok && err.contains("SandboxTemplate"), "{err}");
    let (ok, _, err) = kubectl(&["create", "-f", "-"], &tpl("g", Some("gvisor")));
    assert!(ok, "{err}");
    let mut from_tpl = json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
        "metadata": {"name": "from-tpl", "namespace": env.ns},
        "spec": templated("erin", "g"),
    });
    from_tpl["spec"]["scope"]["user"] = json!("erin");
    let (ok, _, err) = kubectl(&["create", "-f", "-"], &from_tpl.to_string());
    assert!(ok, "{err}");
    // Writes that leave the spec alone pass (a finalizer's removal on a refused object).
    let (ok, _, err) = kubectl(&["label", "sbx", "g", "-n", &env.ns, "x=y"], "");
    assert!(ok, "{err}");
    let (ok, out, err) = kubectl(&["delete", "-f", "-", "--wait=false"], &rendered);
    assert!(ok, "{out}{err}");
    env.finish().await;
}
