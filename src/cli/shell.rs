//! `shell`: an interactive shell with a TTY in a sandbox.

use std::process::ExitCode;

use tokio::io::AsyncWriteExt;

use super::{Fail, code};
use crate::client::SandboxHandle;

/// Puts the local terminal in raw mode with `stty` and restores it on drop.
struct RawTerminal(Option<String>);

impl RawTerminal {
    fn enter() -> Self {
        let saved = std::process::Command::new("stty")
            .arg("-g")
            .stdin(std::process::Stdio::inherit())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        if saved.is_some() {
            let _ = std::process::Command::new("stty")
                .args(["raw", "-echo"])
                .stdin(std::process::Stdio::inherit())
                .status();
        }
        RawTerminal(saved)
    }

    fn size() -> Option<(u16, u16)> {
        let o = std::process::Command::new("stty")
            .arg("size")
            .stdin(std::process::Stdio::inherit())
            .output()
            .ok()?;
        let s = String::from_utf8_lossy(&o.stdout);
        let mut it = s.split_whitespace();
        Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = std::process::Command::new("stty")
                .arg(saved)
                .stdin(std::process::Stdio::inherit())
                .status();
        }
    }
}

/// `agentbox shell`.
pub(super) async fn shell(h: &SandboxHandle) -> Result<ExitCode, Fail> {
    use futures::SinkExt;
    use kube::api::{AttachParams, TerminalSize};
    let pods = h.pods();
    let ap = AttachParams::interactive_tty().container(crate::exec::SANDBOX_CONTAINER);
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
    let size = RawTerminal::size();
    let raw = RawTerminal::enter();
    if let (Some((rows, cols)), Some(mut tx)) = (size, proc.terminal_size()) {
        let _ = tx
            .send(TerminalSize {
                width: cols,
                height: rows,
            })
            .await;
    }
    let mut stdin_w = proc.stdin().ok_or_else(|| Fail("no stdin".into()))?;
    let mut stdout_r = proc.stdout().ok_or_else(|| Fail("no stdout".into()))?;
    let status = proc.take_status().ok_or_else(|| Fail("no status".into()))?;
    let input = tokio::spawn(async move {
        let mut stdin = tokio::io::stdin();
        let _ = tokio::io::copy(&mut stdin, &mut stdin_w).await;
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
    drop(raw);
    let c = match st {
        Some(s) => crate::exec::parse_status(&s)
            .map(|st| st.code().unwrap_or(1))
            .unwrap_or(1),
        None => 1,
    };
    Ok(code(c))
}
