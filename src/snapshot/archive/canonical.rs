//! The canonical encoding: the only tar the operator stores or hands to `tar -x`.
//!
//! One plain form that busybox tar and GNU tar read identically (the differential tests in
//! `differential.rs` check it against both):
//! - members are regular files (`0`), directories (`5`) and symlinks (`2`), nothing else;
//! - POSIX ustar headers (`ustar\0` `00`): name, mode (permission bits only — no setuid,
//!   setgid or sticky bit), uid, gid, size, mtime as zero-padded octal ending in NUL; link name
//!   only on symlinks; empty owner names; zero device numbers; the prefix field unused;
//! - a name or link target of 100 bytes or more goes in a GNU `L`/`K` record before its
//!   header (and the header carries its first 99 bytes). That is the one long-name mechanism
//!   both extractors read the same way: busybox reads a pax `path` (and `linkpath` only in
//!   recent versions) but never a pax `size`, so pax is never written;
//! - data exactly `size` bytes, padded with zeros to the block; two zero blocks at the end and
//!   nothing after.

use bytes::{BufMut, BytesMut};

use super::parse::BLOCK;

/// What a canonical member is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
}

/// A canonical member header's fields.
#[derive(Clone, Copy, Debug)]
pub struct Header<'a> {
    /// Normalised path (directories end in `/`).
    pub path: &'a str,
    /// Kind.
    pub kind: Kind,
    /// Data size (files; 0 otherwise).
    pub size: u64,
    /// Permission bits (masked here to `0o777`).
    pub mode: u32,
    /// Owner (≤ [`super::validate::MAX_ID`]).
    pub uid: u64,
    /// Group (≤ [`super::validate::MAX_ID`]).
    pub gid: u64,
    /// Modification time (clamped to what 11 octal digits hold).
    pub mtime: u64,
    /// Link target (symlinks).
    pub link: &'a str,
}

/// Writes `v` as zero-padded octal filling `field` but its last byte, which is NUL. The
/// caller keeps `v` within range (larger values are clamped).
fn octal(field: &mut [u8], v: u64) {
    let digits = field.len() - 1;
    let max = (1u64 << (3 * digits)) - 1;
    let mut v = v.min(max);
    for b in field[..digits].iter_mut().rev() {
        *b = b'0' + (v & 7) as u8;
        v >>= 3;
    }
    field[digits] = 0;
}

/// One ustar header block.
fn block(name: &[u8], flag: u8, size: u64, h: Option<&Header<'_>>, link: &[u8]) -> [u8; BLOCK] {
    let mut b = [0u8; BLOCK];
    b[..name.len()].copy_from_slice(name);
    let (mode, uid, gid, mtime) =
        h.map_or((0, 0, 0, 0), |h| (h.mode & 0o777, h.uid, h.gid, h.mtime));
    octal(&mut b[100..108], u64::from(mode));
    octal(&mut b[108..116], uid);
    octal(&mut b[116..124], gid);
    octal(&mut b[124..136], size);
    octal(&mut b[136..148], mtime);
    b[156] = flag;
    b[157..157 + link.len()].copy_from_slice(link);
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    let sum: u32 = b.iter().map(|x| u32::from(*x)).sum::<u32>() + 8 * u32::from(b' ');
    octal(&mut b[148..155], u64::from(sum));
    b[155] = b' ';
    b
}

/// The first `max` bytes of a long value (the header field of a member with an `L`/`K`).
fn field(value: &str, max: usize) -> &[u8] {
    &value.as_bytes()[..value.len().min(max)]
}

/// Appends a GNU long-name (`L`) or long-link (`K`) record.
fn long(out: &mut BytesMut, flag: u8, value: &str) {
    let size = value.len() as u64 + 1;
    out.put_slice(&block(b"././@LongLink", flag, size, None, b""));
    out.put_slice(value.as_bytes());
    out.put_u8(0);
    out.put_bytes(0, super::parse::padding(size) as usize);
}

/// Appends a member's header (with its `L`/`K` records when needed). Its data follows, then
/// [`pad`].
pub fn header(out: &mut BytesMut, h: &Header<'_>) {
    let (flag, size, link) = match h.kind {
        Kind::File => (b'0', h.size, ""),
        Kind::Dir => (b'5', 0, ""),
        Kind::Symlink => (b'2', 0, h.link),
    };
    if h.path.len() >= 100 {
        long(out, b'L', h.path);
    }
    if link.len() >= 100 {
        long(out, b'K', link);
    }
    out.put_slice(&block(
        field(h.path, 99),
        flag,
        size,
        Some(h),
        field(link, 99),
    ));
}

/// Appends the zeros that complete a member of `size` data bytes to the block.
pub fn pad(out: &mut BytesMut, size: u64) {
    out.put_bytes(0, super::parse::padding(size) as usize);
}

/// Appends the end-of-archive marker.
pub fn end(out: &mut BytesMut) {
    out.put_bytes(0, 2 * BLOCK);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn octal_fields_are_zero_padded_and_nul_ended() {
        let mut f = [0xffu8; 8];
        octal(&mut f, 0o644);
        assert_eq!(&f, b"0000644\0");
        let mut s = [0u8; 12];
        octal(&mut s, u64::MAX);
        assert_eq!(&s, b"77777777777\0", "clamped");
    }

    #[test]
    fn a_header_is_plain_ustar_with_a_valid_checksum() {
        let mut out = BytesMut::new();
        header(
            &mut out,
            &Header {
                path: "d/f",
                kind: Kind::File,
                size: 5,
                mode: 0o4755,
                uid: 1000,
                gid: 1000,
                mtime: 1_700_000_000,
                link: "ignored",
            },
        );
        assert_eq!(out.len(), BLOCK);
        assert_eq!(&out[..4], b"d/f\0");
        assert_eq!(&out[100..108], b"0000755\0", "setuid dropped");
        assert_eq!(&out[157..257], &[0u8; 100][..], "no link name on a file");
        assert_eq!(&out[257..265], b"ustar\x0000");
        assert!(
            out[265..500].iter().all(|b| *b == 0),
            "no owner names, devices, prefix"
        );
        let sum: u32 = out[..148]
            .iter()
            .chain(&out[156..])
            .map(|b| u32::from(*b))
            .sum::<u32>()
            + 256;
        assert_eq!(&out[148..156], format!("{sum:06o}\0 ").as_bytes());
    }

    #[test]
    fn long_names_and_targets_go_in_gnu_records() {
        let path = "p".repeat(150);
        let link = "t".repeat(100);
        let mut out = BytesMut::new();
        header(
            &mut out,
            &Header {
                path: &path,
                kind: Kind::Symlink,
                size: 0,
                mode: 0o777,
                uid: 0,
                gid: 0,
                mtime: 0,
                link: &link,
            },
        );
        // L header + 1 data block, K header + 1 data block, the member's header.
        assert_eq!(out.len(), 5 * BLOCK);
        assert_eq!(out[156], b'L');
        assert_eq!(&out[BLOCK..BLOCK + 151], format!("{path}\0").as_bytes());
        assert_eq!(out[2 * BLOCK + 156], b'K');
        assert_eq!(out[4 * BLOCK + 156], b'2');
        assert_eq!(&out[4 * BLOCK..4 * BLOCK + 99], &path.as_bytes()[..99]);
        assert_eq!(out[4 * BLOCK + 99], 0);
    }
}
