//! The rules every member must pass, and the path tree they are checked against.
//!
//! The tree holds one node per path that extraction will create — explicit members and the
//! directories implied as their parents — keyed by (parent node, name), with the names in one
//! arena. A member costs at most one node per *new* component plus that component's bytes,
//! whatever its depth; every node counts against the member limit, and components, paths and
//! depth have hard limits of their own, so the whole check is bounded by
//! `max_members × (NAME_MAX + a few words)` however hostile the paths are. (The first version
//! kept a `HashMap<String, _>` with every ancestor prefix as its own string: a path of n
//! components of length L cost O(n²·L).)

use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::parse::{Member, MemberKind};
use super::{Limits, Refusal};

/// The operator's own directory in a workspace; never restored from an archive.
const RESERVED: &str = agentbox_api::remote::STATE_DIR;
/// Longest path accepted, in bytes: Linux's `PATH_MAX` less its NUL. `tar -x` could not open
/// a longer one.
pub const MAX_PATH_BYTES: usize = 4095;
/// Longest path component, in bytes (Linux's `NAME_MAX`): no Linux filesystem stores more.
pub const MAX_NAME_BYTES: usize = 255;
/// Most components in a path. Real trees (`node_modules` included) stay far below it.
pub const MAX_DEPTH: usize = 256;
/// Largest file: the most a ustar size field holds (8 GiB − 1). Larger sizes need base-256 or
/// a pax `size`, which busybox does not read.
pub const MAX_FILE_BYTES: u64 = 0o77777777777;
/// Largest uid or gid: the most a ustar id field holds.
pub const MAX_ID: u64 = 0o7777777;

/// What a path is in the tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// A directory only implied as some member's parent (extraction creates it).
    ImpliedDir,
    /// A directory member.
    Dir,
    /// A regular file member.
    File,
    /// A symlink member.
    Symlink,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    parent: u32,
    kind: NodeKind,
    /// Its name is `names[start..start + len]` (`len` ≤ [`MAX_NAME_BYTES`]).
    len: u8,
    start: usize,
}

/// The paths seen so far.
#[derive(Debug)]
struct Tree {
    nodes: Vec<Node>,
    names: Vec<u8>,
    /// Node ids, hashed by (parent, name).
    table: HashTable<u32>,
    /// Keyed SipHash: names come from the sandbox, which must not be able to aim collisions.
    hasher: std::hash::RandomState,
}

/// The root (the staging directory itself).
const ROOT: u32 = 0;

impl Tree {
    fn new() -> Self {
        Tree {
            nodes: vec![Node {
                parent: ROOT,
                kind: NodeKind::Dir,
                len: 0,
                start: 0,
            }],
            names: Vec::new(),
            table: HashTable::new(),
            hasher: std::hash::RandomState::new(),
        }
    }

    fn name(&self, n: &Node) -> &[u8] {
        &self.names[n.start..n.start + usize::from(n.len)]
    }

    fn hash(&self, parent: u32, name: &[u8]) -> u64 {
        self.hasher.hash_one((parent, name))
    }

    fn child(&self, parent: u32, name: &[u8]) -> Option<u32> {
        let h = self.hash(parent, name);
        self.table
            .find(h, |&id| {
                let n = &self.nodes[id as usize];
                n.parent == parent && self.name(n) == name
            })
            .copied()
    }

    /// Adds a child; the caller checked it is new and that `name` fits [`MAX_NAME_BYTES`].
    fn add(&mut self, parent: u32, name: &[u8], kind: NodeKind) -> u32 {
        let id = u32::try_from(self.nodes.len()).unwrap_or(u32::MAX);
        let start = self.names.len();
        self.names.extend_from_slice(name);
        self.nodes.push(Node {
            parent,
            kind,
            len: u8::try_from(name.len()).unwrap_or(u8::MAX),
            start,
        });
        let h = self.hash(parent, name);
        let (nodes, names, hasher) = (&self.nodes, &self.names, &self.hasher);
        self.table.insert_unique(h, id, |&i| {
            let n = &nodes[i as usize];
            hasher.hash_one((n.parent, &names[n.start..n.start + usize::from(n.len)]))
        });
        id
    }

    /// The path of a node, from the root.
    fn path(&self, mut id: u32) -> String {
        let mut parts = Vec::new();
        while id != ROOT {
            let n = &self.nodes[id as usize];
            parts.push(String::from_utf8_lossy(self.name(n)).into_owned());
            id = n.parent;
        }
        parts.reverse();
        parts.join("/")
    }
}

/// A member the rules accept, as the canonical form names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// Normalised path: no `.` or empty components, no leading `./`; directories end in `/`.
    pub path: String,
}

/// Checks each member against the rules and the limits.
#[derive(Debug)]
pub struct Validator {
    limits: Limits,
    total_input: Option<u64>,
    extracted: u64,
    root_seen: bool,
    tree: Tree,
}

/// A path shown in a message: long ones are cut.
fn shown(path: &str) -> String {
    const MAX: usize = 256;
    if path.len() <= MAX {
        return path.to_string();
    }
    let mut end = MAX;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &path[..end])
}

impl Validator {
    /// A validator with these limits. `total_input` is the archive's size when known in
    /// advance (for the expansion-ratio check at each header).
    pub fn new(limits: Limits, total_input: Option<u64>) -> Self {
        Validator {
            limits,
            total_input,
            extracted: 0,
            root_seen: false,
            tree: Tree::new(),
        }
    }

    /// Paths extraction creates (members and implied directories), not counting the root.
    pub fn paths(&self) -> u64 {
        self.tree.nodes.len() as u64 - 1
    }

    /// Every directory only implied as a parent, by path (for listings of what an archive
    /// extracts to).
    pub fn implied_dirs(&self) -> Vec<String> {
        (1..self.tree.nodes.len())
            .filter(|&i| self.tree.nodes[i].kind == NodeKind::ImpliedDir)
            .map(|i| self.tree.path(i as u32))
            .collect()
    }

    /// Checks one member; `None` for the root directory itself (`.`, `./`), which the
    /// canonical form leaves out.
    pub fn check(&mut self, m: &Member) -> Result<Option<Accepted>, Refusal> {
        let path = m.path.as_str();
        if path.is_empty() || path.contains('\0') {
            return Err(Refusal::InvalidPath(shown(path)));
        }
        if path.starts_with('/') {
            return Err(Refusal::AbsolutePath(shown(path)));
        }
        let mut depth = 0usize;
        let mut bytes = 0usize;
        for part in path.split('/').filter(|s| !s.is_empty() && *s != ".") {
            if part == ".." {
                return Err(Refusal::ParentComponent(shown(path)));
            }
            if part.len() > MAX_NAME_BYTES {
                return Err(Refusal::NameTooLong(shown(path)));
            }
            depth += 1;
            bytes += part.len() + 1;
        }
        if depth > MAX_DEPTH {
            return Err(Refusal::PathTooDeep {
                path: shown(path),
                limit: MAX_DEPTH,
            });
        }
        // As written: the names, a slash between each two, and one after a directory's.
        let len = bytes.saturating_sub(1) + usize::from(m.kind == MemberKind::Dir);
        if len > MAX_PATH_BYTES {
            return Err(Refusal::PathTooLong {
                path: shown(path),
                limit: MAX_PATH_BYTES,
            });
        }
        if depth == 0 {
            // The root itself: fine once, as a directory, and nothing to record.
            return match m.kind {
                MemberKind::Dir if !self.root_seen => {
                    self.root_seen = true;
                    Ok(None)
                }
                MemberKind::Dir => Err(Refusal::Duplicate(shown(path))),
                _ => Err(Refusal::InvalidPath(shown(path))),
            };
        }
        let mut parts = path.split('/').filter(|s| !s.is_empty() && *s != ".");
        if parts.clone().next() == Some(RESERVED) {
            return Err(Refusal::ReservedPath(shown(path)));
        }
        let kind = match m.kind {
            MemberKind::File => NodeKind::File,
            MemberKind::Dir => NodeKind::Dir,
            MemberKind::Symlink => NodeKind::Symlink,
            MemberKind::Hardlink => {
                return Err(Refusal::Hardlink {
                    path: shown(path),
                    target: shown(&m.link),
                });
            }
            MemberKind::CharDevice | MemberKind::BlockDevice => {
                return Err(Refusal::Device(shown(path)));
            }
            MemberKind::Fifo => return Err(Refusal::Fifo(shown(path))),
            MemberKind::Other(flag) => {
                return Err(Refusal::UnsupportedType {
                    path: shown(path),
                    flag: char::from(flag),
                });
            }
        };
        if m.uid > MAX_ID || m.gid > MAX_ID {
            return Err(Refusal::OwnerOutOfRange(shown(path)));
        }
        if kind == NodeKind::Symlink {
            check_symlink(path, depth - 1, &m.link)?;
        }
        if kind == NodeKind::File {
            if m.size > MAX_FILE_BYTES {
                return Err(Refusal::FileTooLarge(shown(path)));
            }
            self.extracted = self.extracted.saturating_add(m.size);
            if self.limits.max_extracted_bytes > 0
                && self.extracted > self.limits.max_extracted_bytes
            {
                return Err(Refusal::ExtractedTooLarge(self.limits.max_extracted_bytes));
            }
            if let (Some(total), r) = (self.total_input, self.limits.max_expansion_ratio)
                && r > 0
                && self.extracted > total.max(1).saturating_mul(r)
            {
                return Err(Refusal::ExpansionRatio(r));
            }
        }

        let mut out = String::with_capacity(bytes + 1);
        let mut parent = ROOT;
        for i in 0..depth {
            let part = parts.next().unwrap_or_default();
            if i > 0 {
                out.push('/');
            }
            out.push_str(part);
            let last = i + 1 == depth;
            match self.tree.child(parent, part.as_bytes()) {
                Some(id) => {
                    let node = &mut self.tree.nodes[id as usize];
                    match (node.kind, last) {
                        (NodeKind::ImpliedDir | NodeKind::Dir, false) => parent = id,
                        (NodeKind::Symlink, false) => {
                            return Err(Refusal::BeneathSymlink {
                                path: shown(path),
                                parent: shown(&out),
                            });
                        }
                        (NodeKind::File, false) => {
                            return Err(Refusal::BeneathFile {
                                path: shown(path),
                                parent: shown(&out),
                            });
                        }
                        // A directory first implied, then listed: it is the same directory.
                        (NodeKind::ImpliedDir, true) if kind == NodeKind::Dir => {
                            node.kind = NodeKind::Dir;
                        }
                        (_, true) => return Err(Refusal::Duplicate(shown(path))),
                    }
                }
                None => {
                    if self.limits.max_members > 0 && self.paths() >= self.limits.max_members {
                        return Err(Refusal::TooManyMembers(self.limits.max_members));
                    }
                    let k = if last { kind } else { NodeKind::ImpliedDir };
                    parent = self.tree.add(parent, part.as_bytes(), k);
                }
            }
        }
        if kind == NodeKind::Dir {
            out.push('/');
        }
        Ok(Some(Accepted { path: out }))
    }
}

/// A symlink at depth `depth` (number of directories above it below the root) may point
/// only inside the root, in canonical form: some `..` (at most `depth`), then names. (A `..`
/// after a name could climb out through another symlink.)
pub fn check_symlink(path: &str, depth: usize, target: &str) -> Result<(), Refusal> {
    let escapes = || Refusal::SymlinkEscapes {
        path: shown(path),
        target: shown(target),
    };
    if target.is_empty() || target.contains('\0') {
        return Err(Refusal::InvalidPath(shown(path)));
    }
    if target.len() > MAX_PATH_BYTES {
        return Err(Refusal::PathTooLong {
            path: shown(path),
            limit: MAX_PATH_BYTES,
        });
    }
    if target.starts_with('/') {
        return Err(escapes());
    }
    let mut ups = 0usize;
    let mut named = false;
    for part in target.split('/').filter(|s| !s.is_empty() && *s != ".") {
        if part == ".." {
            if named {
                return Err(Refusal::SymlinkNotCanonical {
                    path: shown(path),
                    target: shown(target),
                });
            }
            ups += 1;
            if ups > depth {
                return Err(escapes());
            }
        } else {
            named = true;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(path: &str, kind: MemberKind) -> Member {
        Member {
            path: path.into(),
            kind,
            size: 0,
            link: if kind == MemberKind::Symlink {
                "x".into()
            } else {
                String::new()
            },
            mode: 0o644,
            uid: 0,
            gid: 0,
            mtime: 0,
            offset: 0,
        }
    }

    fn accepted(v: &mut Validator, path: &str, kind: MemberKind) -> Result<String, String> {
        v.check(&member(path, kind))
            .map(|a| a.map(|a| a.path).unwrap_or_default())
            .map_err(|r| r.reason().to_string())
    }

    #[test]
    fn paths_are_normalised_and_directories_end_in_a_slash() {
        let mut v = Validator::new(Limits::default(), None);
        assert_eq!(accepted(&mut v, "./", MemberKind::Dir), Ok(String::new()));
        assert_eq!(
            accepted(&mut v, "./a//b/./", MemberKind::Dir),
            Ok("a/b/".into())
        );
        assert_eq!(
            accepted(&mut v, "a/b/c", MemberKind::File),
            Ok("a/b/c".into())
        );
        assert_eq!(accepted(&mut v, "a", MemberKind::Dir), Ok("a/".into()));
        assert_eq!(v.paths(), 3);
        // The same path spelt differently is the same path.
        assert_eq!(
            accepted(&mut v, "./a/b//c", MemberKind::File),
            Err("Duplicate".into())
        );
        assert_eq!(
            accepted(&mut v, ".", MemberKind::Dir),
            Err("Duplicate".into())
        );
    }

    #[test]
    fn implied_directories_count_as_members_and_can_be_listed_later() {
        let limits = Limits {
            max_members: 3,
            ..Limits::default()
        };
        let mut v = Validator::new(limits, None);
        assert!(accepted(&mut v, "x/y/f", MemberKind::File).is_ok());
        assert_eq!(v.implied_dirs(), vec!["x".to_string(), "x/y".to_string()]);
        assert_eq!(accepted(&mut v, "x/y", MemberKind::Dir), Ok("x/y/".into()));
        assert_eq!(v.implied_dirs(), vec!["x".to_string()]);
        assert_eq!(
            accepted(&mut v, "x/y", MemberKind::Dir),
            Err("Duplicate".into())
        );
        assert_eq!(
            accepted(&mut v, "x/g", MemberKind::File),
            Err("TooManyMembers".into())
        );
    }

    #[test]
    fn nothing_goes_beneath_a_file_or_a_symlink() {
        let mut v = Validator::new(Limits::default(), None);
        assert!(accepted(&mut v, "f", MemberKind::File).is_ok());
        assert!(accepted(&mut v, "d/l", MemberKind::Symlink).is_ok());
        assert_eq!(
            accepted(&mut v, "f/x", MemberKind::File),
            Err("BeneathFile".into())
        );
        assert_eq!(
            accepted(&mut v, "d/l/x/y", MemberKind::Dir),
            Err("BeneathSymlink".into())
        );
        assert_eq!(
            accepted(&mut v, "d", MemberKind::Symlink),
            Err("Duplicate".into())
        );
    }

    #[test]
    fn path_length_depth_and_name_limits_each_have_a_reason() {
        let mut v = Validator::new(Limits::default(), None);
        let deep = vec!["d"; MAX_DEPTH + 1].join("/");
        assert_eq!(
            accepted(&mut v, &deep, MemberKind::File),
            Err("PathTooDeep".into())
        );
        let ok_deep = vec!["d"; MAX_DEPTH].join("/");
        assert!(accepted(&mut v, &ok_deep, MemberKind::File).is_ok());
        let long = vec!["n".repeat(200); 21].join("/");
        assert_eq!(
            accepted(&mut v, &long, MemberKind::File),
            Err("PathTooLong".into())
        );
        let name = "n".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(
            accepted(&mut v, &name, MemberKind::File),
            Err("NameTooLong".into())
        );
        assert!(accepted(&mut v, &"n".repeat(MAX_NAME_BYTES), MemberKind::File).is_ok());
        // Extra slashes and dots do not count against a path's length.
        let padded = format!("{}x", "./".repeat(3000));
        assert_eq!(accepted(&mut v, &padded, MemberKind::File), Ok("x".into()));
    }

    #[test]
    fn symlink_rules() {
        assert!(check_symlink("a", 0, "b").is_ok());
        assert!(check_symlink("a", 0, ".").is_ok());
        assert!(check_symlink("d/a", 1, "../b/c").is_ok());
        assert!(check_symlink("d/a", 1, "./../b").is_ok());
        assert!(check_symlink("a", 0, "..").is_err());
        assert!(check_symlink("d/a", 1, "../..").is_err());
        assert!(check_symlink("d/a", 1, "b/../..").is_err());
        assert!(check_symlink("a", 0, "/tmp").is_err());
        assert!(check_symlink("a", 0, "").is_err());
        assert_eq!(
            check_symlink("a", 0, &"x".repeat(MAX_PATH_BYTES + 1))
                .unwrap_err()
                .reason(),
            "PathTooLong"
        );
    }

    #[test]
    fn a_tree_node_costs_its_name_and_a_few_words() {
        let mut t = Tree::new();
        let a = t.add(ROOT, b"a", NodeKind::Dir);
        let b = t.add(a, b"b", NodeKind::File);
        let b2 = t.add(ROOT, b"b", NodeKind::File);
        assert_eq!(t.child(ROOT, b"a"), Some(a));
        assert_eq!(t.child(a, b"b"), Some(b));
        assert_eq!(t.child(ROOT, b"b"), Some(b2));
        assert_eq!(t.child(b, b"b"), None);
        assert_eq!(t.path(b), "a/b");
        assert_eq!(t.names, b"abb");
        assert!(std::mem::size_of::<Node>() <= 24);
    }
}
