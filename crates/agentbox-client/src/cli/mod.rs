//! `agentbox`: the command line for sandboxes, a thin layer over [`crate::client`]; one file
//! per subcommand. `crates/agentbox-client/src/bin/agentbox.rs` only calls [`main`].
//!
//! Installed (or symlinked) as `kubectl-agentbox` on the PATH it also runs as
//! `kubectl agentbox ...`. Errors print one line to stderr and exit non-zero; `exec` and
//! `shell` exit with the remote command's code.

mod completion;
mod cp;
mod create;
mod exec;
mod get;
mod lifecycle;
mod lock;
mod pools;
mod progress;
mod restore;
mod shell;
mod snapshot;
mod templates;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::client::{SandboxHandle, Sandboxes};
use agentbox_api::crd::{Scope, ScopeKind};
use agentbox_api::kubeclient::KubeconfigSelection;

#[derive(Parser)]
#[command(name = "agentbox", version, about = "Work with agentbox sandboxes")]
struct Cli {
    /// Namespace (default: the kubeconfig context's).
    #[arg(short, long, global = true, env = "AGENTBOX_NAMESPACE")]
    namespace: Option<String>,
    /// Kubeconfig file (default: $KUBECONFIG, else ~/.kube/config).
    #[arg(long, global = true, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,
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
    /// Scope kind: session (needs --agent and --session), user (--agent and --user), agent
    /// (--agent) or global (no ids); default: inferred from the ids given.
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
        // The CRD's rules, said here in the flags' words before any request (the API
        // server's refusal names fields, not flags).
        let (needs, name) = SCOPE_IDS
            .iter()
            .find(|(k, ..)| *k == kind)
            .map(|(_, needs, name)| (*needs, *name))
            .unwrap_or_default();
        let given = [
            ("--agent", self.agent.is_some()),
            ("--user", self.user.is_some()),
            ("--session", self.session.is_some()),
        ];
        let missing: Vec<&str> = given
            .iter()
            .filter(|(f, on)| !on && needs.contains(f))
            .map(|(f, _)| *f)
            .collect();
        let extra: Vec<&str> = given
            .iter()
            .filter(|(f, on)| *on && !needs.contains(f))
            .map(|(f, _)| *f)
            .collect();
        let wants = if needs.is_empty() {
            "no ids".to_string()
        } else {
            needs.join(" and ")
        };
        if !missing.is_empty() {
            return Err(format!(
                "a {name} scope needs {wants}: give {} too",
                missing.join(" and ")
            ));
        }
        if !extra.is_empty() {
            return Err(format!(
                "a {name} scope takes {wants}, not {} (see --help for the scope kinds)",
                extra.join(" or ")
            ));
        }
        Ok(Scope {
            kind,
            agent: self.agent.clone(),
            user: self.user.clone(),
            session: self.session.clone(),
        })
    }
}

/// Each scope kind, the id flags it needs (and takes: no others), and its name.
const SCOPE_IDS: [(ScopeKind, &[&str], &str); 4] = [
    (ScopeKind::Session, &["--agent", "--session"], "Session"),
    (ScopeKind::User, &["--agent", "--user"], "User"),
    (ScopeKind::Agent, &["--agent"], "Agent"),
    (ScopeKind::Global, &[], "Global"),
];

/// The scope kinds and the ids each needs, for `create --help`.
const SCOPES_HELP: &str = "\
Scopes (the sandbox's name derives from its scope):
  Session  one session of an agent:        --agent A --session S
  User     one user of an agent:           --agent A --user U
  Agent    one agent, shared by its users: --agent A
  Global   one sandbox for everything:     no ids (or --kind global)
The kind is inferred from the ids given (--session: Session, else --user: User, else --agent:
Agent, else Global); --kind names it explicitly.";

#[derive(Subcommand)]
enum Cmd {
    /// Show one sandbox, and where its exposed ports are reached.
    Get(get::GetArgs),
    /// List sandboxes (optionally of one agent/user/session, or of all namespaces).
    List(get::ListArgs),
    /// Create a scope's sandbox from a template or an image (or get it).
    #[command(after_help = SCOPES_HELP)]
    Create(create::CreateArgs),
    /// List the namespace's SandboxTemplates.
    Templates(get::KindListArgs),
    /// List the namespace's SandboxPools (warm pods of a template).
    Pools(get::KindListArgs),
    /// Run a command in a sandbox; exits with its exit code.
    Exec(exec::ExecArgs),
    /// Open an interactive shell (TTY) in a sandbox.
    Shell(Target),
    /// Copy files or directories: `cp NAME:path local` or `cp local NAME:path`.
    Cp(cp::CpArgs),
    /// Hold a sandbox scope's execution guard while a local command runs.
    Lock(lock::LockArgs),
    /// Snapshot a sandbox's workspace into a new SandboxSnapshot.
    ///
    /// Prints its name, and with `--wait` its object key, digest and size once Ready.
    Snapshot(snapshot::SnapshotArgs),
    /// Create a sandbox whose workspace is restored from a snapshot.
    ///
    /// The spec is copied from the snapshot's source sandbox (which must still exist); the
    /// scope flags give another scope, NAME another name (default: the scope's name).
    Restore(restore::RestoreArgs),
    /// Suspend a sandbox: its pod is deleted, its workspace kept on its node.
    Suspend(lifecycle::LifecycleArgs),
    /// Resume a suspended sandbox (`--wait` until it is Ready).
    Resume(lifecycle::LifecycleArgs),
    /// Delete a sandbox and its workspace (its snapshots stay).
    ///
    /// With `--wait`, returns once the object is gone.
    Delete(lifecycle::LifecycleArgs),
    /// Print a shell completion script: `source <(agentbox completion bash)`.
    Completion(completion::CompletionArgs),
}

/// A failure: one line for the user.
#[derive(Debug)]
pub struct Fail(String);

impl<E: std::fmt::Display + 'static> From<E> for Fail {
    fn from(e: E) -> Self {
        // The API server's refusal as its own words (kube's Display adds a debug dump of the
        // whole Status object).
        let any: &dyn std::any::Any = &e;
        if let Some(kube::Error::Api(s)) = any.downcast_ref::<kube::Error>() {
            return Fail(crate::client::refusal(s));
        }
        Fail(e.to_string())
    }
}

/// The command line's definition, named for how it was invoked: `kubectl agentbox` when the
/// program's file name starts with `kubectl-` (kubectl runs plugins by their path), else
/// `agentbox`.
fn command(argv0: Option<&std::ffi::OsStr>) -> clap::Command {
    let cmd = Cli::command();
    let invoked = argv0
        .and_then(|a| std::path::Path::new(a).file_name())
        .map(|f| f.to_string_lossy().into_owned());
    match invoked.as_deref().and_then(|f| f.strip_prefix("kubectl-")) {
        Some(plugin) => {
            // `kubectl-agentbox` → `kubectl agentbox`, as kubectl users type it.
            let plugin = plugin.split('.').next().unwrap_or(plugin).replace('_', "-");
            cmd.bin_name(format!("kubectl {plugin}"))
        }
        None => cmd.bin_name("agentbox"),
    }
}

/// Parses `args` (the program name first) as the CLI does.
fn parse_from<I, T>(args: I) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let mut cmd = command(args.first().map(|a| a.as_os_str()));
    let mut matches = cmd.try_get_matches_from_mut(args)?;
    Cli::from_arg_matches_mut(&mut matches).map_err(|e| e.format(&mut cmd))
}

/// The binaries' `main`: [`main`] on a runtime of its own, which the process does not wait
/// for once the command is done. A read of local stdin (`exec -i`) blocks a thread of the
/// runtime's blocking pool until the next input or EOF, and dropping the runtime waits for
/// it: a command that had finished would hang the CLI until its stdin closed (`(sleep 20) |
/// agentbox exec -i ... -- true` took 20 s).
pub fn entry() -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentbox: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = rt.block_on(main());
    rt.shutdown_background();
    code
}

/// Parses the command line, runs the subcommand, and prints a failure as one line.
pub async fn main() -> ExitCode {
    let cli = match parse_from(std::env::args_os()) {
        Ok(cli) => cli,
        // Help, version and usage errors, printed and exited as clap does.
        Err(e) => e.exit(),
    };
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
    if let Cmd::Completion(a) = &cli.cmd {
        // Needs no cluster: it only describes this command line.
        let argv0 = std::env::args_os().next();
        let script = completion::script(command(argv0.as_deref()), a.shell, argv0.as_deref());
        std::io::Write::write_all(&mut std::io::stdout(), &script)?;
        return Ok(ExitCode::SUCCESS);
    }
    let selection = KubeconfigSelection {
        kubeconfig: cli.kubeconfig.clone(),
        context: cli.context.clone(),
    };
    let client = agentbox_api::kubeclient::kube_client_for(&selection).await?;
    let ns = cli
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let sbx = Sandboxes::new(client.clone(), ns);
    match cli.cmd {
        Cmd::Get(a) => get::get(&sbx, &a).await,
        Cmd::List(a) => get::list(&client, &sbx, &a).await,
        Cmd::Create(a) => create::create(&sbx, a).await,
        Cmd::Templates(a) => templates::templates(&sbx, &a).await,
        Cmd::Pools(a) => pools::pools(&sbx, &a).await,
        Cmd::Exec(a) => exec::exec(&sbx, a).await,
        Cmd::Shell(t) => shell::shell(&open(&sbx, &t).await?).await,
        Cmd::Cp(a) => cp::cp(&sbx, &a.src, &a.dst).await,
        Cmd::Snapshot(a) => snapshot::snapshot(&sbx, a).await,
        Cmd::Restore(a) => restore::restore(&sbx, a).await,
        Cmd::Lock(a) => lock::lock(&sbx, a).await,
        Cmd::Suspend(a) => lifecycle::change(&sbx, lifecycle::Change::Suspend, a).await,
        Cmd::Resume(a) => lifecycle::change(&sbx, lifecycle::Change::Resume, a).await,
        Cmd::Delete(a) => lifecycle::change(&sbx, lifecycle::Change::Delete, a).await,
        // Answered above, before any cluster is contacted.
        Cmd::Completion(_) => Ok(ExitCode::SUCCESS),
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

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        parse_from(std::iter::once("agentbox").chain(args.iter().copied()))
    }

    #[test]
    fn kubeconfig_and_context_are_global_flags() {
        let cli = parse(&["--kubeconfig", "/tmp/kc", "--context", "dev", "get", "box"]).unwrap();
        assert_eq!(cli.kubeconfig, Some(PathBuf::from("/tmp/kc")));
        assert_eq!(cli.context.as_deref(), Some("dev"));
        // After the subcommand too, as kubectl users write them.
        let cli = parse(&["list", "--context", "prod", "-n", "team"]).unwrap();
        assert_eq!(cli.context.as_deref(), Some("prod"));
        assert_eq!(cli.namespace.as_deref(), Some("team"));
        assert_eq!(cli.kubeconfig, None);
        let err = parse(&["list", "--context"]).err().unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
    }

    #[test]
    fn completion_takes_a_known_shell() {
        let Ok(Cli {
            cmd: Cmd::Completion(a),
            ..
        }) = parse(&["completion", "zsh"])
        else {
            panic!("completion zsh parses");
        };
        assert_eq!(a.shell, clap_complete::Shell::Zsh);
        assert!(parse(&["completion", "tcsh"]).is_err());
    }

    #[test]
    fn help_lists_every_subcommand_with_one_line() {
        let help = command(None).render_help().to_string();
        let subs: Vec<_> = command(None).get_subcommands().cloned().collect();
        let names: Vec<&str> = subs.iter().map(|s| s.get_name()).collect();
        assert_eq!(
            names,
            [
                "get",
                "list",
                "create",
                "templates",
                "pools",
                "exec",
                "shell",
                "cp",
                "lock",
                "snapshot",
                "restore",
                "suspend",
                "resume",
                "delete",
                "completion"
            ]
        );
        for sub in &subs {
            let name = sub.get_name();
            let about = sub.get_about().map(|a| a.to_string()).unwrap_or_default();
            // One short line: the details are in the subcommand's own --help.
            assert!(
                !about.is_empty() && !about.contains('\n') && about.len() <= 80,
                "{name}: {about:?}"
            );
            let line = help
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} not in --help:\n{help}"));
            assert!(line.ends_with(&about), "{line:?} vs {about:?}");
        }
    }

    #[test]
    fn named_kubectl_agentbox_it_is_kubectl_agentbox() {
        let as_plugin = |argv0: &str| {
            command(Some(std::ffi::OsStr::new(argv0)))
                .render_usage()
                .to_string()
        };
        assert!(
            as_plugin("/home/me/bin/kubectl-agentbox").starts_with("Usage: kubectl agentbox "),
            "{}",
            as_plugin("/home/me/bin/kubectl-agentbox")
        );
        assert!(as_plugin("agentbox").starts_with("Usage: agentbox "));
        assert!(as_plugin("/usr/local/bin/agentbox").starts_with("Usage: agentbox "));
        // Parse errors name it the same way.
        let err = parse_from(["/x/kubectl-agentbox", "nonsense"])
            .err()
            .unwrap();
        assert!(err.to_string().contains("kubectl agentbox"), "{err}");
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

    #[test]
    fn a_scope_short_of_its_ids_is_refused_in_the_flags_words() {
        let flags = |kind: Option<&str>, ids: [Option<&str>; 3]| ScopeFlags {
            kind: kind.map(String::from),
            agent: ids[0].map(String::from),
            user: ids[1].map(String::from),
            session: ids[2].map(String::from),
        };
        // `--session X` alone: a Session scope, which needs an agent too.
        let err = flags(None, [None, None, Some("s")]).scope().unwrap_err();
        assert_eq!(
            err,
            "a Session scope needs --agent and --session: give --agent too"
        );
        let err = flags(Some("user"), [Some("a"), None, None])
            .scope()
            .unwrap_err();
        assert!(err.contains("give --user too"), "{err}");
        let err = flags(Some("agent"), [Some("a"), Some("u"), None])
            .scope()
            .unwrap_err();
        assert!(err.contains("not --user"), "{err}");
        let err = flags(Some("global"), [Some("a"), None, None])
            .scope()
            .unwrap_err();
        assert!(err.starts_with("a Global scope takes no ids"), "{err}");
        for ok in [
            flags(None, [Some("a"), None, Some("s")]),
            flags(None, [Some("a"), Some("u"), None]),
            flags(None, [Some("a"), None, None]),
            flags(Some("global"), [None, None, None]),
        ] {
            assert!(ok.scope().is_ok());
        }
    }

    #[test]
    fn create_help_says_which_ids_each_scope_kind_needs() {
        let mut cmd = command(None);
        let create = cmd.find_subcommand_mut("create").expect("create");
        let help = create.render_long_help().to_string();
        for line in [
            "Session  one session of an agent:        --agent A --session S",
            "User     one user of an agent:           --agent A --user U",
            "Agent    one agent, shared by its users: --agent A",
            "Global   one sandbox for everything:     no ids",
        ] {
            assert!(help.contains(line), "{line:?} not in:\n{help}");
        }
        assert!(
            help.contains("session (needs --agent and --session)"),
            "{help}"
        );
    }

    #[test]
    fn an_api_refusal_is_one_line_of_the_servers_words() {
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 422, "reason": "Invalid",
            "message": "Sandbox.agentbox.dev \"a\" is invalid: spec.scope: Invalid value: \"object\": scope.agent is required for Session, User and Agent scopes",
            "details": {"name": "a", "group": "agentbox.dev", "kind": "Sandbox", "causes": [
                {"reason": "FieldValueInvalid", "field": "spec.scope",
                 "message": "Invalid value: \"object\": scope.agent is required for Session, User and Agent scopes"},
                {"reason": "FieldValueTooLong", "field": "metadata.labels",
                 "message": "must be no more than\n63 characters"}]},
        }))
        .unwrap();
        let Fail(line) = Fail::from(kube::Error::Api(Box::new(status)));
        assert_eq!(
            line,
            "Sandbox.agentbox.dev \"a\" is invalid: spec.scope: Invalid value: \"object\": scope.agent is required for Session, User and Agent scopes; metadata.labels: must be no more than 63 characters (422 Invalid)"
        );
        // Through the client's error too, and other errors as they say themselves.
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 403, "reason": "Forbidden",
            "message": "sandboxes.agentbox.dev is forbidden: User \"u\" cannot create"}))
        .unwrap();
        let e = crate::client::ClientError::Kube(kube::Error::Api(Box::new(status)));
        let Fail(line) = Fail::from(e);
        assert_eq!(
            line,
            "sandboxes.agentbox.dev is forbidden: User \"u\" cannot create (403 Forbidden)"
        );
        let Fail(line) = Fail::from("plain".to_string());
        assert_eq!(line, "plain");
    }
}
