//! `snapshot`: a new SandboxSnapshot of a sandbox's workspace.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::progress::Progress;
use super::{Fail, Target, open};
use crate::client::Sandboxes;
use agentbox_api::crd::{DeletionPolicy, SandboxSnapshot};

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
    /// Take the scope's guard first (waiting up to --timeout for whoever holds it) and have
    /// the snapshot taken under it, keeping it until the snapshot is Ready or Failed, so no
    /// harness works in the scope in between. Implies --wait.
    #[arg(long)]
    under_guard: bool,
}

/// `agentbox snapshot`.
pub(super) async fn snapshot(sbx: &Sandboxes, a: SnapshotArgs) -> Result<ExitCode, Fail> {
    let wait = (a.wait || a.under_guard)
        .then(|| Duration::try_from_secs_f64(a.timeout))
        .transpose()?;
    let (target, name, retain) = (&a.target, a.snapshot.as_deref(), a.retain);
    let h = open(sbx, target).await?;
    let policy = if retain {
        DeletionPolicy::Retain
    } else {
        DeletionPolicy::Delete
    };
    let guard = match wait.filter(|_| a.under_guard) {
        Some(t) => Some(h.guard(Some(t)).await?),
        None => None,
    };
    let created = match &guard {
        Some(g) => h.snapshot_under(name, policy, g).await,
        None => h.snapshot(name, policy).await,
    };
    let created = match created {
        Ok(c) => c,
        Err(e) => {
            if let Some(g) = guard {
                let _ = g.release().await;
            }
            return Err(e.into());
        }
    };
    let snap_name = created.metadata.name.clone().unwrap_or_default();
    let Some(wait) = wait else {
        println!("{snap_name}");
        return Ok(ExitCode::SUCCESS);
    };
    let progress = Progress::on_stderr(format!("snapshot {snap_name}: Pending"), false);
    // The phase as it changes, polled only while someone watches the terminal.
    let watcher = progress.is_visible().then(|| {
        let (sbx, name, show) = (sbx.clone(), snap_name.clone(), progress.messenger());
        tokio::spawn(async move {
            loop {
                if let Ok(s) = sbx.get_snapshot(&name).await {
                    show(phase_line(&name, &s));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    });
    let waited = sbx.wait_snapshot(&snap_name, wait).await;
    if let Some(g) = guard {
        // Released whatever happened: the guard is the CLI's only for this command.
        let _ = g.release().await;
    }
    if let Some(w) = watcher {
        w.abort();
    }
    drop(progress);
    let s = waited?;
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

/// The progress line of a snapshot being waited for: its phase, and its attempt after the
/// first.
fn phase_line(name: &str, s: &SandboxSnapshot) -> String {
    let st = s.status.as_ref();
    let phase = st
        .and_then(|st| st.phase)
        .map_or_else(|| "Pending".to_string(), |p| format!("{p:?}"));
    match st.and_then(|st| st.attempts).filter(|a| *a > 1) {
        Some(a) => format!("snapshot {name}: {phase} (attempt {a})"),
        None => format!("snapshot {name}: {phase}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_lines() {
        let mut s: SandboxSnapshot = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1",
            "kind": "SandboxSnapshot",
            "metadata": {"name": "s1"},
            "spec": {"sandboxRef": {"name": "box"}},
        }))
        .unwrap();
        assert_eq!(phase_line("s1", &s), "snapshot s1: Pending");
        s.status =
            serde_json::from_value(serde_json::json!({"phase": "Running", "attempts": 2})).unwrap();
        assert_eq!(phase_line("s1", &s), "snapshot s1: Running (attempt 2)");
    }
}
