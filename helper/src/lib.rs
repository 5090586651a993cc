//! agentbox's node-side helper: the few jobs that need a node's filesystem, run by the operator
//! in short-lived pods of a trusted image (never a sandbox's own image).
//!
//! - [`Job::Remove`]: remove workspace directories from a namespace's directory, without following
//!   symbolic links (a sandbox's code may have planted them anywhere in its workspace);
//! - [`Job::Prepare`]: make a namespace's workspace directory `0700` root-owned, so no other host
//!   user can reach the workspaces under it, and report whether the mount it lives on is
//!   `nosuid,nodev`;
//! - [`Job::Own`]: hand a workspace directory to the uid/gid a non-root sandbox runs as;
//! - [`Job::List`]: name the entries of a namespace's directory (read only), so the operator can
//!   find workspace directories whose sandbox is gone (its orphan sweep);
//! - [`Job::Prune`]: remove directories only if they are empty (a deleted namespace's, once the
//!   sweep has removed its workspaces);
//! - [`Job::Quota`]: give a workspace a hard size limit where the node root can (a btrfs
//!   subvolume with a quota group limit), as an init container of the sandbox pod; see
//!   [`quota`];
//! - [`Job::Watch`]: measure a workspace periodically and end when it is over its limit, as
//!   a sidecar of the sandbox pod;
//! - [`Job::Archive`]: write a tar of a workspace to stdout, read on the node without ever
//!   following a symbolic link (see [`archive`]), for the operator to take a snapshot without
//!   the sandbox's pod (the operator runs it with `exec` in a pod holding [`Job::Hold`]);
//! - [`Job::Extract`]: extract the operator's canonical archive (stdin) into a new staging
//!   directory of a workspace on the node, never following a symbolic link (see [`extract`]),
//!   for a restore that does not run through the sandbox's pod;
//! - [`Job::Hold`]: do nothing for a while, as the main process of such a pod;
//! - [`Job::Pids`]: set the process limit (`pids.max`) of the pod it runs in, as the first init
//!   container of a sandbox pod, before any of the sandbox's code runs (the kubelet's own
//!   `podPidsLimit` is one value per node; this is the sandbox's own limit).
//!
//! Each job prints one report line ([`Report`]), also written to the container's termination
//! message, which is how the operator reads the outcome. The operator builds the command line
//! with [`Job::to_args`] and reads the report with [`Report::parse`], so both sides share this
//! one definition of the protocol.
//!
//! Only the standard library, `rustix` and `tar`, the two the archive job needs (see
//! helper/Cargo.toml): the program stays small enough to audit and builds statically in
//! seconds. `std::fs::remove_dir_all` is symlink-safe on Linux (it walks with `openat` and
//! `O_NOFOLLOW`, the fix for CVE-2022-21658), which is why removal is not hand-written.
// Denied, not forbidden: the one exception is `quota::sys`, the two btrfs ioctls.
#![deny(unsafe_code)]

pub mod archive;
pub mod extract;
pub mod quota;

use std::fmt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where the helper binary lives in the operator image and in the helper image.
pub const BIN: &str = "/usr/local/bin/agentbox-helper";
/// First word of every report line: the protocol and its version.
pub const REPORT_TAG: &str = "agentbox-helper/v1";
/// Mode of a prepared namespace directory: root only (nobody else may traverse it; the
/// container runtime, running as root, still bind-mounts workspaces from below it).
pub const PREPARED_MODE: u32 = 0o700;
/// Mode of a workspace handed to a non-root sandbox: its owner only.
pub const OWNED_MODE: u32 = 0o700;

/// One job of the helper.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Job {
    /// Remove the entries `names` (plain names, one path component each) of directory `root`.
    Remove {
        /// The directory holding the workspaces (the helper's mount of it).
        root: PathBuf,
        /// Workspace directory names (sandbox uids).
        names: Vec<String>,
    },
    /// Make `dir` mode [`PREPARED_MODE`] (it must be owned by root) and report its mount flags.
    Prepare {
        /// The namespace's workspace directory (the helper's mount of it).
        dir: PathBuf,
    },
    /// Give `dir` (and, when its owner changes, everything under it) to `uid`:`gid`, mode
    /// [`OWNED_MODE`].
    Own {
        /// The workspace directory (the helper's mount of it).
        dir: PathBuf,
        /// The sandbox's uid.
        uid: u32,
        /// The sandbox's gid.
        gid: u32,
    },
    /// Name the entries of `dir` (none when it does not exist), leaving out those in `skip`,
    /// as many as fit in a termination message ([`LIST_BUDGET`]).
    List {
        /// The namespace's workspace directory (the helper's read-only mount of it, and
        /// nothing above it).
        dir: PathBuf,
        /// Names the operator already knows to be in use: not reported, so the report has room
        /// for the ones it needs.
        skip: Vec<String>,
    },
    /// Remove the entries `names` of directory `root` that are empty directories (`rmdir`):
    /// one holding anything, or not a directory, stays.
    Prune {
        /// The directory holding them (the helper's mount of it).
        root: PathBuf,
        /// Plain names, one path component each.
        names: Vec<String>,
    },
    /// Lower the process limit of the pids cgroup `dir` (the pod's own, mounted by the pod's
    /// UID) to `limit`: never above what it was (the kubelet's `podPidsLimit`, which stays the
    /// node's ceiling).
    Pids {
        /// The pod's pids cgroup directory (the helper's mount of it).
        dir: PathBuf,
        /// The most processes (and threads) the pod may have at once.
        limit: u64,
    },
    /// Limit the workspace `root/name` to `bytes` ([`quota::limit`]).
    Quota {
        /// The namespace's workspace directory (the helper's mount of it).
        root: PathBuf,
        /// The workspace directory's name in it.
        name: String,
        /// The limit.
        bytes: u64,
        /// What to do where no hard limit can be set.
        fallback: quota::Fallback,
    },
    /// Write a tar of the workspace `dir` to stdout ([`archive::archive`]); the report goes to
    /// stderr and the termination message only.
    Archive {
        /// The workspace (the helper's read-only mount of it).
        dir: PathBuf,
    },
    /// Extract the canonical archive on stdin into `dir/.agentbox/staging-<id>`
    /// ([`extract::extract`]), for the operator to swap in.
    Extract {
        /// The workspace (the helper's read-write mount of it).
        dir: PathBuf,
        /// The restore's id (letters, digits, `-`, `_`).
        id: String,
    },
    /// Sleep `secs` seconds, then end: the main process of a pod the operator runs
    /// [`Job::Archive`] in with `exec` (bounded, so a pod the operator lost ends by itself).
    Hold {
        /// How long.
        secs: u64,
    },
    /// Measure `dir` every `interval_secs` until it holds more than `bytes` ([`quota::watch`]).
    Watch {
        /// The workspace (the helper's read-only mount of it).
        dir: PathBuf,
        /// The limit.
        bytes: u64,
        /// Seconds between measurements.
        interval_secs: u64,
    },
}

/// Bytes of names a [`Job::List`] report carries at most: the kubelet keeps 4096 bytes of a
/// termination message, and the rest of the line needs some. The names left out are counted
/// (`more=`); the next sweep, with fewer entries, gets them.
pub const LIST_BUDGET: usize = 3800;

/// What went wrong.
#[derive(Debug)]
pub enum Error {
    /// The command line does not name a job.
    Usage(String),
    /// A filesystem operation failed.
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// No hard limit could be set, and that is not a failure by itself (see
    /// [`quota::Fallback`]).
    NoQuota(quota::NoQuota),
    /// No hard limit could be set where one is required.
    Refused(String),
    /// An entry of a workspace being archived changed kind or identity between being listed
    /// and being opened (a link swapped in for a directory, say): the archive would not be
    /// of one tree.
    Changed(PathBuf),
    /// A directory to archive has no workspace marker (lost or never initialised).
    NotAWorkspace(PathBuf),
    /// An archive to extract holds what cannot be restored (a path that is not plain and
    /// relative, a member that is not a file, directory or symbolic link).
    BadArchive(String),
    /// A directory that must be root's is not.
    NotRootOwned {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        uid: u32,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Usage(m) => write!(f, "usage: {m}"),
            Error::Io { what, path, source } => {
                write!(f, "{what} {}: {source}", path.display())
            }
            Error::NoQuota(why) => write!(f, "{why}"),
            Error::Changed(p) => write!(
                f,
                "{} changed while the workspace was read (listed as one thing, opened as another)",
                p.display()
            ),
            Error::NotAWorkspace(p) => write!(
                f,
                "{} has no agentbox marker (lost or not initialised)",
                p.display()
            ),
            Error::Refused(why) => write!(
                f,
                "the workspace size limit cannot be enforced and this operator refuses to only measure it: {why}"
            ),
            Error::BadArchive(why) => write!(f, "the archive cannot be restored: {why}"),
            Error::NotRootOwned { path, uid } => write!(
                f,
                "{} is owned by uid {uid}, not root: refusing to use it as a workspace parent",
                path.display()
            ),
        }
    }
}

impl std::error::Error for Error {}

pub(crate) fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error + use<> {
    let path = path.to_path_buf();
    move |source| Error::Io { what, path, source }
}

impl Job {
    /// The helper's arguments (after the program name) for this job.
    pub fn to_args(&self) -> Vec<String> {
        match self {
            Job::Remove { root, names } => {
                let mut v = vec!["remove".into(), root.display().to_string()];
                v.extend(names.iter().cloned());
                v
            }
            Job::Prepare { dir } => vec!["prepare".into(), dir.display().to_string()],
            Job::Own { dir, uid, gid } => vec![
                "own".into(),
                dir.display().to_string(),
                uid.to_string(),
                gid.to_string(),
            ],
            Job::List { dir, skip } => {
                let mut v = vec!["list".into(), dir.display().to_string()];
                v.extend(skip.iter().cloned());
                v
            }
            Job::Prune { root, names } => {
                let mut v = vec!["prune".into(), root.display().to_string()];
                v.extend(names.iter().cloned());
                v
            }
            Job::Pids { dir, limit } => {
                vec!["pids".into(), dir.display().to_string(), limit.to_string()]
            }
            Job::Quota {
                root,
                name,
                bytes,
                fallback,
            } => vec![
                "quota".into(),
                root.display().to_string(),
                name.clone(),
                bytes.to_string(),
                fallback.as_str().into(),
            ],
            Job::Archive { dir } => vec!["archive".into(), dir.display().to_string()],
            Job::Extract { dir, id } => {
                vec!["extract".into(), dir.display().to_string(), id.clone()]
            }
            Job::Hold { secs } => vec!["hold".into(), secs.to_string()],
            Job::Watch {
                dir,
                bytes,
                interval_secs,
            } => vec![
                "watch".into(),
                dir.display().to_string(),
                bytes.to_string(),
                interval_secs.to_string(),
            ],
        }
    }

    /// Parses the helper's arguments (after the program name). Every path must be absolute and
    /// clean, every removed name one plain path component.
    pub fn parse(args: &[String]) -> Result<Job, Error> {
        let usage = || {
            Error::Usage(
                "agentbox-helper remove ROOT NAME... | prepare DIR | own DIR UID GID | list DIR [SKIP...] \
                 | prune ROOT NAME... | pids DIR LIMIT | quota ROOT NAME BYTES measure|refuse \
                 | watch DIR BYTES SECONDS | archive DIR | extract DIR ID | hold SECONDS"
                    .into(),
            )
        };
        let path = |s: &String| -> Result<PathBuf, Error> {
            // Checked on the text: `Path::components` would silently drop a `.` segment.
            let clean = s.starts_with('/') && s.split('/').skip(1).all(is_plain_name);
            if clean {
                Ok(PathBuf::from(s))
            } else {
                Err(Error::Usage(format!("{s:?} is not a clean absolute path")))
            }
        };
        let id = |s: &String| -> Result<u32, Error> {
            s.parse()
                .map_err(|_| Error::Usage(format!("{s:?} is not a numeric id")))
        };
        let positive = |s: &String| -> Result<u64, Error> {
            match s.parse() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(Error::Usage(format!("{s:?} is not a positive number"))),
            }
        };
        match args {
            [job, root, names @ ..] if (job == "remove" || job == "prune") && !names.is_empty() => {
                if let Some(bad) = names.iter().find(|n| !is_plain_name(n)) {
                    return Err(Error::Usage(format!(
                        "{bad:?} is not a plain directory name"
                    )));
                }
                let (root, names) = (path(root)?, names.to_vec());
                Ok(if job == "remove" {
                    Job::Remove { root, names }
                } else {
                    Job::Prune { root, names }
                })
            }
            [job, dir] if job == "prepare" => Ok(Job::Prepare { dir: path(dir)? }),
            [job, dir, uid, gid] if job == "own" => Ok(Job::Own {
                dir: path(dir)?,
                uid: id(uid)?,
                gid: id(gid)?,
            }),
            [job, dir, skip @ ..] if job == "list" => Ok(Job::List {
                dir: path(dir)?,
                skip: skip.to_vec(),
            }),
            [job, dir, limit] if job == "pids" => Ok(Job::Pids {
                dir: path(dir)?,
                limit: match limit.parse() {
                    Ok(n) if n > 0 => n,
                    _ => return Err(Error::Usage(format!("{limit:?} is not a positive limit"))),
                },
            }),
            [job, root, name, bytes, fallback] if job == "quota" => Ok(Job::Quota {
                root: path(root)?,
                name: if is_plain_name(name) {
                    name.clone()
                } else {
                    return Err(Error::Usage(format!(
                        "{name:?} is not a plain directory name"
                    )));
                },
                bytes: positive(bytes)?,
                fallback: quota::Fallback::parse(fallback).ok_or_else(|| {
                    Error::Usage(format!("{fallback:?} is neither measure nor refuse"))
                })?,
            }),
            [job, dir] if job == "archive" => Ok(Job::Archive { dir: path(dir)? }),
            [job, dir, id] if job == "extract" => Ok(Job::Extract {
                dir: path(dir)?,
                id: if extract::is_staging_id(id) {
                    id.clone()
                } else {
                    return Err(Error::Usage(format!("{id:?} is not a staging id")));
                },
            }),
            [job, secs] if job == "hold" => Ok(Job::Hold {
                secs: positive(secs)?,
            }),
            [job, dir, bytes, secs] if job == "watch" => Ok(Job::Watch {
                dir: path(dir)?,
                bytes: positive(bytes)?,
                interval_secs: positive(secs)?,
            }),
            _ => Err(usage()),
        }
    }

    /// Whether the job writes its output (not its report) to stdout.
    pub fn writes_stdout(&self) -> bool {
        matches!(self, Job::Archive { .. })
    }

    /// Runs the job.
    pub fn run(&self) -> Result<Report, Error> {
        match self {
            Job::Archive { dir } => {
                let out = std::io::BufWriter::with_capacity(64 << 10, std::io::stdout().lock());
                let report = archive::archive(dir, out)?;
                // Only a whole archive has an end marker to wait for.
                archive::linger(std::time::Duration::from_secs(600));
                Ok(report)
            }
            Job::Extract { dir, id } => {
                let input = std::io::BufReader::with_capacity(256 << 10, std::io::stdin().lock());
                let outcome = extract::extract(dir, id, input);
                // The operator ends stdin once it has sent the whole archive: read to that end
                // (also after a failure), so the report is out before the exec ends (output
                // still on its way when an exec's process exits can be dropped).
                archive::linger(std::time::Duration::from_secs(600));
                outcome
            }
            Job::Hold { secs } => {
                std::thread::sleep(std::time::Duration::from_secs(*secs));
                Ok(Report::default().with("job", "hold"))
            }
            Job::Remove { root, names } => remove(root, names),
            Job::Prepare { dir } => {
                let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
                    .map_err(io("reading", Path::new("/proc/self/mountinfo")))?;
                prepare(dir, &mountinfo)
            }
            Job::Own { dir, uid, gid } => own(dir, *uid, *gid),
            Job::List { dir, skip } => list(dir, skip),
            Job::Prune { root, names } => prune(root, names),
            Job::Pids { dir, limit } => pids(dir, *limit),
            Job::Quota {
                root,
                name,
                bytes,
                fallback,
            } => quota::limit(root, name, *bytes, *fallback),
            Job::Watch {
                dir,
                bytes,
                interval_secs,
            } => quota::watch(
                dir,
                *bytes,
                std::time::Duration::from_secs(*interval_secs),
                None,
            ),
        }
    }
}

/// Whether `name` is one plain path component: not empty, no `/`, not `.` or `..`, no NUL.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// The outcome of a job: `key=value` pairs on one line after [`REPORT_TAG`]. Values hold no
/// white space.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pairs: Vec<(String, String)>,
}

impl Report {
    /// Adds a pair (white space in the value becomes `_`).
    pub fn with(mut self, key: &str, value: impl fmt::Display) -> Self {
        let v = value
            .to_string()
            .chars()
            .map(|c| if c.is_whitespace() { '_' } else { c })
            .collect();
        self.pairs.push((key.to_string(), v));
        self
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key` as a boolean (`true`/`false`).
    pub fn flag(&self, key: &str) -> Option<bool> {
        match self.get(key)? {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        }
    }

    /// The report's line.
    pub fn line(&self) -> String {
        let mut s = REPORT_TAG.to_string();
        for (k, v) in &self.pairs {
            s.push(' ');
            s.push_str(k);
            s.push('=');
            s.push_str(v);
        }
        s
    }

    /// The last report line in `text` (a termination message or log), if any.
    pub fn parse(text: &str) -> Option<Report> {
        let line = text
            .lines()
            .rev()
            .find_map(|l| l.trim().strip_prefix(REPORT_TAG))?;
        let pairs = line
            .split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Some(Report { pairs })
    }
}

/// `root/<name>`, refused unless `name` is one plain path component.
pub(crate) fn entry(root: &Path, name: &str) -> Result<PathBuf, Error> {
    if !is_plain_name(name) {
        return Err(Error::Usage(format!(
            "{name:?} is not a plain directory name"
        )));
    }
    Ok(root.join(name))
}

/// Removes `root/<name>` for each name, never following a symbolic link: a link is removed,
/// not what it points at. A name that does not exist counts as removed.
pub fn remove(root: &Path, names: &[String]) -> Result<Report, Error> {
    let mut removed = 0;
    let mut absent = 0;
    for name in names {
        let p = entry(root, name)?;
        match std::fs::symlink_metadata(&p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => absent += 1,
            Err(e) => return Err(io("inspecting", &p)(e)),
            Ok(m) if m.is_dir() => {
                std::fs::remove_dir_all(&p).map_err(io("removing", &p))?;
                removed += 1;
            }
            Ok(_) => {
                std::fs::remove_file(&p).map_err(io("removing", &p))?;
                removed += 1;
            }
        }
    }
    Ok(Report::default()
        .with("job", "remove")
        .with("removed", removed)
        .with("absent", absent))
}

/// Removes `root/<name>` for each name that is an empty directory (`rmdir`, which refuses
/// anything else, so nothing in use is lost even if something was put there since the
/// operator looked). A name that does not exist counts as absent; one that holds anything, or
/// is not a directory, is kept and named in `kept=` (comma-separated: the operator sweeps
/// what is in it, then asks again).
pub fn prune(root: &Path, names: &[String]) -> Result<Report, Error> {
    let (mut pruned, mut kept, mut absent) = (0, Vec::new(), 0);
    for name in names {
        let p = entry(root, name)?;
        match std::fs::remove_dir(&p) {
            Ok(()) => pruned += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => absent += 1,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::DirectoryNotEmpty | std::io::ErrorKind::NotADirectory
                ) =>
            {
                kept.push(name.as_str());
            }
            Err(e) => return Err(io("removing", &p)(e)),
        }
    }
    Ok(Report::default()
        .with("job", "prune")
        .with("pruned", pruned)
        .with("kept", kept.join(","))
        .with("absent", absent))
}

/// Names the entries of `dir` that are not in `skip`, sorted, comma-separated in `names=`, up
/// to [`LIST_BUDGET`] bytes; `more=` counts those left out. A missing `dir` has no entries.
/// Names that a report could not carry intact (white space, commas, not UTF-8) are left out:
/// no workspace directory the operator makes is named so.
pub fn list(dir: &Path, skip: &[String]) -> Result<Report, Error> {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io("reading", dir)(e)),
        Ok(rd) => rd
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io("reading", dir))?,
    };
    let mut names: Vec<String> = entries
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter(|n| !n.contains(|c: char| c == ',' || c.is_whitespace()))
        .filter(|n| !skip.contains(n))
        .collect();
    names.sort();
    let (mut shown, mut used) = (Vec::new(), 0);
    for n in &names {
        if used + n.len() + 1 > LIST_BUDGET {
            break;
        }
        used += n.len() + 1;
        shown.push(n.as_str());
    }
    Ok(Report::default()
        .with("job", "list")
        .with("names", shown.join(","))
        .with("more", names.len() - shown.len()))
}

/// Makes `dir` mode [`PREPARED_MODE`] and reports the mode it had and whether the mount it is
/// on (per `mountinfo`, the text of `/proc/self/mountinfo`) is `nosuid` and `nodev`.
pub fn prepare(dir: &Path, mountinfo: &str) -> Result<Report, Error> {
    let meta = std::fs::symlink_metadata(dir).map_err(io("inspecting", dir))?;
    if !meta.is_dir() {
        return Err(Error::Io {
            what: "preparing",
            path: dir.to_path_buf(),
            source: std::io::Error::other("not a directory"),
        });
    }
    if meta.uid() != 0 {
        return Err(Error::NotRootOwned {
            path: dir.to_path_buf(),
            uid: meta.uid(),
        });
    }
    let was = meta.mode() & 0o7777;
    if was != PREPARED_MODE {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(PREPARED_MODE))
            .map_err(io("setting the mode of", dir))?;
    }
    let flags = mount_of(mountinfo, dir);
    Ok(Report::default()
        .with("job", "prepare")
        .with("was", format!("{was:04o}"))
        .with("mode", format!("{PREPARED_MODE:04o}"))
        .with("nosuid", flags.as_ref().is_some_and(|f| f.nosuid))
        .with("nodev", flags.as_ref().is_some_and(|f| f.nodev))
        .with(
            "mount",
            flags.map_or_else(|| "unknown".into(), |f| f.mount_point),
        ))
}

/// A pids cgroup's limit: a number of tasks, or none (`max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidsMax {
    /// No limit (`max`).
    Max,
    /// At most this many tasks.
    Limit(u64),
}

impl PidsMax {
    /// Parses the text of a `pids.max` file.
    pub fn parse(text: &str) -> Option<PidsMax> {
        match text.trim() {
            "max" => Some(PidsMax::Max),
            n => n.parse().ok().map(PidsMax::Limit),
        }
    }

    /// The lower of this limit and `limit`.
    pub fn lowered_to(self, limit: u64) -> u64 {
        match self {
            PidsMax::Max => limit,
            PidsMax::Limit(n) => n.min(limit),
        }
    }
}

impl fmt::Display for PidsMax {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PidsMax::Max => f.write_str("max"),
            PidsMax::Limit(n) => write!(f, "{n}"),
        }
    }
}

/// Sets `dir/pids.max` (a pod's pids cgroup) to `limit`, or leaves it lower where it already
/// is (the kubelet's `podPidsLimit`): reports the limit set (`limit`), the one found
/// (`kubelet`: what the kubelet gave the pod, `max` for none) and the tasks in the cgroup
/// (`current`). A cgroup with no task in it is refused: the pod's own has at least the pod's
/// pause process and this helper, so an empty one is not the pod's (a directory the runtime
/// made in place of a missing one would hold nothing and limit nothing).
pub fn pids(dir: &Path, limit: u64) -> Result<Report, Error> {
    let max_file = dir.join("pids.max");
    let current_file = dir.join("pids.current");
    let read = |p: &Path| std::fs::read_to_string(p).map_err(io("reading", p));
    let bad = |p: &Path, text: &str| Error::Io {
        what: "parsing",
        path: p.to_path_buf(),
        source: std::io::Error::other(format!("unexpected content {:?}", text.trim())),
    };
    let text = read(&max_file)?;
    let found = PidsMax::parse(&text).ok_or_else(|| bad(&max_file, &text))?;
    let text = read(&current_file)?;
    let current: u64 = text.trim().parse().map_err(|_| bad(&current_file, &text))?;
    if current == 0 {
        return Err(Error::Io {
            what: "limiting",
            path: dir.to_path_buf(),
            source: std::io::Error::other(
                "no process is in this cgroup, so it is not this pod's (is the pods' cgroup root right?)",
            ),
        });
    }
    let want = found.lowered_to(limit);
    std::fs::write(&max_file, format!("{want}\n")).map_err(io("writing", &max_file))?;
    let text = read(&max_file)?;
    if PidsMax::parse(&text) != Some(PidsMax::Limit(want)) {
        return Err(Error::Io {
            what: "checking",
            path: max_file,
            source: std::io::Error::other(format!("reads {:?} after writing {want}", text.trim())),
        });
    }
    Ok(Report::default()
        .with("job", "pids")
        .with("limit", want)
        .with("kubelet", found)
        .with("current", current))
}

/// Hands `dir` to `uid`:`gid` with mode [`OWNED_MODE`]. When `dir` already belongs to them
/// nothing below it is touched (the common case, and cheap); otherwise every entry below it is
/// given to them too (`lchown`: a symbolic link itself, never its target).
pub fn own(dir: &Path, uid: u32, gid: u32) -> Result<Report, Error> {
    let meta = std::fs::symlink_metadata(dir).map_err(io("inspecting", dir))?;
    if !meta.is_dir() {
        return Err(Error::Io {
            what: "owning",
            path: dir.to_path_buf(),
            source: std::io::Error::other("not a directory"),
        });
    }
    let mut changed = 0u64;
    if meta.uid() != uid || meta.gid() != gid {
        // Depth-first with an explicit stack: no recursion limit on deep trees.
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in std::fs::read_dir(&d).map_err(io("reading", &d))? {
                let entry = entry.map_err(io("reading", &d))?;
                let p = entry.path();
                let m = std::fs::symlink_metadata(&p).map_err(io("inspecting", &p))?;
                if m.uid() != uid || m.gid() != gid {
                    std::os::unix::fs::lchown(&p, Some(uid), Some(gid))
                        .map_err(io("changing the owner of", &p))?;
                    changed += 1;
                }
                if m.is_dir() {
                    stack.push(p);
                }
            }
        }
        std::os::unix::fs::lchown(dir, Some(uid), Some(gid))
            .map_err(io("changing the owner of", dir))?;
        changed += 1;
    }
    if meta.mode() & 0o7777 != OWNED_MODE {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(OWNED_MODE))
            .map_err(io("setting the mode of", dir))?;
    }
    Ok(Report::default()
        .with("job", "own")
        .with("owner", format!("{uid}:{gid}"))
        .with("changed", changed))
}

/// The flags of the mount a path is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountFlags {
    /// Where that mount is mounted.
    pub mount_point: String,
    /// `nosuid`: set-user-id and set-group-id bits are ignored.
    pub nosuid: bool,
    /// `nodev`: device files cannot be opened.
    pub nodev: bool,
}

/// The mount `path` lies on according to `mountinfo` (the format of `/proc/self/mountinfo`):
/// the one with the longest mount point that contains it, the last such line when mounts are
/// stacked. Per-mount options (the sixth field) carry `nosuid` and `nodev`. `path` should be
/// absolute and free of symbolic links.
pub fn mount_of(mountinfo: &str, path: &Path) -> Option<MountFlags> {
    let mut best: Option<MountFlags> = None;
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(point), Some(opts)) = (fields.get(4), fields.get(5)) else {
            continue;
        };
        let point = unescape(point);
        if !path.starts_with(&point) {
            continue;
        }
        let longer = best
            .as_ref()
            .is_none_or(|b| point.len() >= b.mount_point.len());
        if longer {
            let opts: Vec<&str> = opts.split(',').collect();
            best = Some(MountFlags {
                nosuid: opts.contains(&"nosuid"),
                nodev: opts.contains(&"nodev"),
                mount_point: point,
            });
        }
    }
    best
}

/// Undoes mountinfo's octal escapes (`\040` for a space, `\134` for a backslash, ...).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match oct {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("agentbox-helper-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn jobs_round_trip_through_their_arguments() {
        for job in [
            Job::Remove {
                root: "/ns".into(),
                names: vec!["a-1".into(), "b".into()],
            },
            Job::Prepare { dir: "/ns".into() },
            Job::Own {
                dir: "/workspace".into(),
                uid: 1000,
                gid: 100,
            },
            Job::List {
                dir: "/ns".into(),
                skip: vec!["u1".into()],
            },
            Job::List {
                dir: "/ns".into(),
                skip: vec![],
            },
            Job::Prune {
                root: "/root".into(),
                names: vec!["gone-team".into()],
            },
            Job::Pids {
                dir: "/pids".into(),
                limit: 256,
            },
            Job::Quota {
                root: "/ns".into(),
                name: "uid-1".into(),
                bytes: 64 << 20,
                fallback: quota::Fallback::Refuse,
            },
            Job::Watch {
                dir: "/ws".into(),
                bytes: 1 << 30,
                interval_secs: 30,
            },
            Job::Archive {
                dir: "/workspace".into(),
            },
            Job::Extract {
                dir: "/workspace".into(),
                id: "0123abcd".into(),
            },
            Job::Hold { secs: 600 },
        ] {
            assert_eq!(Job::parse(&job.to_args()).unwrap(), job);
        }
        for bad in [
            &["pids", "/pids", "0"][..],
            &["pids", "/pids", "-1"],
            &["pids", "/pids", "x"],
            &["quota", "/ns", "..", "1", "measure"],
            &["quota", "/ns", "a", "0", "measure"],
            &["quota", "/ns", "a", "1", "maybe"],
            &["watch", "/ws", "1", "0"],
            &["watch", "ws", "1", "1"],
            &["archive", "/ws/../etc"],
            &["archive", "ws"],
            &["extract", "/ws", "../x"],
            &["extract", "/ws", ""],
            &["extract", "ws", "id"],
            &["hold", "0"],
        ] {
            assert!(Job::parse(&args(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn pids_lowers_the_limit_and_never_raises_the_kubelets() {
        let dir = scratch("pids");
        let write = |f: &str, v: &str| std::fs::write(dir.join(f), v).unwrap();
        write("pids.max", "max\n");
        write("pids.current", "2\n");
        let r = pids(&dir, 256).unwrap();
        assert_eq!(r.get("limit"), Some("256"));
        assert_eq!(r.get("kubelet"), Some("max"));
        assert_eq!(r.get("current"), Some("2"));
        assert_eq!(
            std::fs::read_to_string(dir.join("pids.max")).unwrap(),
            "256\n"
        );
        // The kubelet's lower limit stays.
        write("pids.max", "100\n");
        let r = pids(&dir, 256).unwrap();
        assert_eq!(
            (r.get("limit"), r.get("kubelet")),
            (Some("100"), Some("100"))
        );
        // A cgroup no process is in is not the pod's: refused, left as it was.
        write("pids.max", "max\n");
        write("pids.current", "0\n");
        let e = pids(&dir, 256).unwrap_err().to_string();
        assert!(e.contains("no process is in this cgroup"), "{e}");
        assert_eq!(
            std::fs::read_to_string(dir.join("pids.max")).unwrap(),
            "max\n"
        );
        write("pids.max", "lots\n");
        assert!(pids(&dir, 256).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(pids(&dir, 256).is_err(), "a missing cgroup is an error");
    }

    #[test]
    fn arguments_that_could_reach_elsewhere_are_refused() {
        for bad in [
            &["remove", "/ns"][..],
            &["remove", "/ns", ".."],
            &["remove", "/ns", "a/b"],
            &["remove", "/ns", ""],
            &["remove", "ns", "a"],
            &["remove", "/ns/../etc", "a"],
            &["prepare", "/a/./b"],
            &["own", "/w", "-1", "0"],
            &["own", "/w", "1"],
            &["rm", "/w"],
            &["list", "/r/../ns"],
            &["list"],
            &["prune", "/root"],
            &["prune", "/root", ".."],
            &["prune", "/root", "a/b"],
        ] {
            assert!(Job::parse(&args(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn reports_round_trip_and_the_last_line_wins() {
        let r = Report::default()
            .with("job", "prepare")
            .with("nosuid", true)
            .with("mount", "/a b");
        let text = format!("noise\n{}\n", r.line());
        let p = Report::parse(&text).unwrap();
        assert_eq!(p.get("job"), Some("prepare"));
        assert_eq!(p.flag("nosuid"), Some(true));
        assert_eq!(p.flag("nodev"), None);
        assert_eq!(p.get("mount"), Some("/a_b"));
        let later = format!("{text}{} job=remove\n", REPORT_TAG);
        assert_eq!(Report::parse(&later).unwrap().get("job"), Some("remove"));
        assert_eq!(Report::parse("no report here"), None);
    }

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 8:1 /var/lib/agentbox/workspaces /var/lib/agentbox/workspaces rw,nosuid,nodev,relatime shared:1 - ext4 /dev/vda rw
31 22 0:5 / /var/lib/agentbox/work\\040space rw,nosuid - tmpfs tmpfs rw
40 22 8:1 /srv /ns rw,nodev - ext4 /dev/vda rw
41 40 8:1 /srv /ns rw,nosuid,nodev - ext4 /dev/vda rw
";

    #[test]
    fn the_deepest_and_topmost_mount_decides() {
        let at = |p: &str| mount_of(MOUNTINFO, Path::new(p)).unwrap();
        let ws = at("/var/lib/agentbox/workspaces/team/uid");
        assert_eq!(ws.mount_point, "/var/lib/agentbox/workspaces");
        assert!(ws.nosuid && ws.nodev);
        let other = at("/var/lib/agentbox/workspacesX");
        assert_eq!(
            other.mount_point, "/",
            "component-wise, not by string prefix"
        );
        assert!(!other.nosuid && !other.nodev);
        let escaped = at("/var/lib/agentbox/work space/x");
        assert!(escaped.nosuid && !escaped.nodev);
        let stacked = at("/ns");
        assert!(
            stacked.nosuid && stacked.nodev,
            "the later of stacked mounts"
        );
        assert_eq!(mount_of("", Path::new("/x")), None);
    }

    #[test]
    fn remove_takes_links_not_their_targets() {
        let d = scratch("remove");
        let outside = d.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        let ws = d.join("ns/uid-1");
        std::fs::create_dir_all(ws.join("deep/er")).unwrap();
        std::fs::write(ws.join("deep/er/f"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("deep/link")).unwrap();
        // A workspace that is itself a link: the link goes, its target stays.
        std::os::unix::fs::symlink(&outside, d.join("ns/uid-2")).unwrap();
        let r = remove(
            &d.join("ns"),
            &["uid-1".into(), "uid-2".into(), "uid-3".into()],
        )
        .unwrap();
        assert_eq!((r.get("removed"), r.get("absent")), (Some("2"), Some("1")));
        assert!(!ws.exists() && !d.join("ns/uid-2").exists());
        assert!(outside.join("keep").exists(), "nothing outside removed");
        assert!(remove(&d.join("ns"), &["..".into()]).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn prepare_closes_the_directory_and_reports_its_mount() {
        let d = scratch("prepare");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let info = format!(
            "1 0 8:1 / / rw - ext4 /dev/vda rw\n2 1 8:1 / {} rw,nosuid - ext4 /dev/vda rw\n",
            d.display()
        );
        let r = prepare(&d, &info);
        // The unit tests may run as a non-root user, for whom the directory is not root's.
        if std::fs::metadata(&d).unwrap().uid() != 0 {
            assert!(matches!(r, Err(Error::NotRootOwned { .. })));
            std::fs::remove_dir_all(&d).unwrap();
            return;
        }
        let r = r.unwrap();
        assert_eq!(r.get("was"), Some("0755"));
        assert_eq!(r.get("mode"), Some("0700"));
        assert_eq!(
            (r.flag("nosuid"), r.flag("nodev")),
            (Some(true), Some(false))
        );
        let mode = std::fs::metadata(&d).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn own_hands_over_the_tree_without_following_links() {
        let d = scratch("own");
        let ws = d.join("ws");
        std::fs::create_dir_all(ws.join("sub")).unwrap();
        std::fs::write(ws.join("sub/f"), "x").unwrap();
        let outside = d.join("outside");
        std::fs::write(&outside, "x").unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("sub/link")).unwrap();
        let me = std::fs::metadata(&d).unwrap();
        let (uid, gid) = (me.uid(), me.gid());
        // Changing owners needs CAP_CHOWN: as root, hand the tree to another id; otherwise to
        // ourselves (only the mode changes).
        let (to_uid, to_gid) = if uid == 0 { (4242, 4343) } else { (uid, gid) };
        let r = own(&ws, to_uid, to_gid).unwrap();
        assert_eq!(r.get("owner"), Some(format!("{to_uid}:{to_gid}").as_str()));
        for p in ["", "sub", "sub/f", "sub/link"] {
            let m = std::fs::symlink_metadata(ws.join(p)).unwrap();
            assert_eq!((m.uid(), m.gid()), (to_uid, to_gid), "{p}");
        }
        let target = std::fs::metadata(&outside).unwrap();
        assert_eq!(target.uid(), uid, "the link's target keeps its owner");
        assert_eq!(std::fs::metadata(&ws).unwrap().mode() & 0o7777, OWNED_MODE);
        // Already owned: nothing below is touched.
        let again = own(&ws, to_uid, to_gid).unwrap();
        assert_eq!(again.get("changed"), Some("0"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn list_names_what_is_not_skipped_within_its_budget() {
        let d = scratch("list");
        for n in ["b", "a", "skipped"] {
            std::fs::create_dir(d.join(n)).unwrap();
        }
        std::fs::write(d.join("has space"), "").unwrap();
        let r = list(&d, &["skipped".into()]).unwrap();
        assert_eq!(r.get("names"), Some("a,b"));
        assert_eq!(r.get("more"), Some("0"));
        assert_eq!(
            Report::parse(&r.line()).unwrap().get("names"),
            Some("a,b"),
            "survives the report line"
        );
        let missing = list(&d.join("nope"), &[]).unwrap();
        assert_eq!(missing.get("names"), Some(""));
        // More than fits: the rest is counted, not cut mid-name.
        let many = scratch("list-many");
        for i in 0..200 {
            std::fs::create_dir(many.join(format!("{i:036}"))).unwrap();
        }
        let r = list(&many, &[]).unwrap();
        let shown = r.get("names").unwrap().split(',').count();
        assert!(r.line().len() < 4096, "fits a termination message");
        assert_eq!(
            shown + r.get("more").unwrap().parse::<usize>().unwrap(),
            200
        );
        assert!(shown > 90, "{shown}");
        std::fs::remove_dir_all(&d).unwrap();
        std::fs::remove_dir_all(&many).unwrap();
    }

    #[test]
    fn unescape_octal() {
        assert_eq!(unescape("a\\040b\\134c\\011"), "a b\\c\t");
        assert_eq!(unescape("a\\04"), "a\\04");
        assert_eq!(unescape("plain"), "plain");
    }

    #[test]
    fn prune_removes_only_empty_directories() {
        let root = scratch("prune");
        std::fs::create_dir(root.join("empty")).unwrap();
        std::fs::create_dir_all(root.join("busy/ws")).unwrap();
        std::fs::write(root.join("file"), "x").unwrap();
        std::os::unix::fs::symlink(root.join("empty-target"), root.join("link")).unwrap();
        std::fs::create_dir(root.join("empty-target")).unwrap();
        let names = args(&["empty", "busy", "file", "link", "missing"]);
        let r = prune(&root, &names).unwrap();
        assert_eq!(
            (r.get("pruned"), r.get("kept"), r.get("absent")),
            (Some("1"), Some("busy,file,link"), Some("1")),
            "{r:?}"
        );
        assert!(!root.join("empty").exists());
        assert!(root.join("busy/ws").is_dir(), "never what holds anything");
        assert!(root.join("file").is_file());
        assert!(root.join("empty-target").is_dir(), "a link is not followed");
        assert!(std::fs::symlink_metadata(root.join("link")).is_ok());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
