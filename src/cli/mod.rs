//! `agentbox`: the command line for sandboxes, a thin layer over [`crate::client`]; one file
//! per subcommand. `src/bin/agentbox.rs` only calls [`main`].
//!
//! Installed (or symlinked) as `kubectl-agentbox` on the PATH it also runs as
//! `kubectl agentbox ...`. Errors print one line to stderr and exit non-zero; `exec` and
//! `shell` exit with the remote command's code.

mod cp;
mod exec;
mod get;
mod lock;
mod restore;
mod shell;
mod snapshot;

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::client::{SandboxHandle, Sandboxes};
use crate::crd::{Scope, ScopeKind};

#[derive(Parser)]
#[command(name = "agentbox", version, about = "Work with agentbox sandboxes")]
struct Cli {
    /// Namespace (default: the kubeconfig context's).
    #[arg(short, long, global = true, env = "AGENTBOX_NAMESPACE")]
    namespace: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Selects a sandbox: by name, or by scope (the name derives from the scope).
#[derive(Args, Clone)]
struct Target {
    /// Sandbox name (or give the scope flags instead).
    name: Option<String>,
    #[command(flatten)]
    scope: ScopeFlags,
}

#[derive(Args, Clone, Default)]
struct ScopeFlags {
    /// Scope kind: session, user, agent or global (default: inferred from the ids given).
    #[arg(long)]
    kind: Option<String>,
    /// Agent id.
    #[arg(long)]
    agent: Option<String>,
    /// User id.
    #[arg(long)]
    user: Option<String>,
    /// Session id.
    #[arg(long)]
    session: Option<String>,
}

impl ScopeFlags {
    fn is_empty(&self) -> bool {
        self.kind.is_none() && self.agent.is_none() && self.user.is_none() && self.session.is_none()
    }

    fn scope(&self) -> Result<Scope, String> {
        let kind = match self.kind.as_deref().map(str::to_ascii_lowercase).as_deref() {
            Some("session") => ScopeKind::Session,
            Some("user") => ScopeKind::User,
            Some("agent") => ScopeKind::Agent,
            Some("global") => ScopeKind::Global,
            Some(k) => return Err(format!("unknown scope kind {k:?}")),
            None if self.session.is_some() => ScopeKind::Session,
            None if self.user.is_some() => ScopeKind::User,
            None if self.agent.is_some() => ScopeKind::Agent,
            None => ScopeKind::Global,
        };
        Ok(Scope {
            kind,
            agent: self.agent.clone(),
            user: self.user.clone(),
            session: self.session.clone(),
        })
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Show one sandbox, and where its exposed ports are reached
    Get(Target),
    /// List sandboxes (optionally of one agent/user/session).
    List(ScopeFlags),
    /// Run a command in a sandbox; exits with its exit code.
    Exec(exec::ExecArgs),
    /// Open an interactive shell (TTY) in a sandbox.
    Shell(Target),
    /// Copy files or directories: `cp NAME:path local` or `cp local NAME:path`.
    Cp(cp::CpArgs),
    /// Hold a sandbox scope's execution guard while a local command runs.
    Lock(lock::LockArgs),
    /// Snapshot a sandbox's workspace (a new SandboxSnapshot); prints its name, and with
    /// `--wait` its object key, digest and size once Ready.
    Snapshot(snapshot::SnapshotArgs),
    /// Create a sandbox whose workspace is restored from a snapshot. The spec is copied from
    /// the snapshot's source sandbox (which must still exist); the scope flags give another
    /// scope, NAME another name (default: the scope's name).
    Restore(restore::RestoreArgs),
}

/// A failure: one line for the user.
pub struct Fail(String);

impl<E: std::fmt::Display> From<E> for Fail {
    fn from(e: E) -> Self {
        Fail(e.to_string())
    }
}

/// Parses the command line, runs the subcommand, and prints a failure as one line.
pub async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(Fail(msg)) => {
            eprintln!("agentbox: {msg}");
            ExitCode::from(1)
        }
    }
}

/// An exit code from a remote or local command's (clamped to 0..=255).
fn code(c: i32) -> ExitCode {
    ExitCode::from(u8::try_from(c.clamp(0, 255)).unwrap_or(1))
}

async fn run(cli: Cli) -> Result<ExitCode, Fail> {
    let client = crate::kube_client().await?;
    let ns = cli
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let sbx = Sandboxes::new(client, ns);
    match cli.cmd {
        Cmd::Get(t) => get::get(&sbx, &t).await,
        Cmd::List(scope) => get::list(&sbx, &scope).await,
        Cmd::Exec(a) => exec::exec(&sbx, a).await,
        Cmd::Shell(t) => shell::shell(&open(&sbx, &t).await?).await,
        Cmd::Cp(a) => cp::cp(&sbx, &a.src, &a.dst).await,
        Cmd::Snapshot(a) => snapshot::snapshot(&sbx, a).await,
        Cmd::Restore(a) => restore::restore(&sbx, a).await,
        Cmd::Lock(a) => lock::lock(&sbx, a).await,
    }
}

async fn open(sbx: &Sandboxes, t: &Target) -> Result<SandboxHandle, Fail> {
    match (&t.name, t.scope.is_empty()) {
        (Some(n), true) => Ok(sbx.open(n).await?),
        (None, false) => Ok(sbx.open_scope(&t.scope.scope()?).await?),
        (Some(_), false) => Err(Fail("give a sandbox name or scope flags, not both".into())),
        (None, true) => Err(Fail("which sandbox? give a name or scope flags".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scope_kind_is_inferred_from_the_ids() {
        let f = ScopeFlags {
            agent: Some("a".into()),
            user: Some("u".into()),
            ..Default::default()
        };
        assert_eq!(f.scope().unwrap().kind, ScopeKind::User);
        let g = ScopeFlags::default();
        assert_eq!(g.scope().unwrap().kind, ScopeKind::Global);
        let bad = ScopeFlags {
            kind: Some("x".into()),
            ..Default::default()
        };
        assert!(bad.scope().is_err());
    }
}
