//! `agentbox` (also `kubectl agentbox`): the command line; all of it is in `agentbox_client::cli`.
#![forbid(unsafe_code)]

#[tokio::main]
async fn main() -> std::process::ExitCode {
    agentbox_client::cli::main().await
}
