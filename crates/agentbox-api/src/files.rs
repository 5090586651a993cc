//! The file scripts' interface, as every client calls them: the argv that runs one on a path
//! confined to the workspace root, and the listing format of [`LIST`](crate::remote::LIST).
//! The scripts themselves are in [`crate::remote`].

use crate::paths::{PathError, confine};
use crate::remote::PROLOGUE;

/// The argv that runs a file `script` on `path` (confined to `root`) in the pod, and the
/// confined path: `sh -c PROLOGUE+script agentbox-files ROOT PATH`.
pub fn file_argv(script: &str, root: &str, path: &str) -> Result<(Vec<String>, String), PathError> {
    let p = confine(root, path)?;
    let argv = vec![
        "sh".to_string(),
        "-c".to_string(),
        format!("{PROLOGUE}{script}"),
        "agentbox-files".to_string(),
        root.to_string(),
        p.clone(),
    ];
    Ok((argv, p))
}

/// Kind of a directory entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (not followed).
    Symlink,
    /// Anything else (device, FIFO, socket).
    Other,
}

/// One entry of a directory listing (the Rust client's `Workspace::list_dir`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// File name (no directory part).
    pub name: String,
    /// What it is.
    pub kind: EntryKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (e.g. 0o644).
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
}

/// Parses the NUL-separated `"<hex mode> <size> <mtime> <name>"` records of the list script.
pub fn parse_listing(out: &[u8]) -> Result<Vec<DirEntry>, String> {
    let mut v = Vec::new();
    for rec in out.split(|&b| b == 0).filter(|r| !r.is_empty()) {
        let mut it = rec.splitn(4, |&b| b == b' ');
        let (Some(m), Some(s), Some(t), Some(name)) = (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(format!(
                "bad listing record {:?}",
                String::from_utf8_lossy(rec)
            ));
        };
        let parse = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let raw = u32::from_str_radix(&parse(m), 16).map_err(|e| e.to_string())?;
        let kind = match raw & 0o170000 {
            0o100000 => EntryKind::File,
            0o040000 => EntryKind::Dir,
            0o120000 => EntryKind::Symlink,
            _ => EntryKind::Other,
        };
        v.push(DirEntry {
            name: String::from_utf8_lossy(name).into_owned(),
            kind,
            size: parse(s)
                .parse()
                .map_err(|e: std::num::ParseIntError| e.to_string())?,
            mode: raw & 0o7777,
            mtime: parse(t)
                .parse()
                .map_err(|e: std::num::ParseIntError| e.to_string())?,
        });
    }
    v.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(v)
}
