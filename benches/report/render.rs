//! docs/benchmarks.md from data, and nothing else: the figures of the last `hack/bench` run
//! (`last-run.jsonl`: the JSON lines the benches wrote, the run's facts, and which rows came
//! from a measurement outside it) and the notes that stay from run to run (`notes.md`). Pure,
//! so that `tests/bench_report.rs` checks the committed document against the same data (and
//! that every note a code comment cites is there) without running a bench.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Where the data lives, from the repository root.
pub const LAST_RUN: &str = "benches/report/last-run.jsonl";
/// The notes, from the repository root.
pub const NOTES: &str = "benches/report/notes.md";

/// The facts of a run that are not figures: how it was run, when, on what.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Meta {
    /// The command as given, with the settings that change what it measures.
    pub command: String,
    /// The run's id (its directory under `~/.cache/agentbox/bench`).
    pub run: String,
    /// The commit it ran at.
    pub commit: String,
    /// When the report was written, UTC.
    pub date: String,
    /// Seconds the whole run took.
    pub wall_secs: u64,
    /// Lines of the Machine section.
    pub machine: Vec<String>,
    /// Lines of the Versions section.
    pub versions: Vec<String>,
}

/// A later run of some benches alone (`BENCH_ONLY=... hack/bench`): its facts and the benches
/// (as the figures name them) it measured. Its figures replace the same figures of
/// `last-run.jsonl`; the others stay the full run's, and the document names both runs.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Partial {
    /// The run's facts.
    pub meta: Meta,
    /// The benches its figures name (`scale_2000`, ...).
    pub benches: Vec<String>,
}

/// `last-run.jsonl` after a partial run with facts `meta`: each figure of its `results`
/// replaces the same (bench, key) of `last`, every other line stays (an earlier partial run's
/// record too, unless this one measured all its benches again), and this run's record is
/// added. Fails on a line that is not JSON, or on results without a figure.
pub fn merge(last: &str, results: &str, meta: Meta) -> Result<String, String> {
    let mut new = std::collections::BTreeSet::new();
    let mut benches = std::collections::BTreeSet::new();
    for (i, line) in results
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("results line {}: {e}", i + 1))?;
        let (Some(b), Some(k)) = (v["bench"].as_str(), v["key"].as_str()) else {
            return Err(format!("results line {}: not a figure", i + 1));
        };
        new.insert((b.to_string(), k.to_string()));
        benches.insert(b.to_string());
    }
    if new.is_empty() {
        return Err("the partial run measured nothing".into());
    }
    let mut out = String::new();
    for (i, line) in last
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("{LAST_RUN} line {}: {e}", i + 1))?;
        let replaced = match (v["bench"].as_str(), v["key"].as_str()) {
            (Some(b), Some(k)) => new.contains(&(b.to_string(), k.to_string())),
            _ => v["partial"]["benches"].as_array().is_some_and(|bs| {
                bs.iter()
                    .all(|b| b.as_str().is_some_and(|b| benches.contains(b)))
            }),
        };
        if !replaced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str(results.trim_end());
    out.push('\n');
    let partial = Partial {
        meta,
        benches: benches.into_iter().collect(),
    };
    out.push_str(&serde_json::json!({ "partial": partial }).to_string());
    out.push('\n');
    Ok(out)
}

/// The contents of `last-run.jsonl`.
pub struct Data {
    /// The figures.
    pub figures: Figures,
    /// The run's facts.
    pub meta: Meta,
    /// (note marker, figure prefixes): rows whose figure text starts with a prefix came from
    /// the measurement the note records, not from the run.
    pub provenance: Vec<(String, Vec<String>)>,
    /// Later runs of some benches alone, whose figures replaced the full run's.
    pub partials: Vec<Partial>,
}

/// Reads `last-run.jsonl` (or the results a run just wrote): figure lines
/// `{"bench", "key", "value", "n"}`, one `{"meta": {...}}` and any `{"note", "rows"}`.
pub fn parse(jsonl: &str) -> Result<Data, String> {
    let mut figures = BTreeMap::new();
    let mut meta = None;
    let mut provenance = Vec::new();
    let mut partials = Vec::new();
    for (i, line) in jsonl
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("line {}: {e}", i + 1))?;
        if let Some(m) = v.get("meta") {
            meta = Some(
                serde_json::from_value(m.clone()).map_err(|e| format!("line {}: {e}", i + 1))?,
            );
        } else if let Some(p) = v.get("partial") {
            partials.push(
                serde_json::from_value(p.clone()).map_err(|e| format!("line {}: {e}", i + 1))?,
            );
        } else if let Some(note) = v["note"].as_str() {
            let rows = v["rows"]
                .as_array()
                .map(|r| {
                    r.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            provenance.push((note.to_string(), rows));
        } else {
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            figures.insert(
                (s("bench"), s("key")),
                (
                    v["value"].as_f64().unwrap_or(f64::NAN),
                    v["n"].as_u64().unwrap_or(0),
                ),
            );
        }
    }
    Ok(Data {
        figures: Figures(figures),
        meta: meta.unwrap_or_default(),
        provenance,
        partials,
    })
}

/// One note of `notes.md`: a footnote (its heading is its marker, `¹`) or a section.
pub struct Note {
    /// The heading: a marker, or a section's title.
    pub heading: String,
    /// The text under it.
    pub body: String,
}

impl Note {
    /// A footnote's heading is its marker alone: superscript digits.
    pub fn is_footnote(&self) -> bool {
        !self.heading.is_empty() && self.heading.chars().all(|c| SUPERSCRIPTS.contains(c))
    }
}

/// The digits a footnote marker is made of.
pub const SUPERSCRIPTS: &str = "⁰¹²³⁴⁵⁶⁷⁸⁹";

/// The notes of `notes.md`: each `## ` heading starts one; what comes before the first is
/// the file's own comment.
pub fn notes(text: &str) -> Vec<Note> {
    let mut out: Vec<Note> = Vec::new();
    for line in text.lines() {
        if let Some(h) = line.strip_prefix("## ") {
            out.push(Note {
                heading: h.trim().to_string(),
                body: String::new(),
            });
        } else if let Some(n) = out.last_mut() {
            n.body.push_str(line);
            n.body.push('\n');
        }
    }
    for n in &mut out {
        n.body = n.body.trim().to_string();
    }
    out
}

/// The whole document: the run's facts, the table, the notes, the machine and versions, and
/// what each figure is. Fails on a provenance that names a note or a row that is not there.
pub fn document(data: &Data, notes_md: &str) -> Result<String, String> {
    let notes = notes(notes_md);
    let mut rows = rows(&data.figures);
    for (note, prefixes) in &data.provenance {
        if !notes.iter().any(|n| n.is_footnote() && &n.heading == note) {
            return Err(format!("{LAST_RUN}: note {note} is not in {NOTES}"));
        }
        for prefix in prefixes {
            let mut found = false;
            for r in rows
                .iter_mut()
                .filter(|r| r.figure.starts_with(prefix.as_str()))
            {
                r.notes.push(note.clone());
                found = true;
            }
            if !found {
                return Err(format!("{LAST_RUN}: note {note} names no row \"{prefix}\""));
            }
        }
    }
    let m = &data.meta;
    let mut doc = String::from("# Benchmarks\n\n");
    let _ = writeln!(
        doc,
        "Written whole by `hack/bench`: each run replaces the table, its command, the machine \
         and the versions with its own (and `{LAST_RUN}`, the figures they are made of). The \
         notes below the table stay from run to run (`{NOTES}`): each records a measurement made \
         outside a full run, and a row whose figures come from one is marked with it. Targets \
         are issue 7's, issue 12's (small files), issue 14's (the Python SDK) and issue 16's \
         (claims, idle sandboxes).\n"
    );
    let _ = writeln!(
        doc,
        "Command: `{}` (run {} at commit {})  ",
        m.command, m.run, m.commit
    );
    let _ = writeln!(doc, "Run: {}, {} s in all.\n", m.date, m.wall_secs);
    for p in &data.partials {
        let families: Vec<String> = p.benches.iter().map(|b| format!("`{b}`")).collect();
        let _ = writeln!(
            doc,
            "The rows of the bench{} {} come from a later run of {} alone: `{}` (run {} at \
             commit {}), {}, {} s in all; {}.\n",
            if families.len() == 1 { "" } else { "es" },
            families.join(", "),
            if families.len() == 1 { "it" } else { "them" },
            p.meta.command,
            p.meta.run,
            p.meta.commit,
            p.meta.date,
            p.meta.wall_secs,
            p.meta
                .versions
                .iter()
                .filter(|v| !v.starts_with("agentbox:"))
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        );
    }
    doc.push_str(&table(&rows));
    for n in notes.iter().filter(|n| n.is_footnote()) {
        let _ = write!(doc, "\n{} {}\n", n.heading, n.body);
    }
    for n in notes.iter().filter(|n| !n.is_footnote()) {
        let _ = write!(doc, "\n### {}\n\n{}\n", n.heading, n.body);
    }
    let _ = writeln!(doc, "\n## Machine\n");
    for l in &m.machine {
        let _ = writeln!(doc, "- {l}");
    }
    let _ = writeln!(doc, "\n## Versions\n");
    for l in &m.versions {
        let _ = writeln!(doc, "- {l}");
    }
    doc.push('\n');
    doc.push_str(METHOD);
    Ok(doc)
}

/// Figures by (bench, key): value and sample count.
pub struct Figures(BTreeMap<(String, String), (f64, u64)>);

impl Figures {
    fn get(&self, bench: &str, key: &str) -> Option<f64> {
        self.0.get(&(bench.into(), key.into())).map(|v| v.0)
    }
    fn n(&self, bench: &str, key: &str) -> u64 {
        self.0.get(&(bench.into(), key.into())).map_or(0, |v| v.1)
    }
    /// The sizes the scale bench ran at (benches `scale_<n>`), smallest first.
    fn scale_sizes(&self) -> Vec<u64> {
        let mut sizes: Vec<u64> = self
            .0
            .keys()
            .filter_map(|(b, _)| b.strip_prefix("scale_")?.parse().ok())
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }
}

/// One line of the table.
pub struct Row {
    /// What is measured, with the sample count.
    pub figure: String,
    /// agentbox's figure.
    pub agentbox: String,
    /// The baseline measured in the same run, or "—".
    pub baseline: String,
    /// The target, or "—".
    pub target: &'static str,
    /// Whether the target is met; None without a target.
    pub met: Option<bool>,
    /// The markers of the notes this row's figures come from (none when the run measured
    /// them).
    pub notes: Vec<String>,
}

fn row(figure: String, agentbox: String, baseline: String) -> Row {
    Row {
        figure,
        agentbox,
        baseline,
        target: "—",
        met: None,
        notes: Vec::new(),
    }
}

/// The rows of one sandboxing runtime (`BENCH_RUNTIME_CLASS=<class>`: benches `lifecycle_<class>`
/// and `exec_<class>`) beside runc's figures of the same run: create → Ready, one-shot exec
/// and the session. Issue 31's targets: create → Ready and exec p50 within 1.5× runc's.
fn runtime_rows(f: &Figures, class: &str, name: &str) -> Vec<Row> {
    let mut out = Vec::new();
    let (life, exec) = (format!("lifecycle_{class}"), format!("exec_{class}"));
    let times = |ours: f64, runc: f64| ours / runc;
    let l = |k: &str| f.get(&life, k);
    let rl = |k: &str| f.get("lifecycle", k);
    if let (Some(s50), Some(s95), Some(r50), Some(r95)) = (
        l("sandbox_ready_p50_ms"),
        l("sandbox_ready_p95_ms"),
        rl("sandbox_ready_p50_ms"),
        rl("sandbox_ready_p95_ms"),
    ) {
        let n = f.n(&life, "sandbox_ready_p50_ms");
        let x = times(s50, r50);
        out.push(Row {
            target: "p50 ≤ 1.5× runc's",
            met: Some(x <= 1.5),
            ..row(
                format!("{name}: create → Ready, p50 / p95 (n={n}, one at a time)"),
                format!("{s50:.0} / {s95:.0} ms ({x:.2}× runc)"),
                format!("runc {r50:.0} / {r95:.0} ms"),
            )
        });
    }
    if let (Some(b50), Some(b95), Some(r50)) = (
        l("bare_ready_p50_ms"),
        l("bare_ready_p95_ms"),
        rl("bare_ready_p50_ms"),
    ) {
        let n = f.n(&life, "bare_ready_p50_ms");
        out.push(row(
            format!("{name}: bare pod create → Running, p50 / p95 (n={n})"),
            format!("{b50:.0} / {b95:.0} ms ({:.2}× runc)", times(b50, r50)),
            format!("runc {r50:.0} ms"),
        ));
    }
    let e = |k: &str| f.get(&exec, k);
    let re = |k: &str| f.get("exec", k);
    if let (Some(a50), Some(a95), Some(r50), Some(r95)) = (
        e("oneshot_agentbox_p50_ms"),
        e("oneshot_agentbox_p95_ms"),
        re("oneshot_agentbox_p50_ms"),
        re("oneshot_agentbox_p95_ms"),
    ) {
        let n = f.n(&exec, "oneshot_agentbox_p50_ms");
        let x = times(a50, r50);
        out.push(Row {
            target: "p50 ≤ 1.5× runc's",
            met: Some(x <= 1.5),
            ..row(
                format!("{name}: one-shot exec `true`, p50 / p95 (n={n})"),
                format!("{a50:.1} / {a95:.1} ms ({x:.2}× runc)"),
                format!("runc {r50:.1} / {r95:.1} ms"),
            )
        });
    }
    if let (Some(s50), Some(s95), Some(r50), Some(r95)) = (
        e("session_p50_ms"),
        e("session_p95_ms"),
        re("session_p50_ms"),
        re("session_p95_ms"),
    ) {
        let n = f.n(&exec, "session_p50_ms");
        out.push(row(
            format!("{name}: persistent session, per command, p50 / p95 (n={n})"),
            format!("{s50:.2} / {s95:.2} ms ({:.2}× runc)", times(s50, r50)),
            format!("runc {r50:.2} / {r95:.2} ms"),
        ));
    }
    let claim = format!("claim_{class}");
    let (c, rcl) = (|k: &str| f.get(&claim, k), |k: &str| f.get("claim", k));
    if let (Some(c50), Some(c95), Some(r50), Some(r95)) = (
        c("claim_ready_p50_ms"),
        c("claim_ready_p95_ms"),
        rcl("claim_ready_p50_ms"),
        rcl("claim_ready_p95_ms"),
    ) {
        let n = f.n(&claim, "claim_ready_p50_ms");
        out.push(row(
            format!("{name}: warm claim, create → Ready, p50 / p95 (n={n}, pool of 5)"),
            format!("{c50:.1} / {c95:.1} ms ({:.2}× runc)", times(c50, r50)),
            format!("runc {r50:.1} / {r95:.1} ms"),
        ));
    }
    // Throughput: at least half of runc's (issue 31), for 1 GiB and for many small files.
    let snap = format!("snapshot_{class}");
    let (s, rs) = (|k: &str| f.get(&snap, k), |k: &str| f.get("snapshot", k));
    for (key, what) in [
        ("file_snapshot_mib_s", "snapshot"),
        ("file_restore_mib_s", "restore"),
    ] {
        if let (Some(v), Some(r)) = (s(key), rs(key)) {
            let mib = f.n(&snap, key);
            out.push(Row {
                target: "≥ 50% of runc's throughput",
                met: Some(v >= 0.5 * r),
                ..row(
                    format!("{name}: {what} of {mib} MiB, file store"),
                    format!("{v:.1} MiB/s ({:.0}% of runc's)", 100.0 * v / r),
                    format!("runc {r:.1} MiB/s"),
                )
            });
        }
    }
    for (key, what) in [
        ("file_small_snapshot_secs", "snapshot, create → Ready"),
        ("file_small_restore_secs", "restore, pod running → Ready"),
    ] {
        if let (Some(v), Some(r)) = (s(key), rs(key)) {
            let files = f.n(&snap, key);
            out.push(Row {
                target: "≥ 50% of runc's throughput",
                met: Some(v <= 2.0 * r),
                ..row(
                    format!("{name}: {files} small files, {what}"),
                    format!("{v:.2} s ({:.0}% of runc's throughput)", 100.0 * r / v),
                    format!("runc {r:.2} s"),
                )
            });
        }
    }
    out
}

/// The table's rows, in order, for the figures there are (a bench that did not run leaves
/// its rows out).
pub fn rows(f: &Figures) -> Vec<Row> {
    let mut out = Vec::new();
    let l = |k: &str| f.get("lifecycle", k);
    if let (Some(s50), Some(b50), Some(s95), Some(b95)) = (
        l("sandbox_ready_p50_ms"),
        l("bare_ready_p50_ms"),
        l("sandbox_ready_p95_ms"),
        l("bare_ready_p95_ms"),
    ) {
        let n = f.n("lifecycle", "sandbox_ready_p50_ms");
        let over = (s50 / b50 - 1.0) * 100.0;
        out.push(Row {
            target: "overhead < 10% of the bare pod's median",
            met: Some(over < 10.0),
            ..row(
                format!("Create → Ready, p50 (n={n}, one at a time)"),
                format!("{s50:.0} ms ({over:+.0}%)"),
                format!("bare pod → Running {b50:.0} ms"),
            )
        });
        out.push(row(
            format!("Create → Ready, p95 (n={n})"),
            format!("{s95:.0} ms"),
            format!("bare pod → Running {b95:.0} ms"),
        ));
    }
    if let (Some(s50), Some(s95), Some(b50), Some(b95)) = (
        l("sandbox_delete_p50_ms"),
        l("sandbox_delete_p95_ms"),
        l("bare_delete_p50_ms"),
        l("bare_delete_p95_ms"),
    ) {
        let n = f.n("lifecycle", "sandbox_delete_p50_ms");
        out.push(Row {
            target: "p50 ≤ 1 s",
            met: Some(s50 <= 1000.0),
            ..row(
                format!("Delete → gone on a watch, p50 / p95 (n={n}, cold, one at a time)"),
                format!("{s50:.0} / {s95:.0} ms"),
                format!("bare pod {b50:.0} / {b95:.0} ms"),
            )
        });
    }
    if let (Some(d50), Some(d95)) = (l("workspace_removed_p50_ms"), l("workspace_removed_p95_ms")) {
        let n = f.n("lifecycle", "workspace_removed_p50_ms");
        // Informative: the bench fails if a directory stays (it waits for each).
        out.push(row(
            format!("Delete → workspace directory off the node, p50 / p95 (n={n}, the sweep)"),
            format!("{d50:.0} / {d95:.0} ms"),
            "—".into(),
        ));
    }
    if let (Some(p50), Some(max)) = (l("writes_to_ready_p50"), l("writes_to_ready_max")) {
        let n = f.n("lifecycle", "writes_to_ready_max");
        out.push(Row {
            target: "≤ 6",
            met: Some(max <= 6.0),
            ..row(
                format!("API writes per Sandbox, create → Ready, p50 / max (n={n}, audit log)"),
                format!("{p50:.0} / {max:.0}"),
                "—".into(),
            )
        });
    }
    let c = |k: &str| f.get("claim", k);
    if let (Some(c50), Some(c95), Some(warm)) = (
        c("claim_ready_p50_ms"),
        c("claim_ready_p95_ms"),
        c("claim_warm_starts"),
    ) {
        let n = f.n("claim", "claim_ready_p50_ms");
        out.push(Row {
            target: "p50 ≤ 20 ms, p95 ≤ 30 ms",
            met: Some(c50 <= 20.0 && c95 <= 30.0),
            ..row(
                format!(
                    "Claim: templated create → Ready on a watch, p50 / p95 (n={n}, pool of 5, one at a time; {warm:.0} warm)"
                ),
                format!("{c50:.1} / {c95:.1} ms"),
                "cold create → Ready (above)".into(),
            )
        });
    }
    out.extend(peer_rows(f));
    if let (Some(s50), Some(s95)) = (
        c("claim_status_server_p50_ms"),
        c("claim_status_server_p95_ms"),
    ) {
        let n = f.n("claim", "claim_status_server_p50_ms");
        out.push(row(
            format!(
                "Claim: create → Ready status write, server side, p50 / p95 (n={n}, audit log)"
            ),
            format!("{s50:.1} / {s95:.1} ms"),
            "—".into(),
        ));
    }
    if let (Some(w50), Some(w95), Some(c50), Some(c95)) = (
        c("claim_restore_warm_p50_ms"),
        c("claim_restore_warm_p95_ms"),
        c("claim_restore_cold_p50_ms"),
        c("claim_restore_cold_p95_ms"),
    ) {
        let n = f.n("claim", "claim_restore_warm_p50_ms");
        out.push(row(
            format!(
                "Claim with a restore: a small snapshot (3 files) restored into a warm pod, create → Ready on a watch, p50 / p95 (n={n})"
            ),
            format!("{w50:.1} / {w95:.1} ms"),
            format!("the same restore in a cold start: {c50:.1} / {c95:.1} ms"),
        ));
    }
    let fl = |k: &str| f.get("claim_floor", k);
    if let (Some(w2), Some(w2_95), Some(w1), Some(w1_95)) = (
        fl("claim_floor_2w_p50_ms"),
        fl("claim_floor_2w_p95_ms"),
        fl("claim_floor_1w_p50_ms"),
        fl("claim_floor_1w_p95_ms"),
    ) {
        let n = f.n("claim_floor", "claim_floor_2w_p50_ms");
        out.push(row(
            format!(
                "Claim floor: create → Ready on a watch with only a claim's two writes (adopting pod patch, status) by a minimal reactor, no operator, p50 / p95 (n={n})"
            ),
            format!("{w2:.1} / {w2_95:.1} ms"),
            format!("the status write alone: {w1:.1} / {w1_95:.1} ms"),
        ));
    }
    if let (Some(p50), Some(max)) = (c("claim_writes_p50"), c("claim_writes_max")) {
        let n = f.n("claim", "claim_writes_max");
        out.push(Row {
            target: "≤ 3",
            met: Some(max <= 3.0),
            ..row(
                format!("API writes per claim by the operator, p50 / max (n={n}, audit log)"),
                format!("{p50:.0} / {max:.0}"),
                "—".into(),
            )
        });
    }
    if let (Some(rate), Some(p50), Some(p95), Some(warm), Some(twice)) = (
        c("claim_burst_per_s"),
        c("claim_burst_p50_ms"),
        c("claim_burst_p95_ms"),
        c("claim_burst_warm"),
        c("claim_burst_adopted_twice"),
    ) {
        let n = f.n("claim", "claim_burst_per_s");
        out.push(row(
            format!(
                "Claim burst: {n} creates at once against a pool of {n}, claims/s and create → Ready p50 / p95 ({warm:.0} warm)"
            ),
            format!("{rate:.1}/s, {p50:.1} / {p95:.1} ms"),
            "—".into(),
        ));
        out.push(Row {
            target: "0",
            met: Some(twice == 0.0),
            ..row(
                format!("Claim burst: pods adopted twice (n={n})"),
                format!("{twice:.0}"),
                "—".into(),
            )
        });
        if let Some(refill) = c("claim_burst_refill_s") {
            out.push(row(
                format!(
                    "Claim burst: the pool back to {n} claimable warm pods, from the last Ready (the sandboxes deleted then: a node holds 110 pods)"
                ),
                format!("{refill:.1} s"),
                "—".into(),
            ));
        }
    }
    if let (Some(p50), Some(p95)) = (
        c("claim_ready_3files_p50_ms"),
        c("claim_ready_3files_p95_ms"),
    ) {
        let n = f.n("claim", "claim_ready_3files_p50_ms");
        out.push(Row {
            target: "p50 < 20 ms",
            met: Some(p50 < 20.0),
            ..row(
                format!(
                    "Claim with 3 small files, create → Ready on a watch, p50 / p95 (n={n}, pool of 5)"
                ),
                format!("{p50:.1} / {p95:.1} ms"),
                c("claim_ready_p50_ms")
                    .zip(c("claim_ready_p95_ms"))
                    .map_or("—".into(), |(a, b)| format!("no files (above): {a:.1} / {b:.1} ms")),
            )
        });
    }
    if let Some(w) = l("idle_writes_per_min") {
        let n = f.n("lifecycle", "sandbox_ready_p50_ms");
        let secs = f.n("lifecycle", "idle_writes_per_min");
        out.push(Row {
            target: "0",
            met: Some(w == 0.0),
            ..row(
                format!("API writes/min at rest, {n} Ready sandboxes ({secs} s)"),
                format!("{w:.1}"),
                "—".into(),
            )
        });
    }

    let e = |k: &str| f.get("exec", k);
    let ours = (e("oneshot_agentbox_p50_ms"), e("oneshot_agentbox_p95_ms"));
    for (name, key) in [
        ("kubectl exec", "oneshot_kubectl"),
        ("Python client", "oneshot_python"),
    ] {
        let (Some(a50), Some(a95)) = ours else { break };
        let n = f.n("exec", "oneshot_agentbox_p50_ms");
        let figure = format!("One-shot exec `true`, p50 / p95, vs {name} (n={n})");
        let agentbox = format!("{a50:.1} / {a95:.1} ms");
        let Some((b50, b95)) = e(&format!("{key}_p50_ms")).zip(e(&format!("{key}_p95_ms"))) else {
            out.push(row(figure, agentbox, "not measured (see the log)".into()));
            continue;
        };
        let bn = f.n("exec", &format!("{key}_p50_ms"));
        out.push(Row {
            target: "below the baseline",
            met: Some(a50 < b50 && a95 < b95),
            ..row(
                figure,
                agentbox,
                format!("{name} {b50:.1} / {b95:.1} ms (n={bn})"),
            )
        });
    }
    // The lossless wrapper's cost (issue 28: p50 within 10 % of plain argv in the same run).
    if let ((Some(a50), Some(a95)), Some((u50, u95))) = (
        ours,
        e("oneshot_unwrapped_p50_ms").zip(e("oneshot_unwrapped_p95_ms")),
    ) {
        let n = f.n("exec", "oneshot_unwrapped_p50_ms");
        out.push(Row {
            target: "p50 within 10 %",
            met: Some(a50 <= 1.1 * u50),
            ..row(
                format!("One-shot exec `true` under the lossless wrapper vs plain argv, p50 / p95 (n={n}, interleaved)"),
                format!(
                    "{a50:.1} / {a95:.1} ms ({:+.0} % / {:+.0} %)",
                    100.0 * (a50 / u50 - 1.0),
                    100.0 * (a95 / u95 - 1.0)
                ),
                format!("plain argv {u50:.1} / {u95:.1} ms"),
            )
        });
    }
    if let (Some(s50), Some(s95)) = (e("session_p50_ms"), e("session_p95_ms")) {
        let n = f.n("exec", "session_p50_ms");
        out.push(Row {
            target: "p50 < 5 ms",
            met: Some(s50 < 5.0),
            ..row(
                format!("Persistent session, per command, p50 / p95 (n={n})"),
                format!("{s50:.2} / {s95:.2} ms"),
                ours.0
                    .map_or("—".into(), |a| format!("one-shot exec {a:.1} ms")),
            )
        });
    }
    if let (Some(a), Some(r)) = (e("guard_acquire_p50_ms"), e("guard_release_p50_ms")) {
        let n = f.n("exec", "guard_acquire_p50_ms");
        out.push(row(
            format!("Guard acquire / release, p50, uncontended (n={n})"),
            format!("{a:.1} / {r:.1} ms"),
            "—".into(),
        ));
    }
    out.extend(python_sdk_rows(f));
    out.extend(go_sdk_rows(f));
    out.extend(java_rows(f));
    if let Some(t) = e("guard_contended_per_s") {
        let n = f.n("exec", "guard_contended_per_s");
        out.push(row(
            "Guard, 8 contending clients, acquisitions/s".into(),
            format!("{t:.1}/s ({n} in all)"),
            "—".into(),
        ));
    }

    out.extend(runtime_rows(f, "gvisor", "gVisor"));

    for (store, name) in [
        ("file", "file"),
        ("s3minio", "s3 (MinIO)"),
        ("s3", "s3 (s3s-fs)"),
        ("s3moto", "s3 (moto)"),
    ] {
        let s = |k: &str| f.get("snapshot", &format!("{store}_{k}"));
        let Some(raw) = s("raw_mib_s") else { continue };
        let mib = f.n("snapshot", &format!("{store}_raw_mib_s"));
        let baseline = format!("raw `tar -c` through exec {raw:.1} MiB/s");
        // Issue 5's targets: at least 80% of the raw stream, RSS growth under 64 MiB.
        let of_raw = |figure: String, v: f64, baseline: String| Row {
            figure,
            agentbox: format!("{v:.1} MiB/s ({:.0}% of raw)", 100.0 * v / raw),
            baseline,
            target: "≥ 80% of raw",
            met: Some(v >= 0.8 * raw),
            notes: Vec::new(),
        };
        if let Some(v) = s("snapshot_mib_s") {
            out.push(of_raw(
                format!("Snapshot of {mib} MiB, {name} store"),
                v,
                baseline.clone(),
            ));
        }
        if let Some(v) = s("restore_mib_s") {
            out.push(of_raw(
                format!(
                    "Restore of {mib} MiB (validated as it streams into staging), {name} store"
                ),
                v,
                baseline,
            ));
        }
        if let (Some(g), Some(p)) = (s("rss_growth_mib"), s("peak_rss_mib")) {
            out.push(Row {
                target: "growth < 64 MiB",
                met: Some(g < 64.0),
                ..row(
                    format!("Operator peak RSS over snapshot + restore, {name} store"),
                    format!("+{g:.1} MiB (peak {p:.1} MiB)"),
                    s("idle_rss_mib").map_or("—".into(), |i| format!("idle {i:.1} MiB")),
                )
            });
        }
    }

    // Issue 12's targets: many small files.
    let sm = |k: &str| f.get("snapshot", &format!("file_small_{k}"));
    let files = f.n("snapshot", "file_small_raw_secs");
    if let (Some(raw), Some(snap)) = (sm("raw_secs"), sm("snapshot_secs")) {
        let pct = 100.0 * raw / snap;
        out.push(Row {
            target: "≥ 50% of raw's speed",
            met: Some(pct >= 50.0),
            ..row(
                format!("Snapshot of {files} small files (file store), create → Ready"),
                format!("{snap:.2} s ({pct:.0}% of raw's speed)"),
                format!("raw `tar -c` through exec {raw:.2} s"),
            )
        });
    }
    if let (Some(x), Some(restore)) = (sm("extract_secs"), sm("restore_secs")) {
        let pct = 100.0 * x / restore;
        out.push(Row {
            target: "≥ 80% of in-pod `tar -x`'s speed",
            met: Some(pct >= 80.0),
            ..row(
                format!("Restore of {files} small files, pod running → Ready"),
                format!("{restore:.2} s ({pct:.0}% of in-pod `tar -x`'s speed)"),
                format!(
                    "in-pod `tar -x` of the archive from a file {x:.2} s (mean of before and after)"
                ),
            )
        });
    }
    // Issue 32's target: a restore of many small files at in-pod speed, as a harness sees
    // it (create → Ready), against a cold start and the in-pod `tar -x` of the same run.
    let size = sm("file_bytes").map_or(String::new(), |b| format!(" of {b:.0} B"));
    if let (Some(x), Some(cold), Some(restore)) = (
        sm("extract_secs"),
        sm("cold_secs"),
        sm("restore_create_secs"),
    ) {
        let floor = cold + x;
        out.push(Row {
            target: "≤ 1.5 × (cold start + in-pod `tar -x`)",
            met: Some(restore <= 1.5 * floor),
            ..row(
                format!("Restore of {files} files{size}, create → Ready (median)"),
                format!("{restore:.2} s ({:.2} × the floor)", restore / floor),
                format!("cold start {cold:.2} s + in-pod `tar -x` {x:.2} s = {floor:.2} s"),
            )
        });
    }
    if let (Some(tar), Some(cat), Some(spool)) = (
        sm("stream_tar_secs"),
        sm("stream_cat_secs"),
        sm("stream_spool_secs"),
    ) {
        out.push(row(
            format!(
                "The archive of {files} files into the pod over one exec: into `tar -x` / `cat > file` / `cat > file` then `tar -x -f file` (medians)"
            ),
            format!("{tar:.2} / {cat:.2} / {spool:.2} s"),
            "—".into(),
        ));
    }
    if let (Some(s), Some(r)) = (
        sm("snapshot_cpu_us_per_member"),
        sm("restore_cpu_us_per_member"),
    ) {
        out.push(Row {
            target: "≤ 10 µs per member",
            met: Some(s <= 10.0 && r <= 10.0),
            ..row(
                format!("Operator CPU per member, snapshot / restore of {files} small files"),
                format!("{s:.1} / {r:.1} µs"),
                sm("canonicalise_us_per_member")
                    .map_or("—".into(), |c| format!("canonicaliser alone {c:.1} µs")),
            )
        });
    }
    let a = |k: &str| f.get("archive", k);
    if let (Some(s), Some(r)) = (a("snapshot_us_per_member"), a("restore_us_per_member")) {
        let n = f.n("archive", "snapshot_us_per_member");
        out.push(row(
            format!("Canonicaliser in process, {n} small files, snapshot / restore"),
            format!("{s:.2} / {r:.2} µs per member"),
            "—".into(),
        ));
    }
    if let (Some(s), Some(r)) = (a("snapshot_mib_s"), a("restore_mib_s")) {
        let mib = f.n("archive", "snapshot_mib_s");
        out.push(row(
            format!("Canonicaliser in process, one {mib} MiB file, snapshot / restore"),
            format!("{s:.0} / {r:.0} MiB/s"),
            "—".into(),
        ));
    }

    let c = |k: &str| f.get("scale", k);
    let n = f.n("scale", "reconcile_all_secs");
    if let (Some(all), Some(create)) = (c("reconcile_all_secs"), c("create_secs")) {
        out.push(row(
            format!("Scale: {n} Suspended sandboxes, first create → all reconciled"),
            format!("{all:.1} s"),
            format!("the creates alone {create:.1} s (16 in flight)"),
        ));
    }
    if let (Some(p50), Some(p95)) = (c("reconcile_p50_ms"), c("reconcile_p95_ms")) {
        out.push(row(
            format!("Scale: each create → reconciled, p50 / p95 (n={n})"),
            format!("{:.1} / {:.1} s", p50 / 1e3, p95 / 1e3),
            "—".into(),
        ));
    }
    if let Some(w) = c("writes_per_sandbox") {
        out.push(row(
            "Scale: operator API writes per Suspended sandbox".into(),
            format!("{w:.2}"),
            "—".into(),
        ));
    }
    if let (Some(rss), Some(cpu)) = (c("rest_rss_mib"), c("rest_cpu_pct")) {
        let secs = f.n("scale", "rest_cpu_pct");
        out.push(row(
            format!("Scale: operator RSS / CPU at rest, {n} sandboxes ({secs} s)"),
            format!("{rss:.1} MiB / {cpu:.2}%"),
            c("rest_rss_before_mib")
                .map_or("—".into(), |b| format!("RSS with no sandbox {b:.1} MiB")),
        ));
    }
    if let Some(w) = c("rest_writes_per_min") {
        out.push(Row {
            target: "0",
            met: Some(w == 0.0),
            ..row(
                format!("Scale: API writes/min at rest, {n} sandboxes"),
                format!("{w:.1}"),
                "—".into(),
            )
        });
    }
    if let Some(d) = c("delete_all_secs") {
        out.push(row(
            format!("Scale: deletecollection of {n} → all gone"),
            format!("{d:.1} s"),
            "—".into(),
        ));
    }
    for n in f.scale_sizes() {
        out.extend(scale_rows(f, n));
    }
    out.extend(idle_rows(f));
    out
}

/// Issue 44's rows for one size (bench `scale_<n>`): Suspended sandboxes created against one
/// operator under the chart's default memory limit, at rest, after restarts and deleted;
/// memory per sandbox at rest and after a restart side by side. Targets: at most 30 KiB per
/// sandbox at rest and after a restart, a restart's peak at most 1.5× the rest figure, every
/// sandbox reconciled within 60 s of a restart, and no write to a Sandbox whose status was
/// already true.
fn scale_rows(f: &Figures, n: u64) -> Vec<Row> {
    let bench = format!("scale_{n}");
    let c = |k: &str| f.get(&bench, k);
    let mut out = Vec::new();
    if let (Some(all), Some(create), Some(rate)) = (
        c("reconcile_all_secs"),
        c("create_secs"),
        c("create_per_sec"),
    ) {
        let inflight = f.n(&bench, "create_per_sec");
        out.push(row(
            format!("Scale {n}: Suspended sandboxes, first create → all reconciled"),
            format!("{all:.1} s"),
            format!("the creates alone {create:.1} s ({rate:.0}/s, {inflight} in flight)"),
        ));
    }
    if let (Some(rest), Some(after)) = (c("rest_kib_per_sandbox"), c("restart_kib_per_sandbox")) {
        let restarts = f.n(&bench, "restart_kib_per_sandbox");
        out.push(Row {
            target: "≤ 30 KiB",
            met: Some(rest <= 30.0 && after <= 30.0),
            ..row(
                format!(
                    "Scale {n}: operator memory per Suspended sandbox, at rest / after a restart (worst of {restarts})"
                ),
                format!("{rest:.1} / {after:.1} KiB"),
                "—".into(),
            )
        });
    }
    if let (Some(rest), Some(after), Some(peak), Some(before)) = (
        c("rest_rss_mib"),
        c("restart_rss_mib"),
        c("restart_peak_mib"),
        c("rest_rss_before_mib"),
    ) {
        let (limit, enforced) = (c("limit_mib"), f.n(&bench, "limit_mib") == 1);
        let pod = c("chart_pod") == Some(1.0);
        let how = match (limit, enforced) {
            (Some(l), true) if pod => format!("; limit {l:.0} MiB, the chart's operator pod"),
            (Some(l), true) => format!("; limit {l:.0} MiB, a memory cgroup"),
            (Some(l), false) => format!("; limit {l:.0} MiB, checked against the peak"),
            (None, _) => String::new(),
        };
        out.push(row(
            format!("Scale {n}: operator RSS at rest / after a restart / restart's peak"),
            format!("{rest:.1} / {after:.1} / {peak:.1} MiB"),
            format!("RSS with no sandbox {before:.1} MiB{how}"),
        ));
    }
    if let (Some(rest), Some(after), Some(peak)) = (
        c("rest_cgroup_ws_mib"),
        c("restart_cgroup_ws_mib"),
        c("restart_cgroup_peak_mib"),
    ) {
        out.push(row(
            format!(
                "Scale {n}: the operator's memory cgroup, working set at rest / after a restart / restart's peak usage"
            ),
            format!("{rest:.1} / {after:.1} / {peak:.1} MiB"),
            "—".into(),
        ));
    }
    if let Some(x) = c("restart_peak_ratio") {
        out.push(Row {
            target: "≤ 1.5×",
            met: Some(x <= 1.5),
            ..row(
                format!("Scale {n}: a restart's peak RSS against the RSS at rest"),
                format!("{x:.2}×"),
                "—".into(),
            )
        });
    }
    if let Some(t) = c("restart_reconciled_secs") {
        let restarts = f.n(&bench, "restart_reconciled_secs");
        out.push(Row {
            target: "≤ 60 s",
            met: Some(t <= 60.0),
            ..row(
                format!(
                    "Scale {n}: restart → every sandbox reconciled (worst of {restarts} in a row)"
                ),
                format!("{t:.1} s"),
                "—".into(),
            )
        });
    }
    if let (Some(rest), Some(sbx), Some(all)) = (
        c("rest_writes_per_min"),
        c("restart_sandbox_writes"),
        c("restart_writes"),
    ) {
        out.push(Row {
            target: "0",
            met: Some(rest == 0.0 && sbx == 0.0),
            ..row(
                format!(
                    "Scale {n}: API writes at rest (per min) / to Sandboxes during the restarts"
                ),
                format!("{rest:.1} / {sbx:.0}"),
                format!("all the operator's writes during the restarts {all:.0}"),
            )
        });
    }
    if let Some(d) = c("delete_all_secs") {
        out.push(row(
            format!("Scale {n}: deletecollection → all gone"),
            format!("{d:.1} s"),
            match (c("delete_rounds"), c("deleted_rss_mib")) {
                (Some(r), Some(m)) => format!("{r:.0} requests; operator RSS after {m:.1} MiB"),
                (None, Some(m)) => format!("operator RSS after {m:.1} MiB"),
                (Some(r), None) => format!("{r:.0} requests"),
                (None, None) => "—".into(),
            },
        ));
    }
    out
}

/// Issue 16's idle target: Ready sandboxes with a 60 s idle timeout all Suspended within 90 s,
/// then no writes.
/// The peer beside agentbox's claim (issue 32, `BENCH_PEER_AGENT_SANDBOX`): agent-sandbox's
/// warm-pool claim interleaved with agentbox's in the claim bench's run, and the writes each
/// controller made per claim; when the run had no peer, one row that says so (with a claim
/// figure to set it beside).
fn peer_rows(f: &Figures) -> Vec<Row> {
    let c = |k: &str| f.get("claim", k);
    let (Some(c50), Some(c95)) = (c("claim_ready_p50_ms"), c("claim_ready_p95_ms")) else {
        return Vec::new();
    };
    let figure = "Claim beside agent-sandbox (kubernetes-sigs/agent-sandbox): its SandboxClaim on \
         a SandboxWarmPool of the same size, image and pod shape, interleaved with agentbox's \
         claims (above) in the same run, create → Ready on a watch, p50 / p95";
    let (Some(p50), Some(p95)) = (c("claim_peer_ready_p50_ms"), c("claim_peer_ready_p95_ms"))
    else {
        return vec![row(
            figure.into(),
            "—".into(),
            "not measured (BENCH_PEER_AGENT_SANDBOX unset)".into(),
        )];
    };
    let n = f.n("claim", "claim_peer_ready_p50_ms");
    let warm = c("claim_peer_warm_starts").map_or(String::new(), |w| format!("; {w:.0} warm"));
    let mut out = vec![Row {
        target: "below agent-sandbox",
        met: Some(c50 < p50 && c95 < p95),
        ..row(
            format!("{figure} (n={n} each{warm})"),
            format!("{c50:.1} / {c95:.1} ms"),
            format!("agent-sandbox {p50:.1} / {p95:.1} ms"),
        )
    }];
    if let (Some(ours), Some(theirs)) = (c("claim_writes_all_p50"), c("claim_peer_writes_p50")) {
        out.push(row(
            format!(
                "Claim beside agent-sandbox: API writes by the controller per claim, its pool's refill included, p50 (n={n}, audit log)"
            ),
            format!("{ours:.0}"),
            format!("agent-sandbox {theirs:.0}"),
        ));
    }
    out
}

fn idle_rows(f: &Figures) -> Vec<Row> {
    let mut out = Vec::new();
    let i = |k: &str| f.get("idle", k);
    let n = f.n("idle", "ready_to_suspended_max");
    if let (Some(p50), Some(max)) = (i("ready_to_suspended_p50"), i("ready_to_suspended_max")) {
        out.push(Row {
            target: "≤ 90 s",
            met: Some(max <= 90.0),
            ..row(
                format!("Idle: {n} Ready sandboxes, idleTimeout 60 s, Ready → Suspended p50 / max"),
                format!("{p50:.1} / {max:.1} s"),
                i("last_ready_to_all_suspended").map_or("—".into(), |t| {
                    format!("last Ready → all Suspended {t:.1} s")
                }),
            )
        });
    }
    if let Some(w) = i("writes_per_sandbox_create_to_suspended") {
        out.push(row(
            "Idle: operator API writes per sandbox, create → Ready → idle-suspended".into(),
            format!("{w:.1}"),
            "—".into(),
        ));
    }
    if let Some(w) = i("rest_writes_per_min") {
        out.push(Row {
            target: "0",
            met: Some(w == 0.0),
            ..row(
                format!("Idle: API writes/min after all {n} are suspended"),
                format!("{w:.1}"),
                "—".into(),
            )
        });
    }
    out
}

/// The Go client's figures (issue 33's target: within 1.1× of the Rust client), next to the
/// Rust client's from the same run (`go/cmd/agentbox-go-bench`, run by hack/bench after the
/// exec bench, on a bare pod of its own).
fn go_sdk_rows(f: &Figures) -> Vec<Row> {
    let mut out = Vec::new();
    let e = |k: &str| f.get("exec", k);
    let both = |k: &str| e(&format!("{k}_p50_ms")).zip(e(&format!("{k}_p95_ms")));
    if let Some((p50, p95)) = both("oneshot_go_sdk") {
        let n = f.n("exec", "oneshot_go_sdk_p50_ms");
        let figure =
            format!("Go client: one-shot exec `true`, p50 / p95, vs the Rust client (n={n})");
        let ours = format!("{p50:.1} / {p95:.1} ms");
        out.push(match both("oneshot_agentbox") {
            Some((r50, r95)) => Row {
                target: "within 1.1× of the Rust client",
                met: Some(p50 <= 1.1 * r50 && p95 <= 1.1 * r95),
                ..row(figure, ours, format!("Rust client {r50:.1} / {r95:.1} ms"))
            },
            None => row(figure, ours, "—".into()),
        });
    }
    if let Some(s50) = e("session_go_sdk_p50_ms") {
        let n = f.n("exec", "session_go_sdk_p50_ms");
        out.push(Row {
            target: "p50 < 5 ms",
            met: Some(s50 < 5.0),
            ..row(
                format!("Go client: persistent session, per command, p50 (n={n})"),
                format!("{s50:.2} ms"),
                e("session_p50_ms").map_or("—".into(), |r| format!("Rust session {r:.2} ms")),
            )
        });
    }
    out
}

/// The Java client's one-shot exec, next to the Rust client's from the same run (issue 34).
fn java_rows(f: &Figures) -> Vec<Row> {
    let e = |k: &str| f.get("exec", k);
    let both = |k: &str| e(&format!("{k}_p50_ms")).zip(e(&format!("{k}_p95_ms")));
    let (Some((p50, p95)), Some((r50, r95))) = (both("oneshot_java"), both("oneshot_agentbox"))
    else {
        return Vec::new();
    };
    let n = f.n("exec", "oneshot_java_p50_ms");
    vec![row(
        format!("Java client: one-shot exec `true`, p50 / p95, vs the Rust client (n={n})"),
        format!("{p50:.1} / {p95:.1} ms"),
        format!("Rust client {r50:.1} / {r95:.1} ms"),
    )]
}

/// The Python SDK's figures (issue 14's targets), each next to the Rust client's from the same
/// run, and its one-shot exec also next to the official Python client used naively.
fn python_sdk_rows(f: &Figures) -> Vec<Row> {
    let mut out = Vec::new();
    let e = |k: &str| f.get("exec", k);
    let both = |k: &str| e(&format!("{k}_p50_ms")).zip(e(&format!("{k}_p95_ms")));
    if let Some((p50, p95)) = both("oneshot_python_sdk") {
        let n = f.n("exec", "oneshot_python_sdk_p50_ms");
        let ours = format!("{p50:.1} / {p95:.1} ms");
        if let Some((r50, r95)) = both("oneshot_agentbox") {
            out.push(Row {
                target: "within 1.1× of the Rust client",
                met: Some(p50 <= 1.1 * r50 && p95 <= 1.1 * r95),
                ..row(
                    format!(
                        "Python SDK: one-shot exec `true`, p50 / p95, vs the Rust client (n={n})"
                    ),
                    ours.clone(),
                    format!("Rust client {r50:.1} / {r95:.1} ms"),
                )
            });
        }
        if let Some((b50, b95)) = both("oneshot_python") {
            out.push(Row {
                target: "below the baseline",
                met: Some(p50 < b50 && p95 < b95),
                ..row(
                    format!("Python SDK: one-shot exec `true`, p50 / p95, vs the official Python client (n={n})"),
                    ours,
                    format!("`kubernetes` client, `stream()` per exec {b50:.1} / {b95:.1} ms"),
                )
            });
        }
    }
    if let Some((s50, s95)) = both("session_python_sdk") {
        let n = f.n("exec", "session_python_sdk_p50_ms");
        out.push(Row {
            target: "p50 < 5 ms",
            met: Some(s50 < 5.0),
            ..row(
                format!("Python SDK: persistent session, per command, p50 / p95 (n={n})"),
                format!("{s50:.2} / {s95:.2} ms"),
                both("session").map_or("—".into(), |(r50, r95)| {
                    format!("Rust session {r50:.2} / {r95:.2} ms")
                }),
            )
        });
    }
    if let (Some(a), Some(r)) = (
        e("guard_acquire_python_sdk_p50_ms"),
        e("guard_release_python_sdk_p50_ms"),
    ) {
        let n = f.n("exec", "guard_acquire_python_sdk_p50_ms");
        out.push(row(
            format!("Python SDK: guard acquire / release, p50, uncontended (n={n})"),
            format!("{a:.1} / {r:.1} ms"),
            e("guard_acquire_p50_ms")
                .zip(e("guard_release_p50_ms"))
                .map_or("—".into(), |(a, r)| {
                    format!("Rust client {a:.1} / {r:.1} ms")
                }),
        ));
    }
    let l = |k: &str| f.get("lifecycle", k);
    if let (Some(p50), Some(p95)) = (l("python_sdk_ready_p50_ms"), l("python_sdk_ready_p95_ms")) {
        let n = f.n("lifecycle", "python_sdk_ready_p50_ms");
        out.push(row(
            format!("Python SDK: create → Ready (get_or_create + wait_ready), p50 / p95 (n={n})"),
            format!("{p50:.0} / {p95:.0} ms"),
            l("sandbox_ready_p50_ms")
                .zip(l("sandbox_ready_p95_ms"))
                .map_or("—".into(), |(a, b)| {
                    format!("Rust create + watch {a:.0} / {b:.0} ms")
                }),
        ));
    }
    out
}

/// The table in Markdown; a row whose figures come from a note carries its marker.
pub fn table(rows: &[Row]) -> String {
    let mut t = String::from("| figure | agentbox | baseline (same run) | target | met? |\n");
    t.push_str("|---|---|---|---|---|\n");
    for r in rows {
        let met = match r.met {
            Some(true) => "yes",
            Some(false) => "**no**",
            None => "—",
        };
        let notes = if r.notes.is_empty() {
            String::new()
        } else {
            format!(" {}", r.notes.join(" "))
        };
        let _ = writeln!(
            t,
            "| {}{notes} | {} | {} | {} | {met} |",
            r.figure, r.agentbox, r.baseline, r.target
        );
    }
    t
}

const METHOD: &str = "\
## What each figure is

- **Create → Ready**: one object at a time, from the create request to a watch seeing the
  Sandbox `Ready` (workspace initialised), next to a bare pod of the same image to all containers
  ready (`benches/lifecycle.rs`).
- **Delete → gone**: the same cold sandboxes after the steady-state window, one at a time, from
  the delete request to a watch (opened before it) seeing the object `Deleted`, next to the bare
  pods' delete → gone (grace 1 s, as the operator deletes a sandbox's pod); and from the request
  until the workspace directory is off the node (polled on the host every 10 ms; the next delete
  starts after it).
- **API writes**: write requests in the API server's audit log with the operator's User-Agent
  (`agentbox-operator/<version>`) in the bench's namespace, per sandbox from its create until it
  is Ready (plus 1.5 s), and per minute with nothing changing. The operator runs with leader
  election as deployed; its leader Lease renewals (one per 5 s with the default 15 s lease, the
  same with no sandbox) are counted apart and not in these figures.
- **Exec**: one-shot `true` in one pod: `agentbox_api::exec::run` with `agentbox_api::kube_client`,
  `kubectl exec` (a process per command, as a harness shelling out would), the Python
  `kubernetes` client in one process (`benches/exec_python.py`, after a warm-up); the persistent
  session runs `true` per command over one exec. Guard: Lease acquire/release, and 8 clients each
  with its own connection contending for one Lease (`benches/exec.rs`).
- **Python SDK**: the same one-shot exec (`agentbox.exec.run`, argv `true`, one process after a
  warm-up, in the same four rounds as the Rust and official clients), its persistent session
  and guard (`benches/sdk_python.py`, from `benches/exec.rs`), and create → Ready as a harness
  sees it: `Sandboxes.get_or_create` then `Sandbox.wait_ready` (a watch), one at a time, after
  the Rust figures (`benches/lifecycle.rs`).
- **Snapshot / restore**: a sandbox filled with random data; the raw figure is the same
  `tar -c` streamed through exec to nowhere; snapshot is SandboxSnapshot create → Ready (tar,
  SHA-256, upload, commit); restore is a new sandbox of the scope from its pod running to Ready
  (one pass: each member validated before its bytes reach `tar -x` in a staging directory,
  the digest checked before the swap). RSS is the operator's `VmHWM`
  against its `VmRSS` before (`benches/snapshot.rs`).
- **Small files**: the same with a workspace of many files of 1 KiB (`BENCH_SMALL_FILES`,
  `BENCH_SMALL_BYTES`); restores and cold starts (a sandbox of another user's scope) are
  create → Ready, interleaved, the median of `BENCH_SMALL_ROUNDS` (3) each, and the transports
  stream the operator's canonical archive over one exec each, as a restore does;
  the restore's baseline is the image's own `tar -x` of the same archive in the pod, from a
  file on the workspace's filesystem, once before the restore and once after (that filesystem
  slows down as tens of thousands of files come and go; the mean is the baseline); operator
  CPU is its `utime + stime` over the snapshot and over the restore, divided by the members. The canonicaliser figures are `benches/archive.rs`: parsing,
  the rules, the re-encoding and SHA-256 in one process, no I/O.
- **Claim beside agent-sandbox** (when `BENCH_PEER_AGENT_SANDBOX` names its built controller,
  `hack/agent-sandbox build`): its CRDs installed and its controller run out of cluster; a
  SandboxWarmPool as large as the SandboxPool, its template the agentbox warm pod's image,
  command, resources and security context; per round one agentbox claim, then one
  SandboxClaim, each against its pool refilled to full, create → Ready (the claim's `Ready`
  condition) on a watch opened before the create; each claim deleted and its pod gone before
  the next, on both sides (`benches/claim.rs`, `benches/peer/mod.rs`).
- **Scale**: Suspended sandboxes (no pods) created 16 requests in flight against a freshly
  started operator; reconciled = phase Suspended with `observedGeneration` current, seen on a
  watch; then a window at rest (RSS and CPU from `/proc/<pid>`, writes from the audit log), then
  one `deletecollection` until the last finalizer is gone (`benches/scale.rs`). The rows
  `Scale <n>` (issue 44) run the operator as the chart runs it: `hack/bench` installs the chart
  (`helm install`, hack/values-local.yaml, this tree's image from `hack/image`, the chart's
  default `resources`) in the bench's namespace, so the kubelet's memory cgroup holds it to the
  chart's limit; each of three restarts in a row is a rollout of its Deployment (the old pod
  stops, SIGTERM, before the new one starts), timed from the rollout until the new pod's
  `agentbox_startup_reconciled_seconds` says every Sandbox was reconciled (run alone, the bench
  runs this build's binary in a memory cgroup of its own instead, and the row says so). Its
  peak is `VmHWM` of the pod's process, its RSS after a restart is read after a settle window
  (`VmRSS`), beside the container cgroup's working set (usage less inactive file pages) and its
  peak usage; memory per sandbox is (RSS − the RSS of an operator with none) / n; writes during
  a restart are the operator's from the rollout to the end of that window, those to Sandboxes
  apart.

Timings share the machine with the whole cluster (API server, etcd, kubelet, containerd) and
with whatever else runs on it; figures from a busy machine are slower, not wrong in kind.
";
