//! docs/benchmarks.md is what `hack/bench`'s report writes, whole: the rendering of the last
//! run's figures (benches/report/last-run.jsonl) with the notes that stay from run to run
//! (benches/report/notes.md). A run replaces the figures and keeps every note, so what a code
//! comment cites ("docs/benchmarks.md, footnote 7") is there after any run; and every such
//! citation names a note that exists. No cluster, no bench run.

#[path = "../benches/report/render.rs"]
mod render;
// The scale bench's deletion rounds: pure, tested here with the renderer.
#[path = "../benches/scale/rounds.rs"]
mod rounds;

use std::path::{Path, PathBuf};

/// The document, from the repository root.
const DOCUMENT: &str = "docs/benchmarks.md";
/// The command that writes the document again from the data without running a bench.
const RENDER: &str = "BENCH_REPORT=docs/benchmarks.md cargo bench --bench report";

/// A footnote's marker for its number (7 → `⁷`), as code comments cite them ("footnote 7").
fn marker(n: u32) -> String {
    n.to_string()
        .chars()
        .filter_map(|d| d.to_digit(10))
        .filter_map(|d| render::SUPERSCRIPTS.chars().nth(d as usize))
        .collect()
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The last run's data as its full run left it: without the records and figures of the partial
/// runs merged into it since (the scale rows of `BENCH_ONLY=scale` runs), so these tests start
/// from the same kind of data whatever later partial runs brought.
fn full_run(last: &str) -> String {
    last.lines()
        .filter(|l| !l.starts_with(r#"{"partial":"#) && !l.contains(r#""bench":"scale_"#))
        .map(|l| format!("{l}\n"))
        .collect()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_committed_document_is_the_last_run_rendered_with_the_notes() {
    let data = render::parse(&read(render::LAST_RUN)).expect("the last run's data");
    let doc = render::document(&data, &read(render::NOTES)).expect("the document");
    assert!(
        doc == read(DOCUMENT),
        "{} is stale, or was edited by hand: edit {} or {} and run `{}`",
        DOCUMENT,
        render::NOTES,
        render::LAST_RUN,
        RENDER
    );
}

/// A new run: its figures alone, as the benches write them, with its facts.
fn a_new_run() -> render::Data {
    let last = read(render::LAST_RUN);
    let figures: Vec<&str> = last.lines().filter(|l| l.contains("\"bench\"")).collect();
    assert!(figures.len() > 50, "{}", figures.len());
    let meta = serde_json::json!({"meta": {"command": "hack/bench", "run": "new", "commit": "abc",
        "date": "today", "wall_secs": 1, "machine": ["m"], "versions": ["v"]}});
    render::parse(&format!("{}\n{meta}\n", figures.join("\n"))).expect("a run's results")
}

#[test]
fn a_new_run_replaces_the_figures_and_keeps_every_note() {
    let notes_md = read(render::NOTES);
    let notes = render::notes(&notes_md);
    let doc = render::document(&a_new_run(), &notes_md).expect("the document");
    let table: Vec<&str> = doc.lines().filter(|l| l.starts_with("| ")).collect();
    let footnotes: Vec<&render::Note> = notes.iter().filter(|n| n.is_footnote()).collect();
    assert!(footnotes.len() >= 10, "{}", footnotes.len());
    for n in &footnotes {
        // Kept below the table, and marking no row: the run measured every figure itself.
        let first_line = n.body.lines().next().unwrap_or_default();
        assert!(
            doc.contains(&format!("\n{} {first_line}\n", n.heading)),
            "footnote {} is gone",
            n.heading
        );
        assert!(
            !table
                .iter()
                .any(|row| row.contains(&format!(" {} |", n.heading))),
            "a new run's row carries {}",
            n.heading
        );
    }
    for n in notes.iter().filter(|n| !n.is_footnote()) {
        assert!(
            doc.contains(&format!("\n### {}\n", n.heading)),
            "{}",
            n.heading
        );
    }
    assert!(doc.contains("Command: `hack/bench` (run new at commit abc)"));
}

#[test]
fn a_row_carries_the_marker_of_the_note_its_figures_come_from() {
    // The last run's figures, the delete rows' said to come from note ¹.
    let provenance = serde_json::json!({"note": "¹", "rows": ["Delete → gone"]});
    let data = render::parse(&format!("{}\n{provenance}\n", read(render::LAST_RUN)))
        .expect("the last run's data");
    let doc = render::document(&data, &read(render::NOTES)).expect("the document");
    let row = doc
        .lines()
        .find(|l| l.starts_with("| Delete → gone"))
        .expect("the delete row");
    assert!(row.contains(" ¹ |"), "{row}");
    let plain = render::document(
        &render::parse(&read(render::LAST_RUN)).expect("parse"),
        &read(render::NOTES),
    )
    .expect("the document");
    assert!(
        plain
            .lines()
            .filter(|l| l.starts_with("| Delete → gone"))
            .all(|l| !l.contains(" ¹ |")),
        "without the provenance line, no marker"
    );
    // A provenance that names a note or a row that is not there is refused.
    let refusal = |note: &str, row: &str| {
        let line = serde_json::json!({"note": note, "rows": [row]});
        let data = render::parse(&format!("{}\n{line}\n", read(render::LAST_RUN))).expect("parse");
        render::document(&data, &read(render::NOTES)).unwrap_err()
    };
    let err = refusal("⁹⁹", "Delete");
    assert!(err.contains("note ⁹⁹ is not in"), "{err}");
    let err = refusal("¹", "No such figure");
    assert!(err.contains("names no row \"No such figure\""), "{err}");
}

#[test]
fn a_partial_run_replaces_its_figures_alone_and_the_document_names_it() {
    let last = full_run(&read(render::LAST_RUN));
    let old = render::parse(&last).expect("the last run's data");
    let results = [
        r#"{"bench":"scale_2000","key":"rest_kib_per_sandbox","n":2000,"unit":"KiB","value":12.5}"#,
        r#"{"bench":"lifecycle","key":"bare_ready_p50_ms","n":20,"unit":"ms","value":4321.0}"#,
    ]
    .join("\n");
    let meta = |run: &str| render::Meta {
        command: "BENCH_ONLY=scale hack/bench".into(),
        run: run.into(),
        commit: "abc".into(),
        date: "today".into(),
        wall_secs: 7,
        machine: vec!["m".into()],
        versions: vec!["etcd: 3.5".into(), "agentbox: commit abc".into()],
    };
    let merged = render::merge(&last, &results, meta("p1")).expect("merged");
    let data = render::parse(&merged).expect("parse");
    // The full run's facts stay; its figure the partial run measured again is replaced, the
    // others stay, and the new bench joins.
    assert_eq!(data.meta, old.meta);
    let lines = |text: &str, needle: &str| text.lines().filter(|l| l.contains(needle)).count();
    let figure = r#""bench":"lifecycle","key":"bare_ready_p50_ms""#;
    assert_eq!(lines(&last, figure), 1);
    assert_eq!(lines(&merged, figure), 1);
    assert!(merged.contains("4321.0"));
    assert_eq!(
        lines(&merged, r#""bench":"lifecycle""#),
        lines(&last, r#""bench":"lifecycle""#)
    );
    assert_eq!(lines(&merged, r#""bench":"scale_2000""#), 1);
    assert_eq!(data.partials.len(), 1);
    assert_eq!(data.partials[0].benches, ["lifecycle", "scale_2000"]);
    let doc = render::document(&data, &read(render::NOTES)).expect("the document");
    assert!(
        doc.contains(
            "The rows of the benches `lifecycle`, `scale_2000` come from a later run of them alone: `BENCH_ONLY=scale hack/bench` (run p1 at commit abc), today, 7 s in all; etcd: 3.5."
        ),
        "{doc}"
    );
    // A second partial run of the same benches replaces the first's record; one of other
    // benches keeps it.
    let again = render::merge(&merged, &results, meta("p2")).expect("merged again");
    let data = render::parse(&again).expect("parse");
    assert_eq!(data.partials.len(), 1);
    assert_eq!(data.partials[0].meta.run, "p2");
    let other =
        r#"{"bench":"scale_500","key":"rest_kib_per_sandbox","n":500,"unit":"KiB","value":20.0}"#;
    let data =
        render::parse(&render::merge(&again, other, meta("p3")).expect("merged")).expect("parse");
    assert_eq!(data.partials.len(), 2);
    // Results with nothing measured, or a line that is not a figure, are refused.
    let err = render::merge(&last, "", meta("p4")).unwrap_err();
    assert!(err.contains("measured nothing"), "{err}");
    let err = render::merge(&last, r#"{"meta": {}}"#, meta("p5")).unwrap_err();
    assert!(err.contains("results line 1: not a figure"), "{err}");
}

/// Every text file of the source tree a citation could be in.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with('.') || name == "target" || name == "tar-corpus" || name == "docs" {
            continue;
        }
        if path.is_dir() {
            sources(&path, out);
        } else if !name.ends_with(".md") && std::fs::read_to_string(&path).is_ok() {
            out.push(path);
        }
    }
}

/// (file:line, footnote number) of each "docs/benchmarks.md, footnote N" in the code (the
/// number may be on the next line).
fn citations() -> Vec<(String, u32)> {
    let mut files = Vec::new();
    sources(&root(), &mut files);
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(at) = line.find("benchmarks.md") else {
                continue;
            };
            let rest = format!("{} {}", &line[at..], lines.get(i + 1).unwrap_or(&""));
            let Some(f) = rest.find("footnote") else {
                continue;
            };
            let digits: String = rest[f + "footnote".len()..]
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if let Ok(n) = digits.parse() {
                let place = file.strip_prefix(root()).unwrap_or(&file).display();
                out.push((format!("{place}:{}", i + 1), n));
            }
        }
    }
    out
}

#[test]
fn every_footnote_the_code_cites_is_a_note() {
    let notes = render::notes(&read(render::NOTES));
    let cited = citations();
    assert!(
        cited
            .iter()
            .any(|(place, _)| place.contains("refill_delay.rs")),
        "the pool's quiet beat cites footnote 7: {cited:?}"
    );
    for (place, n) in cited {
        let marker = marker(n);
        assert!(
            notes
                .iter()
                .any(|note| note.is_footnote() && note.heading == marker),
            "{place} cites docs/benchmarks.md, footnote {n} ({marker}): not in {}",
            render::NOTES
        );
    }
}

#[test]
fn markers_are_superscript_numbers() {
    assert_eq!(marker(7), "⁷");
    assert_eq!(marker(11), "¹¹");
    let notes = render::notes("comment\n## ¹⁰\nbody\nmore\n\n## A section\ntext\n");
    assert_eq!(notes.len(), 2);
    assert!(notes[0].is_footnote() && notes[0].body == "body\nmore");
    assert!(!notes[1].is_footnote());
}

#[test]
fn the_go_clients_figures_are_rows_beside_the_rust_clients() {
    let go: Vec<String> = [
        ("oneshot_go_sdk_p50_ms", 40.0),
        ("oneshot_go_sdk_p95_ms", 60.0),
        ("session_go_sdk_p50_ms", 1.5),
    ]
    .iter()
    .map(|(k, v)| {
        serde_json::json!({"bench": "exec", "key": k, "value": v, "unit": "ms", "n": 200})
            .to_string()
    })
    .collect();
    let data =
        render::parse(&format!("{}\n{}\n", read(render::LAST_RUN), go.join("\n"))).expect("parse");
    let doc = render::document(&data, &read(render::NOTES)).expect("the document");
    let row = doc
        .lines()
        .find(|l| l.starts_with("| Go client: one-shot exec"))
        .expect("the Go one-shot row");
    assert!(
        row.contains("| 40.0 / 60.0 ms | Rust client ") && row.contains("within 1.1×"),
        "{row}"
    );
    let row = doc
        .lines()
        .find(|l| l.starts_with("| Go client: persistent session"))
        .expect("the Go session row");
    assert!(row.contains("| 1.50 ms | Rust session "), "{row}");
    // Without Go figures, no Go rows.
    let last = read(render::LAST_RUN);
    let no_go: Vec<&str> = last.lines().filter(|l| !l.contains("_go_sdk_")).collect();
    let data = render::parse(&no_go.join("\n")).expect("parse");
    let doc = render::document(&data, &read(render::NOTES)).expect("the document");
    assert!(!doc.contains("Go client"));
}

#[test]
fn gvisor_figures_sit_beside_runcs_with_issue_31s_targets() {
    let line = |bench: &str, key: &str, value: f64| {
        serde_json::json!({"bench": bench, "key": key, "value": value, "unit": "ms", "n": 20})
            .to_string()
    };
    let lines = [
        line("lifecycle", "sandbox_ready_p50_ms", 1000.0),
        line("lifecycle", "sandbox_ready_p95_ms", 1200.0),
        line("lifecycle", "bare_ready_p50_ms", 900.0),
        line("lifecycle_gvisor", "sandbox_ready_p50_ms", 1600.0),
        line("lifecycle_gvisor", "sandbox_ready_p95_ms", 1900.0),
        line("lifecycle_gvisor", "bare_ready_p50_ms", 1400.0),
        line("lifecycle_gvisor", "bare_ready_p95_ms", 1500.0),
        line("exec", "oneshot_agentbox_p50_ms", 40.0),
        line("exec", "oneshot_agentbox_p95_ms", 50.0),
        line("exec_gvisor", "oneshot_agentbox_p50_ms", 50.0),
        line("exec_gvisor", "oneshot_agentbox_p95_ms", 70.0),
        line("exec", "session_p50_ms", 2.0),
        line("exec", "session_p95_ms", 3.0),
        line("exec_gvisor", "session_p50_ms", 3.0),
        line("exec_gvisor", "session_p95_ms", 4.0),
        line("claim", "claim_ready_p50_ms", 30.0),
        line("claim", "claim_ready_p95_ms", 40.0),
        line("claim_gvisor", "claim_ready_p50_ms", 45.0),
        line("claim_gvisor", "claim_ready_p95_ms", 60.0),
        line("snapshot", "file_snapshot_mib_s", 200.0),
        line("snapshot_gvisor", "file_snapshot_mib_s", 90.0),
        line("snapshot", "file_restore_mib_s", 100.0),
        line("snapshot_gvisor", "file_restore_mib_s", 60.0),
        line("snapshot", "file_small_restore_secs", 1.0),
        line("snapshot_gvisor", "file_small_restore_secs", 2.5),
    ];
    let data = render::parse(&lines.join("\n")).expect("parse");
    let rows = render::rows(&data.figures);
    let find = |prefix: &str| {
        rows.iter()
            .find(|r| r.figure.starts_with(prefix))
            .unwrap_or_else(|| panic!("no row {prefix}"))
    };
    let ready = find("gVisor: create → Ready");
    assert_eq!(ready.agentbox, "1600 / 1900 ms (1.60× runc)");
    assert_eq!(ready.baseline, "runc 1000 / 1200 ms");
    assert_eq!(ready.met, Some(false), "1.6× misses 1.5×");
    let exec = find("gVisor: one-shot exec");
    assert_eq!(exec.met, Some(true), "1.25× is within 1.5×");
    assert!(
        find("gVisor: persistent session")
            .agentbox
            .contains("1.50× runc")
    );
    assert!(find("gVisor: bare pod").agentbox.contains("1.56× runc"));
    let claim = find("gVisor: warm claim");
    assert_eq!(claim.agentbox, "45.0 / 60.0 ms (1.50× runc)");
    assert_eq!(claim.baseline, "runc 30.0 / 40.0 ms");
    let snapshot = find("gVisor: snapshot of");
    assert_eq!(snapshot.agentbox, "90.0 MiB/s (45% of runc's)");
    assert_eq!(snapshot.met, Some(false), "45% misses 50%");
    assert_eq!(
        find("gVisor: restore of").met,
        Some(true),
        "60% is at least 50%"
    );
    let small = find("gVisor: 20 small files, restore");
    assert_eq!(small.agentbox, "2.50 s (40% of runc's throughput)");
    assert_eq!(
        small.met,
        Some(false),
        "2.5× the time is 40% of the throughput"
    );
    // A side without its runc figure gets no row.
    assert!(
        !rows
            .iter()
            .any(|r| r.figure.starts_with("gVisor: 20 small files, snapshot"))
    );
    // Without gVisor figures there are no gVisor rows.
    let runc_only = render::parse(&lines[..3].join("\n")).expect("parse");
    assert!(
        !render::rows(&runc_only.figures)
            .iter()
            .any(|r| r.figure.starts_with("gVisor"))
    );
}

#[test]
fn the_peers_claim_sits_beside_agentboxs_or_says_it_was_not_measured() {
    let line = |key: &str, value: f64| {
        serde_json::json!({"bench": "claim", "key": key, "value": value, "unit": "ms", "n": 20})
            .to_string()
    };
    let ours = [
        line("claim_ready_p50_ms", 30.0),
        line("claim_ready_p95_ms", 40.0),
        line("claim_warm_starts", 20.0),
        line("claim_writes_all_p50", 9.0),
    ];
    let find = |rows: &[render::Row], prefix: &str| {
        rows.iter()
            .position(|r| r.figure.starts_with(prefix))
            .unwrap_or_else(|| panic!("no row {prefix}"))
    };
    // Without the peer: one row that says why, next to the claim row, with no figure of its own.
    let alone = render::rows(&render::parse(&ours.join("\n")).expect("parse").figures);
    let at = find(&alone, "Claim beside agent-sandbox");
    assert_eq!(
        alone[at].baseline,
        "not measured (BENCH_PEER_AGENT_SANDBOX unset)"
    );
    assert_eq!(alone[at].agentbox, "—");
    assert_eq!(alone[at].met, None);
    assert_eq!(at, find(&alone, "Claim: templated create → Ready") + 1);
    assert!(!alone.iter().any(|r| {
        r.figure
            .starts_with("Claim beside agent-sandbox: API writes")
    }));

    // Measured: agentbox's claim beside the peer's from the same run, and the writes.
    let mut both = ours.to_vec();
    both.extend([
        line("claim_peer_ready_p50_ms", 32.0),
        line("claim_peer_ready_p95_ms", 41.0),
        line("claim_peer_warm_starts", 20.0),
        line("claim_peer_writes_p50", 18.0),
    ]);
    let rows = render::rows(&render::parse(&both.join("\n")).expect("parse").figures);
    let peer = &rows[find(&rows, "Claim beside agent-sandbox (")];
    assert_eq!(peer.agentbox, "30.0 / 40.0 ms");
    assert_eq!(peer.baseline, "agent-sandbox 32.0 / 41.0 ms");
    assert!(
        peer.figure.contains("(n=20 each; 20 warm)"),
        "{}",
        peer.figure
    );
    assert_eq!(peer.met, Some(true));
    let writes = &rows[find(&rows, "Claim beside agent-sandbox: API writes")];
    assert_eq!(
        (writes.agentbox.as_str(), writes.baseline.as_str()),
        ("9", "agent-sandbox 18")
    );

    // Behind the peer at p95 is not below it.
    both.push(line("claim_peer_ready_p95_ms", 39.0));
    let rows = render::rows(&render::parse(&both.join("\n")).expect("parse").figures);
    assert_eq!(
        rows[find(&rows, "Claim beside agent-sandbox (")].met,
        Some(false)
    );
}

#[test]
fn each_scale_size_has_its_rows_with_memory_per_sandbox_at_rest_and_after_a_restart() {
    let line = |n: u64, key: &str, value: f64, count: u64| {
        serde_json::json!({"bench": format!("scale_{n}"), "key": key, "value": value,
            "unit": "", "n": count})
        .to_string()
    };
    let mut lines = Vec::new();
    for (n, rest, after, peak_ratio, secs, sbx_writes) in [
        (10_000u64, 14.5, 16.0, 1.2, 41.0, 0.0),
        (500, 20.0, 25.0, 1.1, 3.0, 0.0),
        (2000, 31.0, 22.0, 1.7, 70.0, 2.0),
    ] {
        lines.extend([
            line(n, "create_secs", 10.0, n),
            line(n, "create_per_sec", 150.0, 16),
            line(n, "reconcile_all_secs", 12.0, n),
            line(n, "rest_kib_per_sandbox", rest, n),
            line(n, "restart_kib_per_sandbox", after, 3),
            line(n, "rest_rss_mib", 60.0, n),
            line(n, "restart_rss_mib", 61.0, 3),
            line(n, "restart_peak_mib", 72.0, 3),
            line(n, "rest_rss_before_mib", 18.0, n),
            line(n, "limit_mib", 512.0, 1),
            line(n, "restart_peak_ratio", peak_ratio, 3),
            line(n, "restart_reconciled_secs", secs, 3),
            line(n, "rest_writes_per_min", 0.0, 60),
            line(n, "restart_sandbox_writes", sbx_writes, 3),
            line(n, "restart_writes", 4.0, 3),
            line(n, "delete_all_secs", 30.0, n),
        ]);
    }
    let data = render::parse(&format!(
        "{}\n{}\n",
        full_run(&read(render::LAST_RUN)),
        lines.join("\n")
    ))
    .expect("parse");
    let doc = render::document(&data, &read(render::NOTES)).expect("the document");
    let rows: Vec<&str> = doc
        .lines()
        .filter(|l| l.starts_with("| Scale ") && l.contains("memory per Suspended sandbox"))
        .collect();
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(
        rows[0].starts_with("| Scale 500:"),
        "smallest first: {rows:?}"
    );
    assert!(rows[2].starts_with("| Scale 10000:"), "{rows:?}");
    assert!(
        rows[0].contains("| 20.0 / 25.0 KiB |") && rows[0].contains("≤ 30 KiB"),
        "at rest and after a restart side by side: {}",
        rows[0]
    );
    let yes = |row: &str| row.ends_with("| yes |");
    let no = |row: &str| row.ends_with("| **no** |");
    assert!(yes(rows[0]) && yes(rows[2]), "{rows:?}");
    assert!(no(rows[1]), "2,000's rest figure misses it: {}", rows[1]);
    let find = |prefix: &str| {
        doc.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no row {prefix}"))
            .to_string()
    };
    let peak = find("| Scale 2000: a restart's peak RSS");
    assert!(peak.contains("1.70×") && no(&peak), "{peak}");
    let restart = find("| Scale 10000: restart → every sandbox reconciled (worst of 3");
    assert!(restart.contains("41.0 s") && yes(&restart), "{restart}");
    let writes = find("| Scale 2000: API writes at rest");
    assert!(
        no(&writes),
        "a write to a Sandbox misses the target: {writes}"
    );
    let rss = find("| Scale 500: operator RSS at rest / after a restart / restart's peak");
    assert!(
        rss.contains("60.0 / 61.0 / 72.0 MiB") && rss.contains("limit 512 MiB, a memory cgroup"),
        "{rss}"
    );
    // The committed run has none of them: its document is unchanged by these rows.
    let plain = render::document(
        &render::parse(&full_run(&read(render::LAST_RUN))).expect("parse"),
        &read(render::NOTES),
    )
    .expect("the document");
    assert!(!plain.contains("| Scale 500:"));
}
