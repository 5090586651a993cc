//! Lossless exec on the local cluster (issue 28): a reader slower than the command gets every
//! byte or an error, never a short result, through a streamed exec, `read_file` and a
//! directory download; a stream cut before its trailer is `ExecError::OutputCut`.
//!
//! Sizes: `LOSSLESS_MB` MiB per read (default 8), `LOSSLESS_N` reads (default 20), read at
//! `LOSSLESS_MBPS` MiB/s (default 4). The measurement is `LOSSLESS_MB=50`. With
//! `LOSSLESS_CONTROL=1` the same slow reads are also made bare (kube's own exec, no wrapper),
//! to show how many of them the cluster cuts short without the frame (printed, not asserted:
//! that is the cluster's behaviour, not agentbox's).

mod barepod;
mod common;

use std::time::{Duration, Instant};

use agentbox_api::exec::{
    self, ExecError, ExecEvent, ExecRequest, ExitStatus, OutputStream, SANDBOX_CONTAINER,
};
use agentbox_client::client::Workspace;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Makes `/workspace/big` of `mb` MiB of random bytes in the pod; returns its hex SHA-256 as
/// the pod computes it.
async fn big_file(pods: &Api<Pod>, mb: u64) -> String {
    let out = exec::run(
        pods,
        "box",
        SANDBOX_CONTAINER,
        ExecRequest::shell(format!(
            "head -c {} /dev/urandom > /workspace/big && sha256sum /workspace/big",
            mb << 20
        )),
    )
    .await
    .expect("make the file");
    assert!(out.status.success(), "{}", out.stderr_str());
    let sum = out.stdout_str();
    sum.split_whitespace().next().expect("a sum").to_string()
}

/// Sleeps as needed to keep `got` bytes since `start` at or under `rate` bytes/s.
async fn pace(start: Instant, got: u64, rate: u64) {
    let due = Duration::from_secs_f64(got as f64 / rate as f64);
    if let Some(wait) = due.checked_sub(start.elapsed()) {
        tokio::time::sleep(wait).await;
    }
}

/// What one slow read gave: every byte (its digest checked), a short result, or an error.
#[derive(Debug, PartialEq, Eq)]
enum Read {
    Whole,
    Short(u64),
    Error(String),
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_slow_reader_gets_every_byte_or_an_error_never_a_short_result() {
    let env = common::TestEnv::new("lossless-slow").await;
    let pods = barepod::start(&env.client, &env.ns, "box").await;
    let mb = env_num("LOSSLESS_MB", 8);
    let n = env_num("LOSSLESS_N", 20);
    let rate = env_num("LOSSLESS_MBPS", 4) << 20;
    let want = big_file(&pods, mb).await;
    let size = mb << 20;

    let mut results = Vec::new();
    let started = Instant::now();
    for _ in 0..n {
        let s = exec::stream(
            &pods,
            "box",
            SANDBOX_CONTAINER,
            ExecRequest::argv(["cat", "/workspace/big"]),
        )
        .await
        .expect("exec");
        let r = read_slowly(s, rate).await;
        results.push(match r {
            Ok((len, sum, status)) if len == size && sum == want && status.success() => Read::Whole,
            Ok((len, _, _)) => Read::Short(len),
            Err(e) => Read::Error(e.to_string()),
        });
    }
    let took = started.elapsed();
    let whole = results.iter().filter(|r| **r == Read::Whole).count();
    let short = results
        .iter()
        .filter(|r| matches!(r, Read::Short(_)))
        .count();
    println!(
        "slow reader, {n} × {mb} MiB at {} MiB/s through exec::stream: {whole} whole, {short} short, {} errors, {:.1} s",
        rate >> 20,
        results.len() - whole - short,
        took.as_secs_f64()
    );
    assert_eq!(short, 0, "short results: {results:?}");
    assert_eq!(whole as u64, n, "{results:?}");

    if std::env::var("LOSSLESS_CONTROL").is_ok_and(|v| v == "1") {
        let mut lens = Vec::new();
        for _ in 0..n {
            lens.push(read_bare_slowly(&pods, rate).await);
        }
        let short: Vec<u64> = lens.iter().copied().filter(|l| *l != size).collect();
        // The same bare read at full speed: the control itself loses nothing then.
        let fast = read_bare_slowly(&pods, u64::MAX >> 8).await;
        println!(
            "control, the same reads bare (kube's exec, no wrapper): {} of {n} short (MiB received: {:?}); one bare read at full speed: {} of {} bytes",
            short.len(),
            short.iter().map(|l| l >> 20).collect::<Vec<_>>(),
            fast,
            size
        );
    }
    env.finish().await;
}

/// Reads a streamed exec at `rate` bytes/s: its stdout's length and hex SHA-256, and status.
async fn read_slowly(
    mut s: exec::ExecStream,
    rate: u64,
) -> Result<(u64, String, ExitStatus), ExecError> {
    let start = Instant::now();
    let mut h = Sha256::new();
    let mut len = 0u64;
    while let Some(ev) = s.next().await {
        match ev? {
            ExecEvent::Stdout(b) => {
                h.update(&b);
                len += b.len() as u64;
                pace(start, len, rate).await;
            }
            ExecEvent::Stderr(_) => {}
            ExecEvent::Exit { status, .. } => {
                return Ok((len, hex::encode(h.finalize()), status));
            }
        }
    }
    Err(ExecError::Stream("no exit".into()))
}

/// The control: `cat` of the file through kube's own exec, no wrapper, read at `rate`.
async fn read_bare_slowly(pods: &Api<Pod>, rate: u64) -> u64 {
    let ap = kube::api::AttachParams::default()
        .container(SANDBOX_CONTAINER)
        .stdin(false)
        .stdout(true)
        .stderr(false);
    let mut p = pods
        .exec("box", ["cat", "/workspace/big"], &ap)
        .await
        .expect("bare exec");
    let mut out = p.stdout().expect("stdout");
    let start = Instant::now();
    let mut buf = vec![0u8; 32 << 10];
    let mut len = 0u64;
    loop {
        let k = out.read(&mut buf).await.unwrap_or(0);
        if k == 0 {
            break;
        }
        len += k as u64;
        pace(start, len, rate).await;
    }
    let _ = p.join().await;
    len
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn file_reads_and_downloads_are_whole() {
    let env = common::TestEnv::new("lossless-files").await;
    let pods = barepod::start(&env.client, &env.ns, "box").await;
    let mb = env_num("LOSSLESS_MB", 8);
    let want = big_file(&pods, mb).await;
    let ws = Workspace::new(pods.clone(), "box", SANDBOX_CONTAINER, "/workspace");
    for _ in 0..5 {
        let got = ws.read_file("big").await.expect("read_file");
        assert_eq!(got.len() as u64, mb << 20);
        assert_eq!(hex::encode(Sha256::digest(&got)), want);
    }
    let dir = std::env::temp_dir().join(format!("agentbox-lossless-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for _ in 0..3 {
        ws.download_dir(".", &dir).await.expect("download");
        let got = std::fs::read(dir.join("big")).expect("downloaded file");
        assert_eq!(hex::encode(Sha256::digest(&got)), want);
    }
    let _ = std::fs::remove_dir_all(&dir);
    env.finish().await;
}

#[tokio::test]
#[ignore = "needs a cluster"]
async fn a_stream_cut_before_its_trailer_is_an_error_not_a_short_result() {
    let env = common::TestEnv::new("lossless-cut").await;
    let pods = barepod::start(&env.client, &env.ns, "box").await;
    // The command kills the wrapper shell (its parent) before the wrapper could print its
    // trailer: what arrived is all there is, and it is not the whole output.
    let err = exec::run(
        &pods,
        "box",
        SANDBOX_CONTAINER,
        ExecRequest::shell("echo partial; kill -KILL $PPID; sleep 1"),
    )
    .await
    .expect_err("a cut stream");
    assert!(
        matches!(
            err,
            ExecError::OutputCut {
                stream: OutputStream::Stdout,
                received: 8
            }
        ),
        "{err:?}"
    );
    // The same through the streaming form: the output that arrived, then the error.
    let mut s = exec::stream(
        &pods,
        "box",
        SANDBOX_CONTAINER,
        ExecRequest::shell("echo partial; kill -KILL $PPID; sleep 1"),
    )
    .await
    .expect("exec");
    let first = s.next().await.expect("event").expect("output");
    assert_eq!(first, ExecEvent::Stdout("partial\n".into()));
    let last = s.next().await.expect("event");
    assert!(matches!(last, Err(ExecError::OutputCut { .. })), "{last:?}");
    // File operations go through the same frame.
    let ws = Workspace::new(pods.clone(), "box", SANDBOX_CONTAINER, "/workspace");
    ws.write_file("f", &b"0123456789"[..]).await.expect("write");
    assert_eq!(ws.read_file("f").await.expect("read"), b"0123456789");
    // A command that ends normally is still whole (control for the two above).
    let out = exec::run(
        &pods,
        "box",
        SANDBOX_CONTAINER,
        ExecRequest::shell("echo partial; sleep 1"),
    )
    .await
    .expect("whole");
    assert_eq!(out.stdout, b"partial\n");
    env.finish().await;
}
