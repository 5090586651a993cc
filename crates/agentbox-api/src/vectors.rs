//! Protocol test vectors: what other clients must compute exactly as this crate does, written
//! from the crate's own functions to `tests/vectors/protocol.json` (`cargo run --bin vectorgen`)
//! and checked by the Python SDK's tests. A unit test here fails when the committed file no
//! longer matches the code, so a change to a scope key, a name, a path rule, an in-pod script
//! or the guard's expiry rule cannot reach one client only.
//!
//! Covered: scope → scope key, labels, annotations, selector, Sandbox/pod/Lease names; label
//! value validity and bounded names; workspace path confinement; the exec wrapper's argv, the
//! trailer's hold-back and the status channel's exit codes; the persistent session's command line and sentinel
//! framing; the file scripts and their listing format; the guard's expiry verdicts, taken
//! Lease spec and timings; the error kinds and each client's name for them; what a
//! `network.allow` credential's rules refuse.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Status};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::crd::{Scope, ScopeKind};
use crate::exec::{self, ExecError, ExecRequest, ExitStatus, session};
use crate::files;
use crate::guard::{self, GuardConfig};
use crate::labels;
use crate::paths::{self, PathError};

/// Format version of the file; bumped when its layout changes.
pub const FORMAT: u32 = 2;

/// The vectors as pretty JSON with a final newline (the committed file's exact content).
pub fn render_json() -> String {
    let mut s = serde_json::to_string_pretty(&vectors()).unwrap_or_default();
    s.push('\n');
    s
}

/// All vectors.
pub fn vectors() -> Value {
    json!({
        "format": FORMAT,
        "generator": "cargo run --bin vectorgen > tests/vectors/protocol.json",
        "labels": label_keys(),
        "scopes": scopes(),
        "label_values": label_values(),
        "bounded_names": bounded_names(),
        "confine": confine_cases(),
        "exec": exec_vectors(),
        "session": session_vectors(),
        "oom": oom_vectors(),
        "files": file_vectors(),
        "guard": guard_vectors(),
        "error_kinds": error_kinds(),
        "credentials": credential_cases(),
    })
}

/// The error kinds ([`crate::kinds::KINDS`]): each client's tests check that every kind it
/// names has its own error there, refining its parent's.
fn error_kinds() -> Value {
    crate::kinds::KINDS
        .iter()
        .map(|k| {
            json!({
                "kind": k.name,
                "parent": k.parent,
                "python": k.python,
                "go": k.go.map(|g| g.name),
                "java": k.java,
            })
        })
        .collect()
}

/// A `network.allow` entry's credential (`domain` null: a `cidr` entry) and what
/// [`crate::crd::EgressCredential::fault`] finds wrong in it (null: nothing), which every
/// client and backend refuses before any request.
fn credential_cases() -> Value {
    let (long, longest) = ("a".repeat(65), "a".repeat(64));
    let cases: [(Option<&str>, &str, &str, Option<&str>); 20] = [
        (Some("api.example.com"), "model-key", "token", None),
        (
            Some("api.example.com"),
            "k.v1",
            "api_key.v1",
            Some("X-Api-Key"),
        ),
        (
            Some("api.example.com"),
            "k",
            "K-1_.x",
            Some("authorization"),
        ),
        (Some("*.example.com"), "model-key", "token", None),
        (None, "model-key", "token", None),
        (Some("api.example.com"), "", "token", None),
        (Some("api.example.com"), "Model-Key", "token", None),
        (Some("api.example.com"), "model_key", "token", None),
        (Some("api.example.com"), "-k", "token", None),
        (Some("api.example.com"), "k", "", None),
        (Some("api.example.com"), "k", "a/b", None),
        (Some("api.example.com"), "k", "..", None),
        (Some("api.example.com"), "k", "t", Some("")),
        (Some("api.example.com"), "k", "t", Some("Host")),
        (Some("api.example.com"), "k", "t", Some("transfer-encoding")),
        (
            Some("api.example.com"),
            "k",
            "t",
            Some("Proxy-Authorization"),
        ),
        (Some("api.example.com"), "k", "t", Some("X Key")),
        (Some("api.example.com"), "k", "t", Some("X-Key:")),
        (Some("api.example.com"), "k", "t", Some(long.as_str())),
        (Some("api.example.com"), "k", "t", Some(longest.as_str())),
    ];
    // Every header the proxy owns, from the list itself: each client keeps its own copy of
    // it (Python's integrations, Java's SandboxSpec, Go's anna), and these cases are what
    // holds those copies to this one.
    let owned = crate::crd::PROXY_HEADERS
        .iter()
        .map(|h| (Some("api.example.com"), "k", "t", Some(*h)));
    let out: Vec<Value> = cases
        .into_iter()
        .chain(owned)
        .map(|(domain, secret, key, header)| {
            let c = crate::crd::EgressCredential {
                secret_name: secret.to_string(),
                key: key.to_string(),
                header: header.map(str::to_string),
            };
            json!({
                "domain": domain,
                "secretName": secret,
                "key": key,
                "header": header,
                "fault": c.fault(domain).map(|f| f.as_str()),
            })
        })
        .collect();
    Value::Array(out)
}

fn label_keys() -> Value {
    json!({
        "scope": labels::SCOPE,
        "scope_key": labels::SCOPE_KEY,
        "agent": labels::AGENT,
        "user": labels::USER,
        "session": labels::SESSION,
        "sandbox": labels::SANDBOX,
        "managed_by": labels::MANAGED_BY,
        "manager": labels::MANAGER,
        "agent_id": labels::AGENT_ID,
        "user_id": labels::USER_ID,
        "session_id": labels::SESSION_ID,
        "scope_key_len": labels::SCOPE_KEY_LEN,
        "max_label": labels::MAX_LABEL,
    })
}

fn scope(kind: ScopeKind, agent: Option<&str>, user: Option<&str>, session: Option<&str>) -> Scope {
    Scope {
        kind,
        agent: agent.map(str::to_string),
        user: user.map(str::to_string),
        session: session.map(str::to_string),
    }
}

fn scopes() -> Value {
    use ScopeKind::*;
    let long = "u".repeat(253);
    let l63 = "v".repeat(63);
    let l64 = "v".repeat(64);
    let cases = [
        scope(Session, Some("coder"), None, Some("s-1")),
        scope(Session, Some("coder"), None, Some("alice@example.com/1")),
        scope(Session, Some("a.b_c-d"), None, Some("0")),
        scope(User, Some("coder"), Some("alice@example.com"), None),
        scope(User, Some("coder"), Some("alice"), None),
        scope(User, Some("coder"), Some("Alice"), None),
        scope(User, Some("ab"), Some("c"), None),
        scope(User, Some("a"), Some("bc"), None),
        scope(User, Some("coder"), Some(&l63), None),
        scope(User, Some("coder"), Some(&l64), None),
        scope(User, Some("ägent"), Some(&long), None),
        scope(User, Some("-dash"), Some("日本"), None),
        scope(Agent, Some("coder"), None, None),
        scope(Agent, Some("x y"), None, None),
        scope(Global, None, None, None),
    ];
    cases
        .iter()
        .map(|s| {
            let key = labels::scope_key(s);
            let name = labels::sandbox_name_for_scope(s);
            json!({
                "scope": s,
                "scope_key": key,
                "labels": labels::scope_labels(s),
                "annotations": labels::scope_annotations(s),
                "selector": labels::scope_selector(s),
                "sandbox_name": name,
                "pod_name": labels::pod_name(&name),
                "sandbox_label_value": labels::sandbox_label_value(&name),
                "lease_name": labels::lease_name(&key),
            })
        })
        .collect()
}

fn label_values() -> Value {
    let x63 = "x".repeat(63);
    let x64 = "x".repeat(64);
    [
        "",
        "a",
        "alice",
        "a.b_c-d",
        "A1",
        &x63,
        "-a",
        "a-",
        ".a",
        "a.",
        "a b",
        "alice@example.com",
        "a/b",
        "ünï",
        "日本",
        &x64,
    ]
    .iter()
    .map(|v| json!({"value": v, "valid": labels::is_valid_label_value(v)}))
    .collect()
}

fn bounded_names() -> Value {
    let long_a = format!("{}a", "n".repeat(300));
    let dashy = format!("{}-{}", "a".repeat(45), "b".repeat(40));
    let dotty = format!("{}.{}", "a".repeat(45), "b".repeat(40));
    let exact = "e".repeat(63);
    let cases: [(&str, usize); 6] = [
        ("short", 63),
        (&exact, 63),
        (&long_a, 63),
        (&dashy, 63),
        (&dotty, 63),
        (&long_a, 253),
    ];
    cases
        .iter()
        .map(|(b, max)| json!({"base": b, "max": max, "name": labels::bounded_name(b, *max)}))
        .collect()
}

fn path_error(e: &PathError) -> &'static str {
    match e {
        PathError::DotDot(_) => "DotDot",
        PathError::OutsideRoot(..) => "OutsideRoot",
        PathError::Escapes(_) => "Escapes",
        PathError::Invalid(_) => "Invalid",
        // Refusals of spec paths (paths::relative); confine never returns them.
        PathError::Absolute(_) => "Absolute",
        PathError::Reserved(_) => "Reserved",
    }
}

fn confine_cases() -> Value {
    let cases = [
        ("/workspace", "a/b.txt"),
        ("/workspace", "./a//b/"),
        ("/workspace", ""),
        ("/workspace", "."),
        ("/workspace", "./"),
        ("/", "etc"),
        ("/", ""),
        ("/", "/"),
        ("/", "/etc/passwd"),
        ("/workspace", "../x"),
        ("/workspace", "a/../../x"),
        ("/workspace", "a/.."),
        ("/workspace", ".."),
        ("/workspace", "/workspace/../etc"),
        ("/workspace", "a/../b"),
        ("/workspace", "..a/b.."),
        ("/workspace", "/etc/passwd"),
        ("/workspace", "/workspace2/x"),
        ("/workspace", "/"),
        ("/workspace", "/workspace/x"),
        ("/workspace/", "/workspace"),
        ("/w/s", "/w/s/t"),
        ("/w/s", "/w"),
        ("/w/./s", "x"),
        ("/w/../s", "x"),
        ("/workspace", "a\0b"),
        ("workspace", "a"),
        ("", "a"),
        ("/workspace", "sp ace/ü/'q'\"/$x"),
        ("/workspace", "//workspace//a"),
    ];
    cases
        .iter()
        .map(|(root, path)| match paths::confine(root, path) {
            Ok(p) => json!({"root": root, "path": path, "ok": p}),
            Err(e) => json!({"root": root, "path": path, "error": path_error(&e)}),
        })
        .collect()
}

/// The mark of the vectors' wrapped commands and session lines (a real one is random).
const MARK: &str = "__AGENTBOX_0123456789abcdef0123456789abcdef_";

/// What the command reads, as the vectors describe it: nothing, `K` bytes, or a stream.
#[derive(Clone, Copy)]
enum In {
    None,
    Bytes(usize),
    Stream,
}

/// A request as the vectors describe it: argv, timeout in ms, workdir, env pairs, stdin
/// (`null`, a byte count, or `"stream"`).
fn request(
    argv: &[&str],
    timeout_ms: Option<u64>,
    workdir: Option<&str>,
    env: &[(&str, &str)],
) -> (Value, ExecRequest) {
    request_in(argv, timeout_ms, workdir, env, In::None)
}

fn request_in(
    argv: &[&str],
    timeout_ms: Option<u64>,
    workdir: Option<&str>,
    env: &[(&str, &str)],
    stdin: In,
) -> (Value, ExecRequest) {
    let mut r = ExecRequest::argv(argv.iter().copied());
    let stdin_desc = match stdin {
        In::None => Value::Null,
        In::Bytes(k) => {
            r = r.stdin(vec![b'x'; k]);
            json!(k)
        }
        In::Stream => {
            r = r.stdin_reader(tokio::io::empty());
            json!("stream")
        }
    };
    if let Some(t) = timeout_ms {
        r = r.timeout(Duration::from_millis(t));
    }
    if let Some(w) = workdir {
        r = r.workdir(w);
    }
    for (k, v) in env {
        r = r.env(*k, *v);
    }
    let desc = json!({
        "argv": argv,
        "timeout_ms": timeout_ms,
        "workdir": workdir,
        "env": env.iter().map(|(k, v)| json!([k, v])).collect::<Vec<_>>(),
        "stdin": stdin_desc,
    });
    (desc, r)
}

fn requests() -> Vec<(Value, ExecRequest)> {
    vec![
        request(&["echo", "hi"], None, None, &[]),
        request(&["sh", "-c", "ls; exit 3"], None, Some("/workspace"), &[]),
        request(
            &["sh", "-c", "echo $A"],
            Some(1500),
            Some("/workspace"),
            &[("A", "x y"), ("B", "")],
        ),
        request(&["sleep", "5"], Some(20), None, &[]),
        request(&["true"], Some(0), None, &[]),
        request(&["true"], Some(3_600_000), None, &[]),
        request(
            &["printenv", "_X1"],
            None,
            None,
            &[("_X1", "it's \"q\" $HOME\nnl")],
        ),
        request(
            &["echo", "it's", "$HOME", "a b", ""],
            None,
            Some("/w s/'x'"),
            &[],
        ),
        request(&[], None, None, &[]),
        request(&["true"], None, None, &[("1A", "x")]),
        request(&["true"], None, None, &[("A-B", "x")]),
        request(&["true"], None, None, &[("", "x")]),
    ]
}

/// [`requests`] and the same settings with each way of stdin (one-shot exec only: a session
/// command reads none).
fn oneshot_requests() -> Vec<(Value, ExecRequest)> {
    let mut v = requests();
    v.extend([
        request_in(&["cat"], None, None, &[], In::Bytes(5)),
        request_in(&["cat"], None, None, &[], In::Bytes(0)),
        request_in(
            &["sh", "-c", "cat > f"],
            None,
            Some("/workspace"),
            &[],
            In::Bytes(262_145),
        ),
        request_in(&["tar", "-x", "-f", "-"], None, None, &[], In::Stream),
        request_in(
            &["cat"],
            Some(2500),
            Some("/w"),
            &[("K", "v")],
            In::Bytes(3),
        ),
        request_in(&["cat"], Some(2500), None, &[], In::Stream),
    ]);
    v
}

fn exec_error(e: &ExecError) -> Value {
    let kind = match e {
        ExecError::Invalid(_) => "Invalid",
        ExecError::Connect { .. } => "Connect",
        ExecError::NotStarted(_) => "NotStarted",
        ExecError::Stream(_) => "Stream",
        ExecError::Timeout(_) => "Timeout",
        ExecError::Session(_) => "Session",
        ExecError::OutputCut { .. } => "OutputCut",
        ExecError::OutOfMemory { .. } => "OutOfMemory",
    };
    json!(kind)
}

fn status_cases() -> Value {
    let cases: Vec<Value> = vec![
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}),
        json!({"metadata": {}, "status": "Failure", "message": "command terminated with non-zero exit code: error executing command [sh -c exit 42], exit code 42", "reason": "NonZeroExitCode", "details": {"causes": [{"reason": "ExitCode", "message": "42"}]}}),
        json!({"status": "Failure", "reason": "NonZeroExitCode", "details": {"causes": [{"reason": "ExitCode", "message": "137"}]}}),
        json!({"status": "Failure", "reason": "NonZeroExitCode", "details": {"causes": [{"reason": "Other", "message": "x"}, {"reason": "ExitCode", "message": " 7 "}]}}),
        json!({"status": "Failure", "reason": "NonZeroExitCode", "message": "weird", "details": {"causes": []}}),
        json!({"status": "Failure", "reason": "NonZeroExitCode", "message": "no code", "details": {"causes": [{"reason": "ExitCode", "message": "abc"}]}}),
        json!({"status": "Failure", "reason": "InternalError", "message": "OCI runtime exec failed: exec: \"nope\": executable file not found in $PATH"}),
        json!({"status": "Failure", "reason": "InternalError"}),
        json!({"status": "Failure"}),
    ];
    cases
        .into_iter()
        .map(|raw| {
            let outcome = match serde_json::from_value::<Status>(raw.clone()) {
                Err(e) => json!({"parse_error": e.to_string()}),
                Ok(s) => match exec::parse_status(&s) {
                    Ok(ExitStatus::Code(c)) => json!({"code": c}),
                    Ok(ExitStatus::Unknown(m)) => json!({"unknown": m}),
                    Err(ExecError::NotStarted(m)) => json!({"not_started": m}),
                    Err(e) => json!({"error": exec_error(&e)}),
                },
            };
            json!({"status": raw, "outcome": outcome})
        })
        .collect()
}

fn exec_vectors() -> Value {
    let remote: Vec<Value> = oneshot_requests()
        .into_iter()
        .map(|(desc, r)| match r.remote_argv(MARK) {
            Ok(v) => json!({"request": desc, "mark": MARK, "remote_argv": v}),
            Err(e) => json!({"request": desc, "mark": MARK, "error": exec_error(&e)}),
        })
        .collect();
    let sleeps: Vec<Value> = [0u64, 1, 20, 999, 1000, 1500, 3000, 61_001]
        .iter()
        .map(|ms| json!({"ms": ms, "arg": exec::sleep_arg(Duration::from_millis(*ms))}))
        .collect();
    json!({
        "container": exec::SANDBOX_CONTAINER,
        "protocols": ["v5.channel.k8s.io"],
        "channels": {
            "stdin": exec::STDIN_CHANNEL,
            "stdout": exec::STDOUT_CHANNEL,
            "stderr": exec::STDERR_CHANNEL,
            "status": exec::STATUS_CHANNEL,
            "close": exec::CLOSE_CHANNEL,
        },
        "stdin_frame": exec::STDIN_FRAME,
        "default_max_output": exec::DEFAULT_MAX_OUTPUT,
        "timeout_grace_ms": exec::TIMEOUT_GRACE.as_millis() as u64,
        "wrapper": crate::remote::WRAPPER,
        "process_env": crate::remote::PROCESS_ENV,
        "processes_script": crate::remote::PROCESSES,
        "remote_argv": remote,
        "trailer": trailer_cases(),
        "sleep_arg": sleeps,
        "status": status_cases(),
    })
}

/// One stream's chunks through [`exec::Trailer`]: what is passed on after each chunk, all of
/// it, and whether the stream ended whole.
fn trailer_case(mark: &str, chunks: &[&str]) -> Value {
    let mut t = exec::Trailer::new(mark);
    let passed: Vec<String> = chunks
        .iter()
        .map(|c| {
            let b = t.push(bytes::Bytes::copy_from_slice(c.as_bytes()));
            String::from_utf8_lossy(&b).into_owned()
        })
        .collect();
    json!({
        "mark": mark,
        "chunks": chunks,
        "passed": passed,
        "out": passed.concat(),
        "whole": t.whole(),
        "memory": t.memory_killed(),
        "received": t.received(),
    })
}

fn trailer_cases() -> Vec<Value> {
    let m = MARK;
    let (half, rest) = m.split_at(20);
    let m_nl = format!("{m}\n");
    let twice = format!("{m}{m}");
    let almost = format!("{}x", &m[..m.len() - 1]);
    let bad_then_good = format!("{half}{m}");
    let under = &m[..1];
    let memory = crate::remote::memory_trailer(m);
    vec![
        trailer_case(m, &["hello\n", m]),
        trailer_case(m, &[&format!("hello\n{m}")]),
        trailer_case(m, &[m]),
        trailer_case(m, &[]),
        trailer_case(m, &["hello\n"]),
        trailer_case(m, &["out", half, rest]),
        trailer_case(m, &["out", half]),
        trailer_case(m, &[&format!("out{half}"), "more", rest]),
        trailer_case(m, &["out", &m_nl]),
        trailer_case(m, &[&twice]),
        trailer_case(m, &[&almost]),
        trailer_case(m, &[&bad_then_good]),
        trailer_case(m, &["a__", "_", "AGENT", "BOX", &m[1..]]),
        trailer_case(m, &["x", under, under, &m[1..]]),
        trailer_case(m, &[m, "late output"]),
        trailer_case(m, &["", "", m]),
        // The memory trailer (the command was killed for memory) ends a stream as the mark does.
        trailer_case(m, &["out", &memory]),
        trailer_case(m, &[&format!("out{}", &memory[..memory.len() - 1]), "!"]),
        trailer_case(m, &[&memory, "late"]),
        trailer_case(m, &[&format!("{}x", &memory[..memory.len() - 1])]),
        trailer_case(m, &["a!", &memory]),
    ]
}

fn framer_case(start: Option<&str>, end: &str, cap: usize, chunks: &[&str]) -> Value {
    let mut f = session::Framer::new(start.map(|s| s.as_bytes().to_vec()), end.to_string(), cap);
    let mut outcome = json!({"incomplete": true});
    for (i, c) in chunks.iter().enumerate() {
        match f.feed(c.as_bytes()) {
            Ok(Some((trailer, rest))) => {
                outcome = json!({
                    "trailer": trailer,
                    "rest": String::from_utf8_lossy(&rest),
                    "after_chunk": i,
                });
                break;
            }
            Ok(None) => {}
            Err(e) => {
                outcome = json!({"error": exec_error(&e), "after_chunk": i});
                break;
            }
        }
    }
    json!({
        "start": start,
        "end": end,
        "cap": cap,
        "chunks": chunks,
        "outcome": outcome,
        "out": String::from_utf8_lossy(&f.out.buf),
        "truncated": f.out.truncated,
    })
}

fn session_vectors() -> Value {
    let mark = MARK;
    let lines: Vec<Value> = requests()
        .into_iter()
        .map(|(desc, r)| match session::command_line(&r, mark) {
            Ok(l) => json!({"request": desc, "mark": mark, "line": l}),
            Err(e) => json!({"request": desc, "mark": mark, "error": exec_error(&e)}),
        })
        .collect();
    let big = "a".repeat(100);
    let framing = vec![
        framer_case(
            Some("M+\n"),
            "M",
            100,
            &["junkM+\nhello", " worldM42\nnext"],
        ),
        framer_case(
            Some("M+\n"),
            "M",
            100,
            &["M", "+", "\n", "o", "M", "0", "\n"],
        ),
        framer_case(
            Some("__S_+\n"),
            "__S_",
            4,
            &["__S_+\n", &big, "__S_1\nrest"],
        ),
        framer_case(None, "END", 4, &[&big, "END\n"]),
        framer_case(None, "END", 100, &["partEN", "D", "\n"]),
        framer_case(None, "END", 100, &["END", &"x".repeat(40)]),
        framer_case(Some("M+\n"), "M", 100, &["stray output only"]),
        framer_case(Some("M+\n"), "M", 100, &["M+\nout\nM", "7"]),
    ];
    let shells: Vec<Value> = [None, Some("/workspace"), Some("/a b/it's")]
        .into_iter()
        .map(|w| json!({"workdir": w, "argv": crate::remote::session_shell_argv(w)}))
        .collect();
    let ends: Vec<Value> = ["0", "42", " 7 ", "137", "137!", "1!", "", "x", "!", "137!!"]
        .into_iter()
        .map(|t| match crate::remote::parse_session_end(t) {
            Some((code, memory)) => json!({"trailer": t, "code": code, "memory": memory}),
            None => json!({"trailer": t, "unparsable": true}),
        })
        .collect();
    json!({
        "command_lines": lines,
        "framing": framing,
        "shell_argv": shells,
        "end_trailers": ends,
    })
}

/// Whether a pod's status says its sandbox container was killed for memory since an exec began
/// ([`crate::oom::oom_killed_since`]), and the memory trailer of the vectors' mark.
fn oom_vectors() -> Value {
    let since = "2026-01-01T00:01:00Z";
    let container = |state: Value, last: Value| {
        json!({"containerStatuses": [{"name": exec::SANDBOX_CONTAINER, "ready": false,
            "restartCount": 1, "image": "i", "imageID": "", "state": state, "lastState": last}]})
    };
    let term = |reason: &str, finished: Option<&str>| {
        let mut t = json!({"exitCode": 137, "reason": reason});
        if let Some(f) = finished {
            t["finishedAt"] = json!(f);
        }
        json!({"terminated": t})
    };
    let running = json!({"running": {"startedAt": "2026-01-01T00:01:03Z"}});
    let statuses = vec![
        container(term("OOMKilled", Some("2026-01-01T00:01:02Z")), json!({})),
        container(
            running.clone(),
            term("OOMKilled", Some("2026-01-01T00:01:02Z")),
        ),
        container(
            running.clone(),
            term("OOMKilled", Some("2026-01-01T00:00:56Z")),
        ),
        container(
            running.clone(),
            term("OOMKilled", Some("2026-01-01T00:00:54Z")),
        ),
        container(running.clone(), term("OOMKilled", None)),
        container(running.clone(), term("Error", Some("2026-01-01T00:01:02Z"))),
        container(term("Error", Some("2026-01-01T00:01:02Z")), json!({})),
        container(running, json!({})),
        json!({"containerStatuses": [{"name": "other", "ready": false, "restartCount": 1,
            "image": "i", "imageID": "",
            "lastState": term("OOMKilled", Some("2026-01-01T00:01:02Z"))}]}),
        json!({}),
    ];
    let cases: Vec<Value> = statuses
        .into_iter()
        .map(|status| {
            let pod: k8s_openapi::api::core::v1::Pod =
                serde_json::from_value(json!({"metadata": {"name": "p"}, "status": status}))
                    .unwrap_or_default();
            let killed =
                crate::oom::oom_killed_since(&pod, exec::SANDBOX_CONTAINER, ts(since)).is_some();
            json!({"status": status, "since": since, "killed": killed})
        })
        .collect();
    json!({
        "reason": crate::oom::OOM_KILLED,
        "clock_skew_ms": crate::oom::CLOCK_SKEW.as_millis() as u64,
        "settle_ms": crate::oom::SETTLE.as_millis() as u64,
        "poll_ms": crate::oom::POLL.as_millis() as u64,
        "memory_flag": crate::remote::MEMORY_FLAG.to_string(),
        "memory_trailer": {"mark": MARK, "trailer": crate::remote::memory_trailer(MARK)},
        "counter_files": crate::remote::OOM_KILLS,
        "container": cases,
    })
}

fn file_vectors() -> Value {
    let scripts = [
        ("read", crate::remote::READ),
        ("write", crate::remote::WRITE),
        ("list", crate::remote::LIST),
        ("upload", crate::remote::UPLOAD),
        ("download", crate::remote::DOWNLOAD),
    ];
    let reqs: Vec<Value> = [
        ("read", "/workspace", "notes/todo.txt"),
        ("write", "/workspace", "/workspace/a b/c"),
        ("list", "/workspace", ""),
        ("upload", "/data/ws", "src"),
        ("download", "/workspace", "."),
        ("read", "/workspace", "../etc/passwd"),
        ("read", "/workspace", "/etc/passwd"),
    ]
    .iter()
    .map(|(name, root, path)| {
        let script = scripts
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, s)| *s)
            .unwrap_or_default();
        match files::file_argv(script, root, path) {
            Ok((argv, p)) => {
                json!({"script": name, "root": root, "path": path, "argv": argv, "confined": p})
            }
            Err(e) => json!({"script": name, "root": root, "path": path, "error": path_error(&e)}),
        }
    })
    .collect();
    let listings: Vec<Value> = [
        "81a4 12 1700000000 b file.txt\u{0}41ed 4096 1700000001 dir\u{0}a1ff 7 1700000002 link\u{0}",
        "11b6 0 1 fifo\u{0}81ed 5 -3 with space and\nnewline\u{0}",
        "",
        "zz\u{0}",
        "81a4 x 1 f\u{0}",
    ]
    .iter()
    .map(|raw| match files::parse_listing(raw.as_bytes()) {
        Ok(v) => json!({
            "raw": raw,
            "entries": v.iter().map(|e| json!({
                "name": e.name,
                "kind": format!("{:?}", e.kind),
                "size": e.size,
                "mode": e.mode,
                "mtime": e.mtime,
            })).collect::<Vec<_>>(),
        }),
        Err(_) => json!({"raw": raw, "error": true}),
    })
    .collect();
    json!({
        "argv0": "agentbox-files",
        "prologue": crate::remote::PROLOGUE,
        "scripts": scripts.iter().map(|(n, s)| (n.to_string(), json!(s))).collect::<serde_json::Map<_, _>>(),
        "exit_escapes": crate::remote::ESCAPES,
        "exit_missing": crate::remote::MISSING,
        "exit_spool_failed": crate::remote::SPOOL_FAILED,
        "exit_too_large": crate::remote::TOO_LARGE,
        "limit_env": crate::remote::LIMIT_ENV,
        "read_cap": 64u64 << 20,
        "requests": reqs,
        "listings": listings,
    })
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap_or(Timestamp::UNIX_EPOCH)
}

fn lease_spec(
    holder: Option<&str>,
    dur: Option<i32>,
    renew: Option<&str>,
    transitions: Option<i32>,
) -> LeaseSpec {
    LeaseSpec {
        holder_identity: holder.map(str::to_string),
        lease_duration_seconds: dur,
        renew_time: renew.map(|r| MicroTime(ts(r))),
        acquire_time: renew.map(|r| MicroTime(ts(r))),
        lease_transitions: transitions,
        ..Default::default()
    }
}

fn guard_vectors() -> Value {
    let t0 = "2027-01-15T08:00:00.000000Z";
    let judge_cases: Vec<(Option<LeaseSpec>, &str, u64)> = vec![
        (None, t0, 0),
        (Some(lease_spec(None, Some(10), Some(t0), Some(4))), t0, 0),
        (
            Some(lease_spec(Some(""), Some(10), Some(t0), Some(4))),
            t0,
            0,
        ),
        (
            Some(lease_spec(Some("other"), Some(10), Some(t0), Some(4))),
            "2027-01-15T08:00:05.000000Z",
            0,
        ),
        (
            Some(lease_spec(Some("other"), Some(10), Some(t0), Some(4))),
            "2027-01-15T08:00:11.999999Z",
            0,
        ),
        (
            Some(lease_spec(Some("other"), Some(10), Some(t0), Some(4))),
            "2027-01-15T08:00:12.000000Z",
            0,
        ),
        (
            Some(lease_spec(
                Some("other"),
                Some(10),
                Some("2027-01-15T08:16:40.000000Z"),
                Some(4),
            )),
            t0,
            9_999,
        ),
        (
            Some(lease_spec(
                Some("other"),
                Some(10),
                Some("2027-01-15T08:16:40.000000Z"),
                Some(4),
            )),
            t0,
            10_000,
        ),
        (
            Some(lease_spec(Some("other"), None, Some(t0), Some(4))),
            "2027-01-15T08:00:16.000000Z",
            0,
        ),
        (
            Some(lease_spec(Some("other"), None, Some(t0), Some(4))),
            "2027-01-15T08:00:17.000000Z",
            0,
        ),
        (
            Some(lease_spec(Some("other"), Some(0), None, None)),
            "2027-01-15T09:00:00.000000Z",
            0,
        ),
        (
            Some(lease_spec(Some("other"), Some(0), None, None)),
            "2027-01-15T09:00:00.000000Z",
            15_000,
        ),
        (
            Some(lease_spec(Some("other"), Some(-5), Some(t0), None)),
            "2027-01-15T08:00:16.999999Z",
            0,
        ),
    ];
    let skew = Duration::from_secs(2);
    let default = Duration::from_secs(15);
    // Cases without `me`: the verdict of a contender outside the queue (the rule before the
    // queue slot, still what a client unaware of it does).
    let mut judge: Vec<Value> = judge_cases
        .iter()
        .map(|(spec, now, unchanged)| {
            let r = guard::Reading {
                spec: spec.as_ref(),
                annotations: None,
                now: ts(now),
                unchanged_for: Duration::from_millis(*unchanged),
                slot_unchanged_for: Duration::ZERO,
            };
            let v = guard::judge(&r, None, skew, default);
            json!({
                "spec": spec,
                "now": now,
                "unchanged_for_ms": unchanged,
                "clock_skew_ms": skew.as_millis() as u64,
                "default_duration_ms": default.as_millis() as u64,
                "verdict": v.as_str(),
            })
        })
        .collect();
    judge.extend(queue_judge_cases(skew, default));
    let taken: Vec<Value> = [
        (None, 15_000u64),
        (
            Some(lease_spec(Some("other"), Some(10), Some(t0), Some(4))),
            3_000,
        ),
        (Some(lease_spec(None, Some(10), None, None)), 200),
        (
            Some(lease_spec(None, Some(10), None, Some(i32::MAX))),
            90_500,
        ),
    ]
    .into_iter()
    .map(|(old, ms)| {
        let cfg = GuardConfig {
            holder: "me/1/0000abcd".into(),
            lease_duration: Duration::from_millis(ms),
            ..Default::default()
        };
        let now = "2027-01-15T08:00:30.123456Z";
        json!({
            "old": old,
            "holder": cfg.holder,
            "lease_duration_ms": ms,
            "now": now,
            "spec": guard::taken_spec(old.as_ref(), &cfg, ts(now)),
        })
    })
    .collect();
    let timings: Vec<Value> = [200u64, 1000, 3000, 4000, 15_000, 60_000]
        .iter()
        .map(|ms| {
            let cfg = GuardConfig::with_duration(Duration::from_millis(*ms));
            json!({
                "lease_duration_ms": ms,
                "duration_secs": cfg.duration_secs(),
                "renew_every_ms": cfg.renew_every().as_millis() as u64,
                "trust_window_ms": cfg.trust_window().as_millis() as u64,
            })
        })
        .collect();
    let d = GuardConfig::default();
    json!({
        "defaults": {
            "lease_duration_ms": d.lease_duration.as_millis() as u64,
            "retry_interval_ms": d.retry_interval.as_millis() as u64,
            "clock_skew_ms": d.clock_skew.as_millis() as u64,
            "watch_fallback_ms": guard::WATCH_FALLBACK.as_millis() as u64,
            "yield_ms": guard::YIELD.as_millis() as u64,
        },
        "annotation_names": {
            "next": guard::NEXT_ANNOTATION,
            "next_renew": guard::NEXT_RENEW_ANNOTATION,
            "fair_holder": guard::FAIR_HOLDER_ANNOTATION,
        },
        "judge": judge,
        "taken_spec": taken,
        "annotations": annotation_writes(),
        "released_spec": released_specs(),
        "timings": timings,
        "shared_hold": shared_holds(),
        "yield": yields(),
    })
}

/// `guard.shared_hold`: whether a hold makes its holder yield after releasing it (`before`:
/// the Lease's annotations as taken, null when the holder created it).
fn shared_holds() -> Vec<Value> {
    use guard::FAIR_HOLDER_ANNOTATION as FAIR;
    let me = "me/1/0000abcd";
    let mine = annotations(&[(FAIR, me)]);
    let theirs = annotations(&[(FAIR, "other/2/0000beef")]);
    let none = annotations(&[("example.com/other", "kept")]);
    let mut out = Vec::new();
    for queue in [true, false] {
        for waited in [false, true] {
            for before in [None, Some(&mine), Some(&theirs), Some(&none)] {
                out.push(json!({
                    "queue": queue,
                    "waited": waited,
                    "before": before,
                    "me": me,
                    "shared": guard::shared_hold(queue, waited, before, me),
                }));
            }
        }
    }
    out
}

/// `guard.yield`: how long a contender whose verdict is `Take` still leaves the free Lease to
/// others, given what is left of its own yield.
fn yields() -> Vec<Value> {
    use guard::{FAIR_HOLDER_ANNOTATION as FAIR, NEXT_ANNOTATION as NEXT};
    let me = "me/1/0000abcd";
    let cases = [
        annotations(&[(FAIR, me)]),
        annotations(&[(FAIR, "other/2/0000beef")]),
        annotations(&[(FAIR, me), (NEXT, me)]),
        annotations(&[(FAIR, me), (NEXT, "other/2/0000beef")]),
        annotations(&[]),
    ];
    let mut out = Vec::new();
    for a in &cases {
        for left in [0u64, 1, 400, 1000] {
            let y = guard::yield_for(Some(a), me, Duration::from_millis(left));
            out.push(json!({"annotations": a, "me": me, "yield_left_ms": left,
                "yield_ms": y.as_millis() as u64}));
        }
    }
    out.push(json!({"annotations": null, "me": me, "yield_left_ms": 400,
        "yield_ms": guard::yield_for(None, me, Duration::from_millis(400)).as_millis() as u64}));
    out
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// `guard.judge` cases of a contender in the queue (`me` set): the queue slot on free, held
/// and expired Leases, behind holders that expect it and holders that do not.
fn queue_judge_cases(skew: Duration, default: Duration) -> Vec<Value> {
    use guard::NEXT_RENEW_ANNOTATION as RENEW;
    use guard::{FAIR_HOLDER_ANNOTATION as FAIR, NEXT_ANNOTATION as NEXT};
    let t0 = "2027-01-15T08:00:00.000000Z";
    let later = "2027-01-15T08:16:40.000000Z";
    let free = Some(lease_spec(None, Some(10), None, Some(4)));
    let held = Some(lease_spec(Some("other"), Some(10), Some(t0), Some(4)));
    let slot = |who: &str, at: &str| vec![(NEXT, who.to_string()), (RENEW, at.to_string())];
    let fair = |mut v: Vec<(&'static str, String)>| {
        v.push((FAIR, "other".to_string()));
        v
    };
    // (spec, annotations, me, now, unchanged_for_ms, slot_unchanged_for_ms)
    type Case = (
        Option<LeaseSpec>,
        Vec<(&'static str, String)>,
        Option<&'static str>,
        &'static str,
        u64,
        u64,
    );
    let s1 = "2027-01-15T08:00:01.000000Z";
    let s11 = "2027-01-15T08:00:11.999999Z";
    let s12 = "2027-01-15T08:00:12.000000Z";
    let cases: Vec<Case> = vec![
        // A free Lease: the fresh claim's owner takes it, everyone else waits for it...
        (free.clone(), vec![], Some("me"), s1, 0, 0),
        (free.clone(), slot("a", t0), Some("me"), s1, 0, 0),
        (free.clone(), slot("me", t0), Some("me"), s1, 0, 0),
        (free.clone(), slot("a", t0), Some("me"), s11, 0, 0),
        // ...until the claim is stale by the clocks, or unchanged for a full duration,
        (free.clone(), slot("a", t0), Some("me"), s12, 0, 0),
        (free.clone(), slot("a", later), Some("me"), s1, 0, 9_999),
        (free.clone(), slot("a", later), Some("me"), s1, 0, 10_000),
        // or when it has no readable time.
        (free.clone(), slot("a", "soon"), Some("me"), s1, 0, 0),
        (
            free.clone(),
            vec![(NEXT, "a".to_string())],
            Some("me"),
            s1,
            0,
            0,
        ),
        (free.clone(), slot("", t0), Some("me"), s1, 0, 0),
        // A contender outside the queue ignores the slot.
        (free.clone(), slot("a", t0), None, s1, 0, 0),
        // Held by a holder that expects the queue: claim an empty, stale or own slot.
        (held.clone(), fair(vec![]), Some("me"), s1, 0, 0),
        (held.clone(), fair(slot("me", t0)), Some("me"), s1, 0, 0),
        (held.clone(), fair(slot("a", t0)), Some("me"), s1, 0, 0),
        (held.clone(), fair(slot("a", t0)), Some("me"), s11, 0, 0),
        (held.clone(), fair(slot("a", t0)), Some("me"), s1, 0, 10_000),
        // Held by a holder that does not expect it: wait, never write.
        (held.clone(), vec![], Some("me"), s1, 0, 0),
        (
            held.clone(),
            vec![(FAIR, "earlier".to_string())],
            Some("me"),
            s1,
            0,
            0,
        ),
        // Held by a holder whose time is up: free, and the queue decides.
        (held.clone(), fair(slot("a", t0)), Some("me"), s12, 0, 0),
        (held.clone(), fair(vec![]), Some("me"), s12, 0, 0),
        (
            held.clone(),
            fair(slot("me", later)),
            Some("me"),
            s1,
            10_000,
            0,
        ),
        (
            held.clone(),
            fair(slot("a", later)),
            Some("me"),
            s1,
            10_000,
            0,
        ),
    ];
    cases
        .into_iter()
        .map(|(spec, ann, me, now, unchanged, slot_unchanged)| {
            let ann: BTreeMap<String, String> =
                ann.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
            let r = guard::Reading {
                spec: spec.as_ref(),
                annotations: Some(&ann),
                now: ts(now),
                unchanged_for: Duration::from_millis(unchanged),
                slot_unchanged_for: Duration::from_millis(slot_unchanged),
            };
            let v = guard::judge(&r, me, skew, default);
            json!({
                "spec": spec,
                "annotations": ann,
                "me": me,
                "now": now,
                "unchanged_for_ms": unchanged,
                "slot_unchanged_for_ms": slot_unchanged,
                "clock_skew_ms": skew.as_millis() as u64,
                "default_duration_ms": default.as_millis() as u64,
                "verdict": v.as_str(),
            })
        })
        .collect()
}

/// `guard.annotations`: what taking, claiming the queue slot and withdrawing from it write
/// (`after` null: nothing to write).
fn annotation_writes() -> Vec<Value> {
    use guard::NEXT_RENEW_ANNOTATION as RENEW;
    use guard::{FAIR_HOLDER_ANNOTATION as FAIR, NEXT_ANNOTATION as NEXT};
    let now = "2027-01-15T08:00:30.123456Z";
    let queued = annotations(&[
        ("example.com/other", "kept"),
        (FAIR, "old"),
        (NEXT, "me/1/0000abcd"),
        (RENEW, "2027-01-15T08:00:20.000000Z"),
    ]);
    let other = annotations(&[(NEXT, "a"), (RENEW, "2027-01-15T08:00:20.000000Z")]);
    let me = "me/1/0000abcd";
    let mut out = Vec::new();
    for before in [None, Some(queued.clone()), Some(other.clone())] {
        let b = before.as_ref();
        out.push(json!({"op": "take", "me": me, "now": now, "before": b,
            "after": guard::taken_annotations(b, me)}));
        out.push(json!({"op": "claim", "me": me, "now": now, "before": b,
            "after": guard::claimed_annotations(b, me, ts(now))}));
        out.push(json!({"op": "withdraw", "me": me, "now": now, "before": b,
            "after": guard::withdrawn_annotations(b, me)}));
    }
    out
}

/// `guard.released_spec`: the spec a release writes.
fn released_specs() -> Vec<Value> {
    let t0 = "2027-01-15T08:00:00.000000Z";
    [
        lease_spec(Some("me/1/0000abcd"), Some(15), Some(t0), Some(7)),
        lease_spec(Some("me/1/0000abcd"), None, Some(t0), None),
    ]
    .iter()
    .map(|s| json!({"before": s, "after": guard::released_spec(s)}))
    .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn committed_vectors_match_the_code() {
        let committed = include_str!("../../../tests/vectors/protocol.json");
        assert!(
            committed == super::render_json(),
            "tests/vectors/protocol.json is stale: run `cargo run --bin vectorgen > tests/vectors/protocol.json`"
        );
    }

    #[test]
    fn vectors_cover_every_outcome_kind() {
        let v = super::vectors();
        let confine = v["confine"].as_array().cloned().unwrap_or_default();
        for kind in ["DotDot", "OutsideRoot", "Invalid"] {
            assert!(confine.iter().any(|c| c["error"] == kind), "{kind}");
        }
        assert!(confine.iter().any(|c| c["ok"].is_string()));
        let judge = v["guard"]["judge"].as_array().cloned().unwrap_or_default();
        assert!(judge.iter().any(|c| c["verdict"] == "Take"));
        assert!(judge.iter().any(|c| c["verdict"] == "Wait"));
        assert!(judge.iter().any(|c| c["verdict"] == "Queue"));
        let st = v["exec"]["status"].as_array().cloned().unwrap_or_default();
        for k in ["code", "unknown", "not_started"] {
            assert!(st.iter().any(|c| c["outcome"].get(k).is_some()), "{k}");
        }
        let tr = v["exec"]["trailer"].as_array().cloned().unwrap_or_default();
        assert!(tr.iter().any(|c| c["whole"] == true));
        assert!(tr.iter().any(|c| c["whole"] == false));
        let argv = v["exec"]["remote_argv"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for mode in ["-", "=", "5"] {
            assert!(
                argv.iter().any(|c| c["remote_argv"][5] == mode),
                "stdin mode {mode}"
            );
        }
    }
}
