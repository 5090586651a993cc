//! `lock`: a local command run while the sandbox scope's execution guard is held.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::{Fail, Target, code, open};
use crate::client::Sandboxes;
use agentbox_api::guard::GuardConfig;

#[derive(Args)]
pub(super) struct LockArgs {
    #[command(flatten)]
    target: Target,
    /// Give up after waiting this many seconds for the guard (default: wait indefinitely).
    #[arg(long)]
    wait: Option<f64>,
    /// The local command (after `--`); it gets AGENTBOX_FENCING_TOKEN in its environment.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// `agentbox lock`.
pub(super) async fn lock(sbx: &Sandboxes, a: LockArgs) -> Result<ExitCode, Fail> {
    let command = a.command;
    let h = open(sbx, &a.target).await?;
    let wait = a.wait.map(Duration::try_from_secs_f64).transpose()?;
    let g = h.guard_with(&GuardConfig::default(), wait).await?;
    let mut child = tokio::process::Command::new(&command[0])
        .args(&command[1..])
        .env("AGENTBOX_FENCING_TOKEN", g.token().to_string())
        .env("AGENTBOX_LEASE", g.lease_name())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Fail(format!("{}: {e}", command[0])))?;
    let status = g.run(child.wait()).await;
    match status {
        Ok(st) => {
            g.release().await?;
            let st = st?;
            Ok(code(st.code().unwrap_or(1)))
        }
        Err(lost) => {
            let _ = child.kill().await;
            Err(Fail(format!("{lost}; stopped {}", command[0])))
        }
    }
}
