//! The two ways a workspace is read — `tar -c` in the sandbox's pod (`TAR_SCRIPT`, by exec)
//! and the node helper's `archive` job — give the same canonical archive, byte for byte, or
//! the same refusal. Both run here on one temporary tree: `TAR_SCRIPT` with GNU tar (`sh`)
//! and with busybox tar (a `tar` on `PATH` that is busybox), the helper's job as a library
//! call. Needs `busybox` and GNU `tar` on the host, as `differential.rs` does.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use bytes::BytesMut;

use super::{Canonicalizer, Limits, Refusal, Summary};
use agentbox_api::remote::{self, MARKER, STATE_DIR, TAR_SCRIPT};

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("agentbox-two-paths-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join(STATE_DIR)).expect("scratch");
    std::fs::write(d.join(MARKER), "uid-1").expect("marker");
    d
}

/// A directory whose `tar` is busybox's, to put first on `PATH`.
fn busybox_path() -> PathBuf {
    let d = std::env::temp_dir().join(format!("agentbox-two-paths-bin-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    let tar = d.join("tar");
    if !tar.exists() {
        let busybox = Command::new("sh")
            .args(["-c", "command -v busybox"])
            .output()
            .expect("sh");
        let busybox = String::from_utf8_lossy(&busybox.stdout).trim().to_string();
        assert!(!busybox.is_empty(), "busybox is needed on the host");
        symlink(busybox, &tar).expect("tar -> busybox");
    }
    d
}

/// `TAR_SCRIPT`'s archive of `root` (`busybox`: with busybox tar, else GNU tar).
fn exec_path(root: &Path, busybox: bool) -> Vec<u8> {
    let argv = remote::sh(TAR_SCRIPT, remote::tar_args(&root.to_string_lossy(), &[]));
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if busybox {
        let path = std::env::var("PATH").unwrap_or_default();
        cmd.env("PATH", format!("{}:{path}", busybox_path().display()));
    }
    let out = cmd.output().expect("sh");
    assert!(
        out.status.success(),
        "tar -c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// The helper's archive of `root`.
fn helper_path(root: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    agentbox_helper::archive::archive(root, &mut out).expect("helper archive");
    out
}

/// The canonical archive of `tar`, or its refusal's reason.
fn canonical(tar: &[u8]) -> Result<(Vec<u8>, Summary), &'static str> {
    let mut c = Canonicalizer::snapshot(Limits::default());
    let mut out = BytesMut::new();
    // Odd chunk sizes: the result must not depend on how the stream was cut.
    for chunk in tar.chunks(7919) {
        c.feed(chunk, &mut out).map_err(|r: Refusal| r.reason())?;
    }
    let summary = c.finish(&mut out).map_err(|r| r.reason())?;
    Ok((out.to_vec(), summary))
}

/// Asserts that all three readings of `root` canonicalise to the same bytes (or the same
/// refusal); returns that result.
fn same_whichever_path(root: &Path) -> Result<(Vec<u8>, Summary), &'static str> {
    let helper = canonical(&helper_path(root));
    for busybox in [false, true] {
        let exec = canonical(&exec_path(root, busybox));
        let which = if busybox { "busybox" } else { "GNU" };
        match (&exec, &helper) {
            (Ok((e, es)), Ok((h, hs))) => {
                assert_eq!(es, hs, "summaries differ ({which} tar)");
                assert!(e == h, "canonical bytes differ ({which} tar)");
            }
            _ => assert_eq!(
                exec.as_ref().map(|r| &r.1),
                helper.as_ref().map(|r| &r.1),
                "{which} tar"
            ),
        }
    }
    helper
}

#[test]
fn a_workspace_of_files_directories_and_links_is_the_same_archive_either_way() {
    let root = scratch("tree");
    std::fs::create_dir_all(root.join("src/deep/er")).expect("dirs");
    for (i, d) in ["", "src", "src/deep", "src/deep/er"].iter().enumerate() {
        for n in ["b", "a", ".hidden", "..dots", "Z", "with space", "ünï"] {
            std::fs::write(root.join(d).join(n), format!("{d}/{n} {i}")).expect("file");
        }
    }
    std::fs::write(root.join("empty"), "").expect("empty");
    let big: Vec<u8> = (0..(1 << 20) + 3).map(|i| (i % 253) as u8).collect();
    std::fs::write(root.join("src/big"), big).expect("big");
    std::fs::create_dir(root.join("emptydir")).expect("emptydir");
    symlink("src/deep", root.join("link-to-dir")).expect("link");
    symlink("../a", root.join("src/up")).expect("link up");
    symlink("missing", root.join("dangling")).expect("dangling");
    let long = "l".repeat(180);
    std::fs::create_dir(root.join(&long)).expect("long dir");
    std::fs::write(root.join(&long).join("f".repeat(120)), "long").expect("long file");
    symlink(
        format!("{long}/{}", "f".repeat(120)),
        root.join("long-target"),
    )
    .expect("link");
    // Modes beyond the permission bits, and a read-only directory.
    std::fs::set_permissions(
        root.join("src/a"),
        std::os::unix::fs::PermissionsExt::from_mode(0o4751),
    )
    .expect("mode");
    let (bytes, summary) = same_whichever_path(&root).expect("accepted");
    assert!(summary.members > 30, "{summary:?}");
    assert!(!bytes.is_empty());
}

#[test]
fn an_empty_workspace_is_the_same_archive_either_way() {
    let root = scratch("empty");
    let (_, summary) = same_whichever_path(&root).expect("accepted");
    assert_eq!(summary.members, 0);
}

/// A refusal's reason and how to make a workspace that earns it.
type Case<'a> = (&'a str, &'a dyn Fn(&Path));

#[test]
fn what_the_rules_refuse_is_refused_for_the_same_reason_either_way() {
    let cases: [Case<'_>; 4] = [
        ("SymlinkEscapes", &|r: &Path| {
            symlink("/etc", r.join("etc")).expect("link");
        }),
        ("Hardlink", &|r: &Path| {
            std::fs::write(r.join("a"), "x").expect("file");
            std::fs::hard_link(r.join("a"), r.join("b")).expect("hard link");
        }),
        ("Fifo", &|r: &Path| {
            let st = Command::new("mkfifo")
                .arg(r.join("p"))
                .status()
                .expect("mkfifo");
            assert!(st.success());
        }),
        ("InvalidPath", &|r: &Path| {
            let name = std::ffi::OsStr::from_bytes(b"not-utf8-\xff");
            std::fs::write(r.join(name), "x").expect("file");
        }),
    ];
    for (i, (reason, make)) in cases.iter().enumerate() {
        let root = scratch(&format!("refused-{i}"));
        make(&root);
        assert_eq!(same_whichever_path(&root).map(|_| ()), Err(*reason));
    }
}

#[test]
fn a_workspace_without_its_marker_is_refused_either_way() {
    let root = scratch("nomarker");
    std::fs::remove_file(root.join(MARKER)).expect("rm marker");
    let argv = remote::sh(TAR_SCRIPT, remote::tar_args(&root.to_string_lossy(), &[]));
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .output()
        .expect("sh");
    assert!(!out.status.success());
    assert!(matches!(
        agentbox_helper::archive::archive(&root, Vec::new()),
        Err(agentbox_helper::Error::NotAWorkspace(_))
    ));
}
