//! Exec in a sandbox pod through the Kubernetes API (`pods/exec` over WebSocket).
//!
//! Used by the operator (workspace initialisation) and by the harness client. What it adds over
//! a bare `Api::<Pod>::exec`:
//! - the real exit code, parsed from the status channel ([`ExitStatus`]), never from stderr;
//! - a timeout that really stops the command in the container: dropping the WebSocket does not
//!   kill a remote process, so the command runs in its own process group under a small `sh`
//!   prologue with a watchdog that `kill -KILL`s the whole group when the time is up;
//! - no lost output: every command runs under [`WRAPPER`](crate::remote::WRAPPER), whose trailer (a fresh random mark
//!   at the end of stdout and of stderr) says a stream is whole, and which exits only once this
//!   side has read both trailers and half-closed stdin (output on its way when a process exits
//!   can be dropped: kubernetes/kubernetes#124571). A stream without its trailer is
//!   [`ExecError::OutputCut`], never a short result. docs/protocol.md, "Exec", has the whole
//!   protocol;
//! - a per-stream output cap: output past the cap is drained and dropped, and flagged;
//! - stdin from bytes or from any [`AsyncRead`], in large frames, half-closed when done or
//!   when the reader fails (`v5.channel.k8s.io`'s CLOSE frame gives the remote process a clean
//!   EOF);
//! - a streaming form ([`stream`]) that yields stdout/stderr chunks as they arrive;
//! - a persistent shell ([`session::Session`]) for low-latency command loops.

pub mod session;

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures::{FutureExt, SinkExt, Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

/// Name of the single container of every sandbox pod.
pub const SANDBOX_CONTAINER: &str = "sandbox";

/// Default cap on each of stdout and stderr kept by [`run`] (8 MiB).
pub const DEFAULT_MAX_OUTPUT: usize = 8 << 20;

/// How long to wait for the exit status after the timeout fired. The in-pod watchdog fires at
/// the same timeout measured from a later start, so the status normally follows within a
/// round trip; this only bounds a wedged connection.
pub const TIMEOUT_GRACE: Duration = Duration::from_secs(15);

/// Size of kube's in-process pipes for each stream of a persistent session. kube defaults to
/// 1 KiB, which turns a large transfer into thousands of tiny wake-ups.
pub(crate) const PIPE_BUF: usize = 256 << 10;

/// Largest stdin frame. kube's own exec loop sends stdin in 4 KiB WebSocket messages (its
/// `ReaderStream`'s default), each flushed on its own, which held a streamed restore to a third
/// of the speed of the stdout direction; this transport sends up to this much per message.
pub(crate) const STDIN_FRAME: usize = 256 << 10;

/// Interval of WebSocket pings on an exec connection, as kube sends them (keeps proxies from
/// dropping an exec that is silent for long).
const PING_EVERY: Duration = Duration::from_secs(60);

/// Channel numbers of the Kubernetes remote-command protocol (`v5.channel.k8s.io`).
pub(crate) const STDIN_CHANNEL: u8 = 0;
pub(crate) const STDOUT_CHANNEL: u8 = 1;
pub(crate) const STDERR_CHANNEL: u8 = 2;
pub(crate) const STATUS_CHANNEL: u8 = 3;
/// v5: `[CLOSE_CHANNEL, n]` half-closes channel n (stdin EOF for the process).
pub(crate) const CLOSE_CHANNEL: u8 = 255;

use crate::remote::WRAPPER;

/// Where a command's stdin comes from.
pub enum Stdin {
    /// A byte buffer, sent and then closed.
    Bytes(Bytes),
    /// A reader, streamed until EOF and then closed.
    Reader(Pin<Box<dyn AsyncRead + Send>>),
}

impl fmt::Debug for Stdin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stdin::Bytes(b) => write!(f, "Stdin::Bytes({} bytes)", b.len()),
            Stdin::Reader(_) => f.write_str("Stdin::Reader(..)"),
        }
    }
}

/// A command to run in a sandbox.
#[derive(Debug)]
pub struct ExecRequest {
    /// Program and arguments (no shell unless the program is one).
    pub argv: Vec<String>,
    /// stdin; `None` gives the command no stdin (it reads EOF).
    pub stdin: Option<Stdin>,
    /// Stop the command (its whole process group) after this long.
    pub timeout: Option<Duration>,
    /// Cap on the bytes kept of each of stdout and stderr.
    pub max_output: usize,
    /// Working directory; `None` keeps the container's.
    pub workdir: Option<String>,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
}

impl ExecRequest {
    /// A command given as program and arguments.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ExecRequest {
            argv: argv.into_iter().map(Into::into).collect(),
            stdin: None,
            timeout: None,
            max_output: DEFAULT_MAX_OUTPUT,
            workdir: None,
            env: Vec::new(),
        }
    }

    /// A shell script, run as `sh -c script`.
    pub fn shell(script: impl Into<String>) -> Self {
        Self::argv(["sh".to_string(), "-c".to_string(), script.into()])
    }

    /// Send these bytes on stdin, then close it.
    pub fn stdin(mut self, bytes: impl Into<Bytes>) -> Self {
        self.stdin = Some(Stdin::Bytes(bytes.into()));
        self
    }

    /// Stream stdin from a reader until EOF, then close it.
    pub fn stdin_reader(mut self, reader: impl AsyncRead + Send + 'static) -> Self {
        self.stdin = Some(Stdin::Reader(Box::pin(reader)));
        self
    }

    /// Stop the command after `d`.
    pub fn timeout(mut self, d: Duration) -> Self {
        self.timeout = Some(d);
        self
    }

    /// Keep at most `n` bytes of each of stdout and stderr.
    pub fn max_output(mut self, n: usize) -> Self {
        self.max_output = n;
        self
    }

    /// Run in this directory.
    pub fn workdir(mut self, p: impl Into<String>) -> Self {
        self.workdir = Some(p.into());
        self
    }

    /// Set an environment variable.
    pub fn env(mut self, k: impl Into<String>, v: impl Into<String>) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// The wrapper's `STDIN` parameter: `-` no stdin (and none of zero bytes: the command
    /// reads EOF either way), `K` for `K` bytes, `=` for a stream of unknown length.
    pub(crate) fn stdin_mode(&self) -> String {
        match &self.stdin {
            None => "-".into(),
            Some(Stdin::Bytes(b)) if b.is_empty() => "-".into(),
            Some(Stdin::Bytes(b)) => b.len().to_string(),
            Some(Stdin::Reader(_)) => "=".into(),
        }
    }

    fn check(&self) -> Result<(), ExecError> {
        if self.argv.is_empty() {
            return Err(ExecError::Invalid("empty argv".into()));
        }
        for (k, _) in &self.env {
            if !is_env_name(k) {
                return Err(ExecError::Invalid(format!(
                    "invalid environment variable name {k:?}"
                )));
            }
        }
        Ok(())
    }

    /// The argv a one-shot exec sends: `sh -c WRAPPER agentbox-exec MARK STDIN TIMEOUT
    /// WORKDIR N ENV... ARGV...` ([`WRAPPER`]), always, since the trailer is what tells the
    /// client it has every byte.
    pub(crate) fn remote_argv(&self, mark: &str) -> Result<Vec<String>, ExecError> {
        self.check()?;
        Ok(self.wrapped(mark, &self.stdin_mode()))
    }

    /// The argv of a command in a persistent session, whose shell outlives the command (so
    /// nothing is cut and no trailer is needed): the command itself when it needs no
    /// settings, otherwise the wrapper with an empty mark. Its stdin is always `/dev/null`.
    pub(crate) fn session_argv(&self) -> Result<Vec<String>, ExecError> {
        self.check()?;
        if self.timeout.is_none() && self.workdir.is_none() && self.env.is_empty() {
            return Ok(self.argv.clone());
        }
        Ok(self.wrapped("", "-"))
    }

    fn wrapped(&self, mark: &str, stdin: &str) -> Vec<String> {
        let mut v = vec![
            "sh".to_string(),
            "-c".to_string(),
            WRAPPER.to_string(),
            "agentbox-exec".to_string(),
            mark.to_string(),
            stdin.to_string(),
            self.timeout.map(sleep_arg).unwrap_or_default(),
            self.workdir.clone().unwrap_or_default(),
            self.env.len().to_string(),
        ];
        v.extend(self.env.iter().map(|(k, val)| format!("{k}={val}")));
        v.extend(self.argv.iter().cloned());
        v
    }
}

/// A fresh mark: `__AGENTBOX_` + 32 lowercase hex digits (16 random bytes) + `_`. The
/// one-shot exec's trailer and a persistent session's sentinels.
pub(crate) fn new_mark() -> String {
    let nonce: u128 = rand::random();
    format!("__AGENTBOX_{nonce:032x}_")
}

/// The client's half of the trailer (docs/protocol.md, "What the client does"): passes a
/// stream's bytes on, holding back the longest suffix of what has arrived that is a prefix of
/// the mark (at most the whole mark), so the mark never reaches the caller and ordinary output
/// is held back only while it ends like the start of a mark. The stream is whole when what is
/// held back is the whole mark, or the whole memory trailer
/// ([`memory_trailer`](crate::remote::memory_trailer): the mark with its last character `!`,
/// which the wrapper prints when the command was killed for memory); the hold-back treats both
/// alike.
#[derive(Debug)]
pub(crate) struct Trailer {
    mark: Vec<u8>,
    memory: Vec<u8>,
    held: Vec<u8>,
    received: u64,
}

impl Trailer {
    pub(crate) fn new(mark: &str) -> Self {
        Trailer {
            mark: mark.as_bytes().to_vec(),
            memory: crate::remote::memory_trailer(mark).into_bytes(),
            held: Vec::new(),
            received: 0,
        }
    }

    /// Whether byte `b` may stand at position `j` of a trailer (the mark or the memory
    /// trailer, which differ only in their last byte).
    fn fits(&self, j: usize, b: u8) -> bool {
        self.mark[j] == b || self.memory.get(j) == Some(&b)
    }

    /// Takes the next chunk of the stream; returns the bytes to pass on (possibly empty).
    pub(crate) fn push(&mut self, chunk: Bytes) -> Bytes {
        self.received += chunk.len() as u64;
        let held = self.held.len();
        let total = held + chunk.len();
        let at = |i: usize| {
            if i < held {
                self.held[i]
            } else {
                chunk[i - held]
            }
        };
        let mut k = self.mark.len().min(total);
        while k > 0 && !(0..k).all(|j| self.fits(j, at(total - k + j))) {
            k -= 1;
        }
        let pass = total - k;
        if pass <= held {
            // Everything new is held back, with the end of what was.
            let out = Bytes::copy_from_slice(&self.held[..pass]);
            self.held.drain(..pass);
            self.held.extend_from_slice(&chunk);
            out
        } else if held == 0 {
            self.held.extend_from_slice(&chunk[pass..]);
            chunk.slice(..pass)
        } else {
            let mut out = BytesMut::with_capacity(pass);
            out.put_slice(&self.held);
            out.put_slice(&chunk[..pass - held]);
            self.held.clear();
            self.held.extend_from_slice(&chunk[pass - held..]);
            out.freeze()
        }
    }

    /// Whether the stream, as far as it has arrived, ends with the mark or the memory trailer.
    pub(crate) fn whole(&self) -> bool {
        self.held == self.mark || self.memory_killed()
    }

    /// Whether the stream, as far as it has arrived, ends with the memory trailer: the wrapper
    /// found the command killed for memory.
    pub(crate) fn memory_killed(&self) -> bool {
        !self.mark.is_empty() && self.held == self.memory
    }

    /// Bytes received so far, the mark's included.
    pub(crate) fn received(&self) -> u64 {
        self.received
    }
}

/// `sleep` argument for a duration: seconds with millisecond precision (busybox `sleep` takes
/// fractions), at least 1 ms.
pub(crate) fn sleep_arg(d: Duration) -> String {
    let ms = d.as_millis().max(1);
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// Whether `k` is a portable environment variable name.
fn is_env_name(k: &str) -> bool {
    let mut b = k.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// How a command ended, as reported by the exec status channel.
///
/// Through the CRI (containerd, CRI-O) a process killed by signal N is reported as exit code
/// 128+N, exactly like a process that exits with that code, so the two cannot be told apart;
/// [`ExitStatus::signal`] applies the shell convention for display.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    /// The process exited with this code (0 = success).
    Code(i32),
    /// The process ended without an exit code; the runtime's message, verbatim.
    Unknown(String),
}

impl ExitStatus {
    /// The exit code, when there is one.
    pub fn code(&self) -> Option<i32> {
        match self {
            ExitStatus::Code(c) => Some(*c),
            ExitStatus::Unknown(_) => None,
        }
    }

    /// Exit code 0.
    pub fn success(&self) -> bool {
        self.code() == Some(0)
    }

    /// The signal N when the code is 128+N (shell convention; a process may also exit with
    /// such a code on purpose).
    pub fn signal(&self) -> Option<i32> {
        match self.code() {
            Some(c) if (129..=128 + 64).contains(&c) => Some(c - 128),
            _ => None,
        }
    }
}

impl fmt::Display for ExitStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitStatus::Code(c) => match self.signal() {
                Some(s) => write!(f, "exit code {c} (signal {s}?)"),
                None => write!(f, "exit code {c}"),
            },
            ExitStatus::Unknown(m) => write!(f, "unknown exit status: {m}"),
        }
    }
}

/// The collected result of [`run`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecOutput {
    /// stdout, at most `max_output` bytes.
    pub stdout: Vec<u8>,
    /// stderr, at most `max_output` bytes.
    pub stderr: Vec<u8>,
    /// How the command ended.
    pub status: ExitStatus,
    /// stdout was longer than the cap; the rest was dropped.
    pub stdout_truncated: bool,
    /// stderr was longer than the cap; the rest was dropped.
    pub stderr_truncated: bool,
    /// The timeout passed before the command ended; it was killed.
    pub timed_out: bool,
}

impl ExecOutput {
    /// stdout as (lossy) UTF-8.
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as (lossy) UTF-8.
    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }

    /// Exit code 0 and no timeout.
    pub fn success(&self) -> bool {
        self.status.success() && !self.timed_out
    }
}

/// One event of a streamed exec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecEvent {
    /// A chunk of stdout.
    Stdout(Bytes),
    /// A chunk of stderr.
    Stderr(Bytes),
    /// The command ended; always the last event.
    Exit {
        /// How it ended.
        status: ExitStatus,
        /// The timeout passed before it ended.
        timed_out: bool,
    },
}

/// Exec failures. [`ExecError::is_transient`] tells the retryable ones apart.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The request itself is wrong (empty argv, bad env name).
    #[error("invalid exec request: {0}")]
    Invalid(String),
    /// The exec could not be opened: API server, pod or container unreachable (transient).
    #[error("cannot open exec to pod {pod}: {source}")]
    Connect {
        /// Pod name.
        pod: String,
        /// Underlying error.
        #[source]
        source: kube::Error,
    },
    /// The runtime refused to start the command (container not running; a program that does
    /// not exist is exit code 127 from the wrapper's shell).
    #[error("command could not start: {0}")]
    NotStarted(String),
    /// The connection broke while the command ran; it may or may not have finished
    /// (transient, but not safely retryable for non-idempotent commands).
    #[error("exec stream failed: {0}")]
    Stream(String),
    /// The timeout passed and no exit status arrived within the grace period.
    #[error("command timed out after {0:?} and no exit status arrived")]
    Timeout(Duration),
    /// A persistent session failed (see [`session`]).
    #[error("session: {0}")]
    Session(String),
    /// A stream of the command's output did not end with the wrapper's trailer: bytes were
    /// lost on the way (kubernetes/kubernetes#124571) or the wrapper was killed. The command
    /// ran (in part or whole); its output is not reported, since it is not all there.
    #[error(
        "the command's {stream} was cut: {received} bytes arrived without the end of the stream"
    )]
    OutputCut {
        /// Which stream.
        stream: OutputStream,
        /// Bytes of that stream that arrived.
        received: u64,
    },
    /// The command was killed for memory: the kernel's OOM killer ended it (its container's
    /// OOM kill counter rose while it ran and it died of SIGKILL, exit code 137), or the whole
    /// sandbox container was killed for memory (the kubelet's `OOMKilled`) while it ran. Not
    /// transient: the same command will most likely run out again; raise the sandbox's
    /// `resources.limits.memory`, or make the command use less.
    #[error("{}", oom_message(*.container))]
    OutOfMemory {
        /// The whole container was killed (every process in it, sessions too), not only the
        /// command.
        container: bool,
    },
}

fn oom_message(container: bool) -> &'static str {
    if container {
        "out of memory: the sandbox's container was killed for memory (OOMKilled) while the command ran, and every process in it with it; raise the sandbox's resources.limits.memory"
    } else {
        "out of memory: the command was killed for memory (the kernel's OOM killer, exit code 137) when its container reached its memory limit; raise the sandbox's resources.limits.memory"
    }
}

/// One of a command's output streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputStream {
    /// stdout.
    Stdout,
    /// stderr.
    Stderr,
}

impl fmt::Display for OutputStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        })
    }
}

impl ExecError {
    /// Every [`ExecError::kind`].
    pub const KINDS: [&'static str; 8] = [
        "invalid",
        "connect",
        "not_started",
        "stream",
        "timeout",
        "session",
        "output_cut",
        "out_of_memory",
    ];

    /// A short kind for metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            ExecError::Invalid(_) => "invalid",
            ExecError::Connect { .. } => "connect",
            ExecError::NotStarted(_) => "not_started",
            ExecError::Stream(_) => "stream",
            ExecError::Timeout(_) => "timeout",
            ExecError::Session(_) => "session",
            ExecError::OutputCut { .. } => "output_cut",
            ExecError::OutOfMemory { .. } => "out_of_memory",
        }
    }

    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            ExecError::Connect { source, .. } => match source {
                kube::Error::Api(s) => s.code >= 500 || s.code == 429 || s.code == 404,
                _ => true,
            },
            ExecError::Stream(_)
            | ExecError::Timeout(_)
            | ExecError::Session(_)
            | ExecError::OutputCut { .. } => true,
            ExecError::Invalid(_) | ExecError::NotStarted(_) | ExecError::OutOfMemory { .. } => {
                false
            }
        }
    }
}

/// Maps the status-channel object to an exit status. `Success` is 0; `NonZeroExitCode` carries
/// the code in a cause with reason `ExitCode`. Anything else means the command never ran.
pub fn parse_status(s: &Status) -> Result<ExitStatus, ExecError> {
    if s.status.as_deref() == Some("Success") {
        return Ok(ExitStatus::Code(0));
    }
    let code = s.details.as_ref().and_then(|d| {
        d.causes.iter().flatten().find_map(|c| {
            (c.reason.as_deref() == Some("ExitCode"))
                .then(|| {
                    c.message
                        .as_deref()
                        .and_then(|m| m.trim().parse::<i32>().ok())
                })
                .flatten()
        })
    });
    match (s.reason.as_deref(), code) {
        (Some("NonZeroExitCode"), Some(c)) => Ok(ExitStatus::Code(c)),
        (Some("NonZeroExitCode"), None) => {
            Ok(ExitStatus::Unknown(s.message.clone().unwrap_or_default()))
        }
        _ => Err(ExecError::NotStarted(
            s.message
                .clone()
                .or_else(|| s.reason.clone())
                .unwrap_or_else(|| "exec failed without a message".into()),
        )),
    }
}

/// A streamed exec: yields stdout/stderr chunks as they arrive, then exactly one
/// [`ExecEvent::Exit`]. Dropping it closes the connection, which does not stop the command
/// (one that ignores the end of its stdin keeps running in the pod, unless it had a timeout):
/// [`ExecStream::kill`] does.
pub struct ExecStream {
    rx: mpsc::Receiver<Result<ExecEvent, ExecError>>,
    killer: Option<Killer>,
}

/// What killing a streamed command needs: where it runs, its process id
/// ([`crate::remote::PROCESS_ENV`]), and the stdin sender's stop.
struct Killer {
    pods: Api<Pod>,
    pod: String,
    container: String,
    id: String,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl ExecStream {
    /// The command's `AGENTBOX_PROCESS` id ([`crate::remote::PROCESS_ENV`]), which what it
    /// starts inherits; `None` once killed.
    pub fn process_id(&self) -> Option<&str> {
        self.killer.as_ref().map(|k| k.id.as_str())
    }

    /// Kills the command and every process it started that carries its
    /// [`crate::remote::PROCESS_ENV`] entry, in the pod, whatever their process group (a second
    /// exec runs [`crate::remote::PROCESSES`]), then half-closes its stdin, so the stream goes
    /// on to its [`ExecEvent::Exit`] (SIGKILL's code 137): read it to the end. A second call
    /// does nothing.
    pub async fn kill(&mut self) -> Result<(), ExecError> {
        let Some(k) = self.killer.take() else {
            return Ok(());
        };
        let req = ExecRequest::argv(crate::remote::sh(
            crate::remote::PROCESSES,
            ["kill".to_string(), k.id.clone()],
        ));
        let out = Box::pin(run(&k.pods, &k.pod, &k.container, req)).await;
        // Whatever the kill's outcome: stdin is no longer sent, so the wrapper ends once the
        // command has.
        let _ = k.stop.send(());
        let out = out?;
        match out.status {
            ExitStatus::Code(0) => Ok(()),
            s => Err(ExecError::Stream(format!(
                "killing the command's processes in the pod failed ({s:?}): {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ))),
        }
    }
}

impl Stream for ExecStream {
    type Item = Result<ExecEvent, ExecError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// Starts a command and returns its event stream. The connection is open when this returns
/// (connection errors come back here, not from the stream).
///
/// The command runs under [`WRAPPER`] with a fresh mark: the stream yields its output without
/// the trailer, and ends with [`ExecError::OutputCut`] instead of the exit when a stream of
/// its output did not end with the mark. The remote-command protocol is spoken here rather
/// than through kube's `AttachedProcess`: that one moves every byte through in-process pipes
/// and sends stdin in 4 KiB messages.
pub async fn stream(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    mut req: ExecRequest,
) -> Result<ExecStream, ExecError> {
    let mark = new_mark();
    // The command's process id: a fresh random one, in its environment for ExecStream::kill.
    let id = new_mark()["__AGENTBOX_".len()..]
        .trim_end_matches('_')
        .to_string();
    req.env.retain(|(k, _)| k != crate::remote::PROCESS_ENV);
    req.env
        .push((crate::remote::PROCESS_ENV.to_string(), id.clone()));
    let argv = req.remote_argv(&mark)?;
    // Open with stdin whatever the command reads: the exec's stdin is what the wrapper
    // lingers on until the client has read both trailers.
    let linger = req.stdin_mode() != "=";
    let conn = connect(pods, pod, container, argv, true).await?;
    if !conn.supports_stream_close() {
        // Without a half-close the wrapper's linger could only end with the connection, and
        // the exit status with it.
        return Err(ExecError::Stream(
            "the API server spoke v4.channel.k8s.io; agentbox exec needs v5.channel.k8s.io \
             (Kubernetes 1.30 or later)"
                .into(),
        ));
    }
    let (tx, rx) = mpsc::channel(16);
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let frame = Frame {
        mark,
        linger,
        stdin: true,
        stop: Some(stopped),
    };
    tokio::spawn(drive(conn, req.stdin, req.timeout, frame, tx));
    Ok(ExecStream {
        rx,
        killer: Some(Killer {
            pods: pods.clone(),
            pod: pod.to_string(),
            container: container.to_string(),
            id,
            stop,
        }),
    })
}

/// Opens the exec connection of `argv` (stdin open or not).
async fn connect(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    argv: Vec<String>,
    stdin: bool,
) -> Result<kube::client::Connection, ExecError> {
    let ap = AttachParams::default()
        .container(container)
        .stdin(stdin)
        .stdout(true)
        .stderr(true);
    let mut http = kube::core::Request::new(pods.resource_url())
        .exec(pod, argv, &ap)
        .map_err(|e| ExecError::Invalid(e.to_string()))?;
    http.extensions_mut().insert("exec");
    pods.clone()
        .into_client()
        .connect(http)
        .await
        .map_err(|source| ExecError::Connect {
            pod: pod.to_string(),
            source,
        })
}

/// The frame of an exec without [`WRAPPER`]: an empty mark (every stream is whole as it is),
/// no linger.
fn unwrapped_frame(stdin: bool) -> Frame {
    Frame {
        mark: String::new(),
        linger: false,
        stdin,
        stop: None,
    }
}

/// Runs `argv` as it is, without [`WRAPPER`]: no trailer, no linger, no stdin, the framing
/// one-shot execs had before the lossless protocol (and `kubectl exec`'s), over the same
/// transport. Its output can lose its tail with no error (kubernetes/kubernetes#124571), so
/// it is for what needs no output and has no shell: benches/exec.rs measures what the wrapper
/// costs with it, interleaved with [`run`], and the operator hands the egress proxy (an image
/// without a shell) its table with it, reading only the exit status.
#[doc(hidden)]
pub async fn run_unwrapped(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    argv: Vec<String>,
) -> Result<ExecOutput, ExecError> {
    if argv.is_empty() {
        return Err(ExecError::Invalid("empty argv".into()));
    }
    let conn = connect(pods, pod, container, argv, false).await?;
    let (tx, rx) = mpsc::channel(16);
    let frame = unwrapped_frame(false);
    tokio::spawn(drive(conn, None, None, frame, tx));
    collect(ExecStream { rx, killer: None }, DEFAULT_MAX_OUTPUT).await
}

/// [`run_unwrapped`] with `stdin` sent to the command, then its stdin half-closed: for what
/// must not be in the command line (which is in the exec request's URL, so in the API
/// server's audit log, and in the pod's process list), such as the egress proxy's table with
/// its credentials. The command should read a known length: its stdin's end is passed on
/// only where the API server speaks `v5.channel.k8s.io`.
pub async fn run_unwrapped_stdin(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    argv: Vec<String>,
    stdin: Bytes,
) -> Result<ExecOutput, ExecError> {
    if argv.is_empty() {
        return Err(ExecError::Invalid("empty argv".into()));
    }
    let conn = connect(pods, pod, container, argv, true).await?;
    let (tx, rx) = mpsc::channel(16);
    let frame = unwrapped_frame(true);
    tokio::spawn(drive(conn, Some(Stdin::Bytes(stdin)), None, frame, tx));
    collect(ExecStream { rx, killer: None }, DEFAULT_MAX_OUTPUT).await
}

/// Streams `argv` as it is, without [`WRAPPER`] (so in a container without a shell), its
/// stdin read from `stdin` until EOF and then half-closed. With no trailer, the command itself
/// must not exit before the client has its whole output (kubernetes/kubernetes#124571): the
/// node helper's `archive` job writes an archive whose end marker the client recognises, then
/// waits for its stdin to end, which the client ends once the marker has arrived (as
/// `TAR_SCRIPT` does for the wrapped path). No timeout: the caller bounds it.
pub async fn stream_unwrapped(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    argv: Vec<String>,
    stdin: impl AsyncRead + Send + 'static,
) -> Result<ExecStream, ExecError> {
    if argv.is_empty() {
        return Err(ExecError::Invalid("empty argv".into()));
    }
    let conn = connect(pods, pod, container, argv, true).await?;
    if !conn.supports_stream_close() {
        return Err(ExecError::Stream(
            "the API server spoke v4.channel.k8s.io; a stream whose end is signalled on stdin \
             needs v5.channel.k8s.io (Kubernetes 1.30 or later)"
                .into(),
        ));
    }
    let (tx, rx) = mpsc::channel(16);
    let frame = unwrapped_frame(true);
    let stdin = Stdin::Reader(Box::pin(stdin));
    tokio::spawn(drive(conn, Some(stdin), None, frame, tx));
    Ok(ExecStream { rx, killer: None })
}

/// Runs a command to completion and collects its output (each stream capped at
/// `req.max_output`; the rest is read and dropped so the command is never blocked).
pub async fn run(
    pods: &Api<Pod>,
    pod: &str,
    container: &str,
    req: ExecRequest,
) -> Result<ExecOutput, ExecError> {
    let cap = req.max_output;
    collect(stream(pods, pod, container, req).await?, cap).await
}

/// A stream's output, each stream capped at `cap`, and its exit.
async fn collect(mut s: ExecStream, cap: usize) -> Result<ExecOutput, ExecError> {
    use futures::StreamExt;
    let mut out = Capped::new(cap);
    let mut err = Capped::new(cap);
    while let Some(ev) = s.next().await {
        match ev? {
            ExecEvent::Stdout(b) => out.push(&b),
            ExecEvent::Stderr(b) => err.push(&b),
            ExecEvent::Exit { status, timed_out } => {
                return Ok(ExecOutput {
                    stdout: out.buf,
                    stderr: err.buf,
                    status,
                    stdout_truncated: out.truncated,
                    stderr_truncated: err.truncated,
                    timed_out,
                });
            }
        }
    }
    Err(ExecError::Stream(
        "stream ended without an exit status".into(),
    ))
}

/// A byte buffer that keeps at most `cap` bytes and remembers whether it dropped any (a
/// command's stderr kept for an error message, say).
#[derive(Debug)]
pub struct Capped {
    /// The bytes kept, at most `cap`.
    pub buf: Vec<u8>,
    /// The most bytes kept.
    pub cap: usize,
    /// Whether bytes were dropped.
    pub truncated: bool,
}

impl Capped {
    /// An empty buffer that keeps at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Capped {
            buf: Vec::new(),
            cap,
            truncated: false,
        }
    }

    /// Appends what fits of `b`.
    pub fn push(&mut self, b: &[u8]) {
        let room = self.cap.saturating_sub(self.buf.len());
        if b.len() > room {
            self.truncated = true;
        }
        self.buf.extend_from_slice(&b[..b.len().min(room)]);
    }
}

/// What a wrapped command's connection needs to know of its wrapper: the trailer's mark, and
/// whether the wrapper lingers until stdin is half-closed.
struct Frame {
    mark: String,
    linger: bool,
    /// Whether the exec has a stdin to half-close (only [`run_unwrapped`]'s has none).
    stdin: bool,
    /// Told by [`ExecStream::kill`]: stop sending stdin and half-close it.
    stop: Option<tokio::sync::oneshot::Receiver<()>>,
}

/// Pumps one exec connection: stdin in, stdout/stderr out as events, then the exit status.
async fn drive(
    conn: kube::client::Connection,
    stdin: Option<Stdin>,
    timeout: Option<Duration>,
    frame: Frame,
    tx: mpsc::Sender<Result<ExecEvent, ExecError>>,
) {
    let result = pump(conn, stdin, timeout, frame, &tx).await;
    let _ = tx.send(result).await;
    // Dropping the connection closes it.
}

async fn pump(
    conn: kube::client::Connection,
    stdin: Option<Stdin>,
    timeout: Option<Duration>,
    frame: Frame,
    tx: &mpsc::Sender<Result<ExecEvent, ExecError>>,
) -> Result<ExecEvent, ExecError> {
    let (sink, mut incoming) = conn.into_stream().split();
    // Told when both trailers have arrived: then stdin is half-closed, which ends the
    // wrapper's linger.
    let (read_all, all_read) = tokio::sync::oneshot::channel();
    let mut read_all = Some(read_all);
    // stdin runs on its own task so that a slow or never-reading command cannot stall output.
    let sender = tokio::spawn(send_stdin(
        sink,
        stdin,
        frame.linger,
        frame.stdin,
        all_read,
        frame.stop,
    ));
    let mut out = Trailer::new(&frame.mark);
    let mut err = Trailer::new(&frame.mark);
    let start = tokio::time::Instant::now();
    let far = start + Duration::from_secs(100 * 365 * 24 * 3600);
    let deadline = timeout.map(|t| start + t).unwrap_or(far);
    let mut timed_out = false;
    // Two timers, made once: a timer made afresh in each turn of the loop is registered in
    // the timer wheel and dropped again for every message, and a command can send tens of
    // thousands of them.
    let fire = tokio::time::sleep_until(deadline);
    let give_up = tokio::time::sleep_until(far);
    tokio::pin!(fire, give_up);
    let result = loop {
        tokio::select! {
            msg = incoming.next() => match msg {
                Some(Ok(Message::Binary(b))) if b.len() > 1 => {
                    let ev = match b[0] {
                        STDOUT_CHANNEL => ExecEvent::Stdout(out.push(b.slice(1..))),
                        STDERR_CHANNEL => ExecEvent::Stderr(err.push(b.slice(1..))),
                        STATUS_CHANNEL => {
                            let st: Status = serde_json::from_slice(&b[1..])
                                .map_err(|e| ExecError::Stream(format!("bad status: {e}")))?;
                            break Ok(st);
                        }
                        _ => continue,
                    };
                    if out.whole() && err.whole()
                        && let Some(t) = read_all.take()
                    {
                        let _ = t.send(());
                    }
                    let empty = match &ev {
                        ExecEvent::Stdout(c) | ExecEvent::Stderr(c) => c.is_empty(),
                        ExecEvent::Exit { .. } => false,
                    };
                    if !empty && tx.send(Ok(ev)).await.is_err() {
                        break Err(ExecError::Stream("receiver dropped".into()));
                    }
                }
                // The server sends only binary messages; a close ends the stream.
                Some(Ok(Message::Close(_))) | None => break Err(ExecError::Stream(
                    "connection closed without an exit status".into(),
                )),
                Some(Ok(_)) => {}
                Some(Err(e)) => break Err(ExecError::Stream(format!("reading: {e}"))),
            },
            _ = &mut fire, if !timed_out && timeout.is_some() => {
                timed_out = true;
                give_up.as_mut().reset(tokio::time::Instant::now() + TIMEOUT_GRACE);
            },
            _ = &mut give_up, if timed_out => {
                break Err(ExecError::Timeout(timeout.unwrap_or_default()));
            },
        }
    };
    sender.abort();
    // A command that never started has no trailer to miss.
    let status = parse_status(&result?)?;
    for (t, stream) in [(&out, OutputStream::Stdout), (&err, OutputStream::Stderr)] {
        if !t.whole() {
            return Err(ExecError::OutputCut {
                stream,
                received: t.received(),
            });
        }
    }
    if out.memory_killed() || err.memory_killed() {
        return Err(ExecError::OutOfMemory { container: false });
    }
    // The client deadline starts before the in-pod watchdog, so a command the watchdog killed
    // is always seen as timed out here.
    let timed_out = timed_out || timeout.is_some_and(|t| start.elapsed() >= t);
    Ok(ExecEvent::Exit { status, timed_out })
}

/// Sends stdin (if any) in frames of up to [`STDIN_FRAME`], then pings until aborted. stdin
/// is half-closed at its end when the wrapper does not linger (`=`), otherwise once
/// `all_read` says both trailers arrived (which also stops what is left of the data: the
/// command has ended). A failed send means the connection is gone: the receiving side reports
/// that.
async fn send_stdin<S>(
    mut sink: S,
    stdin: Option<Stdin>,
    linger: bool,
    open: bool,
    all_read: tokio::sync::oneshot::Receiver<()>,
    stop: Option<tokio::sync::oneshot::Receiver<()>>,
) where
    S: futures::Sink<Message> + Unpin,
{
    let mut all_read = all_read.fuse();
    // Only a stop sent counts: a dropped ExecStream leaves stdin as it was.
    let mut stop = Box::pin(async move {
        let sent = match stop {
            Some(r) => r.await.is_ok(),
            None => false,
        };
        if !sent {
            std::future::pending::<()>().await;
        }
    });
    let mut read = false;
    if let Some(src) = stdin {
        let data = async {
            match src {
                Stdin::Bytes(b) => {
                    for part in b.chunks(STDIN_FRAME) {
                        let mut f = BytesMut::with_capacity(1 + part.len());
                        f.put_u8(STDIN_CHANNEL);
                        f.put_slice(part);
                        if sink.send(Message::Binary(f.freeze())).await.is_err() {
                            return false;
                        }
                    }
                    true
                }
                Stdin::Reader(mut r) => loop {
                    // A failed source ends stdin like EOF, and the exec still waits for the
                    // command to exit: dropping the connection instead would leave the command
                    // running in the pod. Callers that stream from a fallible source check it
                    // themselves (a restore checks what its reader forwarded).
                    let (frame, eof) = next_frame(&mut r).await.unwrap_or((None, true));
                    if let Some(f) = frame
                        && sink.send(Message::Binary(f)).await.is_err()
                    {
                        break false;
                    }
                    if eof {
                        break true;
                    }
                },
            }
        };
        let sent = tokio::select! {
            sent = data => sent,
            _ = &mut all_read => {
                read = true;
                true
            }
            _ = &mut stop => {
                read = true;
                true
            }
        };
        if !sent {
            return;
        }
    }
    let close = || Message::Binary(Bytes::from_static(&[CLOSE_CHANNEL, STDIN_CHANNEL]));
    if open && (!linger || read) && sink.send(close()).await.is_err() {
        return;
    }
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    loop {
        tokio::select! {
            _ = ping.tick() => {
                if sink.send(Message::Ping(Bytes::new())).await.is_err() {
                    return;
                }
            }
            _ = &mut all_read, if linger && !read => {
                read = true;
                if sink.send(close()).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Reads the next stdin frame: waits for some bytes, then takes whatever more is ready at
/// once, up to [`STDIN_FRAME`] (a trickling interactive source is not held back). Returns the
/// frame (`None` when nothing was read) and whether the source ended.
async fn next_frame(
    r: &mut Pin<Box<dyn AsyncRead + Send>>,
) -> std::io::Result<(Option<Bytes>, bool)> {
    let mut f = BytesMut::with_capacity(1 + STDIN_FRAME);
    f.put_u8(STDIN_CHANNEL);
    let mut eof = false;
    let mut first = true;
    while f.len() < 1 + STDIN_FRAME {
        let room = 1 + STDIN_FRAME - f.len();
        let mut limited = (&mut f).limit(room);
        let n = if first {
            first = false;
            r.read_buf(&mut limited).await?
        } else {
            match r.read_buf(&mut limited).now_or_never() {
                Some(n) => n?,
                None => break,
            }
        };
        if n == 0 {
            eof = true;
            break;
        }
    }
    let frame = (f.len() > 1).then(|| f.freeze());
    Ok((frame, eof))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

    #[test]
    fn every_error_kind_is_listed_once() {
        let all = [
            ExecError::Invalid(String::new()),
            ExecError::Connect {
                pod: "p".into(),
                source: kube::Error::LinesCodecMaxLineLengthExceeded,
            },
            ExecError::NotStarted(String::new()),
            ExecError::Stream(String::new()),
            ExecError::Timeout(Duration::ZERO),
            ExecError::Session(String::new()),
            ExecError::OutputCut {
                stream: OutputStream::Stdout,
                received: 0,
            },
            ExecError::OutOfMemory { container: false },
        ];
        let kinds: Vec<&str> = all.iter().map(ExecError::kind).collect();
        assert_eq!(kinds, ExecError::KINDS);
    }

    fn failure(reason: &str, causes: Vec<(&str, &str)>, msg: &str) -> Status {
        Status {
            status: Some("Failure".into()),
            reason: Some(reason.into()),
            message: Some(msg.into()),
            details: Some(StatusDetails {
                causes: Some(
                    causes
                        .into_iter()
                        .map(|(r, m)| StatusCause {
                            reason: Some(r.into()),
                            message: Some(m.into()),
                            field: None,
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn status_success_is_zero() {
        let s = Status {
            status: Some("Success".into()),
            ..Default::default()
        };
        assert_eq!(parse_status(&s).unwrap(), ExitStatus::Code(0));
    }

    #[test]
    fn status_non_zero_exit_code() {
        let s = failure(
            "NonZeroExitCode",
            vec![("ExitCode", "42")],
            "command terminated with non-zero exit code: exit status 42",
        );
        assert_eq!(parse_status(&s).unwrap(), ExitStatus::Code(42));
        let k = failure("NonZeroExitCode", vec![("ExitCode", "137")], "x");
        let st = parse_status(&k).unwrap();
        assert_eq!(st, ExitStatus::Code(137));
        assert_eq!(st.signal(), Some(9));
        assert!(!st.success());
    }

    #[test]
    fn status_without_code_is_unknown_and_other_failures_did_not_start() {
        let s = failure("NonZeroExitCode", vec![], "weird");
        assert_eq!(
            parse_status(&s).unwrap(),
            ExitStatus::Unknown("weird".into())
        );
        let s = failure(
            "InternalError",
            vec![],
            "OCI runtime exec failed: exec: \"nope\": executable file not found in $PATH",
        );
        let e = parse_status(&s).unwrap_err();
        assert!(matches!(e, ExecError::NotStarted(ref m) if m.contains("not found")));
        assert!(!e.is_transient());
    }

    const MK: &str = "__AGENTBOX_00112233445566778899aabbccddeeff_";

    #[test]
    fn every_one_shot_argv_is_wrapped_and_a_session_s_only_when_it_needs_to_be() {
        let r = ExecRequest::argv(["echo", "hi"]);
        assert_eq!(
            &r.remote_argv(MK).unwrap()[3..],
            ["agentbox-exec", MK, "-", "", "", "0", "echo", "hi"]
        );
        assert_eq!(r.session_argv().unwrap(), vec!["echo", "hi"]);
        assert!(
            ExecRequest::argv(Vec::<String>::new())
                .remote_argv(MK)
                .is_err()
        );
        let s = ExecRequest::argv(["true"])
            .env("A", "1")
            .session_argv()
            .unwrap();
        assert_eq!(
            &s[3..],
            ["agentbox-exec", "", "-", "", "", "1", "A=1", "true"]
        );
    }

    #[test]
    fn wrapped_argv_carries_settings_positionally() {
        let r = ExecRequest::shell("echo $A")
            .timeout(Duration::from_millis(1500))
            .workdir("/workspace")
            .env("A", "x y")
            .env("B", "");
        let v = r.remote_argv(MK).unwrap();
        assert_eq!(&v[..3], ["sh", "-c", WRAPPER]);
        assert_eq!(
            &v[3..],
            [
                "agentbox-exec",
                MK,
                "-",
                "1.500",
                "/workspace",
                "2",
                "A=x y",
                "B=",
                "sh",
                "-c",
                "echo $A"
            ]
        );
        let bad = ExecRequest::argv(["true"]).env("1A", "x");
        assert!(matches!(bad.remote_argv(MK), Err(ExecError::Invalid(_))));
        let mode = |r: ExecRequest| r.remote_argv(MK).unwrap()[5].clone();
        assert_eq!(mode(ExecRequest::argv(["cat"]).stdin("abc")), "3");
        assert_eq!(mode(ExecRequest::argv(["cat"]).stdin("")), "-");
        assert_eq!(
            mode(ExecRequest::argv(["cat"]).stdin_reader(tokio::io::empty())),
            "="
        );
    }

    #[test]
    fn marks_are_fresh_and_of_the_documented_form() {
        let (a, b) = (new_mark(), new_mark());
        assert_ne!(a, b);
        assert_eq!(a.len(), MK.len());
        assert!(a.starts_with("__AGENTBOX_") && a.ends_with('_'));
        assert!(
            a[11..43]
                .bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
        );
    }

    /// `stream` cut into three chunks at every pair of positions: what passes is the stream
    /// without its trailer, whole exactly when the stream ends with the mark.
    #[test]
    fn the_trailer_is_held_back_and_found_across_any_split() {
        let m = "__M_";
        for (stream, want, whole) in [
            ("out__\n_M__M_", "out__\n_M", true),
            ("__M___M_", "__M_", true),
            ("out__M", "out", false),
            ("out__M_late", "out__M_late", false),
            ("", "", false),
        ] {
            let b = stream.as_bytes();
            for i in 0..=b.len() {
                for j in i..=b.len() {
                    let mut t = Trailer::new(m);
                    let mut got = Vec::new();
                    for part in [&b[..i], &b[i..j], &b[j..]] {
                        got.extend_from_slice(&t.push(Bytes::copy_from_slice(part)));
                    }
                    assert_eq!(t.whole(), whole, "{stream:?} split {i},{j}");
                    if whole {
                        assert_eq!(String::from_utf8_lossy(&got), want, "{stream:?} {i},{j}");
                    } else {
                        // A cut stream passes on all but what might still begin a mark.
                        assert!(want.starts_with(&*String::from_utf8_lossy(&got)));
                    }
                    assert_eq!(t.received(), b.len() as u64);
                }
            }
        }
    }

    #[test]
    fn sleep_arg_has_millisecond_precision() {
        assert_eq!(sleep_arg(Duration::from_secs(3)), "3.000");
        assert_eq!(sleep_arg(Duration::from_millis(20)), "0.020");
        assert_eq!(sleep_arg(Duration::ZERO), "0.001");
    }

    #[test]
    fn capped_keeps_prefix_and_flags() {
        let mut c = Capped::new(5);
        c.push(b"abc");
        assert!(!c.truncated);
        c.push(b"defg");
        assert_eq!(c.buf, b"abcde");
        assert!(c.truncated);
        c.push(b"h");
        assert_eq!(c.buf.len(), 5);
        let mut e = Capped::new(3);
        e.push(b"abc");
        assert!(!e.truncated);
    }
}
