//! A persistent shell in a sandbox: one long-lived `sh` over one exec with stdin open, for
//! command loops where a new exec per command (a WebSocket upgrade through the API server and
//! kubelet each time) costs too much.
//!
//! Each command is written to the shell's stdin as one line that runs it in a subshell (so
//! `exit`, `cd` or `set -e` in one command cannot break the session) with stdin from
//! `/dev/null` (so it cannot eat the following commands), framed by sentinels carrying a fresh
//! random nonce: a start sentinel on stdout, then the command's output, then an end sentinel
//! with `$?` on stdout and one on stderr. Each command thus gets its own stdout, stderr and
//! exit code. State does not carry over between commands: use [`ExecRequest::workdir`] and
//! [`ExecRequest::env`].
//!
//! If the shell is found dead before a command starts, a new one is started and the command is
//! sent there; if it dies while a command runs, the command fails with
//! [`ExecError::Session`] (it may have run in part) and the next command gets a new shell.

use std::future::Future;
use std::pin::Pin;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams, AttachedProcess};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadHalf, SimplexStream, WriteHalf};
use tokio::sync::Mutex;

use super::{
    Capped, ExecError, ExecOutput, ExecRequest, ExitStatus, PIPE_BUF, TIMEOUT_GRACE, new_mark,
};

/// A persistent shell in one container of one pod. Commands run one at a time; the session
/// can be shared (`&self` methods) and serialises them.
pub struct Session {
    pods: Api<Pod>,
    pod: String,
    container: String,
    workdir: Option<String>,
    shell: Mutex<Option<Shell>>,
    oom_check: bool,
}

struct Shell {
    // Kept alive: dropping it aborts kube's message loop and closes the connection.
    _proc: AttachedProcess,
    stdin: WriteHalf<SimplexStream>,
    stdout: ReadHalf<SimplexStream>,
    stderr: ReadHalf<SimplexStream>,
    out_pending: Vec<u8>,
    err_pending: Vec<u8>,
    exited: Pin<Box<dyn Future<Output = Option<Status>> + Send>>,
}

impl Shell {
    /// The shell's exec has ended (its status arrived or the connection dropped).
    fn is_dead(&mut self) -> bool {
        self.exited.as_mut().now_or_never().is_some()
    }
}

impl Session {
    /// A session in `container` of `pod`; the shell starts with the first command.
    pub fn new(pods: Api<Pod>, pod: impl Into<String>, container: impl Into<String>) -> Self {
        Session {
            pods,
            pod: pod.into(),
            container: container.into(),
            workdir: None,
            shell: Mutex::new(None),
            oom_check: false,
        }
    }

    /// A command that fails as a dead container would make it fail (its shell gone, its
    /// stream cut) is [`ExecError::OutOfMemory`] when the kubelet recorded the container
    /// killed for memory meanwhile ([`crate::oom::explain`]: a few reads of the pod, only on
    /// such a failure). For a harness's session; the operator's own sessions go without.
    pub fn with_oom_check(mut self) -> Self {
        self.oom_check = true;
        self
    }

    /// Run commands in `dir` unless the request names its own workdir: the shell starts
    /// there ([`crate::remote::session_shell_argv`]), so such commands need no wrapper.
    pub fn with_workdir(mut self, dir: impl Into<String>) -> Self {
        self.workdir = Some(dir.into());
        self
    }

    /// Whether a shell was started and has ended since (its exec's status arrived or its
    /// connection dropped). False while a command runs, and before the first one.
    pub fn has_ended(&self) -> bool {
        self.shell
            .try_lock()
            .is_ok_and(|mut g| g.as_mut().is_some_and(Shell::is_dead))
    }

    /// Starts the shell now rather than with the first command.
    pub async fn start(&self) -> Result<(), ExecError> {
        let mut g = self.shell.lock().await;
        if g.as_mut().is_none_or(Shell::is_dead) {
            *g = Some(self.spawn().await?);
        }
        Ok(())
    }

    async fn spawn(&self) -> Result<Shell, ExecError> {
        let ap = AttachParams::default()
            .container(&self.container)
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .max_stdin_buf_size(PIPE_BUF)
            .max_stdout_buf_size(PIPE_BUF)
            .max_stderr_buf_size(PIPE_BUF);
        let mut proc = self
            .pods
            .exec(
                &self.pod,
                crate::remote::session_shell_argv(self.workdir.as_deref()),
                &ap,
            )
            .await
            .map_err(|source| ExecError::Connect {
                pod: self.pod.clone(),
                source,
            })?;
        let missing = || ExecError::Session("exec without the requested streams".into());
        let stdin = proc.stdin().ok_or_else(missing)?;
        let stdout = proc.stdout().ok_or_else(missing)?;
        let stderr = proc.stderr().ok_or_else(missing)?;
        let exited = Box::pin(proc.take_status().ok_or_else(missing)?);
        Ok(Shell {
            _proc: proc,
            stdin,
            stdout,
            stderr,
            out_pending: Vec::new(),
            err_pending: Vec::new(),
            exited,
        })
    }

    /// Runs one command in the shell. stdin is not supported here (use
    /// [`crate::exec::run`]); the timeout kills the command's process group as in one-shot
    /// exec.
    pub async fn run(&self, req: ExecRequest) -> Result<ExecOutput, ExecError> {
        if req.stdin.is_some() {
            return Err(ExecError::Invalid(
                "session commands take no stdin; use a one-shot exec".into(),
            ));
        }
        let mark = new_mark();
        let line = command_line(&req, &mark)?;
        // Only these of the request are needed from here on (the request itself, with its
        // stdin slot, is not Sync, and this future must be Send).
        let limits = Limits {
            max_output: req.max_output,
            timeout: req.timeout,
        };
        self.run_line(&line, &mark, limits).await
    }

    /// Runs `script` with `args` as its positional parameters in a subshell of the shell
    /// itself ([`crate::remote::session_script_line`]): no new `sh`, no watchdog, so the
    /// script's own commands are its only processes. For short scripts of the operator's own
    /// on a hot path (a claim's workspace write); `timeout` bounds the wait for the answer,
    /// and a command still running then is not killed (drop the session: its stdin closes).
    pub async fn run_script(
        &self,
        script: &str,
        args: &[String],
        timeout: std::time::Duration,
        max_output: usize,
    ) -> Result<ExecOutput, ExecError> {
        let mark = new_mark();
        let line = crate::remote::session_script_line(script, args, &mark);
        let limits = Limits {
            max_output,
            timeout: Some(timeout),
        };
        self.run_line(&line, &mark, limits).await
    }

    async fn run_line(
        &self,
        line: &str,
        mark: &str,
        limits: Limits,
    ) -> Result<ExecOutput, ExecError> {
        let since = k8s_openapi::jiff::Timestamp::now();
        match self.run_line_once(line, mark, limits).await {
            Err(e) if self.oom_check => {
                Err(crate::oom::explain(&self.pods, &self.pod, &self.container, since, e).await)
            }
            other => other,
        }
    }

    async fn run_line_once(
        &self,
        line: &str,
        mark: &str,
        limits: Limits,
    ) -> Result<ExecOutput, ExecError> {
        let mut g = self.shell.lock().await;
        // A shell found dead before the command was sent, or one that ends before printing
        // the command's start sentinel, has not run the command: replace it and try again
        // (once). A shell that dies after the start sentinel fails the command.
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.run_once(&mut g, limits, line, mark).await {
                Ok(out) => return Ok(out),
                Err(Failure::NotStarted(why)) if attempt < 2 => {
                    tracing::debug!(pod = %self.pod, %why, "session shell gone; starting a new one");
                    *g = None;
                }
                Err(Failure::NotStarted(why)) => {
                    *g = None;
                    return Err(ExecError::Session(format!(
                        "the command did not start: {why}"
                    )));
                }
                Err(Failure::Other(e)) => {
                    // The frames may be out of step now: this shell cannot be trusted any more.
                    *g = None;
                    return Err(e);
                }
            }
        }
    }

    async fn run_once(
        &self,
        g: &mut Option<Shell>,
        req: Limits,
        line: &str,
        mark: &str,
    ) -> Result<ExecOutput, Failure> {
        if g.as_mut().is_none_or(Shell::is_dead) {
            *g = None;
            *g = Some(self.spawn().await.map_err(Failure::Other)?);
        }
        let Some(sh) = g.as_mut() else {
            return Err(Failure::NotStarted("no shell".into()));
        };
        let sent = async {
            sh.stdin.write_all(line.as_bytes()).await?;
            sh.stdin.flush().await
        }
        .await;
        if let Err(e) = sent {
            return Err(Failure::NotStarted(format!("writing the command: {e}")));
        }

        let cap = req.max_output;
        let mut out = Framer::new(
            Some(format!("{mark}+\n").into_bytes()),
            mark.to_string(),
            cap,
        );
        let mut err = Framer::new(None, mark.to_string(), cap);
        let work = async {
            let (o, e) = tokio::join!(
                read_frame(&mut sh.stdout, &mut sh.out_pending, &mut out),
                read_frame(&mut sh.stderr, &mut sh.err_pending, &mut err),
            );
            // stdout knows whether the command started; its verdict comes first, naming the
            // session's directory (what the shell said on stderr may be cut by its exit).
            let o = o.map_err(|f| match f {
                Failure::NotStarted(mut why) => {
                    if let Some(dir) = &self.workdir {
                        why = format!("{why} (started in {dir})");
                    }
                    let said = String::from_utf8_lossy(&err.out.buf).trim().to_string();
                    if !said.is_empty() {
                        why = format!("{why}: {said}");
                    }
                    Failure::NotStarted(why)
                }
                other => other,
            });
            Ok::<_, Failure>((o?, e?))
        };
        let started = tokio::time::Instant::now();
        let (code, _) = match req.timeout {
            // The in-pod watchdog kills the command at the timeout; the grace only bounds a
            // wedged connection.
            Some(t) => tokio::time::timeout(t + TIMEOUT_GRACE, work)
                .await
                .unwrap_or(Err(Failure::Other(ExecError::Timeout(t))))?,
            None => work.await?,
        };
        let status = match crate::remote::parse_session_end(&code) {
            Some((_, true)) => {
                return Err(Failure::Other(ExecError::OutOfMemory { container: false }));
            }
            Some((c, false)) => ExitStatus::Code(c),
            None => ExitStatus::Unknown(format!("unparsable status {code:?}")),
        };
        let timed_out = req.timeout.is_some_and(|t| started.elapsed() >= t);
        Ok(ExecOutput {
            stdout: out.out.buf,
            stderr: err.out.buf,
            status,
            stdout_truncated: out.out.truncated,
            stderr_truncated: err.out.truncated,
            timed_out,
        })
    }

    /// Ends the shell (closing its stdin lets it exit).
    pub async fn close(&self) {
        if let Some(mut sh) = self.shell.lock().await.take() {
            let _ = sh.stdin.shutdown().await;
        }
    }
}

/// The line written to the shell for one command ([`crate::remote::session_line`]): the
/// session's shell outlives the command, so the command needs no trailer of its own
/// ([`ExecRequest::session_argv`]).
pub(crate) fn command_line(req: &ExecRequest, mark: &str) -> Result<String, ExecError> {
    let argv = req.session_argv()?;
    Ok(crate::remote::session_line(&argv, mark))
}

/// What a command's run needs of its request besides its line.
#[derive(Clone, Copy)]
struct Limits {
    max_output: usize,
    timeout: Option<std::time::Duration>,
}

/// Why one attempt at a command failed.
enum Failure {
    /// The command certainly did not start (the shell was gone before its start sentinel).
    NotStarted(String),
    /// Anything else; the command may have run.
    Other(ExecError),
}

/// Reads chunks into `framer` until it completes a frame; bytes after the frame stay pending.
async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    pending: &mut Vec<u8>,
    framer: &mut Framer,
) -> Result<String, Failure> {
    let first = std::mem::take(pending);
    if let Some((code, rest)) = framer.feed(&first).map_err(Failure::Other)? {
        *pending = rest;
        return Ok(code);
    }
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = r.read(&mut buf).await.map_err(|e| {
            Failure::Other(ExecError::Session(format!("reading from the shell: {e}")))
        })?;
        if n == 0 {
            return Err(if framer.awaiting_start() {
                Failure::NotStarted("the shell exited".into())
            } else {
                Failure::Other(ExecError::Session(
                    "the shell exited while a command ran; it may have run in part".into(),
                ))
            });
        }
        if let Some((code, rest)) = framer.feed(&buf[..n]).map_err(Failure::Other)? {
            *pending = rest;
            return Ok(code);
        }
    }
}

/// Incremental parser of one command's frame on one stream: skips to the start sentinel (if
/// any), collects output (capped) up to the end sentinel, then takes the text up to the next
/// newline as the frame's trailer (the exit code on stdout, empty on stderr). Memory stays
/// bounded by the cap plus a sentinel's length.
pub(crate) struct Framer {
    start: Option<Vec<u8>>,
    end: Vec<u8>,
    buf: Vec<u8>,
    pub(crate) out: Capped,
}

/// Longest trailer accepted after an end sentinel.
const MAX_TRAILER: usize = 32;

impl Framer {
    pub(crate) fn new(start: Option<Vec<u8>>, end: String, cap: usize) -> Self {
        Framer {
            start,
            end: end.into_bytes(),
            buf: Vec::new(),
            out: Capped::new(cap),
        }
    }

    /// Whether the start sentinel is still to come.
    pub(crate) fn awaiting_start(&self) -> bool {
        self.start.is_some()
    }

    /// Feeds bytes; returns the trailer and the bytes after the frame once it is complete.
    pub(crate) fn feed(&mut self, data: &[u8]) -> Result<Option<(String, Vec<u8>)>, ExecError> {
        self.buf.extend_from_slice(data);
        if let Some(start) = &self.start {
            match find(&self.buf, start) {
                Some(p) => {
                    self.buf.drain(..p + start.len());
                    self.start = None;
                }
                None => {
                    // Anything before the start sentinel is stray output from earlier commands'
                    // background jobs: drop it, keeping a possible sentinel prefix.
                    let keep = start.len().saturating_sub(1).min(self.buf.len());
                    self.buf.drain(..self.buf.len() - keep);
                    return Ok(None);
                }
            }
        }
        match find(&self.buf, &self.end) {
            Some(p) => {
                self.out.push(&self.buf[..p]);
                self.buf.drain(..p);
                let after = &self.buf[self.end.len()..];
                match after.iter().position(|&c| c == b'\n') {
                    Some(nl) => {
                        let trailer = String::from_utf8_lossy(&after[..nl]).into_owned();
                        let rest = after[nl + 1..].to_vec();
                        self.buf.clear();
                        Ok(Some((trailer, rest)))
                    }
                    None if after.len() > MAX_TRAILER => Err(ExecError::Session(
                        "malformed frame trailer from the shell".into(),
                    )),
                    None => Ok(None),
                }
            }
            None => {
                let keep = self.end.len().saturating_sub(1).min(self.buf.len());
                let n = self.buf.len() - keep;
                self.out.push(&self.buf[..n]);
                self.buf.drain(..n);
                Ok(None)
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || hay.len() < needle.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(f: &mut Framer, chunks: &[&[u8]]) -> Option<(String, Vec<u8>)> {
        for (i, c) in chunks.iter().enumerate() {
            if let Some((code, mut rest)) = f.feed(c).unwrap() {
                // What the stream delivers after the frame stays pending for the next one.
                for later in &chunks[i + 1..] {
                    rest.extend_from_slice(later);
                }
                return Some((code, rest));
            }
        }
        None
    }

    #[test]
    fn frame_with_start_output_and_code() {
        let mut f = Framer::new(Some(b"M+\n".to_vec()), "M".into(), 100);
        let (code, rest) = feed_all(&mut f, &[b"junkM+\nhello", b" worldM42\nnext"]).unwrap();
        assert_eq!(code, "42");
        assert_eq!(f.out.buf, b"hello world");
        assert_eq!(rest, b"next");
    }

    #[test]
    fn sentinels_split_across_chunks_at_every_position() {
        let start = b"__AGENTBOX_ab_+\n";
        let end = "__AGENTBOX_ab_";
        let stream = b"xx__AGENTBOX_ab_+\nout\nput no newline__AGENTBOX_ab_7\nrest".to_vec();
        for i in 0..stream.len() {
            for j in i..stream.len() {
                let mut f = Framer::new(Some(start.to_vec()), end.into(), 1000);
                let got = feed_all(&mut f, &[&stream[..i], &stream[i..j], &stream[j..]]);
                let (code, rest) = got.unwrap_or_else(|| panic!("split {i},{j}"));
                assert_eq!(code, "7");
                assert_eq!(f.out.buf, b"out\nput no newline", "split {i},{j}");
                assert_eq!(rest, b"rest");
            }
        }
    }

    #[test]
    fn output_is_capped_while_the_frame_still_completes() {
        let mut f = Framer::new(None, "END".into(), 4);
        let big = vec![b'a'; 10_000];
        assert!(f.feed(&big).unwrap().is_none());
        let (code, _) = f.feed(b"END\n").unwrap().unwrap();
        assert_eq!(code, "");
        assert_eq!(f.out.buf, b"aaaa");
        assert!(f.out.truncated);
        assert!(f.buf.len() < 10);
    }

    #[test]
    fn malformed_trailer_is_an_error() {
        let mut f = Framer::new(None, "END".into(), 4);
        assert!(f.feed(b"END").unwrap().is_none());
        assert!(f.feed(&[b'x'; 40]).is_err());
    }

    #[test]
    fn command_line_quotes_everything() {
        let req = ExecRequest::argv(["echo", "it's", "$HOME"]);
        let l = command_line(&req, "__M_").unwrap();
        assert!(l.contains(r"( exec 'echo' 'it'\''s' '$HOME' ) </dev/null"));
        assert!(l.ends_with('\n'));
        assert_eq!(l.matches('\n').count(), 1);
    }
}
