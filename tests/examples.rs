//! Every file in examples/ applied with kubectl, as a user would, into a temporary namespace with
//! an operator watching it; each Sandbox must become Ready and show what its comments promise.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use agentbox_api::crd::{Sandbox, SandboxPhase, StartBranch};
use agentbox_api::labels;
use common::{TestEnv, phase_is, repo_root, sh};
use k8s_openapi::api::networking::v1::NetworkPolicy;

fn examples_dir() -> PathBuf {
    repo_root().join("examples")
}

fn apply(ns: &str, file: &Path) {
    let out = Command::new(common::kubectl_bin())
        .args(["apply", "-n", ns, "-f"])
        .arg(file)
        .output()
        .expect("run kubectl");
    assert!(
        out.status.success(),
        "kubectl apply -f {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn ready(env: &TestEnv, name: &str) -> Sandbox {
    env.wait_for::<Sandbox>(name, 120, phase_is("Ready")).await
}

fn pod(s: &Sandbox) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.pod_name.clone())
        .expect("pod name in status")
}

async fn run(env: &TestEnv, s: &Sandbox, script: &str) -> String {
    let (code, out) = sh(env, &pod(s), script).await;
    assert_eq!(code, Some(0), "{script}: {out}");
    out
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn every_example_applies_and_becomes_ready() {
    let mut env = TestEnv::new("examples").await;
    env.start_operator(&[]);

    let mut files: Vec<PathBuf> = std::fs::read_dir(examples_dir())
        .expect("examples/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "session.yaml",
        "user.yaml",
        "agent.yaml",
        "global.yaml",
        "files-and-projections.yaml",
        "snapshot-restore.yaml",
        "no-egress.yaml",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "examples/{want} is missing"
        );
    }
    for f in &files {
        apply(&env.ns, f);
    }
    // Every Sandbox in every example file must become Ready (none needs anything absent).
    let all = env
        .api::<Sandbox>()
        .list(&Default::default())
        .await
        .expect("list sandboxes");
    assert!(
        all.items.len() >= files.len(),
        "one Sandbox per example at least"
    );
    for s in &all.items {
        ready(&env, &kube::ResourceExt::name_any(s)).await;
    }

    // One per scope kind, labelled with its scope.
    for (name, scope) in [
        ("session-example", "session"),
        ("user-example", "user"),
        ("agent-example", "agent"),
        ("global-example", "global"),
    ] {
        let s = ready(&env, name).await;
        let pods = env.sandbox_pods(name).await;
        assert_eq!(pods.len(), 1, "{name}: one pod");
        let l = pods[0].metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            l.get(labels::SCOPE).map(String::as_str),
            Some(scope),
            "{name}"
        );
        assert_eq!(
            l.get(labels::SCOPE_KEY),
            s.status.as_ref().and_then(|st| st.scope_key.as_ref()),
            "{name}: scope-key label"
        );
    }
    let s = ready(&env, "session-example").await;
    assert!(
        run(&env, &s, "cat /workspace/TASK.md")
            .await
            .contains("failing test")
    );
    let s = ready(&env, "user-example").await;
    assert_eq!(
        run(&env, &s, "cat /workspace/notes/preferences.md").await,
        "Prefers small commits.\n"
    );
    let s = ready(&env, "agent-example").await;
    run(&env, &s, "test -d /work/.agentbox").await;

    // Files (inline, mode, from a ConfigMap, ephemeral) and a projection.
    let s = ready(&env, "files-example").await;
    let out = run(
        &env,
        &s,
        "cd /workspace && cat README.md && ./bin/check.sh && stat -c %a bin/check.sh \
         && cat .config/settings.json run/started-by && ls skills && cat skills/git.md",
    )
    .await;
    for want in [
        "hello from agentbox",
        "workspace ok:",
        "755",
        "\"maxSteps\": 50",
        "agentbox",
        "git.md",
        "tests.md",
        "Commit with a clear message.",
    ] {
        assert!(out.contains(want), "files-example: {want:?} not in {out:?}");
    }

    // Restore Latest with no snapshot of the scope yet: a fresh start (branch D), files written.
    let s = ready(&env, "restore-example").await;
    let st = s.status.clone().unwrap_or_default();
    assert_eq!(st.phase, Some(SandboxPhase::Ready));
    assert_eq!(
        st.workspace.as_ref().and_then(|w| w.last_start_branch),
        Some(StartBranch::Fresh)
    );
    assert_eq!(st.restored_from, None);
    run(&env, &s, "test -f /workspace/README.md").await;

    // Egress None: the deny-all-egress NetworkPolicy exists (enforcement is the CNI's job).
    ready(&env, "no-egress-example").await;
    let np = env
        .api::<NetworkPolicy>()
        .get(&labels::network_policy_name("no-egress-example"))
        .await
        .expect("egress NetworkPolicy");
    let spec = np.spec.expect("policy spec");
    assert_eq!(spec.policy_types, Some(vec!["Egress".to_string()]));
    assert!(spec.egress.unwrap_or_default().is_empty(), "no egress rule");

    env.finish().await;
}
