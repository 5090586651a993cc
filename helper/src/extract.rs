//! The `extract` job: the operator's canonical archive, read on stdin, into a new staging
//! directory of a workspace, written on the node itself (a restore that does not run through
//! the sandbox: under gVisor every file the sandbox's own `tar -x` creates goes through the
//! runtime, about twenty times slower than this for small files, see docs/benchmarks.md).
//!
//! The workspace belongs to the sandbox, whose code may be running and may plant symbolic
//! links anywhere in it, also in the staging directory while this job writes it. So nothing
//! here resolves a path through a link: every directory is opened beneath the staging
//! directory with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`,
//! every member is created in its parent's descriptor by one name (`O_CREAT | O_EXCL |
//! O_NOFOLLOW`, `mkdirat`, `symlinkat`), and owners, modes and times are set on what was
//! created (`fchown`, `fchmod`, `futimens`) or on the name with `AT_SYMLINK_NOFOLLOW`.
//!
//! What it writes is what the sandbox's `tar -x` writes for the same archive: files,
//! directories and symbolic links (the only members of the canonical form; anything else is
//! refused), each member's permission bits and modification time (a directory's once its
//! contents are in, as GNU tar does), parents a member names without listing them made
//! `0755`. The owner is the header's where the workspace is root's (a sandbox running as root,
//! whose `tar -x` keeps the archive's owners) and otherwise the workspace's owner (a non-root
//! sandbox's `tar` makes every file its own). The staging directory is given to the
//! workspace's owner as soon as it is made, so the operator's swap and discard, which run in
//! the sandbox's container, can move and remove what is in it.
//!
//! The operator has already validated the stream and re-encoded it (paths, kinds, links,
//! sizes, limits), so the checks here are the ones that keep a write on the node beneath the
//! staging directory, whatever the stream says.
#![forbid(unsafe_code)]

use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, Gid, Mode, OFlags, Timespec, Timestamps, Uid};
use tar::EntryType;

use crate::archive::{STATE_DIR, open_root, resolve, sys};
use crate::{Error, Report};

/// The prefix of a staging directory's name under the workspace's `.agentbox` (as the exec
/// path's `EXTRACT_STREAM_SCRIPT` names it, so the swap finds it).
pub const STAGING_PREFIX: &str = "staging-";
/// Mode of a parent directory a member names without the archive listing it (`tar -x` makes
/// those with the default umask).
const IMPLICIT_DIR_MODE: u32 = 0o755;

/// Whether `id` may name a staging directory: letters, digits, `-` and `_` only.
pub fn is_staging_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Who owns what is extracted (see the module's docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Owners {
    /// The workspace's owner.
    uid: u32,
    gid: u32,
}

impl Owners {
    /// The owner of a member whose header says `uid`:`gid`.
    fn of(self, uid: u64, gid: u64) -> (Uid, Gid) {
        let (u, g) = if self.uid == 0 {
            (
                u32::try_from(uid).unwrap_or(0),
                u32::try_from(gid).unwrap_or(0),
            )
        } else {
            (self.uid, self.gid)
        };
        (Uid::from_raw(u), Gid::from_raw(g))
    }
}

/// Extracts the archive read from `input` into `root/.agentbox/staging-<id>` (made here; it
/// must not exist), `root` being a workspace (its `.agentbox` is made when absent).
pub fn extract(root: &Path, id: &str, input: impl Read) -> Result<Report, Error> {
    if !is_staging_id(id) {
        return Err(Error::Usage(format!("{id:?} is not a staging id")));
    }
    let root_fd = open_root(root)?;
    let st = rustix::fs::fstat(&root_fd).map_err(sys("inspecting", root))?;
    let owners = Owners {
        uid: st.st_uid,
        gid: st.st_gid,
    };
    // The operator's directory, made as the exec path's `mkdir -p .agentbox` makes it when
    // absent (a restore comes before the workspace's marker is written); never through a link.
    let state = match open_dir(root_fd.as_fd(), STATE_DIR.as_bytes()) {
        Err(rustix::io::Errno::NOENT) => {
            let at = root.join(STATE_DIR);
            rustix::fs::mkdirat(&root_fd, STATE_DIR, Mode::from_raw_mode(0o700))
                .map_err(sys("making", &at))?;
            let fd =
                open_dir(root_fd.as_fd(), STATE_DIR.as_bytes()).map_err(sys("opening", &at))?;
            rustix::fs::fchown(
                &fd,
                Some(Uid::from_raw(owners.uid)),
                Some(Gid::from_raw(owners.gid)),
            )
            .map_err(sys("changing the owner of", &at))?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(IMPLICIT_DIR_MODE))
                .map_err(sys("setting the mode of", &at))?;
            fd
        }
        other => other.map_err(sys("opening", &root.join(STATE_DIR)))?,
    };
    let name = format!("{STAGING_PREFIX}{id}");
    let staging_path = root.join(STATE_DIR).join(&name);
    rustix::fs::mkdirat(&state, name.as_str(), Mode::from_raw_mode(0o700))
        .map_err(sys("making", &staging_path))?;
    let staging =
        open_dir(state.as_fd(), name.as_bytes()).map_err(sys("opening", &staging_path))?;
    rustix::fs::fchown(
        &staging,
        Some(Uid::from_raw(owners.uid)),
        Some(Gid::from_raw(owners.gid)),
    )
    .map_err(sys("changing the owner of", &staging_path))?;
    let mut x = Extraction {
        staging: staging.as_fd(),
        path: staging_path,
        owners,
        parent: None,
        dirs: Vec::new(),
        members: 0,
        bytes: 0,
    };
    let mut archive = tar::Archive::new(input);
    let entries = archive.entries().map_err(x.read_err())?;
    for entry in entries {
        let entry = entry.map_err(x.read_err())?;
        x.member(entry)?;
    }
    x.finish_dirs()?;
    Ok(Report::default()
        .with("job", "extract")
        .with("members", x.members)
        .with("bytes", x.bytes))
}

/// Opens the directory `rel` beneath `at`, through no link.
fn open_dir(at: BorrowedFd<'_>, rel: &[u8]) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat2(
        at,
        Path::new(std::ffi::OsStr::from_bytes(rel)),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        resolve(),
    )
}

/// A member's path split into its parent (relative, `""` at the top) and its name, each
/// component plain; `None` for anything else (absolute, `.`, `..`, empty components, the
/// operator's own directory at the top).
fn split(path: &[u8]) -> Option<(&[u8], &[u8])> {
    let path = path.strip_suffix(b"/").unwrap_or(path);
    if path.is_empty() || path.starts_with(b"/") {
        return None;
    }
    let plain = |c: &[u8]| !c.is_empty() && c != b"." && c != b".." && !c.contains(&0);
    if !path.split(|b| *b == b'/').all(plain) {
        return None;
    }
    if path.split(|b| *b == b'/').next() == Some(STATE_DIR.as_bytes()) {
        return None;
    }
    Some(match path.iter().rposition(|b| *b == b'/') {
        Some(i) => (&path[..i], &path[i + 1..]),
        None => (&b""[..], path),
    })
}

fn time(secs: u64) -> Timestamps {
    let t = Timespec {
        tv_sec: i64::try_from(secs).unwrap_or(i64::MAX),
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

/// The extraction's state.
struct Extraction<'a> {
    staging: BorrowedFd<'a>,
    /// The staging directory's path, for errors.
    path: PathBuf,
    owners: Owners,
    /// The last parent directory opened (its relative path and descriptor): members come
    /// grouped by directory, so most reuse it.
    parent: Option<(Vec<u8>, OwnedFd)>,
    /// Directories made, in order, with their modification times (set at the end).
    dirs: Vec<(Vec<u8>, u64)>,
    members: u64,
    bytes: u64,
}

impl Extraction<'_> {
    fn at(&self, rel: &[u8]) -> PathBuf {
        self.path.join(std::ffi::OsStr::from_bytes(rel))
    }

    fn read_err(&self) -> impl FnOnce(std::io::Error) -> Error + use<> {
        let path = self.path.clone();
        move |source| Error::Io {
            what: "reading the archive for",
            path,
            source,
        }
    }

    /// The descriptor of the directory `rel` (made, with its missing parents, when absent).
    fn parent(&mut self, rel: &[u8]) -> Result<BorrowedFd<'_>, Error> {
        if self.parent.as_ref().is_none_or(|(p, _)| p != rel) {
            let fd = if rel.is_empty() {
                rustix::io::dup(self.staging).map_err(sys("opening", &self.path))?
            } else {
                match open_dir(self.staging, rel) {
                    Ok(fd) => fd,
                    Err(rustix::io::Errno::NOENT) => self.make_parents(rel)?,
                    Err(e) => return Err(sys("opening", &self.at(rel))(e)),
                }
            };
            self.parent = Some((rel.to_vec(), fd));
        }
        match &self.parent {
            Some((_, fd)) => Ok(fd.as_fd()),
            None => Err(sys("opening", &self.at(rel))(rustix::io::Errno::NOENT)),
        }
    }

    /// Makes the missing directories of `rel` (`0755`, the owner's), one component at a time.
    fn make_parents(&mut self, rel: &[u8]) -> Result<OwnedFd, Error> {
        let mut fd = rustix::io::dup(self.staging).map_err(sys("opening", &self.path))?;
        let mut done = Vec::new();
        for c in rel.split(|b| *b == b'/') {
            if !done.is_empty() {
                done.push(b'/');
            }
            done.extend_from_slice(c);
            let name = std::ffi::OsStr::from_bytes(c);
            match rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(0o700)) {
                Ok(()) => {
                    let child = open_dir(fd.as_fd(), c).map_err(sys("opening", &self.at(&done)))?;
                    // As `tar -x` makes them: its own (the workspace owner's).
                    let (u, g) = (
                        Uid::from_raw(self.owners.uid),
                        Gid::from_raw(self.owners.gid),
                    );
                    rustix::fs::fchown(&child, Some(u), Some(g))
                        .map_err(sys("changing the owner of", &self.at(&done)))?;
                    rustix::fs::fchmod(&child, Mode::from_raw_mode(IMPLICIT_DIR_MODE))
                        .map_err(sys("setting the mode of", &self.at(&done)))?;
                    fd = child;
                }
                Err(rustix::io::Errno::EXIST) => {
                    fd = open_dir(fd.as_fd(), c).map_err(sys("opening", &self.at(&done)))?;
                }
                Err(e) => return Err(sys("making", &self.at(&done))(e)),
            }
        }
        Ok(fd)
    }

    fn member<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> Result<(), Error> {
        let path = entry.path_bytes().into_owned();
        let Some((parent, name)) = split(&path) else {
            return Err(Error::BadArchive(format!(
                "archive member {:?} is not a plain relative path",
                String::from_utf8_lossy(&path)
            )));
        };
        let rel = path.strip_suffix(b"/").unwrap_or(&path).to_vec();
        let (parent, name) = (parent.to_vec(), name.to_vec());
        let h = entry.header().clone();
        let ty = h.entry_type();
        let mode = Mode::from_raw_mode(h.mode().map_err(self.read_err())? & 0o777);
        let (uid, gid) = self.owners.of(
            h.uid().map_err(self.read_err())?,
            h.gid().map_err(self.read_err())?,
        );
        let mtime = h.mtime().map_err(self.read_err())?;
        let at = self.at(&rel);
        let dir = self.parent(&parent)?;
        let name_os = std::ffi::OsStr::from_bytes(&name);
        match ty {
            EntryType::Directory => {
                rustix::fs::mkdirat(dir, name_os, Mode::from_raw_mode(0o700))
                    .map_err(sys("making", &at))?;
                let fd = open_dir(dir, &name).map_err(sys("opening", &at))?;
                rustix::fs::fchown(&fd, Some(uid), Some(gid))
                    .map_err(sys("changing the owner of", &at))?;
                rustix::fs::fchmod(&fd, mode).map_err(sys("setting the mode of", &at))?;
                self.dirs.push((rel, mtime));
            }
            EntryType::Regular | EntryType::Continuous => {
                let fd = rustix::fs::openat2(
                    dir,
                    name_os,
                    OFlags::WRONLY
                        | OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                    resolve(),
                )
                .map_err(sys("creating", &at))?;
                let mut file = std::fs::File::from(fd);
                let n = std::io::copy(&mut entry, &mut file).map_err(|source| Error::Io {
                    what: "writing",
                    path: at.clone(),
                    source,
                })?;
                self.bytes += n;
                rustix::fs::fchown(&file, Some(uid), Some(gid))
                    .map_err(sys("changing the owner of", &at))?;
                rustix::fs::fchmod(&file, mode).map_err(sys("setting the mode of", &at))?;
                rustix::fs::futimens(&file, &time(mtime))
                    .map_err(sys("setting the time of", &at))?;
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| {
                        Error::BadArchive(format!("symbolic link {} has no target", at.display()))
                    })?
                    .into_owned();
                rustix::fs::symlinkat(std::ffi::OsStr::from_bytes(&target), dir, name_os)
                    .map_err(sys("making the link", &at))?;
                rustix::fs::chownat(
                    dir,
                    name_os,
                    Some(uid),
                    Some(gid),
                    AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(sys("changing the owner of", &at))?;
                rustix::fs::utimensat(dir, name_os, &time(mtime), AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(sys("setting the time of", &at))?;
            }
            other => {
                return Err(Error::BadArchive(format!(
                    "archive member {} is a {other:?}: only files, directories and symbolic links are restored",
                    at.display()
                )));
            }
        }
        self.members += 1;
        Ok(())
    }

    /// Sets each directory's modification time, deepest first, once nothing more is made in
    /// it.
    fn finish_dirs(&mut self) -> Result<(), Error> {
        self.parent = None;
        let dirs = std::mem::take(&mut self.dirs);
        for (rel, mtime) in dirs.iter().rev() {
            let at = self.at(rel);
            let fd = open_dir(self.staging, rel).map_err(sys("opening", &at))?;
            rustix::fs::futimens(&fd, &time(*mtime)).map_err(sys("setting the time of", &at))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

    fn is_root() -> bool {
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    }

    fn workspace(name: &str) -> PathBuf {
        crate::archive::scratch_workspace(&format!("extract-{name}"))
    }

    /// An archive as the operator's canonical form writes one (ustar, GNU long names).
    fn archive(members: &[(&str, EntryType, &[u8], u32, u64)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, ty, data, mode, mtime) in members {
            let mut h = tar::Header::new_ustar();
            h.set_entry_type(*ty);
            h.set_mode(*mode);
            h.set_uid(1234);
            h.set_gid(5678);
            h.set_mtime(*mtime);
            if *ty == EntryType::Symlink {
                h.set_size(0);
                b.append_link(&mut h, path, std::str::from_utf8(data).unwrap())
                    .unwrap();
            } else {
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, *data).unwrap();
            }
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn an_archive_lands_in_its_staging_directory_with_modes_times_and_links() {
        let ws = workspace("roundtrip");
        let long = format!("d/{}", "n".repeat(150));
        let tar = archive(&[
            ("d/", EntryType::Directory, b"", 0o750, 1_000_000),
            ("d/f.txt", EntryType::Regular, b"hello", 0o640, 2_000_000),
            (&long, EntryType::Regular, b"long", 0o600, 3),
            ("d/link", EntryType::Symlink, b"f.txt", 0o777, 4),
            ("implicit/deep/file", EntryType::Regular, b"x", 0o755, 5),
            ("top", EntryType::Regular, b"", 0o444, 6),
        ]);
        let report = extract(&ws, "abc", &tar[..]).unwrap();
        assert!(report.line().contains("members=6"), "{}", report.line());
        let st = ws.join(".agentbox/staging-abc");
        assert_eq!(std::fs::read(st.join("d/f.txt")).unwrap(), b"hello");
        assert_eq!(std::fs::read(st.join(&long)).unwrap(), b"long");
        assert_eq!(
            std::fs::read_link(st.join("d/link")).unwrap(),
            Path::new("f.txt")
        );
        let meta = |p: &str| std::fs::symlink_metadata(st.join(p)).unwrap();
        assert_eq!(meta("d/f.txt").permissions().mode() & 0o7777, 0o640);
        assert_eq!(meta("d/f.txt").mtime(), 2_000_000);
        assert_eq!(meta("top").permissions().mode() & 0o7777, 0o444);
        // A directory's time is its member's, set after its contents were written.
        assert_eq!(meta("d").mtime(), 1_000_000);
        assert_eq!(meta("d").permissions().mode() & 0o7777, 0o750);
        assert_eq!(meta("d/link").mtime(), 4);
        // Parents named but not listed: 0755.
        assert_eq!(meta("implicit/deep").permissions().mode() & 0o7777, 0o755);
        // A root-owned workspace keeps the archive's owners (a root sandbox's tar does).
        if is_root() && meta(".").uid() == 0 {
            assert_eq!((meta("d/f.txt").uid(), meta("d/f.txt").gid()), (1234, 5678));
            assert_eq!((meta("d/link").uid(), meta("d/link").gid()), (1234, 5678));
        }
        std::fs::remove_dir_all(&ws).unwrap();
    }

    #[test]
    fn a_non_root_workspace_owns_everything_extracted() {
        if !is_root() {
            return; // chown needs root: the helper's pod runs as root
        }
        let ws = workspace("owner");
        std::os::unix::fs::chown(&ws, Some(1000), Some(1001)).unwrap();
        let tar = archive(&[
            ("a/", EntryType::Directory, b"", 0o755, 1),
            ("a/b", EntryType::Regular, b"b", 0o644, 1),
            ("a/l", EntryType::Symlink, b"b", 0o777, 1),
            ("c/d", EntryType::Regular, b"d", 0o644, 1),
        ]);
        extract(&ws, "own", &tar[..]).unwrap();
        let st = ws.join(".agentbox/staging-own");
        for p in [".", "a", "a/b", "a/l", "c", "c/d"] {
            let m = std::fs::symlink_metadata(st.join(p)).unwrap();
            assert_eq!((m.uid(), m.gid()), (1000, 1001), "{p}");
        }
        std::fs::remove_dir_all(&ws).unwrap();
    }

    #[test]
    fn nothing_is_written_through_a_link_or_outside_the_staging_directory() {
        let ws = workspace("links");
        let outside = ws.with_extension("outside");
        let _ = std::fs::remove_dir_all(&outside);
        std::fs::create_dir_all(&outside).unwrap();
        // A member whose parent is a link it made: refused, nothing written outside.
        let tar = archive(&[
            (
                "esc",
                EntryType::Symlink,
                outside.to_str().unwrap().as_bytes(),
                0o777,
                1,
            ),
            ("esc/pwned", EntryType::Regular, b"x", 0o644, 1),
        ]);
        let err = extract(&ws, "one", &tar[..]).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert!(!outside.join("pwned").exists());
        // Paths that leave: refused before anything is made for them.
        for (i, bad) in ["../up", "a/../../up", "/abs", ".agentbox/marker", "a//b"]
            .into_iter()
            .enumerate()
        {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(EntryType::Regular);
            h.set_size(1);
            h.set_mode(0o644);
            let name = bad.as_bytes();
            h.as_old_mut().name[..name.len()].copy_from_slice(name);
            h.set_cksum();
            let mut data = h.as_bytes().to_vec();
            data.extend_from_slice(&[b'x'; 512]);
            data.extend_from_slice(&[0; 1024]);
            let id = format!("bad{i}");
            let err = extract(&ws, &id, &data[..]).unwrap_err();
            assert!(matches!(err, Error::BadArchive(_)), "{bad}: {err}");
        }
        assert!(!ws.join("up").exists() && !ws.parent().unwrap().join("up").exists());
        // The state directory swapped for a link: refused, nothing made through it.
        let ws2 = workspace("statelink");
        std::fs::remove_dir_all(ws2.join(STATE_DIR)).unwrap();
        std::fs::create_dir_all(outside.join("agentbox")).unwrap();
        std::fs::write(outside.join("agentbox/marker"), "x").unwrap();
        symlink(outside.join("agentbox"), ws2.join(STATE_DIR)).unwrap();
        let tar = archive(&[("f", EntryType::Regular, b"x", 0o644, 1)]);
        let err = extract(&ws2, "s", &tar[..]).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert!(!outside.join("agentbox/staging-s").exists());
        // A workspace not yet marked (a restore comes first): its `.agentbox` is made.
        let ws3 = workspace("fresh");
        std::fs::remove_dir_all(ws3.join(STATE_DIR)).unwrap();
        extract(&ws3, "first", &tar[..]).unwrap();
        assert_eq!(
            std::fs::read(ws3.join(".agentbox/staging-first/f")).unwrap(),
            b"x"
        );
        let m = std::fs::metadata(ws3.join(STATE_DIR)).unwrap();
        assert_eq!(m.permissions().mode() & 0o7777, 0o755);
        // A staging directory that exists already is not reused.
        let tar = archive(&[("f", EntryType::Regular, b"x", 0o644, 1)]);
        extract(&ws, "twice", &tar[..]).unwrap();
        let err = extract(&ws, "twice", &tar[..]).unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
        assert!(!is_staging_id("../x") && !is_staging_id("") && is_staging_id("0123abcdef"));
        for d in [&ws, &ws2, &ws3, &outside] {
            std::fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn a_link_swapped_in_for_a_directory_mid_extraction_is_not_followed() {
        // The sandbox may be running: a directory the extraction made is replaced by a link
        // before its member arrives. The member is refused; nothing lands outside.
        let ws = workspace("swap");
        let outside = ws.with_extension("swap-outside");
        let _ = std::fs::remove_dir_all(&outside);
        std::fs::create_dir_all(&outside).unwrap();
        let tar = archive(&[
            ("d/", EntryType::Directory, b"", 0o755, 1),
            ("e", EntryType::Regular, b"e", 0o644, 1),
            ("d/f", EntryType::Regular, b"f", 0o644, 1),
        ]);
        // A reader that swaps `d` for a link once the first two members were read.
        struct Swapping<'a> {
            data: &'a [u8],
            pos: usize,
            at: PathBuf,
            to: PathBuf,
            done: bool,
        }
        impl Read for Swapping<'_> {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if !self.done && self.pos >= 3 * 512 {
                    std::fs::remove_dir(&self.at).unwrap();
                    symlink(&self.to, &self.at).unwrap();
                    self.done = true;
                }
                let n = buf.len().min(512).min(self.data.len() - self.pos);
                buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
                self.pos += n;
                Ok(n)
            }
        }
        let r = Swapping {
            data: &tar,
            pos: 0,
            at: ws.join(".agentbox/staging-sw/d"),
            to: outside.clone(),
            done: false,
        };
        let err = extract(&ws, "sw", r).unwrap_err();
        // Refused at the link (opened with O_NOFOLLOW | O_DIRECTORY: ENOTDIR), not for any
        // other reason.
        let shown = err.to_string();
        assert!(
            shown.contains("opening") && shown.contains("staging-sw/d:"),
            "{shown}"
        );
        assert!(!outside.join("f").exists());
        std::fs::remove_dir_all(&ws).unwrap();
        std::fs::remove_dir_all(&outside).unwrap();
    }
}
