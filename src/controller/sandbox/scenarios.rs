//! The sandbox controller's scenarios: its reconciles against the fake API server
//! ([`crate::test_support`]), each asserting what a transition writes, in which order.

use std::sync::Arc;

use kube::runtime::controller::Action;
use serde_json::{Value, json};

use crate::controller::context::Context;
use crate::test_support::*;
use agentbox_api::crd::Sandbox;

#[tokio::test]
async fn a_new_sandbox_gets_its_pod_then_finalizer_and_labels_in_one_write() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    fake.put(
        &format!("{SBX}/fresh"),
        sandbox("fresh", json!({}), json!({}), Value::Null),
    );
    let action = reconcile_sandbox(&fake, &ctx, "fresh").await;
    assert_eq!(
        fake.writes(),
        vec![
            format!("PATCH {PODS}/{}", pod("fresh")),
            format!("POST {EVENTS}"),
            format!("PATCH {SBX}/fresh"),
        ],
        "pod, PodCreated Event, then metadata (issue 32: it follows the start); no status \
         before the pod reports"
    );
    let s = fake.get(&format!("{SBX}/fresh")).expect("sandbox");
    assert_eq!(
        s["metadata"]["finalizers"],
        json!([super::write::FINALIZER])
    );
    assert_eq!(
        s["metadata"]["labels"][agentbox_api::labels::AGENT],
        json!("fresh")
    );
    assert!(s.get("status").is_none_or(Value::is_null));
    assert_eq!(action, Action::requeue(std::time::Duration::from_secs(10)));
}

#[tokio::test]
async fn an_invalid_spec_costs_one_event_and_one_status_write_and_no_pod() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    let spec = json!({"workspace": {"root": "relative"}});
    fake.put(&format!("{SBX}/bad"), adopted("bad", spec, Value::Null));
    reconcile_sandbox(&fake, &ctx, "bad").await;
    assert_eq!(fake.writes(), event_and_status("bad"));
    let s = fake.get(&format!("{SBX}/bad")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Failed"));
    // Again: the same world, the same status: no write at all.
    let before = fake.writes().len();
    reconcile_sandbox(&fake, &ctx, "bad").await;
    assert_eq!(fake.writes().len(), before, "{:?}", fake.writes());
}

#[tokio::test]
async fn a_version_this_process_wrote_over_is_skipped_without_a_request() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    fake.put(
        &format!("{SBX}/stale"),
        adopted("stale", json!({"workspace": {"root": "x"}}), Value::Null),
    );
    let read: Sandbox =
        serde_json::from_value(fake.get(&format!("{SBX}/stale")).expect("s")).expect("sandbox");
    super::reconcile(Arc::new(read.clone()), ctx.clone())
        .await
        .expect("reconcile");
    let seen = fake.requests();
    // The cache hands the same (now written-over) version again.
    let action = super::reconcile(Arc::new(read), ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(fake.requests(), seen, "no request for a superseded version");
    assert_eq!(
        action,
        Action::requeue(std::time::Duration::from_millis(500))
    );
}

#[tokio::test]
async fn suspending_deletes_the_pod_then_records_suspended_once() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    let spec = json!({"lifecycle": {"mode": "Suspended"}});
    fake.put(
        &format!("{SBX}/sus"),
        adopted(
            "sus",
            spec,
            json!({"phase": "Ready", "podName": pod("sus")}),
        ),
    );
    fake.put(
        &format!("{PODS}/{}", pod("sus")),
        json!({"metadata": {"name": pod("sus")}}),
    );
    reconcile_sandbox(&fake, &ctx, "sus").await;
    // Under the operator's own guard, taken without waiting and released after.
    let mut want = vec![
        format!("POST {LEASES}"),
        format!("DELETE {PODS}/{}", pod("sus")),
        format!("PUT {}", guard_lease("sus")),
    ];
    want.extend(event_and_status("sus"));
    assert_eq!(fake.writes(), want);
    let s = fake.get(&format!("{SBX}/sus")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Suspended"));
    assert!(s["status"].get("podName").is_none_or(Value::is_null));
}

#[tokio::test]
async fn a_suspension_whose_pod_is_already_going_takes_no_guard_and_writes_no_lease() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    let spec = json!({"lifecycle": {"mode": "Suspended"}});
    fake.put(
        &format!("{SBX}/going"),
        adopted(
            "going",
            spec,
            json!({"phase": "Ready", "podName": pod("going")}),
        ),
    );
    // Asked to go by an earlier look (under the guard), its kubelet still stopping it.
    fake.put(
        &format!("{PODS}/{}", pod("going")),
        json!({"metadata": {"name": pod("going"),
            "deletionTimestamp": "2026-11-27T04:00:00Z"}}),
    );
    // Each look used to take and release the guard (two Lease writes, each a watched event
    // that brought the next look) until the pod was gone.
    for _ in 0..3 {
        reconcile_sandbox(&fake, &ctx, "going").await;
    }
    let writes = fake.writes();
    assert!(
        !writes
            .iter()
            .any(|w| w.contains("/leases") || w.starts_with("DELETE")),
        "{writes:?}"
    );
    let statuses = writes.iter().filter(|w| w.contains("/status")).count();
    assert!(
        statuses <= 1,
        "the status is written once at most: {writes:?}"
    );
}

/// A Lease of the sandbox's scope, held by `holder` (renewed just now) with `token`.
fn held_lease(name: &str, holder: &str, token: i64) -> Value {
    let lease = guard_lease(name);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": lease.rsplit('/').next(), "namespace": "n", "resourceVersion": "7"},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "acquireTime": now,
            "renewTime": now, "leaseTransitions": token}})
}

#[tokio::test]
async fn a_suspension_waits_for_a_harness_at_work_and_goes_at_once_under_its_handed_over_hold() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    fake.put(&guard_lease("busy"), held_lease("busy", "harness-1", 4));
    let spec = json!({"lifecycle": {"mode": "Suspended"}});
    fake.put(
        &format!("{SBX}/busy"),
        adopted(
            "busy",
            spec,
            json!({"phase": "Ready", "podName": pod("busy")}),
        ),
    );
    fake.put(
        &format!("{PODS}/{}", pod("busy")),
        json!({"metadata": {"name": pod("busy")}}),
    );
    // A harness holds the guard and handed nothing over: its pod stays.
    reconcile_sandbox(&fake, &ctx, "busy").await;
    assert_eq!(
        fake.writes(),
        [] as [String; 0],
        "nothing under a harness at work"
    );
    // The same harness hands its hold over: the pod goes under it, the Lease untouched.
    let hold = json!({"lifecycle": {"mode": "Suspended",
        "guard": {"holder": "harness-1", "token": 4}}});
    fake.put(
        &format!("{SBX}/busy"),
        adopted(
            "busy",
            hold,
            json!({"phase": "Ready", "podName": pod("busy")}),
        ),
    );
    reconcile_sandbox(&fake, &ctx, "busy").await;
    let mut want = vec![format!("DELETE {PODS}/{}", pod("busy"))];
    want.extend(event_and_status("busy"));
    assert_eq!(fake.writes(), want);
    let l = fake.get(&guard_lease("busy")).expect("lease");
    assert_eq!(
        l["spec"]["holderIdentity"],
        json!("harness-1"),
        "still the harness's"
    );
}

#[tokio::test]
async fn suspending_a_sandbox_served_before_the_kubelet_says_running_takes_its_on_stop_snapshot() {
    let fake = Arc::new(FakeApi::default());
    let store = crate::snapshot::store::Store::memory("");
    let ctx = context_with(fake.clone(), Some(store));
    let spec = json!({"lifecycle": {"mode": "Suspended"}, "snapshot": {"onStop": true}});
    let status = json!({"phase": "Ready", "podName": pod("early"), "nodeName": "node-1",
        "scopeKey": "k", "workspace": {"rootReady": true, "initializedPodUid": "pod-uid"}});
    fake.put(&format!("{SBX}/early"), adopted("early", spec, status));
    // Initialised through an early exec: the kubelet has not reported the container running.
    let mut p = current_pod(&ctx, "early", &fake);
    p["status"] = json!({"phase": "Pending", "containerStatuses": [{
        "name": crate::controller::pod::CONTAINER, "ready": false, "restartCount": 0, "image": "busybox",
        "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}]});
    fake.put(&format!("{PODS}/{}", pod("early")), p);
    node_root_checked(&ctx);
    reconcile_sandbox(&fake, &ctx, "early").await;
    let writes = fake.writes();
    assert!(
        writes.contains(&format!("POST {SNAPS}")),
        "the on-stop snapshot is asked for: {writes:?}"
    );
    assert!(
        !writes.iter().any(|w| w.starts_with("DELETE")),
        "the pod stays until the snapshot is done: {writes:?}"
    );
}

#[tokio::test]
async fn deleting_asks_the_pod_to_go_and_lets_the_finalizer_go_without_waiting() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    let meta = json!({"deletionTimestamp": "2026-01-01T00:00:00Z"});
    let mut obj = adopted("gone", json!({}), json!({"phase": "Ready"}));
    merge(&mut obj["metadata"], &meta);
    fake.put(&format!("{SBX}/gone"), obj);
    fake.put(
        &format!("{PODS}/{}", pod("gone")),
        json!({"metadata": {"name": pod("gone"), "uid": "pod-uid"}}),
    );

    // One pass: the pod asked to go (short grace, this pod only), the finalizer removed while
    // it still terminates; no Terminating status for a deletion that does not wait.
    let action = reconcile_sandbox(&fake, &ctx, "gone").await;
    assert_eq!(
        fake.writes(),
        vec![
            format!("DELETE {PODS}/{}", pod("gone")),
            format!("PATCH {SBX}/gone"),
        ]
    );
    assert_eq!(action, Action::await_change());
    let s = fake.get(&format!("{SBX}/gone")).expect("sandbox");
    assert_eq!(s["metadata"]["finalizers"], json!([]));
    let p = fake.get(&format!("{PODS}/{}", pod("gone"))).expect("pod");
    assert!(
        !p["metadata"]["deletionTimestamp"].is_null(),
        "terminating, not forced"
    );
}

#[tokio::test]
async fn deleting_a_sandbox_on_a_lost_node_force_deletes_its_pod_and_does_not_wait_for_the_node() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    let meta = json!({"deletionTimestamp": "2026-01-01T00:00:00Z"});
    let status = json!({"phase": "Terminating", "nodeName": "node-1"});
    let mut obj = adopted("away", json!({}), status);
    merge(&mut obj["metadata"], &meta);
    fake.put(&format!("{SBX}/away"), obj);
    // Terminating already, on a node Unknown since long ago: its kubelet will never finish it.
    fake.put(
        &format!("{PODS}/{}", pod("away")),
        json!({"metadata": {"name": pod("away"), "uid": "stale",
            "deletionTimestamp": "2026-01-01T00:00:00Z"}, "spec": {"nodeName": "node-1"}}),
    );
    fake.put(&node_path("node-1"), node("node-1", "Unknown"));
    reconcile_sandbox(&fake, &ctx, "away").await;
    // The pod forced out, the workspace's directory named in a Warning Event (its node is
    // lost), and the finalizer gone, in one pass.
    assert_eq!(
        fake.writes(),
        vec![
            format!("DELETE {PODS}/{}", pod("away")),
            format!("POST {EVENTS}"),
            format!("PATCH {SBX}/away"),
        ]
    );
    assert!(
        fake.get(&format!("{PODS}/{}", pod("away"))).is_none(),
        "forced"
    );
    let s = fake.get(&format!("{SBX}/away")).expect("sandbox");
    assert_eq!(s["metadata"]["finalizers"], json!([]));
}

#[tokio::test]
async fn a_pod_of_another_owner_fails_the_sandbox_with_a_name_conflict() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    fake.put(
        &format!("{SBX}/clash"),
        adopted("clash", json!({}), Value::Null),
    );
    fake.put(
        &format!("{PODS}/{}", pod("clash")),
        json!({"metadata": {"name": pod("clash"), "ownerReferences": [{"apiVersion": "v1",
            "kind": "ReplicaSet", "name": "other", "uid": "someone-else", "controller": true}]}}),
    );
    reconcile_sandbox(&fake, &ctx, "clash").await;
    assert_eq!(fake.writes(), event_and_status("clash"));
    let s = fake.get(&format!("{SBX}/clash")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Failed"));
    let ready = s["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(ready["reason"], json!("PodNameConflict"), "{}", s["status"]);
}

#[tokio::test]
async fn a_sandbox_without_a_pod_whose_node_is_gone_starts_elsewhere_and_records_the_loss() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    let status = json!({"phase": "Pending", "nodeName": "node-9",
        "workspace": {"rootReady": true, "initializedPodUid": "old-pod"}});
    fake.put(&format!("{SBX}/gone"), adopted("gone", json!({}), status));
    reconcile_sandbox(&fake, &ctx, "gone").await;
    assert_eq!(
        fake.writes(),
        vec![
            format!("POST {EVENTS}"),
            format!("PATCH {PODS}/{}", pod("gone")),
            format!("POST {EVENTS}"),
            format!("PATCH {SBX}/gone/status"),
        ]
    );
    let p = fake.get(&format!("{PODS}/{}", pod("gone"))).expect("pod");
    assert!(
        p["spec"]["affinity"].is_null(),
        "not pinned to the gone node: {p}"
    );
    let s = fake.get(&format!("{SBX}/gone")).expect("sandbox");
    assert_eq!(s["status"]["nodeLoss"]["node"], json!("node-9"));
    assert!(s["status"]["nodeLoss"]["notReadySince"].is_null());
    assert_eq!(s["status"]["abandoned"][0]["node"], json!("node-9"));
    assert!(
        ctx.metrics
            .render()
            .contains("agentbox_node_loss_recoveries_total 1")
    );
}

#[tokio::test]
async fn a_lost_node_gives_the_workspace_up_with_one_status_write_one_event_and_a_forced_delete() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    let status = json!({"phase": "Ready", "nodeName": "node-1", "podName": pod("lost"),
        "workspace": {"rootReady": true, "initializedPodUid": "pod-uid"}});
    fake.put(&format!("{SBX}/lost"), adopted("lost", json!({}), status));
    let mut p = current_pod(&ctx, "lost", &fake);
    // What the node lifecycle controller leaves: the pod's Ready condition False (its
    // container status as the dead kubelet last reported it: ready), the node Unknown for far
    // longer than the grace.
    p["status"]["conditions"] = json!([{"type": "Ready", "status": "False"}]);
    fake.put(&format!("{PODS}/{}", pod("lost")), p);
    fake.put(&node_path("node-1"), node("node-1", "Unknown"));
    let action = reconcile_sandbox(&fake, &ctx, "lost").await;
    assert_eq!(
        fake.writes(),
        vec![
            format!("POST {EVENTS}"),
            format!("PATCH {SBX}/lost/status"),
            format!("DELETE {PODS}/{}", pod("lost")),
        ]
    );
    let s = fake.get(&format!("{SBX}/lost")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Pending"));
    assert_eq!(s["status"]["nodeLoss"]["node"], json!("node-1"));
    assert_eq!(s["status"]["abandoned"][0]["node"], json!("node-1"));
    let dir = s["status"]["abandoned"][0]["directory"]
        .as_str()
        .unwrap_or_default();
    assert!(dir.ends_with("/n/uid-lost"), "{dir}");
    assert!(
        fake.get(&format!("{PODS}/{}", pod("lost"))).is_none(),
        "force-deleted, not left terminating"
    );
    assert!(
        ctx.metrics
            .render()
            .contains("agentbox_node_loss_recoveries_total 1")
    );
    assert_eq!(action, Action::requeue(std::time::Duration::from_secs(1)));
}

#[tokio::test]
async fn a_running_pod_with_its_workspace_initialised_makes_the_sandbox_ready_in_one_write() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    let status = json!({"phase": "Pending", "workspace": {"rootReady": true,
        "initializedPodUid": "pod-uid"}});
    fake.put(&format!("{SBX}/run"), adopted("run", json!({}), status));
    fake.put(
        &format!("{PODS}/{}", pod("run")),
        current_pod(&ctx, "run", &fake),
    );
    node_root_checked(&ctx);
    reconcile_sandbox(&fake, &ctx, "run").await;
    assert_eq!(fake.writes(), vec![format!("PATCH {SBX}/run/status")]);
    let s = fake.get(&format!("{SBX}/run")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Ready"));
    assert_eq!(s["status"]["nodeName"], json!("node-1"));
    // Nothing changed: nothing written.
    reconcile_sandbox(&fake, &ctx, "run").await;
    assert_eq!(fake.writes().len(), 1, "{:?}", fake.writes());
}

/// A first reconcile of a sandbox whose pod already serves with its workspace initialised
/// (an operator stopped before its metadata write): `name` without finalizer or labels.
fn first_reconcile_of_a_serving_sandbox(fake: &Arc<FakeApi>, name: &str) -> Arc<Context> {
    let ctx = context(fake.clone());
    let status = json!({"phase": "Pending", "workspace": {"rootReady": true,
        "initializedPodUid": "pod-uid"}});
    fake.put(
        &format!("{SBX}/{name}"),
        sandbox(name, json!({}), json!({}), status),
    );
    fake.put(
        &format!("{PODS}/{}", pod(name)),
        current_pod(&ctx, name, fake),
    );
    node_root_checked(&ctx);
    ctx
}

#[tokio::test]
async fn the_metadata_write_follows_the_ready_status_and_neither_version_is_started_again() {
    let fake = Arc::new(FakeApi::default());
    let ctx = first_reconcile_of_a_serving_sandbox(&fake, "meta");
    let read: Sandbox =
        serde_json::from_value(fake.get(&format!("{SBX}/meta")).expect("s")).expect("sandbox");
    let metadata = fake.hold(&format!("PATCH {SBX}/meta"));
    let running = tokio::spawn({
        let (fake, ctx) = (fake.clone(), ctx.clone());
        async move { reconcile_sandbox(&fake, &ctx, "meta").await }
    });
    // The version between the two writes (the metadata write held): Ready, without the
    // finalizer.
    while !fake.requested(&format!("PATCH {SBX}/meta/status")) {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let between: Sandbox =
        serde_json::from_value(fake.get(&format!("{SBX}/meta")).expect("s")).expect("sandbox");
    assert_eq!(
        between.status.as_ref().and_then(|s| s.phase),
        Some(agentbox_api::crd::SandboxPhase::Ready)
    );
    assert!(
        between.metadata.finalizers.is_none(),
        "{:?}",
        between.metadata
    );
    metadata.close();
    running.await.expect("reconcile");
    // Nothing between the start and the Ready status: the finalizer and labels come after it.
    assert_eq!(
        fake.writes(),
        vec![
            format!("PATCH {SBX}/meta/status"),
            format!("PATCH {SBX}/meta")
        ]
    );
    let s = fake.get(&format!("{SBX}/meta")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Ready"));
    assert_eq!(
        s["metadata"]["finalizers"],
        json!([super::write::FINALIZER])
    );
    // The version the status write made (Ready, no finalizer yet) and the one read are
    // written over: a lagging cache that hands either back costs no request.
    let seen = fake.requests();
    for stale in [read, between] {
        let action = super::reconcile(Arc::new(stale), ctx.clone())
            .await
            .expect("reconcile");
        assert_eq!(
            action,
            Action::requeue(std::time::Duration::from_millis(500))
        );
    }
    assert_eq!(
        fake.requests(),
        seen,
        "no request for a written-over version"
    );
}

#[tokio::test]
async fn a_failed_metadata_write_after_the_status_is_the_error_and_is_made_again() {
    let fake = Arc::new(FakeApi::default());
    let ctx = first_reconcile_of_a_serving_sandbox(&fake, "nometa");
    fake.failing
        .lock()
        .expect("failing")
        .insert(format!("PATCH {SBX}/nometa"), 500);
    let obj: Sandbox =
        serde_json::from_value(fake.get(&format!("{SBX}/nometa")).expect("s")).expect("sandbox");
    let err = super::reconcile(Arc::new(obj), ctx.clone())
        .await
        .expect_err("the metadata write failed");
    assert_eq!(err.kind(), "kube", "the write's own error: {err}");
    assert_eq!(
        fake.writes(),
        vec![
            format!("PATCH {SBX}/nometa/status"),
            format!("PATCH {SBX}/nometa")
        ]
    );
    let s = fake.get(&format!("{SBX}/nometa")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Ready"));
    // The retry acts on the version the status write made (not skipped as written over):
    // the metadata write again, and nothing else.
    fake.failing.lock().expect("failing").clear();
    reconcile_sandbox(&fake, &ctx, "nometa").await;
    assert_eq!(fake.writes().len(), 3, "{:?}", fake.writes());
    assert_eq!(fake.writes()[2], format!("PATCH {SBX}/nometa"));
    let s = fake.get(&format!("{SBX}/nometa")).expect("sandbox");
    assert_eq!(
        s["metadata"]["finalizers"],
        json!([super::write::FINALIZER])
    );
}

#[tokio::test]
async fn a_pod_adopted_before_the_status_said_so_is_found_and_recorded_with_its_directory() {
    // An operator adopted a warm pod for the sandbox and stopped before writing its status:
    // the pod has another name and directory, and only the watch's cache knows it is this
    // sandbox's. It is recorded (name and directory, in the one status write) and no pod is
    // made.
    let fake = Arc::new(FakeApi::default());
    let status = json!({"phase": "Pending", "workspace": {"rootReady": true,
        "initializedPodUid": "pod-uid"}});
    fake.put(&format!("{SBX}/adp"), adopted("adp", json!({}), status));
    let probe = context(fake.clone());
    let dir = format!("{}/{NS}/warm-abcde", probe.config.node_root);
    let sbx: Sandbox =
        serde_json::from_value(fake.get(&format!("{SBX}/adp")).expect("stored")).expect("sbx");
    let podcfg = crate::controller::pod::PodConfig::from_config(&probe.config);
    let mut p = current_pod(&probe, "adp", &fake);
    let built = crate::controller::pod::build_pod_in(&sbx, &podcfg, &dir, None);
    p["metadata"] = serde_json::to_value(built.metadata).expect("meta");
    p["metadata"]["name"] = json!("pool-warm-abcde");
    p["metadata"]["uid"] = json!("pod-uid");
    p["spec"]["volumes"] = serde_json::to_value(built.spec.expect("spec").volumes).expect("v");
    fake.put(&format!("{PODS}/pool-warm-abcde"), p.clone());
    let ctx = context_with_pods(
        fake.clone(),
        None,
        vec![serde_json::from_value(p).expect("pod")],
    );
    node_root_checked(&ctx);
    reconcile_sandbox(&fake, &ctx, "adp").await;
    assert_eq!(fake.writes(), vec![format!("PATCH {SBX}/adp/status")]);
    let s = fake.get(&format!("{SBX}/adp")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Ready"));
    assert_eq!(s["status"]["podName"], json!("pool-warm-abcde"));
    assert_eq!(s["status"]["workspace"]["hostDir"], json!(dir));
    // From now on the status names it: found without the cache, nothing written.
    let again = context(fake.clone());
    node_root_checked(&again);
    reconcile_sandbox(&fake, &again, "adp").await;
    assert_eq!(fake.writes().len(), 1, "{:?}", fake.writes());
}

#[tokio::test]
async fn a_changed_spec_replaces_the_pod_without_a_status_write() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    fake.put(
        &format!("{SBX}/chg"),
        adopted("chg", json!({}), json!({"phase": "Ready"})),
    );
    let mut p = current_pod(&ctx, "chg", &fake);
    p["metadata"]["annotations"][crate::controller::pod::SPEC_HASH] = json!("an-older-spec");
    fake.put(&format!("{PODS}/{}", pod("chg")), p);
    let action = reconcile_sandbox(&fake, &ctx, "chg").await;
    assert_eq!(
        fake.writes(),
        vec![
            format!("POST {EVENTS}"),
            format!("DELETE {PODS}/{}", pod("chg")),
        ]
    );
    assert_eq!(action, Action::requeue(std::time::Duration::from_secs(1)));
}

#[tokio::test]
async fn a_terminating_pod_is_waited_for_with_one_status_write() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    fake.put(
        &format!("{SBX}/term"),
        adopted("term", json!({}), json!({"phase": "Ready"})),
    );
    let mut p = current_pod(&ctx, "term", &fake);
    p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    fake.put(&format!("{PODS}/{}", pod("term")), p);
    let action = reconcile_sandbox(&fake, &ctx, "term").await;
    assert_eq!(fake.writes(), vec![format!("PATCH {SBX}/term/status")]);
    let s = fake.get(&format!("{SBX}/term")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Pending"));
    assert_eq!(action, Action::requeue(std::time::Duration::from_secs(1)));
}

#[tokio::test]
async fn a_passed_shutdown_time_deletes_the_sandbox_with_an_event() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    let spec = json!({"lifecycle": {"shutdownTime": "2020-01-01T00:00:00Z"}});
    fake.put(&format!("{SBX}/end"), adopted("end", spec, Value::Null));
    reconcile_sandbox(&fake, &ctx, "end").await;
    assert_eq!(
        fake.writes(),
        vec![format!("POST {EVENTS}"), format!("DELETE {SBX}/end")]
    );
    let s = fake
        .get(&format!("{SBX}/end"))
        .expect("kept by its finalizer");
    assert!(!s["metadata"]["deletionTimestamp"].is_null());
}

#[tokio::test]
async fn a_first_reconcile_deletes_a_shut_down_sandbox_only_once_its_finalizer_is_on() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    let spec = json!({"lifecycle": {"shutdownTime": "2020-01-01T00:00:00Z"}});
    fake.put(
        &format!("{SBX}/end1"),
        sandbox("end1", spec, json!({}), Value::Null),
    );
    fake.slow.lock().expect("slow").insert(
        format!("PATCH {SBX}/end1"),
        std::time::Duration::from_millis(300),
    );
    reconcile_sandbox(&fake, &ctx, "end1").await;
    assert_eq!(
        fake.writes(),
        vec![
            format!("PATCH {SBX}/end1"),
            format!("POST {EVENTS}"),
            format!("DELETE {SBX}/end1")
        ]
    );
    let s = fake
        .get(&format!("{SBX}/end1"))
        .expect("kept by its finalizer");
    assert!(!s["metadata"]["deletionTimestamp"].is_null());
}

#[tokio::test]
async fn a_prepared_root_without_its_marker_starts_fresh_from_the_spec_and_says_it_was_lost() {
    let root = std::env::temp_dir().join(format!("agentbox-scenario-init-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).expect("root");
    let (fake, ctx, _) = serving_sandbox("init", &root, json!({"rootReady": true})).await;
    reconcile_sandbox(&fake, &ctx, "init").await;
    let todo = std::fs::read_to_string(root.join("notes/todo.txt"));
    let marker = root.join(agentbox_api::remote::MARKER).exists();
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(todo.expect("the spec's file written"), "ship it\n");
    assert!(marker, "the marker written");
    assert!(fake.requested(&format!("GET {PODS}/{}/exec", pod("init"))));
    // No snapshot to restore: branch D, reported as a loss, since the root had been
    // prepared before.
    assert_started(&fake, "init", "D", "WorkspaceReinitialized");
    let status_writes = fake
        .writes()
        .iter()
        .filter(|w| w.ends_with("/status"))
        .count();
    assert_eq!(status_writes, 1, "{:?}", fake.writes());
}

#[tokio::test]
async fn a_workspace_initialised_by_an_earlier_pod_is_reattached_as_it_is() {
    let root = host_workspace("reattach");
    std::fs::write(root.join("src/main.py"), "edited\n").expect("an edit");
    let (fake, ctx, _) = serving_sandbox(
        "again",
        &root,
        json!({"rootReady": true, "initializedPodUid": "an-earlier-pod"}),
    )
    .await;
    reconcile_sandbox(&fake, &ctx, "again").await;
    let kept = std::fs::read_to_string(root.join("src/main.py"));
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(kept.expect("the file"), "edited\n", "the workspace is kept");
    assert_started(&fake, "again", "A", "WorkspaceReused");
}

/// The sandbox `name` is Ready, initialised in the current pod, through `branch` for `reason`.
fn assert_started(fake: &FakeApi, name: &str, branch: &str, reason: &str) {
    let s = fake.get(&format!("{SBX}/{name}")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Ready"), "{s:#}");
    let w = &s["status"]["workspace"];
    assert_eq!(w["initializedPodUid"], json!("pod-uid"), "{s:#}");
    assert_eq!(w["lastStartBranch"], json!(branch), "{s:#}");
    assert_eq!(condition(&s, "WorkspaceReady")["reason"], json!(reason));
}

#[tokio::test]
async fn a_lost_workspace_comes_back_from_the_newest_snapshot_as_recovered() {
    let root = host_workspace("recover");
    let initialised = json!({"rootReady": true, "initializedPodUid": "pod-uid"});
    let (fake, ctx, _) = serving_sandbox("rec", &root, initialised).await;
    fake.put(
        &format!("{SNAPS}/s1"),
        snapshot_of("s1", "rec", Value::Null),
    );
    crate::controller::snapshot::reconcile(stored_snapshot(&fake, "s1"), ctx.clone())
        .await
        .expect("the snapshot");
    assert_eq!(
        fake.get(&format!("{SNAPS}/s1")).expect("s1")["status"]["phase"],
        json!("Ready")
    );
    // The node lost the workspace; the sandbox's pod is a new one.
    std::fs::remove_dir_all(&root).expect("lose it");
    std::fs::create_dir_all(&root).expect("an empty root");
    let mut sbx = fake.get(&format!("{SBX}/rec")).expect("sandbox");
    // (The fake stores a status patch as the whole status, so the snapshot's record of
    // itself replaced what the sandbox controller wrote; the API server would merge them.)
    sbx["status"]["podName"] = json!(pod("rec"));
    sbx["status"]["workspace"] = json!({"rootReady": true, "initializedPodUid": "a-lost-pod"});
    fake.put(&format!("{SBX}/rec"), sbx);

    reconcile_sandbox(&fake, &ctx, "rec").await;
    let back = std::fs::read_to_string(root.join("src/main.py"));
    let todo = std::fs::read_to_string(root.join("notes/todo.txt"));
    let staged: Vec<String> = std::fs::read_dir(root.join(agentbox_api::remote::STATE_DIR))
        .expect("the state directory")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("staging-") || n.starts_with("old-"))
        .collect();
    let _ = std::fs::remove_dir_all(&root);
    assert_started(&fake, "rec", "B", "WorkspaceRecovered");
    assert_eq!(back.expect("restored"), "print('hi')\n");
    assert!(todo.is_err(), "branch B writes only the ephemeral files");
    assert!(
        staged.is_empty(),
        "nothing of the restore is left behind: {staged:?}"
    );
    let s = fake.get(&format!("{SBX}/rec")).expect("sandbox");
    assert_eq!(s["status"]["restoredFrom"], json!("s1"), "{s:#}");
}

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/n/leases";

/// The path of the guard Lease of sandbox `name`'s scope (Agent `name`).
fn guard_lease(name: &str) -> String {
    let scope: agentbox_api::crd::Scope =
        serde_json::from_value(json!({"kind": "Agent", "agent": name})).expect("scope");
    format!(
        "{LEASES}/{}",
        agentbox_api::labels::lease_name(&agentbox_api::labels::scope_key(&scope))
    )
}

/// A Ready sandbox with a 60 s idle timeout, idle (its guard free, no Lease yet) since
/// `idle_for` ago, serving in its current pod.
fn idle_sandbox(fake: &Arc<FakeApi>, ctx: &Context, name: &str, idle_for: i64) {
    let since = k8s_openapi::jiff::Timestamp::from_second(
        k8s_openapi::jiff::Timestamp::now().as_second() - idle_for,
    )
    .expect("time");
    let status = json!({"phase": "Ready", "podName": pod(name), "nodeName": "node-1",
        "scopeKey": "k", "workspace": {"rootReady": true, "initializedPodUid": "pod-uid"},
        "idleSince": since.to_string(), "idleGuardTransitions": 0});
    let spec = json!({"lifecycle": {"idleTimeout": "60s"}});
    fake.put(&format!("{SBX}/{name}"), adopted(name, spec, status));
    fake.put(
        &format!("{PODS}/{}", pod(name)),
        current_pod(ctx, name, fake),
    );
    node_root_checked(ctx);
}

#[tokio::test]
async fn an_idle_sandbox_past_its_timeout_suspends_itself_under_the_guard_then_loses_its_pod() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    idle_sandbox(&fake, &ctx, "idle", 61);
    reconcile_sandbox(&fake, &ctx, "idle").await;
    let lease = guard_lease("idle");
    assert_eq!(
        fake.writes(),
        vec![
            format!("POST {LEASES}"),
            format!("PATCH {SBX}/idle"),
            format!("POST {EVENTS}"),
            format!("PATCH {SBX}/idle/status"),
            format!("PUT {lease}"),
        ],
        "guard taken, mode set, announced, recorded, guard released"
    );
    let s = fake.get(&format!("{SBX}/idle")).expect("sandbox");
    assert_eq!(s["spec"]["lifecycle"]["mode"], json!("Suspended"));
    assert_eq!(s["status"]["phase"], json!("Suspended"));
    assert_eq!(condition(&s, "Ready")["reason"], json!("IdleTimeout"));
    assert_eq!(
        s["status"]["podName"],
        json!(pod("idle")),
        "for the on-stop snapshot"
    );
    let l = fake.get(&lease).expect("lease");
    assert!(l["spec"]["holderIdentity"].is_null(), "released: {l}");
    assert_eq!(l["spec"]["leaseTransitions"], json!(1));
    assert_eq!(
        ctx.metrics
            .render()
            .lines()
            .find(|l| l.starts_with("agentbox_idle_suspensions_total")),
        Some("agentbox_idle_suspensions_total 1")
    );

    // The mode change brings the suspend step: the pod goes under the guard (taken and
    // released again), no second Event.
    let before = fake.writes().len();
    reconcile_sandbox(&fake, &ctx, "idle").await;
    assert_eq!(
        fake.writes()[before..],
        [
            format!("PUT {lease}"),
            format!("DELETE {PODS}/{}", pod("idle")),
            format!("PUT {lease}"),
            format!("PATCH {SBX}/idle/status"),
        ]
    );
    let s = fake.get(&format!("{SBX}/idle")).expect("sandbox");
    assert!(s["status"].get("podName").is_none_or(Value::is_null));
    assert_eq!(condition(&s, "Ready")["reason"], json!("IdleTimeout"));
    assert!(
        s["status"]["idleSince"].is_string(),
        "says when it went idle"
    );
    // Suspended, the pod gone, nothing changes: nothing written.
    fake.objects
        .lock()
        .expect("objects")
        .remove(&format!("{PODS}/{}", pod("idle")));
    let before = fake.writes().len();
    reconcile_sandbox(&fake, &ctx, "idle").await;
    reconcile_sandbox(&fake, &ctx, "idle").await;
    assert_eq!(fake.writes()[before..], [] as [String; 0], "at rest");
}

/// The requeue of an Action, in seconds (kube's Action shows it only in its Debug form).
fn requeue_secs(action: &Action) -> Option<f64> {
    let shown = format!("{action:?}");
    let inner = shown.split("Some(").nth(1)?.split(')').next()?;
    match inner.strip_suffix("ms") {
        Some(ms) => ms.parse::<f64>().ok().map(|m| m / 1000.0),
        None => inner.strip_suffix('s')?.parse().ok(),
    }
}

#[tokio::test]
async fn an_idle_sandbox_short_of_its_timeout_costs_no_write_and_wakes_when_it_is_due() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    idle_sandbox(&fake, &ctx, "soon", 20);
    // The first look completes the status the fixture left short (its conditions).
    reconcile_sandbox(&fake, &ctx, "soon").await;
    let before = fake.writes().len();
    let action = reconcile_sandbox(&fake, &ctx, "soon").await;
    assert_eq!(fake.writes().len(), before, "{:?}", fake.writes());
    let due = requeue_secs(&action).unwrap_or_else(|| panic!("no requeue: {action:?}"));
    // Idle since 20 s ago (whole seconds) of 60: due in 40 s less the part of a second gone.
    assert!(due > 38.0 && due <= 40.0, "{action:?}");
    let s = fake.get(&format!("{SBX}/soon")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Ready"));
}

#[tokio::test]
async fn a_harness_that_takes_the_guard_first_keeps_its_sandbox() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    idle_sandbox(&fake, &ctx, "race", 61);
    // The harness's take lands between the operator's look and its own take.
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let lease = guard_lease("race");
    let harness = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": lease.rsplit('/').next(), "namespace": NS},
        "spec": {"holderIdentity": "harness", "leaseDurationSeconds": 15,
            "acquireTime": now, "renewTime": now, "leaseTransitions": 1}});
    *fake.first.lock().expect("first") = Some((format!("POST {LEASES}"), lease.clone(), harness));
    reconcile_sandbox(&fake, &ctx, "race").await;
    assert_eq!(
        fake.writes(),
        vec![format!("POST {LEASES}")],
        "the take failed (409): nothing else written"
    );
    let s = fake.get(&format!("{SBX}/race")).expect("sandbox");
    assert_eq!(s["spec"]["lifecycle"]["mode"], Value::Null);
    assert_eq!(s["status"]["phase"], json!("Ready"));
    assert_eq!(
        fake.get(&lease).expect("lease")["spec"]["holderIdentity"],
        json!("harness")
    );
}

#[tokio::test]
async fn a_sandbox_changed_since_it_was_read_is_not_suspended_and_the_guard_goes_back() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    idle_sandbox(&fake, &ctx, "moved", 61);
    let read: Sandbox =
        serde_json::from_value(fake.get(&format!("{SBX}/moved")).expect("stored")).expect("sbx");
    // Someone writes the Sandbox after the operator's cache saw it.
    let mut newer = fake.get(&format!("{SBX}/moved")).expect("stored");
    newer["metadata"]["annotations"] = json!({"touched": "yes"});
    fake.put(&format!("{SBX}/moved"), newer);
    super::reconcile(Arc::new(read), ctx.clone())
        .await
        .expect("reconcile");
    let lease = guard_lease("moved");
    assert_eq!(
        fake.writes(),
        vec![
            format!("POST {LEASES}"),
            format!("PATCH {SBX}/moved"),
            format!("PUT {lease}"),
        ],
        "the conditional write was refused (409) and the guard released"
    );
    let s = fake.get(&format!("{SBX}/moved")).expect("sandbox");
    assert_eq!(s["spec"]["lifecycle"]["mode"], Value::Null);
    assert!(fake.get(&lease).expect("lease")["spec"]["holderIdentity"].is_null());
}

/// The pod of sandbox `name` as the operator would make it now, on node-1, created `age`
/// seconds ago, its container waiting with `reason` and `message`.
fn waiting_pod(ctx: &Context, name: &str, fake: &FakeApi, reason: &str, age: i64) -> Value {
    let mut p = current_pod(ctx, name, fake);
    let created =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(age);
    p["metadata"]["creationTimestamp"] = json!(created.to_string());
    p["status"] = json!({"phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True",
            "lastTransitionTime": created.to_string()}],
        "containerStatuses": [{
        "name": crate::controller::pod::CONTAINER, "ready": false, "restartCount": 0, "image": "nope",
        "imageID": "", "state": {"waiting": {"reason": reason,
            "message": format!("{reason}: pull access denied for nope")}}}]});
    p
}

/// The Events stored so far: (type, reason, note).
fn events(fake: &FakeApi) -> Vec<(String, String, String)> {
    let prefix = format!("{EVENTS}/");
    let objects = fake.objects.lock().expect("objects");
    objects
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .map(|(_, e)| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("type"), s("reason"), s("note"))
        })
        .collect()
}

#[tokio::test]
async fn an_image_that_cannot_be_pulled_stalls_the_start_after_the_grace_and_clears_when_it_runs() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    assert_eq!(ctx.config.stall_grace_seconds, 20, "the default");
    // (The workspace is recorded as initialised in the pod, so that once it runs it is served
    // without an exec, which this fake does not answer.)
    let status = json!({"phase": "Pending", "workspace": {"rootReady": true,
        "initializedPodUid": "pod-uid"}});
    fake.put(&format!("{SBX}/img"), adopted("img", json!({}), status));
    node_root_checked(&ctx);
    let at = format!("{PODS}/{}", pod("img"));

    // 5 s into a failed pull: Pending with the kubelet's reason, and a look again when the
    // grace runs out, whether or not the pod changes meanwhile.
    fake.put(&at, waiting_pod(&ctx, "img", &fake, "ErrImagePull", 5));
    let action = reconcile_sandbox(&fake, &ctx, "img").await;
    let due = requeue_secs(&action).unwrap_or_else(|| panic!("no requeue: {action:?}"));
    assert!(due > 13.0 && due <= 15.0, "{action:?}");
    let s = fake.get(&format!("{SBX}/img")).expect("sandbox");
    assert_eq!(condition(&s, "Ready")["reason"], json!("ErrImagePull"));
    assert!(
        s["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().all(|c| c["type"] != "Stalled")),
        "not within the grace: {s:#}"
    );

    // 25 s in, backing off: Stalled with that reason and message (Ready says the same), and
    // a Warning Event.
    fake.put(&at, waiting_pod(&ctx, "img", &fake, "ImagePullBackOff", 25));
    let before = events(&fake).len();
    reconcile_sandbox(&fake, &ctx, "img").await;
    let s = fake.get(&format!("{SBX}/img")).expect("sandbox");
    let stalled = condition(&s, "Stalled");
    assert_eq!(stalled["status"], json!("True"));
    assert_eq!(stalled["reason"], json!("ImagePullBackOff"));
    assert_eq!(stalled["observedGeneration"], json!(1));
    let message = stalled["message"].as_str().unwrap_or_default().to_string();
    assert!(
        message.starts_with("ImagePullBackOff: pull access denied for nope"),
        "{message}"
    );
    assert_eq!(condition(&s, "Ready")["reason"], json!("ImagePullBackOff"));
    let sbx: Sandbox = serde_json::from_value(s).expect("sandbox");
    assert!(sbx.stalled().is_some(), "what the clients' waits end on");
    let new = events(&fake)[before..].to_vec();
    assert_eq!(
        new,
        vec![(
            "Warning".to_string(),
            "ImagePullBackOff".to_string(),
            message
        )],
        "one Warning"
    );
    // Nothing new: no write.
    let writes = fake.writes().len();
    reconcile_sandbox(&fake, &ctx, "img").await;
    assert_eq!(fake.writes().len(), writes, "{:?}", fake.writes());

    // The image turns up and the pod runs after all: no longer stalled, Ready.
    fake.put(&at, current_pod(&ctx, "img", &fake));
    reconcile_sandbox(&fake, &ctx, "img").await;
    let s = fake.get(&format!("{SBX}/img")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Ready"));
    assert!(
        s["status"]["conditions"]
            .as_array()
            .is_some_and(|cs| cs.iter().all(|c| c["type"] != "Stalled")),
        "{s:#}"
    );
}

// Ready means the pod the status names runs (issue 42): whatever order the pod's changes
// reach the operator in, no status says Ready (phase, `Ready` or `PodReady` True) unless the
// pod it names is, as the API server holds it at that moment, the pod the workspace was
// initialised in (by UID), Running, its container running and ready, and not being deleted.
// A pod of the same name can still be stopping on the node when its successor is bound (a
// force delete), and exec finds a container by the pod's name: a command sent before the
// kubelet reports the new pod running may reach the old one, or none.

/// What the scheduler and the kubelet have made of a pod so far.
#[derive(Clone, Copy, Debug)]
enum Kubelet {
    /// Made, bound to no node yet, no status.
    Unbound,
    /// Bound to the node; the kubelet has not reported on it.
    Bound(&'static str),
    /// Bound; its container is being created.
    Creating(&'static str),
    /// Running; its container started, not ready yet.
    Started(&'static str),
    /// Running; its container running and ready.
    Serving(&'static str),
    /// Serving, and being deleted (gracefully: the kubelet stops it).
    Going(&'static str),
}

/// The pod of sandbox `name` (as the operator makes it) with UID `uid`, as `k` says.
fn pod_as(ctx: &Context, name: &str, fake: &FakeApi, uid: &str, k: Kubelet) -> Value {
    let mut p = current_pod(ctx, name, fake);
    p["metadata"]["uid"] = json!(uid);
    let container = |ready: bool, state: Value| {
        json!([{"name": crate::controller::pod::CONTAINER, "ready": ready, "restartCount": 0,
            "image": "busybox", "imageID": "", "state": state}])
    };
    let scheduled = json!([{"type": "PodScheduled", "status": "True"}]);
    let running = json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}});
    let (node, status) = match k {
        Kubelet::Unbound => (None, json!({"phase": "Pending"})),
        Kubelet::Bound(n) => (
            Some(n),
            json!({"phase": "Pending", "conditions": scheduled}),
        ),
        Kubelet::Creating(n) => (
            Some(n),
            json!({"phase": "Pending", "conditions": scheduled, "containerStatuses":
                container(false, json!({"waiting": {"reason": "ContainerCreating"}}))}),
        ),
        Kubelet::Started(n) => (
            Some(n),
            json!({"phase": "Running", "containerStatuses": container(false, running)}),
        ),
        Kubelet::Serving(n) | Kubelet::Going(n) => (
            Some(n),
            json!({"phase": "Running", "containerStatuses": container(true, running)}),
        ),
    };
    p["spec"]["nodeName"] = json!(node);
    p["status"] = status;
    if let Kubelet::Going(_) = k {
        p["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
    }
    p
}

/// Whether `pod` (as stored) is the running, ready, live pod with UID `uid`.
fn runs_as(pod: &Value, uid: &Value) -> bool {
    let container = pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|cs| {
            cs.iter()
                .find(|c| c["name"] == crate::controller::pod::CONTAINER)
        });
    !uid.is_null()
        && &pod["metadata"]["uid"] == uid
        && pod["status"]["phase"] == "Running"
        && pod["metadata"]["deletionTimestamp"].is_null()
        && container.is_some_and(|c| c["ready"] == true && !c["state"]["running"].is_null())
}

/// The statuses written that say Ready (phase, `Ready` or `PodReady` True) while the pod
/// they name was not, as the fake held it then, the running, ready, live pod the workspace
/// was initialised in.
fn ready_without_its_pod(fake: &FakeApi) -> Vec<String> {
    let statuses = fake.statuses.lock().expect("statuses");
    statuses
        .iter()
        .filter(|(_, st, _)| {
            let says = |t: &str| {
                st["conditions"]
                    .as_array()
                    .is_some_and(|cs| cs.iter().any(|c| c["type"] == t && c["status"] == "True"))
            };
            st["phase"] == "Ready" || says("Ready") || says("PodReady")
        })
        .filter(|(_, st, pod)| {
            let uid = &st["workspace"]["initializedPodUid"];
            !pod.as_ref().is_some_and(|p| runs_as(p, uid))
        })
        .map(|(at, st, pod)| {
            let pod = pod.as_ref().map(|p| {
                json!({"uid": p["metadata"]["uid"], "node": p["spec"]["nodeName"],
                    "deleting": !p["metadata"]["deletionTimestamp"].is_null(),
                    "status": p["status"]})
            });
            format!(
                "{at}: phase {} naming {} (initialised in {}) while the pod was {}",
                st["phase"],
                st["podName"],
                st["workspace"]["initializedPodUid"],
                pod.map_or("gone".to_string(), |p| p.to_string())
            )
        })
        .collect()
}

/// Plays `world` on sandbox `name`: each entry is the pod as the API server then holds it
/// (`None`: deleted, which the operator answers by making one; `Some`: its UID and what the
/// kubelet reported), each followed by a reconcile.
async fn play(
    fake: &Arc<FakeApi>,
    ctx: &Arc<Context>,
    name: &str,
    world: &[Option<(&str, Kubelet)>],
) {
    let at = format!("{PODS}/{}", pod(name));
    for w in world {
        match w {
            None => {
                fake.objects.lock().expect("objects").remove(&at);
            }
            Some((uid, k)) => fake.put(&at, pod_as(ctx, name, fake, uid, *k)),
        }
        let obj: Sandbox = serde_json::from_value(fake.get(&format!("{SBX}/{name}")).expect("sbx"))
            .expect("sandbox");
        // A reconcile may fail (an exec into a pod that is not running): the invariant is
        // about what it writes, and the controller retries.
        let _ = super::reconcile(Arc::new(obj), ctx.clone()).await;
    }
}

/// A served context (its pod cache holding `cached`) and sandbox `name`, Ready, its workspace
/// (at `root` on the host) initialised in pod `pod-1` on node-1, which serves; node-1 and
/// node-2 Ready and checked.
async fn ready_in_pod_1(
    name: &str,
    root: &std::path::Path,
    cached: Vec<k8s_openapi::api::core::v1::Pod>,
) -> (Arc<FakeApi>, Arc<Context>) {
    let fake = Arc::new(FakeApi::default());
    let store = crate::snapshot::store::Store::memory("");
    let ctx = served_context_with_pods(fake.clone(), Some(store), cached).await;
    let spec = json!({"workspace": {"root": root.to_string_lossy(),
        "files": [{"path": "notes/todo.txt", "content": "ship it\n"}]}});
    let status = json!({"phase": "Ready", "podName": pod(name), "nodeName": "node-1",
        "workspace": {"rootReady": true, "initializedPodUid": "pod-1"}});
    fake.put(&format!("{SBX}/{name}"), adopted(name, spec, status));
    fake.put(&node_path("node-2"), node("node-2", "True"));
    let p = pod_as(&ctx, name, &fake, "pod-1", Kubelet::Serving("node-1"));
    fake.put(&format!("{PODS}/{}", pod(name)), p);
    node_root_checked(&ctx);
    let found = crate::controller::memos::Found::Checked {
        nosuid: true,
        nodev: true,
        mount: "/".into(),
    };
    ctx.node_roots
        .record("node-2", NS, found, std::time::Instant::now());
    (fake, ctx)
}

/// The sandbox `name` ends Ready in pod `uid`, and no status said Ready before its pod did.
fn assert_ready_only_when_its_pod_is(fake: &FakeApi, name: &str, uid: &str, order: &str) {
    let bad = ready_without_its_pod(fake);
    assert!(
        bad.is_empty(),
        "{order}: Ready before its pod was:\n{bad:#?}"
    );
    let s = fake.get(&format!("{SBX}/{name}")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Ready"), "{order}: {s:#}");
    assert_eq!(
        s["status"]["workspace"]["initializedPodUid"],
        json!(uid),
        "{order}: {s:#}"
    );
    assert_eq!(s["status"]["podName"], json!(pod(name)), "{order}: {s:#}");
}

#[tokio::test]
async fn a_replaced_pod_is_ready_only_once_the_kubelet_reports_it_running_in_any_order() {
    use Kubelet::*;
    type World = Vec<Option<(&'static str, Kubelet)>>;
    let orders: Vec<(&str, World)> = vec![
        (
            "force-deleted, then every report on its successor",
            vec![
                None,
                Some(("pod-2", Unbound)),
                Some(("pod-2", Bound("node-1"))),
                Some(("pod-2", Creating("node-1"))),
                Some(("pod-2", Started("node-1"))),
                Some(("pod-2", Serving("node-1"))),
            ],
        ),
        (
            "force-deleted, the successor's reports coalesced",
            vec![
                None,
                Some(("pod-2", Creating("node-1"))),
                Some(("pod-2", Serving("node-1"))),
            ],
        ),
        (
            "deleted gracefully",
            vec![
                Some(("pod-1", Going("node-1"))),
                None,
                Some(("pod-2", Bound("node-1"))),
                Some(("pod-2", Creating("node-1"))),
                Some(("pod-2", Serving("node-1"))),
            ],
        ),
        (
            "the successor seen before the delete (status still naming pod-1 Ready)",
            vec![
                Some(("pod-2", Creating("node-1"))),
                Some(("pod-2", Started("node-1"))),
                Some(("pod-2", Serving("node-1"))),
            ],
        ),
        (
            "replaced on another node",
            vec![
                None,
                Some(("pod-2", Bound("node-2"))),
                Some(("pod-2", Creating("node-2"))),
                Some(("pod-2", Serving("node-2"))),
            ],
        ),
        (
            "the old pod back in a stale read between the successor's reports",
            vec![
                None,
                Some(("pod-2", Creating("node-1"))),
                Some(("pod-1", Serving("node-1"))),
                Some(("pod-2", Creating("node-1"))),
                Some(("pod-2", Serving("node-1"))),
            ],
        ),
    ];
    for (i, (order, world)) in orders.iter().enumerate() {
        let name = format!("rep{i}");
        let root = host_workspace(&name);
        let (fake, ctx) = ready_in_pod_1(&name, &root, Vec::new()).await;
        play(&fake, &ctx, &name, world).await;
        let _ = std::fs::remove_dir_all(&root);
        assert_ready_only_when_its_pod_is(&fake, &name, "pod-2", order);
    }
}

#[tokio::test]
async fn a_pod_cache_that_still_holds_the_old_pod_changes_nothing() {
    use Kubelet::*;
    let name = "stale";
    let root = host_workspace(name);
    let probe = Arc::new(FakeApi::default());
    let probe_ctx = context(probe.clone());
    probe.put(
        &format!("{SBX}/{name}"),
        adopted(name, json!({}), Value::Null),
    );
    let old: k8s_openapi::api::core::v1::Pod =
        serde_json::from_value(pod_as(&probe_ctx, name, &probe, "pod-1", Serving("node-1")))
            .expect("pod");
    let (fake, ctx) = ready_in_pod_1(name, &root, vec![old]).await;
    play(
        &fake,
        &ctx,
        name,
        &[
            None,
            Some(("pod-2", Bound("node-1"))),
            Some(("pod-2", Creating("node-1"))),
            Some(("pod-2", Serving("node-1"))),
        ],
    )
    .await;
    let _ = std::fs::remove_dir_all(&root);
    assert_ready_only_when_its_pod_is(&fake, name, "pod-2", "stale pod cache");
}

#[tokio::test]
async fn a_resumed_sandbox_is_ready_only_once_its_new_pod_runs() {
    use Kubelet::*;
    let name = "resume";
    let root = host_workspace(name);
    let (fake, ctx) = ready_in_pod_1(name, &root, Vec::new()).await;
    // Suspended (its pod gone, the workspace kept on node-1), now asked to run again.
    let mut sbx = fake.get(&format!("{SBX}/{name}")).expect("sandbox");
    sbx["status"]["phase"] = json!("Suspended");
    sbx["status"]["podName"] = Value::Null;
    fake.put(&format!("{SBX}/{name}"), sbx);
    play(
        &fake,
        &ctx,
        name,
        &[
            None,
            Some(("pod-2", Bound("node-1"))),
            Some(("pod-2", Creating("node-1"))),
            Some(("pod-2", Started("node-1"))),
            Some(("pod-2", Serving("node-1"))),
        ],
    )
    .await;
    let kept = std::fs::read_to_string(root.join("src/main.py"));
    let _ = std::fs::remove_dir_all(&root);
    assert_ready_only_when_its_pod_is(&fake, name, "pod-2", "resume");
    assert_eq!(kept.expect("the workspace kept"), "print('hi')\n");
}

#[tokio::test]
async fn a_restore_into_a_new_pod_is_ready_only_once_that_pod_runs() {
    use Kubelet::*;
    let name = "restore";
    let root = host_workspace(name);
    let (fake, ctx) = ready_in_pod_1(name, &root, Vec::new()).await;
    fake.put(&format!("{SNAPS}/s1"), snapshot_of("s1", name, Value::Null));
    crate::controller::snapshot::reconcile(stored_snapshot(&fake, "s1"), ctx.clone())
        .await
        .expect("the snapshot");
    // The node lost the workspace; the sandbox's next pod restores it (branch B).
    std::fs::remove_dir_all(&root).expect("lose it");
    std::fs::create_dir_all(&root).expect("an empty root");
    let mut sbx = fake.get(&format!("{SBX}/{name}")).expect("sandbox");
    sbx["status"]["phase"] = json!("Ready");
    sbx["status"]["podName"] = json!(pod(name));
    sbx["status"]["nodeName"] = json!("node-1");
    sbx["status"]["workspace"] = json!({"rootReady": true, "initializedPodUid": "pod-1"});
    fake.put(&format!("{SBX}/{name}"), sbx);
    fake.statuses.lock().expect("statuses").clear();
    play(
        &fake,
        &ctx,
        name,
        &[
            None,
            Some(("pod-2", Creating("node-1"))),
            Some(("pod-2", Started("node-1"))),
            Some(("pod-2", Serving("node-1"))),
        ],
    )
    .await;
    let back = std::fs::read_to_string(root.join("src/main.py"));
    let _ = std::fs::remove_dir_all(&root);
    assert_ready_only_when_its_pod_is(&fake, name, "pod-2", "restore");
    assert_eq!(back.expect("restored"), "print('hi')\n");
    let s = fake.get(&format!("{SBX}/{name}")).expect("sandbox");
    assert_eq!(s["status"]["restoredFrom"], json!("s1"), "{s:#}");
}

const TEMPLATES: &str = "/apis/agentbox.dev/v1alpha1/namespaces/n/sandboxtemplates";

/// A first start of sandbox `name` from template `tpl` (its workspace at `root` on the host),
/// with a warm pod `tpl-warm-aaaaa` of pool `pool` that fits it, Ready, in the fake; returns
/// the warm pod as the fake holds it (what an up-to-date pod cache holds).
fn claimable(
    fake: &Arc<FakeApi>,
    ctx: &Context,
    name: &str,
    root: &std::path::Path,
) -> k8s_openapi::api::core::v1::Pod {
    fake.put(
        &format!("{TEMPLATES}/tpl"),
        json!({"apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxTemplate",
            "metadata": {"name": "tpl", "namespace": NS, "uid": "tpl-uid", "generation": 1},
            "spec": {"image": "busybox"}}),
    );
    let spec = json!({"templateRef": {"name": "tpl"},
        "workspace": {"root": root.to_string_lossy(),
            "files": [{"path": "notes/todo.txt", "content": "ship it\n"}]}});
    fake.put(&format!("{SBX}/{name}"), adopted(name, spec, Value::Null));
    let sbx: Sandbox =
        serde_json::from_value(fake.get(&format!("{SBX}/{name}")).expect("sbx")).expect("sbx");
    let tpl: agentbox_api::crd::SandboxTemplate =
        serde_json::from_value(fake.get(&format!("{TEMPLATES}/tpl")).expect("tpl")).expect("tpl");
    let mut resolved = sbx.clone();
    resolved.spec = agentbox_api::template::resolve(&tpl.spec, &sbx.spec);
    let podcfg = crate::controller::pod::PodConfig::from_config(&ctx.config);
    let shape = super::claim::shape_hash(&resolved, &podcfg);
    let dir = format!("{}/{NS}/warm-aaaaa", ctx.config.node_root);
    let l = agentbox_api::labels::WARM;
    let warm = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "tpl-warm-aaaaa", "namespace": NS, "uid": "warm-1",
            "labels": {l: "true", agentbox_api::labels::POOL: "pool",
                agentbox_api::labels::MANAGED_BY: agentbox_api::labels::MANAGER},
            "annotations": {agentbox_api::labels::WARM_READY: "true",
                agentbox_api::labels::POD_SHAPE_HASH: shape,
                agentbox_api::labels::WORKSPACE_HOST_DIR: dir},
            "ownerReferences": [{"apiVersion": "agentbox.dev/v1alpha1",
                "kind": "SandboxPool", "name": "pool", "uid": "pool-uid", "controller": true}]},
        "spec": {"nodeName": "node-1", "containers": [{"name": crate::controller::pod::CONTAINER}],
            "volumes": [{"name": crate::controller::pod::WORKSPACE_VOLUME,
                "hostPath": {"path": dir}}]},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": crate::controller::pod::CONTAINER, "ready": true, "restartCount": 0,
            "image": "busybox", "imageID": "",
            "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}});
    fake.put(&format!("{PODS}/tpl-warm-aaaaa"), warm);
    fake.put(&node_path("node-1"), node("node-1", "True"));
    serde_json::from_value(fake.get(&format!("{PODS}/tpl-warm-aaaaa")).expect("warm"))
        .expect("a pod")
}

#[tokio::test]
async fn a_claim_is_ready_only_in_the_running_warm_pod_it_adopted() {
    let name = "claim";
    let root = host_workspace(name);
    std::fs::remove_dir_all(&root).expect("an empty root");
    std::fs::create_dir_all(&root).expect("an empty root");
    let fake = Arc::new(FakeApi::default());
    let probe = context(fake.clone());
    let warm = claimable(&fake, &probe, name, &root);
    let ctx = served_context_with_pods(fake.clone(), None, vec![warm]).await;
    node_root_checked(&ctx);
    let obj: Sandbox =
        serde_json::from_value(fake.get(&format!("{SBX}/{name}")).expect("sbx")).expect("sbx");
    super::reconcile(Arc::new(obj), ctx.clone())
        .await
        .expect("the claim");
    let todo = std::fs::read_to_string(root.join("notes/todo.txt"));
    let _ = std::fs::remove_dir_all(&root);
    let bad = ready_without_its_pod(&fake);
    assert!(bad.is_empty(), "Ready before its pod was:\n{bad:#?}");
    let s = fake.get(&format!("{SBX}/{name}")).expect("sandbox");
    assert_eq!(s["status"]["phase"], json!("Ready"), "{s:#}");
    assert_eq!(
        s["status"]["podName"],
        json!("tpl-warm-aaaaa"),
        "adopted: {s:#}"
    );
    assert_eq!(
        s["status"]["workspace"]["initializedPodUid"],
        json!("warm-1")
    );
    assert_eq!(todo.expect("the file written"), "ship it\n");
}

#[tokio::test]
async fn a_claim_from_a_stale_pod_cache_starts_cold_and_is_ready_only_once_its_pod_runs() {
    use Kubelet::*;
    let name = "claim2";
    let root = host_workspace(name);
    std::fs::remove_dir_all(&root).expect("an empty root");
    std::fs::create_dir_all(&root).expect("an empty root");
    let fake = Arc::new(FakeApi::default());
    let probe = context(fake.clone());
    let warm = claimable(&fake, &probe, name, &root);
    // The API server has moved on from what the cache holds: the warm pod was deleted and a
    // pod of the same name, starting, took its place.
    let mut replaced = serde_json::to_value(&warm).expect("pod");
    replaced["metadata"]["uid"] = json!("warm-2");
    replaced["status"] = json!({"phase": "Pending"});
    fake.put(&format!("{PODS}/tpl-warm-aaaaa"), replaced);
    let ctx = served_context_with_pods(fake.clone(), None, vec![warm]).await;
    node_root_checked(&ctx);
    play(
        &fake,
        &ctx,
        name,
        &[
            None,
            Some(("pod-2", Bound("node-1"))),
            Some(("pod-2", Creating("node-1"))),
            Some(("pod-2", Serving("node-1"))),
        ],
    )
    .await;
    let todo = std::fs::read_to_string(root.join("notes/todo.txt"));
    let _ = std::fs::remove_dir_all(&root);
    let adopted = fake.get(&format!("{PODS}/tpl-warm-aaaaa")).expect("left");
    assert!(
        adopted["metadata"]["ownerReferences"][0]["kind"] == "SandboxPool",
        "the replaced pod is not adopted: {adopted:#}"
    );
    assert_ready_only_when_its_pod_is(&fake, name, "pod-2", "stale claim, cold start");
    assert_eq!(todo.expect("the file written"), "ship it\n");
}
