//! The controller's shape, checked (issue 49): the sandbox controller's spine
//! (`sandbox/mod.rs`) fits in 120 lines, the plan and the status transitions each stay under
//! 1,300, and no function in `src/controller` is over 80 lines. A merge of two changes to one
//! function made `proxy::run` 85 lines without anyone writing a long function; this says so at
//! `cargo test` rather than at the next read.
//!
//! Tests only (declared under `#[cfg(test)]`): it reads the sources as text. A function is
//! counted from its `fn` line to the first line after it that closes a block at the `fn`'s
//! own indentation (what `rustfmt` writes); the inline test modules are left out.

use std::path::{Path, PathBuf};

const LONGEST_FN: usize = 80;

fn controller_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/controller")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src/controller") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The name of the function a line declares, if it declares one.
fn declares(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    for prefix in [
        "pub(crate) ",
        "pub(super) ",
        "pub ",
        "async ",
        "const ",
        "unsafe ",
    ] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("async ").unwrap_or(rest);
    let name = rest.strip_prefix("fn ")?;
    let end = name.find(|c: char| !(c.is_alphanumeric() || c == '_'))?;
    Some(&name[..end])
}

/// What follows `mod ` on a line declaring a module (any visibility).
fn test_module(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("pub(super) ").unwrap_or(line);
    let rest = rest.strip_prefix("pub(crate) ").unwrap_or(rest);
    rest.strip_prefix("mod ")
}

/// The files of the modules `text` declares for tests only (`#[cfg(test)]` then `mod x;`):
/// scenario tiers, not controller code.
fn test_only_files(text: &str, dir: &Path) -> Vec<PathBuf> {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[0].starts_with("#[cfg(test)]"))
        .filter_map(|w| test_module(w[1])?.strip_suffix(';'))
        .map(|m| dir.join(format!("{m}.rs")))
        .collect()
}

/// Each function of `text` outside its test module, with its length in lines.
fn functions(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    // The inline test module (`#[cfg(test)]` then `mod tests {`), not a `mod x;` so marked.
    let end = lines
        .windows(2)
        .position(|w| {
            w[0].starts_with("#[cfg(test)]") && test_module(w[1]).is_some_and(|m| m.ends_with('{'))
        })
        .unwrap_or(lines.len());
    let mut out = Vec::new();
    for (i, line) in lines[..end].iter().enumerate() {
        let Some(name) = declares(line) else { continue };
        let indent = line.len() - line.trim_start().len();
        // A declaration without a body (a trait's) ends at its `;`.
        if line.trim_end().ends_with(';') {
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let len = lines[i..end]
            .iter()
            .position(|l| l.trim_end() == close)
            .map_or(0, |n| n + 1);
        out.push((name.to_string(), len));
    }
    out
}

#[test]
fn the_counter_counts_a_function_from_fn_to_its_closing_brace() {
    let text = "fn a() {\n    let x = 1;\n}\n#[cfg(test)]\nmod x;\n    pub async fn b(\n        y: u8,\n    ) {\n    }\n#[cfg(test)]\nmod tests {\nfn c() {\n}\n}\n";
    assert_eq!(
        functions(text),
        vec![("a".to_string(), 3), ("b".to_string(), 4)]
    );
}

#[test]
fn no_controller_function_is_over_80_lines() {
    let mut files = Vec::new();
    rust_files(&controller_dir(), &mut files);
    assert!(files.len() > 20, "found only {} files", files.len());
    let mut test_only = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read a source");
        let dir = if f.ends_with("mod.rs") {
            f.parent().map(Path::to_path_buf)
        } else {
            Some(f.with_extension(""))
        };
        test_only.extend(test_only_files(&text, &dir.expect("a directory")));
    }
    assert!(
        test_only
            .iter()
            .any(|f| f.ends_with("sandbox/scenarios.rs")),
        "{test_only:#?}"
    );
    let mut long = Vec::new();
    for f in files.iter().filter(|f| !test_only.contains(f)) {
        let text = std::fs::read_to_string(f).expect("read a source");
        for (name, len) in functions(&text) {
            if len > LONGEST_FN {
                long.push(format!("{}: {name} ({len} lines)", f.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "over {LONGEST_FN} lines (split it into steps that return): {long:#?}"
    );
}

#[test]
fn the_spine_and_the_two_halves_of_the_plan_stay_short() {
    for (file, most) in [
        ("sandbox/mod.rs", 120),
        ("sandbox/plan.rs", 1300),
        ("sandbox/status.rs", 1300),
    ] {
        let text = std::fs::read_to_string(controller_dir().join(file)).expect("read");
        let n = text.lines().count();
        assert!(n <= most, "{file} is {n} lines (at most {most})");
    }
}
