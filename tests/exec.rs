//! Exec against a real pod on the local cluster: exit codes, timeouts that really stop the
//! command, output caps, large binary stdin, streaming, and the persistent session.

mod barepod;
mod common;

use std::time::{Duration, Instant};

use agentbox_api::exec::{
    self, ExecError, ExecEvent, ExecRequest, ExitStatus, SANDBOX_CONTAINER, session::Session,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use sha2::{Digest, Sha256};

async fn setup(prefix: &str) -> (common::TestEnv, Api<Pod>) {
    let env = common::TestEnv::new(prefix).await;
    let pods = barepod::start(&env.client, &env.ns, "box").await;
    (env, pods)
}

async fn run(pods: &Api<Pod>, req: ExecRequest) -> exec::ExecOutput {
    exec::run(pods, "box", SANDBOX_CONTAINER, req)
        .await
        .expect("exec")
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn exit_codes_come_from_the_status_channel() {
    let (env, pods) = setup("exec-codes").await;
    for code in [0, 1, 42] {
        let out = run(
            &pods,
            ExecRequest::shell(format!("echo out; echo err >&2; exit {code}")),
        )
        .await;
        assert_eq!(out.status, ExitStatus::Code(code));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        assert!(!out.timed_out && !out.stdout_truncated && !out.stderr_truncated);
    }
    // SIGKILL: the CRI reports 128+9, the same as the shell would.
    let out = run(&pods, ExecRequest::shell("kill -KILL $$")).await;
    assert_eq!(out.status, ExitStatus::Code(137), "{out:?}");
    assert_eq!(out.status.signal(), Some(9));
    // The same through the wrapper (env set) and with a timeout that does not fire.
    let out = run(
        &pods,
        ExecRequest::shell("kill -KILL $$")
            .env("X", "1")
            .timeout(Duration::from_secs(60)),
    )
    .await;
    assert_eq!(out.status, ExitStatus::Code(137), "{out:?}");
    assert!(!out.timed_out);
    // No such program: every command runs under the wrapper, whose shell reports 127 and
    // its message, like any shell would.
    let out = run(&pods, ExecRequest::argv(["/no/such/program"])).await;
    assert_eq!(out.status, ExitStatus::Code(127), "{out:?}");
    assert!(out.stderr_str().contains("/no/such/program"), "{out:?}");
    let out = run(&pods, ExecRequest::argv(["/no/such/program"]).workdir("/")).await;
    assert_eq!(out.status, ExitStatus::Code(127), "{out:?}");
    // A container that does not exist: the runtime refuses to start anything (no exit code).
    let err = exec::run(
        &pods,
        "box",
        "no-such-container",
        ExecRequest::argv(["true"]),
    )
    .await
    .expect_err("must not start");
    assert!(
        matches!(err, ExecError::NotStarted(_) | ExecError::Connect { .. }),
        "{err:?}"
    );
    // Env and workdir reach the command.
    let out = run(
        &pods,
        ExecRequest::shell("pwd; echo \"$A|$B\"")
            .workdir("/tmp")
            .env("A", "x 'y' $z")
            .env("B", ""),
    )
    .await;
    assert_eq!(out.stdout_str(), "/tmp\nx 'y' $z|\n");
    // Missing pod: a connection error, classed transient.
    let err = exec::run(
        &pods,
        "nope",
        SANDBOX_CONTAINER,
        ExecRequest::argv(["true"]),
    )
    .await
    .expect_err("no pod");
    assert!(matches!(err, ExecError::Connect { .. }), "{err:?}");
    env.finish().await;
}

/// The processes of the pod whose command line contains `needle`.
async fn procs_matching(pods: &Api<Pod>, needle: &str) -> String {
    // Scan /proc directly; exclude the scanning shell itself and the exec wrapper around it
    // (its parent, whose arguments hold this script).
    let script = format!(
        "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); case \"$c\" in *{needle}*) [ \"${{p#/proc/}}\" = $$ ] || [ \"${{p#/proc/}}\" = $PPID ] || echo \"${{p#/proc/}} $c\";; esac; done"
    );
    let out = run(pods, ExecRequest::shell(script)).await;
    out.stdout_str()
        .lines()
        .filter(|l| !l.contains("for p in"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn timeout_kills_the_whole_command() {
    let (env, pods) = setup("exec-timeout").await;
    // A child in the background and one in the foreground, both far past the timeout.
    let out = run(
        &pods,
        ExecRequest::shell("echo started; sleep 3117 & sleep 3118; echo never")
            .timeout(Duration::from_secs(2)),
    )
    .await;
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.stdout_str(), "started\n");
    assert_eq!(out.status.signal(), Some(9), "{out:?}");
    let left = procs_matching(&pods, "311[78]").await;
    // Positive control: the scan does see a process that is still there.
    run(
        &pods,
        ExecRequest::shell("setsid sleep 3116 </dev/null >/dev/null 2>&1 &"),
    )
    .await;
    let seen = procs_matching(&pods, "3116").await;
    assert!(
        seen.contains("sleep 3116"),
        "scan missed a live process: {seen:?}"
    );
    assert!(left.is_empty(), "processes survived the timeout:\n{left}");
    // stdin still reaches a command that runs under a timeout.
    let out = run(
        &pods,
        ExecRequest::argv(["cat"])
            .stdin(&b"piped"[..])
            .timeout(Duration::from_secs(30)),
    )
    .await;
    assert_eq!(out.stdout, b"piped");
    assert!(!out.timed_out && out.status.success());
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn output_is_capped_and_flagged() {
    let (env, pods) = setup("exec-cap").await;
    let out = run(
        &pods,
        ExecRequest::shell("head -c 10485760 /dev/zero; echo small >&2").max_output(1 << 20),
    )
    .await;
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), 1 << 20);
    assert!(out.stdout_truncated);
    assert_eq!(out.stderr, b"small\n");
    assert!(!out.stderr_truncated);
    // Exactly at the cap is not truncated.
    let out = run(
        &pods,
        ExecRequest::shell("head -c 1000 /dev/zero").max_output(1000),
    )
    .await;
    assert_eq!(out.stdout.len(), 1000);
    assert!(!out.stdout_truncated);
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn large_binary_stdin_round_trips() {
    let (env, pods) = setup("exec-stdin").await;
    let mut data = vec![0u8; 50 << 20];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for b in data.iter_mut() {
        // xorshift: incompressible, every byte value.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = (x >> 24) as u8;
    }
    let want = hex::encode(Sha256::digest(&data));
    // Through the pod and back.
    let out = run(
        &pods,
        ExecRequest::argv(["cat"])
            .stdin(data.clone())
            .max_output(60 << 20),
    )
    .await;
    assert!(out.status.success(), "{:?}", out.stderr_str());
    assert_eq!(out.stdout.len(), data.len());
    assert_eq!(hex::encode(Sha256::digest(&out.stdout)), want);
    // Hashed in the pod, streamed from a reader: the command sees EOF and exactly our bytes.
    let out = run(
        &pods,
        ExecRequest::argv(["sha256sum"]).stdin_reader(std::io::Cursor::new(data)),
    )
    .await;
    assert!(out.status.success());
    assert_eq!(
        out.stdout_str().split_whitespace().next(),
        Some(want.as_str())
    );
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn streaming_yields_output_while_the_command_runs() {
    let (env, pods) = setup("exec-stream").await;
    // The command waits for a file that is only created after its first output arrived here:
    // it can only finish if output is streamed before the end.
    let mut s = exec::stream(
        &pods,
        "box",
        SANDBOX_CONTAINER,
        ExecRequest::shell(
            "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo second >&2; exit 3",
        )
        .timeout(Duration::from_secs(60)),
    )
    .await
    .expect("stream");
    let first = s.next().await.expect("event").expect("ok");
    assert_eq!(first, ExecEvent::Stdout("first\n".into()));
    run(&pods, ExecRequest::argv(["touch", "/tmp/go"])).await;
    let mut rest = Vec::new();
    while let Some(ev) = s.next().await {
        rest.push(ev.expect("event"));
    }
    assert_eq!(
        rest,
        vec![
            ExecEvent::Stderr("second\n".into()),
            ExecEvent::Exit {
                status: ExitStatus::Code(3),
                timed_out: false
            }
        ]
    );
    env.finish().await;
}

/// Closing a streamed exec does not stop a command that ignores the end of its stdin (a stdio
/// server): `ExecStream::kill` ends it and its children in the pod, whatever their process
/// group, and the stream goes on to SIGKILL's exit.
#[tokio::test]
#[ignore = "needs a cluster"]
async fn kill_ends_a_streamed_command_and_its_children_in_the_pod() {
    let (env, pods) = setup("exec-kill").await;
    // stdin that stays open (the harness's end of a stdio server's pipe).
    let (_keep, stdin) = tokio::io::duplex(64);
    let mut s = exec::stream(
        &pods,
        "box",
        SANDBOX_CONTAINER,
        ExecRequest::shell(
            "trap '' HUP TERM; sleep 3124 & setsid sleep 3125 & echo up; sleep 3126",
        )
        .stdin_reader(stdin),
    )
    .await
    .expect("stream");
    assert!(s.process_id().is_some());
    let first = s.next().await.expect("event").expect("ok");
    assert_eq!(first, ExecEvent::Stdout("up\n".into()));
    let before = procs_matching(&pods, "312[456]").await;
    for p in ["sleep 3124", "sleep 3125", "sleep 3126"] {
        assert!(before.contains(p), "{p} is not running: {before}");
    }
    s.kill().await.expect("kill");
    let mut end = None;
    while let Some(ev) = s.next().await {
        if let ExecEvent::Exit { status, .. } = ev.expect("event") {
            end = Some(status);
        }
    }
    assert_eq!(end, Some(ExitStatus::Code(137)));
    let left = procs_matching(&pods, "312[456]").await;
    assert!(
        left.is_empty(),
        "left running in the pod after kill:\n{left}"
    );
    s.kill().await.expect("a second kill does nothing");
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn persistent_session_frames_a_thousand_commands() {
    let (env, pods) = setup("exec-session").await;
    let session = Session::new(pods.clone(), "box", SANDBOX_CONTAINER).with_workdir("/tmp");
    session.start().await.expect("start session");
    let mut times = Vec::with_capacity(1000);
    for i in 0..1000u32 {
        let req = ExecRequest::argv([
            "sh".to_string(),
            "-c".to_string(),
            // No trailing newline on stdout, to exercise sentinel detection mid-line.
            "printf 'out-%s' \"$0\"; echo \"err-$0\" >&2; exit $(($0 % 7))".to_string(),
            i.to_string(),
        ]);
        let t = Instant::now();
        let out = session.run(req).await.expect("session command");
        times.push(t.elapsed());
        assert_eq!(out.stdout_str(), format!("out-{i}"), "command {i}");
        assert_eq!(out.stderr_str(), format!("err-{i}\n"), "command {i}");
        assert_eq!(out.status, ExitStatus::Code((i % 7) as i32), "command {i}");
    }
    let p50 = barepod::pct(&mut times, 50);
    let p95 = barepod::pct(&mut times, 95);
    println!("session per-command latency: p50 {p50:.2} ms, p95 {p95:.2} ms");

    // Shell builtins that would end or change a plain shell do not leak across commands.
    let out = session
        .run(ExecRequest::shell("cd /; exit 5"))
        .await
        .expect("exit");
    assert_eq!(out.status, ExitStatus::Code(5));
    let out = session.run(ExecRequest::argv(["pwd"])).await.expect("pwd");
    assert_eq!(out.stdout_str(), "/tmp\n");
    // A session in a directory that does not exist fails its command, naming it.
    let lost = Session::new(pods.clone(), "box", SANDBOX_CONTAINER).with_workdir("/no/such/dir");
    match lost.run(ExecRequest::argv(["true"])).await {
        Err(ExecError::Session(m)) => assert!(m.contains("/no/such/dir"), "{m}"),
        other => panic!("a missing session directory: {other:?}"),
    }
    // A command reading stdin gets EOF instead of the following commands.
    let out = session.run(ExecRequest::argv(["cat"])).await.expect("cat");
    assert!(out.stdout.is_empty() && out.status.success());
    // Caps and timeouts work in the session too.
    let out = session
        .run(ExecRequest::shell("head -c 100000 /dev/zero").max_output(10))
        .await
        .expect("cap");
    assert!(out.stdout_truncated && out.stdout.len() == 10);
    let out = session
        .run(ExecRequest::shell("sleep 4119").timeout(Duration::from_secs(1)))
        .await
        .expect("timeout");
    assert!(out.timed_out && out.status.signal() == Some(9), "{out:?}");
    let left = procs_matching(&pods, "4119").await;
    assert!(left.is_empty(), "{left}");

    // The shell is killed between commands: the next command gets a new shell transparently.
    let out = session
        .run(ExecRequest::shell("echo $PPID"))
        .await
        .expect("ppid");
    let shell_pid = out.stdout_str().trim().to_string();
    run(&pods, ExecRequest::argv(["kill", "-KILL", &shell_pid])).await;
    let out = session
        .run(ExecRequest::argv(["echo", "again"]))
        .await
        .expect("recovered");
    assert_eq!(out.stdout_str(), "again\n");
    // The shell dies while a command runs: that command fails clearly, the next one works.
    let err = session
        .run(ExecRequest::shell("kill -KILL $PPID; sleep 1"))
        .await
        .expect_err("shell died mid-command");
    assert!(matches!(err, ExecError::Session(_)), "{err:?}");
    let out = session
        .run(ExecRequest::argv(["echo", "fine"]))
        .await
        .expect("recovered");
    assert_eq!(out.stdout_str(), "fine\n");
    session.close().await;
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn one_shot_latency_figures() {
    let (env, pods) = setup("exec-bench").await;
    let mut times = Vec::new();
    for _ in 0..60 {
        let t = Instant::now();
        let out = run(&pods, ExecRequest::argv(["true"])).await;
        times.push(t.elapsed());
        assert!(out.status.success());
    }
    times.drain(..10); // warm-up
    let p50 = barepod::pct(&mut times, 50);
    let p95 = barepod::pct(&mut times, 95);
    println!("one-shot exec latency: p50 {p50:.1} ms, p95 {p95:.1} ms");
    env.finish().await;
}
