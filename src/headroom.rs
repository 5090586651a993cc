//! The operator's memory against its limit: the resident set (`VmRSS` of `/proc/self/status`)
//! and the memory limit of the cgroup it runs in (v2 `memory.max`, v1
//! `memory.limit_in_bytes`), sampled every few seconds into two gauges, and a warning in the
//! log when the resident set nears the limit, before the kernel's OOM killer ends the process
//! (which says nothing but `OOMKilled`). docs/operations.md, "Memory", gives the limit as a
//! formula of the number of Sandboxes.
//!
//! The reading and the decision are pure functions of the files' text; [`run`] is the loop
//! that reads them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use crate::metrics::Metrics;

/// How often the resident set is sampled.
pub const INTERVAL: Duration = Duration::from_secs(5);

/// The share of the limit at which the operator warns (percent).
pub const WARN_PERCENT: u64 = 80;

/// The share below which a warning is over (percent): a process hovering at the threshold
/// warns once, not at every sample.
pub const CLEAR_PERCENT: u64 = 70;

/// A limit at or above this many bytes is no limit: cgroup v1 writes "unlimited" as the
/// largest multiple of the page size below 2^63.
const UNLIMITED: u64 = 1 << 60;

/// Where the cgroup file systems are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The resident set in bytes from the text of `/proc/<pid>/status` (its `VmRSS:` line, in kB).
pub fn rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The files that may hold this process's memory limit, most specific first, from the text
/// of `/proc/self/cgroup`: the cgroup's own directory under the mount (a process on a host,
/// or in a container that sees the host's hierarchy), then the mount's root (a container
/// whose cgroup is mounted there, as containerd and Docker do, with or without a cgroup
/// namespace). v2 (`0::/path`) and v1 (`N:...memory...:/path`) alike.
pub fn limit_files(proc_cgroup: &str, root: &Path) -> Vec<PathBuf> {
    // A v1 memory controller, when there is one, is the one that limits: its files first.
    let (mut v1, mut v2) = (Vec::new(), Vec::new());
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let rel = path.trim_start_matches('/');
        if id == "0" && controllers.is_empty() {
            v2.push(root.join(rel).join("memory.max"));
            v2.push(root.join("memory.max"));
        } else if controllers.split(',').any(|c| c == "memory") {
            let mount = root.join("memory");
            v1.push(mount.join(rel).join("memory.limit_in_bytes"));
            v1.push(mount.join("memory.limit_in_bytes"));
        }
    }
    v1.append(&mut v2);
    v1.dedup();
    v1
}

/// A limit from the text of a `memory.max` or `memory.limit_in_bytes` file: `None` for
/// none (`max`, or v1's "unlimited" value).
pub fn parse_limit(text: &str) -> Option<u64> {
    let n: u64 = text.trim().parse().ok()?;
    (n < UNLIMITED).then_some(n)
}

/// The first limit found in `files` (read with `read`), as [`limit_files`] orders them.
pub fn limit(files: &[PathBuf], read: impl Fn(&Path) -> Option<String>) -> Option<u64> {
    files
        .iter()
        .find_map(|f| read(f))
        .as_deref()
        .and_then(parse_limit)
}

/// Where the resident set stands against the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Below [`WARN_PERCENT`] of the limit, or no limit.
    Fine,
    /// At or above it (until it falls below [`CLEAR_PERCENT`]).
    Near,
}

/// The level after a sample of `rss` against `limit`, coming from `before` (pure).
pub fn level(rss: u64, limit: Option<u64>, before: Level) -> Level {
    let Some(limit) = limit.filter(|l| *l > 0) else {
        return Level::Fine;
    };
    let pct = u128::from(rss) * 100 / u128::from(limit);
    match before {
        Level::Fine if pct >= u128::from(WARN_PERCENT) => Level::Near,
        Level::Near if pct < u128::from(CLEAR_PERCENT) => Level::Fine,
        l => l,
    }
}

fn mib(b: u64) -> u64 {
    b / (1024 * 1024)
}

/// Samples the resident set and the limit every [`INTERVAL`] into `metrics`, and logs a
/// warning when the resident set reaches [`WARN_PERCENT`] of the limit (and a line when it is
/// back under [`CLEAR_PERCENT`]). Runs until the process ends; does nothing on a system
/// without `/proc`.
pub async fn run(metrics: Arc<Metrics>) {
    let files = std::fs::read_to_string("/proc/self/cgroup")
        .map(|t| limit_files(&t, Path::new(CGROUP_ROOT)))
        .unwrap_or_default();
    let mut state = Level::Fine;
    let mut ticks = tokio::time::interval(INTERVAL);
    loop {
        ticks.tick().await;
        let Some(rss) = std::fs::read_to_string("/proc/self/status")
            .ok()
            .as_deref()
            .and_then(rss_bytes)
        else {
            return;
        };
        // Read again each time: a limit can be changed in place (cgroup v2, in-place pod
        // resizing).
        let lim = limit(&files, |p| std::fs::read_to_string(p).ok());
        metrics.memory(rss, lim);
        let next = level(rss, lim, state);
        match (state, next, lim) {
            (Level::Fine, Level::Near, Some(l)) => warn!(
                rss_mib = mib(rss),
                limit_mib = mib(l),
                "the operator's memory is at {}% of its limit ({} of {} MiB): raise the memory limit before the kernel ends the process (docs/operations.md, \"Memory\": at least 64 MiB and 40 KiB per Sandbox)",
                u128::from(rss) * 100 / u128::from(l.max(1)),
                mib(rss),
                mib(l)
            ),
            (Level::Near, Level::Fine, _) => info!(
                rss_mib = mib(rss),
                "the operator's memory is back under {CLEAR_PERCENT}% of its limit"
            ),
            _ => {}
        }
        state = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_resident_set_is_read_in_bytes() {
        let status = "Name:\tagentbox\nVmHWM:\t  90000 kB\nVmRSS:\t   51200 kB\nThreads:\t4\n";
        assert_eq!(rss_bytes(status), Some(50 * 1024 * 1024));
        assert_eq!(rss_bytes("Name:\tx\n"), None);
    }

    #[test]
    fn limit_files_cover_v2_v1_on_a_host_and_in_a_container() {
        let root = Path::new("/sys/fs/cgroup");
        assert_eq!(
            limit_files("0::/kubepods/pod1/c1\n", root),
            vec![
                PathBuf::from("/sys/fs/cgroup/kubepods/pod1/c1/memory.max"),
                PathBuf::from("/sys/fs/cgroup/memory.max"),
            ]
        );
        // cgroup v1: the memory controller's line, not the others'.
        let v1 = "12:pids:/x\n4:memory:/kubepods/burstable/pod1/c1\n1:name=systemd:/x\n";
        assert_eq!(
            limit_files(v1, root),
            vec![
                PathBuf::from(
                    "/sys/fs/cgroup/memory/kubepods/burstable/pod1/c1/memory.limit_in_bytes"
                ),
                PathBuf::from("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
            ]
        );
        // A cgroup namespace: the path is "/", both candidates are the mount's root.
        assert_eq!(
            limit_files("0::/\n", root),
            vec![PathBuf::from("/sys/fs/cgroup/memory.max")]
        );
        assert!(limit_files("", root).is_empty());
        // A hybrid host: the v1 memory controller limits, its files come first.
        let hybrid = limit_files("0::/user.slice\n4:memory:/bench\n", root);
        assert_eq!(
            hybrid.first(),
            Some(&PathBuf::from(
                "/sys/fs/cgroup/memory/bench/memory.limit_in_bytes"
            ))
        );
        assert_eq!(hybrid.len(), 4);
    }

    #[test]
    fn the_most_specific_file_there_is_gives_the_limit() {
        let files = limit_files("4:memory:/bench\n", Path::new("/cg"));
        let read = |p: &Path| match p.to_str() {
            Some("/cg/memory/bench/memory.limit_in_bytes") => Some("268435456\n".to_string()),
            Some("/cg/memory/memory.limit_in_bytes") => Some("9223372036854771712\n".into()),
            _ => None,
        };
        assert_eq!(limit(&files, read), Some(256 << 20));
        // The process's own directory is not there (a container): the mount's root.
        let root_only = |p: &Path| {
            (p == Path::new("/cg/memory/memory.limit_in_bytes")).then(|| "1073741824".to_string())
        };
        assert_eq!(limit(&files, root_only), Some(1 << 30));
        assert_eq!(limit(&files, |_| None), None);
    }

    #[test]
    fn no_limit_reads_as_none() {
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712"), None, "v1 unlimited");
        assert_eq!(parse_limit("268435456\n"), Some(268_435_456));
        assert_eq!(parse_limit("garbage"), None);
    }

    #[test]
    fn the_warning_starts_at_80_percent_and_ends_under_70() {
        let lim = Some(1000);
        assert_eq!(level(799, lim, Level::Fine), Level::Fine);
        assert_eq!(level(800, lim, Level::Fine), Level::Near);
        assert_eq!(level(750, lim, Level::Near), Level::Near, "no flapping");
        assert_eq!(level(699, lim, Level::Near), Level::Fine);
        assert_eq!(level(u64::MAX, None, Level::Fine), Level::Fine, "no limit");
        assert_eq!(level(5, Some(0), Level::Near), Level::Fine, "a zero limit");
    }
}
