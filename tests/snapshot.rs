//! Snapshots against the real local cluster, each scenario against a `file://` store and an
//! S3-compatible server on loopback (`hack/s3`, started here when not running): round trip
//! into a new sandbox (branch C), recovery of a lost workspace (branch B), hostile archives,
//! an operator killed mid-upload, retention, deletion policies and onStop, and a suspended
//! sandbox snapshotted by the node helper without its pod.

mod common;

use std::time::Duration;

use agentbox_api::crd::{Sandbox, SandboxPhase, SandboxSnapshot, SnapshotPhase, StartBranch};
use agentbox_api::labels;
use common::{
    NODE_ROOT, TestEnv, create_sandbox, events, listing, phase_is, raw, raw_header, sh,
    snapshot_finished as finished, take_snapshot,
};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use sha2::{Digest, Sha256};

use common::store::{Backend, Kind, backend, check_committed, keys_of, start, upload_alive};

fn spec(user: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut s = json!({
        "image": common::BASE_IMAGE,
        "imagePullPolicy": "Never",
        "scope": {"kind": "User", "agent": "snap-tests", "user": user},
    });
    if let (Some(base), Some(more)) = (s.as_object_mut(), extra.as_object()) {
        for (k, v) in more {
            base.insert(k.clone(), v.clone());
        }
    }
    s
}

fn pod_of(s: &Sandbox) -> String {
    s.status
        .as_ref()
        .and_then(|st| st.pod_name.clone())
        .expect("pod name")
}

fn branch(s: &Sandbox) -> Option<StartBranch> {
    s.status
        .as_ref()
        .and_then(|st| st.workspace.as_ref())
        .and_then(|w| w.last_start_branch)
}

async fn ready(env: &TestEnv, name: &str) -> Sandbox {
    env.wait_for::<Sandbox>(name, 300, phase_is("Ready")).await
}

async fn fill(env: &TestEnv, pod: &str, script: &str) {
    let out = agentbox_api::exec::run(
        &env.api::<Pod>(),
        pod,
        "sandbox",
        agentbox_api::exec::ExecRequest::shell(script).timeout(Duration::from_secs(300)),
    )
    .await
    .expect("exec fill");
    assert!(out.success(), "fill failed: {}", out.stderr_str());
}

/// Deletes every snapshot while the operator still runs (their finalizers need it).
async fn finish(env: TestEnv, b: &Backend) {
    common::finish_with_snapshots(env, b.dir.as_deref()).await;
}

const CONTENT: &str = r#"set -e
cd /workspace
mkdir -p src/deep/er empty/nested-empty bin 'with space'
head -c 65536 /dev/urandom > bin/blob.bin
printf '\000\001\002\377binary' > src/deep/er/raw
echo 'echo hi' > bin/run.sh && chmod 0755 bin/run.sh
echo secret > src/private && chmod 0600 src/private
chmod 0750 src/deep
echo spaced > 'with space/file name'
ln -s deep/er/raw src/link-to-raw
ln -s ../bin src/deep/up-link
ln -s . self
head -c 209715200 /dev/urandom > big.dat
"#;

async fn round_trip(kind: Kind) {
    let mut env = TestEnv::new(&format!("snap-rt-{}", format!("{kind:?}").to_lowercase())).await;
    let b = backend(kind, &env.ns);
    start(&mut env, &b);
    create_sandbox(&env, "a", spec("alice", json!({})))
        .await
        .expect("create a");
    let a = ready(&env, "a").await;
    let pod_a = pod_of(&a);
    fill(&env, &pod_a, CONTENT).await;
    let before = listing(&env, &pod_a).await;
    assert!(before.contains("F ./big.dat 644"), "{before}");
    assert!(
        before.contains("L ./src/link-to-raw deep/er/raw"),
        "{before}"
    );

    let s = take_snapshot(&env, "s1", "a", "Delete").await;
    check_committed(&b, &env, &s).await;
    let key = labels::scope_key(&a.spec.scope);
    assert_eq!(s.labels().get(labels::SCOPE_KEY), Some(&key));
    assert_eq!(
        s.labels().get(labels::USER).map(String::as_str),
        Some("alice")
    );
    assert!(s.owner_references().is_empty(), "snapshots have no owner");
    // The sandbox records its newest Ready snapshot.
    let sha = s.status.as_ref().and_then(|st| st.sha256.clone());
    let a = env
        .wait_for::<Sandbox>("a", 60, |x: Option<&Sandbox>| {
            x.and_then(|x| x.status.as_ref())
                .and_then(|st| st.last_snapshot.as_ref())
                .is_some_and(|l| l.name == "s1")
        })
        .await;
    let last = a
        .status
        .as_ref()
        .and_then(|st| st.last_snapshot.clone())
        .expect("lastSnapshot");
    assert_eq!(Some(last.sha256), sha);
    assert_eq!(
        Some(last.size_bytes),
        s.status.as_ref().and_then(|st| st.size_bytes)
    );
    assert_eq!(
        Some(&last.completed_at),
        s.status.as_ref().and_then(|st| st.completed_at.as_ref())
    );

    // A new sandbox of the same user scope restores the newest snapshot: branch C.
    create_sandbox(&env, "b", spec("alice", json!({})))
        .await
        .expect("create b");
    let sb = ready(&env, "b").await;
    assert_eq!(branch(&sb), Some(StartBranch::Restored), "{sb:#?}");
    assert_eq!(
        sb.status
            .as_ref()
            .and_then(|st| st.restored_from.as_deref()),
        Some("s1")
    );
    let after = listing(&env, &pod_of(&sb)).await;
    assert_eq!(before, after, "restored workspace differs");
    let host = agentbox_operator::controller::pod::workspace_host_path(
        NODE_ROOT,
        &env.ns,
        &sb.uid().unwrap(),
    );
    let leftovers: Vec<String> = std::fs::read_dir(format!("{host}/.agentbox"))
        .expect("read .agentbox")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("staging-") || n.starts_with("old-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    finish(env, &b).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn round_trip_into_a_new_sandbox_is_byte_for_byte_file() {
    round_trip(Kind::File).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn round_trip_into_a_new_sandbox_is_byte_for_byte_s3() {
    round_trip(Kind::S3).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn round_trip_into_a_new_sandbox_is_byte_for_byte_s3_moto() {
    round_trip(Kind::S3Moto).await;
}

async fn lost_workspace(kind: Kind) {
    let mut env = TestEnv::new(&format!("snap-lost-{}", format!("{kind:?}").to_lowercase())).await;
    let b = backend(kind, &env.ns);
    start(&mut env, &b);
    create_sandbox(
        &env,
        "r",
        spec("bob", json!({"snapshot": {"onStop": true}})),
    )
    .await
    .expect("create r");
    let r = ready(&env, "r").await;
    let pod = pod_of(&r);
    fill(&env, &pod, "mkdir -p /workspace/d && echo kept > /workspace/d/kept.txt && ln -s d/kept.txt /workspace/l").await;
    take_snapshot(&env, "before-loss", "r", "Delete").await;
    fill(&env, &pod, "echo later > /workspace/after.txt").await;
    let old_pod_uid = env
        .api::<Pod>()
        .get(&pod)
        .await
        .expect("pod")
        .uid()
        .expect("pod uid");

    // The node loses the workspace, then the pod goes.
    let host = agentbox_operator::controller::pod::workspace_host_path(
        NODE_ROOT,
        &env.ns,
        &r.uid().unwrap(),
    );
    std::fs::remove_dir_all(&host).expect("remove the workspace on the host");
    env.api::<Pod>()
        .delete(&pod, &DeleteParams::default())
        .await
        .expect("delete pod");
    let back = env
        .wait_for::<Sandbox>("r", 300, move |s: Option<&Sandbox>| {
            s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
                st.phase == Some(SandboxPhase::Ready)
                    && st
                        .workspace
                        .as_ref()
                        .and_then(|w| w.initialized_pod_uid.as_deref())
                        .is_some_and(|u| u != old_pod_uid)
            })
        })
        .await;
    assert_eq!(branch(&back), Some(StartBranch::Recovered), "{back:#?}");
    let (code, out) = sh(
        &env,
        &pod_of(&back),
        "cat /workspace/l; test -e /workspace/after.txt && echo after; true",
    )
    .await;
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(
        out, "kept\n",
        "the snapshot's content, and nothing written after it"
    );

    // onStop: suspending takes a snapshot first.
    env.api::<Sandbox>()
        .patch(
            "r",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"lifecycle": {"mode": "Suspended"}}})),
        )
        .await
        .expect("suspend");
    env.wait_for::<Sandbox>("r", 300, phase_is("Suspended"))
        .await;
    let stops = env
        .api::<SandboxSnapshot>()
        .list(&ListParams::default().labels("agentbox.dev/on-stop=true"))
        .await
        .expect("list");
    assert_eq!(stops.items.len(), 1, "{stops:#?}");
    let stop = &stops.items[0];
    assert_eq!(
        stop.status.as_ref().and_then(|s| s.phase),
        Some(SnapshotPhase::Ready),
        "{stop:#?}"
    );
    check_committed(&b, &env, stop).await;
    finish(env, &b).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_lost_workspace_comes_back_recovered_file() {
    lost_workspace(Kind::File).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_lost_workspace_comes_back_recovered_s3() {
    lost_workspace(Kind::S3).await;
}

async fn hostile(kind: Kind) {
    let mut env = TestEnv::new(&format!("snap-evil-{}", format!("{kind:?}").to_lowercase())).await;
    let b = backend(kind, &env.ns);
    let tag = common::suffix();
    let evil_abs = format!("/tmp/agentbox-evil-{tag}");
    let evil_up = format!("../agentbox-evil-{tag}");
    let mut bomb = Vec::new();
    for i in 0..100_001 {
        bomb.extend_from_slice(&raw_header(&format!("m{i}"), b'0', 0, ""));
    }
    bomb.extend_from_slice(&[0u8; 1024]);
    let mut expansion = raw_header("huge", b'0', 50 << 20, "").to_vec();
    expansion.extend_from_slice(&[7u8; 4096]);
    let good = raw(&[("fine.txt", b'0', b"fine", "")]);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "absolute",
            raw(&[(evil_abs.as_str(), b'0', b"x", "")]),
            "AbsolutePath",
        ),
        (
            "dotdot",
            raw(&[(evil_up.as_str(), b'0', b"x", "")]),
            "ParentComponent",
        ),
        (
            "hardlink",
            raw(&[("f", b'0', b"x", ""), ("h", b'1', b"", "/etc/passwd")]),
            "Hardlink",
        ),
        ("device", raw(&[("null", b'3', b"", "")]), "Device"),
        ("fifo", raw(&[("pipe", b'6', b"", "")]), "Fifo"),
        (
            "etc-link",
            raw(&[("etc", b'2', b"", "/etc")]),
            "SymlinkEscapes",
        ),
        (
            "under-link",
            raw(&[
                ("sub", b'5', b"", ""),
                ("l", b'2', b"", "sub"),
                ("l/x", b'0', b"x", ""),
            ]),
            "BeneathSymlink",
        ),
        (
            "duplicate",
            raw(&[("f", b'0', b"x", ""), ("f", b'0', b"y", "")]),
            "Duplicate",
        ),
        ("member-bomb", bomb, "TooManyMembers"),
        ("expansion-bomb", expansion, "ExpansionRatio"),
        ("wrong-digest", good, "DigestMismatch"),
    ];
    // The snapshots are made Ready by hand before an operator runs, pointing at the hostile
    // objects placed directly in the store.
    let scope_key = labels::scope_key(
        &serde_json::from_value(json!({"kind": "User", "agent": "snap-tests", "user": "mallory"}))
            .unwrap(),
    );
    for (name, bytes, _) in &cases {
        let sha = if *name == "wrong-digest" {
            "0".repeat(64)
        } else {
            hex::encode(Sha256::digest(bytes))
        };
        common::forge_snapshot(&env, &b.store, &scope_key, name, bytes, &sha).await;
    }
    start(&mut env, &b);
    for (name, _, _) in &cases {
        create_sandbox(
            &env,
            &format!("h-{name}"),
            spec(
                "mallory",
                json!({"snapshot": {"restore": "Named", "name": name}}),
            ),
        )
        .await
        .expect("create sandbox");
    }
    let mut reasons = std::collections::BTreeSet::new();
    for (name, _, want) in &cases {
        let want = want.to_string();
        let w2 = want.clone();
        let s = env
            .wait_for::<Sandbox>(&format!("h-{name}"), 300, move |s: Option<&Sandbox>| {
                s.and_then(|s| s.status.as_ref()).is_some_and(|st| {
                    st.conditions.iter().any(|c| {
                        c.type_ == "WorkspaceReady" && c.status == "False" && c.reason == w2
                    })
                })
            })
            .await;
        reasons.insert(want);
        let st = s.status.as_ref().unwrap();
        assert_ne!(st.phase, Some(SandboxPhase::Ready), "{name}");
        // Nothing was written: the workspace holds at most the operator's own directory, with
        // no staging left behind.
        let host = agentbox_operator::controller::pod::workspace_host_path(
            NODE_ROOT,
            &env.ns,
            &s.uid().unwrap(),
        );
        let entries = common::workspace_entries(&s);
        assert!(
            entries.iter().all(|e| e == ".agentbox"),
            "{name}: {entries:?}"
        );
        // The refused archive's staging directory is gone, and stays gone: the refusal is
        // recorded on the sandbox and not retried.
        let mut inner: Vec<String> = Vec::new();
        for _ in 0..150 {
            inner = std::fs::read_dir(format!("{host}/.agentbox"))
                .map(|d| {
                    d.flatten()
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .filter(|e| e.starts_with("staging-") || e.starts_with("old-"))
                        .collect()
                })
                .unwrap_or_default();
            if inner.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert!(inner.is_empty(), "{name}: {inner:?}");
        let (_, out) = sh(
            &env,
            &pod_of(&s),
            &format!("test -e {evil_abs} && echo leaked; true"),
        )
        .await;
        assert_eq!(out, "", "{name}");
    }
    assert_eq!(reasons.len(), cases.len(), "{reasons:?}");
    assert!(!std::path::Path::new(&format!("{NODE_ROOT}/{}/agentbox-evil-{tag}", env.ns)).exists());
    finish(env, &b).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn hostile_archives_are_refused_each_with_its_reason_file() {
    hostile(Kind::File).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn hostile_archives_are_refused_each_with_its_reason_s3() {
    hostile(Kind::S3).await;
}

async fn killed_mid_upload(kind: Kind) {
    let mut env = TestEnv::new(&format!("snap-kill-{}", format!("{kind:?}").to_lowercase())).await;
    let b = backend(kind, &env.ns);
    start(&mut env, &b);
    create_sandbox(&env, "k", spec("carol", json!({})))
        .await
        .expect("create");
    let k = ready(&env, "k").await;
    fill(
        &env,
        &pod_of(&k),
        "head -c 524288000 /dev/urandom > /workspace/big.dat",
    )
    .await;
    let obj: SandboxSnapshot = serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1",
        "kind": "SandboxSnapshot",
        "metadata": {"name": "k1"},
        "spec": {"sandboxRef": {"name": "k"}},
    }))
    .unwrap();
    let api = env.api::<SandboxSnapshot>();
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create");
    let running = env
        .wait_for::<SandboxSnapshot>("k1", 300, |s: Option<&SandboxSnapshot>| {
            s.and_then(|s| s.status.as_ref()).and_then(|st| st.phase)
                == Some(SnapshotPhase::Running)
        })
        .await;
    let keys = keys_of(&b, &env, &running);
    // Let some of the upload happen.
    if let Some(dir) = &b.dir {
        let tmp_dir = dir.join(keys.temp.as_ref()).parent().unwrap().to_path_buf();
        for _ in 0..600 {
            let staged: u64 = std::fs::read_dir(&tmp_dir)
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| e.metadata().ok())
                        .map(|m| m.len())
                        .sum()
                })
                .unwrap_or(0);
            if staged > 20 << 20 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    } else {
        // Until a part is in the bucket (s3s-fs lists an upload only by its parts).
        let id = running
            .status
            .as_ref()
            .and_then(|s| s.upload_id.clone())
            .expect("the Running status records the upload id");
        for _ in 0..600 {
            if upload_alive(&b, &keys.object, &id) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    env.operators[0].kill();
    let at_kill = api.get("k1").await.expect("get");
    assert_eq!(
        at_kill.status.as_ref().and_then(|s| s.phase),
        Some(SnapshotPhase::Running),
        "the kill came too late to test anything"
    );
    let upload_id = at_kill.status.as_ref().and_then(|s| s.upload_id.clone());
    if kind != Kind::File {
        let id = upload_id
            .as_deref()
            .expect("the Running status records the upload id");
        assert!(
            upload_alive(&b, &keys.object, id),
            "the killed upload should be in the bucket before the restart"
        );
    } else {
        assert_eq!(upload_id, None, "file:// has no multipart ids");
    }
    // Against s3s-fs, the store also forgets the upload while the operator is down, as s3s-fs
    // does when a completion is cut short (it drops the upload before writing the object):
    // it answers the restarted operator's abort with 403, which must neither block the
    // snapshot nor pass unsaid. moto keeps the upload for the operator to abort.
    let forgotten = kind == Kind::S3;
    if forgotten {
        let id = upload_id.as_deref().unwrap_or_default().to_string();
        b.store
            .multipart()
            .expect("multipart")
            .abort_multipart(&keys.object, &id)
            .await
            .expect("abort the upload behind the operator's back");
    }
    start(&mut env, &b);
    let s = env.wait_for::<SandboxSnapshot>("k1", 900, finished).await;
    let st = s.status.as_ref().unwrap();
    match st.phase {
        Some(SnapshotPhase::Ready) => check_committed(&b, &env, &s).await,
        other => {
            assert_eq!(other, Some(SnapshotPhase::Failed));
            assert_eq!(b.store.size(&keys.object).await.unwrap(), None);
        }
    }
    assert_eq!(
        b.store.size(&keys.temp).await.unwrap(),
        None,
        "temporary object left"
    );
    assert_eq!(st.upload_id, None, "a finished snapshot records no upload");
    if let Some(id) = at_kill.status.as_ref().and_then(|s| s.upload_id.as_deref()) {
        assert!(!upload_alive(&b, &keys.object, id), "upload {id} left");
    }
    if let Some(dir) = &b.dir {
        let tmp_dir = dir.join(keys.temp.as_ref()).parent().unwrap().to_path_buf();
        let left: Vec<String> = std::fs::read_dir(&tmp_dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp"))
            .collect();
        assert!(left.is_empty(), "staged upload files left: {left:?}");
    }
    let refused = events(&env, "k1", "UploadAbortRefused").await;
    assert_eq!(
        !refused.is_empty(),
        forgotten,
        "an UploadAbortRefused Event exactly when the store refused the abort: {refused:?}"
    );
    finish(env, &b).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn an_operator_killed_mid_upload_never_leaves_a_bad_ready_snapshot_file() {
    killed_mid_upload(Kind::File).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn an_operator_killed_mid_upload_never_leaves_a_bad_ready_snapshot_s3() {
    killed_mid_upload(Kind::S3).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn an_operator_killed_mid_upload_never_leaves_a_bad_ready_snapshot_s3_moto() {
    killed_mid_upload(Kind::S3Moto).await;
}

/// Waits until a snapshot no longer exists (its finalizer ran).
async fn gone(env: &TestEnv, name: &str, secs: u64) {
    let api = env.api::<SandboxSnapshot>();
    for _ in 0..secs * 5 {
        if api.get_opt(name).await.expect("get snapshot").is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{name} still exists after {secs}s\n{}", env.operator_logs());
}

async fn ready_of_scope(env: &TestEnv, key: &str) -> Vec<String> {
    let mut v: Vec<String> = env
        .api::<SandboxSnapshot>()
        .list(&ListParams::default().labels(&format!("{}={key}", labels::SCOPE_KEY)))
        .await
        .expect("list")
        .items
        .into_iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter(|s| s.status.as_ref().and_then(|st| st.phase) == Some(SnapshotPhase::Ready))
        .map(|s| s.name_any())
        .collect();
    v.sort();
    v
}

async fn retention(kind: Kind) {
    let mut env = TestEnv::new(&format!("snap-ret-{}", format!("{kind:?}").to_lowercase())).await;
    let b = backend(kind, &env.ns);
    start(&mut env, &b);
    create_sandbox(
        &env,
        "t",
        spec("dave", json!({"snapshot": {"retention": {"keepLast": 2}}})),
    )
    .await
    .expect("create");
    let t = ready(&env, "t").await;
    fill(&env, &pod_of(&t), "echo v1 > /workspace/v").await;
    let key = labels::scope_key(&t.spec.scope);
    let s1 = take_snapshot(&env, "s1", "t", "Delete").await;
    let k1 = keys_of(&b, &env, &s1);
    take_snapshot(&env, "s2", "t", "Delete").await;
    take_snapshot(&env, "s3", "t", "Delete").await;
    gone(&env, "s1", 120).await;
    assert_eq!(ready_of_scope(&env, &key).await, vec!["s2", "s3"]);
    assert_eq!(
        b.store.size(&k1.object).await.unwrap(),
        None,
        "Delete removes the object"
    );
    assert_eq!(b.store.size(&k1.manifest).await.unwrap(), None);

    // Retain keeps the object when the resource goes; Delete removes it.
    let keep = take_snapshot(&env, "keep", "t", "Retain").await;
    gone(&env, "s2", 120).await;
    let drop = take_snapshot(&env, "drop", "t", "Delete").await;
    gone(&env, "s3", 120).await;
    assert_eq!(ready_of_scope(&env, &key).await, vec!["drop", "keep"]);
    let (kk, kd) = (keys_of(&b, &env, &keep), keys_of(&b, &env, &drop));
    let api = env.api::<SandboxSnapshot>();
    api.delete("keep", &DeleteParams::default())
        .await
        .expect("delete keep");
    api.delete("drop", &DeleteParams::default())
        .await
        .expect("delete drop");
    gone(&env, "keep", 120).await;
    gone(&env, "drop", 120).await;
    assert!(
        b.store.size(&kk.object).await.unwrap().is_some(),
        "Retain kept the object"
    );
    assert!(b.store.get_manifest(&kk.manifest).await.unwrap().is_some());
    assert_eq!(
        b.store.size(&kd.object).await.unwrap(),
        None,
        "Delete removed the object"
    );
    b.store
        .delete_snapshot(&kk)
        .await
        .expect("tidy the retained object");

    // A workspace the restore would refuse (an absolute symlink) is not stored as a Ready
    // snapshot that can never come back: the snapshot fails at once, naming the member.
    fill(&env, &pod_of(&t), "ln -s /etc/hostname /workspace/abs-link").await;
    let obj: SandboxSnapshot = serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1",
        "kind": "SandboxSnapshot",
        "metadata": {"name": "unrestorable"},
        "spec": {"sandboxRef": {"name": "t"}},
    }))
    .expect("snapshot json");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create");
    let bad = env
        .wait_for::<SandboxSnapshot>("unrestorable", 300, finished)
        .await;
    let st = bad.status.as_ref().expect("status");
    assert_eq!(st.phase, Some(SnapshotPhase::Failed), "{bad:#?}");
    assert_eq!(st.attempts, Some(1), "a refusal is not retried");
    let c = st
        .conditions
        .iter()
        .find(|c| c.type_ == "Committed")
        .expect("Committed condition");
    assert_eq!(c.reason, "SymlinkEscapes", "{c:?}");
    assert!(c.message.contains("abs-link"), "{c:?}");
    let kb = b.store.keys(&env.ns, &key, &bad.uid().expect("uid"));
    assert_eq!(b.store.size(&kb.object).await.unwrap(), None);
    assert_eq!(b.store.size(&kb.temp).await.unwrap(), None);
    finish(env, &b).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn retention_keeps_n_and_deletion_policies_behave_file() {
    retention(Kind::File).await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn retention_keeps_n_and_deletion_policies_behave_s3() {
    retention(Kind::S3).await;
}

/// What [`suspended`] writes: files, a directory, links inside the workspace, a mode.
const AT_REST: &str = r#"set -e
cd /workspace
mkdir -p src/deep 'with space'
head -c 1048576 /dev/urandom > src/blob.bin
echo 'echo hi' > run.sh && chmod 0755 run.sh
echo spaced > 'with space/file name'
: > empty
ln -s deep src/link-to-deep
ln -s ../run.sh src/deep/up
"#;

async fn suspended(kind: Kind) {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let name = format!("snap-rest-{}", format!("{kind:?}").to_lowercase());
    let mut env = TestEnv::new(&name).await;
    let b = backend(kind, &env.ns);
    start(&mut env, &b);
    create_sandbox(&env, "a", spec("rest", json!({})))
        .await
        .expect("create a");
    let a = ready(&env, "a").await;
    let pod_a = pod_of(&a);
    fill(&env, &pod_a, AT_REST).await;
    let before = listing(&env, &pod_a).await;
    assert!(before.contains("L ./src/link-to-deep deep"), "{before}");

    let patch = json!({"spec": {"lifecycle": {"mode": "Suspended"}}});
    env.api::<Sandbox>()
        .patch("a", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("suspend");
    env.wait_for::<Sandbox>("a", 300, phase_is("Suspended"))
        .await;
    gone_pod(&env, &pod_a, 120).await;

    // Every pod of the sandbox, or archive pod, that appears from now until the snapshot is
    // Ready (the namespace's network check has pods of its own, of no sandbox). The archive
    // pod must not carry the sandbox's label: the sandbox's Service selects by it.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let watch = {
        let seen = seen.clone();
        let pods = env.api::<Pod>();
        let of_a = labels::sandbox_label_value("a");
        let helper = agentbox_operator::controller::helper_pod::HELPER_LABEL;
        tokio::spawn(async move {
            let mut w = watcher(pods, watcher::Config::default()).boxed();
            while let Some(ev) = w.next().await {
                if let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev {
                    let l = p.labels();
                    let archive = l.get(helper).map(String::as_str) == Some("archive");
                    let n = if archive && l.contains_key(labels::SANDBOX) {
                        format!("{} (with the sandbox's label)", p.name_any())
                    } else if archive || l.get(labels::SANDBOX) == Some(&of_a) {
                        p.name_any()
                    } else {
                        continue;
                    };
                    let mut s = seen.lock().expect("seen");
                    if !s.contains(&n) {
                        s.push(n);
                    }
                }
            }
        })
    };
    let s = take_snapshot(&env, "s1", "a", "Delete").await;
    watch.abort();
    check_committed(&b, &env, &s).await;
    let seen = seen.lock().expect("seen").clone();
    let uid = s.uid().expect("uid");
    assert!(
        seen.iter().all(|n| *n == format!("snap-archive-{uid}")),
        "only the archive pod may run, never the sandbox's ({pod_a}): {seen:?}"
    );
    assert!(
        !seen.is_empty(),
        "the snapshot went through the archive pod"
    );
    let a = env.api::<Sandbox>().get("a").await.expect("get a");
    assert_eq!(
        a.status.as_ref().and_then(|st| st.phase),
        Some(SandboxPhase::Suspended)
    );
    // No orphan: the archive pod goes with the attempt.
    gone_pod(&env, &format!("snap-archive-{uid}"), 60).await;

    // What the rules refuse is refused through the helper too, and the failed attempt's pod
    // goes as well: a FIFO put in the suspended workspace (on the node, where it lies).
    let host = agentbox_operator::controller::pod::workspace_host_path(
        NODE_ROOT,
        &env.ns,
        &a.uid().expect("uid of a"),
    );
    let made = std::process::Command::new("mkfifo")
        .arg(format!("{host}/pipe"))
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let obj: SandboxSnapshot = serde_json::from_value(json!({
        "apiVersion": "agentbox.dev/v1alpha1", "kind": "SandboxSnapshot",
        "metadata": {"name": "s2"}, "spec": {"sandboxRef": {"name": "a"}},
    }))
    .expect("snapshot json");
    env.api::<SandboxSnapshot>()
        .create(&PostParams::default(), &obj)
        .await
        .expect("create s2");
    let s2 = env.wait_for::<SandboxSnapshot>("s2", 300, finished).await;
    let st = s2.status.clone().unwrap_or_default();
    assert_eq!(st.phase, Some(SnapshotPhase::Failed), "{s2:#?}");
    assert!(
        st.conditions.iter().any(|c| c.reason == "Fifo"),
        "{:?}",
        st.conditions
    );
    gone_pod(
        &env,
        &format!("snap-archive-{}", s2.uid().expect("uid")),
        60,
    )
    .await;
    std::fs::remove_file(format!("{host}/pipe")).expect("rm fifo");

    // Restored into a new sandbox of the scope: the same tree, links still links.
    create_sandbox(&env, "b", spec("rest", json!({})))
        .await
        .expect("create b");
    let sb = ready(&env, "b").await;
    assert_eq!(branch(&sb), Some(StartBranch::Restored), "{sb:#?}");
    let after = listing(&env, &pod_of(&sb)).await;
    assert_eq!(before, after, "restored workspace differs");
    finish(env, &b).await;
}

/// Waits until pod `name` is gone.
async fn gone_pod(env: &TestEnv, name: &str, secs: u64) {
    for _ in 0..secs * 5 {
        if env
            .api::<Pod>()
            .get_opt(name)
            .await
            .expect("get pod")
            .is_none()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("pod {name} still there after {secs}s");
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_suspended_sandbox_is_snapshotted_without_starting_its_pod_file() {
    suspended(Kind::File).await;
}
