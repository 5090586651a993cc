//! Validation memory is bounded whatever the archive: a test that canonicalises adversarial
//! archives (very many members, very long paths, very deep paths, all at the default limits)
//! in a child process and reads its peak RSS (`VmHWM`). Memory, not time, so it can assert.

use std::process::Command;

use bytes::BytesMut;

use super::tests::raw_header;
use super::{Canonicalizer, Limits, MAX_NAME_BYTES};

/// Set in the child: which workload to run.
const CHILD: &str = "AGENTBOX_ARCHIVE_RSS_WORKLOAD";
/// The bound the operator promises: peak growth while validating any archive.
const MAX_GROWTH_KIB: u64 = 64 << 10;

fn proc_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a /proc/self/status field")
}

/// One member with a GNU long name (any length), as a sandbox could print it.
fn long_member(out: &mut Vec<u8>, path: &str) {
    let name = format!("{path}\0");
    out.extend_from_slice(&raw_header("././@LongLink", b'L', name.len() as u64, ""));
    out.extend_from_slice(name.as_bytes());
    out.resize(out.len().div_ceil(512) * 512, 0);
    out.extend_from_slice(&raw_header("x", b'0', 0, ""));
}

/// The `i`th member's path in a workload.
fn path(workload: &str, i: u64) -> String {
    let name = |i: u64, len: usize| {
        let tag = format!("{i:x}-");
        format!("{tag}{}", "n".repeat(len - tag.len()))
    };
    match workload {
        // Every member a new top-level name of the longest length: the most name bytes the
        // tree can be made to hold.
        "many" => name(i, MAX_NAME_BYTES),
        // Paths near the length limit, each under a new top-level directory: 16 new
        // components of up to 255 bytes per member.
        "long" => (0..16)
            .map(|c| name(i * 16 + c, if c == 15 { 200 } else { MAX_NAME_BYTES }))
            .collect::<Vec<_>>()
            .join("/"),
        // The deepest paths allowed, every component new.
        "deep" => (0..super::MAX_DEPTH as u64)
            .map(|c| format!("{:x}", i * 1000 + c))
            .collect::<Vec<_>>()
            .join("/"),
        other => panic!("unknown workload {other}"),
    }
}

/// Runs one workload until the member limit refuses it (or it ends); prints the growth.
fn child(workload: &str) {
    let limits = Limits::default();
    let before = proc_kib("VmRSS:");
    let mut c = Canonicalizer::snapshot(limits);
    let mut input = Vec::with_capacity(1 << 20);
    let mut out = BytesMut::with_capacity(1 << 20);
    let mut outcome = String::from("accepted");
    let mut i = 0u64;
    'feed: while i <= limits.max_members {
        input.clear();
        while input.len() < (1 << 20) - 8192 && i <= limits.max_members {
            long_member(&mut input, &path(workload, i));
            i += 1;
        }
        out.clear();
        if let Err(r) = c.feed(&input, &mut out) {
            outcome = r.reason().to_string();
            break 'feed;
        }
    }
    let peak = proc_kib("VmHWM:");
    println!(
        "workload={workload} members={i} outcome={outcome} rss-growth-kib={}",
        peak.saturating_sub(before)
    );
}

#[test]
fn validation_memory_stays_bounded_whatever_the_paths() {
    if let Ok(w) = std::env::var(CHILD) {
        child(&w);
        return;
    }
    let name = format!(
        "{}::validation_memory_stays_bounded_whatever_the_paths",
        module_path!().split_once("::").map_or("", |(_, rest)| rest)
    );
    for workload in ["many", "long", "deep"] {
        let out = Command::new(std::env::current_exe().expect("test binary"))
            .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, workload)
            .output()
            .expect("run the child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{workload}: {stdout}");
        let line = stdout
            .lines()
            .find_map(|l| l.find("workload=").map(|at| &l[at..]))
            .unwrap_or_else(|| panic!("{workload}: no result in {stdout}"));
        let growth: u64 = line
            .rsplit_once("rss-growth-kib=")
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        eprintln!("{line}");
        // Each workload must reach the member limit: the bound is shown at the worst case.
        assert!(line.contains("outcome=TooManyMembers"), "{line}");
        assert!(growth < MAX_GROWTH_KIB, "{line}");
    }
}
