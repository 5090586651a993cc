//! `agentbox suspend|resume|delete`: a sandbox's lifecycle.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::{Fail, Target, open};
use crate::client::Sandboxes;

/// Which lifecycle change.
#[derive(Clone, Copy)]
pub enum Change {
    /// Delete the pod, keep the workspace.
    Suspend,
    /// Start a pod on the workspace again.
    Resume,
    /// Delete the sandbox and its workspace.
    Delete,
}

/// Arguments of `suspend`, `resume` and `delete`.
#[derive(Args)]
pub struct LifecycleArgs {
    #[command(flatten)]
    target: Target,
    /// Wait until it is done (suspend: Suspended; resume: Ready; delete: gone) — at most
    /// this many seconds.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "120")]
    wait: Option<u64>,
    /// suspend: take the scope's guard first (waiting for whoever holds it) and suspend under
    /// it, keeping it until the sandbox is Suspended, so no harness starts work in between.
    #[arg(long)]
    under_guard: bool,
}

/// Makes the change; with `--wait`, waits for its outcome.
pub async fn change(sbx: &Sandboxes, what: Change, a: LifecycleArgs) -> Result<ExitCode, Fail> {
    let mut h = open(sbx, &a.target).await?;
    let wait = a.wait.map(Duration::from_secs);
    match what {
        Change::Suspend if a.under_guard => {
            let t = wait.unwrap_or(Duration::from_secs(120));
            let g = h.guard(Some(t)).await?;
            let done = h.suspend_under(&g, t).await;
            // Released whatever happened: the guard is the CLI's only for this command.
            let _ = g.release().await;
            done?;
        }
        Change::Suspend => {
            h.suspend().await?;
            if let Some(t) = wait {
                h.wait_suspended(t).await?;
            }
        }
        Change::Resume => {
            h.resume().await?;
            if let Some(t) = wait {
                h.wait_ready(t).await?;
            }
        }
        Change::Delete => match wait {
            Some(t) => h.delete(t).await?,
            // The request is accepted; the operator finishes it.
            None => {
                h.request_delete().await?;
            }
        },
    }
    let done = match what {
        // The request is accepted (with --wait or --under-guard: done).
        Change::Suspend => "suspended",
        Change::Resume if wait.is_some() => "ready",
        Change::Resume => "resuming",
        Change::Delete if wait.is_some() => "deleted",
        Change::Delete => "deleting",
    };
    println!("sandbox/{} {done}", h.name());
    Ok(ExitCode::SUCCESS)
}
