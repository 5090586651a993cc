//! SandboxPools against the real local cluster: a pool keeps N warm pods of its template
//! Running and initialised, each with an empty workspace directory of its own on the node and
//! no scope anything; `kubectl scale` resizes it both ways; a deleted warm pod is refilled; a
//! template change replaces warm pods under Recreate and keeps them under OnDelete; a missing
//! template is a condition and an Event; deleting a pool removes its warm pods and their
//! directories and leaves a claimed pod alone; a restarted operator makes no extra pods; bad
//! pools are refused at admission; the namespace's directory is root-only before any warm pod
//! is ready to be claimed.

mod common;

use std::time::Duration;

use agentbox_api::crd::{SandboxPool, SandboxTemplate};
use agentbox_api::labels;
use common::pools::{
    create_pool, create_template, entries, host_dir, names, pool_json, wait_claimable, wait_ready,
    warm_pods,
};
use common::{NODE_ROOT, TestEnv, kubectl};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// Operator flags of these tests: a short sweep interval, so the periodic pass is seen too.
const SWEEP_FAST: [&str; 2] = ["--sweep-interval-seconds", "3"];

async fn scale(env: &TestEnv, pool: &str, n: u32) {
    let (ok, out, err) = kubectl(
        &[
            "scale",
            "-n",
            &env.ns,
            &format!("sandboxpool/{pool}"),
            &format!("--replicas={n}"),
        ],
        "",
    );
    assert!(ok, "kubectl scale: {out}{err}");
}

/// A warm pod of a ready pool, as the contract with the claim describes it.
fn assert_warm_pod(env: &TestEnv, pool: &SandboxPool, p: &Pod) {
    let name = p.name_any();
    let suffix = name
        .strip_prefix(&format!("{}-warm-", pool.name_any()))
        .expect("named <pool>-warm-<suffix>");
    assert_eq!(suffix.len(), labels::WARM_SUFFIX_LEN);
    // The template label puts a warm pod under its template's egress policy before a claim.
    let template = labels::template_label_value(&pool.spec.template_ref.name);
    let want: std::collections::BTreeMap<String, String> = [
        (labels::MANAGED_BY, labels::MANAGER),
        (labels::POOL, pool.name_any().as_str()),
        (labels::TEMPLATE, template.as_str()),
        (labels::WARM, "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(p.labels(), &want, "{name}: no scope labels");
    assert!(
        !p.annotations()
            .keys()
            .any(|k| k.ends_with("-id") || k.contains("scope")),
        "{name}: no scope annotations: {:?}",
        p.annotations()
    );
    let owner = p
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .expect("a controller owner");
    assert_eq!(
        (owner.kind.as_str(), Some(&owner.uid)),
        ("SandboxPool", pool.metadata.uid.as_ref())
    );
    assert_eq!(owner.block_owner_deletion, Some(true));
    let dir = host_dir(p);
    assert_eq!(dir, format!("{NODE_ROOT}/{}/warm-{suffix}", env.ns));
    assert_eq!(
        p.annotations().get(labels::WARM_READY).map(String::as_str),
        Some("true")
    );
    assert_eq!(
        p.annotations().get(labels::WARM_MARKED).map(String::as_str),
        Some("true")
    );
    assert!(
        agentbox_operator::controller::pool::is_claimable(p),
        "{name}"
    );
    // Its directory on the node: empty but for the state directory, whose marker is the
    // pool's, naming no sandbox.
    assert_eq!(entries(&dir), vec![".agentbox".to_string()], "{dir}");
    assert_eq!(
        entries(&format!("{dir}/.agentbox")),
        vec!["marker".to_string(), "tmp".to_string()]
    );
    assert_eq!(
        std::fs::read_to_string(format!("{dir}/{}", agentbox_api::remote::MARKER)).ok(),
        Some(agentbox_api::remote::WARM_MARKER.to_string())
    );
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_pool_keeps_ready_warm_pods_with_empty_directories_and_scales_both_ways() {
    let mut env = TestEnv::new("pool-scale").await;
    env.start_operator(&SWEEP_FAST);
    create_template(&env, "agent", "a").await;
    create_pool(&env, "py", "agent", 2, "Recreate")
        .await
        .expect("create pool");
    let pool = wait_ready(&env, "py", 2).await;
    // Before any claim, the namespace's directory was made root-only (the operator's prepare
    // helper ran before the pods were initialised), and that helper pod is gone.
    let ns_dir = format!("{NODE_ROOT}/{}", env.ns);
    let meta = std::fs::metadata(&ns_dir).expect("the namespace's directory is on the node");
    assert_eq!(
        (
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            std::os::unix::fs::MetadataExt::uid(&meta)
        ),
        (0o700, 0),
        "{ns_dir}"
    );
    let helpers: kube::Api<Pod> = kube::Api::namespaced(env.client.clone(), &env.ns);
    let prepare_pods = ListParams::default().labels(&format!(
        "{}=prepare",
        agentbox_operator::controller::helper_pod::HELPER_LABEL
    ));
    let mut left = Vec::new();
    for _ in 0..100 {
        left = helpers.list(&prepare_pods).await.unwrap().items;
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(left.is_empty(), "prepare pods left: {:?}", names(&left));
    let st = pool.status.clone().expect("status");
    assert_eq!(
        st.selector.as_deref(),
        Some("agentbox.dev/pool=py,agentbox.dev/warm=true")
    );
    assert_eq!(st.template_generation, Some(1));
    let pods = warm_pods(&env, "py").await;
    assert_eq!(pods.len(), 2);
    for p in &pods {
        assert_warm_pod(&env, &pool, p);
    }
    let shape = pods[0].annotations()[labels::POD_SHAPE_HASH].clone();
    assert!(
        pods.iter()
            .all(|p| p.annotations()[labels::POD_SHAPE_HASH] == shape)
    );
    // The warm container answers exec with the template's env, in its workspace.
    let (code, out) = common::sh(&env, &pods[0].name_any(), "echo \"$MODE\"; pwd; ls -A").await;
    assert_eq!(code, Some(0));
    assert_eq!(out, "a\n/workspace\n.agentbox\n");

    // kubectl scale, up and down (through the /scale subresource).
    scale(&env, "py", 3).await;
    wait_ready(&env, "py", 3).await;
    let three = warm_pods(&env, "py").await;
    assert_eq!(three.len(), 3);
    assert!(names(&pods).is_subset(&names(&three)), "the first two kept");
    scale(&env, "py", 1).await;
    wait_ready(&env, "py", 1).await;
    let one = warm_pods(&env, "py").await;
    assert_eq!(one.len(), 1);
    for gone in three.iter().filter(|p| p.name_any() != one[0].name_any()) {
        env.wait_gone::<Pod>(&gone.name_any(), 60).await;
        common::wait_removed(&env, &host_dir(gone), 60).await;
    }
    // kubectl get shows it.
    let (ok, out, err) = kubectl(&["get", "sbxpool", "-n", &env.ns, "py"], "");
    assert!(ok, "{err}");
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME", "TEMPLATE", "DESIRED", "CURRENT", "READY", "REASON", "AGE"
        ]
    );
    let row: Vec<&str> = out
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(&row[..6], ["py", "agent", "1", "1", "1", "Ready"]);
    // So do the CLI and the Rust client.
    let (code, out, err) = common::cli(&env, &["pools"]);
    assert_eq!(code, Some(0), "{err}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["NAME", "TEMPLATE", "DESIRED", "READY", "REASON", "AGE"]
    );
    assert_eq!(&rows[1][..5], ["py", "agent", "1", "1", "Ready"]);
    let listed = agentbox_client::client::Sandboxes::new(env.client.clone(), env.ns.clone())
        .pools()
        .await
        .expect("pools()");
    assert_eq!(
        listed.iter().map(|p| p.name_any()).collect::<Vec<_>>(),
        ["py"]
    );
    // And the operator's metrics, from the pool's status.
    let want = [
        format!(
            "agentbox_pool_replicas{{namespace=\"{}\",pool=\"py\"}} 1",
            env.ns
        ),
        format!(
            "agentbox_pool_ready{{namespace=\"{}\",pool=\"py\"}} 1",
            env.ns
        ),
    ];
    let mut body = String::new();
    for _ in 0..100 {
        body = env.operators[0]
            .get("/metrics")
            .await
            .map(|(_, b)| b)
            .unwrap_or_default();
        if want.iter().all(|w| body.lines().any(|l| l == w)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for w in &want {
        assert!(body.lines().any(|l| l == w), "no {w} in:\n{body}");
    }
    assert!(env.counter(0, "agentbox_pool_pods_created_total").await >= 3.0);
    assert!(env.counter(0, "agentbox_pool_pods_deleted_total").await >= 2.0);
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_deleted_warm_pod_is_refilled_and_its_directory_removed() {
    let mut env = TestEnv::new("pool-refill").await;
    env.start_operator(&SWEEP_FAST);
    create_template(&env, "agent", "a").await;
    create_pool(&env, "py", "agent", 2, "Recreate")
        .await
        .expect("create pool");
    wait_ready(&env, "py", 2).await;
    let before = warm_pods(&env, "py").await;
    let victim = before[0].clone();
    env.api::<Pod>()
        .delete(&victim.name_any(), &DeleteParams::default())
        .await
        .expect("delete a warm pod");
    env.wait_gone::<Pod>(&victim.name_any(), 60).await;
    let after = wait_claimable(&env, "py", 2, &[victim.name_any()]).await;
    let pool = wait_ready(&env, "py", 2).await;
    assert_eq!(after.len(), 2);
    assert!(!names(&after).contains(&victim.name_any()));
    assert!(names(&after).contains(&before[1].name_any()));
    for p in &after {
        assert_warm_pod(&env, &pool, p);
    }
    common::wait_removed(&env, &host_dir(&victim), 60).await;
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_template_change_replaces_warm_pods_under_recreate_and_keeps_them_under_on_delete() {
    let mut env = TestEnv::new("pool-update").await;
    env.start_operator(&SWEEP_FAST);
    create_template(&env, "agent", "a").await;
    create_pool(&env, "re", "agent", 1, "Recreate")
        .await
        .expect("create pool re");
    create_pool(&env, "keep", "agent", 1, "OnDelete")
        .await
        .expect("create pool keep");
    wait_ready(&env, "re", 1).await;
    wait_ready(&env, "keep", 1).await;
    let re_before = warm_pods(&env, "re").await;
    let keep_before = warm_pods(&env, "keep").await;

    env.api::<SandboxTemplate>()
        .patch(
            "agent",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"env": [{"name": "MODE", "value": "b"}]}})),
        )
        .await
        .expect("edit template");

    // Recreate: the old pod goes, a new one of the new shape takes its place.
    let old = re_before[0].name_any();
    env.wait_gone::<Pod>(&old, 60).await;
    let pool = env
        .wait_for::<SandboxPool>("re", 120, |p: Option<&SandboxPool>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.template_generation == Some(2) && s.ready_replicas == 1)
        })
        .await;
    let re_after = wait_claimable(&env, "re", 1, std::slice::from_ref(&old)).await;
    assert_ne!(re_after[0].name_any(), old);
    assert_ne!(
        re_after[0].annotations()[labels::POD_SHAPE_HASH],
        re_before[0].annotations()[labels::POD_SHAPE_HASH]
    );
    assert_eq!(re_after[0].annotations()[labels::TEMPLATE_GENERATION], "2");
    assert_warm_pod(&env, &pool, &re_after[0]);
    let (_, out) = common::sh(&env, &re_after[0].name_any(), "echo \"$MODE\"").await;
    assert_eq!(out, "b\n");
    common::wait_removed(&env, &host_dir(&re_before[0]), 60).await;

    // OnDelete: the old pod stays, and the pool says it is out of date.
    let keep = env
        .wait_for::<SandboxPool>("keep", 60, |p: Option<&SandboxPool>| {
            p.and_then(|p| p.status.as_ref()).is_some_and(|s| {
                s.template_generation == Some(2)
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.reason == "Updating")
            })
        })
        .await;
    assert_eq!(keep.status.as_ref().map(|s| s.replicas), Some(1));
    assert_eq!(names(&warm_pods(&env, "keep").await), names(&keep_before));
    // Deleted by hand, it comes back in the new shape.
    env.api::<Pod>()
        .delete(&keep_before[0].name_any(), &DeleteParams::default())
        .await
        .expect("delete the old pod");
    let keep_after = wait_claimable(&env, "keep", 1, &[keep_before[0].name_any()]).await;
    wait_ready(&env, "keep", 1).await;
    assert_eq!(
        keep_after[0].annotations()[labels::POD_SHAPE_HASH],
        re_after[0].annotations()[labels::POD_SHAPE_HASH]
    );
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_missing_template_is_a_condition_and_an_event_and_makes_no_pods() {
    let mut env = TestEnv::new("pool-missing").await;
    env.start_operator(&SWEEP_FAST);
    create_pool(&env, "py", "later", 2, "Recreate")
        .await
        .expect("create pool");
    let pool = env
        .wait_for::<SandboxPool>("py", 60, |p: Option<&SandboxPool>| {
            p.and_then(|p| p.status.as_ref()).is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "TemplateNotFound" && c.status == "True")
            })
        })
        .await;
    let ready = pool
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .cloned()
        .expect("Ready condition");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "TemplateNotFound")
    );
    assert!(
        ready.message.contains("SandboxTemplate later not found"),
        "{}",
        ready.message
    );
    let events = common::events(&env, "py", "TemplateNotFound").await;
    assert_eq!(events.len(), 1, "one Event, on the transition: {events:?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert!(warm_pods(&env, "py").await.is_empty());
    // The template appears: the pool fills.
    create_template(&env, "later", "a").await;
    wait_ready(&env, "py", 2).await;
    let pool = env.api::<SandboxPool>().get("py").await.expect("pool");
    assert!(pool.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "TemplateNotFound" && c.status == "False")
    }));
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn deleting_a_pool_removes_its_warm_pods_and_directories_but_not_a_claimed_pod() {
    let mut env = TestEnv::new("pool-delete").await;
    env.start_operator(&SWEEP_FAST);
    create_template(&env, "agent", "a").await;
    create_pool(&env, "py", "agent", 2, "Recreate")
        .await
        .expect("create pool");
    wait_ready(&env, "py", 2).await;
    let pods = warm_pods(&env, "py").await;
    let (claimed, warm) = (pods[0].clone(), pods[1].clone());

    // A claim, as the claiming Sandbox would make it: another controller owner, no warm label
    // (the pool label stays), conditioned on the pod's resourceVersion. The owner here is a
    // ConfigMap standing in for the Sandbox.
    let mut owner = ConfigMap::default();
    owner.metadata.name = Some("claimer".into());
    let owner = env
        .api::<ConfigMap>()
        .create(&PostParams::default(), &owner)
        .await
        .expect("owner");
    let claim = json!({
        "metadata": {
            "resourceVersion": claimed.metadata.resource_version,
            "labels": {labels::WARM: null},
            "annotations": {labels::WARM_READY: null},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "ConfigMap", "name": "claimer",
                "uid": owner.metadata.uid, "controller": true,
            }],
        }
    });
    env.api::<Pod>()
        .patch(
            &claimed.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&claim),
        )
        .await
        .expect("claim");
    // The pool refills: two warm pods again, the claimed one not among them.
    let refilled = wait_claimable(&env, "py", 2, &[claimed.name_any()]).await;
    assert!(!names(&refilled).contains(&claimed.name_any()));
    assert!(names(&refilled).contains(&warm.name_any()));

    env.api::<SandboxPool>()
        .delete("py", &DeleteParams::default())
        .await
        .expect("delete pool");
    env.wait_gone::<SandboxPool>("py", 60).await;
    for p in &refilled {
        env.wait_gone::<Pod>(&p.name_any(), 60).await;
        common::wait_removed(&env, &host_dir(p), 60).await;
    }
    // The claimed pod is untouched: still running, its directory still there.
    let still = env
        .api::<Pod>()
        .get(&claimed.name_any())
        .await
        .expect("the claimed pod");
    assert!(still.metadata.deletion_timestamp.is_none());
    assert_eq!(still.uid(), claimed.uid());
    assert_eq!(
        still.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );
    assert!(std::path::Path::new(&host_dir(&claimed)).is_dir());
    let (code, _) = common::sh(&env, &claimed.name_any(), "true").await;
    assert_eq!(code, Some(0));

    // Once nothing mounts it, the periodic sweep takes its directory too (no hint: it was
    // not a warm pod any more when it went).
    env.api::<ConfigMap>()
        .delete("claimer", &DeleteParams::default())
        .await
        .expect("delete the owner");
    env.wait_gone::<Pod>(&claimed.name_any(), 120).await;
    common::wait_removed(&env, &host_dir(&claimed), 60).await;
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_restarted_operator_makes_no_extra_pods() {
    let mut env = TestEnv::new("pool-restart").await;
    env.start_operator(&SWEEP_FAST);
    create_template(&env, "agent", "a").await;
    create_pool(&env, "py", "agent", 3, "Recreate")
        .await
        .expect("create pool");
    wait_ready(&env, "py", 3).await;
    let before = names(&warm_pods(&env, "py").await);
    env.operators[0].kill();
    let op = env.start_operator(&SWEEP_FAST);
    // Wait until the new leader has reconciled the pool (its first reconcile ran to the end).
    let mut reconciled = 0.0;
    for _ in 0..600 {
        if let Some((_, body)) = env.operators[op].get("/metrics").await {
            reconciled = body
                .lines()
                .find_map(|l| l.strip_prefix("agentbox_reconciles_total{controller=\"pool\"} "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0.0);
        }
        if reconciled >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        reconciled >= 1.0,
        "the new operator reconciled the pool\n{}",
        env.operator_logs()
    );
    assert_eq!(
        env.counter(op, "agentbox_pool_pods_created_total").await,
        0.0
    );
    assert_eq!(
        env.counter(op, "agentbox_pool_pods_deleted_total").await,
        0.0
    );
    assert_eq!(names(&warm_pods(&env, "py").await), before);
    let all = env
        .api::<Pod>()
        .list(&ListParams::default().labels(labels::POOL))
        .await
        .expect("pods")
        .items;
    assert_eq!(all.len(), 3, "{:?}", names(&all));
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn bad_pools_are_refused_at_admission_with_a_clear_message() {
    let env = TestEnv::new("pool-admission").await;
    for (bad, says) in [
        (pool_json("neg", "agent", -1, "Recreate"), "spec.replicas"),
        (pool_json("big", "agent", 101, "Recreate"), "spec.replicas"),
        (
            pool_json("odd", "agent", 1, "Rolling"),
            "spec.updateStrategy",
        ),
        (
            pool_json("badref", "../x", 1, "Recreate"),
            "spec.templateRef.name",
        ),
        (
            json!({"apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxPool",
                   "metadata": {"name": "noref"}, "spec": {"replicas": 1}}),
            "spec.templateRef",
        ),
    ] {
        let (ok, out, err) = kubectl(&["apply", "-n", &env.ns, "-f", "-"], &bad.to_string());
        assert!(!ok, "accepted: {bad}\n{out}");
        assert!(err.contains(says), "{bad}: {err}");
    }
    let (ok, _, err) = kubectl(
        &["apply", "-n", &env.ns, "-f", "-"],
        &pool_json("ok", "agent", 0, "OnDelete").to_string(),
    );
    assert!(ok, "{err}");
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_non_root_templates_warm_pods_own_their_workspace_as_a_cold_start_would() {
    use std::os::unix::fs::MetadataExt;
    let mut env = TestEnv::new("pool-nonroot").await;
    env.start_operator(&SWEEP_FAST);
    let t: SandboxTemplate = serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxTemplate",
        "metadata": {"name": "plain"},
        "spec": {
            "image": common::BASE_IMAGE,
            "imagePullPolicy": "Never",
            "securityContext": {"runAsNonRoot": true},
        }
    }))
    .expect("template json");
    env.api::<SandboxTemplate>()
        .create(&PostParams::default(), &t)
        .await
        .expect("create template");
    create_pool(&env, "nr", "plain", 1, "Recreate")
        .await
        .expect("create pool");
    let pool = wait_ready(&env, "nr", 1).await;
    let pods = wait_claimable(&env, "nr", 1, &[]).await;
    let p = &pods[0];
    assert_warm_pod(&env, &pool, p);
    let spec = p.spec.as_ref().expect("pod spec");
    let init = spec.init_containers.as_ref().expect("an init container");
    assert_eq!(
        init[0].name,
        agentbox_operator::controller::pod::OWN_CONTAINER
    );
    // The workspace and the state directory the warm init made are the sandbox user's.
    let dir = host_dir(p);
    for d in [dir.clone(), format!("{dir}/.agentbox/tmp")] {
        let m = std::fs::metadata(&d).expect("on the node");
        assert_eq!((m.uid(), m.gid()), (65532, 65532), "{d}");
    }
    let (code, out) = common::sh(&env, &p.name_any(), "id -u; touch probe && rm probe").await;
    assert_eq!((code, out.as_str()), (Some(0), "65532\n"));
    env.finish().await;
}
