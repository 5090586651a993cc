//! Workspace initialisation, the pure half of [`super::init`]: which start branch to take, and
//! what to write.
//!
//! After a sandbox pod runs, the operator probes the workspace for its marker and then writes
//! files with one exec of `tar -x` fed from stdin, or, in a claimed warm pod, small files
//! inline in the pool's open shell ([`files_via`]). Everything here is pure; the reconciler
//! does the I/O.

use sha2::{Digest, Sha256};

use agentbox_api::crd::{StartBranch, WhenLost};

pub use agentbox_api::paths::normalize;
use agentbox_api::remote::InlineFile;
pub use agentbox_api::remote::{FilesVia, MARKER, STATE_DIR};

/// A file to write into the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// Path relative to the workspace root, normalised (no `./`, no trailing slash).
    pub path: String,
    /// Content.
    pub data: Vec<u8>,
    /// Permission bits.
    pub mode: u32,
    /// Re-written on every start.
    pub ephemeral: bool,
}

/// A ConfigMap's content, resolved, for one projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedProjection {
    /// Name of the ConfigMap.
    pub config_map: String,
    /// Directory relative to the workspace root.
    pub dir: String,
    /// Keys and values, sorted by key.
    pub entries: Vec<(String, Vec<u8>)>,
}

/// What the workspace looked like and what the sandbox remembers of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed<'a> {
    /// The marker file exists in the workspace.
    pub marker_present: bool,
    /// Status says this sandbox's workspace was initialised before.
    pub root_was_ready: bool,
    /// A snapshot to restore, when the sandbox's restore policy finds one.
    pub snapshot: Option<&'a str>,
    /// Snapshot restore is available in this operator.
    pub can_restore: bool,
}

/// The decided start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Branch recorded in status.
    pub branch: StartBranch,
    /// Snapshot to restore before writing files.
    pub restore: Option<String>,
    /// Write every file (fresh workspace), or only the ephemeral ones.
    pub all_files: bool,
    /// Condition reason for WorkspaceReady.
    pub reason: &'static str,
    /// Human-readable account of the start, for the condition message and the Event.
    pub message: String,
}

/// Decides the start branch (Reattached: reuse, Recovered: a lost workspace restored,
/// Restored: a fresh one restored, Fresh). Where a snapshot would be restored but none exists,
/// the start falls back to Fresh and the message says why.
pub fn decide(o: Observed<'_>) -> Decision {
    if o.marker_present {
        return Decision {
            branch: StartBranch::Reattached,
            restore: None,
            all_files: false,
            reason: "WorkspaceReused",
            message: "existing workspace reused; ephemeral files re-applied".into(),
        };
    }
    let restorable = o.snapshot.filter(|_| o.can_restore);
    match (o.root_was_ready, restorable) {
        (true, Some(snap)) => Decision {
            branch: StartBranch::Recovered,
            restore: Some(snap.to_string()),
            all_files: false,
            reason: "WorkspaceRecovered",
            message: format!("workspace was lost; restored from snapshot {snap}"),
        },
        (false, Some(snap)) => Decision {
            branch: StartBranch::Restored,
            restore: Some(snap.to_string()),
            all_files: true,
            reason: "WorkspaceRestored",
            message: format!("fresh workspace restored from snapshot {snap}; files written"),
        },
        (lost, None) => {
            let why = match (lost, o.snapshot, o.can_restore) {
                (true, Some(s), false) => {
                    format!(
                        "workspace was lost; snapshot {s} exists but this operator cannot restore snapshots; "
                    )
                }
                (true, _, _) => "workspace was lost and there is no snapshot to restore; ".into(),
                (false, Some(s), false) => {
                    format!("snapshot {s} exists but this operator cannot restore snapshots; ")
                }
                (false, _, _) => String::new(),
            };
            Decision {
                branch: StartBranch::Fresh,
                restore: None,
                all_files: true,
                reason: if lost {
                    "WorkspaceReinitialized"
                } else {
                    "WorkspaceInitialized"
                },
                message: format!("{why}fresh workspace initialised from the spec"),
            }
        }
    }
}

/// Why a start is refused: the workspace was lost (`root_was_ready`), there is nothing to
/// restore (`decision` is branch D), and the sandbox's `snapshot.whenLost` is `Fail`. `None`:
/// the start goes ahead.
pub fn refused_when_lost(
    decision: &Decision,
    root_was_ready: bool,
    policy: WhenLost,
) -> Option<String> {
    (decision.branch == StartBranch::Fresh && root_was_ready && policy == WhenLost::Fail).then(|| {
        format!(
            "{}; not started, since snapshot.whenLost is Fail: take or name a snapshot, or set whenLost to StartFresh",
            decision.message.trim_end_matches("; fresh workspace initialised from the spec")
        )
    })
}

/// SHA-256 over every projection's ConfigMap name, directory and content, length-prefixed so
/// that moving bytes between keys or values changes the hash. `None` without projections.
pub fn projection_hash(projections: &[ResolvedProjection]) -> Option<String> {
    if projections.is_empty() {
        return None;
    }
    let mut h = Sha256::new();
    let mut put = |b: &[u8]| {
        h.update((b.len() as u64).to_be_bytes());
        h.update(b);
    };
    for p in projections {
        put(p.config_map.as_bytes());
        put(p.dir.as_bytes());
        for (k, v) in &p.entries {
            put(k.as_bytes());
            put(v);
        }
    }
    Some(hex::encode(h.finalize()))
}

/// The writes of one initialisation: a tar archive for stdin and the arguments of
/// [`agentbox_api::remote::INIT_SCRIPT`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writes {
    /// Projection directories to empty before extraction (they are replaced whole).
    pub replace_dirs: Vec<String>,
    /// Parent directories to create (`mkdir -p`, which follows the user's symlinks as a user
    /// would expect, instead of tar replacing them).
    pub parents: Vec<String>,
    /// The files, in archive order.
    pub files: Vec<FileEntry>,
}

impl Writes {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.replace_dirs.is_empty() && self.files.is_empty()
    }
}

/// Chooses what to write: all files on a fresh workspace, else only the ephemeral ones; the
/// projections when the workspace is fresh or their hash changed.
pub fn plan_writes(
    decision: &Decision,
    files: &[FileEntry],
    projections: &[ResolvedProjection],
    projections_changed: bool,
) -> Writes {
    let mut out: Vec<FileEntry> = files
        .iter()
        .filter(|f| decision.all_files || f.ephemeral)
        .cloned()
        .collect();
    let mut replace_dirs = Vec::new();
    if decision.all_files || decision.branch == StartBranch::Recovered || projections_changed {
        for p in projections {
            replace_dirs.push(p.dir.clone());
            for (k, v) in &p.entries {
                out.push(FileEntry {
                    path: format!("{}/{k}", p.dir),
                    data: v.clone(),
                    mode: 0o644,
                    ephemeral: false,
                });
            }
        }
    }
    let mut parents: Vec<String> = out
        .iter()
        .filter_map(|f| f.path.rsplit_once('/').map(|(dir, _)| dir.to_string()))
        .chain(replace_dirs.iter().cloned())
        .collect();
    parents.sort();
    parents.dedup();
    Writes {
        replace_dirs,
        parents,
        files: out,
    }
}

/// Builds the tar archive of the files (regular files only, owned by root, with their modes,
/// modified at `mtime` seconds since the epoch).
pub fn archive(files: &[FileEntry], mtime: u64) -> std::io::Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for f in files {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_size(f.data.len() as u64);
        h.set_mode(f.mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(mtime);
        b.append_data(&mut h, &f.path, f.data.as_slice())?;
    }
    b.into_inner()
}

/// The most file content a start passes inline ([`agentbox_api::remote::FilesVia::Inline`]), in
/// bytes: each byte may take four in the script, which goes through the shell's stdin.
pub const INLINE_MAX: usize = 16 * 1024;

/// How the files of `w` reach [`agentbox_api::remote::INIT_SCRIPT`]: inline when there is an open
/// shell to run it in (a claimed warm pod's) and they are small, else as an archive.
pub fn files_via(w: &Writes, shell: bool) -> FilesVia {
    if w.files.is_empty() {
        FilesVia::None
    } else if shell && w.files.iter().map(|f| f.data.len()).sum::<usize>() <= INLINE_MAX {
        FilesVia::Inline
    } else {
        FilesVia::Archive
    }
}

/// Arguments of [`agentbox_api::remote::INIT_SCRIPT`] for `w`, its files arriving `via`.
pub fn script_args(root: &str, marker: &str, w: &Writes, via: FilesVia) -> Vec<String> {
    let inline: Vec<InlineFile<'_>> = w
        .files
        .iter()
        .filter(|_| via == FilesVia::Inline)
        .map(|f| InlineFile {
            path: &f.path,
            mode: f.mode,
            data: &f.data,
        })
        .collect();
    agentbox_api::remote::init_args(root, marker, via, (&w.replace_dirs, &w.parents), &inline)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(marker: bool, ready: bool, snap: Option<&str>, can: bool) -> Decision {
        decide(Observed {
            marker_present: marker,
            root_was_ready: ready,
            snapshot: snap,
            can_restore: can,
        })
    }

    #[test]
    fn the_four_branches() {
        assert_eq!(
            obs(true, true, Some("s"), true).branch,
            StartBranch::Reattached
        );
        assert_eq!(
            obs(true, false, None, false).branch,
            StartBranch::Reattached
        );
        let b = obs(false, true, Some("s1"), true);
        assert_eq!(
            (b.branch, b.restore.as_deref(), b.all_files),
            (StartBranch::Recovered, Some("s1"), false)
        );
        let c = obs(false, false, Some("s1"), true);
        assert_eq!(
            (c.branch, c.restore.as_deref(), c.all_files),
            (StartBranch::Restored, Some("s1"), true)
        );
        let d = obs(false, false, None, true);
        assert_eq!(
            (d.branch, d.restore, d.all_files),
            (StartBranch::Fresh, None, true)
        );
        assert_eq!(d.reason, "WorkspaceInitialized");
    }

    #[test]
    fn a_lost_workspace_without_snapshot_is_refused_only_when_the_policy_says_fail() {
        let lost = obs(false, true, None, true);
        let why = refused_when_lost(&lost, true, WhenLost::Fail).unwrap();
        assert!(
            why.starts_with("workspace was lost and there is no snapshot to restore")
                && why.contains("whenLost is Fail"),
            "{why}"
        );
        assert_eq!(refused_when_lost(&lost, true, WhenLost::StartFresh), None);
        // A first start (nothing was lost) and a recovery from a snapshot go ahead.
        let first = obs(false, false, None, true);
        assert_eq!(refused_when_lost(&first, false, WhenLost::Fail), None);
        let b = obs(false, true, Some("s"), true);
        assert_eq!(refused_when_lost(&b, true, WhenLost::Fail), None);
    }

    #[test]
    fn lost_workspace_without_snapshot_falls_back_to_d_and_says_so() {
        let d = obs(false, true, None, true);
        assert_eq!(d.branch, StartBranch::Fresh);
        assert_eq!(d.reason, "WorkspaceReinitialized");
        assert!(d.message.contains("no snapshot"), "{}", d.message);
        let d = obs(false, true, Some("s9"), false);
        assert_eq!(d.branch, StartBranch::Fresh);
        assert!(d.message.contains("cannot restore"), "{}", d.message);
    }

    fn file(path: &str, eph: bool) -> FileEntry {
        FileEntry {
            path: path.into(),
            data: b"x".to_vec(),
            mode: 0o600,
            ephemeral: eph,
        }
    }

    fn proj() -> ResolvedProjection {
        ResolvedProjection {
            config_map: "cm".into(),
            dir: "conf".into(),
            entries: vec![("a".into(), b"1".to_vec()), ("b".into(), b"2".to_vec())],
        }
    }

    #[test]
    fn branch_a_writes_only_ephemeral_files_and_changed_projections() {
        let files = [file("a/b/keep.txt", false), file("tmp/eph", true)];
        let a = obs(true, true, None, false);
        let w = plan_writes(&a, &files, &[proj()], false);
        assert_eq!(
            w.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
            vec!["tmp/eph"]
        );
        assert!(w.replace_dirs.is_empty());
        assert_eq!(w.parents, vec!["tmp"]);
        let w = plan_writes(&a, &files, &[proj()], true);
        assert_eq!(w.replace_dirs, vec!["conf"]);
        assert_eq!(w.files.len(), 3);
        let d = obs(false, false, None, false);
        let w = plan_writes(&d, &files, &[proj()], false);
        assert_eq!(w.files.len(), 4);
        assert_eq!(w.parents, vec!["a/b", "conf", "tmp"]);
        assert!(!w.is_empty());
        assert!(plan_writes(&a, &[file("x", false)], &[], false).is_empty());
    }

    #[test]
    fn projection_hash_tracks_content() {
        assert_eq!(projection_hash(&[]), None);
        let h = projection_hash(&[proj()]).unwrap();
        let mut p = proj();
        p.entries[0].1 = b"changed".to_vec();
        assert_ne!(Some(h.clone()), projection_hash(&[p]));
        // Moving a byte from a key to its value changes the hash too.
        let mut q = proj();
        q.entries = vec![("a1".into(), Vec::new()), ("b".into(), b"2".to_vec())];
        assert_ne!(Some(h), projection_hash(&[q]));
    }

    #[test]
    fn archive_round_trips_paths_modes_and_bytes() {
        let files = vec![
            FileEntry {
                path: "dir/run.sh".into(),
                data: b"#!/bin/sh\n".to_vec(),
                mode: 0o755,
                ephemeral: false,
            },
            FileEntry {
                path: "bin".into(),
                data: vec![0, 159, 255],
                mode: 0o600,
                ephemeral: true,
            },
        ];
        let bytes = archive(&files, 1_700_000_000).unwrap();
        let mut ar = tar::Archive::new(bytes.as_slice());
        let got: Vec<(String, u32, Vec<u8>)> = ar
            .entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let mut data = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut data).unwrap();
                (
                    e.path().unwrap().display().to_string(),
                    e.header().mode().unwrap(),
                    data,
                )
            })
            .collect();
        assert_eq!(
            got[0],
            ("dir/run.sh".into(), 0o755, b"#!/bin/sh\n".to_vec())
        );
        assert_eq!(got[1], ("bin".into(), 0o600, vec![0, 159, 255]));
        let mut ar = tar::Archive::new(bytes.as_slice());
        let first = ar.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(first.header().mtime().unwrap(), 1_700_000_000);
    }

    #[test]
    fn script_args_layout() {
        let w = Writes {
            replace_dirs: vec!["conf".into()],
            parents: vec!["a".into()],
            files: vec![],
        };
        assert_eq!(
            script_args("/workspace", "uid", &w, FilesVia::None),
            vec!["/workspace", "uid", "0", "1", "conf", "1", "a"]
        );
        let file = |n: usize| FileEntry {
            path: "f".into(),
            data: vec![b'x'; n],
            mode: 0o644,
            ephemeral: false,
        };
        let small = Writes {
            files: vec![file(10), file(INLINE_MAX - 10)],
            ..w.clone()
        };
        assert_eq!(files_via(&small, true), FilesVia::Inline);
        assert_eq!(
            files_via(&small, false),
            FilesVia::Archive,
            "no shell: an exec"
        );
        let big = Writes {
            files: vec![file(10), file(INLINE_MAX)],
            ..w.clone()
        };
        assert_eq!(files_via(&big, true), FilesVia::Archive);
        assert_eq!(files_via(&w, true), FilesVia::None);
        let one = Writes {
            files: vec![file(2)],
            ..w
        };
        assert_eq!(
            script_args("/w", "uid", &one, FilesVia::Inline),
            vec![
                "/w", "uid", "2", "1", "conf", "1", "a", "f", "0133", "", "xx"
            ]
        );
    }

    /// Runs [`agentbox_api::remote::INIT_SCRIPT`] with the host's `sh` and `tar` on a scratch
    /// directory, the files `via` an archive on stdin (none otherwise, as in the pod) or inline.
    fn run_init(root: &std::path::Path, w: &Writes, via: FilesVia) -> bool {
        use std::io::Write as _;
        let mut child = std::process::Command::new("sh")
            .args(["-c", agentbox_api::remote::INIT_SCRIPT, "sh"])
            .args(script_args(&root.to_string_lossy(), "uid-1", w, via))
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        if via == FilesVia::Archive {
            stdin
                .write_all(&archive(&w.files, 1_700_000_000).unwrap())
                .unwrap();
        }
        drop(stdin);
        child.wait().unwrap().success()
    }

    #[test]
    fn init_script_reads_an_archive_only_when_there_are_files() {
        let dir = std::env::temp_dir().join(format!("agentbox-init-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let none = Writes {
            replace_dirs: vec!["skills".into()],
            parents: vec!["skills".into()],
            files: vec![],
        };
        assert!(
            run_init(&dir, &none, FilesVia::None),
            "no files: no tar, no stdin needed"
        );
        assert!(dir.join("skills").is_dir());
        assert_eq!(std::fs::read_to_string(dir.join(MARKER)).unwrap(), "uid-1");
        let files = Writes {
            replace_dirs: vec![],
            parents: vec!["bin".into()],
            files: vec![FileEntry {
                path: "bin/run".into(),
                data: b"one".to_vec(),
                mode: 0o755,
                ephemeral: false,
            }],
        };
        assert!(run_init(&dir, &files, FilesVia::Archive));
        assert_eq!(std::fs::read_to_string(dir.join("bin/run")).unwrap(), "one");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn inline_files_are_written_byte_for_byte_with_their_modes() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("agentbox-inline-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        // Already there: a file of another mode, and a symbolic link that must not be followed.
        std::fs::write(dir.join("notes.md"), "old").unwrap();
        std::fs::set_permissions(dir.join("notes.md"), std::fs::Permissions::from_mode(0o600))
            .unwrap();
        std::os::unix::fs::symlink("/etc/hostname", dir.join("link")).unwrap();
        let every_byte: Vec<u8> = (0..=255u8).collect();
        let entry = |path: &str, data: &[u8], mode: u32| FileEntry {
            path: path.into(),
            data: data.to_vec(),
            mode,
            ephemeral: false,
        };
        let w = Writes {
            replace_dirs: vec![],
            parents: vec!["bin".into(), "deep/er".into()],
            files: vec![
                entry("bin/run", b"#!/bin/sh\necho '%s' \\n $HOME `x`\n", 0o755),
                entry("deep/er/bytes", &every_byte, 0o600),
                entry("notes.md", b"-n leading dash, 100% \\0 \"quoted\"", 0o644),
                entry("link", b"not through the link", 0o644),
                entry("empty", b"", 0o640),
            ],
        };
        assert_eq!(files_via(&w, true), FilesVia::Inline);
        assert!(run_init(&dir, &w, FilesVia::Inline));
        for f in &w.files {
            let p = dir.join(&f.path);
            assert_eq!(std::fs::read(&p).unwrap(), f.data, "{}", f.path);
            let meta = std::fs::symlink_metadata(&p).unwrap();
            assert!(meta.is_file(), "{}", f.path);
            assert_eq!(meta.permissions().mode() & 0o7777, f.mode, "{}", f.path);
        }
        assert_eq!(std::fs::read_to_string(dir.join(MARKER)).unwrap(), "uid-1");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
