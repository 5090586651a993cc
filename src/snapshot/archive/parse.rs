//! The tar reader: bytes in, [`Event`]s out (a member's header, then its data in pieces).
//!
//! It reads any of the formats a sandbox's `tar -c` may print — ustar (with the `prefix`
//! field), old GNU (`L`/`K` long names, base-256 numbers), pax (`x` per member, `g` global),
//! v7 — into one [`Member`] model, and refuses ([`Ambiguity`]) where those formats let two
//! readers see different things in the same bytes, instead of picking one reading. It is pull
//! based ([`Parser::next`] over a chunk), so an archive of any size is read in constant memory:
//! one header block plus at most one extension's data ([`MAX_EXTENSION`]).

use super::{Ambiguity, Refusal};

/// Tar block size.
pub(super) const BLOCK: usize = 512;
/// Largest GNU long-name or pax extended header accepted.
const MAX_EXTENSION: u64 = 64 << 10;

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

/// One member as the archive describes it (long names and pax records applied).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Path as written in the archive.
    pub path: String,
    /// Kind.
    pub kind: MemberKind,
    /// Size of its data.
    pub size: u64,
    /// Link target (symlinks and hard links; empty otherwise).
    pub link: String,
    /// Mode bits as written (all twelve; the canonical form keeps the permission bits).
    pub mode: u32,
    /// Owner.
    pub uid: u64,
    /// Group.
    pub gid: u64,
    /// Modification time, seconds since the epoch (negative times read as 0).
    pub mtime: u64,
    /// Offset of its header in the archive.
    pub offset: u64,
}

/// What the parser found next.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// A member's header; its data (files only) follows as [`Event::Data`].
    Member(Member),
    /// A piece of the current member's data.
    Data(&'a [u8]),
}

#[derive(Debug)]
enum State {
    /// Collecting a 512-byte header.
    Header,
    /// Passing `remaining` data bytes, then skipping `padding`.
    Data { remaining: u64, padding: u64 },
    /// Collecting an extension's data (`L`, `K`, `x`, `g`), then skipping `padding`.
    Extension {
        flag: u8,
        remaining: u64,
        padding: u64,
    },
    /// Past the end-of-archive marker; everything else is ignored.
    End,
}

/// Values a pax `x` header sets for the next member.
#[derive(Debug, Default)]
struct Pax {
    path: Option<Vec<u8>>,
    linkpath: Option<Vec<u8>>,
    size: Option<u64>,
    mtime: Option<u64>,
    uid: Option<u64>,
    gid: Option<u64>,
    /// GNU sparse-file records: the member's data is a sparse map, not its content.
    sparse: bool,
}

/// Extensions read since the last member, for the next one.
#[derive(Debug, Default)]
struct Pending {
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
    pax: Option<Pax>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.long_name.is_none() && self.long_link.is_none() && self.pax.is_none()
    }
}

/// A pull parser of tar streams.
#[derive(Debug)]
pub struct Parser {
    state: State,
    block: [u8; BLOCK],
    filled: usize,
    /// Extension data being collected.
    ext: Vec<u8>,
    /// Bytes consumed so far.
    offset: u64,
    /// Offset of the header being collected (or of the extension being read).
    header_at: u64,
    zero_blocks: u8,
    pending: Pending,
}

impl Default for Parser {
    fn default() -> Self {
        Parser {
            state: State::Header,
            block: [0; BLOCK],
            filled: 0,
            ext: Vec::new(),
            offset: 0,
            header_at: 0,
            zero_blocks: 0,
            pending: Pending::default(),
        }
    }
}

pub(super) fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

/// A numeric header field's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Number {
    Value(u64),
    /// A negative GNU base-256 value (seen in mtimes).
    Negative,
}

/// Parses an octal or GNU base-256 numeric field, strictly: octal is optional leading spaces,
/// octal digits, then only NULs and spaces. (GNU tar and busybox stop at the first NUL or space
/// and ignore what follows, and busybox also takes a sign; bytes there are refused rather
/// than read one way.) An empty field is 0.
fn number(field: &[u8]) -> Option<Number> {
    let first = *field.first()?;
    if first & 0x80 != 0 {
        if first & 0x40 != 0 {
            return Some(Number::Negative);
        }
        let mut v = u64::from(first & 0x3f);
        for &b in &field[1..] {
            v = v.checked_mul(256)?.checked_add(u64::from(b))?;
        }
        return Some(Number::Value(v));
    }
    let start = field.iter().position(|b| *b != b' ').unwrap_or(field.len());
    let digits = field[start..]
        .iter()
        .position(|b| !(b'0'..=b'7').contains(b))
        .map_or(field.len(), |p| start + p);
    if !field[digits..].iter().all(|b| *b == 0 || *b == b' ') {
        return None;
    }
    let mut v: u64 = 0;
    for &b in &field[start..digits] {
        v = v.checked_mul(8)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(Number::Value(v))
}

/// A NUL-terminated string field.
fn cstr(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    &field[..end]
}

fn utf8(bytes: Vec<u8>) -> Result<String, Refusal> {
    String::from_utf8(bytes)
        .map_err(|e| Refusal::InvalidPath(String::from_utf8_lossy(e.as_bytes()).into_owned()))
}

impl Parser {
    /// The next event from `input`, consuming what it read; `None` when `input` is used up
    /// (or the archive ended) and more input is needed.
    pub fn next<'a>(&mut self, input: &mut &'a [u8]) -> Result<Option<Event<'a>>, Refusal> {
        loop {
            if input.is_empty() {
                return Ok(None);
            }
            match &mut self.state {
                State::End => {
                    self.offset += input.len() as u64;
                    *input = &[];
                    return Ok(None);
                }
                State::Data { remaining, padding } => {
                    if *remaining > 0 {
                        let take = input
                            .len()
                            .min(usize::try_from(*remaining).unwrap_or(usize::MAX));
                        let (data, rest) = input.split_at(take);
                        *input = rest;
                        *remaining -= take as u64;
                        self.offset += take as u64;
                        if *remaining == 0 && *padding == 0 {
                            self.state = State::Header;
                        }
                        return Ok(Some(Event::Data(data)));
                    }
                    let take = input.len().min(*padding as usize);
                    *input = &input[take..];
                    *padding -= take as u64;
                    self.offset += take as u64;
                    if *padding == 0 {
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
                        let take = input.len().min(*remaining as usize);
                        self.ext.extend_from_slice(&input[..take]);
                        *input = &input[take..];
                        *remaining -= take as u64;
                        self.offset += take as u64;
                    } else {
                        let take = input.len().min(*padding as usize);
                        *input = &input[take..];
                        *padding -= take as u64;
                        self.offset += take as u64;
                    }
                    if let State::Extension {
                        remaining: 0,
                        padding: 0,
                        ..
                    } = self.state
                    {
                        let data = std::mem::take(&mut self.ext);
                        self.apply_extension(flag, &data)?;
                        self.state = State::Header;
                    }
                }
                State::Header => {
                    if self.filled == 0 {
                        self.header_at = self.offset;
                        // A whole header in the input: read it in place.
                        if let Some((h, rest)) = input.split_first_chunk::<BLOCK>() {
                            *input = rest;
                            self.offset += BLOCK as u64;
                            if let Some(m) = self.header(h)? {
                                return Ok(Some(Event::Member(m)));
                            }
                            continue;
                        }
                    }
                    let take = input.len().min(BLOCK - self.filled);
                    self.block[self.filled..self.filled + take].copy_from_slice(&input[..take]);
                    self.filled += take;
                    *input = &input[take..];
                    self.offset += take as u64;
                    if self.filled == BLOCK {
                        self.filled = 0;
                        let block = self.block;
                        if let Some(m) = self.header(&block)? {
                            return Ok(Some(Event::Member(m)));
                        }
                    }
                }
            }
        }
    }

    /// Whether the end-of-archive marker has been read: whatever follows is ignored.
    pub fn ended(&self) -> bool {
        matches!(self.state, State::End)
    }

    /// Declares the end of input: an error unless the end-of-archive marker (two zero
    /// blocks) was read. Without it an archive cut short between two members would look
    /// whole; `tar -c` always writes it.
    pub fn finish(&self) -> Result<(), Refusal> {
        match self.state {
            State::End => Ok(()),
            State::Header if self.filled == 0 && !self.pending.is_empty() => {
                Err(self.ambiguous(Ambiguity::DanglingExtension))
            }
            _ => Err(Refusal::Truncated),
        }
    }

    fn ambiguous(&self, what: Ambiguity) -> Refusal {
        Refusal::Ambiguous {
            offset: self.header_at,
            what,
        }
    }

    fn bad(&self, what: &'static str) -> Refusal {
        Refusal::BadHeader {
            offset: self.header_at,
            what,
        }
    }

    /// A numeric field that must not be negative.
    fn unsigned(&self, field: &[u8], what: &'static str) -> Result<u64, Refusal> {
        match number(field) {
            Some(Number::Value(v)) => Ok(v),
            _ => Err(self.bad(what)),
        }
    }

    /// Handles a full header block; returns the member it describes, if any.
    fn header(&mut self, h: &[u8; BLOCK]) -> Result<Option<Member>, Refusal> {
        let at = self.header_at;
        // One pass over the block: all zero exactly when its byte sum is.
        let bytes: u32 = h.iter().map(|b| u32::from(*b)).sum();
        if bytes == 0 {
            if !self.pending.is_empty() {
                return Err(self.ambiguous(Ambiguity::DanglingExtension));
            }
            self.zero_blocks += 1;
            if self.zero_blocks >= 2 {
                self.state = State::End;
            }
            return Ok(None);
        }
        if self.zero_blocks > 0 {
            // GNU tar stops at a lone zero block; busybox reads on.
            return Err(self.ambiguous(Ambiguity::LoneZeroBlock));
        }
        let stored = match number(&h[148..156]) {
            Some(Number::Value(v)) if h[148] & 0x80 == 0 => v,
            _ => return Err(self.bad("checksum field")),
        };
        let sum: u64 = h[..148]
            .iter()
            .chain(&h[156..])
            .map(|b| u64::from(*b))
            .sum::<u64>()
            + 8 * u64::from(b' ');
        if stored != sum {
            return Err(Refusal::BadChecksum(at));
        }
        let flag = h[156];
        let size = self.unsigned(&h[124..136], "size field")?;
        if matches!(flag, b'L' | b'K' | b'x' | b'g') {
            if size > MAX_EXTENSION {
                return Err(Refusal::HeaderTooLarge(at));
            }
            let twice = match flag {
                b'L' => self
                    .pending
                    .long_name
                    .is_some()
                    .then_some(Ambiguity::LongNameTwice),
                b'K' => self
                    .pending
                    .long_link
                    .is_some()
                    .then_some(Ambiguity::LongLinkTwice),
                b'x' => self
                    .pending
                    .pax
                    .is_some()
                    .then_some(Ambiguity::PaxHeaderTwice),
                // A global header between a member's extensions and the member.
                _ => (!self.pending.is_empty()).then_some(Ambiguity::DanglingExtension),
            };
            if let Some(what) = twice {
                return Err(self.ambiguous(what));
            }
            self.state = State::Extension {
                flag,
                remaining: size,
                padding: padding(size),
            };
            if size == 0 {
                self.state = State::Header;
                self.apply_extension(flag, &[])?;
            }
            return Ok(None);
        }

        let posix = &h[257..263] == b"ustar\0";
        let old_gnu = &h[257..265] == b"ustar  \0";
        let v7 = h[257..265].iter().all(|b| *b == 0);
        if !(posix || old_gnu || v7) {
            return Err(self.bad("unknown magic"));
        }
        if !posix && h[345..500].iter().any(|b| *b != 0) {
            // Old GNU keeps times and sparse data there; busybox reads it as a ustar prefix.
            return Err(self.ambiguous(Ambiguity::PrefixOutsideUstar));
        }
        let name = cstr(&h[..100]);
        let header_path = if posix && h[345] != 0 {
            let mut p = cstr(&h[345..500]).to_vec();
            p.push(b'/');
            p.extend_from_slice(name);
            p
        } else {
            name.to_vec()
        };
        let header_link = cstr(&h[157..257]);
        let kind = MemberKind::from_flag(flag);
        let mode = self.unsigned(&h[100..108], "mode field")?;
        let mut uid = self.unsigned(&h[108..116], "uid field")?;
        let mut gid = self.unsigned(&h[116..124], "gid field")?;
        let mut mtime = match number(&h[136..148]) {
            Some(Number::Value(v)) => v,
            Some(Number::Negative) => 0,
            None => return Err(self.bad("mtime field")),
        };
        let pending = std::mem::take(&mut self.pending);
        let pax = pending.pax.unwrap_or_default();
        if pending.long_name.is_some() && pax.path.is_some() {
            return Err(self.ambiguous(Ambiguity::LongNameAndPaxPath));
        }
        if pending.long_link.is_some() && pax.linkpath.is_some() {
            return Err(self.ambiguous(Ambiguity::LongLinkAndPaxLinkpath));
        }
        let path = utf8(pending.long_name.or(pax.path).unwrap_or(header_path))?;
        let explicit_link = pending.long_link.is_some() || pax.linkpath.is_some();
        let link = utf8(
            pending
                .long_link
                .or(pax.linkpath)
                .unwrap_or_else(|| header_link.to_vec()),
        )?;
        if let Some(s) = pax.size
            && s != size
        {
            // busybox ignores a pax size; GNU tar obeys it.
            return Err(self.ambiguous(Ambiguity::PaxSizeMismatch {
                pax: s,
                header: size,
            }));
        }
        if pax.sparse {
            return Err(Refusal::UnsupportedType { path, flag: 'S' });
        }
        uid = pax.uid.unwrap_or(uid);
        gid = pax.gid.unwrap_or(gid);
        mtime = pax.mtime.unwrap_or(mtime);
        match kind {
            MemberKind::File | MemberKind::Dir if !link.is_empty() || explicit_link => {
                // Meaningless on these, and kept by readers as the member's link target.
                return Err(self.ambiguous(Ambiguity::LinkNameOnNonLink));
            }
            MemberKind::Dir | MemberKind::Symlink if size != 0 => {
                // Extractors read no data after these; a reader that skipped `size` bytes would
                // miss the member hidden there.
                return Err(self.ambiguous(Ambiguity::SizeOnNonFile));
            }
            MemberKind::File | MemberKind::Symlink if path.ends_with('/') => {
                // busybox makes a file of it, GNU tar a directory.
                return Err(self.ambiguous(Ambiguity::TrailingSlash));
            }
            _ => {}
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
            kind,
            size,
            link,
            mode: u32::try_from(mode & 0o7777).unwrap_or(0),
            uid,
            gid,
            mtime,
            offset: at,
        }))
    }

    fn apply_extension(&mut self, flag: u8, data: &[u8]) -> Result<(), Refusal> {
        match flag {
            b'L' => self.pending.long_name = Some(self.long_value(data)?),
            b'K' => self.pending.long_link = Some(self.long_value(data)?),
            b'x' => {
                let mut pax = Pax::default();
                let mut seen: Vec<&[u8]> = Vec::new();
                for (key, value) in pax_records(data).ok_or(self.bad("pax records"))? {
                    if seen.contains(&key) {
                        let key = String::from_utf8_lossy(key).into_owned();
                        return Err(self.ambiguous(Ambiguity::PaxDuplicateKey(key)));
                    }
                    seen.push(key);
                    match key {
                        b"path" => pax.path = Some(self.pax_name(value)?),
                        b"linkpath" => pax.linkpath = Some(self.pax_name(value)?),
                        b"size" => pax.size = Some(self.decimal(value, "pax size")?),
                        b"uid" => pax.uid = Some(self.decimal(value, "pax uid")?),
                        b"gid" => pax.gid = Some(self.decimal(value, "pax gid")?),
                        b"mtime" => pax.mtime = Some(self.pax_time(value)?),
                        k if k.starts_with(b"GNU.sparse.") => pax.sparse = true,
                        // Times, owner names, xattrs, comments, charsets: not carried over.
                        _ => {}
                    }
                }
                self.pending.pax = Some(pax);
            }
            _ => {
                // A global header: GNU tar applies these keys to every later member, busybox
                // ignores them.
                for (key, _) in pax_records(data).ok_or(self.bad("pax records"))? {
                    if matches!(
                        key,
                        b"path" | b"linkpath" | b"size" | b"uid" | b"gid" | b"mtime"
                    ) || key.starts_with(b"GNU.sparse.")
                    {
                        let key = String::from_utf8_lossy(key).into_owned();
                        return Err(self.ambiguous(Ambiguity::PaxGlobalOverride(key)));
                    }
                }
            }
        }
        Ok(())
    }

    /// A GNU long name or link: the bytes up to the NUL, and nothing but NULs after it.
    fn long_value(&self, data: &[u8]) -> Result<Vec<u8>, Refusal> {
        let value = cstr(data);
        if data[value.len()..].iter().any(|b| *b != 0) {
            return Err(self.ambiguous(Ambiguity::BytesAfterNul));
        }
        Ok(value.to_vec())
    }

    fn pax_name(&self, value: &[u8]) -> Result<Vec<u8>, Refusal> {
        if value.contains(&0) {
            return Err(self.ambiguous(Ambiguity::BytesAfterNul));
        }
        Ok(value.to_vec())
    }

    fn decimal(&self, value: &[u8], what: &'static str) -> Result<u64, Refusal> {
        if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
            return Err(self.bad(what));
        }
        std::str::from_utf8(value)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(self.bad(what))
    }

    /// A pax time (`[-]seconds[.fraction]`): whole seconds, negative ones as 0.
    fn pax_time(&self, value: &[u8]) -> Result<u64, Refusal> {
        let (negative, rest) = match value.strip_prefix(b"-") {
            Some(r) => (true, r),
            None => (false, value),
        };
        let (secs, frac) = match rest.iter().position(|b| *b == b'.') {
            Some(p) => (&rest[..p], &rest[p + 1..]),
            None => (rest, &[][..]),
        };
        if !frac.iter().all(u8::is_ascii_digit) {
            return Err(self.bad("pax mtime"));
        }
        let secs = self.decimal(secs, "pax mtime")?;
        Ok(if negative { 0 } else { secs })
    }
}

/// Splits pax records (`"<len> <key>=<value>\n"`); `None` when malformed. Trailing NULs are
/// allowed.
fn pax_records(mut data: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let mut out = Vec::new();
    while !data.is_empty() {
        if data.iter().all(|b| *b == 0) {
            break;
        }
        let sp = data.iter().take(20).position(|b| *b == b' ')?;
        let digits = &data[..sp];
        if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let len: usize = std::str::from_utf8(digits).ok()?.parse().ok()?;
        if len <= sp + 1 || len > data.len() {
            return None;
        }
        let record = data[sp + 1..len].strip_suffix(b"\n")?;
        let eq = record.iter().position(|b| *b == b'=')?;
        if eq == 0 {
            return None;
        }
        out.push((&record[..eq], &record[eq + 1..]));
        data = &data[len..];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numeric_fields_are_read_strictly() {
        assert_eq!(number(b"0000644\0"), Some(Number::Value(0o644)));
        assert_eq!(number(b"  755 \0"), Some(Number::Value(0o755)));
        assert_eq!(number(b"\0\0\0"), Some(Number::Value(0)));
        assert_eq!(number(b"77777777777\0"), Some(Number::Value(0o77777777777)));
        // Full width, no terminator: both extractors read all of it.
        assert_eq!(number(b"777777777777"), Some(Number::Value(0o777777777777)));
        assert_eq!(number(b"0009"), None);
        assert_eq!(number(b"-123\0"), None, "busybox would read a sign");
        assert_eq!(number(b"644\0xyz"), None, "bytes after the terminator");
        assert_eq!(number(b"644 1\0"), None);
        let mut b256 = [0u8; 12];
        b256[0] = 0x80;
        b256[11] = 5;
        b256[10] = 1;
        assert_eq!(number(&b256), Some(Number::Value(261)));
        b256[0] = 0xff;
        assert_eq!(number(&b256), Some(Number::Negative));
    }

    #[test]
    fn pax_records_split_strictly() {
        assert_eq!(
            pax_records(b"11 path=ab\n"),
            Some(vec![(&b"path"[..], &b"ab"[..])])
        );
        assert_eq!(
            pax_records(b"11 path=ab\n\0\0\0"),
            pax_records(b"11 path=ab\n")
        );
        assert_eq!(pax_records(b"99 path=ab\n"), None);
        assert_eq!(pax_records(b"11 path=ab "), None);
        assert_eq!(pax_records(b"+11 path=ab\n"), None);
        assert_eq!(pax_records(b"7 =ab\n"), None);
    }

    #[test]
    fn pax_times_keep_whole_seconds() {
        let p = Parser::default();
        assert_eq!(p.pax_time(b"1700000000.123456789"), Ok(1_700_000_000));
        assert_eq!(p.pax_time(b"-5.5"), Ok(0));
        assert_eq!(p.pax_time(b"12"), Ok(12));
        assert!(p.pax_time(b"1e9").is_err());
        assert!(p.pax_time(b"").is_err());
    }
}
