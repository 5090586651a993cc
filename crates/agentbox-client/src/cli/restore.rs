//! `restore`: a new sandbox whose workspace is restored from a snapshot.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::get::print_sandboxes;
use super::{Fail, Target};
use crate::client::{ClientError, Sandboxes};

#[derive(Args)]
pub(super) struct RestoreArgs {
    #[command(flatten)]
    target: Target,
    /// The SandboxSnapshot to restore.
    #[arg(long = "from")]
    from: String,
    /// Wait until the new sandbox is Ready.
    #[arg(long)]
    wait: bool,
    /// How long to wait, in seconds.
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
}

/// `agentbox restore`.
pub(super) async fn restore(sbx: &Sandboxes, a: RestoreArgs) -> Result<ExitCode, Fail> {
    let wait = a
        .wait
        .then(|| Duration::try_from_secs_f64(a.timeout))
        .transpose()?;
    let (target, from) = (&a.target, a.from.as_str());
    let snap = sbx.get_snapshot(from).await?;
    let source = &snap.spec.sandbox_ref.name;
    let src = sbx.open(source).await.map_err(|e| {
        Fail(format!(
            "snapshot {from}: its sandbox {source} is needed for the spec to copy: {e}"
        ))
    })?;
    let mut spec = src.sandbox().spec.clone();
    if !target.scope.is_empty() {
        spec.scope = target.scope.scope()?;
    }
    let mut h = match sbx
        .create_restored(target.name.as_deref(), spec, from)
        .await
    {
        Err(ClientError::Kube(kube::Error::Api(s))) if s.code == 409 => {
            return Err(Fail(format!(
                "a sandbox of that name exists (give another NAME, or other scope flags): {}",
                s.message
            )));
        }
        r => r?,
    };
    if let Some(wait) = wait {
        h.wait_ready(wait).await?;
    }
    print_sandboxes(&[h.sandbox().clone()]);
    Ok(ExitCode::SUCCESS)
}
