//! A workspace's size limit: a hard limit where the node root can give one, a measurement
//! everywhere.
//!
//! - [`limit`] (the `quota` job, the init container `limit-workspace` of a sandbox pod with
//!   `workspace.sizeLimit`): makes the workspace directory a btrfs subvolume of its own and
//!   sets the subvolume's quota group limit (`max_rfer`), so writes past it fail in the sandbox
//!   with `EDQUOT` ("Disk quota exceeded") and nothing else on the node notices. A node root
//!   that is not btrfs with quotas enabled (or a directory that already holds data, or a
//!   runtime such as gVisor that does not pass the ioctls through) gets no hard limit: the
//!   report says why, and the operator decides (refuse, or measure).
//! - [`watch`] (the `watch` job, the sidecar `workspace-usage`): measures the workspace every
//!   interval, prints one report line per measurement, and ends with a report `over=true`
//!   (exit code [`OVER_LIMIT_EXIT`]) when the workspace holds more than its limit, which is how
//!   the operator learns it must stop the sandbox.
//!
//! Why btrfs and not ext4 project quotas: ext4 keeps project quotas in its hidden quota
//! inodes, which need the kernel's `CONFIG_QFMT_V2`; kernels without it (the test machines')
//! refuse to mount an ext4 made with `-O quota,project` at all, while btrfs quota groups need
//! nothing but btrfs.
//!
//! Why raw ioctls: no maintained crate wraps the btrfs subvolume and quota-group ioctls
//! without pulling in a dependency tree (libbtrfsutil needs a C library on the node), and
//! `std` has no `ioctl`. The two calls live in [`sys`], the only module of the helper allowed
//! `unsafe`, each a single `ioctl(2)` on an owned file descriptor with a `#[repr(C)]` argument
//! laid out as `<linux/btrfs.h>` has it (sizes checked by tests).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Error, Report, io};

/// Exit code of a `watch` that found its workspace over the limit.
pub const OVER_LIMIT_EXIT: i32 = 3;

/// The inode number of a btrfs subvolume's root directory (`BTRFS_FIRST_FREE_OBJECTID`).
const SUBVOLUME_ROOT_INO: u64 = 256;

/// What to do where no hard limit can be set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// Report it and go on: the operator measures the workspace instead.
    Measure,
    /// Fail (the pod does not start).
    Refuse,
}

impl Fallback {
    /// The word on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::Measure => "measure",
            Fallback::Refuse => "refuse",
        }
    }

    /// Parses [`Fallback::as_str`]'s words.
    pub fn parse(s: &str) -> Option<Fallback> {
        match s {
            "measure" => Some(Fallback::Measure),
            "refuse" => Some(Fallback::Refuse),
            _ => None,
        }
    }
}

/// Why a directory got no hard limit.
#[derive(Debug)]
pub enum NoQuota {
    /// The filesystem (or the runtime between us and it) has no subvolumes.
    NotBtrfs(std::io::Error),
    /// Quotas are not enabled on the filesystem.
    NotEnabled(std::io::Error),
    /// The directory exists, holds data and is no subvolume of its own.
    HoldsData,
}

impl std::fmt::Display for NoQuota {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoQuota::NotBtrfs(e) => write!(
                f,
                "the node root has no btrfs subvolumes here ({e}): no hard limit"
            ),
            NoQuota::NotEnabled(e) => write!(
                f,
                "quotas are not enabled on the node root's btrfs ({e}): no hard limit"
            ),
            NoQuota::HoldsData => write!(
                f,
                "the workspace directory already holds data from before its limit and is no subvolume of its own: no hard limit"
            ),
        }
    }
}

/// Whether an ioctl error says "this filesystem (or runtime) does not do that".
fn unsupported(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            25 /* ENOTTY */ | 95 /* EOPNOTSUPP */ | 38 /* ENOSYS */ | 22 /* EINVAL */ | 18 /* EXDEV */
        )
    )
}

/// The `quota` job: limits workspace `root/name` to `bytes` (see the module's docs).
pub fn limit(root: &Path, name: &str, bytes: u64, fallback: Fallback) -> Result<Report, Error> {
    let dir = crate::entry(root, name)?;
    let report = Report::default().with("job", "quota").with("limit", bytes);
    let outcome = subvolume(root, name, &dir).and_then(|()| {
        let f = std::fs::File::open(&dir).map_err(io("opening", &dir))?;
        match sys::qgroup_limit(&f, bytes) {
            Ok(()) => Ok(Ok(())),
            Err(e) if unsupported(&e) || e.raw_os_error() == Some(107 /* ENOTCONN */) => {
                Ok(Err(NoQuota::NotEnabled(e)))
            }
            Err(e) => Err(io("setting the quota group limit of", &dir)(e)),
        }
    });
    let why = match outcome {
        Ok(Ok(())) => return Ok(report.with("mode", "quota")),
        Ok(Err(why)) => why,
        Err(Error::NoQuota(why)) => why,
        Err(e) => return Err(e),
    };
    match fallback {
        Fallback::Measure => Ok(report.with("mode", "measure").with("reason", why)),
        Fallback::Refuse => Err(Error::Refused(why.to_string())),
    }
}

/// Makes `dir` (`root/name`) a subvolume of its own: a missing or empty plain directory is
/// replaced by a new subvolume (made under a temporary name first, so a filesystem without
/// subvolumes leaves the directory as it was); one that is a subvolume already stays.
fn subvolume(root: &Path, name: &str, dir: &Path) -> Result<(), Error> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io("inspecting", dir)(e)),
    };
    if let Some(m) = &meta {
        if !m.is_dir() {
            return Err(Error::Usage(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
        if m.ino() == SUBVOLUME_ROOT_INO {
            return Ok(());
        }
        let empty = std::fs::read_dir(dir)
            .map_err(io("reading", dir))?
            .next()
            .is_none();
        if !empty {
            return Err(Error::NoQuota(NoQuota::HoldsData));
        }
    }
    let temp = format!(".{name}.subvolume");
    let temp_path = root.join(&temp);
    // A leftover of an interrupted run: empty, or it would not be ours to remove.
    match std::fs::remove_dir(&temp_path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("removing the leftover", &temp_path)(e)),
    }
    let parent = std::fs::File::open(root).map_err(io("opening", root))?;
    match sys::subvolume_create(&parent, &temp) {
        Ok(()) => {}
        Err(e) if unsupported(&e) => return Err(Error::NoQuota(NoQuota::NotBtrfs(e))),
        Err(e) => return Err(io("creating a subvolume in", root)(e)),
    }
    if meta.is_some() {
        std::fs::remove_dir(dir).map_err(io("removing the empty", dir))?;
    }
    std::fs::rename(&temp_path, dir).map_err(io("renaming the new subvolume to", dir))?;
    Ok(())
}

/// Bytes `dir` takes on its filesystem: the allocated blocks of everything under it (as
/// `du` counts them), without following symbolic links. Nested subvolumes and other
/// filesystems below it count too: whatever the sandbox wrote there is its.
pub fn usage(dir: &Path) -> Result<u64, Error> {
    let mut total = 0u64;
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(rd) => rd,
            // Gone meanwhile (the sandbox removed it): nothing to count.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && d != dir => continue,
            Err(e) => return Err(io("reading", &d)(e)),
        };
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let p = entry.path();
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            total = total.saturating_add(m.blocks().saturating_mul(512));
            if m.is_dir() {
                stack.push(p);
            }
        }
    }
    Ok(total)
}

/// The `watch` job: measures `dir` every `interval`, printing each measurement's report line;
/// returns the first report over `bytes` (`over=true`). `rounds` bounds the measurements (for
/// tests; `None`: until over).
pub fn watch(
    dir: &Path,
    bytes: u64,
    interval: Duration,
    rounds: Option<u64>,
) -> Result<Report, Error> {
    let mut n = 0u64;
    loop {
        let used = usage(dir)?;
        let report = Report::default()
            .with("job", "watch")
            .with("used", used)
            .with("limit", bytes);
        if used > bytes {
            return Ok(report.with("over", true));
        }
        println!("{}", report.line());
        n += 1;
        if rounds.is_some_and(|r| n >= r) {
            return Ok(report.with("over", false));
        }
        std::thread::sleep(interval);
    }
}

/// The two btrfs ioctls.
#[allow(unsafe_code)]
mod sys {
    use std::ffi::{c_int, c_ulong};
    use std::os::fd::AsRawFd;

    unsafe extern "C" {
        fn ioctl(fd: c_int, request: c_ulong, ...) -> c_int;
    }

    /// `BTRFS_IOC_SUBVOL_CREATE`: `_IOW(0x94, 14, struct btrfs_ioctl_vol_args)`.
    const SUBVOL_CREATE: c_ulong = 0x5000_940e;
    /// `BTRFS_IOC_QGROUP_LIMIT`: `_IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)`.
    const QGROUP_LIMIT: c_ulong = 0x8030_942b;
    /// `BTRFS_QGROUP_LIMIT_MAX_RFER`.
    const LIMIT_MAX_RFER: u64 = 1;
    /// `BTRFS_PATH_NAME_MAX + 1`.
    const NAME_LEN: usize = 4088;

    /// `struct btrfs_ioctl_vol_args`.
    #[repr(C)]
    pub(super) struct VolArgs {
        fd: i64,
        name: [u8; NAME_LEN],
    }

    /// `struct btrfs_ioctl_qgroup_limit_args` (with its `struct btrfs_qgroup_limit`).
    #[repr(C)]
    pub(super) struct QgroupLimitArgs {
        qgroupid: u64,
        flags: u64,
        max_rfer: u64,
        max_excl: u64,
        rsv_rfer: u64,
        rsv_excl: u64,
    }

    fn check(r: c_int) -> std::io::Result<()> {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Creates subvolume `name` (one plain component) in the directory `parent`.
    pub(super) fn subvolume_create(parent: &std::fs::File, name: &str) -> std::io::Result<()> {
        let bytes = name.as_bytes();
        if bytes.is_empty() || bytes.len() >= NAME_LEN || bytes.contains(&0) {
            return Err(std::io::Error::from_raw_os_error(22));
        }
        let mut args = Box::new(VolArgs {
            fd: 0,
            name: [0; NAME_LEN],
        });
        args.name[..bytes.len()].copy_from_slice(bytes);
        // SAFETY: `parent` is an open descriptor for the call's duration; `args` is a valid,
        // initialised `btrfs_ioctl_vol_args` (NUL-terminated name) the kernel only reads.
        check(unsafe {
            ioctl(
                parent.as_raw_fd(),
                SUBVOL_CREATE,
                &mut *args as *mut VolArgs,
            )
        })
    }

    /// Sets the referenced-bytes limit of the quota group of the subvolume `dir` is the root
    /// of (quota group id 0: the subvolume of the descriptor).
    pub(super) fn qgroup_limit(dir: &std::fs::File, bytes: u64) -> std::io::Result<()> {
        let mut args = QgroupLimitArgs {
            qgroupid: 0,
            flags: LIMIT_MAX_RFER,
            max_rfer: bytes,
            max_excl: 0,
            rsv_rfer: 0,
            rsv_excl: 0,
        };
        // SAFETY: `dir` is an open descriptor for the call's duration; `args` is a valid,
        // initialised `btrfs_ioctl_qgroup_limit_args`.
        check(unsafe {
            ioctl(
                dir.as_raw_fd(),
                QGROUP_LIMIT,
                &mut args as *mut QgroupLimitArgs,
            )
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn argument_layouts_match_the_ioctl_numbers() {
            // The size is encoded in bits 16..30 of each request.
            assert_eq!(std::mem::size_of::<VolArgs>(), 4096);
            assert_eq!((SUBVOL_CREATE >> 16) & 0x3fff, 4096);
            assert_eq!(std::mem::size_of::<QgroupLimitArgs>(), 48);
            assert_eq!((QGROUP_LIMIT >> 16) & 0x3fff, 48);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("agentbox-quota-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn usage_counts_allocated_blocks_without_following_links() {
        let d = scratch("usage");
        let ws = d.join("ws");
        std::fs::create_dir_all(ws.join("a/b")).unwrap();
        std::fs::write(ws.join("a/b/f"), vec![1u8; 256 * 1024]).unwrap();
        let outside = d.join("outside");
        std::fs::write(&outside, vec![1u8; 1024 * 1024]).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
        let used = usage(&ws).unwrap();
        assert!(
            (256 * 1024..1024 * 1024).contains(&used),
            "the file's 256 KiB and some directory blocks, not the link's target: {used}"
        );
        assert!(usage(&d.join("missing")).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn watch_reports_until_over_the_limit() {
        let d = scratch("watch");
        std::fs::write(d.join("f"), vec![1u8; 64 * 1024]).unwrap();
        let r = watch(&d, 1 << 30, Duration::ZERO, Some(2)).unwrap();
        assert_eq!(r.flag("over"), Some(false));
        let r = watch(&d, 4096, Duration::ZERO, None).unwrap();
        assert_eq!(r.flag("over"), Some(true));
        assert_eq!(r.get("limit"), Some("4096"));
        assert!(r.get("used").unwrap().parse::<u64>().unwrap() >= 64 * 1024);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn without_subvolumes_the_directory_stays_and_the_fallback_decides() {
        // The unit tests run on a filesystem without btrfs quota groups (tmpfs, ext4, or a
        // btrfs without quotas): no hard limit. Where it is btrfs with quotas and we are root
        // with CAP_SYS_ADMIN, the limit is set instead.
        let root = scratch("limit");
        std::fs::create_dir(root.join("ws")).unwrap();
        match limit(&root, "ws", 64 << 20, Fallback::Measure) {
            Ok(r) if r.get("mode") == Some("quota") => return,
            Ok(r) => {
                assert_eq!(r.get("mode"), Some("measure"), "{r:?}");
                assert!(r.get("reason").is_some(), "{r:?}");
            }
            Err(e) => panic!("{e}"),
        }
        assert!(root.join("ws").is_dir(), "the directory is left as it was");
        let names: Vec<_> = std::fs::read_dir(&root).unwrap().collect();
        assert_eq!(names.len(), 1, "no temporary subvolume left behind");
        let e = limit(&root, "ws", 64 << 20, Fallback::Refuse).unwrap_err();
        assert!(matches!(e, Error::Refused(_)), "{e}");
        // A directory holding data is never replaced.
        std::fs::write(root.join("ws/keep"), "x").unwrap();
        let r = limit(&root, "ws", 64 << 20, Fallback::Measure).unwrap();
        assert_eq!(r.get("mode"), Some("measure"));
        assert!(root.join("ws/keep").exists());
        assert!(limit(&root, "..", 1, Fallback::Measure).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
