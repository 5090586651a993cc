//! `shell`: an interactive shell with a TTY in a sandbox.

use std::io::IsTerminal;
use std::process::ExitCode;

use crossterm::terminal;
use futures::SinkExt;
use kube::api::{AttachParams, TerminalSize};
use tokio::io::AsyncWriteExt;

use super::{Fail, code};
use crate::client::SandboxHandle;

/// The local terminal in raw mode (keys go to the remote shell as typed, with no local echo)
/// while this lives; dropping it restores the mode, on every path out of [`shell`].
struct RawTerminal {
    raw: bool,
}

impl RawTerminal {
    /// Raw mode if stdin is a terminal; a no-op otherwise (input piped into `shell`).
    fn enter() -> Result<Self, Fail> {
        if !std::io::stdin().is_terminal() {
            return Ok(RawTerminal { raw: false });
        }
        terminal::enable_raw_mode().map_err(|e| Fail(format!("terminal raw mode: {e}")))?;
        Ok(RawTerminal { raw: true })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if self.raw {
            // Nothing more to do if it fails: the process is leaving the terminal anyway.
            let _ = terminal::disable_raw_mode();
        }
    }
}

/// The local terminal's size for the remote TTY, if stdout is a terminal.
fn terminal_size() -> Option<TerminalSize> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let (width, height) = terminal::size().ok()?;
    Some(TerminalSize { width, height })
}

/// Local stdin in chunks as they are read, from a plain thread that does not hold the process
/// (see [`super::entry`]); its channel closes at stdin's EOF.
fn stdin_chunks() -> tokio::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 16 << 10];
        loop {
            match std::io::Read::read(&mut stdin, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    rx
}

/// `agentbox shell`.
pub(super) async fn shell(h: &SandboxHandle) -> Result<ExitCode, Fail> {
    let pods = h.pods();
    let ap = AttachParams::interactive_tty().container(agentbox_api::exec::SANDBOX_CONTAINER);
    let root = h.workspace_root();
    let mut proc = pods
        .exec(
            &h.pod_name(),
            [
                "sh",
                "-c",
                "cd \"$0\" 2>/dev/null; exec sh -i",
                root.as_str(),
            ],
            &ap,
        )
        .await?;
    let raw = RawTerminal::enter()?;
    // The remote TTY follows the local window: its size now, and again on each SIGWINCH.
    let resizer = match (terminal_size(), proc.terminal_size()) {
        (Some(size), Some(mut tx)) => {
            let _ = tx.send(size).await;
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
                .ok()
                .map(|mut winch| {
                    tokio::spawn(async move {
                        while winch.recv().await.is_some() {
                            let Some(size) = terminal_size() else {
                                continue;
                            };
                            if tx.send(size).await.is_err() {
                                break;
                            }
                        }
                    })
                })
        }
        _ => None,
    };
    let mut stdin_w = proc.stdin().ok_or_else(|| Fail("no stdin".into()))?;
    let mut stdout_r = proc.stdout().ok_or_else(|| Fail("no stdout".into()))?;
    let status = proc.take_status().ok_or_else(|| Fail("no status".into()))?;
    let mut keys = stdin_chunks();
    let input = tokio::spawn(async move {
        while let Some(chunk) = keys.recv().await {
            if stdin_w.write_all(&chunk).await.is_err() || stdin_w.flush().await.is_err() {
                break;
            }
        }
    });
    let mut out = tokio::io::stdout();
    let copy = async {
        let mut buf = vec![0u8; 16 << 10];
        loop {
            use tokio::io::AsyncReadExt;
            match stdout_r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if out.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    let _ = out.flush().await;
                }
            }
        }
    };
    copy.await;
    let st = status.await;
    input.abort();
    if let Some(r) = resizer {
        r.abort();
    }
    drop(raw);
    let c = match st {
        Some(s) => agentbox_api::exec::parse_status(&s)
            .map(|st| st.code().unwrap_or(1))
            .unwrap_or(1),
        None => 1,
    };
    Ok(code(c))
}
