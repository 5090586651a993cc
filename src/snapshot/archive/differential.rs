//! Differential tests: archives in every header format and extension, many of them hostile
//! or odd, go through the [`Canonicalizer`]; every one it accepts is extracted by busybox tar
//! and by GNU tar in a scratch directory, and what each created — path, kind, content digest,
//! link target, permission bits — must be exactly what the canonicaliser listed, with nothing
//! else anywhere. The canonical form must also re-encode to itself, and give the same answer
//! however the input is chunked. Archives that found bugs are kept in `tests/tar-corpus/`
//! and checked the same way.
//!
//! Needs `busybox` (Debian's busybox-static) and GNU `tar` on the host: `hack/test` installs
//! them before the unit tests.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use proptest::prelude::*;
use sha2::{Digest, Sha256};

use super::tests::{canon, canon_with, seal};
use super::{Entry, Kind, Limits};

/// What an extractor created at one path.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Found {
    kind: String,
    sha256: String,
    link: String,
    /// Permission bits (files and directories the archive lists; implied ones vary).
    mode: Option<u32>,
}

/// Walks `root` without following symlinks.
fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Found>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        let rel = p
            .strip_prefix(root)
            .expect("under root")
            .to_string_lossy()
            .into_owned();
        let md = std::fs::symlink_metadata(&p).expect("lstat");
        let ft = md.file_type();
        let mode = Some(md.permissions().mode() & 0o7777);
        let found = if ft.is_symlink() {
            Found {
                kind: "symlink".into(),
                sha256: String::new(),
                link: std::fs::read_link(&p)
                    .expect("readlink")
                    .to_string_lossy()
                    .into_owned(),
                mode: None,
            }
        } else if ft.is_dir() {
            walk(root, &p, out);
            Found {
                kind: "dir".into(),
                sha256: String::new(),
                link: String::new(),
                mode,
            }
        } else if ft.is_file() {
            Found {
                // A second name for one inode is a hard link.
                kind: if md.nlink() == 1 { "file" } else { "hardlink" }.into(),
                sha256: hex::encode(Sha256::digest(std::fs::read(&p).expect("read"))),
                link: String::new(),
                mode,
            }
        } else {
            Found {
                kind: format!("special {:o}", md.mode()),
                sha256: String::new(),
                link: String::new(),
                mode,
            }
        };
        out.insert(rel, found);
    }
}

/// What the listing says extraction creates. `modes` holds the permission bits of the members
/// the archive lists (read back from the canonical headers).
fn expected(listing: &[Entry], modes: &BTreeMap<String, u32>) -> BTreeMap<String, Found> {
    listing
        .iter()
        .map(|e| {
            let kind = match e.kind {
                Kind::File => "file",
                Kind::Dir => "dir",
                Kind::Symlink => "symlink",
            };
            let mode = match e.kind {
                Kind::Symlink => None,
                _ => modes.get(&e.path).copied(),
            };
            (
                e.path.clone(),
                Found {
                    kind: kind.into(),
                    sha256: e.sha256.clone(),
                    link: e.link.clone(),
                    mode,
                },
            )
        })
        .collect()
}

/// Permission bits of each member in a canonical archive, by path.
fn modes(canonical: &[u8]) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    let mut ar = tar::Archive::new(canonical);
    for e in ar.entries().expect("entries") {
        let e = e.expect("entry");
        let path = e.path().expect("path").to_string_lossy().into_owned();
        let path = path.trim_end_matches('/').to_string();
        out.insert(path, e.header().mode().expect("mode") & 0o7777);
    }
    out
}

/// A scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!(
            "agentbox-diff-{tag}-{}-{:x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(dir.join("root")).expect("scratch");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What one extractor did with an archive.
struct Extracted {
    ok: bool,
    stderr: String,
    /// Names in the scratch directory beside the root (there must be none).
    beside: Vec<std::ffi::OsString>,
    found: BTreeMap<String, Found>,
    root: PathBuf,
    _scratch: Scratch,
}

/// Runs `argv -x -f - -C <root>` (one tar implementation) on `bytes` in a scratch directory.
fn run_extractor(argv: &[&str], bytes: &[u8]) -> Extracted {
    let scratch = Scratch::new(argv[0]);
    let root = scratch.0.join("root");
    let mut child = Command::new(argv[0])
        .args(&argv[1..])
        .args(["-x", "-f", "-", "-C"])
        .arg(&root)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (hack/test installs it)", argv[0]));
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        // A refusing extractor may close its stdin early.
        let _ = stdin.write_all(bytes);
    }
    let out = child.wait_with_output().expect("wait");
    let beside = std::fs::read_dir(&scratch.0)
        .expect("read scratch")
        .map(|e| e.expect("entry").file_name())
        .filter(|n| n != "root")
        .collect();
    let mut found = BTreeMap::new();
    walk(&root, &root, &mut found);
    Extracted {
        ok: out.status.success(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        beside,
        found,
        root,
        _scratch: scratch,
    }
}

/// Extracts `canonical` with one implementation; what it created, or why that is wrong.
fn extract(argv: &[&str], canonical: &[u8]) -> Result<BTreeMap<String, Found>, String> {
    let x = run_extractor(argv, canonical);
    if !x.ok {
        return Err(format!("{argv:?} failed: {}", x.stderr));
    }
    if !x.beside.is_empty() {
        return Err(format!("{argv:?} wrote outside its root: {:?}", x.beside));
    }
    forbidden(&x.root, &x.found).map_err(|e| format!("{argv:?}: {e}"))?;
    Ok(x.found)
}

const EXTRACTORS: [&[&str]; 2] = [&["busybox", "tar"], &["tar"]];

/// Where a path leads inside `root`, following symlinks: `Err` if it ever climbs above it.
/// (An oracle of its own, by resolution rather than the validator's counting of `..`.)
fn resolve(root: &Path, rel: &Path, hops: &mut u32) -> Result<Vec<std::ffi::OsString>, String> {
    let mut at: Vec<std::ffi::OsString> = Vec::new();
    for c in rel.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                if at.pop().is_none() {
                    return Err(format!("{} climbs out", rel.display()));
                }
            }
            std::path::Component::Normal(n) => {
                at.push(n.to_os_string());
                let here: PathBuf = at.iter().fold(root.to_path_buf(), |p, c| p.join(c));
                if let Ok(t) = std::fs::read_link(&here) {
                    *hops += 1;
                    if *hops > 40 {
                        return Ok(at); // a loop, inside the root
                    }
                    if t.is_absolute() {
                        return Err(format!("{} points to {}", here.display(), t.display()));
                    }
                    at.pop();
                    let base: PathBuf = at.iter().collect();
                    at = resolve(root, &base.join(t), hops)?;
                }
            }
            _ => return Err(format!("{} is absolute", rel.display())),
        }
    }
    Ok(at)
}

/// What must never be extracted, whatever the listing says: hard links, devices, FIFOs,
/// sockets, setuid/setgid/sticky bits, symlinks leading out of the root.
fn forbidden(root: &Path, found: &BTreeMap<String, Found>) -> Result<(), String> {
    for (p, f) in found {
        if !matches!(f.kind.as_str(), "file" | "dir" | "symlink") {
            return Err(format!("{p} is a {}", f.kind));
        }
        if f.mode.is_some_and(|m| m & 0o7000 != 0) {
            return Err(format!("{p} has mode {:o}", f.mode.unwrap_or(0)));
        }
        if f.kind == "symlink" {
            resolve(root, Path::new(p), &mut 0)?;
        }
    }
    Ok(())
}

/// The whole property for one input archive: refused, or canonicalised to a fixed point that
/// both extractors turn into exactly the listed tree. Returns the refusal reason, if refused.
fn check_archive(input: &[u8]) -> Result<Option<&'static str>, String> {
    let whole = canon(input);
    for chunk in [1usize, 512, 4099] {
        let other = canon_with(input, Limits::default(), chunk);
        if other.as_ref().map_err(|r| r.reason()) != whole.as_ref().map_err(|r| r.reason()) {
            return Err(format!(
                "chunk {chunk} gives {:?}, whole gives {:?}",
                other.map(|o| o.0).map_err(|r| r.to_string()),
                whole.map(|o| o.0).map_err(|r| r.to_string())
            ));
        }
    }
    let (_, listing, out) = match whole {
        Ok(c) => c,
        Err(r) => return Ok(Some(r.reason())),
    };
    let (_, again, out2) = canon(&out).map_err(|r| format!("canonical output refused: {r}"))?;
    if out2 != out || again != listing {
        return Err("the canonical form does not re-encode to itself".into());
    }
    let mut paths: Vec<&str> = listing.iter().map(|e| e.path.as_str()).collect();
    paths.dedup();
    if paths.len() != listing.len() {
        return Err(format!("a path listed twice: {listing:?}"));
    }
    let want = expected(&listing, &modes(&out));
    for argv in EXTRACTORS {
        let mut got = extract(argv, &out)?;
        // Directories only implied get the extractor's default mode.
        for (p, f) in got.iter_mut() {
            if want.get(p).is_some_and(|w| w.mode.is_none()) {
                f.mode = None;
            }
        }
        if got != want {
            return Err(format!(
                "{argv:?} extracted something else\n  listed:    {want:?}\n  extracted: {got:?}"
            ));
        }
    }
    Ok(None)
}

// ---- hostile and odd archives ----

#[derive(Clone, Debug)]
enum Body {
    File(Vec<u8>),
    Dir,
    Symlink(String),
    Hardlink(String),
    CharDev,
    Fifo,
    Flag(u8),
}

/// How a member's name is written.
#[derive(Clone, Copy, Debug)]
enum NameIn {
    /// The name field (cut at 100 bytes).
    Field,
    /// Split between the ustar prefix and name fields where it fits.
    Prefix,
    /// A GNU `L` record.
    GnuLong,
    /// A pax `path` record.
    PaxPath,
    /// Both (ambiguous).
    GnuLongAndPax,
}

/// How a link target is written.
#[derive(Clone, Copy, Debug)]
enum LinkIn {
    Field,
    GnuLong,
    PaxLinkpath,
    GnuLongAndPax,
}

/// How a size is written.
#[derive(Clone, Copy, Debug)]
enum SizeIn {
    Octal,
    Base256,
    PaxAgreeing,
    PaxDisagreeing,
}

#[derive(Clone, Copy, Debug)]
enum Magic {
    Posix,
    OldGnu,
    V7,
}

/// Rare oddities around a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Odd {
    None,
    LinkNameOnFile,
    SizeOnDir,
    PaxJunkKeys,
    PaxDuplicateKey,
    GlobalComment,
    GlobalPath,
    LoneZeroBefore,
    TwoLongNames,
    SignedChecksum,
}

#[derive(Clone, Debug)]
struct GenMember {
    path: String,
    body: Body,
    name_in: NameIn,
    link_in: LinkIn,
    size_in: SizeIn,
    magic: Magic,
    mode: u32,
    uid: u64,
    mtime: u64,
    odd: Odd,
}

#[derive(Clone, Copy, Debug)]
enum Ending {
    TwoZeroBlocks,
    OneZeroBlock,
    Nothing,
    TrailingGarbage,
}

fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(vec!["a", "b", "c", "dd", "e.txt", "sp ace", "ü"]).prop_map(String::from),
        1 => Just(".".to_string()),
        1 => Just(String::new()),
        1 => Just("..".to_string()),
        1 => Just(".agentbox".to_string()),
        2 => (100usize..130).prop_map(|n| "L".repeat(n)),
        1 => Just("N".repeat(256)),
    ]
}

fn path() -> impl Strategy<Value = String> {
    (
        prop_oneof![6 => Just(""), 2 => Just("./"), 1 => Just("/")],
        prop::collection::vec(component(), 1..5),
    )
        .prop_map(|(lead, parts)| format!("{lead}{}", parts.join("/")))
}

fn target() -> impl Strategy<Value = String> {
    (
        prop_oneof![8 => Just(""), 1 => Just("/")],
        prop::collection::vec(
            prop_oneof![
                4 => prop::sample::select(vec!["a", "b", "dd", "."]).prop_map(String::from),
                3 => Just("..".to_string()),
                1 => (100usize..120).prop_map(|n| "T".repeat(n)),
            ],
            1..4,
        ),
    )
        .prop_map(|(lead, parts)| format!("{lead}{}", parts.join("/")))
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        10 => prop::collection::vec(any::<u8>(), 0..700).prop_map(Body::File),
        4 => Just(Body::Dir),
        4 => target().prop_map(Body::Symlink),
        1 => target().prop_map(Body::Hardlink),
        1 => Just(Body::CharDev),
        1 => Just(Body::Fifo),
        1 => prop::sample::select(vec![b'S', b'V', b'M', b'N', b'D', b'A']).prop_map(Body::Flag),
    ]
}

fn member() -> impl Strategy<Value = GenMember> {
    let encodings = (
        prop_oneof![
            5 => Just(NameIn::Field),
            2 => Just(NameIn::Prefix),
            3 => Just(NameIn::GnuLong),
            3 => Just(NameIn::PaxPath),
            1 => Just(NameIn::GnuLongAndPax),
        ],
        prop_oneof![
            5 => Just(LinkIn::Field),
            3 => Just(LinkIn::GnuLong),
            3 => Just(LinkIn::PaxLinkpath),
            1 => Just(LinkIn::GnuLongAndPax),
        ],
        prop_oneof![
            6 => Just(SizeIn::Octal),
            2 => Just(SizeIn::Base256),
            2 => Just(SizeIn::PaxAgreeing),
            1 => Just(SizeIn::PaxDisagreeing),
        ],
        prop_oneof![4 => Just(Magic::Posix), 4 => Just(Magic::OldGnu), 1 => Just(Magic::V7)],
    );
    let odd = prop_oneof![
        40 => Just(Odd::None),
        1 => Just(Odd::LinkNameOnFile),
        1 => Just(Odd::SizeOnDir),
        2 => Just(Odd::PaxJunkKeys),
        1 => Just(Odd::PaxDuplicateKey),
        1 => Just(Odd::GlobalComment),
        1 => Just(Odd::GlobalPath),
        1 => Just(Odd::LoneZeroBefore),
        1 => Just(Odd::TwoLongNames),
        1 => Just(Odd::SignedChecksum),
    ];
    (
        path(),
        body(),
        encodings,
        prop_oneof![
            Just(0o644u32),
            Just(0o755),
            Just(0o4755),
            Just(0o1777),
            Just(0o600),
            Just(0o000)
        ],
        prop_oneof![Just(0u64), Just(1000), Just(65534)],
        prop_oneof![Just(0u64), Just(1_700_000_000)],
        odd,
    )
        .prop_map(
            |(path, body, (name_in, link_in, size_in, magic), mode, uid, mtime, odd)| GenMember {
                path,
                body,
                name_in,
                link_in,
                size_in,
                magic,
                mode,
                uid,
                mtime,
                odd,
            },
        )
}

/// Any member at all: hostile paths, types, encodings and oddities.
fn hostile_archive() -> impl Strategy<Value = (Vec<GenMember>, Ending)> {
    (
        prop::collection::vec(member(), 1..10),
        prop_oneof![
            6 => Just(Ending::TwoZeroBlocks),
            1 => Just(Ending::OneZeroBlock),
            1 => Just(Ending::Nothing),
            1 => Just(Ending::TrailingGarbage),
        ],
    )
}

/// Members the rules accept, in every encoding that is not ambiguous: distinct paths (the
/// last component carries its index), symlinks that stay inside, only files, directories
/// and symlinks.
fn benign_member() -> impl Strategy<Value = (Vec<String>, u8, Vec<u8>, usize, Vec<String>)> {
    (
        prop::collection::vec(
            prop_oneof![
                6 => prop::sample::select(vec!["a", "b", "dd", "sp ace", "ü"]).prop_map(String::from),
                1 => (100usize..130).prop_map(|n| "L".repeat(n)),
            ],
            0..4,
        ),
        prop::sample::select(vec![b'0', b'0', b'0', b'5', b'2']),
        prop::collection::vec(any::<u8>(), 0..700),
        0usize..4,
        prop::collection::vec(
            prop_oneof![
                4 => prop::sample::select(vec!["a", "b", "dd", "."]).prop_map(String::from),
                1 => (100usize..120).prop_map(|n| "T".repeat(n)),
            ],
            1..3,
        ),
    )
}

fn benign_archive() -> impl Strategy<Value = (Vec<GenMember>, Ending)> {
    let encodings = (
        prop::sample::select(vec![
            NameIn::Field,
            NameIn::Prefix,
            NameIn::GnuLong,
            NameIn::PaxPath,
        ]),
        prop::sample::select(vec![LinkIn::Field, LinkIn::GnuLong, LinkIn::PaxLinkpath]),
        prop::sample::select(vec![SizeIn::Octal, SizeIn::Base256, SizeIn::PaxAgreeing]),
        prop::sample::select(vec![Magic::Posix, Magic::OldGnu, Magic::V7]),
        prop::sample::select(vec![
            Odd::None,
            Odd::None,
            Odd::PaxJunkKeys,
            Odd::GlobalComment,
        ]),
        prop::sample::select(vec![0o644u32, 0o755, 0o4755, 0o1777, 0o600, 0o000, 0o750]),
        prop_oneof![Just(""), Just("./")],
    );
    (
        prop::collection::vec((benign_member(), encodings), 1..12),
        prop::sample::select(vec![Ending::TwoZeroBlocks, Ending::TrailingGarbage]),
    )
        .prop_map(|(members, ending)| {
            let members = members
                .into_iter()
                .enumerate()
                .map(
                    |(
                        i,
                        (
                            (dirs, flag, data, ups, names),
                            (name_in, link_in, size_in, magic, odd, mode, lead),
                        ),
                    )| {
                        let last = format!("m{i}");
                        let depth = dirs.len();
                        let path = format!(
                            "{lead}{}",
                            dirs.iter()
                                .chain([&last])
                                .cloned()
                                .collect::<Vec<_>>()
                                .join("/")
                        );
                        let body = match flag {
                            b'5' => Body::Dir,
                            b'2' => {
                                let ups = ups.min(depth);
                                let mut t: Vec<String> = vec!["..".to_string(); ups];
                                t.extend(names);
                                Body::Symlink(t.join("/"))
                            }
                            _ => Body::File(data),
                        };
                        let name_in = match name_in {
                            NameIn::Field if path.len() > 99 => NameIn::GnuLong,
                            NameIn::Prefix if !matches!(magic, Magic::Posix) => NameIn::PaxPath,
                            n => n,
                        };
                        GenMember {
                            path,
                            body,
                            name_in,
                            link_in,
                            size_in,
                            magic,
                            mode,
                            uid: 1000,
                            mtime: 1_700_000_000,
                            odd,
                        }
                    },
                )
                .collect();
            (members, ending)
        })
}

/// A plain member of a hazard.
fn plain(path: &str, body: Body) -> GenMember {
    GenMember {
        path: path.into(),
        body,
        name_in: NameIn::Field,
        link_in: LinkIn::Field,
        size_in: SizeIn::Octal,
        magic: Magic::Posix,
        mode: 0o644,
        uid: 0,
        mtime: 0,
        odd: Odd::None,
    }
}

/// Self-contained hazards, each of which the rules must refuse: if a rule were missing, the
/// extractors would create something the listing does not say, or something forbidden.
fn hazard(which: usize) -> Vec<GenMember> {
    let file = |p: &str, d: &[u8]| plain(p, Body::File(d.to_vec()));
    let link = |p: &str, t: &str| plain(p, Body::Symlink(t.into()));
    match which {
        0 => vec![link("zl", "."), file("zl/x", b"through a symlink")],
        1 => vec![link("zl", "dd"), plain("zl/y", Body::Dir)],
        2 => vec![file("zf", b"f"), file("zf/x", b"under a file")],
        3 => vec![file("zd", b"one"), file(".//zd", b"two")],
        4 => vec![link("ze", "../outside")],
        5 => vec![plain("zx", Body::Dir), link("zx/ze", "../../outside")],
        6 => vec![link("zn", "a/../../outside")],
        7 => vec![link("za", "/etc")],
        8 => vec![file("zh0", b"h"), plain("zh", Body::Hardlink("zh0".into()))],
        9 => vec![plain("zc", Body::CharDev)],
        10 => vec![plain("zp", Body::Fifo)],
        11 => vec![file("/tmp/agentbox-diff-absolute", b"abs")],
        12 => vec![file("a/../../agentbox-diff-up", b"up")],
        13 => vec![file(".agentbox/marker", b"m")],
        14 => vec![plain("zs", Body::Flag(b'S'))],
        15 => vec![link("zl2", "."), link("zl2/zl3", ".")],
        _ => vec![plain("zdir", Body::Dir), link("zdir", ".")],
    }
}

fn with_hazard() -> impl Strategy<Value = (Vec<GenMember>, Ending)> {
    (benign_archive(), 0usize..17, any::<prop::sample::Index>()).prop_map(
        |((mut members, ending), which, at)| {
            let at = at.index(members.len() + 1);
            for (i, m) in hazard(which).into_iter().enumerate() {
                members.insert(at + i, m);
            }
            (members, ending)
        },
    )
}

fn archive() -> impl Strategy<Value = (Vec<GenMember>, Ending)> {
    prop_oneof![benign_archive(), with_hazard(), hostile_archive()]
}

fn octal_field(field: &mut [u8], v: u64) {
    let s = format!("{v:0width$o}", width = field.len() - 1);
    let s = &s.as_bytes()[s.len() - (field.len() - 1)..];
    field[..s.len()].copy_from_slice(s);
    field[field.len() - 1] = 0;
}

fn pad(out: &mut Vec<u8>) {
    out.resize(out.len().div_ceil(512) * 512, 0);
}

/// One pax record, its length prefix counting itself.
fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = key.len() + value.len() + 3; // ' ', '=', '\n'
    let mut len = body + 1;
    while len != body + len.to_string().len() {
        len = body + len.to_string().len();
    }
    let mut r = format!("{len} {key}=").into_bytes();
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

fn header_block(name: &[u8], flag: u8, size: u64, magic: Magic) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len().min(100)].copy_from_slice(&name[..name.len().min(100)]);
    octal_field(&mut h[100..108], 0o644);
    octal_field(&mut h[108..116], 0);
    octal_field(&mut h[116..124], 0);
    octal_field(&mut h[124..136], size);
    octal_field(&mut h[136..148], 0);
    h[156] = flag;
    match magic {
        Magic::Posix => h[257..265].copy_from_slice(b"ustar\x0000"),
        Magic::OldGnu => h[257..265].copy_from_slice(b"ustar  \0"),
        Magic::V7 => {}
    }
    seal(&mut h);
    h
}

fn extension(out: &mut Vec<u8>, flag: u8, data: &[u8], magic: Magic) {
    let name: &[u8] = if flag == b'L' || flag == b'K' {
        b"././@LongLink"
    } else {
        b"PaxHeaders/x"
    };
    out.extend_from_slice(&header_block(name, flag, data.len() as u64, magic));
    out.extend_from_slice(data);
    pad(out);
}

fn encode_member(out: &mut Vec<u8>, m: &GenMember) {
    let (flag, data, link): (u8, &[u8], &str) = match &m.body {
        Body::File(d) => (
            b'0',
            d,
            if m.odd == Odd::LinkNameOnFile {
                "f"
            } else {
                ""
            },
        ),
        Body::Dir => (
            b'5',
            if m.odd == Odd::SizeOnDir {
                &[7u8; 10][..]
            } else {
                &[]
            },
            "",
        ),
        Body::Symlink(t) => (b'2', &[], t),
        Body::Hardlink(t) => (b'1', &[], t),
        Body::CharDev => (b'3', &[], ""),
        Body::Fifo => (b'6', &[], ""),
        Body::Flag(f) => (*f, &[], ""),
    };
    let size = data.len() as u64;
    let path = m.path.as_bytes();
    match m.odd {
        Odd::GlobalComment => extension(out, b'g', &pax_record("comment", b"hi"), m.magic),
        Odd::GlobalPath => extension(out, b'g', &pax_record("path", b"g"), m.magic),
        _ => {}
    }
    let mut pax = Vec::new();
    let mut name_field: Vec<u8> = path.to_vec();
    let mut prefix_field: Vec<u8> = Vec::new();
    match m.name_in {
        NameIn::Field => {}
        NameIn::Prefix => {
            if path.len() > 100
                && let Some(cut) = (0..path.len())
                    .rev()
                    .find(|&i| path[i] == b'/' && i <= 155 && path.len() - i - 1 <= 100)
            {
                prefix_field = path[..cut].to_vec();
                name_field = path[cut + 1..].to_vec();
            }
        }
        NameIn::GnuLong | NameIn::GnuLongAndPax => {
            let mut d = path.to_vec();
            d.push(0);
            extension(out, b'L', &d, m.magic);
            if m.odd == Odd::TwoLongNames {
                extension(out, b'L', b"other\0", m.magic);
            }
            if matches!(m.name_in, NameIn::GnuLongAndPax) {
                pax.extend(pax_record("path", b"elsewhere"));
            }
        }
        NameIn::PaxPath => pax.extend(pax_record("path", path)),
    }
    let mut link_field = link.as_bytes().to_vec();
    if !link.is_empty() {
        match m.link_in {
            LinkIn::Field => {}
            LinkIn::GnuLong | LinkIn::GnuLongAndPax => {
                let mut d = link.as_bytes().to_vec();
                d.push(0);
                extension(out, b'K', &d, m.magic);
                if matches!(m.link_in, LinkIn::GnuLongAndPax) {
                    pax.extend(pax_record("linkpath", b"elsewhere"));
                }
            }
            LinkIn::PaxLinkpath => {
                pax.extend(pax_record("linkpath", link.as_bytes()));
                link_field.clear();
            }
        }
    }
    match m.size_in {
        SizeIn::PaxAgreeing => pax.extend(pax_record("size", size.to_string().as_bytes())),
        SizeIn::PaxDisagreeing => {
            pax.extend(pax_record("size", (size + 1).to_string().as_bytes()));
        }
        _ => {}
    }
    match m.odd {
        Odd::PaxJunkKeys => {
            pax.extend(pax_record("atime", b"1700000000.5"));
            pax.extend(pax_record("SCHILY.xattr.user.x", b"v"));
            pax.extend(pax_record("uname", b"someone"));
        }
        Odd::PaxDuplicateKey => {
            pax.extend(pax_record("mtime", b"1"));
            pax.extend(pax_record("mtime", b"2"));
        }
        Odd::LoneZeroBefore => out.extend_from_slice(&[0u8; 512]),
        _ => {}
    }
    if !pax.is_empty() {
        extension(out, b'x', &pax, m.magic);
    }
    let mut h = header_block(&name_field, flag, size, m.magic);
    if !prefix_field.is_empty() {
        let n = prefix_field.len().min(155);
        h[345..345 + n].copy_from_slice(&prefix_field[..n]);
    }
    let n = link_field.len().min(100);
    h[157..157 + n].copy_from_slice(&link_field[..n]);
    octal_field(&mut h[100..108], u64::from(m.mode));
    octal_field(&mut h[108..116], m.uid);
    octal_field(&mut h[136..148], m.mtime);
    if matches!(m.size_in, SizeIn::Base256) {
        h[124..136].fill(0);
        h[124] = 0x80;
        h[128..136].copy_from_slice(&size.to_be_bytes());
    }
    seal(&mut h);
    if m.odd == Odd::SignedChecksum {
        // The checksum as the signed sum (what some old tars wrote): only GNU tar accepts it.
        h[0] = 0xff;
        h[148..156].copy_from_slice(b"        ");
        let sum: i64 = h.iter().map(|b| i64::from(*b as i8)).sum();
        h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    }
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    pad(out);
}

fn encode(members: &[GenMember], ending: Ending) -> Vec<u8> {
    let mut out = Vec::new();
    for m in members {
        encode_member(&mut out, m);
    }
    match ending {
        Ending::TwoZeroBlocks => out.extend_from_slice(&[0u8; 1024]),
        Ending::OneZeroBlock => out.extend_from_slice(&[0u8; 512]),
        Ending::Nothing => {}
        Ending::TrailingGarbage => {
            out.extend_from_slice(&[0u8; 1024]);
            out.extend_from_slice(b"garbage after the end");
        }
    }
    out
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(96)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        .. ProptestConfig::default()
    })]

    /// Every accepted archive extracts, with busybox and with GNU tar, to exactly what was
    /// listed; every other one is refused with a reason.
    #[test]
    fn extractors_create_exactly_what_the_canonicaliser_listed((members, ending) in archive()) {
        let bytes = encode(&members, ending);
        if let Err(e) = check_archive(&bytes) {
            return Err(TestCaseError::fail(e));
        }
    }
}

/// A mostly benign generated workload is accepted often enough for the property above to
/// test extraction, not only refusals (a generator that only made refused archives would
/// check nothing).
#[test]
fn the_generator_makes_accepted_archives_too() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = archive();
    let mut accepted = 0;
    let mut reasons = std::collections::BTreeSet::new();
    for _ in 0..400 {
        let (members, ending) = strategy.new_tree(&mut runner).expect("tree").current();
        match canon(&encode(&members, ending)) {
            Ok(_) => accepted += 1,
            Err(r) => {
                reasons.insert(r.reason());
            }
        }
    }
    assert!(accepted >= 100, "only {accepted} of 400 accepted");
    for r in [
        "AmbiguousHeader",
        "Duplicate",
        "ParentComponent",
        "SymlinkEscapes",
    ] {
        assert!(reasons.contains(r), "{r} never came up: {reasons:?}");
    }
}

/// The regression corpus: each archive in `tests/tar-corpus/` with the reason it must be
/// refused for (or `ok`: then it must pass the whole differential check), and whether busybox
/// and GNU tar disagree about the raw archive (the evidence for the table in [`super`]).
#[test]
fn the_regression_corpus_gives_its_recorded_answers() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tar-corpus");
    let index =
        std::fs::read_to_string(dir.join("expect.txt")).expect("tests/tar-corpus/expect.txt");
    let mut checked = 0;
    for line in index
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let mut words = line.split_whitespace();
        let (Some(file), Some(want), Some(raw)) = (words.next(), words.next(), words.next()) else {
            panic!("bad line in expect.txt: {line}");
        };
        let bytes = std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let got = check_archive(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(got.unwrap_or("ok"), want, "{file}");
        let [busybox, gnu] = EXTRACTORS.map(|argv| {
            let x = run_extractor(argv, &bytes);
            (x.ok, x.found)
        });
        let seen = if busybox == gnu { "same" } else { "differs" };
        assert_eq!(seen, raw, "{file}: busybox {busybox:?}, GNU tar {gnu:?}");
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} corpus archives");
}

/// What the sandbox's own `tar -c` prints — busybox, GNU in its default, POSIX (pax) and
/// ustar formats — is accepted and listed exactly as the tree it came from, long names,
/// links, modes and all.
#[test]
fn real_tar_c_output_is_accepted_and_listed_as_the_tree() {
    use std::os::unix::fs::symlink;
    let scratch = Scratch::new("tarc");
    let src = scratch.0.join("root");
    let deep = src.join("d/".repeat(30)).join("L".repeat(120));
    std::fs::create_dir_all(&deep).expect("mkdir");
    std::fs::write(deep.join("x".repeat(200)), b"deep").expect("write");
    std::fs::write(src.join("plain.txt"), b"hello").expect("write");
    std::fs::write(src.join("sp ace ü"), b"").expect("write");
    std::fs::create_dir(src.join("empty")).expect("mkdir");
    symlink("plain.txt", src.join("link")).expect("symlink");
    symlink(format!("d/{}", "T".repeat(150)), src.join("long-link")).expect("symlink");
    std::fs::set_permissions(
        src.join("plain.txt"),
        std::fs::Permissions::from_mode(0o750),
    )
    .expect("chmod");
    let mut want = BTreeMap::new();
    walk(&src, &src, &mut want);
    for argv in [
        &["busybox", "tar", "-c", "-f", "-"][..],
        &["tar", "-c", "-f", "-"],
        &["tar", "--format=posix", "-c", "-f", "-"],
        &["tar", "--format=gnu", "-c", "-f", "-"],
    ] {
        let names: Vec<String> = std::fs::read_dir(&src)
            .expect("read")
            .map(|e| format!("./{}", e.expect("entry").file_name().to_string_lossy()))
            .collect();
        let out = Command::new(argv[0])
            .args(&argv[1..])
            .args(&names)
            .current_dir(&src)
            .output()
            .expect("tar -c");
        assert!(
            out.status.success(),
            "{argv:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Err(e) = check_archive(&out.stdout) {
            panic!("{argv:?}: {e}");
        }
        let (_, listing, canonical) =
            canon(&out.stdout).unwrap_or_else(|r| panic!("{argv:?}: {r}"));
        let mut got = expected(&listing, &modes(&canonical));
        // The walk saw the implied directories' modes too.
        for (p, f) in got.iter_mut() {
            if f.mode.is_none() && f.kind == "dir" {
                f.mode = want.get(p).and_then(|w| w.mode);
            }
        }
        assert_eq!(got, want, "{argv:?}");
    }
}
