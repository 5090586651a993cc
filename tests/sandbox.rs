//! The sandbox controller against the real local cluster: start branches, lifecycle,
//! admission errors, cleanup, and leader election.

mod common;

use std::time::Duration;

use agentbox_api::crd::{Sandbox, SandboxPhase, StartBranch};
use agentbox_api::labels;
use common::{NODE_ROOT, TestEnv, condition_message, create_sandbox, phase_is, sh, wait_condition};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn status(s: &Sandbox) -> &agentbox_api::crd::SandboxStatus {
    s.status.as_ref().expect("status")
}

fn branch(s: &Sandbox) -> Option<StartBranch> {
    status(s)
        .workspace
        .as_ref()
        .and_then(|w| w.last_start_branch)
}

fn workspace_dir(env: &TestEnv, s: &Sandbox) -> String {
    agentbox_operator::controller::pod::workspace_host_path(NODE_ROOT, &env.ns, &s.uid().unwrap())
}

async fn merge(env: &TestEnv, name: &str, patch: serde_json::Value) -> Sandbox {
    env.api::<Sandbox>()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("patch sandbox")
}

/// Waits for Ready and for the workspace to be initialised in a pod other than `old_pod_uid`.
async fn wait_ready_in_new_pod(env: &TestEnv, name: &str, old_pod_uid: &str) -> Sandbox {
    let old = old_pod_uid.to_string();
    env.wait_for::<Sandbox>(name, 120, move |s: Option<&Sandbox>| {
        s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
            st.phase == Some(SandboxPhase::Ready)
                && st
                    .workspace
                    .as_ref()
                    .and_then(|w| w.initialized_pod_uid.as_deref())
                    .is_some_and(|u| u != old)
        })
    })
    .await
}

fn pod_uid(s: &Sandbox) -> String {
    status(s)
        .workspace
        .as_ref()
        .and_then(|w| w.initialized_pod_uid.clone())
        .expect("initialised pod uid")
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn files_fresh_then_pod_restart_reattaches_with_workspace_intact() {
    let mut env = TestEnv::new("sbx-files").await;
    env.start_operator(&[]);
    let cms = env.api::<ConfigMap>();
    // Sources opt in to being read for sandboxes (docs/security.md).
    let readable = json!({"agentbox.dev/sandbox-readable": "true"});
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "tools", "labels": readable},
        "data": {"lint.sh": "echo lint\n", "fmt.sh": "echo fmt\n"}
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let cm_file: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "cfg", "labels": readable}, "data": {"settings": "a=1\n"}}),
    )
    .unwrap();
    cms.create(&PostParams::default(), &cm_file).await.unwrap();
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "token", "labels": readable}, "stringData": {"value": "s3cr3t"}}),
    )
    .unwrap();
    env.api::<Secret>()
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    create_sandbox(&env, "files", json!({
        "image": common::BASE_IMAGE,
        "imagePullPolicy": "Never",
        "scope": {"kind": "Session", "agent": "coder", "session": "Session #1 (ünïcode)"},
        "workspace": {
            "files": [
                {"path": "README.md", "content": "hello\n"},
                {"path": "bin/run.sh", "content": "#!/bin/sh\necho run\n", "mode": 0o755},
                {"path": "./conf/settings", "contentFrom": {"configMapKeyRef": {"name": "cfg", "key": "settings"}}},
                {"path": "secret/token", "contentFrom": {"secretKeyRef": {"name": "token", "key": "value"}}, "mode": 0o600},
                {"path": "state/session", "content": "fresh", "ephemeral": true}
            ],
            "projections": [{"configMap": "tools", "path": "tools"}]
        }
    }))
    .await
    .expect("create sandbox");
    let sbx = env
        .wait_for::<Sandbox>("files", 120, phase_is("Ready"))
        .await;
    assert_eq!(branch(&sbx), Some(StartBranch::Fresh));
    let st = status(&sbx);
    let pod = st.pod_name.clone().unwrap();
    let node = st.node_name.clone().unwrap();
    assert_eq!(
        st.scope_key.as_deref(),
        Some(labels::scope_key(&sbx.spec.scope).as_str())
    );
    assert!(st.workspace.as_ref().unwrap().projection_hash.is_some());
    // The operator labels the Sandbox itself with its scope, so label queries find it.
    assert_eq!(sbx.labels().get(labels::SCOPE_KEY), st.scope_key.as_ref());
    assert_eq!(
        sbx.labels().get(labels::SCOPE).map(String::as_str),
        Some("session")
    );
    for t in ["PodReady", "WorkspaceReady", "Ready"] {
        let c = st
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("{t} condition"));
        assert_eq!(c.status, "True", "{c:?}");
    }

    let (code, out) = sh(&env, &pod, "cat README.md conf/settings secret/token state/session tools/lint.sh && ./bin/run.sh && stat -c '%a %n' bin/run.sh secret/token README.md").await;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out,
        "hello\na=1\ns3cr3tfreshecho lint\nrun\n755 bin/run.sh\n600 secret/token\n644 README.md\n"
    );

    // The pod carries the scope labels; ids that are no valid label value live in annotations.
    let p = env.api::<Pod>().get(&pod).await.unwrap();
    let l = p.labels();
    assert_eq!(l.get(labels::SCOPE).map(String::as_str), Some("session"));
    assert_eq!(l.get(labels::SCOPE_KEY), st.scope_key.as_ref());
    assert_eq!(l.get(labels::AGENT).map(String::as_str), Some("coder"));
    assert!(!l.contains_key(labels::SESSION));
    assert_eq!(
        p.annotations().get(labels::SESSION_ID).map(String::as_str),
        Some("Session #1 (ünïcode)")
    );
    let spec = p.spec.as_ref().unwrap();
    assert_eq!(spec.automount_service_account_token, Some(false));

    // kubectl shows the useful columns.
    let kubectl = common::kubectl_bin();
    let table = std::process::Command::new(kubectl)
        .args(["get", "sbx", "-n", &env.ns])
        .output()
        .expect("kubectl");
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME", "PHASE", "SCOPE", "MODE", "NODE", "START", "SNAPSHOT", "REASON", "AGE"
        ],
        "{table}"
    );
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..6],
        ["files", "Ready", "Session", "Running", node.as_str(), "D"],
        "{table}"
    );

    // Work done in the workspace survives a pod loss; ephemeral files are re-applied.
    let (code, _) = sh(
        &env,
        &pod,
        "echo mine > notes.txt && echo used > state/session",
    )
    .await;
    assert_eq!(code, Some(0));
    let first_uid = pod_uid(&sbx);
    env.api::<Pod>()
        .delete(&pod, &DeleteParams::default())
        .await
        .unwrap();
    let sbx = wait_ready_in_new_pod(&env, "files", &first_uid).await;
    assert_eq!(branch(&sbx), Some(StartBranch::Reattached));
    assert_eq!(status(&sbx).node_name.as_deref(), Some(node.as_str()));
    let c = status(&sbx)
        .conditions
        .iter()
        .find(|c| c.type_ == "WorkspaceReady")
        .unwrap();
    assert_eq!(c.reason, "WorkspaceReused");
    let (code, out) = sh(&env, &pod, "cat notes.txt state/session README.md").await;
    assert_eq!(code, Some(0));
    assert_eq!(out, "mine\nfreshhello\n");
    let new_pod = env.api::<Pod>().get(&pod).await.unwrap();
    let terms = new_pod
        .spec
        .unwrap()
        .affinity
        .unwrap()
        .node_affinity
        .unwrap()
        .required_during_scheduling_ignored_during_execution
        .unwrap()
        .node_selector_terms;
    assert_eq!(
        terms[0].match_fields.as_ref().unwrap()[0].values,
        Some(vec![node.clone()]),
        "pinned to the workspace's node"
    );

    // A projection is re-applied on the next start only when its content changed.
    let (code, _) = sh(&env, &pod, "echo local-edit > tools/lint.sh").await;
    assert_eq!(code, Some(0));
    let second_uid = pod_uid(&sbx);
    env.api::<Pod>()
        .delete(&pod, &DeleteParams::default())
        .await
        .unwrap();
    let sbx = wait_ready_in_new_pod(&env, "files", &second_uid).await;
    assert_eq!(
        sh(&env, &pod, "cat tools/lint.sh").await.1,
        "local-edit\n",
        "unchanged projection is not re-applied"
    );
    let cm_patch = json!({"data": {"lint.sh": "echo lint v2\n", "fmt.sh": null}});
    cms.patch("tools", &PatchParams::default(), &Patch::Merge(&cm_patch))
        .await
        .unwrap();
    let third_uid = pod_uid(&sbx);
    env.api::<Pod>()
        .delete(&pod, &DeleteParams::default())
        .await
        .unwrap();
    wait_ready_in_new_pod(&env, "files", &third_uid).await;
    let (_, out) = sh(&env, &pod, "cat tools/lint.sh; ls tools").await;
    assert_eq!(
        out, "echo lint v2\nlint.sh\n",
        "changed projection replaces the directory"
    );
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn suspend_deletes_the_pod_keeps_the_workspace_and_resume_reuses_it() {
    let mut env = TestEnv::new("sbx-suspend").await;
    env.start_operator(&[]);
    create_sandbox(&env, "s", json!({
        "image": common::BASE_IMAGE,
        "scope": {"kind": "Agent", "agent": "planner"},
        "workspace": {"root": "/home/agent/work", "files": [{"path": "plan.md", "content": "v1\n"}]}
    }))
    .await
    .unwrap();
    let sbx = env.wait_for::<Sandbox>("s", 120, phase_is("Ready")).await;
    let pod = status(&sbx).pod_name.clone().unwrap();
    assert_eq!(
        sh(&env, &pod, "pwd; echo edit >> plan.md").await.1,
        "/home/agent/work\n"
    );
    let dir = workspace_dir(&env, &sbx);
    // A cold start's directory is the derived one: not recorded, found by the placement.
    assert_eq!(
        status(&sbx)
            .workspace
            .as_ref()
            .and_then(|w| w.host_dir.clone()),
        None
    );
    let recorded = |s: &Sandbox| {
        Some(agentbox_operator::controller::placement::host_dir(
            s,
            common::NODE_ROOT,
        ))
    };
    assert_eq!(
        recorded(&sbx).as_deref(),
        Some(dir.as_str()),
        "the placement names the directory"
    );

    merge(
        &env,
        "s",
        json!({"spec": {"lifecycle": {"mode": "Suspended"}}}),
    )
    .await;
    let suspended = env
        .wait_for::<Sandbox>("s", 60, phase_is("Suspended"))
        .await;
    assert_eq!(
        recorded(&suspended).as_deref(),
        Some(dir.as_str()),
        "kept while suspended"
    );
    env.wait_gone::<Pod>(&pod, 60).await;
    assert!(env.sandbox_pods("s").await.is_empty());
    assert_eq!(
        std::fs::read_to_string(format!("{dir}/plan.md")).unwrap(),
        "v1\nedit\n",
        "workspace kept on the node"
    );

    merge(
        &env,
        "s",
        json!({"spec": {"lifecycle": {"mode": "Running"}}}),
    )
    .await;
    let sbx = wait_ready_in_new_pod(&env, "s", &pod_uid(&sbx)).await;
    assert_eq!(branch(&sbx), Some(StartBranch::Reattached));
    assert_eq!(recorded(&sbx).as_deref(), Some(dir.as_str()));
    assert_eq!(sh(&env, &pod, "cat plan.md").await.1, "v1\nedit\n");
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn deleting_a_sandbox_leaves_no_pod_policy_or_workspace() {
    let mut env = TestEnv::new("sbx-delete").await;
    env.start_operator(&[]);
    let spec = |path: &str, content: &str| {
        json!({
            "image": common::BASE_IMAGE,
            "scope": {"kind": "Global"},
            "network": {"egress": "None"},
            "workspace": {"files": [{"path": path, "content": content}]}
        })
    };
    create_sandbox(&env, "d", spec("f", "x")).await.unwrap();
    let sbx = env.wait_for::<Sandbox>("d", 120, phase_is("Ready")).await;
    let dir = workspace_dir(&env, &sbx);
    assert!(std::path::Path::new(&dir).join("f").exists());
    let policies = env
        .api::<NetworkPolicy>()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(policies.len(), 1);
    let np = policies[0].spec.as_ref().unwrap();
    assert_eq!(np.policy_types, Some(vec!["Egress".to_string()]));
    assert!(
        np.egress.as_ref().is_none_or(Vec::is_empty),
        "no egress rule: all egress denied"
    );

    // A harness used the scope's guard and released it: the idle Lease goes with the sandbox.
    let guard = agentbox_api::guard::acquire_scope(
        env.client.clone(),
        &env.ns,
        &sbx.spec.scope,
        &agentbox_api::guard::GuardConfig::default(),
        Some(Duration::from_secs(10)),
    )
    .await
    .expect("guard");
    // The sandbox shows who holds its scope's guard, and when it is free again.
    let holder = guard.holder().to_string();
    let guarded = |want: bool| {
        move |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
                st.conditions
                    .iter()
                    .any(|c| c.type_ == "Guarded" && (c.status == "True") == want)
            })
        }
    };
    let sbx = env.wait_for::<Sandbox>("d", 30, guarded(true)).await;
    assert_eq!(
        status(&sbx).guard.as_ref().and_then(|g| g.holder.clone()),
        Some(holder)
    );
    guard.release().await.expect("release");
    let sbx = env.wait_for::<Sandbox>("d", 30, guarded(false)).await;
    assert!(status(&sbx).guard.is_none());
    let lease_name = labels::lease_name(&labels::scope_key(&sbx.spec.scope));
    assert!(
        env.api::<Lease>()
            .get_opt(&lease_name)
            .await
            .unwrap()
            .is_some()
    );

    env.api::<Sandbox>()
        .delete("d", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone::<Sandbox>("d", 120).await;
    // A harness makes a sandbox of the same name again at once, while the old one's pod (of the
    // same name) is still stopping and its directory still on the node: the new one gets a
    // pod and a workspace of its own, and nothing of the old one's.
    create_sandbox(&env, "d", spec("g", "y")).await.unwrap();
    let again = env.wait_for::<Sandbox>("d", 120, phase_is("Ready")).await;
    assert_ne!(again.uid(), sbx.uid());
    let again_dir = workspace_dir(&env, &again);
    assert_ne!(again_dir, dir);
    let pod = status(&again).pod_name.clone().unwrap();
    assert_eq!(sh(&env, &pod, "cat g; ls").await.1, "yg\n");
    // The old directory goes all the same (the sweep's hint), the new one stays.
    common::wait_removed(&env, &dir, 60).await;
    assert!(std::path::Path::new(&again_dir).join("g").exists());
    env.api::<Sandbox>()
        .delete("d", &DeleteParams::default())
        .await
        .unwrap();
    env.wait_gone::<Sandbox>("d", 120).await;
    // The object goes first; its pod, the sweep's helper pods and the directory follow.
    common::wait_no_pods(&env, 60).await;
    common::wait_removed(&env, &again_dir, 60).await;
    assert!(
        env.api::<NetworkPolicy>()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no policy left"
    );
    assert!(
        env.api::<Lease>()
            .get_opt(&lease_name)
            .await
            .unwrap()
            .is_none(),
        "idle guard lease removed"
    );
    env.finish().await;
}

/// A harness on the plain API (no agentbox code) takes the scope's guard by its documented
/// name, labelled with nothing but the scope key (issue 42): the Sandbox's `Guarded`
/// condition shows that holder within seconds, and shows the guard free once it lets go.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_guard_lease_made_on_the_plain_api_shows_its_holder() {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let mut env = TestEnv::new("sbx-guard3p").await;
    env.start_operator(&[]);
    let scope = json!({"kind": "User", "agent": "ext", "user": "u1"});
    create_sandbox(
        &env,
        "g",
        json!({"image": common::BASE_IMAGE, "scope": scope}),
    )
    .await
    .unwrap();
    let sbx = env.wait_for::<Sandbox>("g", 120, phase_is("Ready")).await;
    let key = labels::scope_key(&sbx.spec.scope);
    let name = labels::lease_name(&key);
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            labels: Some([(labels::SCOPE_KEY.to_string(), key.clone())].into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("third-party-harness".into()),
            lease_duration_seconds: Some(60),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            lease_transitions: Some(0),
            ..Default::default()
        }),
    };
    let leases = env.api::<Lease>();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let held_by = |holder: Option<&'static str>| {
        move |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
                let cond = st
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Guarded" && (c.status == "True") == holder.is_some());
                cond && st.guard.as_ref().and_then(|g| g.holder.as_deref()) == holder
            })
        }
    };
    let t0 = std::time::Instant::now();
    env.wait_for::<Sandbox>("g", 10, held_by(Some("third-party-harness")))
        .await;
    eprintln!(
        "[guard] a third-party holder shown after {:?}",
        t0.elapsed()
    );
    // It lets go (clears the holder, as the protocol's release does): free again.
    let mut released = leases.get(&name).await.unwrap();
    if let Some(spec) = released.spec.as_mut() {
        spec.holder_identity = None;
    }
    leases
        .replace(&name, &PostParams::default(), &released)
        .await
        .unwrap();
    env.wait_for::<Sandbox>("g", 10, held_by(None)).await;
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn invalid_specs_are_refused_with_clear_messages_and_get_no_pod() {
    let mut env = TestEnv::new("sbx-invalid").await;
    env.start_operator(&[]);
    let base = || json!({"image": common::BASE_IMAGE, "scope": {"kind": "User", "agent": "a", "user": "u"}});
    let with = |patch: serde_json::Value| {
        let mut b = base();
        json_merge(&mut b, patch);
        b
    };
    let cases = [
        (
            with(json!({"scope": {"kind": "Session", "agent": "a", "user": null}})),
            "scope.session is required",
        ),
        (
            with(json!({"scope": {"kind": "User", "agent": null, "user": "u"}})),
            "scope.agent is required",
        ),
        (
            with(json!({"scope": {"kind": "Global", "agent": "x", "user": null}})),
            "a Global scope takes no ids",
        ),
        (
            with(json!({"workspace": {"root": "workspace"}})),
            "workspace.root must be an absolute path",
        ),
        (
            with(json!({"workspace": {"files": [{"path": "../escape", "content": "x"}]}})),
            "must not contain '..'",
        ),
        (
            with(json!({"workspace": {"files": [{"path": "/etc/passwd", "content": "x"}]}})),
            "relative to the workspace root",
        ),
        (
            with(
                json!({"workspace": {"files": [{"path": "a", "content": "x", "contentFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}}),
            ),
            "exactly one of content and contentFrom",
        ),
        (
            with(json!({"workspace": {"files": [{"path": ".agentbox/marker", "content": "x"}]}})),
            ".agentbox is reserved",
        ),
        (
            with(json!({"workspace": {"mounts": [{"path": "data", "hostPath": "relative/path"}]}})),
            "hostPath must be absolute",
        ),
        (
            with(json!({"snapshot": {"restore": "Named"}})),
            "snapshot.name is required",
        ),
        (with(json!({"image": ""})), "spec.image"),
        (
            with(json!({"workspace": {"files": [{"path": "a", "content": "x", "mode": 4095}]}})),
            "spec.workspace.files[0].mode",
        ),
    ];
    for (i, (spec, expected)) in cases.iter().enumerate() {
        match create_sandbox(&env, &format!("bad-{i}"), spec.clone()).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422, "case {i}: {s:?}");
                assert!(
                    s.message.contains(expected),
                    "case {i}: {:?} does not mention {expected:?}",
                    s.message
                );
            }
            other => panic!("case {i} ({expected}) was accepted: {other:?}"),
        }
    }

    // Scope is immutable.
    create_sandbox(&env, "ok", base()).await.unwrap();
    let change = json!({"spec": {"scope": {"user": "someone-else"}}});
    match env
        .api::<Sandbox>()
        .patch("ok", &PatchParams::default(), &Patch::Merge(&change))
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 422);
            assert!(s.message.contains("scope is immutable"), "{}", s.message);
        }
        other => panic!("scope change accepted: {other:?}"),
    }

    // A host mount outside the operator's allowed prefixes passes admission (the CRD cannot know
    // the operator's configuration) and is refused by the operator: condition, Event, no pod.
    create_sandbox(
        &env,
        "mount",
        with(json!({"workspace": {"mounts": [{"path": "data", "hostPath": "/etc"}]}})),
    )
    .await
    .unwrap();
    let sbx = env
        .wait_for::<Sandbox>("mount", 60, phase_is("Failed"))
        .await;
    let ready = status(&sbx)
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, "InvalidSpec");
    assert!(
        ready.message.contains("\"/etc\" is not allowed"),
        "{}",
        ready.message
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    let evs = events.list(&ListParams::default()).await.unwrap().items;
    assert!(
        evs.iter()
            .any(|e| e.reason.as_deref() == Some("InvalidSpec")
                && e.type_.as_deref() == Some("Warning")),
        "{evs:?}"
    );
    env.wait_for::<Sandbox>("ok", 120, phase_is("Ready")).await;

    // A file whose ConfigMap does not exist: the pod runs, the workspace is not initialised,
    // and the condition names what is missing.
    let missing = json!({"workspace": {"files": [{"path": "cfg", "contentFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}]}});
    create_sandbox(&env, "nocm", with(missing)).await.unwrap();
    let sbx = wait_condition(&env, "nocm", "WorkspaceReady", "False", "SourceMissing").await;
    let message = condition_message(&sbx, "WorkspaceReady");
    assert!(message.contains("ConfigMap absent not found"), "{message}");
    assert_ne!(status(&sbx).phase, Some(SandboxPhase::Ready));
    assert!(
        env.sandbox_pods("mount").await.is_empty(),
        "no pod for the refused spec"
    );
    for i in 0..cases.len() {
        assert!(env.sandbox_pods(&format!("bad-{i}")).await.is_empty());
    }
    env.finish().await;
}

fn json_merge(base: &mut serde_json::Value, patch: serde_json::Value) {
    match (base, patch) {
        (serde_json::Value::Object(b), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    b.remove(&k);
                } else {
                    json_merge(b.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        (b, p) => *b = p,
    }
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn shutdown_time_deletes_the_sandbox_and_spec_changes_replace_the_pod() {
    let mut env = TestEnv::new("sbx-shutdown").await;
    env.start_operator(&[]);
    create_sandbox(
        &env,
        "t",
        json!({"image": common::BASE_IMAGE, "scope": {"kind": "Agent", "agent": "a"},
        "workspace": {"files": [{"path": "keep", "content": "1"}]}}),
    )
    .await
    .unwrap();
    let sbx = env.wait_for::<Sandbox>("t", 120, phase_is("Ready")).await;
    let pod = status(&sbx).pod_name.clone().unwrap();
    sh(&env, &pod, "echo work > work.txt").await;
    // Changing the environment needs a new pod; the workspace stays (branch A).
    merge(
        &env,
        "t",
        json!({"spec": {"env": [{"name": "MODE", "value": "two"}]}}),
    )
    .await;
    let sbx = wait_ready_in_new_pod(&env, "t", &pod_uid(&sbx)).await;
    assert_eq!(branch(&sbx), Some(StartBranch::Reattached));
    assert_eq!(
        sh(&env, &pod, "echo $MODE; cat work.txt").await.1,
        "two\nwork\n"
    );
    assert_eq!(status(&sbx).observed_generation, sbx.metadata.generation);

    let at = k8s_openapi::jiff::Timestamp::now() + k8s_openapi::jiff::SignedDuration::from_secs(3);
    merge(
        &env,
        "t",
        json!({"spec": {"lifecycle": {"shutdownTime": at.to_string()}}}),
    )
    .await;
    env.wait_gone::<Sandbox>("t", 60).await;
    // Its pod follows the object (asked to go, not waited for).
    common::wait_no_pods(&env, 60).await;
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn two_replicas_only_the_leader_reconciles_and_the_other_takes_over() {
    let mut env = TestEnv::new("sbx-leader").await;
    let a = env.start_operator(&[]);
    // Let the first replica win deterministically.
    let leases = env.api::<Lease>();
    let lease = "agentbox-operator-leader";
    let holder = |l: Option<&Lease>| {
        l.and_then(|l| l.spec.as_ref())
            .and_then(|s| s.holder_identity.clone())
    };
    for _ in 0..100 {
        if holder(leases.get_opt(lease).await.unwrap().as_ref()).is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = env.start_operator(&[]);
    let leader_id = holder(leases.get_opt(lease).await.unwrap().as_ref()).expect("a leader");
    assert_eq!(leader_id, env.operators[a].identity);

    create_sandbox(
        &env,
        "x",
        json!({"image": common::BASE_IMAGE, "scope": {"kind": "Global"}}),
    )
    .await
    .unwrap();
    env.wait_for::<Sandbox>("x", 120, phase_is("Ready")).await;
    let metric = |text: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with("agentbox_reconciles_total{controller=\"sandbox\"}"))
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let (code, ra) = env.operators[a]
        .get("/metrics")
        .await
        .expect("leader metrics");
    assert_eq!(code, 200);
    let (_, rb) = env.operators[b]
        .get("/metrics")
        .await
        .expect("follower metrics");
    assert!(metric(&ra) > 0.0, "leader reconciled:\n{ra}");
    assert_eq!(metric(&rb), 0.0, "the follower must not reconcile:\n{rb}");
    assert!(rb.contains("agentbox_leader 0"), "{rb}");
    assert_eq!(
        env.operators[b].get("/readyz").await.map(|r| r.0),
        Some(200),
        "a standby is ready"
    );
    // Every write to the sandbox came from one field manager and the Events from the leader.
    let events: Api<k8s_openapi::api::events::v1::Event> = env.api();
    let evs = events.list(&ListParams::default()).await.unwrap().items;
    let ours: Vec<_> = evs
        .iter()
        .filter(|e| e.reporting_controller.as_deref() == Some("agentbox-operator"))
        .collect();
    assert!(!ours.is_empty());
    assert!(
        ours.iter()
            .all(|e| e.reporting_instance.as_deref() == Some(leader_id.as_str())),
        "{ours:?}"
    );

    // The leader dies without releasing: the other takes over after the lease expires.
    env.operators[a].kill();
    let new_leader = env.operators[b].identity.clone();
    for _ in 0..300 {
        if holder(leases.get_opt(lease).await.unwrap().as_ref()).as_deref()
            == Some(new_leader.as_str())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        holder(leases.get_opt(lease).await.unwrap().as_ref()),
        Some(new_leader)
    );
    create_sandbox(
        &env,
        "y",
        json!({"image": common::BASE_IMAGE, "scope": {"kind": "Agent", "agent": "b"}}),
    )
    .await
    .unwrap();
    env.wait_for::<Sandbox>("y", 120, phase_is("Ready")).await;
    let (_, rb) = env.operators[b]
        .get("/metrics")
        .await
        .expect("new leader metrics");
    assert!(
        metric(&rb) > 0.0 && rb.contains("agentbox_leader 1"),
        "{rb}"
    );
    env.finish().await;
}
