//! `agentbox-selftest`: what the chart's `helm test` pod runs (from the operator image, which has
//! no shell). Through the harness library, as a harness would: create a Sandbox, wait until it
//! is Ready, run commands in it (a file from the spec, a real exit code), delete it and wait
//! until it is gone. Exits non-zero, saying which step failed, when anything does.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use agentbox_api::crd::{Sandbox, SandboxSpec, Scope, ScopeKind};
use agentbox_api::exec::ExecRequest;
use agentbox_client::client::Sandboxes;
use clap::Parser;
use kube::api::{Api, DeleteParams};

/// Creates a Sandbox, runs commands in it and deletes it; exits 0 when all of it works.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Namespace in which the operator manages Sandboxes.
    #[arg(long, env = "AGENTBOX_NAMESPACE")]
    namespace: String,
    /// Image of the test Sandbox (needs sh).
    #[arg(long)]
    image: String,
    /// Session id of the test Sandbox's scope (agent `agentbox-selftest`): one Sandbox per run.
    #[arg(long, env = "AGENTBOX_SELFTEST_SESSION")]
    session: String,
    /// Seconds the Sandbox may take to become Ready, and to go.
    #[arg(long, default_value_t = 180)]
    timeout: u64,
}

const GREETING: &str = "hello from the agentbox self-test\n";

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args).await {
        Ok(()) => {
            println!("ok: the Sandbox was created, Ready, ran commands and was deleted");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("agentbox-selftest: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<(), String> {
    let client = agentbox_api::kube_client()
        .await
        .map_err(|e| format!("connecting to the API server: {e}"))?;
    let sandboxes = Sandboxes::new(client.clone(), &args.namespace);
    let scope = Scope {
        kind: ScopeKind::Session,
        agent: Some("agentbox-selftest".into()),
        user: None,
        session: Some(args.session.clone()),
    };
    let spec: SandboxSpec = serde_json::from_value(serde_json::json!({
        "image": args.image,
        "scope": scope,
        "snapshot": {"restore": "None"},
        "workspace": {"files": [{"path": "hello.txt", "content": GREETING}]},
    }))
    .map_err(|e| format!("the test spec: {e}"))?;
    let timeout = Duration::from_secs(args.timeout);
    let mut sbx = sandboxes
        .get_or_create(&scope, spec)
        .await
        .map_err(|e| format!("creating the Sandbox: {e}"))?;
    let name = sbx.name().to_string();
    println!("created Sandbox {}/{name}", args.namespace);
    let checked = async {
        sbx.wait_ready(timeout)
            .await
            .map_err(|e| format!("waiting for {name} to be Ready: {e}"))?;
        println!("{name} is Ready");
        let out = sbx
            .exec(ExecRequest::shell("cat hello.txt").timeout(Duration::from_secs(60)))
            .await
            .map_err(|e| format!("exec in {name}: {e}"))?;
        if out.status.code() != Some(0) || out.stdout_str() != GREETING {
            return Err(format!(
                "exec in {name}: `cat hello.txt` gave {:?} with {:?}",
                out.status.code(),
                out.stdout_str()
            ));
        }
        let out = sbx
            .exec(ExecRequest::shell("exit 3").timeout(Duration::from_secs(60)))
            .await
            .map_err(|e| format!("exec in {name}: {e}"))?;
        if out.status.code() != Some(3) {
            return Err(format!(
                "exec in {name}: `exit 3` gave exit code {:?}",
                out.status.code()
            ));
        }
        println!("{name} ran commands (file content and exit code as expected)");
        Ok(())
    }
    .await;
    // Deleted also when a step failed, so that a failed test leaves nothing behind.
    let deleted = delete(&client, &args.namespace, &name, timeout).await;
    checked?;
    deleted?;
    println!("{name} is deleted");
    Ok(())
}

async fn delete(
    client: &kube::Client,
    ns: &str,
    name: &str,
    timeout: Duration,
) -> Result<(), String> {
    let api: Api<Sandbox> = Api::namespaced(client.clone(), ns);
    api.delete(name, &DeleteParams::default())
        .await
        .map_err(|e| format!("deleting {name}: {e}"))?;
    let deadline = tokio::time::Instant::now() + timeout;
    while api
        .get_opt(name)
        .await
        .map_err(|e| format!("waiting for {name} to go: {e}"))?
        .is_some()
    {
        if tokio::time::Instant::now() > deadline {
            return Err(format!("{name} still exists after {timeout:?}"));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}
