//! The snapshot controller's scenarios: its reconciles against the fake API server
//! ([`crate::test_support`]), each asserting what a snapshot writes, in which order.

use std::sync::Arc;

use kube::runtime::controller::Action;
use serde_json::{Value, json};

use crate::test_support::*;
use agentbox_api::crd::SandboxSnapshot;

#[tokio::test]
async fn a_snapshot_without_a_store_fails_once_with_its_reason() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context(fake.clone());
    let snap = json!({"apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxSnapshot",
        "metadata": {"name": "s1", "namespace": NS, "uid": "snap-uid"},
        "spec": {"sandboxRef": {"name": "missing"}}});
    fake.put(&format!("{SNAPS}/s1"), snap);
    let read = |fake: &FakeApi| -> Arc<SandboxSnapshot> {
        Arc::new(
            serde_json::from_value(fake.get(&format!("{SNAPS}/s1")).expect("s")).expect("snap"),
        )
    };
    // First the finalizer, alone.
    super::reconcile(read(&fake), ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(fake.writes(), vec![format!("PATCH {SNAPS}/s1")]);
    super::reconcile(read(&fake), ctx.clone())
        .await
        .expect("reconcile");
    let writes = fake.writes();
    assert_eq!(
        writes[1..],
        [format!("POST {EVENTS}"), format!("PATCH {SNAPS}/s1/status")]
    );
    let s = fake.get(&format!("{SNAPS}/s1")).expect("snapshot");
    assert_eq!(s["status"]["phase"], json!("Failed"));
    assert_eq!(s["status"]["conditions"][0]["reason"], json!("NoStore"));
    // Failed is final: nothing more.
    super::reconcile(read(&fake), ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(fake.writes().len(), 3);
}

#[tokio::test]
async fn a_snapshot_of_a_sandbox_without_a_pod_waits_pending_and_writes_once() {
    let fake = Arc::new(FakeApi::default());
    let store = crate::snapshot::store::Store::memory("");
    let ctx = context_with(fake.clone(), Some(store));
    fake.put(
        &format!("{SBX}/idle"),
        adopted("idle", json!({}), Value::Null),
    );
    let snap = json!({"apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxSnapshot",
        "metadata": {"name": "s2", "namespace": NS, "uid": "snap-2",
            "finalizers": [super::FINALIZER]},
        "spec": {"sandboxRef": {"name": "idle"}}});
    fake.put(&format!("{SNAPS}/s2"), snap);
    let read = |fake: &FakeApi| -> Arc<SandboxSnapshot> {
        Arc::new(
            serde_json::from_value(fake.get(&format!("{SNAPS}/s2")).expect("s")).expect("snap"),
        )
    };
    let action = super::reconcile(read(&fake), ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(fake.writes(), vec![format!("PATCH {SNAPS}/s2/status")]);
    assert_eq!(action, Action::requeue(std::time::Duration::from_secs(3)));
    let s = fake.get(&format!("{SNAPS}/s2")).expect("snapshot");
    assert_eq!(s["status"]["phase"], json!("Pending"));
    assert_eq!(
        s["status"]["conditions"][0]["reason"],
        json!("SandboxNotReady")
    );
    super::reconcile(read(&fake), ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(fake.writes().len(), 1, "waiting again costs no write");
}

#[tokio::test]
async fn a_finished_snapshot_costs_no_request() {
    let fake = Arc::new(FakeApi::default());
    let ctx = context_with(
        fake.clone(),
        Some(crate::snapshot::store::Store::memory("")),
    );
    for (name, phase) in [("done", "Ready"), ("gave-up", "Failed")] {
        fake.put(
            &format!("{SNAPS}/{name}"),
            snapshot_of(name, "gone", json!({"phase": phase})),
        );
        let action = super::reconcile(stored_snapshot(&fake, name), ctx.clone())
            .await
            .expect("reconcile");
        assert_eq!(action, Action::await_change());
    }
    assert_eq!(fake.requests(), 0);
}

#[tokio::test]
async fn a_snapshot_of_a_serving_sandbox_is_taken_under_the_guard_and_committed() {
    let root = host_workspace("take");
    let initialised = json!({"rootReady": true, "initializedPodUid": "pod-uid"});
    let (fake, ctx, store) = serving_sandbox("busy", &root, initialised).await;
    fake.put(
        &format!("{SNAPS}/s1"),
        snapshot_of("s1", "busy", Value::Null),
    );

    let action = super::reconcile(stored_snapshot(&fake, "s1"), ctx.clone())
        .await
        .expect("reconcile");
    let _ = std::fs::remove_dir_all(&root);

    let s = fake.get(&format!("{SNAPS}/s1")).expect("snapshot");
    assert_eq!(s["status"]["phase"], json!("Ready"), "{s:#}");
    assert_eq!(condition(&s, "Ready")["status"], json!("True"));
    // src/ and src/main.py; the operator's state directory is not archived.
    assert_eq!(s["status"]["members"], json!(2), "{s:#}");
    // The object holds exactly what the status says.
    let key = s["status"]["objectKey"].as_str().expect("an object key");
    use object_store::ObjectStoreExt;
    let bytes = store
        .inner()
        .get(&object_store::path::Path::from(key))
        .await
        .expect("the object")
        .bytes()
        .await
        .expect("its bytes");
    assert_eq!(s["status"]["sizeBytes"], json!(bytes.len()));
    use sha2::Digest;
    assert_eq!(
        s["status"]["sha256"],
        json!(hex::encode(sha2::Sha256::digest(&bytes)))
    );
    // The sandbox records its newest snapshot.
    let sbx = fake.get(&format!("{SBX}/busy")).expect("sandbox");
    assert_eq!(sbx["status"]["lastSnapshot"]["name"], json!("s1"));
    // Labels, the guard, one status write before the stream and one after it (the guard
    // released between them), the sandbox's record, one Event.
    let lease = format!(
        "/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/agentbox-guard-{}",
        s["status"]["scopeKey"].as_str().expect("scope key")
    );
    assert_eq!(
        fake.writes(),
        vec![
            format!("PATCH {SNAPS}/s1"),
            "POST /apis/coordination.k8s.io/v1/namespaces/n/leases".to_string(),
            format!("PATCH {SNAPS}/s1/status"),
            format!("PUT {lease}"),
            format!("PATCH {SNAPS}/s1/status"),
            format!("PATCH {SBX}/busy/status"),
            format!("POST {EVENTS}"),
        ]
    );
    assert!(fake.requested(&format!("GET {PODS}/{}/exec", pod("busy"))));
    let held = fake.get(&lease).expect("the lease");
    assert!(
        held["spec"]["holderIdentity"]
            .as_str()
            .unwrap_or("")
            .is_empty(),
        "released: {held:#}"
    );
    assert_eq!(action, Action::await_change());
}

#[tokio::test]
async fn a_workspace_without_its_marker_is_never_committed() {
    let root = host_workspace("unmarked");
    std::fs::remove_file(root.join(agentbox_api::remote::MARKER)).expect("marker");
    let initialised = json!({"rootReady": true, "initializedPodUid": "pod-uid"});
    let (fake, ctx, store) = serving_sandbox("bare", &root, initialised).await;
    fake.put(
        &format!("{SNAPS}/s2"),
        snapshot_of("s2", "bare", Value::Null),
    );
    let _ = super::reconcile(stored_snapshot(&fake, "s2"), ctx.clone()).await;
    let _ = std::fs::remove_dir_all(&root);
    let s = fake.get(&format!("{SNAPS}/s2")).expect("snapshot");
    assert_ne!(s["status"]["phase"], json!("Ready"), "{s:#}");
    assert!(s["status"]["sha256"].is_null(), "{s:#}");
    assert_eq!(s["status"]["attempts"], json!(1));
    // Nothing is left in the store: no object, no unfinished upload.
    use futures::TryStreamExt;
    use object_store::ObjectStore;
    let left: Vec<_> = store
        .inner()
        .list(None)
        .try_collect()
        .await
        .expect("a listing");
    assert!(left.is_empty(), "{left:?}");
    let sbx = fake.get(&format!("{SBX}/bare")).expect("sandbox");
    assert!(sbx["status"]["lastSnapshot"].is_null());
}
