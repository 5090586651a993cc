//! README.md against the real local cluster: every YAML snippet in it (fenced `yaml` blocks and
//! `<<'YAML'` here-documents of `sh` blocks) is accepted by the API server (a server-side dry
//! run, client- and server-side apply) and then applied for real with an operator watching, and
//! `kubectl wait --for=condition=Ready` returns for every object it made, of each kind. A spec
//! with a duplicate key in any keyed list is refused at admission, naming the duplicate.

mod common;

use common::{TestEnv, kubectl, repo_root};

/// A YAML snippet of the README and the line it starts on.
struct Snippet {
    line: usize,
    text: String,
}

/// Every YAML snippet of the README: the body of each fenced `yaml` block, and of each
/// here-document ending in a line `YAML` inside other fenced blocks.
fn snippets(readme: &str) -> Vec<Snippet> {
    let mut out = Vec::new();
    let mut lines = readme.lines().enumerate();
    while let Some((i, l)) = lines.next() {
        let Some(lang) = l.trim_start().strip_prefix("```") else {
            continue;
        };
        if lang.trim() == "yaml" {
            let body: Vec<&str> = lines
                .by_ref()
                .map(|(_, l)| l)
                .take_while(|l| !l.trim_start().starts_with("```"))
                .collect();
            out.push(Snippet {
                line: i + 2,
                text: body.join("\n") + "\n",
            });
            continue;
        }
        // Another fenced block: look for here-documents of YAML in it.
        let mut heredoc: Option<(usize, Vec<&str>)> = None;
        for (j, l) in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                break;
            }
            match &mut heredoc {
                Some((start, body)) if l.trim() == "YAML" => {
                    out.push(Snippet {
                        line: *start,
                        text: body.join("\n") + "\n",
                    });
                    heredoc = None;
                }
                Some((_, body)) => body.push(l),
                None if l.contains("<<'YAML'") => heredoc = Some((j + 2, Vec::new())),
                None => {}
            }
        }
        assert!(
            heredoc.is_none(),
            "README.md:{}: unterminated YAML here-document",
            i + 1
        );
    }
    out
}

/// (kind, name) of a Kubernetes object snippet; None for other YAML (Helm values).
fn object_of(s: &Snippet) -> Option<(String, String)> {
    let v: serde_yaml::Value = serde_yaml::from_str(&s.text)
        .unwrap_or_else(|e| panic!("README.md:{}: not YAML: {e}\n{}", s.line, s.text));
    let kind = v.get("kind")?.as_str()?.to_string();
    let name = v["metadata"]["name"]
        .as_str()
        .unwrap_or_else(|| panic!("README.md:{}: {kind} without metadata.name", s.line))
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
            "README.md:{}: neither an object nor values the chart accepts: {e}\n{}",
            s.line, s.text
        );
    }
}

#[test]
fn snippets_are_found() {
    let text = "x\n```yaml\na: 1\n```\n```sh\nkubectl apply -f - <<'YAML'\nb: 2\nYAML\nls\n```\n";
    let got: Vec<(usize, String)> = snippets(text)
        .into_iter()
        .map(|s| (s.line, s.text))
        .collect();
    assert_eq!(got, [(3, "a: 1\n".to_string()), (7, "b: 2\n".to_string())]);
}

#[tokio::test]
async fn every_readme_yaml_snippet_applies_and_kubectl_waits_on_ready() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).expect("README.md");
    let all = snippets(&readme);
    let mut objects = Vec::new();
    for s in &all {
        match object_of(s) {
            Some(o) => objects.push((s, o)),
            None => check_values(s),
        }
    }
    let kinds: Vec<&str> = objects.iter().map(|(_, (k, _))| k.as_str()).collect();
    assert!(
        kinds.contains(&"Sandbox")
            && kinds.contains(&"SandboxSnapshot")
            && kinds.contains(&"SandboxTemplate")
            && kinds.contains(&"SandboxPool"),
        "the README shows a Sandbox, a SandboxSnapshot, a SandboxTemplate and a SandboxPool: {kinds:?}"
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
            assert!(
                ok,
                "README.md:{} ({kind} {name}), kubectl {mode:?}: {err}",
                s.line
            );
        }
    }
    // Then for real, in README order, each waited on with `kubectl wait`.
    for (s, (kind, name)) in &objects {
        let (ok, _, err) = kubectl(&["apply", "-n", &ns, "-f", "-"], &s.text);
        assert!(ok, "README.md:{} ({kind} {name}): {err}", s.line);
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
            "README.md:{}: kubectl wait --for=condition=Ready {obj}: {out}{err}\n{}",
            s.line,
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

    common::delete_snapshots(&env).await;
    env.finish().await;
    let _ = std::fs::remove_dir_all(&store);
}

#[tokio::test]
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
