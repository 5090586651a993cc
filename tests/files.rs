//! The workspace file API against a real pod: read/write/list, directory upload/download as
//! tar, and confinement (`..`, absolute paths outside the root, symlink escapes).

mod barepod;
mod common;

use agentbox_api::exec::{self, ExecRequest, SANDBOX_CONTAINER};
use agentbox_client::client::{ClientError, EntryKind, PathError, Workspace};

#[tokio::test]
#[ignore = "needs a cluster"]
async fn files_are_confined_to_the_workspace() {
    let env = common::TestEnv::new("files").await;
    let pods = barepod::start(&env.client, &env.ns, "box").await;
    let ws = Workspace::new(pods.clone(), "box", SANDBOX_CONTAINER, "/workspace");

    // Write (creating parents), read back, overwrite, list.
    let blob: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    ws.write_file("a/b/c.bin", blob.clone())
        .await
        .expect("write");
    assert_eq!(ws.read_file("a/b/c.bin").await.expect("read"), blob);
    ws.write_file("/workspace/a/b/c.bin", "short")
        .await
        .expect("overwrite");
    assert_eq!(ws.read_file("./a/b/c.bin").await.expect("read"), b"short");
    ws.write_file("a/empty", Vec::new())
        .await
        .expect("empty file");
    let list = ws.list_dir("a").await.expect("list");
    let names: Vec<(&str, EntryKind)> = list.iter().map(|e| (e.name.as_str(), e.kind)).collect();
    assert_eq!(names, [("b", EntryKind::Dir), ("empty", EntryKind::File)]);
    assert!(matches!(
        ws.read_file("nope").await,
        Err(ClientError::NotFound(_))
    ));
    assert!(matches!(
        ws.read_file("a").await,
        Err(ClientError::NotFound(_))
    ));
    assert!(matches!(
        ws.list_dir("a/empty").await,
        Err(ClientError::NotFound(_))
    ));

    // Refused before anything reaches the pod.
    assert!(matches!(
        ws.read_file("../x").await,
        Err(ClientError::Path(PathError::DotDot(_)))
    ));
    assert!(matches!(
        ws.write_file("a/../../x", "x").await,
        Err(ClientError::Path(PathError::DotDot(_)))
    ));
    assert!(matches!(
        ws.read_file("/etc/passwd").await,
        Err(ClientError::Path(PathError::OutsideRoot(..)))
    ));

    // Symlinks that lead out of the workspace, made inside the pod.
    let out = exec::run(
        &pods,
        "box",
        SANDBOX_CONTAINER,
        ExecRequest::shell("cd /workspace && ln -s /etc out && ln -s /etc/passwd pw && ln -s a inside && ln -s /nonexistent dangling"),
    )
    .await
    .expect("symlinks");
    assert!(out.status.success(), "{}", out.stderr_str());
    let escapes =
        |r: Result<_, ClientError>| matches!(r, Err(ClientError::Path(PathError::Escapes(_))));
    let escapes_ref =
        |r: &Result<(), ClientError>| matches!(r, Err(ClientError::Path(PathError::Escapes(_))));
    assert!(escapes(ws.read_file("pw").await.map(|_| ())));
    assert!(escapes(ws.read_file("out/passwd").await.map(|_| ())));
    assert!(escapes(ws.write_file("out/evil", "x").await));
    assert!(escapes(ws.write_file("out/new/dir/evil", "x").await));
    assert!(escapes(ws.list_dir("out").await.map(|_| ())));
    assert!(escapes(ws.write_file("dangling", "x").await));
    let tmp = std::env::temp_dir().join(format!("agentbox-files-{}", env.ns));
    std::fs::create_dir_all(&tmp).expect("tmp");
    let up = ws.upload_dir(&tmp, "out/up").await;
    assert!(escapes_ref(&up), "{up:?}");
    let down = ws.download_dir("out", &tmp.join("dl")).await;
    assert!(escapes_ref(&down), "{down:?}");
    // Nothing was written outside.
    let out = exec::run(
        &pods,
        "box",
        SANDBOX_CONTAINER,
        ExecRequest::shell("ls /etc/evil /etc/new 2>&1; true"),
    )
    .await
    .expect("ls");
    assert!(
        out.stdout_str().contains("No such file"),
        "{}",
        out.stdout_str()
    );
    // A symlink that stays inside is fine.
    assert_eq!(
        ws.read_file("inside/empty").await.expect("inside link"),
        b""
    );
    let list = ws.list_dir("").await.expect("list root");
    assert!(
        list.iter()
            .any(|e| e.name == "out" && e.kind == EntryKind::Symlink)
    );

    // Upload a directory tree and download it again.
    let src = tmp.join("src");
    std::fs::create_dir_all(src.join("sub/deeper")).expect("mkdir");
    std::fs::write(src.join("top.txt"), "top").expect("write");
    std::fs::write(src.join("sub/deeper/data.bin"), &blob).expect("write");
    std::os::unix::fs::symlink("../top.txt", src.join("sub/link")).expect("symlink");
    ws.upload_dir(&src, "tree").await.expect("upload");
    // Through a spool in the state directory, gone once extracted.
    let spools = exec::run(
        &pods,
        "box",
        SANDBOX_CONTAINER,
        ExecRequest::shell("ls -A /workspace/.agentbox/tmp"),
    )
    .await
    .expect("ls");
    assert!(spools.status.success(), "{}", spools.stderr_str());
    assert_eq!(spools.stdout_str(), "");
    // A tar that fails midway (every top-level directory of the archive is a file in the
    // destination) is reported, not waited on: the archive is read whole into the spool first,
    // so no stream is left unread however early tar stops (straight into `tar -x`, an upload
    // of more than the pipes hold hung there).
    let many = tmp.join("many");
    for i in 0..8 {
        std::fs::create_dir_all(many.join(format!("d{i}"))).expect("mkdir");
        std::fs::write(many.join(format!("d{i}/blob")), vec![i as u8; 1 << 20]).expect("write");
    }
    let out = exec::run(
        &pods,
        "box",
        SANDBOX_CONTAINER,
        ExecRequest::shell(
            "mkdir -p /workspace/clash && cd /workspace/clash && touch d0 d1 d2 d3 d4 d5 d6 d7",
        ),
    )
    .await
    .expect("clash");
    assert!(out.status.success(), "{}", out.stderr_str());
    let failed = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        ws.upload_dir(&many, "clash"),
    )
    .await
    .expect("a failed extraction is reported, not waited on");
    assert!(
        matches!(&failed, Err(ClientError::Remote { .. })),
        "{failed:?}"
    );
    // The same upload into a directory holding a symlink that leads out: refused by the
    // script's symlink check, after it read the stream (it hung there too).
    let out = exec::run(
        &pods,
        "box",
        SANDBOX_CONTAINER,
        ExecRequest::shell("mkdir -p /workspace/esc && ln -s /etc /workspace/esc/out"),
    )
    .await
    .expect("esc");
    assert!(out.status.success(), "{}", out.stderr_str());
    let refused = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        ws.upload_dir(&many, "esc"),
    )
    .await
    .expect("a refusal is reported, not waited on");
    assert!(escapes_ref(&refused), "{refused:?}");
    assert_eq!(
        ws.read_file("tree/sub/deeper/data.bin")
            .await
            .expect("read"),
        blob
    );
    assert_eq!(
        ws.read_file("tree/sub/link").await.expect("via link"),
        b"top"
    );
    let dst = tmp.join("dst");
    ws.download_dir("tree", &dst).await.expect("download");
    assert_eq!(std::fs::read(dst.join("top.txt")).expect("top"), b"top");
    assert_eq!(
        std::fs::read(dst.join("sub/deeper/data.bin")).expect("data"),
        blob
    );
    assert_eq!(
        std::fs::read_link(dst.join("sub/link")).expect("link"),
        std::path::PathBuf::from("../top.txt")
    );
    let _ = std::fs::remove_dir_all(&tmp);
    env.finish().await;
}

/// A directory upload spools its archive in the pod before extracting it: on a workspace whose
/// disk is too small for the archive (a 1 MiB memory-backed emptyDir, a real ENOSPC), the
/// upload fails with `UploadSpool` naming the cause, extracts nothing and leaves no spool; the
/// disk is free again afterwards, and an upload that fits goes through the spool and leaves
/// none behind.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn an_upload_to_a_full_disk_fails_cleanly_and_extracts_nothing() {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::PostParams;
    let env = common::TestEnv::new("files-full").await;
    let pods: kube::Api<Pod> = env.api();
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "small"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": SANDBOX_CONTAINER,
                "image": common::BASE_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done"],
                "volumeMounts": [{"name": "small", "mountPath": "/small"}],
            }],
            "volumes": [{"name": "small", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}],
        },
    }))
    .expect("pod json");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    tokio::time::timeout(
        std::time::Duration::from_secs(120),
        kube::runtime::wait::await_condition(
            pods.clone(),
            "small",
            kube::runtime::conditions::is_pod_running(),
        ),
    )
    .await
    .expect("pod running in time")
    .expect("pod watch");
    // Under runc even in hack/test's gVisor matrix: the size of a memory-backed emptyDir is
    // the kernel's tmpfs limit there, which is what this test needs.
    let ws = Workspace::new(pods.clone(), "small", SANDBOX_CONTAINER, "/small");

    let tmp = std::env::temp_dir().join(format!("agentbox-files-full-{}", env.ns));
    let big = tmp.join("big");
    std::fs::create_dir_all(big.join("d")).expect("mkdir");
    std::fs::write(big.join("a.txt"), "first").expect("write");
    std::fs::write(big.join("d/blob"), vec![7u8; 2 << 20]).expect("write");
    let r = ws.upload_dir(&big, "dst").await;
    let Err(ClientError::UploadSpool(msg)) = &r else {
        panic!("not an UploadSpool error: {r:?}");
    };
    assert!(
        msg.contains("No space left on device") && msg.contains("spool"),
        "{msg}"
    );
    assert!(r.unwrap_err().to_string().contains("disk full"));
    let left = |script: &'static str| {
        let pods = pods.clone();
        async move {
            let out = exec::run(
                &pods,
                "small",
                SANDBOX_CONTAINER,
                ExecRequest::shell(script),
            )
            .await
            .expect("exec");
            assert!(out.status.success(), "{}", out.stderr_str());
            out.stdout_str().trim().to_string()
        }
    };
    // Nothing extracted (the destination was made, empty), no spool left.
    assert_eq!(
        left("ls -A /small/dst; ls -A /small/.agentbox/tmp").await,
        ""
    );

    // The disk is free again: an upload that fits goes through.
    let fits = tmp.join("fits");
    std::fs::create_dir_all(fits.join("d")).expect("mkdir");
    std::fs::write(fits.join("d/small.bin"), vec![1u8; 100 << 10]).expect("write");
    ws.upload_dir(&fits, "dst").await.expect("upload that fits");
    assert_eq!(
        ws.read_file("dst/d/small.bin").await.expect("read"),
        vec![1u8; 100 << 10]
    );
    assert_eq!(left("ls -A /small/.agentbox/tmp").await, "");
    let _ = std::fs::remove_dir_all(&tmp);
    env.finish().await;
}
