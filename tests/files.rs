//! The workspace file API against a real pod: read/write/list, directory upload/download as
//! tar, and confinement (`..`, absolute paths outside the root, symlink escapes).

mod barepod;
mod common;

use agentbox_api::exec::{self, ExecRequest, SANDBOX_CONTAINER};
use agentbox_client::client::{ClientError, EntryKind, PathError, Workspace};

#[tokio::test]
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
