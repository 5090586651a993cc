//! Workspace tarballs: the operator's own tar parser, the rules and limits every member must
//! pass, and the canonical re-encoding that is the only tar the operator stores or hands to an
//! extractor.
//!
//! What a sandbox's `tar -c` prints is untrusted: root in the sandbox can replace `sh` and
//! `tar` and print any bytes. Validating those bytes and then letting another tar parser (the
//! pod's `tar -x`) read them would rest safety on two parsers agreeing, and tar readers
//! disagree in many places. So a [`Canonicalizer`] parses the stream ([`parse`]), checks each
//! member ([`validate`]) and writes a fresh archive of the accepted members in one plain form
//! ([`canonical`]) that busybox tar and GNU tar read identically. A snapshot stores that
//! re-encoding (its digest, size and member count are the canonical bytes'); a restore parses
//! the stored object again — a store can be tampered with — and streams a new re-encoding into
//! `tar -x`, so no byte the operator did not write reaches an extractor.
//!
//! Everything here is pure and push-based: chunks go in ([`Canonicalizer::feed`]) and
//! canonical bytes come out, in memory bounded by one header, one extension (64 KiB) and the
//! path tree (a fixed amount per path the archive creates, see [`validate`]).
//!
//! Where input formats let readers see different things in the same bytes, the archive is
//! refused with [`Refusal::Ambiguous`] naming the [`Ambiguity`] (or another named reason)
//! rather than read one way. Each class has an archive in `tests/tar-corpus/` and what busybox
//! 1.35 and GNU tar 1.34 do with it is checked by the tests:
//!
//! | input | busybox | GNU tar | here |
//! |---|---|---|---|
//! | size on a directory or symlink | next block is a header | next block is a header | refused; the old validator skipped `size` bytes, so a member hidden there reached `tar -x` unchecked |
//! | pax `size` ≠ header size | header size | pax size | refused; canonical never writes pax |
//! | pax `path` then a GNU `L` | the `L` | the pax path | refused, as is any second name or link name for a member and a duplicate pax key |
//! | pax global `path` (or size, ids, mtime) | ignored | renames every later member | refused |
//! | prefix field in an old-GNU / v7 header | prepended / archive refused | ignored | refused; canonical leaves the prefix empty |
//! | one zero block, then more headers | reads on | stops | refused; canonical ends in two zero blocks and nothing after |
//! | extension headers with no member | fails | ignores them | refused |
//! | regular file named `d/` | a file `d` | a directory `d` | refused |
//! | numeric field `-000644` | a sign: 7134 | base-64: 710 | refused: fields must be plain octal (or base-256) |
//! | checksum right only as signed bytes | refuses | accepts | refused |
//! | setuid/setgid/sticky bits | applied | applied | dropped: canonical keeps permission bits |
//! | link name on a regular file | ignored | ignored | refused (the readers keep it as the member's link target) |
//! | empty name field after an `L` | the `L` | the `L` | read; canonical name fields are never empty (older busybox took it for the end) |
//!
//! The canonical form itself uses only what both read the same way (checked by property tests
//! against both, see `differential.rs`): POSIX ustar headers, GNU `L`/`K` records for long
//! names and link targets (busybox reads pax `path` and, in recent versions, `linkpath`, but
//! never pax `size`), plain octal numbers (so files over 8 GiB − 1 and ids over 2097151 are
//! refused), no owner names, device numbers, extended attributes or vendor records.
//!
//! Paths are normalised (no `.` or empty components, directories end in `/`), so one path has
//! one spelling, and the rules (no absolute paths, `..`, hard links, devices, FIFOs, escaping
//! symlinks, members beneath symlinks or files, duplicates, the `.agentbox` directory) are
//! judged on exactly the names the extractor will see.

mod canonical;
mod parse;
mod validate;

#[cfg(test)]
mod differential;
#[cfg(test)]
mod memory;
#[cfg(test)]
mod two_paths;

use std::fmt;

use bytes::BytesMut;
use sha2::{Digest, Sha256};

pub use canonical::Kind;
pub use parse::{Member, MemberKind};
pub use validate::{MAX_DEPTH, MAX_FILE_BYTES, MAX_ID, MAX_NAME_BYTES, MAX_PATH_BYTES};

use parse::{Event, Parser};
use validate::Validator;

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
    /// A path over [`MAX_PATH_BYTES`] (or a symlink target over it).
    #[error("member {path:?} has a path over {limit} bytes")]
    PathTooLong {
        /// Member path (cut when long).
        path: String,
        /// The limit.
        limit: usize,
    },
    /// A path of more than [`MAX_DEPTH`] components.
    #[error("member {path:?} is more than {limit} directories deep")]
    PathTooDeep {
        /// Member path (cut when long).
        path: String,
        /// The limit.
        limit: usize,
    },
    /// A path component over [`MAX_NAME_BYTES`].
    #[error("member {0:?} has a name over 255 bytes")]
    NameTooLong(String),
    /// A file over [`MAX_FILE_BYTES`].
    #[error("member {0:?} is larger than 8 GiB - 1, which the canonical form cannot hold")]
    FileTooLarge(String),
    /// A uid or gid over [`MAX_ID`].
    #[error("member {0:?} has a uid or gid over 2097151, which the canonical form cannot hold")]
    OwnerOutOfRange(String),
    /// Bytes that tar readers read in different ways ([`Ambiguity`]).
    #[error("ambiguous header at offset {offset}: {what}")]
    Ambiguous {
        /// Byte offset of the header (or of the first extension header of its member).
        offset: u64,
        /// Which ambiguity.
        what: Ambiguity,
    },
}

impl Refusal {
    /// Every reason [`Refusal::reason`] gives (to map one read back from a status to its
    /// static string).
    pub const REASONS: [&'static str; 29] = [
        "AbsolutePath",
        "ParentComponent",
        "InvalidPath",
        "ReservedPath",
        "Hardlink",
        "Device",
        "Fifo",
        "UnsupportedType",
        "SymlinkEscapes",
        "SymlinkNotCanonical",
        "BeneathSymlink",
        "BeneathFile",
        "Duplicate",
        "TooManyMembers",
        "InputTooLarge",
        "ExtractedTooLarge",
        "ExpansionRatio",
        "BadChecksum",
        "BadHeader",
        "HeaderTooLarge",
        "Truncated",
        "DigestMismatch",
        "SizeMismatch",
        "PathTooLong",
        "PathTooDeep",
        "NameTooLong",
        "FileTooLarge",
        "OwnerOutOfRange",
        "AmbiguousHeader",
    ];

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
            Refusal::PathTooLong { .. } => "PathTooLong",
            Refusal::PathTooDeep { .. } => "PathTooDeep",
            Refusal::NameTooLong(_) => "NameTooLong",
            Refusal::FileTooLarge(_) => "FileTooLarge",
            Refusal::OwnerOutOfRange(_) => "OwnerOutOfRange",
            Refusal::Ambiguous { .. } => "AmbiguousHeader",
        }
    }
}

/// Places where tar readers read the same bytes differently. Each is refused, never resolved
/// by picking a reading.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Ambiguity {
    /// Two GNU long names (`L`) for one member.
    #[error("two GNU long names for one member")]
    LongNameTwice,
    /// Two GNU long links (`K`) for one member.
    #[error("two GNU long link names for one member")]
    LongLinkTwice,
    /// Two pax extended headers (`x`) for one member.
    #[error("two pax extended headers for one member")]
    PaxHeaderTwice,
    /// A GNU long name and a pax `path` for one member.
    #[error("a GNU long name and a pax path for one member")]
    LongNameAndPaxPath,
    /// A GNU long link and a pax `linkpath` for one member.
    #[error("a GNU long link name and a pax linkpath for one member")]
    LongLinkAndPaxLinkpath,
    /// A key twice in one pax header.
    #[error("pax key {0:?} given twice")]
    PaxDuplicateKey(String),
    /// A pax `size` that is not the header's (busybox ignores pax sizes).
    #[error("pax size {pax} differs from the header's {header}")]
    PaxSizeMismatch {
        /// The pax record's.
        pax: u64,
        /// The header's.
        header: u64,
    },
    /// A pax global header setting a per-member value (GNU tar applies it to every later
    /// member; busybox ignores it).
    #[error("pax global header sets {0:?}")]
    PaxGlobalOverride(String),
    /// A link name on a regular file or directory.
    #[error("a link name on a regular file or directory")]
    LinkNameOnNonLink,
    /// A non-zero size on a directory or symlink (extractors read no data after it; readers
    /// that skip `size` bytes miss the member hidden there).
    #[error("a non-zero size on a directory or symlink")]
    SizeOnNonFile,
    /// A regular file or symlink whose name ends in `/` (busybox makes a file, GNU tar a
    /// directory).
    #[error("a regular file or symlink named like a directory")]
    TrailingSlash,
    /// Bytes in the ustar prefix field of an old-GNU or v7 header (busybox prepends them to
    /// the name; GNU tar does not).
    #[error("bytes in the prefix field of a non-POSIX header")]
    PrefixOutsideUstar,
    /// A single zero block followed by more headers (GNU tar stops there; busybox reads on).
    #[error("a lone zero block followed by more headers")]
    LoneZeroBlock,
    /// Extension headers with no member after them.
    #[error("extension headers not followed by a member")]
    DanglingExtension,
    /// A long name or link with bytes after its NUL.
    #[error("bytes after the NUL of a long name")]
    BytesAfterNul,
}

/// Summary of a complete archive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Hex SHA-256 of the stored bytes: the canonical output when taking a snapshot, the
    /// object read when restoring.
    pub sha256: String,
    /// Size of the stored bytes.
    pub size: u64,
    /// Members written (files, directories, symlinks; not the root, not extension records).
    pub members: u64,
}

/// One path an archive extracts to (see [`Canonicalizer::recording`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Entry {
    /// Normalised path, without a trailing `/`.
    pub path: String,
    /// Kind; directories only implied as parents are listed as [`Kind::Dir`] too.
    pub kind: Kind,
    /// Hex SHA-256 of a file's content (empty otherwise).
    pub sha256: String,
    /// Symlink target (empty otherwise).
    pub link: String,
}

/// Which bytes the digest covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stored {
    /// The output: a snapshot stores what it writes.
    Output,
    /// The input: a restore reads what was stored.
    Input,
}

/// A tar stream parsed, checked and re-encoded in canonical form as it goes.
pub struct Canonicalizer {
    parser: Parser,
    validator: Validator,
    max_input: u64,
    stored: Stored,
    hasher: Sha256,
    input: u64,
    output: u64,
    members: u64,
    /// Data bytes of the current file still to come, and its size.
    data_left: u64,
    data_size: u64,
    listing: Option<(Vec<Entry>, Sha256)>,
}

impl fmt::Debug for Canonicalizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Canonicalizer")
            .field("input", &self.input)
            .field("output", &self.output)
            .field("members", &self.members)
            .finish()
    }
}

impl Canonicalizer {
    fn new(limits: Limits, total_input: Option<u64>, stored: Stored) -> Self {
        Canonicalizer {
            parser: Parser::default(),
            validator: Validator::new(limits, total_input),
            max_input: limits.max_input_bytes,
            stored,
            hasher: Sha256::new(),
            input: 0,
            output: 0,
            members: 0,
            data_left: 0,
            data_size: 0,
            listing: None,
        }
    }

    /// For a snapshot: the digest and size in the [`Summary`] are the canonical output's.
    pub fn snapshot(limits: Limits) -> Self {
        Self::new(limits, None, Stored::Output)
    }

    /// For a restore of a stored object of `total` bytes: the digest and size in the
    /// [`Summary`] are the input's, to be checked against the snapshot's record ([`verify`]).
    pub fn restore(limits: Limits, total: u64) -> Self {
        Self::new(limits, Some(total), Stored::Input)
    }

    /// Also lists every path the archive extracts to, with content digests
    /// ([`Canonicalizer::finish_listing`]); memory then grows with the member count.
    pub fn recording(mut self) -> Self {
        self.listing = Some((Vec::new(), Sha256::new()));
        self
    }

    /// Checks the archive's declared size against the input limit before reading it.
    pub fn check_size(&self, total: u64) -> Result<(), Refusal> {
        if self.max_input > 0 && total > self.max_input {
            return Err(Refusal::InputTooLarge(self.max_input));
        }
        Ok(())
    }

    /// Feeds the next input chunk, appending canonical bytes to `out`. After an error the
    /// stream must be dropped (and what it wrote discarded).
    pub fn feed(&mut self, chunk: &[u8], out: &mut BytesMut) -> Result<(), Refusal> {
        self.input += chunk.len() as u64;
        if self.max_input > 0 && self.input > self.max_input {
            return Err(Refusal::InputTooLarge(self.max_input));
        }
        if self.stored == Stored::Input {
            self.hasher.update(chunk);
        }
        let start = out.len();
        let mut rest = chunk;
        let result = self.drain(&mut rest, out);
        if self.stored == Stored::Output {
            self.hasher.update(&out[start..]);
        }
        self.output += (out.len() - start) as u64;
        result
    }

    fn drain(&mut self, rest: &mut &[u8], out: &mut BytesMut) -> Result<(), Refusal> {
        while let Some(event) = self.parser.next(rest)? {
            match event {
                Event::Member(m) => self.member(&m, out)?,
                Event::Data(d) => {
                    out.extend_from_slice(d);
                    if let Some((_, h)) = &mut self.listing {
                        h.update(d);
                    }
                    self.data_left -= d.len() as u64;
                    if self.data_left == 0 {
                        canonical::pad(out, self.data_size);
                        self.file_done();
                    }
                }
            }
        }
        Ok(())
    }

    fn member(&mut self, m: &Member, out: &mut BytesMut) -> Result<(), Refusal> {
        let Some(accepted) = self.validator.check(m)? else {
            return Ok(());
        };
        let kind = match m.kind {
            MemberKind::Dir => Kind::Dir,
            MemberKind::Symlink => Kind::Symlink,
            _ => Kind::File,
        };
        canonical::header(
            out,
            &canonical::Header {
                path: &accepted.path,
                kind,
                size: m.size,
                mode: m.mode,
                uid: m.uid,
                gid: m.gid,
                mtime: m.mtime,
                link: &m.link,
            },
        );
        self.members += 1;
        if let Some((entries, _)) = &mut self.listing {
            entries.push(Entry {
                path: accepted.path.trim_end_matches('/').to_string(),
                kind,
                sha256: String::new(),
                link: if kind == Kind::Symlink {
                    m.link.clone()
                } else {
                    String::new()
                },
            });
        }
        self.data_size = m.size;
        self.data_left = if kind == Kind::File { m.size } else { 0 };
        if kind == Kind::File && m.size == 0 {
            self.file_done();
        }
        Ok(())
    }

    /// Records the content digest of the file just written.
    fn file_done(&mut self) {
        if let Some((entries, h)) = &mut self.listing
            && let Some(e) = entries.last_mut()
        {
            e.sha256 = hex::encode(std::mem::take(h).finalize());
        }
    }

    /// Whether the input's end-of-archive marker has been read: nothing after it matters.
    pub fn ended(&self) -> bool {
        self.parser.ended()
    }

    /// Input bytes fed so far.
    pub fn input_size(&self) -> u64 {
        self.input
    }

    /// Ends the stream, appending the end-of-archive marker to `out`: the input must not
    /// stop inside a member.
    pub fn finish(mut self, out: &mut BytesMut) -> Result<Summary, Refusal> {
        self.parser.finish()?;
        let start = out.len();
        canonical::end(out);
        if self.stored == Stored::Output {
            self.hasher.update(&out[start..]);
        }
        self.output += (out.len() - start) as u64;
        Ok(Summary {
            sha256: hex::encode(self.hasher.finalize()),
            size: match self.stored {
                Stored::Output => self.output,
                Stored::Input => self.input,
            },
            members: self.members,
        })
    }

    /// [`Canonicalizer::finish`], and the sorted list of every path the archive extracts to
    /// (empty unless [`Canonicalizer::recording`]).
    pub fn finish_listing(mut self, out: &mut BytesMut) -> Result<(Summary, Vec<Entry>), Refusal> {
        let mut entries = self.listing.take().map(|l| l.0).unwrap_or_default();
        entries.extend(self.validator.implied_dirs().into_iter().map(|path| Entry {
            path,
            kind: Kind::Dir,
            sha256: String::new(),
            link: String::new(),
        }));
        entries.sort();
        Ok((self.finish(out)?, entries))
    }
}

/// Checks a restore's summary against the digest and size on record.
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
pub(crate) mod tests {
    use super::*;

    /// A raw ustar header with any path, type, size and link (the tar crate refuses to write
    /// some of the hostile ones).
    pub(crate) fn raw_header(path: &str, flag: u8, size: u64, link: &str) -> [u8; 512] {
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
        seal(&mut h);
        h
    }

    /// Writes a header's checksum.
    pub(crate) fn seal(h: &mut [u8; 512]) {
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        let c = format!("{sum:06o}\0 ");
        h[148..156].copy_from_slice(c.as_bytes());
    }

    /// An archive of (path, flag, data, link) members, properly padded and terminated.
    pub(crate) fn raw(members: &[(&str, u8, &[u8], &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (path, flag, data, link) in members {
            out.extend_from_slice(&raw_header(path, *flag, data.len() as u64, link));
            out.extend_from_slice(data);
            out.resize(out.len() + parse::padding(data.len() as u64) as usize, 0);
        }
        out.extend_from_slice(&[0u8; 1024]);
        out
    }

    /// Canonicalises `bytes` as a restore would (fed in chunks of `chunk`): the summary, the
    /// listing and the canonical bytes.
    pub(crate) fn canon_with(
        bytes: &[u8],
        limits: Limits,
        chunk: usize,
    ) -> Result<(Summary, Vec<Entry>, Vec<u8>), Refusal> {
        let mut c = Canonicalizer::restore(limits, bytes.len() as u64).recording();
        c.check_size(bytes.len() as u64)?;
        let mut out = BytesMut::new();
        for piece in bytes.chunks(chunk.max(1)) {
            c.feed(piece, &mut out)?;
        }
        let (s, listing) = c.finish_listing(&mut out)?;
        Ok((s, listing, out.to_vec()))
    }

    pub(crate) fn canon(bytes: &[u8]) -> Result<(Summary, Vec<Entry>, Vec<u8>), Refusal> {
        canon_with(bytes, Limits::default(), 64 << 10)
    }

    fn check(bytes: &[u8]) -> Result<Summary, Refusal> {
        canon(bytes).map(|c| c.0)
    }

    fn check_with(bytes: &[u8], limits: Limits) -> Result<Summary, Refusal> {
        canon_with(bytes, limits, 64 << 10).map(|c| c.0)
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
        f.set_mode(0o4755);
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
    fn a_normal_archive_is_re_encoded_with_digest_and_members() {
        let bytes = good_archive();
        let (s, listing, out) = canon(&bytes).unwrap();
        // The root is not a member; the 5 others are, and "src" is implied.
        assert_eq!(s.members, 5);
        assert_eq!(s.size, bytes.len() as u64);
        assert_eq!(s.sha256, hex::encode(Sha256::digest(&bytes)));
        let paths: Vec<&str> = listing.iter().map(|e| e.path.as_str()).collect();
        let long = format!("src/{}", "n".repeat(150));
        assert_eq!(
            paths,
            vec![
                "src",
                "src/bin.dat",
                "src/empty",
                "src/empty/up",
                "src/link",
                &long
            ]
        );
        let bin = listing.iter().find(|e| e.path == "src/bin.dat").unwrap();
        assert_eq!(bin.sha256, hex::encode(Sha256::digest([7u8; 1000])));
        for chunk in [1, 7, 511, 512, 513, 4096] {
            let (s2, l2, o2) = canon_with(&bytes, Limits::default(), chunk).unwrap();
            assert_eq!((&s2, &l2, &o2), (&s, &listing, &out), "chunk {chunk}");
        }
        assert!(verify(&s, &s.sha256, Some(s.size)).is_ok());
        // The canonical form is a fixed point: re-encoding it gives the same bytes.
        let (again, l3, out2) = canon(&out).unwrap();
        assert_eq!(out2, out);
        assert_eq!(l3, listing);
        assert_eq!(again.members, 5);
        // What a snapshot reports is the canonical bytes'.
        let mut c = Canonicalizer::snapshot(Limits::default());
        let mut o = BytesMut::new();
        c.feed(&bytes, &mut o).unwrap();
        let snap = c.finish(&mut o).unwrap();
        assert_eq!(o.to_vec(), out);
        assert_eq!(snap.sha256, hex::encode(Sha256::digest(&out)));
        assert_eq!(snap.size, out.len() as u64);
        // Permission bits only: the setuid bit is gone.
        let h = out.windows(12).position(|w| w == b"src/bin.dat\0").unwrap();
        assert_eq!(&out[h + 100..h + 108], b"0000755\0");
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
                "duplicate spelt differently",
                raw(&[("a/f", b'0', b"x", ""), ("./a//f", b'0', b"y", "")]),
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
            (
                "empty name",
                raw(&[("x", b'0', b"", "")])[..0]
                    .iter()
                    .copied()
                    .chain(raw_header("", b'0', 0, ""))
                    .chain([0u8; 1024])
                    .collect(),
                "InvalidPath",
            ),
            (
                "link name on a file",
                raw(&[("f", b'0', b"x", "/etc/passwd")]),
                "AmbiguousHeader",
            ),
            (
                "size on a directory",
                raw(&[("d", b'5', &[b'x'; 600], "")]),
                "AmbiguousHeader",
            ),
            (
                "file named like a directory",
                raw(&[("f/", b'0', b"x", "")]),
                "AmbiguousHeader",
            ),
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
        // Directories implied by a deep path count too.
        let deep = raw(&[("a/b/c/d/e/f/g/h/i/j/k", b'0', b"", "")]);
        assert_eq!(
            check_with(&deep, limits).unwrap_err(),
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
        let mut c = Canonicalizer::snapshot(small);
        assert_eq!(
            c.feed(&ok, &mut BytesMut::new()).unwrap_err(),
            Refusal::InputTooLarge(1000)
        );
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
        let mut c = Canonicalizer::snapshot(Limits::default());
        let mut out = BytesMut::new();
        c.feed(&bytes[..1500], &mut out).unwrap();
        assert_eq!(c.finish(&mut out).unwrap_err(), Refusal::Truncated);
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
        // An archive cut short between two members is not whole: the end marker is required.
        for cut in [1024, 512] {
            let no_end = &bytes[..bytes.len() - cut];
            assert_eq!(canon(no_end).unwrap_err(), Refusal::Truncated, "{cut}");
        }
        assert_eq!(canon(&[]).unwrap_err(), Refusal::Truncated);
        let (_, _, out) = canon(&bytes).unwrap();
        assert_eq!(&out[out.len() - 1024..], &[0u8; 1024][..]);
        // Trailing bytes after the end marker are not carried over.
        let mut trailing = bytes.clone();
        trailing.extend_from_slice(b"after the end");
        assert_eq!(canon(&trailing).unwrap().2, canon(&bytes).unwrap().2);
    }

    #[test]
    fn pax_overrides_path_and_is_refused_when_ambiguous() {
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
        // A pax size that disagrees with the header's.
        let mut b = tar::Builder::new(Vec::new());
        b.append_pax_extensions([("size", &b"0"[..])]).unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_size(3);
        b.append_data(&mut h, "f", &b"abc"[..]).unwrap();
        let got = check(&b.into_inner().unwrap()).unwrap_err();
        assert!(
            matches!(
                got,
                Refusal::Ambiguous {
                    what: Ambiguity::PaxSizeMismatch { pax: 0, header: 3 },
                    ..
                }
            ),
            "{got}"
        );
        // Unambiguous pax records are read: a long path and a long link target come out
        // under their full names, written as GNU records.
        let mut b = tar::Builder::new(Vec::new());
        let long = "d/".repeat(80) + "f";
        let target = "t".repeat(120);
        b.append_pax_extensions([("path", long.as_bytes()), ("linkpath", target.as_bytes())])
            .unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_data(&mut h, "short", std::io::empty()).unwrap();
        let (_, listing, out) = canon(&b.into_inner().unwrap()).unwrap();
        let link = listing.iter().find(|e| e.kind == Kind::Symlink).unwrap();
        assert_eq!(
            (link.path.as_str(), link.link.as_str()),
            (long.as_str(), target.as_str())
        );
        assert!(
            !out.windows(9).any(|w| w == b"linkpath="),
            "no pax in canonical output"
        );
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
            Refusal::PathTooLong {
                path: String::new(),
                limit: 0,
            },
            Refusal::PathTooDeep {
                path: String::new(),
                limit: 0,
            },
            Refusal::NameTooLong(String::new()),
            Refusal::FileTooLarge(String::new()),
            Refusal::OwnerOutOfRange(String::new()),
            Refusal::Ambiguous {
                offset: 0,
                what: Ambiguity::LoneZeroBlock,
            },
        ];
        let reasons: std::collections::HashSet<_> = all.iter().map(Refusal::reason).collect();
        assert_eq!(reasons.len(), all.len());
        let listed: std::collections::HashSet<_> = Refusal::REASONS.into_iter().collect();
        assert_eq!(listed, reasons, "Refusal::REASONS lists every reason");
    }
}
