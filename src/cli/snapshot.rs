//! `snapshot`: a new SandboxSnapshot of a sandbox's workspace.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::{Fail, Target, open};
use crate::client::Sandboxes;
use crate::crd::DeletionPolicy;

#[derive(Args)]
pub(super) struct SnapshotArgs {
    #[command(flatten)]
    target: Target,
    /// Snapshot name (default: `<sandbox>-<random>`).
    #[arg(long = "as")]
    snapshot: Option<String>,
    /// Keep the stored tarball when the SandboxSnapshot is deleted.
    #[arg(long)]
    retain: bool,
    /// Wait until the snapshot is Ready (fails with its reason if it fails).
    #[arg(long)]
    wait: bool,
    /// How long to wait, in seconds.
    #[arg(long, default_value_t = 600.0)]
    timeout: f64,
}

/// `agentbox snapshot`.
pub(super) async fn snapshot(sbx: &Sandboxes, a: SnapshotArgs) -> Result<ExitCode, Fail> {
    let wait = a
        .wait
        .then(|| Duration::try_from_secs_f64(a.timeout))
        .transpose()?;
    let (target, name, retain) = (&a.target, a.snapshot.as_deref(), a.retain);
    let h = open(sbx, target).await?;
    let policy = if retain {
        DeletionPolicy::Retain
    } else {
        DeletionPolicy::Delete
    };
    let created = h.snapshot(name, policy).await?;
    let snap_name = created.metadata.name.clone().unwrap_or_default();
    let Some(wait) = wait else {
        println!("{snap_name}");
        return Ok(ExitCode::SUCCESS);
    };
    let s = sbx.wait_snapshot(&snap_name, wait).await?;
    let st = s.status.unwrap_or_default();
    println!("{:<40} {:<64} {:>12} OBJECT", "NAME", "SHA256", "BYTES");
    println!(
        "{:<40} {:<64} {:>12} {}",
        snap_name,
        st.sha256.as_deref().unwrap_or("-"),
        st.size_bytes
            .map(|b| b.to_string())
            .unwrap_or_else(|| "-".into()),
        st.object_key.as_deref().unwrap_or("-"),
    );
    Ok(ExitCode::SUCCESS)
}
