//! `agentbox_client::client` and the `agentbox` CLI against the real local cluster, with the operator
//! running: get-or-create races, waiting for Ready (and failing fast), exec and files through
//! the handle, the scope guard's fencing tokens, and the CLI's exit codes and lookups.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agentbox_api::crd::{
    DeletionPolicy, Sandbox, SandboxPhase, SandboxSnapshot, SandboxSpec, Scope, ScopeKind,
};
use agentbox_api::exec::ExecRequest;
use agentbox_api::guard::GuardConfig;
use agentbox_client::client::{ClientError, EntryKind, Sandboxes};
use common::{TestEnv, cli, output};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams};
use serde_json::json;

fn scope(agent: &str, user: &str) -> Scope {
    Scope {
        kind: ScopeKind::User,
        agent: Some(agent.into()),
        user: Some(user.into()),
        session: None,
    }
}

fn template(scope: &Scope, extra: serde_json::Value) -> SandboxSpec {
    let mut spec = json!({
        "image": common::BASE_IMAGE,
        "imagePullPolicy": "Never",
        "scope": scope,
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(spec).expect("sandbox spec")
}

/// A table's (or any text's) lines split into their whitespace-separated cells.
fn cells(out: &str) -> Vec<Vec<String>> {
    out.lines()
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

/// Runs the shell command `line` on a pseudo-terminal (script(1)), `stdin` typed into it:
/// (exit code, everything the terminal showed).
fn on_tty(line: &str, stdin: &str) -> (Option<i32>, String) {
    use std::io::Write;
    let mut child = Command::new("script")
        .args(["-qec", line, "/dev/null"])
        // A terminal that redraws, whatever the caller's (indicatif draws nothing for "dumb").
        .env("TERM", "xterm")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("script(1)");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).expect("write stdin");
    // Left open a little: script(1) ends the session at its stdin's EOF.
    std::thread::sleep(Duration::from_secs(3));
    drop(input);
    let out = child.wait_with_output().expect("script output");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn get_or_create_race_wait_ready_exec_files_guard_and_cli() {
    let mut env = TestEnv::new("client").await;
    env.start_operator(&[]);
    let sbxs = Sandboxes::new(env.client.clone(), env.ns.clone());
    let sc = scope("clitest", "alice");

    // Two harnesses racing for one scope get one Sandbox.
    let (a, b) = tokio::join!(
        sbxs.get_or_create(&sc, template(&sc, json!({}))),
        sbxs.get_or_create(&sc, template(&sc, json!({}))),
    );
    let (mut a, b) = (
        a.expect("first get_or_create"),
        b.expect("second get_or_create"),
    );
    assert_eq!(a.name(), b.name());
    assert_eq!(a.sandbox().metadata.uid, b.sandbox().metadata.uid);
    assert!(a.sandbox().metadata.uid.is_some());
    let all = sbxs.list(None).await.expect("list");
    assert_eq!(all.len(), 1, "one sandbox for the scope");
    assert_eq!(
        agentbox_api::labels::sandbox_name_for_scope(&sc),
        a.name(),
        "deterministic name"
    );
    // A third call after the fact returns the same object too.
    let c = sbxs
        .get_or_create(&sc, template(&sc, json!({})))
        .await
        .expect("third get_or_create");
    assert_eq!(c.sandbox().metadata.uid, a.sandbox().metadata.uid);

    a.wait_ready(Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("wait_ready: {e}\n{}", env.operator_logs()));
    assert_eq!(a.phase(), Some(SandboxPhase::Ready));
    let name = a.name().to_string();

    // Exec runs in the workspace root by default.
    let out = a
        .exec(ExecRequest::shell("pwd; echo err >&2; exit 3").timeout(Duration::from_secs(30)))
        .await
        .expect("exec");
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(out.stdout_str().trim(), a.workspace_root());
    assert_eq!(out.stderr_str().trim(), "err");

    // Files: write (creating parents), read back, list.
    a.write_file("notes/deep/todo.txt", "ship it\n")
        .await
        .expect("write_file");
    assert_eq!(
        a.read_file("notes/deep/todo.txt").await.expect("read_file"),
        b"ship it\n"
    );
    let bin: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    a.write_file("blob.bin", bin.clone()).await.expect("write");
    assert_eq!(a.read_file("blob.bin").await.expect("read"), bin);
    let listing = a.list_dir("notes").await.expect("list_dir");
    assert!(
        listing
            .iter()
            .any(|e| e.name == "deep" && e.kind == EntryKind::Dir),
        "{listing:?}"
    );
    let deep = a.list_dir("notes/deep").await.expect("list_dir deep");
    let todo = deep.iter().find(|e| e.name == "todo.txt").expect("todo");
    assert_eq!((todo.kind, todo.size), (EntryKind::File, 8));
    // The file is where a plain exec in the workspace sees it.
    let cat = a
        .exec(ExecRequest::argv(["cat", "notes/deep/todo.txt"]))
        .await
        .expect("cat");
    assert_eq!(cat.stdout_str(), "ship it\n");
    assert!(matches!(
        a.read_file("../etc/passwd").await,
        Err(ClientError::Path(_))
    ));

    // The guard's fencing token increases with each holder.
    let cfg = GuardConfig::with_duration(Duration::from_secs(5));
    let g1 = a
        .guard_with(&cfg, Some(Duration::from_secs(60)))
        .await
        .expect("guard 1");
    let t1 = g1.token();
    let inside = g1
        .run(a.exec(ExecRequest::argv(["true"])))
        .await
        .expect("guard held");
    assert!(inside.expect("exec under guard").success());
    g1.release().await.expect("release 1");
    let g2 = b
        .guard_with(&cfg, Some(Duration::from_secs(60)))
        .await
        .expect("guard 2");
    let t2 = g2.token();
    g2.release().await.expect("release 2");
    let g3 = a
        .guard_with(&cfg, Some(Duration::from_secs(60)))
        .await
        .expect("guard 3");
    let t3 = g3.token();
    g3.release().await.expect("release 3");
    assert!(t1 < t2 && t2 < t3, "fencing tokens {t1} < {t2} < {t3}");

    // The CLI: exit codes pass through.
    let (code, _, err) = cli(&env, &["exec", &name, "--", "sh", "-c", "exit 42"]);
    assert_eq!(code, Some(42), "{err}");
    let (code, out, err) = cli(&env, &["exec", &name, "--", "cat", "notes/deep/todo.txt"]);
    assert_eq!((code, out.as_str()), (Some(0), "ship it\n"), "{err}");
    // By scope flags instead of the name.
    let (code, out, err) = cli(
        &env,
        &["exec", "--agent", "clitest", "--user", "alice", "--", "pwd"],
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim(), a.workspace_root());
    let (code, _, err) = cli(&env, &["exec", "--lock", &name, "--", "true"]);
    assert_eq!(code, Some(0), "{err}");
    // `exec -i` ends when the command does, its local stdin still open (a terminal nobody
    // types into, a pipe whose writer lives on): it does not wait for that stdin's EOF.
    let mut child = Command::new(common::cli_bin("agentbox"))
        .args(["-n", &env.ns, "exec", "-i", &name, "--", "echo", "done"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the CLI");
    let held_open = child.stdin.take();
    // A bound on the wait, so that a CLI that hangs fails the test instead of holding it.
    let bound = Instant::now() + Duration::from_secs(120);
    let exited = loop {
        if let Some(status) = child.try_wait().expect("wait for the CLI") {
            break Some(status);
        }
        if Instant::now() > bound {
            child.kill().expect("kill the CLI");
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    drop(held_open);
    let out = child.wait_with_output().expect("the CLI's output");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        exited.is_some_and(|s| s.success()),
        "exec -i with its stdin open: {exited:?} {stdout:?} {stderr}"
    );
    assert_eq!(stdout, "done\n", "{stderr}");

    // get / list find it (the Sandbox carries its scope labels).
    let (code, out, err) = cli(&env, &["get", &name]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(&name) && out.contains("Ready"), "{out}");
    let (code, out, err) = cli(&env, &["list", "--agent", "clitest"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(&name), "list --agent: {out}");
    let (code, out, err) = cli(&env, &["list", "--agent", "someone-else"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains(&name), "list --agent other: {out}");

    // An error is one line on stderr with a non-zero exit.
    let (code, out, err) = cli(&env, &["exec", "no-such-sandbox", "--", "true"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(
        err.starts_with("agentbox: ") && err.contains("no-such-sandbox"),
        "{err}"
    );
    let (code, _, err) = cli(&env, &["get", "no-such-sandbox"]);
    assert_eq!(code, Some(1));
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");

    // Deleted, it goes (the operator's cleanup, then its finalizer off).
    a.delete(Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("delete: {e}\n{}", env.operator_logs()));
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn wait_ready_fails_fast_with_the_condition_reason() {
    let mut env = TestEnv::new("client-fail").await;
    env.start_operator(&[]);
    let sbxs = Sandboxes::new(env.client.clone(), env.ns.clone());
    let sc = scope("clitest", "bob");
    // A host mount outside the operator's allowed prefixes: admitted, then refused (Failed).
    let spec = template(
        &sc,
        json!({"workspace": {"mounts": [{"path": "data", "hostPath": "/etc"}]}}),
    );
    let mut h = sbxs.get_or_create(&sc, spec).await.expect("create");
    let started = Instant::now();
    let err = h
        .wait_ready(Duration::from_secs(120))
        .await
        .expect_err("cannot become Ready");
    let took = started.elapsed();
    match &err {
        ClientError::Failed {
            name,
            reason,
            message,
        } => {
            assert_eq!(name, h.name());
            assert_eq!(reason, "InvalidSpec", "{message}");
            assert!(message.contains("/etc"), "{message}");
        }
        other => panic!("expected Failed, got {other}"),
    }
    assert!(took < Duration::from_secs(30), "failed fast: {took:?}");
    // Open by name sees the same, and a missing sandbox is NotFound.
    let mut again = sbxs.open(h.name()).await.expect("open");
    assert!(matches!(
        again.wait_ready(Duration::from_secs(5)).await,
        Err(ClientError::Failed { .. })
    ));
    assert!(matches!(
        sbxs.open("nope").await,
        Err(ClientError::NotFound(_))
    ));
    // A sandbox still starting, with a tiny timeout: NotReady, not Failed.
    let sc2 = scope("clitest", "carol");
    let mut slow = sbxs
        .get_or_create(&sc2, template(&sc2, json!({})))
        .await
        .expect("create");
    match slow.wait_ready(Duration::from_millis(1)).await {
        Err(ClientError::NotReady { .. }) => {}
        Err(other) => panic!("expected NotReady, got {other}"),
        Ok(()) => panic!("Ready within a millisecond"),
    }
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn cli_snapshot_and_restore_into_a_new_sandbox() {
    let mut env = TestEnv::new("client-snap").await;
    // A file store on the node's host (the test operator runs there).
    let dir = format!("/var/lib/agentbox/test-snapshots/{}", env.ns);
    env.start_operator(&[
        "--store-url",
        &format!("file://{dir}"),
        "--store-prefix",
        "snaps",
    ]);
    let sbxs = Sandboxes::new(env.client.clone(), env.ns.clone());
    let sc = scope("clitest", "dave");
    let mut h = sbxs
        .get_or_create(&sc, template(&sc, json!({"snapshot": {"restore": "None"}})))
        .await
        .expect("create");
    h.wait_ready(Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("wait_ready: {e}\n{}", env.operator_logs()));
    h.write_file("work/result.txt", "42\n")
        .await
        .expect("write");
    let name = h.name().to_string();

    let (code, out, err) = cli(&env, &["snapshot", &name, "--as", "s1", "--wait"]);
    assert_eq!(code, Some(0), "{out}{err}\n{}", env.operator_logs());
    let row = out.lines().nth(1).unwrap_or_default().to_string();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols.first(), Some(&"s1"), "{out}");
    let snap = sbxs.get_snapshot("s1").await.expect("snapshot");
    let st = snap.status.clone().expect("status");
    assert_eq!(cols.get(1).copied(), st.sha256.as_deref(), "{out}");
    assert_eq!(
        cols.get(2).and_then(|b| b.parse::<i64>().ok()),
        st.size_bytes,
        "{out}"
    );
    // On a terminal, the phase is shown while it waits; the table follows.
    let (code, shown) = on_tty(
        &format!(
            "{} -n {} snapshot {name} --as s2 --wait",
            common::cli_bin("agentbox").display(),
            env.ns
        ),
        "",
    );
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains("snapshot s2: "), "phase shown: {shown:?}");
    assert!(
        shown.lines().any(|l| l.starts_with("s2 ")),
        "table: {shown:?}"
    );
    // Without --wait it prints the generated name at once.
    let (code, out, err) = cli(&env, &["snapshot", &name]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.trim().starts_with(&format!("{name}-")), "{out}");

    // Restore into a new sandbox of the same scope under another name.
    let (code, out, err) = cli(&env, &["restore", "copy", "--from", "s1", "--wait"]);
    assert_eq!(code, Some(0), "{out}{err}\n{}", env.operator_logs());
    assert!(out.contains("copy") && out.contains("Ready"), "{out}");
    let copy = sbxs.open("copy").await.expect("open copy");
    assert_eq!(
        copy.read_file("work/result.txt")
            .await
            .expect("restored file"),
        b"42\n"
    );
    let restored_from = copy
        .sandbox()
        .status
        .as_ref()
        .and_then(|s| s.restored_from.clone());
    assert_eq!(restored_from.as_deref(), Some("s1"));
    // The same name again: one clear line.
    let (code, _, err) = cli(&env, &["restore", "copy", "--from", "s1"]);
    assert_eq!(code, Some(1));
    assert_eq!(err.lines().count(), 1, "{err:?}");
    // An unknown snapshot: one clear line.
    let (code, _, err) = cli(&env, &["restore", "other", "--from", "nope"]);
    assert_eq!(code, Some(1));
    assert!(err.contains("nope") && err.lines().count() == 1, "{err:?}");

    // Snapshots have finalizers the operator runs: delete them while it is still up.
    common::delete_snapshots(&env).await;
    env.finish().await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn cli_output_formats_kubeconfig_flags_and_kubectl_plugin() {
    let mut env = TestEnv::new("client-cli").await;
    env.start_operator(&[]);
    let sbxs = Sandboxes::new(env.client.clone(), env.ns.clone());
    let sc = scope("clitest", "erin");
    let mut h = sbxs
        .get_or_create(&sc, template(&sc, json!({})))
        .await
        .expect("create");
    h.wait_ready(Duration::from_secs(120))
        .await
        .unwrap_or_else(|e| panic!("wait_ready: {e}\n{}", env.operator_logs()));
    let name = h.name().to_string();
    let status = h.sandbox().status.clone().expect("status");
    let (pod, node) = (
        status.pod_name.expect("pod name"),
        status.node_name.expect("node name"),
    );

    // list -A -o json: a List holding this namespace's sandbox among all namespaces'.
    let (code, out, err) = cli(&env, &["list", "-A", "-o", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).expect("list -A -o json is JSON");
    assert_eq!(list["kind"], "List", "{out}");
    let ours: Vec<&serde_json::Value> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|i| i["metadata"]["namespace"] == env.ns.as_str())
        .collect();
    assert_eq!(ours.len(), 1, "{out}");
    assert_eq!(ours[0]["metadata"]["name"], name.as_str());
    assert_eq!(ours[0]["kind"], "Sandbox");
    assert_eq!(ours[0]["status"]["phase"], "Ready");

    // get NAME -o yaml: the object itself.
    let (code, out, err) = cli(&env, &["get", &name, "-o", "yaml"]);
    assert_eq!(code, Some(0), "{err}");
    let obj: serde_json::Value = serde_yaml::from_str(&out).expect("get -o yaml is YAML");
    assert_eq!(obj["kind"], "Sandbox", "{out}");
    assert_eq!(obj["metadata"]["name"], name.as_str());
    assert_eq!(obj["metadata"]["namespace"], env.ns.as_str());
    assert_eq!(obj["spec"]["scope"]["user"], "erin");

    // -o wide: where it runs; -A: which namespace.
    let (code, out, err) = cli(&env, &["list", "-o", "wide"]);
    assert_eq!(code, Some(0), "{err}");
    let table = cells(&out);
    assert_eq!(
        table[0],
        ["NAME", "PHASE", "SCOPE", "AGE", "POD", "NODE", "SCOPE-KEY"],
        "{out}"
    );
    assert_eq!(table.len(), 2, "one sandbox: {out}");
    let row: Vec<&str> = table[1].iter().map(String::as_str).collect();
    assert_eq!(
        [row[0], row[1], row[4], row[5]],
        [name.as_str(), "Ready", pod.as_str(), node.as_str()],
        "{out}"
    );
    let (code, out, err) = cli(&env, &["list", "-A"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.starts_with("NAMESPACE "), "{out}");
    assert!(
        cells(&out)
            .iter()
            .any(|r| r.len() > 1 && r[0] == env.ns && r[1] == name),
        "{out}"
    );

    // --kubeconfig and --context: a copy of the kubeconfig, $KUBECONFIG pointing nowhere.
    let original = std::env::var("KUBECONFIG").expect("KUBECONFIG (hack/cluster env)");
    let kubeconfig = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("{}.kubeconfig", env.ns));
    std::fs::copy(&original, &kubeconfig).expect("copy the kubeconfig");
    let context = kube::config::Kubeconfig::read_from(&kubeconfig)
        .expect("kubeconfig")
        .current_context
        .expect("a current context");
    let with_copy = |ctx: &str, args: &[&str]| {
        let mut cmd = Command::new(common::cli_bin("agentbox"));
        cmd.env("KUBECONFIG", "/nonexistent/kubeconfig")
            .args(["-n", &env.ns])
            .args([
                "--kubeconfig",
                &kubeconfig.to_string_lossy(),
                "--context",
                ctx,
            ])
            .args(args);
        output(cmd)
    };
    let (code, out, err) = with_copy(&context, &["get", &name]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(&name) && out.contains("Ready"), "{out}");
    let (code, out, err) = with_copy("no-such-context", &["get", &name]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(
        err.starts_with("agentbox: ")
            && err.contains("\"no-such-context\"")
            && err.contains(&context),
        "names the wrong context and the known one: {err}"
    );
    let _ = std::fs::remove_file(&kubeconfig);

    // Completion needs no cluster.
    let mut cmd = Command::new(common::cli_bin("agentbox"));
    cmd.env("KUBECONFIG", "/nonexistent/kubeconfig")
        .args(["completion", "bash"]);
    let (code, out, err) = output(cmd);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.contains("complete -F") && out.contains("snapshot"),
        "{out}"
    );

    // As a kubectl plugin: kubectl finds kubectl-agentbox on the PATH.
    let plugin = common::cli_bin("kubectl-agentbox");
    let dir = plugin.parent().expect("the plugin's directory");
    let path = std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("PATH");
    let kubectl_plugin = |args: &[&str]| {
        let mut cmd = Command::new(common::kubectl_bin());
        cmd.env("PATH", &path).arg("agentbox").args(args);
        output(cmd)
    };
    let (code, out, err) = kubectl_plugin(&["-n", &env.ns, "get", &name]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains(&name) && out.contains("Ready"), "{out}");
    let (code, out, err) = kubectl_plugin(&["--help"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("Usage: kubectl agentbox "), "{out}");
    for sub in ["get", "list", "snapshot", "completion"] {
        assert!(
            cells(&out)
                .iter()
                .any(|r| r.first().is_some_and(|c| c == sub)),
            "--help lists {sub}: {out}"
        );
    }

    // On a terminal (script(1) gives it a pty) cp shows the bytes copied on stderr; piped,
    // stderr stays empty.
    let src = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-up", env.ns));
    std::fs::create_dir_all(&src).expect("upload dir");
    std::fs::write(src.join("blob"), vec![7u8; 3 << 20]).expect("blob");
    let src_s = src.to_string_lossy().into_owned();
    let (code, out, err) = cli(&env, &["cp", &src_s, &format!("{name}:up")]);
    assert_eq!((code, out.as_str(), err.as_str()), (Some(0), "", ""));
    let bin = common::cli_bin("agentbox");
    let bin = bin.display();
    let (code, shown) = on_tty(&format!("{bin} -n {} cp {src_s} {name}:up2", env.ns), "");
    assert_eq!(code, Some(0), "{shown}");
    assert!(
        shown.contains(&format!("→ {name}:up2")) && shown.contains("MiB"),
        "progress on a terminal: {shown:?}"
    );
    let _ = std::fs::remove_dir_all(&src);

    // shell: the remote shell gets a TTY; the local terminal is raw meanwhile and restored
    // after (stty shows canonical mode and echo again).
    let (code, shown) = on_tty(
        &format!(
            "{bin} -n {} shell {name}; echo shell-exit=$?; stty -a",
            env.ns
        ),
        "echo in-the-$((1+1))-sandbox; exit 3\n",
    );
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains("in-the-2-sandbox"), "{shown:?}");
    assert!(shown.contains("shell-exit=3"), "{shown:?}");
    let modes: Vec<&str> = shown.split_whitespace().collect();
    assert!(
        modes.contains(&"icanon") && modes.contains(&"echo"),
        "terminal restored: {shown:?}"
    );

    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_suspended_sandbox_is_resumed_by_get_or_create_and_the_cli_suspends_and_deletes() {
    let mut env = TestEnv::new("client-suspend").await;
    env.start_operator(&[]);
    let sbxs = Sandboxes::new(env.client.clone(), env.ns.clone());
    let sc = scope("clitest", "dora");
    let mut h = sbxs
        .get_or_create(&sc, template(&sc, json!({})))
        .await
        .expect("create");
    h.wait_ready(Duration::from_secs(120)).await.expect("ready");
    h.write_file("kept.txt", &b"across a suspension"[..])
        .await
        .expect("write");

    // Through the CLI (the client's suspend underneath).
    let (code, out, err) = cli(&env, &["suspend", h.name()]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim(), format!("sandbox/{} suspended", h.name()));
    // Waiting on a suspended sandbox says so at once: with this timeout a wait that did not
    // know would end in NotReady, not Suspended.
    match h.wait_ready(Duration::from_secs(600)).await {
        Err(ClientError::Suspended(name)) => assert_eq!(name, h.name()),
        other => panic!("expected Suspended, got {other:?}"),
    }
    env.wait_for::<agentbox_api::crd::Sandbox>(h.name(), 120, common::phase_is("Suspended"))
        .await;

    // The harness's usual call brings it back, with its workspace.
    let mut again = sbxs
        .get_or_create(&sc, template(&sc, json!({})))
        .await
        .expect("get_or_create");
    assert_eq!(again.name(), h.name());
    again
        .wait_ready(Duration::from_secs(120))
        .await
        .expect("ready again");
    assert_eq!(
        again.read_file("kept.txt").await.expect("read"),
        b"across a suspension"
    );

    let (code, out, err) = cli(&env, &["delete", h.name(), "--wait", "120"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(out.trim(), format!("sandbox/{} deleted", h.name()));
    assert!(matches!(
        sbxs.open(h.name()).await,
        Err(ClientError::NotFound(_))
    ));
    // Deleting what is gone is not an error.
    again
        .delete(Duration::from_secs(5))
        .await
        .expect("delete again");
    env.finish().await;
}

/// The guard handed over (issue 29): a harness holds its scope's guard and has the operator
/// snapshot and suspend under that hold; the operator is SIGKILLed during each, and the one
/// started after it finishes the work under the same hold. The Lease never changes hands:
/// nobody could work in the scope between the harness's last command and the suspension.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_snapshot_and_a_suspension_under_a_handed_over_guard_survive_an_operator_kill() {
    let mut env = TestEnv::new("client-handoff").await;
    let (flags, _store, dir) = common::file_store(&env.ns);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    env.start_operator(&flags);
    let sbxs = Sandboxes::new(env.client.clone(), env.ns.clone());
    let sc = scope("handoff", "alice");
    let mut h = sbxs
        .get_or_create(&sc, template(&sc, json!({})))
        .await
        .expect("create");
    h.wait_ready(Duration::from_secs(120)).await.expect("ready");
    let g = h.guard(Some(Duration::from_secs(30))).await.expect("guard");
    // Enough to read that the kill comes while it streams, most of the time.
    let out = h
        .exec(ExecRequest::shell(
            "head -c 200000000 /dev/zero > big && echo last > last.txt",
        ))
        .await
        .expect("write");
    assert!(out.success(), "{}", out.stderr_str());
    let snap = h
        .snapshot_under(Some("handoff"), DeletionPolicy::Delete, &g)
        .await
        .expect("snapshot");
    let name = snap.metadata.name.clone().expect("name");
    env.wait_for::<SandboxSnapshot>(&name, 120, |s: Option<&SandboxSnapshot>| {
        s.and_then(|s| s.status.as_ref())
            .and_then(|st| st.phase)
            .is_some()
    })
    .await;
    env.operators[0].kill();
    env.start_operator(&flags);
    let done = sbxs
        .wait_snapshot(&name, Duration::from_secs(300))
        .await
        .expect("snapshot Ready after the restart");
    let st = done.status.expect("status");
    assert_eq!(st.fencing_token, Some(g.token()), "taken under the hold");

    h.suspend_under(&g, Duration::from_secs(120))
        .await
        .expect("suspended");
    assert!(!g.is_lost(), "the hold stood throughout");
    // The suspension again, with a kill between the request and the stop: resume, then
    // suspend with the operator stopped, and start it again.
    h.resume().await.expect("resume");
    h.wait_ready(Duration::from_secs(120)).await.expect("ready");
    env.operators[1].kill();
    let hold = h.hold_of(&g).expect("hold");
    env.api::<Sandbox>()
        .patch(
            h.name(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"lifecycle": {"mode": "Suspended", "guard": hold}}})),
        )
        .await
        .expect("suspend request");
    env.start_operator(&flags);
    h.wait_suspended(Duration::from_secs(120))
        .await
        .expect("suspended by the new operator");
    let lease: Lease = env.api::<Lease>().get(g.lease_name()).await.expect("lease");
    let spec = lease.spec.expect("spec");
    assert_eq!(spec.holder_identity.as_deref(), Some(g.holder()));
    assert_eq!(spec.lease_transitions.map(i64::from), Some(g.token()));
    g.release().await.expect("release: still ours");
    common::finish_with_snapshots(env, Some(&dir)).await;
}

/// An image no node has. Never pulled (`imagePullPolicy: Never`): a pull would make the node
/// look up a registry, and test traffic stays on loopback.
const MISSING_IMAGE: &str = "docker.io/library/does-not-exist:nope";

/// The reason the kubelet gives for it.
const PULL_FAILURES: [&str; 1] = ["ErrImageNeverPull"];

/// An image reference the kubelet refuses before any pull (upper case in a repository name),
/// for the CLI, whose `create` takes no pull policy.
const INVALID_IMAGE: &str = "docker.io/library/Does-Not-Exist:nope";

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_missing_image_ends_every_wait_at_its_stall_with_the_reason() {
    let mut env = TestEnv::new("client-image").await;
    // The operator's default stall grace (20 s).
    env.start_operator(&[]);
    let sbxs = Sandboxes::new(env.client.clone(), env.ns.clone());

    // The SDK: a long timeout, and the wait ends because the start stalled (Failed with the
    // kubelet's reason), not because the timeout ran out (NotReady).
    let sc = scope("missing-image", "alice");
    let spec = template(
        &sc,
        json!({"image": MISSING_IMAGE, "imagePullPolicy": "Never"}),
    );
    let mut h = sbxs.get_or_create(&sc, spec).await.expect("create");
    let started = Instant::now();
    let err = h
        .wait_ready(Duration::from_secs(300))
        .await
        .expect_err("the image cannot be pulled");
    eprintln!("the SDK's wait ended after {:?}: {err}", started.elapsed());
    match &err {
        ClientError::Failed {
            name,
            reason,
            message,
        } => {
            assert_eq!(name, h.name());
            assert!(PULL_FAILURES.contains(&reason.as_str()), "{err}");
            assert!(message.contains("does-not-exist"), "{message}");
        }
        other => panic!("expected the stall (Failed), got {other}"),
    }
    let s = h.refresh().await.expect("refresh");
    let stalled = s.stalled().expect("Stalled for the current spec");
    let ready = s
        .status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Ready"))
        .expect("Ready condition");
    assert!(
        PULL_FAILURES.contains(&stalled.reason.as_str())
            && PULL_FAILURES.contains(&ready.reason.as_str()),
        "{stalled:?} {ready:?}"
    );
    assert_eq!(
        s.status.as_ref().and_then(|st| st.phase),
        Some(SandboxPhase::Pending)
    );

    // The CLI, creating one sandbox of the invalid image and waiting `wait` seconds for it.
    let create_and_wait = |wait: &str| {
        cli(
            &env,
            &[
                "create",
                "--agent",
                "missing-image",
                "--session",
                "s1",
                "--image",
                INVALID_IMAGE,
                "--wait",
                wait,
            ],
        )
    };
    // A wait that runs out first names the reason the sandbox gave last ...
    let (code, out, err) = create_and_wait("10");
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(
        err.contains("not Ready after 10s (phase Pending): ")
            && ["PodStarting", "InvalidImageName"]
                .iter()
                .any(|r| err.contains(&format!("): {r}: "))),
        "the timeout names the last reason: {err}"
    );
    // ... and a long one ends at the stall, with the reason and the kubelet's message.
    let (code, out, err) = create_and_wait("300");
    assert_eq!(code, Some(1), "{out}{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(
        err.starts_with("agentbox: sandbox ")
            && err.contains(" failed: InvalidImageName: ")
            && err.contains("Does-Not-Exist"),
        "{err}"
    );
    assert!(!err.contains("not Ready after"), "not the timeout: {err}");

    // A Warning Event said so, and nothing was left Pending: no snapshot was asked for.
    let events: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(env.client.clone(), &env.ns);
    let warned = events
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .iter()
        .any(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(h.name())
                && e.note.as_deref().is_some_and(|n| n.contains("stall grace"))
        });
    assert!(warned, "no Warning Event of the stall");
    let snaps: kube::Api<agentbox_api::crd::SandboxSnapshot> =
        kube::Api::namespaced(env.client.clone(), &env.ns);
    let left = snaps
        .list(&Default::default())
        .await
        .expect("snapshots")
        .items;
    assert!(left.is_empty(), "{left:?}");
    env.finish().await;
}
