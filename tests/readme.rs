//! Every snippet of the README, of docs/ and of python/README.md, checked against the real
//! local cluster as far as its kind allows (a snippet no test checks is a defect):
//!
//! - `yaml`: a Kubernetes object is accepted by the API server (a server-side dry run: client-
//!   and server-side apply, create), then applied for real with an operator watching, and
//!   `kubectl wait --for=condition=Ready` returns for every object of a kind that has the
//!   condition; other YAML is Helm values the chart accepts. `<<'YAML'` here-documents of `sh`
//!   blocks count as YAML snippets too.
//! - `sh`: run with `bash -euo pipefail` in a directory of its own, in order, after every
//!   object above is Ready: with a kubeconfig whose namespace is the test's (the docs' example
//!   namespace `team-a` is that one), the CLI (`agentbox`, `kubectl-agentbox`) and kubectl on the
//!   PATH, each object snippet saved as `<name>.yaml` (the first of a name), and the
//!   repository's `examples/`, `crds/`, `charts/`, `hack/` and `python/` beside them. A block
//!   after `<!-- not run: why -->` is checked without running: `bash -n`, and each command
//!   against what it names (scripts and their subcommands, `helm template` with the same chart
//!   and values, the crate's binaries, the Dockerfile, the package's extras).
//! - `console`: a transcript; each `$ ` command runs as an `sh` block would and prints exactly
//!   the lines under it.
//! - `text`: diagrams and layouts; every repository path they name exists.
//! - a block after `<!-- excerpt of PATH -->` is the same lines (at any one indentation) as
//!   that file, which is compiled and tested: the README's Rust is the module
//!   [`readme_rust`] below, run here against the cluster; the Python excerpts are the examples
//!   `hack/test` runs. Any other language must be an excerpt.
//! - `python`: run by the Python SDK's `tests/integration/test_docs.py`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{TestEnv, kubectl, repo_root};

/// The README's Rust, compiled here and run by
/// [`every_snippet_applies_runs_and_prints_what_it_says`].
mod readme_rust {
    use std::time::Duration;

    use agentbox_api::crd::{SandboxSpec, Scope, ScopeKind};
    use agentbox_api::exec::ExecRequest;
    use agentbox_client::client::Sandboxes;

    pub async fn turn(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
        // The kubeconfig context's namespace.
        let sandboxes = Sandboxes::new(client.clone(), client.default_namespace());
        let scope = Scope {
            kind: ScopeKind::User,
            agent: Some("coder".into()),
            user: Some("alice@example.com".into()),
            session: None,
        };
        let spec: SandboxSpec = serde_json::from_value(serde_json::json!({
            "image": "docker.io/library/busybox:1.37",
            "scope": {"kind": "User", "agent": "coder", "user": "alice@example.com"},
        }))?;
        let mut sbx = sandboxes.get_or_create(&scope, spec).await?; // racing harnesses: one Sandbox
        sbx.wait_ready(Duration::from_secs(120)).await?;
        let guard = sbx.guard(Some(Duration::from_secs(60))).await?; // the scope's Lease
        let req = ExecRequest::shell("ls; exit 3").timeout(Duration::from_secs(30));
        let out = sbx.exec(req).await?;
        assert_eq!(out.status.code(), Some(3)); // the real exit code
        sbx.write_file("notes/todo.txt", "ship it\n").await?; // confined to the workspace
        let session = sbx.session(); // a persistent shell: ~2 ms per command
        let out = session.run(ExecRequest::shell("cat notes/*")).await?;
        assert_eq!(out.stdout, b"ship it\n");
        guard.release().await?;
        Ok(())
    }
}

/// The documents whose snippets are checked, from the repository root, in the order their
/// blocks run.
fn documents() -> Vec<String> {
    let mut docs: Vec<String> = std::fs::read_dir(repo_root().join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    docs.insert(0, "README.md".into());
    docs.push("python/README.md".into());
    docs
}

/// How a block is to be checked, from the HTML comment on the line above its fence.
#[derive(Debug, PartialEq)]
enum Directive {
    /// `<!-- not run: why -->`: checked without running.
    NotRun,
    /// `<!-- excerpt of PATH -->`: the same lines as that file.
    Excerpt(String),
}

/// A fenced block of a document.
#[derive(Debug)]
struct Block {
    /// `doc:line` of its first line, for messages.
    at: String,
    /// The first word of the fence's info string (`yaml`, `sh`...), or "".
    lang: String,
    directive: Option<Directive>,
    text: String,
}

/// Every fenced block of `text` (the document `doc`).
fn blocks(doc: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let lang = info
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        let directive = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| l.trim().strip_prefix("<!--"))
            .and_then(|l| l.strip_suffix("-->"))
            .and_then(|c| {
                let c = c.trim();
                if c.starts_with("not run:") {
                    Some(Directive::NotRun)
                } else {
                    c.strip_prefix("excerpt of ")
                        .map(|p| Directive::Excerpt(p.trim().to_string()))
                }
            });
        let body: Vec<&str> = lines[i + 1..]
            .iter()
            .take_while(|l| !l.trim_start().starts_with("```"))
            .copied()
            .collect();
        assert!(
            i + 1 + body.len() < lines.len(),
            "{doc}:{}: unterminated block",
            i + 1
        );
        out.push(Block {
            at: format!("{doc}:{}", i + 2),
            lang,
            directive,
            text: body.join("\n") + "\n",
        });
        i += body.len() + 2;
    }
    out
}

/// Every block of every document.
fn all_blocks() -> Vec<Block> {
    documents()
        .iter()
        .flat_map(|doc| {
            let text = std::fs::read_to_string(repo_root().join(doc)).expect("a document");
            blocks(doc, &text)
        })
        .collect()
}

/// A YAML snippet and where it starts.
struct Snippet {
    at: String,
    text: String,
}

/// The YAML snippets of the blocks: each `yaml` block, and each here-document ending in a line
/// `YAML` inside an `sh` block.
fn yaml_snippets(blocks: &[Block]) -> Vec<Snippet> {
    let mut out = Vec::new();
    for b in blocks {
        if b.lang == "yaml" {
            out.push(Snippet {
                at: b.at.clone(),
                text: b.text.clone(),
            });
            continue;
        }
        if b.lang != "sh" {
            continue;
        }
        let mut heredoc: Option<(usize, Vec<&str>)> = None;
        for (j, l) in b.text.lines().enumerate() {
            match &mut heredoc {
                Some((start, body)) if l.trim() == "YAML" => {
                    let (doc, line) = b.at.rsplit_once(':').expect("doc:line");
                    let line: usize = line.parse().expect("a line number");
                    out.push(Snippet {
                        at: format!("{doc}:{}", line + *start),
                        text: body.join("\n") + "\n",
                    });
                    heredoc = None;
                }
                Some((_, body)) => body.push(l),
                None if l.contains("<<'YAML'") => heredoc = Some((j + 1, Vec::new())),
                None => {}
            }
        }
        assert!(
            heredoc.is_none(),
            "{}: unterminated YAML here-document",
            b.at
        );
    }
    out
}

/// (kind, name) of a Kubernetes object snippet; None for other YAML (Helm values).
fn object_of(s: &Snippet) -> Option<(String, String)> {
    let v: serde_yaml::Value = serde_yaml::from_str(&s.text)
        .unwrap_or_else(|e| panic!("{}: not YAML: {e}\n{}", s.at, s.text));
    let kind = v.get("kind")?.as_str()?.to_string();
    let name = v["metadata"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("{}: {kind} without metadata.name", s.at))
        .to_string();
    Some((kind, name))
}

/// Checks a YAML snippet that is not an object as Helm values of the chart (its schema refuses
/// unknown keys and wrong types).
fn check_values(s: &Snippet) {
    let dir = std::env::temp_dir().join(format!("readme-values-{}", common::suffix()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("values.yaml");
    std::fs::write(&file, &s.text).expect("write values");
    let out = common::helm_template(&["-f", file.to_str().expect("a UTF-8 path")]);
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = out {
        panic!(
            "{}: neither an object nor values the chart accepts: {e}\n{}",
            s.at, s.text
        );
    }
}

/// Whether `block`'s lines are lines of `file` at one indentation (blank lines match blank
/// lines).
fn is_excerpt(block: &str, file: &str) -> bool {
    let want: Vec<&str> = block.lines().collect();
    let have: Vec<&str> = file.lines().collect();
    let Some(first) = want.first().filter(|l| !l.trim().is_empty()) else {
        return false;
    };
    (0..have.len()).any(|i| {
        let Some(indent) = have[i].strip_suffix(first) else {
            return false;
        };
        indent.trim().is_empty()
            && want.iter().enumerate().all(|(j, w)| match have.get(i + j) {
                Some(h) if w.trim().is_empty() => h.trim().is_empty(),
                Some(h) => h.strip_prefix(indent) == Some(*w),
                None => false,
            })
    })
}

/// The repository paths a `text` block names: words with a `/` whose first component is an
/// entry of the repository root (`src/controller/`, `tests/vectors/protocol.json`,
/// `crates/agentbox-api/src/exec*.rs`).
fn named_paths(text: &str) -> Vec<String> {
    let root = repo_root();
    text.split_whitespace()
        .map(|w| w.trim_matches(|c: char| ",;:()'\"`".contains(c)))
        .map(|w| w.trim_end_matches('.'))
        .filter(|w| w.contains('/') && !w.contains("://"))
        .filter(|w| {
            let first = w.split('/').next().unwrap_or_default();
            !first.is_empty() && !first.starts_with('.') && root.join(first).exists()
        })
        .map(str::to_string)
        .collect()
}

/// Whether a repository path exists; one `*` in its last component matches any text.
fn exists(path: &str) -> bool {
    let root = repo_root();
    let path = path.trim_end_matches('/');
    let Some((head, tail)) = path.split_once('*') else {
        return root.join(path).exists();
    };
    let (dir, prefix) = head.rsplit_once('/').unwrap_or(("", head));
    std::fs::read_dir(root.join(dir)).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(prefix) && n.ends_with(tail) && n.len() >= prefix.len() + tail.len()
        })
    })
}

/// The words of one shell command line, quotes removed (enough for the docs' commands).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut started = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                started = true;
            }
            (None, c) if c.is_whitespace() => {
                if started || !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
                started = false;
            }
            (None, c) => word.push(c),
        }
    }
    if started || !word.is_empty() {
        out.push(word);
    }
    out
}

/// The simple commands of a shell block: continuation lines joined, comments dropped, split
/// at `&&`, `||` and `;`, leading `VAR=value` words and redirections removed.
fn commands(block: &str) -> Vec<Vec<String>> {
    let joined = block.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines() {
        let line = match line.find(" #") {
            Some(i) => &line[..i],
            None if line.trim_start().starts_with('#') => "",
            None => line,
        };
        for part in line
            .split("&&")
            .flat_map(|p| p.split("||"))
            .flat_map(|p| p.split(';'))
        {
            let mut w = words(part);
            if let Some(i) = w.iter().position(|x| x.starts_with('>')) {
                w.truncate(i);
            }
            let skip = w
                .iter()
                .take_while(|x| x.contains('=') && !x.starts_with('-'))
                .count();
            let w: Vec<String> = w.into_iter().skip(skip).collect();
            if !w.is_empty() {
                out.push(w);
            }
        }
    }
    out
}

/// The `[[bin]]`/`[[bench]]` targets Cargo.toml declares under `section`.
/// The targets of one `section` (`[[bin]]`, `[[bench]]`) in the manifest of the package at
/// `path`, or of every package of the workspace (what `cargo run --bin` finds) without one.
fn cargo_targets(section: &str, path: Option<&str>) -> Vec<String> {
    let packages = match path {
        Some(p) => vec![p],
        None => vec![".", "crates/agentbox-api", "crates/agentbox-client"],
    };
    packages
        .into_iter()
        .flat_map(|p| {
            let manifest = repo_root().join(p).join("Cargo.toml");
            let toml = std::fs::read_to_string(&manifest).unwrap_or_default();
            toml.split(section)
                .skip(1)
                .filter_map(|s| {
                    s.lines()
                        .find_map(|l| l.trim().strip_prefix("name = "))
                        .map(|n| n.trim_matches('"').to_string())
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Checks one command of a block that is not run against what it names; Err says why not.
fn check_not_run(cmd: &[String], built: &mut Vec<String>) -> Result<(), String> {
    let root = repo_root();
    let arg = |flag: &str| {
        cmd.iter()
            .position(|w| w == flag)
            .and_then(|i| cmd.get(i + 1))
            .cloned()
    };
    let program = cmd[0].as_str();
    match program {
        p if p.starts_with("hack/") => {
            let script = std::fs::read_to_string(root.join(p)).map_err(|e| format!("{p}: {e}"))?;
            if let Some(sub) = cmd.get(1).filter(|s| !s.starts_with('-')) {
                let handled = script.lines().any(|l| {
                    l.trim()
                        .split_once(')')
                        .is_some_and(|(pat, _)| pat.split('|').any(|alt| alt.trim() == sub))
                });
                if !handled {
                    return Err(format!("{p} has no subcommand {sub}"));
                }
            }
            for flag in cmd.iter().filter(|w| w.starts_with("--")) {
                if !script.contains(flag.as_str()) {
                    return Err(format!("{p} knows no {flag}"));
                }
            }
            Ok(())
        }
        "helm" if matches!(cmd.get(1).map(String::as_str), Some("install" | "upgrade")) => {
            // The same chart and values, rendered: what the API would be sent.
            let mut args: Vec<&str> = Vec::new();
            let mut rest = cmd[2..].iter();
            while let Some(w) = rest.next() {
                match w.as_str() {
                    "--create-namespace"
                    | "--wait"
                    | "--reset-then-reuse-values"
                    | "--reuse-values"
                    | "--take-ownership"
                    | "--install" => {}
                    "--timeout" => {
                        rest.next();
                    }
                    w => args.push(w),
                }
            }
            let out = Command::new(common::helm_bin())
                .arg("template")
                .args(&args)
                .args(["--kube-version", common::CHART_KUBE_VERSION])
                .current_dir(&root)
                .output()
                .map_err(|e| format!("helm: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "helm template {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                ))
            }
        }
        "docker" => match cmd.get(1).map(String::as_str) {
            Some("build") => {
                let context = cmd.last().filter(|c| !c.starts_with('-')).cloned();
                let file = arg("-f").unwrap_or_else(|| {
                    format!("{}/Dockerfile", context.unwrap_or_else(|| ".".into()))
                });
                if !root.join(&file).is_file() {
                    return Err(format!("no {file}"));
                }
                built.extend(arg("-t"));
                Ok(())
            }
            Some("push") if cmd.get(2).is_some_and(|t| built.contains(t)) => Ok(()),
            _ => Err("docker: only `build`, and `push` of what was built".into()),
        },
        "cargo" => {
            let (flag, section) = if cmd.get(1).map(String::as_str) == Some("bench") {
                ("--bench", "[[bench]]")
            } else {
                ("--bin", "[[bin]]")
            };
            let targets = cargo_targets(section, arg("--path").as_deref());
            let named: Vec<&String> = cmd
                .iter()
                .enumerate()
                .filter(|(i, _)| *i > 0 && cmd[i - 1] == flag)
                .map(|(_, w)| w)
                .collect();
            if named.is_empty() {
                return Err(format!("cargo without {flag}"));
            }
            match named.iter().find(|n| !targets.contains(n)) {
                Some(n) => Err(format!("no crate of the workspace has {flag} {n}")),
                None => Ok(()),
            }
        }
        // A namespace annotation the operator reads, set as documented.
        "kubectl" if cmd.get(1).map(String::as_str) == Some("annotate") => {
            let known = [
                agentbox_operator::controller::runtime::REQUIRED_RUNTIME_CLASS,
                agentbox_operator::controller::restore_source::ALLOW_CROSS_SCOPE,
            ];
            match (cmd.get(2).map(String::as_str), cmd.get(4)) {
                (Some("namespace"), Some(kv))
                    if cmd.len() == 5
                        && kv
                            .split_once('=')
                            .is_some_and(|(k, v)| known.contains(&k) && !v.is_empty()) =>
                {
                    Ok(())
                }
                _ => Err(format!(
                    "kubectl annotate: only `kubectl annotate namespace NAME KEY=VALUE` with one of {known:?}"
                )),
            }
        }
        "cp" => match cmd.get(1) {
            Some(src) if root.join(src).exists() => Ok(()),
            src => Err(format!("cp: no {src:?}")),
        },
        "pip" if cmd.get(1).map(String::as_str) == Some("install") => {
            let spec = cmd.get(2).ok_or("pip install what?")?;
            let (path, extras) = match spec.split_once('[') {
                Some((p, e)) => (p, e.trim_end_matches(']')),
                None => (spec.as_str(), ""),
            };
            let pyproject = std::fs::read_to_string(root.join(path).join("pyproject.toml"))
                .map_err(|e| format!("{path}/pyproject.toml: {e}"))?;
            match extras
                .split(',')
                .filter(|e| !e.is_empty())
                .find(|e| !pyproject.contains(&format!("\n{e} = ")))
            {
                Some(e) => Err(format!("{path} has no extra {e}")),
                None => Ok(()),
            }
        }
        p => Err(format!(
            "no check for `{p}` in a block that is not run: run it, or teach this test to check it"
        )),
    }
}

#[test]
fn blocks_and_snippets_are_found() {
    let text = "x\n<!-- not run: it would -->\n```sh\nkubectl apply -f - <<'YAML'\nb: 2\nYAML\nls\n```\n\
                ```yaml\na: 1\n```\n<!-- excerpt of tests/readme.rs -->\n\n```rust\nfn f() {}\n```\n";
    let b = blocks("d.md", text);
    let got: Vec<(&str, &str, &Option<Directive>)> = b
        .iter()
        .map(|b| (b.at.as_str(), b.lang.as_str(), &b.directive))
        .collect();
    assert_eq!(
        got,
        [
            ("d.md:4", "sh", &Some(Directive::NotRun)),
            ("d.md:10", "yaml", &None),
            (
                "d.md:15",
                "rust",
                &Some(Directive::Excerpt("tests/readme.rs".into()))
            ),
        ]
    );
    let s: Vec<(String, String)> = yaml_snippets(&b)
        .into_iter()
        .map(|s| (s.at, s.text))
        .collect();
    assert_eq!(
        s,
        [
            ("d.md:5".to_string(), "b: 2\n".to_string()),
            ("d.md:10".to_string(), "a: 1\n".to_string())
        ]
    );
    assert_eq!(
        commands("A=1 hack/x up --n 2 # why\nfoo 'a b' > f && bar \\\n  baz; qux\n"),
        [
            vec!["hack/x", "up", "--n", "2"],
            vec!["foo", "a b"],
            vec!["bar", "baz"],
            vec!["qux"]
        ]
    );
    assert!(is_excerpt("b\n  c\n", "a\n    b\n      c\nd\n"));
    assert!(!is_excerpt("b\nc\n", "a\n    b\n  c\n"));
    assert_eq!(
        named_paths(
            "crates/agentbox-api/src/crd/ x/y pods/exec `tests/readme.rs`, crates/agentbox-api/src/exec*.rs."
        ),
        [
            "crates/agentbox-api/src/crd/",
            "tests/readme.rs",
            "crates/agentbox-api/src/exec*.rs"
        ]
    );
    assert!(exists("crates/agentbox-api/src/exec*.rs") && !exists("src/nothing*.rs"));
}

/// What can be checked without a cluster: every block is of a kind some test checks, every
/// excerpt is in its file, every path a text block names exists, and every command of a block
/// that is not run names what exists.
#[test]
#[ignore = "needs a cluster"]
fn every_block_is_checked_by_some_test() {
    let blocks = all_blocks();
    let mut excerpts = 0;
    let mut not_run = 0;
    for b in &blocks {
        match (&b.directive, b.lang.as_str()) {
            (Some(Directive::Excerpt(path)), _) => {
                let file = std::fs::read_to_string(repo_root().join(path))
                    .unwrap_or_else(|e| panic!("{}: excerpt of {path}: {e}", b.at));
                assert!(
                    is_excerpt(&b.text, &file),
                    "{}: not an excerpt of {path} (the same lines, at one indentation):\n{}",
                    b.at,
                    b.text
                );
                excerpts += 1;
            }
            (Some(Directive::NotRun), "sh") => {
                let script = std::env::temp_dir().join(format!("readme-{}.sh", common::suffix()));
                std::fs::write(&script, &b.text).expect("write the block");
                let syntax = Command::new("bash").arg("-n").arg(&script).output();
                let _ = std::fs::remove_file(&script);
                let syntax = syntax.expect("bash -n");
                assert!(
                    syntax.status.success(),
                    "{}: {}",
                    b.at,
                    String::from_utf8_lossy(&syntax.stderr)
                );
                let mut built = Vec::new();
                for cmd in commands(&b.text) {
                    if let Err(e) = check_not_run(&cmd, &mut built) {
                        panic!("{}: `{}`: {e}", b.at, cmd.join(" "));
                    }
                }
                not_run += 1;
            }
            (Some(Directive::NotRun), lang) => {
                panic!("{}: only sh blocks can be left unrun, not {lang:?}", b.at)
            }
            (None, "yaml" | "sh" | "console" | "python") => {}
            (None, "text") => {
                for p in named_paths(&b.text) {
                    assert!(exists(&p), "{}: names {p}, which is not there", b.at);
                }
            }
            (None, "") => panic!(
                "{}: a block without a language: `text` for diagrams and layouts, else its language",
                b.at
            ),
            (None, lang) => panic!(
                "{}: a {lang} block must be an excerpt of the compiled file that holds it: \
                 put <!-- excerpt of PATH --> on the line above",
                b.at
            ),
        }
    }
    assert!(
        excerpts >= 3 && not_run >= 3,
        "{excerpts} excerpts, {not_run} not run"
    );
    // The README's Rust is this file's module, compiled and run.
    assert!(blocks.iter().any(|b| b.at.starts_with("README.md")
        && b.lang == "rust"
        && b.directive == Some(Directive::Excerpt("tests/readme.rs".into()))));
}

/// The directory an `sh` block runs in: the saved object snippets, the repository's
/// directories, the binaries, a kubeconfig of the test's namespace.
struct Shell {
    dir: PathBuf,
    path: String,
    kubeconfig: PathBuf,
    ns: String,
}

impl Shell {
    fn new(ns: &str, objects: &[(&Snippet, (String, String))]) -> Shell {
        let dir = std::env::temp_dir().join(format!("readme-run-{ns}"));
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("the run directory");
        let root = repo_root();
        for d in ["examples", "crds", "charts", "hack", "python"] {
            std::os::unix::fs::symlink(root.join(d), dir.join(d)).expect("link a directory");
        }
        for (name, target) in [
            (
                "agentbox",
                common::cli_bin("agentbox").display().to_string(),
            ),
            (
                "kubectl-agentbox",
                common::cli_bin("kubectl-agentbox").display().to_string(),
            ),
            ("kubectl", which(&common::kubectl_bin())),
        ] {
            std::os::unix::fs::symlink(target, bin.join(name)).expect("link a binary");
        }
        for (s, (_, name)) in objects {
            let file = dir.join(format!("{name}.yaml"));
            if !file.exists() {
                std::fs::write(file, &s.text).expect("save a snippet");
            }
        }
        let (ok, config, err) = kubectl(&["config", "view", "--raw", "--minify", "--flatten"], "");
        assert!(ok, "{err}");
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(&kubeconfig, config).expect("write the kubeconfig");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let shell = Shell {
            dir,
            path,
            kubeconfig,
            ns: ns.to_string(),
        };
        let (code, _, err) = shell.run(&format!(
            "kubectl config set-context --current --namespace {ns} >/dev/null"
        ));
        assert_eq!(code, Some(0), "{err}");
        shell
    }

    /// Runs `script` with bash (-euo pipefail), the docs' example namespace being the test's.
    fn run(&self, script: &str) -> (Option<i32>, String, String) {
        let mut cmd = Command::new("timeout");
        cmd.args(["600", "bash", "-euo", "pipefail", "-c"])
            .arg(script.replace("team-a", &self.ns))
            .current_dir(&self.dir)
            .env("PATH", &self.path)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("AGENTBOX_NAMESPACE")
            .env_remove("KUBECTL");
        common::output(cmd)
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A program's path: itself when it has a `/`, else found on the PATH.
fn which(program: &str) -> String {
    if program.contains('/') {
        return program.to_string();
    }
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| panic!("{program} is not on the PATH"))
}

/// A console transcript: each `$ ` command and the lines it prints.
fn transcript(text: &str) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for line in text.lines() {
        match line.strip_prefix("$ ") {
            Some(cmd) => out.push((cmd.to_string(), Vec::new())),
            None => out
                .last_mut()
                .expect("a transcript starts with `$ `")
                .1
                .push(line.trim_end().to_string()),
        }
    }
    out
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn every_snippet_applies_runs_and_prints_what_it_says() {
    let blocks = all_blocks();
    let all = yaml_snippets(&blocks);
    let mut objects = Vec::new();
    for s in &all {
        match object_of(s) {
            Some(o) => objects.push((s, o)),
            None => check_values(s),
        }
    }
    let mut names: Vec<&(String, String)> = objects.iter().map(|(_, o)| o).collect();
    names.sort();
    let count = names.len();
    names.dedup();
    assert_eq!(count, names.len(), "two snippets make the same object");
    let kinds: Vec<&str> = objects.iter().map(|(_, (k, _))| k.as_str()).collect();
    assert!(
        [
            "Sandbox",
            "SandboxSnapshot",
            "SandboxTemplate",
            "SandboxPool"
        ]
        .iter()
        .all(|k| kinds.contains(k)),
        "the docs show a Sandbox, a SandboxSnapshot, a SandboxTemplate and a SandboxPool: {kinds:?}"
    );

    let mut env = TestEnv::new("readme").await;
    let store = format!("/var/lib/agentbox/test-snapshots/{}", env.ns);
    env.start_operator(&["--store-url", &format!("file://{store}")]);
    let ns = env.ns.clone();

    // Admission first: every object as kubectl would send it, without creating anything.
    for (s, (kind, name)) in &objects {
        for mode in [
            &["apply"][..],
            &["apply", "--server-side"][..],
            &["create"][..],
        ] {
            let mut args = mode.to_vec();
            args.extend(["--dry-run=server", "-n", &ns, "-f", "-"]);
            let (ok, _, err) = kubectl(&args, &s.text);
            assert!(ok, "{} ({kind} {name}), kubectl {mode:?}: {err}", s.at);
        }
    }
    // Then for real, in document order, each waited on with `kubectl wait`.
    for (s, (kind, name)) in &objects {
        let (ok, _, err) = kubectl(&["apply", "-n", &ns, "-f", "-"], &s.text);
        assert!(ok, "{} ({kind} {name}): {err}", s.at);
    }
    // A template has no state to wait for; the Sandbox made from it waits on it.
    for (s, (kind, name)) in objects.iter().filter(|(_, (k, _))| k != "SandboxTemplate") {
        let obj = format!("{}/{name}", kind.to_lowercase());
        let (ok, out, err) = kubectl(
            &[
                "wait",
                "-n",
                &ns,
                "--for=condition=Ready",
                "--timeout=300s",
                &obj,
            ],
            "",
        );
        assert!(
            ok,
            "{}: kubectl wait --for=condition=Ready {obj}: {out}{err}\n{}",
            s.at,
            env.operator_logs()
        );
    }
    // A snapshot keeps its Committed condition beside Ready.
    for (_, (kind, name)) in objects.iter().filter(|(_, (k, _))| k == "SandboxSnapshot") {
        let (ok, out, err) = kubectl(
            &[
                "get",
                "-n",
                &ns,
                &format!("{}/{name}", kind.to_lowercase()),
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Committed\")].status}",
            ],
            "",
        );
        assert!(ok && out == "True", "{name}: Committed {out:?} {err}");
    }
    // `kubectl get agentbox` lists every object of every kind (the category), and the REASON
    // column shows the Ready condition's reason. (The CRDs applied once more and a fresh
    // discovery cache: other tests on a shared cluster may have applied older CRDs meanwhile.)
    common::ensure_crds(&env.client).await;
    let cache = std::env::temp_dir().join(format!("readme-kubectl-cache-{ns}"));
    let cache_dir = format!("--cache-dir={}", cache.display());
    let (ok, out, err) = kubectl(
        &["get", "agentbox", "-n", &ns, "-o", "name", &cache_dir],
        "",
    );
    let _ = std::fs::remove_dir_all(&cache);
    assert!(ok, "{err}");
    for (_, (kind, name)) in &objects {
        let want = format!("{}.agentbox.dev/{name}", kind.to_lowercase());
        assert!(out.lines().any(|l| l == want), "{want} not in {out}");
    }
    let (ok, out, err) = kubectl(&["get", "sbxsnap", "-n", &ns], "");
    assert!(ok, "{err}");
    let header: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert!(header.contains(&"REASON"), "{out}");
    assert!(
        out.lines().skip(1).all(|l| l.contains(" Committed ")),
        "every snapshot Ready, reason Committed:\n{out}"
    );

    // The README's Rust, with a client of the test's namespace.
    let mut config = kube::Config::infer().await.expect("a kubeconfig");
    config.default_namespace = ns.clone();
    let client = kube::Client::try_from(config).expect("a client");
    if let Err(e) = readme_rust::turn(client).await {
        panic!("README.md's Rust: {e}\n{}", env.operator_logs());
    }

    // The shell blocks and transcripts, in document order.
    let shell = Shell::new(&ns, &objects);
    let mut ran = 0;
    for b in blocks.iter().filter(|b| b.directive.is_none()) {
        match b.lang.as_str() {
            "sh" => {
                let (code, out, err) = shell.run(&b.text);
                assert_eq!(
                    code,
                    Some(0),
                    "{}:\n{}\nstdout:\n{out}\nstderr:\n{err}\n{}",
                    b.at,
                    b.text,
                    env.operator_logs()
                );
                ran += 1;
            }
            "console" => {
                for (cmd, want) in transcript(&b.text) {
                    let (code, out, err) = shell.run(&cmd);
                    assert_eq!(code, Some(0), "{}: $ {cmd}\n{out}{err}", b.at);
                    let got: Vec<&str> = out.lines().map(str::trim_end).collect();
                    assert_eq!(got, want, "{}: $ {cmd} printed otherwise", b.at);
                }
                ran += 1;
            }
            _ => {}
        }
    }
    assert!(ran >= 6, "{ran} blocks ran");
    drop(shell);

    common::delete_snapshots(&env).await;
    env.finish().await;
    let _ = std::fs::remove_dir_all(&store);
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn duplicate_keys_are_refused_at_admission_naming_the_duplicate() {
    let env = TestEnv::new("dupkeys").await;
    let sandbox = |spec: &str| {
        format!(
            "apiVersion: agentbox.dev/v1alpha1\nkind: Sandbox\nmetadata: {{name: dup}}\n\
             spec:\n  image: {}\n  scope: {{kind: Global}}\n{spec}",
            common::BASE_IMAGE
        )
    };
    for (spec, message) in [
        (
            "  workspace:\n    files: [{path: a, content: one}, {path: a, content: two}]\n",
            "file paths must be unique: a appears more than once",
        ),
        (
            "  workspace:\n    projections: [{configMap: c, path: skills}, {configMap: d, path: skills}]\n",
            "projection paths must be unique: skills appears more than once",
        ),
        (
            "  workspace:\n    mounts: [{path: data, hostPath: /srv/a}, {path: data, hostPath: /srv/b}]\n",
            "mount paths must be unique: data appears more than once",
        ),
        (
            "  env: [{name: MODE, value: a}, {name: LEVEL, value: b}, {name: MODE, value: c}]\n",
            "env names must be unique: MODE appears more than once",
        ),
    ] {
        let text = sandbox(spec);
        for mode in [&["apply"][..], &["apply", "--server-side"][..]] {
            let mut args = mode.to_vec();
            args.extend(["--dry-run=server", "-n", &env.ns, "-f", "-"]);
            let (ok, _, err) = kubectl(&args, &text);
            assert!(!ok, "accepted: {text}");
            assert!(err.contains(message), "kubectl {mode:?}: {err}\n{text}");
        }
    }
    // The same lists without the duplicate are accepted.
    let text = sandbox(
        "  env: [{name: MODE, value: a}, {name: LEVEL, value: b}]\n  workspace:\n    \
         files: [{path: a, content: one}, {path: b, content: two}]\n",
    );
    let (ok, _, err) = kubectl(
        &["apply", "--dry-run=server", "-n", &env.ns, "-f", "-"],
        &text,
    );
    assert!(ok, "{err}");
    env.finish().await;
}
