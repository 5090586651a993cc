//! The canonicaliser alone, in this process (no cluster): `cargo bench --bench archive`.
//!
//! - many small files (`BENCH_FILES`, default 20,000 files of a few bytes, as `tar -c` of a
//!   virtualenv or `node_modules` looks): microseconds per member, taking a snapshot (output
//!   hashed) and restoring one (input hashed);
//! - one large file (`BENCH_ARCHIVE_MIB`, default 512): MiB/s, the same two ways.
//!
//! Made for profiling too: `valgrind --tool=callgrind target/release/deps/archive-*` counts
//! instructions whatever else the machine runs. With `BENCH_RESULTS` set, each figure is also
//! appended to that file as a JSON line.

use std::time::Instant;

use agentbox_operator::snapshot::archive::{Canonicalizer, Limits};
use bytes::BytesMut;

mod common;

use common::{emit, env_num};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// `n` files of a few bytes under `./many/`, with GNU headers as `tar -c` writes them.
fn small_files(n: u64) -> Res<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    let mut d = tar::Header::new_gnu();
    d.set_entry_type(tar::EntryType::Directory);
    d.set_mode(0o755);
    d.set_size(0);
    d.set_mtime(1_700_000_000);
    b.append_data(&mut d, "./many/", std::io::empty())?;
    for i in 0..n {
        let data = format!("file {i}\n");
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        b.append_data(&mut h, format!("./many/f{i}"), data.as_bytes())?;
    }
    Ok(b.into_inner()?)
}

/// Canonicalises `archive` fed in 64 KiB chunks (as a download or an exec stream arrives);
/// returns the seconds taken and the members.
fn run(archive: &[u8], restore: bool) -> Res<(f64, u64)> {
    let limits = Limits {
        max_members: 0,
        max_input_bytes: 0,
        max_extracted_bytes: 0,
        ..Limits::default()
    };
    let t = Instant::now();
    let mut c = if restore {
        Canonicalizer::restore(limits, archive.len() as u64)
    } else {
        Canonicalizer::snapshot(limits)
    };
    let mut out = BytesMut::with_capacity(1 << 20);
    for chunk in archive.chunks(64 << 10) {
        c.feed(chunk, &mut out)?;
        out.clear();
    }
    let members = c.finish(&mut out)?.members;
    Ok((t.elapsed().as_secs_f64(), members))
}

/// The best of three runs (the least disturbed by the rest of the machine).
fn best(archive: &[u8], restore: bool) -> Res<(f64, u64)> {
    let mut best = (f64::MAX, 0);
    for _ in 0..3 {
        let r = run(archive, restore)?;
        if r.0 < best.0 {
            best = r;
        }
    }
    Ok(best)
}

fn main() -> Res<()> {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return Ok(()); // `cargo test --benches` / `--list`: nothing to list.
    }
    let n = env_num("BENCH_FILES", 20_000);
    let small = small_files(n)?;
    for (restore, label) in [(false, "snapshot"), (true, "restore")] {
        let (secs, members) = best(&small, restore)?;
        let us = secs * 1e6 / members.max(1) as f64;
        println!(
            "{label}: {n} small files ({:.1} MiB): {us:.2} us/member",
            small.len() as f64 / (1 << 20) as f64
        );
        emit("archive", &format!("{label}_us_per_member"), us, "us", n);
    }

    let mib = env_num("BENCH_ARCHIVE_MIB", 512);
    let mut b = tar::Builder::new(Vec::with_capacity(((mib + 1) << 20) as usize));
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_size(mib << 20);
    b.append_data(
        &mut h,
        "./big.bin",
        std::io::Read::take(std::io::repeat(0x5a), mib << 20),
    )?;
    let big = b.into_inner()?;
    for (restore, label) in [(false, "snapshot"), (true, "restore")] {
        let (secs, _) = best(&big, restore)?;
        let rate = big.len() as f64 / (1 << 20) as f64 / secs;
        println!("{label}: one {mib} MiB file: {rate:.0} MiB/s");
        emit("archive", &format!("{label}_mib_s"), rate, "MiB/s", mib);
    }
    Ok(())
}
