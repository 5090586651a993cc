//! The `archive` job: a tar of a workspace directory on stdout, read on the node itself.
//!
//! The workspace belongs to the sandbox, whose code may plant symbolic links anywhere in it
//! and swap them in for directories while this walk runs. So nothing here resolves a path
//! through a link: the walk holds a file descriptor for each directory it is in and opens
//! every entry relative to it, one name at a time, with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` and `O_NOFOLLOW`. A link is archived as a
//! link (its target read with `readlinkat`), never followed; an entry that changed kind or
//! identity between being listed and being opened ends the job with [`Error::Changed`].
//!
//! What it writes is what the exec path's `tar -c` (`TAR_SCRIPT` in agentbox-api) writes for
//! the same tree, member for member, in the same order: the workspace root's entries but
//! `.agentbox` in the shell's glob order (`*`, then `.[!.]*`, then `..?*`, each sorted
//! bytewise), then each directory's entries in directory order, a directory before its
//! contents; the same mode, owner and modification time. Members the operator's archive rules
//! refuse are written as tar writes them (a FIFO, a device, the second name of a hard link),
//! so the operator refuses them with the same reason whichever path read the workspace;
//! sockets are left out, as tar leaves them out. The operator re-encodes the stream in its
//! canonical form, so the stored archive is the same bytes whichever path produced it (the
//! operator's tests check that against `tar -c`).
//!
//! The tar crate writes the headers (long names and link targets as GNU `L`/`K` records, as
//! tar does); link targets go in as their bytes (`set_link_name_literal`), since the crate's
//! path-based setter would tidy them (`a//b` to `a/b`) and so archive a different link.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use tar::{EntryType, Header};

use crate::{Error, Report};

/// The operator's directory in a workspace: never archived (as `TAR_SCRIPT` leaves it out).
pub const STATE_DIR: &str = ".agentbox";
/// The file every initialised workspace has; a workspace without it is refused, as the exec
/// path refuses it (archiving it would pass off an empty or partial tree as the sandbox's).
pub const MARKER: &str = ".agentbox/marker";
/// Deepest directory the walk descends into, in path components. The operator refuses members
/// deeper than 256 components (`PathTooDeep`); the walk writes the first member past that, so
/// the refusal is the same as for `tar -c`'s output, without holding a descriptor for every
/// level of an arbitrarily deep tree.
pub const DESCEND_LIMIT: usize = 257;

/// How every entry is resolved: beneath the directory descriptor, through no symbolic link
/// (nor a `/proc` magic link).
pub(crate) fn resolve() -> ResolveFlags {
    ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS
}

/// One listed entry of a directory: its name and what `lstat` saw.
struct Listed {
    name: Vec<u8>,
    stat: Stat,
}

/// Called with an entry's archive path after it was listed and before it is opened (a test's
/// chance to change the tree in between).
pub type BeforeOpen<'a> = &'a mut dyn FnMut(&[u8]);

/// Writes the archive of the workspace `root` to `out`; reports the members written and the
/// sockets left out.
pub fn archive(root: &Path, out: impl Write) -> Result<Report, Error> {
    archive_observed(root, out, &mut |_| {})
}

/// [`archive`], calling `before_open` between listing and opening each entry.
pub fn archive_observed(
    root: &Path,
    out: impl Write,
    before_open: BeforeOpen<'_>,
) -> Result<Report, Error> {
    let root_fd = open_root(root)?;
    check_marker(root_fd.as_fd(), root)?;
    let mut walk = Walk {
        root,
        builder: tar::Builder::new(out),
        links: HashMap::new(),
        members: 0,
        sockets: 0,
        before_open,
    };
    let mut top = walk.list(root_fd.as_fd(), b"")?;
    top.retain(|e| e.name != STATE_DIR.as_bytes());
    top.sort_by(|a, b| (glob_group(&a.name), &a.name).cmp(&(glob_group(&b.name), &b.name)));
    for e in top {
        walk.entry(root_fd.as_fd(), b"", e, 1)?;
    }
    walk.builder.finish().map_err(|e| Error::Io {
        what: "writing the archive of",
        path: root.to_path_buf(),
        source: e,
    })?;
    let mut out = walk.builder.into_inner().map_err(|e| Error::Io {
        what: "writing the archive of",
        path: root.to_path_buf(),
        source: e,
    })?;
    out.flush().map_err(|e| Error::Io {
        what: "writing the archive of",
        path: root.to_path_buf(),
        source: e,
    })?;
    Ok(Report::default()
        .with("job", "archive")
        .with("members", walk.members)
        .with("sockets", walk.sockets))
}

/// Which of `TAR_SCRIPT`'s globs names a top-level entry: `*` (0), `.[!.]*` (1), `..?*` (2).
fn glob_group(name: &[u8]) -> u8 {
    match name {
        [b'.', b'.', ..] => 2,
        [b'.', ..] => 1,
        _ => 0,
    }
}

/// Refuses a workspace whose marker is missing or is not a regular file (a link is not
/// followed to find one).
fn check_marker(root_fd: BorrowedFd<'_>, root: &Path) -> Result<(), Error> {
    let missing = || Error::NotAWorkspace(root.to_path_buf());
    let fd = match rustix::fs::openat2(
        root_fd,
        MARKER,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        resolve(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR) => {
            return Err(missing());
        }
        Err(e) => return Err(sys("opening", &root.join(MARKER))(e)),
    };
    let st = rustix::fs::fstat(&fd).map_err(sys("inspecting", &root.join(MARKER)))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(missing());
    }
    Ok(())
}

/// A workspace's directory (the helper's mount of it), opened through no link.
pub(crate) fn open_root(root: &Path) -> Result<OwnedFd, Error> {
    rustix::fs::openat2(
        rustix::fs::CWD,
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(sys("opening", root))
}

/// A `rustix` error as the helper's [`Error::Io`].
pub(crate) fn sys(
    what: &'static str,
    path: &Path,
) -> impl FnOnce(rustix::io::Errno) -> Error + use<> {
    let path = path.to_path_buf();
    move |e| Error::Io {
        what,
        path,
        source: e.into(),
    }
}

/// The walk's state.
struct Walk<'a, W: Write> {
    root: &'a Path,
    builder: tar::Builder<W>,
    /// Non-directories with more than one name, by (device, inode): the first name archived.
    links: HashMap<(u64, u64), Vec<u8>>,
    members: u64,
    sockets: u64,
    before_open: BeforeOpen<'a>,
}

/// `parent/name` (or `name` at the top).
fn join(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(parent.len() + 1 + name.len());
    if !parent.is_empty() {
        p.extend_from_slice(parent);
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn os(p: &[u8]) -> &Path {
    Path::new(OsStr::from_bytes(p))
}

impl<W: Write> Walk<'_, W> {
    fn path(&self, rel: &[u8]) -> PathBuf {
        self.root.join(os(rel))
    }

    fn write_err(&self, rel: &[u8]) -> impl FnOnce(std::io::Error) -> Error + use<W> {
        let path = self.path(rel);
        move |source| Error::Io {
            what: "archiving",
            path,
            source,
        }
    }

    /// The entries of the directory `dir` (at `rel`), in directory order, each with its
    /// `lstat`.
    fn list(&self, dir: BorrowedFd<'_>, rel: &[u8]) -> Result<Vec<Listed>, Error> {
        let path = self.path(rel);
        let mut out = Vec::new();
        for e in rustix::fs::Dir::read_from(dir).map_err(sys("reading", &path))? {
            let e = e.map_err(sys("reading", &path))?;
            let name = e.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let stat = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                .map_err(sys("inspecting", &self.path(&join(rel, name.to_bytes()))))?;
            out.push(Listed {
                name: name.to_bytes().to_vec(),
                stat,
            });
        }
        Ok(out)
    }

    /// Opens `name` in `dir` (a directory or regular file, as listed), refusing what is no
    /// longer the entry that was listed.
    fn open(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &[u8],
        rel: &[u8],
        listed: &Stat,
        flags: OFlags,
    ) -> Result<(OwnedFd, Stat), Error> {
        (self.before_open)(rel);
        let changed = || Error::Changed(self.path(rel));
        // NONBLOCK and NOCTTY: should a FIFO or a terminal be swapped in, the open neither
        // waits for a writer nor takes it as the helper's terminal.
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY;
        let fd = match rustix::fs::openat2(dir, os(name), flags, Mode::empty(), resolve()) {
            Ok(fd) => fd,
            // A link (ELOOP), a non-directory (ENOTDIR) or nothing (ENOENT) where the listing
            // saw something else.
            Err(rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR | rustix::io::Errno::NOENT) => {
                return Err(changed());
            }
            Err(e) => return Err(sys("opening", &self.path(rel))(e)),
        };
        let st = rustix::fs::fstat(&fd).map_err(sys("inspecting", &self.path(rel)))?;
        let kind = |s: &Stat| FileType::from_raw_mode(s.st_mode);
        if (st.st_dev, st.st_ino) != (listed.st_dev, listed.st_ino) || kind(&st) != kind(listed) {
            return Err(changed());
        }
        Ok((fd, st))
    }

    /// Archives one entry of `dir` (whose archive path is `parent`), `depth` components deep,
    /// and what is below it.
    fn entry(
        &mut self,
        dir: BorrowedFd<'_>,
        parent: &[u8],
        e: Listed,
        depth: usize,
    ) -> Result<(), Error> {
        let rel = join(parent, &e.name);
        match FileType::from_raw_mode(e.stat.st_mode) {
            FileType::Directory => {
                let (fd, st) = self.open(
                    dir,
                    &e.name,
                    &rel,
                    &e.stat,
                    OFlags::RDONLY | OFlags::DIRECTORY,
                )?;
                let mut h = header(&st, EntryType::Directory, 0);
                let mut name = rel.clone();
                name.push(b'/');
                self.builder
                    .append_data(&mut h, os(&name), std::io::empty())
                    .map_err(self.write_err(&rel))?;
                self.members += 1;
                if depth < DESCEND_LIMIT {
                    for child in self.list(fd.as_fd(), &rel)? {
                        self.entry(fd.as_fd(), &rel, child, depth + 1)?;
                    }
                }
            }
            FileType::RegularFile => {
                if let Some(first) = self.hard_link(&e.stat, &rel) {
                    return self.link(&e.stat, EntryType::Link, &rel, &first);
                }
                let (fd, st) = self.open(dir, &e.name, &rel, &e.stat, OFlags::RDONLY)?;
                let size = u64::try_from(st.st_size).unwrap_or(0);
                let mut h = header(&st, EntryType::Regular, size);
                let file = std::fs::File::from(fd);
                let data = Exact {
                    inner: (&file).take(size),
                    left: size,
                };
                self.builder
                    .append_data(&mut h, os(&rel), data)
                    .map_err(self.write_err(&rel))?;
                self.members += 1;
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(dir, os(&e.name), Vec::new())
                    .map_err(sys("reading the link", &self.path(&rel)))?;
                self.link(&e.stat, EntryType::Symlink, &rel, target.as_bytes())?;
            }
            // Sockets: tar leaves them out too ("socket ignored").
            FileType::Socket => self.sockets += 1,
            other => {
                if let Some(first) = self.hard_link(&e.stat, &rel) {
                    return self.link(&e.stat, EntryType::Link, &rel, &first);
                }
                let ty = match other {
                    FileType::Fifo => EntryType::Fifo,
                    FileType::CharacterDevice => EntryType::Char,
                    FileType::BlockDevice => EntryType::Block,
                    _ => return Err(Error::Changed(self.path(&rel))),
                };
                // Written as tar writes it, for the operator to refuse by its own rules.
                let mut h = header(&e.stat, ty, 0);
                self.builder
                    .append_data(&mut h, os(&rel), std::io::empty())
                    .map_err(self.write_err(&rel))?;
                self.members += 1;
            }
        }
        Ok(())
    }

    /// The name this file was first archived under, when it has more than one and this is
    /// not the first; else records `rel` as its first.
    fn hard_link(&mut self, st: &Stat, rel: &[u8]) -> Option<Vec<u8>> {
        if st.st_nlink <= 1 {
            return None;
        }
        let key = (st.st_dev, st.st_ino);
        if let Some(first) = self.links.get(&key) {
            return Some(first.clone());
        }
        self.links.insert(key, rel.to_vec());
        None
    }

    /// A symbolic or hard link member `rel` to `target` (its bytes as they are; a long one in
    /// a GNU `K` record before the header, as tar writes it).
    fn link(&mut self, st: &Stat, ty: EntryType, rel: &[u8], target: &[u8]) -> Result<(), Error> {
        let mut h = header(st, ty, 0);
        if target.len() >= 100 {
            let mut k = Header::new_gnu();
            let long = b"././@LongLink";
            k.as_old_mut().name[..long.len()].copy_from_slice(long);
            k.set_mode(0o644);
            k.set_entry_type(EntryType::GNULongLink);
            let len = target.len() as u64 + 1;
            k.set_size(len);
            k.set_cksum();
            let data = target.chain(&[0u8][..]);
            self.builder.append(&k, data).map_err(self.write_err(rel))?;
            h.set_link_name_literal(&target[..99])
                .map_err(self.write_err(rel))?;
        } else {
            h.set_link_name_literal(target)
                .map_err(self.write_err(rel))?;
        }
        self.builder
            .append_data(&mut h, os(rel), std::io::empty())
            .map_err(self.write_err(rel))?;
        self.members += 1;
        Ok(())
    }
}

/// A header for `st` as tar writes one: permission and mode bits, owner, modification time.
fn header(st: &Stat, ty: EntryType, size: u64) -> Header {
    let mut h = Header::new_ustar();
    h.set_entry_type(ty);
    h.set_mode(st.st_mode & 0o7777);
    h.set_uid(u64::from(st.st_uid));
    h.set_gid(u64::from(st.st_gid));
    h.set_mtime(u64::try_from(st.st_mtime).unwrap_or(0));
    h.set_size(size);
    h
}

/// A file's data, exactly as many bytes as its header says: one that shrank while it was read
/// is an error (tar's `append` would pad the member short and shift every later header), and
/// bytes it grew by are not read.
struct Exact<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let n = self.inner.read(buf)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "the file shrank while it was read ({} bytes short)",
                    self.left
                ),
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Reads stdin until it ends, for at most `limit`: the exec's process must not exit before
/// the operator has the whole archive (see `TAR_SCRIPT`: output still on its way when an exec
/// ends can be dropped, so the operator ends stdin once the archive's end marker arrived).
pub fn linger(limit: std::time::Duration) {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut sink = [0u8; 512];
        let mut stdin = std::io::stdin().lock();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(limit);
}

/// A fresh initialised workspace for the tests (`.agentbox/marker` in it), named for `name`
/// and this process.
#[cfg(test)]
pub(crate) fn scratch_workspace(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("agentbox-helper-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join(STATE_DIR)).unwrap();
    std::fs::write(d.join(MARKER), "uid").unwrap();
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn scratch(name: &str) -> PathBuf {
        scratch_workspace(&format!("archive-{name}"))
    }

    /// A member's path, type, link name and data.
    type Member = (Vec<u8>, EntryType, Vec<u8>, Vec<u8>);

    /// Every member of `tar`.
    fn members(tar: &[u8]) -> Vec<Member> {
        let mut a = tar::Archive::new(tar);
        a.entries()
            .unwrap()
            .map(|e| {
                let mut e = e.unwrap();
                let path = e.path_bytes().to_vec();
                let ty = e.header().entry_type();
                let link = e.link_name_bytes().map(|l| l.to_vec()).unwrap_or_default();
                let mut data = Vec::new();
                e.read_to_end(&mut data).unwrap();
                (path, ty, link, data)
            })
            .collect()
    }

    fn names(tar: &[u8]) -> Vec<String> {
        members(tar)
            .into_iter()
            .map(|m| String::from_utf8_lossy(&m.0).into_owned())
            .collect()
    }

    #[test]
    fn a_link_to_outside_is_archived_as_a_link_and_not_followed() {
        let root = scratch("outside");
        let outside = scratch("outside-target");
        std::fs::write(outside.join("secret"), "node's").unwrap();
        symlink(&outside, root.join("out")).unwrap();
        symlink("/etc/passwd", root.join("passwd")).unwrap();
        let mut tar = Vec::new();
        let r = archive(&root, &mut tar).unwrap();
        assert_eq!(r.get("members"), Some("2"));
        let m = members(&tar);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].0, b"out");
        assert_eq!(m[0].1, EntryType::Symlink);
        assert_eq!(m[0].2, outside.as_os_str().as_bytes());
        assert_eq!(m[1].2, b"/etc/passwd");
        assert!(
            !tar.windows(6).any(|w| w == b"node's"),
            "nothing of the target"
        );
    }

    #[test]
    fn a_link_swapped_in_for_a_directory_between_listing_and_opening_is_not_followed() {
        let root = scratch("swap");
        let outside = scratch("swap-target");
        std::fs::write(outside.join("secret"), "node's").unwrap();
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/f"), "mine").unwrap();
        let mut swapped = false;
        let mut swap = |rel: &[u8]| {
            if rel == b"d" && !swapped {
                std::fs::rename(root.join("d"), root.join("d.old")).unwrap();
                symlink(&outside, root.join("d")).unwrap();
                swapped = true;
            }
        };
        let mut tar = Vec::new();
        let e = archive_observed(&root, &mut tar, &mut swap).unwrap_err();
        assert!(swapped);
        assert!(matches!(&e, Error::Changed(p) if p.ends_with("d")), "{e}");
        assert!(!tar.windows(6).any(|w| w == b"node's"));
        // Once the tree holds still, the link is archived as what it is.
        let mut tar = Vec::new();
        archive(&root, &mut tar).unwrap();
        let m = members(&tar);
        let d = m.iter().find(|m| m.0 == b"d").unwrap();
        assert_eq!(d.1, EntryType::Symlink);
        assert!(!tar.windows(6).any(|w| w == b"node's"));
    }

    #[test]
    fn a_directory_swapped_for_another_is_refused_as_changed() {
        let root = scratch("swapdir");
        std::fs::create_dir(root.join("a")).unwrap();
        std::fs::create_dir(root.join("b")).unwrap();
        let mut swap = |rel: &[u8]| {
            if rel == b"a" {
                std::fs::remove_dir(root.join("a")).unwrap();
                std::fs::rename(root.join("b"), root.join("a")).unwrap();
            }
        };
        let e = archive_observed(&root, Vec::new(), &mut swap).unwrap_err();
        assert!(matches!(&e, Error::Changed(p) if p.ends_with("a")), "{e}");
    }

    #[test]
    fn hard_links_are_written_as_tar_writes_them() {
        let root = scratch("hard");
        std::fs::write(root.join("a"), "x").unwrap();
        std::fs::hard_link(root.join("a"), root.join("b")).unwrap();
        let mut tar = Vec::new();
        archive(&root, &mut tar).unwrap();
        let m = members(&tar);
        assert_eq!(m[0].1, EntryType::Regular);
        assert_eq!(m[0].3, b"x");
        assert_eq!((m[1].0.as_slice(), m[1].1), (&b"b"[..], EntryType::Link));
        assert_eq!(m[1].2, b"a");
    }

    #[test]
    fn big_and_empty_files_keep_their_size() {
        let root = scratch("sizes");
        std::fs::write(root.join("empty"), "").unwrap();
        let big: Vec<u8> = (0..(3 << 20) + 7).map(|i| (i % 251) as u8).collect();
        std::fs::write(root.join("big"), &big).unwrap();
        let mut tar = Vec::new();
        archive(&root, &mut tar).unwrap();
        let m = members(&tar);
        let get = |n: &[u8]| m.iter().find(|m| m.0 == n).unwrap().3.clone();
        assert_eq!(get(b"empty"), b"");
        assert_eq!(get(b"big"), big);
        assert_eq!(tar.len() % 512, 0);
    }

    #[test]
    fn odd_names_long_names_and_long_targets_survive() {
        let root = scratch("odd");
        let odd = OsStr::from_bytes(b"new\nline \xff\\ tab\t");
        std::fs::write(root.join(odd), "o").unwrap();
        let long = "n".repeat(200);
        std::fs::create_dir(root.join(&long)).unwrap();
        std::fs::write(root.join(&long).join("f"), "l").unwrap();
        let target = format!("{}//./x", "t".repeat(120));
        symlink(&target, root.join("l")).unwrap();
        symlink("a//b", root.join("s")).unwrap();
        let mut tar = Vec::new();
        archive(&root, &mut tar).unwrap();
        let m = members(&tar);
        let get = |n: &[u8]| m.iter().find(|m| m.0 == n).unwrap().clone();
        assert_eq!(get(odd.as_bytes()).3, b"o");
        assert_eq!(get(format!("{long}/f").as_bytes()).3, b"l");
        assert_eq!(get(b"l").2, target.as_bytes(), "a long target, as it is");
        assert_eq!(get(b"s").2, b"a//b", "a short one, untidied");
    }

    #[test]
    fn a_fifo_is_written_not_opened_and_a_socket_left_out() {
        let root = scratch("fifo");
        let st = std::process::Command::new("mkfifo")
            .arg(root.join("p"))
            .status()
            .unwrap();
        assert!(st.success());
        let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
        let mut tar = Vec::new();
        // Opening the FIFO would wait for a writer forever: finishing shows it was not.
        let r = archive(&root, &mut tar).unwrap();
        assert_eq!(r.get("sockets"), Some("1"));
        let m = members(&tar);
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].0.as_slice(), m[0].1), (&b"p"[..], EntryType::Fifo));
    }

    #[test]
    fn the_top_level_is_in_glob_order_and_the_state_directory_left_out() {
        let root = scratch("order");
        for n in ["b", "a", ".z", ".a", "..x", "B", "_"] {
            std::fs::write(root.join(n), n).unwrap();
        }
        let mut tar = Vec::new();
        archive(&root, &mut tar).unwrap();
        assert_eq!(names(&tar), ["B", "_", "a", "b", ".a", ".z", "..x"]);
    }

    #[test]
    fn a_workspace_without_its_marker_is_refused() {
        let root = scratch("nomarker");
        std::fs::remove_file(root.join(MARKER)).unwrap();
        assert!(matches!(
            archive(&root, Vec::new()),
            Err(Error::NotAWorkspace(_))
        ));
        // A link to a marker elsewhere is no marker.
        let other = scratch("nomarker-other");
        symlink(other.join(MARKER), root.join(MARKER)).unwrap();
        assert!(matches!(
            archive(&root, Vec::new()),
            Err(Error::NotAWorkspace(_))
        ));
        std::fs::remove_file(root.join(MARKER)).unwrap();
        std::fs::remove_dir(root.join(STATE_DIR)).unwrap();
        symlink(other.join(STATE_DIR), root.join(STATE_DIR)).unwrap();
        assert!(matches!(
            archive(&root, Vec::new()),
            Err(Error::NotAWorkspace(_))
        ));
    }

    #[test]
    fn an_empty_workspace_is_an_empty_archive() {
        let root = scratch("empty");
        let mut tar = Vec::new();
        archive(&root, &mut tar).unwrap();
        assert_eq!(tar, vec![0u8; 1024]);
    }

    #[test]
    fn a_file_that_shrinks_is_an_error_not_a_short_member() {
        let root = scratch("shrink");
        std::fs::write(root.join("f"), vec![1u8; 4096]).unwrap();
        let data = Exact {
            inner: std::fs::File::open(root.join("f")).unwrap().take(4096),
            left: 8192,
        };
        let mut sink = Vec::new();
        let e = std::io::copy(&mut { data }, &mut sink).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
    }
}
