//! Workspace tarballs: a streaming tar parser, a validator that refuses anything unsafe to
//! extract, and limits.
//!
//! Everything here is pure and push-based: bytes go in chunk by chunk ([`TarStream::feed`]),
//! so an archive of any size is checked in constant memory (plus one entry per member for the
//! duplicate and beneath-a-symlink checks, bounded by the member limit). The restore path
//! validates each member header before any of its bytes reach the pod; the snapshot path runs
//! the same validator over what it uploads (and reports its member count and digest), so a
//! snapshot that is Ready can also be restored.
//!
//! Formats understood: ustar (with the `prefix` field), GNU (`L`/`K` long names, base-256
//! sizes) and pax (`x` per-member `path`, `linkpath`, `size`; `g` global headers are skipped).

use std::collections::HashMap;
use std::fmt;

use sha2::{Digest, Sha256};

/// Tar block size.
const BLOCK: usize = 512;
/// Largest GNU long-name or pax extended header accepted.
const MAX_EXTENSION: u64 = 64 << 10;
/// The operator's own directory in a workspace; never restored from an archive.
const RESERVED: &str = ".agentbox";

/// Limits on an archive being restored. `0` disables a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest archive (bytes of tar input).
    pub max_input_bytes: u64,
    /// Largest total size of the regular files it holds.
    pub max_extracted_bytes: u64,
    /// Most members (files, directories, symlinks).
    pub max_members: u64,
    /// Largest ratio of extracted bytes to archive bytes.
    pub max_expansion_ratio: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_input_bytes: 1 << 30,
            max_extracted_bytes: 4 << 30,
            max_members: 100_000,
            max_expansion_ratio: 100,
        }
    }
}

/// Why an archive was refused. Each variant is a distinct reason; [`Refusal::reason`] gives
/// its condition reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A member path starts with `/`.
    #[error("member {0:?} has an absolute path")]
    AbsolutePath(String),
    /// A member path has a `..` component.
    #[error("member {0:?} has a '..' component")]
    ParentComponent(String),
    /// A member path is empty, has a NUL, or is not UTF-8.
    #[error("member path {0:?} is empty or invalid")]
    InvalidPath(String),
    /// A member lies in the operator's own `.agentbox` directory.
    #[error("member {0:?} lies in the reserved .agentbox directory")]
    ReservedPath(String),
    /// A hard link.
    #[error("member {path:?} is a hard link (to {target:?})")]
    Hardlink {
        /// Member path.
        path: String,
        /// Link target.
        target: String,
    },
    /// A character or block device.
    #[error("member {0:?} is a device")]
    Device(String),
    /// A FIFO.
    #[error("member {0:?} is a FIFO")]
    Fifo(String),
    /// A member type that is not a file, directory or symlink (sparse files, volume labels...).
    #[error("member {path:?} has unsupported type {flag:?}")]
    UnsupportedType {
        /// Member path.
        path: String,
        /// The tar type flag.
        flag: char,
    },
    /// A symlink whose target is absolute or climbs above the workspace root.
    #[error("symlink {path:?} points outside the workspace ({target:?})")]
    SymlinkEscapes {
        /// Member path.
        path: String,
        /// Link target.
        target: String,
    },
    /// A symlink target with `..` after a named component (`a/../b`), which could climb out
    /// through another symlink.
    #[error("symlink {path:?} has a non-canonical target {target:?}")]
    SymlinkNotCanonical {
        /// Member path.
        path: String,
        /// Link target.
        target: String,
    },
    /// A member below a path that is a symlink.
    #[error("member {path:?} lies beneath the symlink {parent:?}")]
    BeneathSymlink {
        /// Member path.
        path: String,
        /// The symlink.
        parent: String,
    },
    /// A member below a path that is a regular file.
    #[error("member {path:?} lies beneath the file {parent:?}")]
    BeneathFile {
        /// Member path.
        path: String,
        /// The file.
        parent: String,
    },
    /// A path that appears twice (or first as a directory, then as something else).
    #[error("member {0:?} appears more than once")]
    Duplicate(String),
    /// Too many members.
    #[error("more than {0} members")]
    TooManyMembers(u64),
    /// The archive is too large.
    #[error("archive larger than {0} bytes")]
    InputTooLarge(u64),
    /// The files would take too much space.
    #[error("extracted size over {0} bytes")]
    ExtractedTooLarge(u64),
    /// The files would be far larger than the archive (a header that lies about sizes).
    #[error("extracted size over {0} times the archive size")]
    ExpansionRatio(u64),
    /// A header's checksum is wrong.
    #[error("bad header checksum at offset {0}")]
    BadChecksum(u64),
    /// A header field cannot be parsed.
    #[error("malformed header at offset {offset}: {what}")]
    BadHeader {
        /// Byte offset of the header.
        offset: u64,
        /// What is wrong.
        what: &'static str,
    },
    /// A long-name or pax header over the size accepted.
    #[error("extended header at offset {0} is too large")]
    HeaderTooLarge(u64),
    /// The archive ends inside a member.
    #[error("archive truncated inside a member")]
    Truncated,
    /// The archive's SHA-256 is not the recorded one.
    #[error("digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch {
        /// Recorded digest.
        expected: String,
        /// Digest of the bytes read.
        actual: String,
    },
    /// The archive's size is not the recorded one.
    #[error("size mismatch: expected {expected} bytes, got {actual}")]
    SizeMismatch {
        /// Recorded size.
        expected: u64,
        /// Bytes read.
        actual: u64,
    },
}

impl Refusal {
    /// The reason, CamelCase, for conditions and Events.
    pub fn reason(&self) -> &'static str {
        match self {
            Refusal::AbsolutePath(_) => "AbsolutePath",
            Refusal::ParentComponent(_) => "ParentComponent",
            Refusal::InvalidPath(_) => "InvalidPath",
            Refusal::ReservedPath(_) => "ReservedPath",
            Refusal::Hardlink { .. } => "Hardlink",
            Refusal::Device(_) => "Device",
            Refusal::Fifo(_) => "Fifo",
            Refusal::UnsupportedType { .. } => "UnsupportedType",
            Refusal::SymlinkEscapes { .. } => "SymlinkEscapes",
            Refusal::SymlinkNotCanonical { .. } => "SymlinkNotCanonical",
            Refusal::BeneathSymlink { .. } => "BeneathSymlink",
            Refusal::BeneathFile { .. } => "BeneathFile",
            Refusal::Duplicate(_) => "Duplicate",
            Refusal::TooManyMembers(_) => "TooManyMembers",
            Refusal::InputTooLarge(_) => "InputTooLarge",
            Refusal::ExtractedTooLarge(_) => "ExtractedTooLarge",
            Refusal::ExpansionRatio(_) => "ExpansionRatio",
            Refusal::BadChecksum(_) => "BadChecksum",
            Refusal::BadHeader { .. } => "BadHeader",
            Refusal::HeaderTooLarge(_) => "HeaderTooLarge",
            Refusal::Truncated => "Truncated",
            Refusal::DigestMismatch { .. } => "DigestMismatch",
            Refusal::SizeMismatch { .. } => "SizeMismatch",
        }
    }
}

/// Kind of a tar member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberKind {
    /// Regular file (`0`, NUL, `7`).
    File,
    /// Directory (`5`).
    Dir,
    /// Symbolic link (`2`).
    Symlink,
    /// Hard link (`1`).
    Hardlink,
    /// Character device (`3`).
    CharDevice,
    /// Block device (`4`).
    BlockDevice,
    /// FIFO (`6`).
    Fifo,
    /// Anything else, with its type flag.
    Other(u8),
}

impl MemberKind {
    fn from_flag(flag: u8) -> Self {
        match flag {
            b'0' | 0 | b'7' => MemberKind::File,
            b'5' => MemberKind::Dir,
            b'2' => MemberKind::Symlink,
            b'1' => MemberKind::Hardlink,
            b'3' => MemberKind::CharDevice,
            b'4' => MemberKind::BlockDevice,
            b'6' => MemberKind::Fifo,
            other => MemberKind::Other(other),
        }
    }
}

/// One member as the archive describes it (long names and pax overrides applied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Path as written in the archive.
    pub path: String,
    /// Kind.
    pub kind: MemberKind,
    /// Size of its data.
    pub size: u64,
    /// Link target (symlinks and hard links).
    pub link: String,
}

#[derive(Debug)]
enum State {
    /// Collecting a 512-byte header.
    Header,
    /// Skipping `remaining` data bytes, then `padding`.
    Data { remaining: u64, padding: u64 },
    /// Collecting an extension's data (`L`, `K`, `x`, `g`), then `padding`.
    Extension {
        flag: u8,
        remaining: u64,
        padding: u64,
    },
    /// Past the end-of-archive marker; everything else is ignored.
    End,
}

/// Pending overrides for the next member from GNU long names and pax headers.
#[derive(Debug, Default)]
struct Pending {
    path: Option<String>,
    link: Option<String>,
    size: Option<u64>,
}

/// A push parser of tar streams: feed chunks, get [`Member`]s.
#[derive(Debug)]
pub struct Parser {
    state: State,
    /// Header or extension bytes being collected.
    buf: Vec<u8>,
    /// Bytes consumed so far.
    offset: u64,
    /// Offset of the header being collected.
    header_at: u64,
    zero_blocks: u8,
    pending: Pending,
}

impl Default for Parser {
    fn default() -> Self {
        Parser {
            state: State::Header,
            buf: Vec::with_capacity(BLOCK),
            offset: 0,
            header_at: 0,
            zero_blocks: 0,
            pending: Pending::default(),
        }
    }
}

fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

/// Parses an octal (NUL/space terminated) or GNU base-256 numeric field.
fn numeric(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        // Base-256: the first byte's high bit marks it; negative values are refused.
        if field[0] & 0x40 != 0 {
            return None;
        }
        let mut v: u64 = u64::from(field[0] & 0x3f);
        for &b in &field[1..] {
            v = v.checked_mul(256)?.checked_add(u64::from(b))?;
        }
        return Some(v);
    }
    let s: Vec<u8> = field
        .iter()
        .copied()
        .skip_while(|b| *b == b' ')
        .take_while(|b| *b != 0 && *b != b' ')
        .collect();
    if s.is_empty() {
        return Some(0);
    }
    let mut v: u64 = 0;
    for b in s {
        if !(b'0'..=b'7').contains(&b) {
            return None;
        }
        v = v.checked_mul(8)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(v)
}

/// A NUL-terminated string field.
fn cstr(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    &field[..end]
}

fn utf8(bytes: &[u8]) -> Result<String, Refusal> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| Refusal::InvalidPath(String::from_utf8_lossy(bytes).into_owned()))
}

impl Parser {
    /// Feeds a chunk; calls `on_member` for each member whose header completes in it.
    pub fn feed(
        &mut self,
        mut chunk: &[u8],
        on_member: &mut impl FnMut(Member) -> Result<(), Refusal>,
    ) -> Result<(), Refusal> {
        while !chunk.is_empty() {
            match &mut self.state {
                State::End => {
                    self.offset += chunk.len() as u64;
                    return Ok(());
                }
                State::Data { remaining, padding } => {
                    let total = *remaining + *padding;
                    let take = (chunk.len() as u64).min(total);
                    let from_data = take.min(*remaining);
                    *remaining -= from_data;
                    *padding -= take - from_data;
                    self.offset += take;
                    chunk = &chunk[take as usize..];
                    if *remaining == 0 && *padding == 0 {
                        self.state = State::Header;
                    }
                }
                State::Extension {
                    flag,
                    remaining,
                    padding,
                } => {
                    let flag = *flag;
                    if *remaining > 0 {
                        let take = (chunk.len() as u64).min(*remaining);
                        self.buf.extend_from_slice(&chunk[..take as usize]);
                        *remaining -= take;
                        self.offset += take;
                        chunk = &chunk[take as usize..];
                    } else if *padding > 0 {
                        let take = (chunk.len() as u64).min(*padding);
                        *padding -= take;
                        self.offset += take;
                        chunk = &chunk[take as usize..];
                    }
                    if let State::Extension {
                        remaining: 0,
                        padding: 0,
                        ..
                    } = self.state
                    {
                        let data = std::mem::take(&mut self.buf);
                        self.apply_extension(flag, &data)?;
                        self.state = State::Header;
                    }
                }
                State::Header => {
                    if self.buf.is_empty() {
                        self.header_at = self.offset;
                    }
                    let take = chunk.len().min(BLOCK - self.buf.len());
                    self.buf.extend_from_slice(&chunk[..take]);
                    self.offset += take as u64;
                    chunk = &chunk[take..];
                    if self.buf.len() == BLOCK {
                        let header = std::mem::replace(&mut self.buf, Vec::with_capacity(BLOCK));
                        if let Some(m) = self.header(&header)? {
                            on_member(m)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Declares the end of input: an error if it stopped inside a member.
    pub fn finish(&self) -> Result<(), Refusal> {
        match self.state {
            State::End => Ok(()),
            State::Header if self.buf.is_empty() => Ok(()),
            _ => Err(Refusal::Truncated),
        }
    }

    /// Handles a full header block; returns the member it describes, if any.
    fn header(&mut self, h: &[u8]) -> Result<Option<Member>, Refusal> {
        let at = self.header_at;
        if h.iter().all(|b| *b == 0) {
            self.zero_blocks += 1;
            if self.zero_blocks >= 2 {
                self.state = State::End;
            }
            return Ok(None);
        }
        self.zero_blocks = 0;
        let stored = numeric(&h[148..156]).ok_or(Refusal::BadHeader {
            offset: at,
            what: "checksum field",
        })?;
        let sum: u64 = h
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if (148..156).contains(&i) {
                    u64::from(b' ')
                } else {
                    u64::from(*b)
                }
            })
            .sum();
        if stored != sum {
            return Err(Refusal::BadChecksum(at));
        }
        let flag = h[156];
        let size = numeric(&h[124..136]).ok_or(Refusal::BadHeader {
            offset: at,
            what: "size field",
        })?;
        if matches!(flag, b'L' | b'K' | b'x' | b'g') {
            if size > MAX_EXTENSION {
                return Err(Refusal::HeaderTooLarge(at));
            }
            self.state = State::Extension {
                flag,
                remaining: size,
                padding: padding(size),
            };
            if size == 0 {
                self.state = State::Header;
            }
            return Ok(None);
        }
        let ustar = &h[257..263] == b"ustar\0";
        let name = cstr(&h[0..100]);
        let mut path = if ustar && h[345] != 0 {
            let mut p = cstr(&h[345..500]).to_vec();
            p.push(b'/');
            p.extend_from_slice(name);
            utf8(&p)?
        } else {
            utf8(name)?
        };
        let mut link = utf8(cstr(&h[157..257]))?;
        let mut size = size;
        let pending = std::mem::take(&mut self.pending);
        if let Some(p) = pending.path {
            path = p;
        }
        if let Some(l) = pending.link {
            link = l;
        }
        if let Some(s) = pending.size {
            size = s;
        }
        self.state = State::Data {
            remaining: size,
            padding: padding(size),
        };
        if size == 0 {
            self.state = State::Header;
        }
        Ok(Some(Member {
            path,
            kind: MemberKind::from_flag(flag),
            size,
            link,
        }))
    }

    fn apply_extension(&mut self, flag: u8, data: &[u8]) -> Result<(), Refusal> {
        match flag {
            b'L' => self.pending.path = Some(utf8(cstr(data))?),
            b'K' => self.pending.link = Some(utf8(cstr(data))?),
            b'x' => {
                for (key, value) in pax_records(data).ok_or(Refusal::BadHeader {
                    offset: self.header_at,
                    what: "pax records",
                })? {
                    match key {
                        b"path" => self.pending.path = Some(utf8(value)?),
                        b"linkpath" => self.pending.link = Some(utf8(value)?),
                        b"size" => {
                            let s = std::str::from_utf8(value)
                                .ok()
                                .and_then(|s| s.parse().ok())
                                .ok_or(Refusal::BadHeader {
                                    offset: self.header_at,
                                    what: "pax size",
                                })?;
                            self.pending.size = Some(s);
                        }
                        _ => {}
                    }
                }
            }
            // Global pax headers carry defaults this validator does not need.
            _ => {}
        }
        Ok(())
    }
}

/// Splits pax records (`"<len> <key>=<value>\n"`).
fn pax_records(mut data: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let mut out = Vec::new();
    while !data.is_empty() {
        if data.iter().all(|b| *b == 0) {
            break;
        }
        let sp = data.iter().position(|b| *b == b' ')?;
        let len: usize = std::str::from_utf8(&data[..sp]).ok()?.parse().ok()?;
        if len <= sp + 1 || len > data.len() {
            return None;
        }
        let record = &data[sp + 1..len];
        let record = record.strip_suffix(b"\n")?;
        let eq = record.iter().position(|b| *b == b'=')?;
        out.push((&record[..eq], &record[eq + 1..]));
        data = &data[len..];
    }
    Some(out)
}

/// What a path has been seen as so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    /// A directory; `explicit` when it had its own member (not only a parent of one).
    Dir { explicit: bool },
    /// A regular file.
    File,
    /// A symlink.
    Symlink,
}

/// Checks each member against the rules and the limits.
#[derive(Debug)]
pub struct Validator {
    limits: Limits,
    total_input: Option<u64>,
    members: u64,
    extracted: u64,
    seen: HashMap<String, Seen>,
}

impl Validator {
    /// A validator with these limits. `total_input` is the archive's size when known in
    /// advance (for the expansion-ratio check at each header).
    pub fn new(limits: Limits, total_input: Option<u64>) -> Self {
        Validator {
            limits,
            total_input,
            members: 0,
            extracted: 0,
            seen: HashMap::new(),
        }
    }

    /// Checks one member.
    pub fn check(&mut self, m: &Member) -> Result<(), Refusal> {
        self.members += 1;
        if self.limits.max_members > 0 && self.members > self.limits.max_members {
            return Err(Refusal::TooManyMembers(self.limits.max_members));
        }
        let parts = split_path(&m.path)?;
        if parts.is_empty() {
            // The root itself (`.` or `./`): fine as a directory, and nothing to record.
            return if m.kind == MemberKind::Dir {
                Ok(())
            } else {
                Err(Refusal::InvalidPath(m.path.clone()))
            };
        }
        if parts[0] == RESERVED {
            return Err(Refusal::ReservedPath(m.path.clone()));
        }
        match m.kind {
            MemberKind::File | MemberKind::Dir | MemberKind::Symlink => {}
            MemberKind::Hardlink => {
                return Err(Refusal::Hardlink {
                    path: m.path.clone(),
                    target: m.link.clone(),
                });
            }
            MemberKind::CharDevice | MemberKind::BlockDevice => {
                return Err(Refusal::Device(m.path.clone()));
            }
            MemberKind::Fifo => return Err(Refusal::Fifo(m.path.clone())),
            MemberKind::Other(flag) => {
                return Err(Refusal::UnsupportedType {
                    path: m.path.clone(),
                    flag: char::from(flag),
                });
            }
        }
        // Ancestors must be (or become) directories.
        let mut prefix = String::new();
        for part in &parts[..parts.len() - 1] {
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(part);
            match self.seen.get(&prefix) {
                Some(Seen::Symlink) => {
                    return Err(Refusal::BeneathSymlink {
                        path: m.path.clone(),
                        parent: prefix,
                    });
                }
                Some(Seen::File) => {
                    return Err(Refusal::BeneathFile {
                        path: m.path.clone(),
                        parent: prefix,
                    });
                }
                Some(Seen::Dir { .. }) => {}
                None => {
                    self.seen
                        .insert(prefix.clone(), Seen::Dir { explicit: false });
                }
            }
        }
        let key = parts.join("/");
        let now = match m.kind {
            MemberKind::Dir => Seen::Dir { explicit: true },
            MemberKind::Symlink => Seen::Symlink,
            _ => Seen::File,
        };
        match self.seen.get(&key) {
            None => {}
            Some(Seen::Dir { explicit: false }) if now == (Seen::Dir { explicit: true }) => {}
            Some(_) => return Err(Refusal::Duplicate(m.path.clone())),
        }
        if m.kind == MemberKind::Symlink {
            check_symlink(&m.path, parts.len() - 1, &m.link)?;
        }
        if m.kind == MemberKind::File {
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
        self.seen.insert(key, now);
        Ok(())
    }
}

/// Splits a member path into its named components; refuses absolute paths, `..`, NULs and
/// empty paths.
fn split_path(path: &str) -> Result<Vec<&str>, Refusal> {
    if path.is_empty() || path.contains('\0') {
        return Err(Refusal::InvalidPath(path.to_string()));
    }
    if path.starts_with('/') {
        return Err(Refusal::AbsolutePath(path.to_string()));
    }
    let parts: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(Refusal::ParentComponent(path.to_string()));
    }
    Ok(parts)
}

/// A symlink at depth `depth` (number of directories above it below the root) may point
/// only inside the root, in canonical form: some `..` (at most `depth`), then names.
fn check_symlink(path: &str, depth: usize, target: &str) -> Result<(), Refusal> {
    let escapes = || Refusal::SymlinkEscapes {
        path: path.to_string(),
        target: target.to_string(),
    };
    if target.is_empty() || target.contains('\0') {
        return Err(Refusal::InvalidPath(path.to_string()));
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
                    path: path.to_string(),
                    target: target.to_string(),
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

/// Summary of a complete archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Hex SHA-256 of every byte fed.
    pub sha256: String,
    /// Bytes fed.
    pub size: u64,
    /// Members (files, directories, symlinks; extension headers not counted).
    pub members: u64,
}

/// A tar stream being hashed, counted and validated.
pub struct TarStream {
    parser: Parser,
    validator: Validator,
    max_input: u64,
    hasher: Sha256,
    size: u64,
    members: u64,
}

impl fmt::Debug for TarStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TarStream")
            .field("size", &self.size)
            .field("members", &self.members)
            .finish()
    }
}

impl TarStream {
    /// Hashes, counts and validates every member against `limits`.
    pub fn validating(limits: Limits, total_input: Option<u64>) -> Self {
        TarStream {
            parser: Parser::default(),
            validator: Validator::new(limits, total_input),
            max_input: limits.max_input_bytes,
            hasher: Sha256::new(),
            size: 0,
            members: 0,
        }
    }

    /// Checks the archive's declared size against the input limit before reading it.
    pub fn check_size(&self, total: u64) -> Result<(), Refusal> {
        if self.max_input > 0 && total > self.max_input {
            return Err(Refusal::InputTooLarge(self.max_input));
        }
        Ok(())
    }

    /// Feeds the next chunk. After an error the stream must be dropped.
    pub fn feed(&mut self, chunk: &[u8]) -> Result<(), Refusal> {
        self.size += chunk.len() as u64;
        if self.max_input > 0 && self.size > self.max_input {
            return Err(Refusal::InputTooLarge(self.max_input));
        }
        self.hasher.update(chunk);
        let validator = &mut self.validator;
        let members = &mut self.members;
        self.parser.feed(chunk, &mut |m| {
            *members += 1;
            validator.check(&m)
        })
    }

    /// Bytes fed so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Ends the stream: the archive must not stop inside a member.
    pub fn finish(self) -> Result<Summary, Refusal> {
        self.parser.finish()?;
        Ok(Summary {
            sha256: hex::encode(self.hasher.finalize()),
            size: self.size,
            members: self.members,
        })
    }
}

/// Checks a finished summary against the digest and size on record.
pub fn verify(summary: &Summary, sha256: &str, size: Option<u64>) -> Result<(), Refusal> {
    if let Some(expected) = size
        && expected != summary.size
    {
        return Err(Refusal::SizeMismatch {
            expected,
            actual: summary.size,
        });
    }
    if !summary.sha256.eq_ignore_ascii_case(sha256) {
        return Err(Refusal::DigestMismatch {
            expected: sha256.to_string(),
            actual: summary.sha256.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A raw ustar header with any path, type, size and link (the tar crate refuses to write
    /// some of the hostile ones).
    fn raw_header(path: &str, flag: u8, size: u64, link: &str) -> [u8; 512] {
        let mut h = [0u8; 512];
        h[..path.len()].copy_from_slice(path.as_bytes());
        h[100..107].copy_from_slice(b"0000644");
        h[108..115].copy_from_slice(b"0000000");
        h[116..123].copy_from_slice(b"0000000");
        let s = format!("{size:011o}");
        h[124..135].copy_from_slice(s.as_bytes());
        h[136..147].copy_from_slice(b"00000000000");
        h[156] = flag;
        h[157..157 + link.len()].copy_from_slice(link.as_bytes());
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        let c = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(c.as_bytes());
        h
    }

    /// An archive of (path, flag, data, link) members, properly padded and terminated.
    fn raw(members: &[(&str, u8, &[u8], &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (path, flag, data, link) in members {
            out.extend_from_slice(&raw_header(path, *flag, data.len() as u64, link));
            out.extend_from_slice(data);
            out.resize(out.len() + padding(data.len() as u64) as usize, 0);
        }
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    fn check(bytes: &[u8]) -> Result<Summary, Refusal> {
        check_with(bytes, Limits::default())
    }

    fn check_with(bytes: &[u8], limits: Limits) -> Result<Summary, Refusal> {
        let mut t = TarStream::validating(limits, Some(bytes.len() as u64));
        t.check_size(bytes.len() as u64)?;
        t.feed(bytes)?;
        t.finish()
    }

    /// Feeding in odd-sized chunks gives the same answer as all at once.
    fn check_chunked(bytes: &[u8], chunk: usize) -> Result<Summary, Refusal> {
        let mut t = TarStream::validating(Limits::default(), Some(bytes.len() as u64));
        for c in bytes.chunks(chunk) {
            t.feed(c)?;
        }
        t.finish()
    }

    fn good_archive() -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o755);
        dir.set_size(0);
        b.append_data(&mut dir, "./", std::io::empty()).unwrap();
        b.append_data(&mut dir.clone(), "src/empty", std::io::empty())
            .unwrap();
        let data = vec![7u8; 1000];
        let mut f = tar::Header::new_gnu();
        f.set_mode(0o755);
        f.set_size(data.len() as u64);
        b.append_data(&mut f, "src/bin.dat", data.as_slice())
            .unwrap();
        // A long name goes through a GNU 'L' extension.
        let long = format!("src/{}", "n".repeat(150));
        let mut f2 = tar::Header::new_gnu();
        f2.set_size(3);
        b.append_data(&mut f2, &long, &b"abc"[..]).unwrap();
        let mut l = tar::Header::new_gnu();
        l.set_entry_type(tar::EntryType::Symlink);
        l.set_size(0);
        b.append_link(&mut l, "src/link", "bin.dat").unwrap();
        let mut up = tar::Header::new_gnu();
        up.set_entry_type(tar::EntryType::Symlink);
        up.set_size(0);
        b.append_link(&mut up, "src/empty/up", "../../src/bin.dat")
            .unwrap();
        b.into_inner().unwrap()
    }

    #[test]
    fn a_normal_archive_passes_with_digest_and_members() {
        let bytes = good_archive();
        let s = check(&bytes).unwrap();
        assert_eq!(s.members, 6);
        assert_eq!(s.size, bytes.len() as u64);
        assert_eq!(s.sha256, hex::encode(Sha256::digest(&bytes)));
        for chunk in [1, 7, 511, 512, 513, 4096] {
            assert_eq!(check_chunked(&bytes, chunk).unwrap(), s, "chunk {chunk}");
        }
        assert!(verify(&s, &s.sha256, Some(s.size)).is_ok());
    }

    #[test]
    fn each_hostile_archive_is_refused_with_its_own_reason() {
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            (
                "absolute",
                raw(&[("/etc/cron.d/x", b'0', b"x", "")]),
                "AbsolutePath",
            ),
            (
                "dotdot",
                raw(&[("a/../../x", b'0', b"x", "")]),
                "ParentComponent",
            ),
            (
                "hardlink",
                raw(&[("f", b'0', b"x", ""), ("h", b'1', b"", "f")]),
                "Hardlink",
            ),
            ("chardev", raw(&[("null", b'3', b"", "")]), "Device"),
            ("blockdev", raw(&[("sda", b'4', b"", "")]), "Device"),
            ("fifo", raw(&[("p", b'6', b"", "")]), "Fifo"),
            (
                "symlink to /etc",
                raw(&[("etc", b'2', b"", "/etc")]),
                "SymlinkEscapes",
            ),
            (
                "symlink up",
                raw(&[("d/l", b'2', b"", "../..")]),
                "SymlinkEscapes",
            ),
            (
                "symlink a/../..",
                raw(&[("l", b'2', b"", "a/../..")]),
                "SymlinkNotCanonical",
            ),
            (
                "under symlink",
                raw(&[("l", b'2', b"", "d"), ("l/x", b'0', b"x", "")]),
                "BeneathSymlink",
            ),
            (
                "under file",
                raw(&[("f", b'0', b"x", ""), ("f/x", b'0', b"x", "")]),
                "BeneathFile",
            ),
            (
                "duplicate",
                raw(&[("f", b'0', b"x", ""), ("f", b'0', b"y", "")]),
                "Duplicate",
            ),
            (
                "dir then symlink",
                raw(&[("d/x", b'0', b"x", ""), ("d", b'2', b"", "e")]),
                "Duplicate",
            ),
            (
                "reserved",
                raw(&[(".agentbox/marker", b'0', b"x", "")]),
                "ReservedPath",
            ),
            ("sparse", raw(&[("s", b'S', b"", "")]), "UnsupportedType"),
            ("empty name", raw(&[("", b'0', b"", "")]), "InvalidPath"),
        ];
        for (what, bytes, reason) in cases {
            let got = check(&bytes).expect_err(what);
            assert_eq!(got.reason(), reason, "{what}: {got}");
        }
    }

    #[test]
    fn limits_refuse_bombs() {
        let many: Vec<String> = (0..20).map(|i| format!("f{i}")).collect();
        let members: Vec<(&str, u8, &[u8], &str)> = many
            .iter()
            .map(|p| (p.as_str(), b'0', &b""[..], ""))
            .collect();
        let bytes = raw(&members);
        let limits = Limits {
            max_members: 10,
            ..Limits::default()
        };
        assert_eq!(
            check_with(&bytes, limits).unwrap_err(),
            Refusal::TooManyMembers(10)
        );
        // A header claiming far more data than the archive holds.
        let mut bomb = raw_header("big", b'0', 50 << 20, "").to_vec();
        bomb.extend_from_slice(&[1u8; 4096]);
        assert_eq!(check(&bomb).unwrap_err(), Refusal::ExpansionRatio(100));
        let mut huge = raw_header("huge", b'0', 5 << 30, "").to_vec();
        huge.extend_from_slice(&[1u8; 4096]);
        assert_eq!(
            check(&huge).unwrap_err(),
            Refusal::ExtractedTooLarge(4 << 30)
        );
        let small = Limits {
            max_input_bytes: 1000,
            ..Limits::default()
        };
        let ok = good_archive();
        assert_eq!(
            check_with(&ok, small).unwrap_err(),
            Refusal::InputTooLarge(1000)
        );
        // Without knowing the size up front, the running count still stops it.
        let mut t = TarStream::validating(small, None);
        assert_eq!(t.feed(&ok).unwrap_err(), Refusal::InputTooLarge(1000));
        // Zero disables a limit.
        let off = Limits {
            max_members: 0,
            max_input_bytes: 0,
            max_extracted_bytes: 0,
            max_expansion_ratio: 0,
        };
        assert!(check_with(&bytes, off).is_ok());
    }

    #[test]
    fn truncation_and_corruption() {
        let bytes = good_archive();
        let mut t = TarStream::validating(Limits::default(), None);
        t.feed(&bytes[..1500]).unwrap();
        assert_eq!(t.finish().unwrap_err(), Refusal::Truncated);
        let mut bad = bytes.clone();
        bad[10] ^= 0x55;
        assert_eq!(check(&bad).unwrap_err().reason(), "BadChecksum");
        let s = check(&bytes).unwrap();
        let wrong = "0".repeat(64);
        assert_eq!(
            verify(&s, &wrong, None).unwrap_err().reason(),
            "DigestMismatch"
        );
        assert_eq!(
            verify(&s, &s.sha256, Some(1)).unwrap_err().reason(),
            "SizeMismatch"
        );
        // Missing end-of-archive marker at a member boundary is accepted.
        let no_end = &bytes[..bytes.len() - 1024];
        let mut t = TarStream::validating(Limits::default(), None);
        t.feed(no_end).unwrap();
        assert!(t.finish().is_ok());
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
    }

    #[test]
    fn pax_overrides_path_and_size() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_size(0);
        b.append_pax_extensions([("path", &b"/etc/evil"[..])])
            .unwrap();
        b.append_data(&mut h, "harmless", std::io::empty()).unwrap();
        let bytes = b.into_inner().unwrap();
        assert_eq!(
            check(&bytes).unwrap_err(),
            Refusal::AbsolutePath("/etc/evil".into())
        );
        assert_eq!(
            pax_records(b"11 path=ab\n"),
            Some(vec![(&b"path"[..], &b"ab"[..])])
        );
        assert_eq!(pax_records(b"99 path=ab\n"), None);
    }

    #[test]
    fn numeric_fields() {
        assert_eq!(numeric(b"0000644\0"), Some(0o644));
        assert_eq!(numeric(b"  755 \0"), Some(0o755));
        assert_eq!(numeric(b"\0\0\0"), Some(0));
        assert_eq!(numeric(b"0009"), None);
        let mut b256 = [0u8; 12];
        b256[0] = 0x80;
        b256[11] = 5;
        b256[10] = 1;
        assert_eq!(numeric(&b256), Some(261));
    }

    #[test]
    fn refusal_reasons_are_distinct() {
        let all = [
            Refusal::AbsolutePath(String::new()),
            Refusal::ParentComponent(String::new()),
            Refusal::InvalidPath(String::new()),
            Refusal::ReservedPath(String::new()),
            Refusal::Hardlink {
                path: String::new(),
                target: String::new(),
            },
            Refusal::Device(String::new()),
            Refusal::Fifo(String::new()),
            Refusal::UnsupportedType {
                path: String::new(),
                flag: 'S',
            },
            Refusal::SymlinkEscapes {
                path: String::new(),
                target: String::new(),
            },
            Refusal::SymlinkNotCanonical {
                path: String::new(),
                target: String::new(),
            },
            Refusal::BeneathSymlink {
                path: String::new(),
                parent: String::new(),
            },
            Refusal::BeneathFile {
                path: String::new(),
                parent: String::new(),
            },
            Refusal::Duplicate(String::new()),
            Refusal::TooManyMembers(0),
            Refusal::InputTooLarge(0),
            Refusal::ExtractedTooLarge(0),
            Refusal::ExpansionRatio(0),
            Refusal::BadChecksum(0),
            Refusal::BadHeader {
                offset: 0,
                what: "",
            },
            Refusal::HeaderTooLarge(0),
            Refusal::Truncated,
            Refusal::DigestMismatch {
                expected: String::new(),
                actual: String::new(),
            },
            Refusal::SizeMismatch {
                expected: 0,
                actual: 0,
            },
        ];
        let reasons: std::collections::HashSet<_> = all.iter().map(Refusal::reason).collect();
        assert_eq!(reasons.len(), all.len());
    }
}
