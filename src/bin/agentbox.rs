//! `agentbox`: the command line for sandboxes, a thin layer over `agentbox::client`.
//!
//! Installed (or symlinked) as `kubectl-agentbox` on the PATH it also runs as
//! `kubectl agentbox ...`. Errors print one line to stderr and exit non-zero; `exec` and
//! `shell` exit with the remote command's code.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use agentbox::client::{ClientError, SandboxHandle, Sandboxes};
use agentbox::crd::{DeletionPolicy, Scope, ScopeKind};
use agentbox::exec::{ExecEvent, ExecRequest};
use agentbox::guard::GuardConfig;
use clap::{Args, Parser, Subcommand};
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

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
    Exec {
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
    },
    /// Open an interactive shell (TTY) in a sandbox.
    Shell(Target),
    /// Copy files or directories: `cp NAME:path local` or `cp local NAME:path`.
    Cp {
        /// Source (`NAME:path` for a sandbox path).
        src: String,
        /// Destination (`NAME:path` for a sandbox path).
        dst: String,
    },
    /// Hold a sandbox scope's execution guard while a local command runs.
    Lock {
        #[command(flatten)]
        target: Target,
        /// Give up after waiting this many seconds for the guard (default: wait indefinitely).
        #[arg(long)]
        wait: Option<f64>,
        /// The local command (after `--`); it gets AGENTBOX_FENCING_TOKEN in its environment.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Snapshot a sandbox's workspace (a new SandboxSnapshot); prints its name, and with
    /// `--wait` its object key, digest and size once Ready.
    Snapshot {
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
    },
    /// Create a sandbox whose workspace is restored from a snapshot. The spec is copied from
    /// the snapshot's source sandbox (which must still exist); the scope flags give another
    /// scope, NAME another name (default: the scope's name).
    Restore {
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
    },
}

/// A failure: one line for the user.
struct Fail(String);

impl<E: std::fmt::Display> From<E> for Fail {
    fn from(e: E) -> Self {
        Fail(e.to_string())
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(code) => code,
        Err(Fail(msg)) => {
            eprintln!("agentbox: {msg}");
            ExitCode::from(1)
        }
    }
}

fn code(c: i32) -> ExitCode {
    ExitCode::from(u8::try_from(c.clamp(0, 255)).unwrap_or(1))
}

async fn run(cli: Cli) -> Result<ExitCode, Fail> {
    let client = agentbox::kube_client().await?;
    let ns = cli
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let sbx = Sandboxes::new(client, ns);
    match cli.cmd {
        Cmd::Get(t) => {
            let h = open(&sbx, &t).await?;
            print_sandboxes(&[h.sandbox().clone()]);
            print_endpoints(h.endpoints());
            Ok(ExitCode::SUCCESS)
        }
        Cmd::List(scope) => {
            let selector = list_selector(&scope)?;
            let items = sbx.list(selector.as_deref()).await?;
            print_sandboxes(&items);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Exec {
            target,
            timeout,
            lock,
            stdin,
            workdir,
            env,
            command,
        } => {
            let h = open(&sbx, &target).await?;
            let mut req = ExecRequest::argv(command);
            if let Some(t) = timeout {
                req = req.timeout(Duration::try_from_secs_f64(t)?);
            }
            if let Some(w) = workdir {
                req = req.workdir(w);
            }
            for kv in env {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| Fail(format!("--env {kv:?}: expected NAME=value")))?;
                req = req.env(k, v);
            }
            if stdin {
                req = req.stdin_reader(tokio::io::stdin());
            }
            if lock {
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
        Cmd::Shell(t) => {
            let h = open(&sbx, &t).await?;
            shell(&h).await
        }
        Cmd::Cp { src, dst } => cp(&sbx, &src, &dst).await,
        Cmd::Snapshot {
            target,
            snapshot: name,
            retain,
            wait,
            timeout,
        } => {
            let wait = wait
                .then(|| Duration::try_from_secs_f64(timeout))
                .transpose()?;
            snapshot(&sbx, &target, name.as_deref(), retain, wait).await
        }
        Cmd::Restore {
            target,
            from,
            wait,
            timeout,
        } => {
            let wait = wait
                .then(|| Duration::try_from_secs_f64(timeout))
                .transpose()?;
            restore(&sbx, &target, &from, wait).await
        }
        Cmd::Lock {
            target,
            wait,
            command,
        } => {
            let h = open(&sbx, &target).await?;
            let wait = wait.map(Duration::try_from_secs_f64).transpose()?;
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
    }
}

async fn snapshot(
    sbx: &Sandboxes,
    target: &Target,
    name: Option<&str>,
    retain: bool,
    wait: Option<Duration>,
) -> Result<ExitCode, Fail> {
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

async fn restore(
    sbx: &Sandboxes,
    target: &Target,
    from: &str,
    wait: Option<Duration>,
) -> Result<ExitCode, Fail> {
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

async fn open(sbx: &Sandboxes, t: &Target) -> Result<SandboxHandle, Fail> {
    match (&t.name, t.scope.is_empty()) {
        (Some(n), true) => Ok(sbx.open(n).await?),
        (None, false) => Ok(sbx.open_scope(&t.scope.scope()?).await?),
        (Some(_), false) => Err(Fail("give a sandbox name or scope flags, not both".into())),
        (None, true) => Err(Fail("which sandbox? give a name or scope flags".into())),
    }
}

/// A label selector for the scope flags given (only the readable id labels can be matched
/// without all ids; with a full scope the scope key is exact).
fn list_selector(f: &ScopeFlags) -> Result<Option<String>, Fail> {
    if f.is_empty() {
        return Ok(None);
    }
    if f.kind.is_some() {
        let scope = f.scope()?;
        return Ok(Some(agentbox::labels::scope_selector(&scope)));
    }
    let mut parts = Vec::new();
    for (key, v) in [
        (agentbox::labels::AGENT, &f.agent),
        (agentbox::labels::USER, &f.user),
        (agentbox::labels::SESSION, &f.session),
    ] {
        if let Some(v) = v {
            if !agentbox::labels::is_valid_label_value(v) {
                return Err(Fail(format!(
                    "{v:?} is not a label value; give --kind and all ids to match by scope key"
                )));
            }
            parts.push(format!("{key}={v}"));
        }
    }
    Ok(Some(parts.join(",")))
}

fn print_sandboxes(items: &[agentbox::crd::Sandbox]) {
    println!(
        "{:<40} {:<13} {:<8} {:<30} SCOPE-KEY",
        "NAME", "PHASE", "SCOPE", "POD"
    );
    for s in items {
        let st = s.status.clone().unwrap_or_default();
        println!(
            "{:<40} {:<13} {:<8} {:<30} {}",
            s.metadata.name.as_deref().unwrap_or(""),
            st.phase.map(|p| p.as_str()).unwrap_or("-"),
            s.spec.scope.kind.label_value(),
            st.pod_name.as_deref().unwrap_or("-"),
            st.scope_key.as_deref().unwrap_or("-"),
        );
    }
}

/// The exposed ports of one sandbox (`spec.ports` → `status.endpoints`), after a blank line;
/// nothing for a sandbox without ports.
fn print_endpoints(endpoints: &[agentbox::crd::PortEndpoint]) {
    if endpoints.is_empty() {
        return;
    }
    println!();
    println!(
        "{:<16} {:>6} {:<8} {:<50} POD-IP",
        "PORT", "NUMBER", "PROTOCOL", "HOST"
    );
    for e in endpoints {
        println!(
            "{:<16} {:>6} {:<8} {:<50} {}",
            e.name,
            e.port,
            e.protocol.as_str(),
            e.host,
            e.pod_ip.as_deref().unwrap_or("-"),
        );
    }
}

async fn exec_streaming(h: &SandboxHandle, req: ExecRequest) -> Result<ExitCode, Fail> {
    let mut s = h.exec_stream(req).await?;
    let mut out = tokio::io::stdout();
    let mut err = tokio::io::stderr();
    while let Some(ev) = s.next().await {
        match ev.map_err(ClientError::from)? {
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

/// `NAME:path` → (NAME, path); a plain local path → None. A leading `./` or `/` marks a
/// local path that contains a colon.
fn remote_spec(s: &str) -> Option<(&str, &str)> {
    if s.starts_with('/') || s.starts_with('.') {
        return None;
    }
    s.split_once(':').filter(|(n, _)| !n.is_empty())
}

async fn cp(sbx: &Sandboxes, src: &str, dst: &str) -> Result<ExitCode, Fail> {
    match (remote_spec(src), remote_spec(dst)) {
        (Some((name, path)), None) => {
            let h = sbx.open(name).await?;
            let local = PathBuf::from(dst);
            match h.read_file(path).await {
                Ok(bytes) => {
                    let target = if local.is_dir() {
                        let base = path.rsplit('/').find(|c| !c.is_empty()).unwrap_or("file");
                        local.join(base)
                    } else {
                        local
                    };
                    tokio::fs::write(&target, bytes).await?;
                }
                // Not a regular file: copy it as a directory.
                Err(ClientError::NotFound(_)) => h.download_dir(path, &local).await?,
                Err(e) => return Err(e.into()),
            }
            Ok(ExitCode::SUCCESS)
        }
        (None, Some((name, path))) => {
            let h = sbx.open(name).await?;
            let local = PathBuf::from(src);
            if local.is_dir() {
                h.upload_dir(&local, path).await?;
            } else {
                let bytes = tokio::fs::read(&local)
                    .await
                    .map_err(|e| Fail(format!("{src}: {e}")))?;
                h.write_file(path, bytes).await?;
            }
            Ok(ExitCode::SUCCESS)
        }
        _ => Err(Fail(
            "cp needs exactly one side of the form NAME:path".into(),
        )),
    }
}

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

async fn shell(h: &SandboxHandle) -> Result<ExitCode, Fail> {
    use futures::SinkExt;
    use kube::api::{AttachParams, TerminalSize};
    let pods = h.pods();
    let ap = AttachParams::interactive_tty().container(agentbox::exec::SANDBOX_CONTAINER);
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
        Some(s) => agentbox::exec::parse_status(&s)
            .map(|st| st.code().unwrap_or(1))
            .unwrap_or(1),
        None => 1,
    };
    Ok(code(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_specs() {
        assert_eq!(remote_spec("box:/a/b"), Some(("box", "/a/b")));
        assert_eq!(remote_spec("box:"), Some(("box", "")));
        assert_eq!(remote_spec("./a:b"), None);
        assert_eq!(remote_spec("/tmp/x"), None);
        assert_eq!(remote_spec("local"), None);
    }

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
