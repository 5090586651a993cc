//! `exec`: a command in a sandbox, its output streamed, its exit code returned.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::{Fail, Target, code, open};
use crate::client::{ClientError, SandboxHandle, Sandboxes};
use agentbox_api::exec::{ExecError, ExecEvent, ExecRequest};

#[derive(Args)]
pub(super) struct ExecArgs {
    #[command(flatten)]
    target: Target,
    /// Stop the command after this many seconds (exit code 124).
    #[arg(long)]
    timeout: Option<f64>,
    /// Hold the scope's execution guard while the command runs.
    #[arg(long)]
    lock: bool,
    /// Forward local stdin to the command.
    #[arg(short = 'i', long)]
    stdin: bool,
    /// Working directory (default: the workspace root).
    #[arg(short = 'w', long)]
    workdir: Option<String>,
    /// Environment variables, NAME=value.
    #[arg(short = 'e', long = "env")]
    env: Vec<String>,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// `agentbox exec`.
pub(super) async fn exec(sbx: &Sandboxes, a: ExecArgs) -> Result<ExitCode, Fail> {
    let h = open(sbx, &a.target).await?;
    let mut req = ExecRequest::argv(a.command);
    if let Some(t) = a.timeout {
        req = req.timeout(Duration::try_from_secs_f64(t)?);
    }
    if let Some(w) = a.workdir {
        req = req.workdir(w);
    }
    for kv in a.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| Fail(format!("--env {kv:?}: expected NAME=value")))?;
        req = req.env(k, v);
    }
    if a.stdin {
        req = req.stdin_reader(tokio::io::stdin());
    }
    if a.lock {
        let g = h.guard(None).await?;
        let res = g.run(exec_streaming(&h, req)).await;
        let released = g.release().await;
        let c = res??;
        released?;
        Ok(c)
    } else {
        exec_streaming(&h, req).await
    }
}

async fn exec_streaming(h: &SandboxHandle, req: ExecRequest) -> Result<ExitCode, Fail> {
    let since = k8s_openapi::jiff::Timestamp::now();
    let mut s = h.exec_stream(req).await?;
    let mut out = tokio::io::stdout();
    let mut err = tokio::io::stderr();
    while let Some(ev) = s.next().await {
        let ev = match ev {
            Ok(ev) => ev,
            // Out of memory: said so, with the code of a process killed by SIGKILL (137), as
            // a shell reports it.
            Err(e) => match h.explain_exec_error(since, e).await {
                e @ ExecError::OutOfMemory { .. } => {
                    out.flush().await?;
                    eprintln!("agentbox: {e}");
                    return Ok(ExitCode::from(137));
                }
                e => return Err(ClientError::from(e).into()),
            },
        };
        match ev {
            ExecEvent::Stdout(b) => {
                out.write_all(&b).await?;
                out.flush().await?;
            }
            ExecEvent::Stderr(b) => {
                err.write_all(&b).await?;
                err.flush().await?;
            }
            ExecEvent::Exit { status, timed_out } => {
                if timed_out {
                    eprintln!("agentbox: command timed out and was killed");
                    return Ok(ExitCode::from(124));
                }
                return Ok(code(status.code().unwrap_or(1)));
            }
        }
    }
    Err(Fail("exec ended without an exit status".into()))
}
