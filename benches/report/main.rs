//! The report of `hack/bench`: after a run, reads the JSON lines the benches appended to
//! `$BENCH_RESULTS`, adds the run's facts (`$BENCH_COMMAND`, `$BENCH_RUN`, `$BENCH_WALL_SECS`,
//! the commit, the machine, the versions), prints the table and, with `$BENCH_REPORT` set,
//! writes them to `benches/report/last-run.jsonl` and the document to `$BENCH_REPORT`
//! (docs/benchmarks.md) with the notes of `benches/report/notes.md` (render.rs). With
//! `$BENCH_REPORT` and no `$BENCH_RESULTS` it writes the document again from
//! `last-run.jsonl` (after a note changed) without running anything. With `$BENCH_PARTIAL`
//! set (`hack/bench` with `BENCH_ONLY`) the run's figures replace only the same figures of
//! `last-run.jsonl` (render.rs, `merge`). Does nothing without
//! either, so a plain `cargo bench` passes over it.

use std::process::Command;

#[path = "../common/mod.rs"]
mod common;
mod render;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The first line a command prints, or "unknown".
fn first_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into())
}

fn json_of(cmd: &str, args: &[&str]) -> serde_json::Value {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        .unwrap_or_default()
}

/// The Machine and Versions lines of this machine and checkout, and the commit.
fn machine_and_versions() -> (Vec<String>, Vec<String>, String) {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or("unknown".into(), |kib| {
            format!("{:.1} GiB", kib / 1024.0 / 1024.0)
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or("unknown".into(), |s| s.trim().to_string());
    let os = std::fs::read_to_string("/etc/os-release")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map_or("unknown".into(), |v| v.trim_matches('"').to_string());

    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let v = json_of(&kubectl, &["version", "-o", "json"]);
    let s = |p: &str| {
        v.pointer(p)
            .and_then(|x| x.as_str())
            .unwrap_or("unknown")
            .to_string()
    };
    let (server, client) = (
        s("/serverVersion/gitVersion"),
        s("/clientVersion/gitVersion"),
    );
    let nodes = json_of(&kubectl, &["get", "nodes", "-o", "json"]);
    let info = |k: &str| {
        nodes
            .pointer(&format!("/items/0/status/nodeInfo/{k}"))
            .and_then(|x| x.as_str())
            .unwrap_or("unknown")
            .to_string()
    };
    // etcd answers no version through the API server: ask the binary hack/cluster runs.
    let state = std::env::var("AGENTBOX_CLUSTER_DIR")
        .unwrap_or_else(|_| "/var/lib/agentbox-cluster".into());
    let etcd = std::fs::read_to_string(format!("{state}/run/etcd.pid"))
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).map(str::to_string))
        .map_or("unknown (not started by hack/cluster)".into(), |exe| {
            first_line(&exe, &["--version"])
        });
    let python = std::env::var("PYTHON").map_or("not measured".into(), |py| {
        first_line(
            &py,
            &[
                "-c",
                "import sys, importlib.metadata as m\ndef v(p):\n    try:\n        return m.version(p)\n    except m.PackageNotFoundError:\n        return 'not installed'\nprint(v('kubernetes') + '; agentbox SDK ' + v('agentbox') + ' on kubernetes_asyncio ' + v('kubernetes_asyncio') + ', aiohttp ' + v('aiohttp') + '; Python ' + sys.version.split()[0])",
            ],
        )
    });
    let root = common::repo_root();
    let root = root.to_string_lossy();
    let commit = first_line("git", &["-C", &root, "rev-parse", "--short=12", "HEAD"]);
    let dirty = Command::new("git")
        .args(["-C", &root, "status", "--porcelain", "--untracked-files=no"])
        .output()
        .is_ok_and(|o| !o.stdout.is_empty());
    let commit = if dirty {
        format!("{commit} (with uncommitted changes)")
    } else {
        commit
    };

    let machine = vec![
        format!("CPU: {cpu}, {cores} cores"),
        format!("RAM: {mem}"),
        format!("kernel {kernel}, {os}"),
    ];
    let versions = vec![
        format!(
            "Kubernetes: API server {server}, kubelet {}, kubectl {client}",
            info("kubeletVersion")
        ),
        format!("etcd: {etcd}"),
        format!("container runtime: {}", info("containerRuntimeVersion")),
        format!("rustc: {}", first_line("rustc", &["-V"])),
        format!("agentbox: commit {commit}"),
        format!("Python: `kubernetes` client {python}"),
        format!("load when the report was written: {}", load_average()),
    ];
    (machine, versions, commit)
}

/// `/proc/loadavg`'s 1-, 5- and 15-minute load averages (the machine may be shared).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn main() -> Res<()> {
    let root = common::repo_root();
    let report = std::env::var("BENCH_REPORT").ok();
    let data = match std::env::var("BENCH_RESULTS") {
        Ok(results) => {
            // A run: its figures and facts become the last run's.
            let figures = std::fs::read_to_string(&results)?;
            let (machine, versions, commit) = machine_and_versions();
            let meta = render::Meta {
                command: std::env::var("BENCH_COMMAND").unwrap_or_else(|_| "hack/bench".into()),
                run: std::env::var("BENCH_RUN").unwrap_or_else(|_| "?".into()),
                commit,
                date: first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
                wall_secs: std::env::var("BENCH_WALL_SECS")
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or_default(),
                machine,
                versions,
            };
            let text = if std::env::var_os("BENCH_PARTIAL").is_some() {
                // Some benches alone: their figures replace the same figures of the last
                // run, whose facts stay, with this run's beside them.
                let last = std::fs::read_to_string(root.join(render::LAST_RUN))?;
                render::merge(&last, &figures, meta)?
            } else {
                let meta = serde_json::json!({ "meta": meta });
                format!("{}\n{meta}\n", figures.trim_end())
            };
            if report.is_some() {
                std::fs::write(root.join(render::LAST_RUN), &text)?;
            }
            text
        }
        Err(_) if report.is_some() => std::fs::read_to_string(root.join(render::LAST_RUN))?,
        Err(_) => return Ok(()), // run by hack/bench only
    };
    let data = render::parse(&data)?;
    println!("\n{}", render::table(&render::rows(&data.figures)));
    let Some(path) = report else {
        return Ok(());
    };
    let notes = std::fs::read_to_string(root.join(render::NOTES))?;
    let doc = render::document(&data, &notes)?;
    if let Some(dir) = std::path::Path::new(&path).parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&path, doc)?;
    eprintln!("wrote {path}");
    Ok(())
}
