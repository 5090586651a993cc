//! `agentbox` (also `kubectl agentbox`): the command line; all of it is in `agentbox::cli`.
#![forbid(unsafe_code)]

#[tokio::main]
async fn main() -> std::process::ExitCode {
    agentbox::cli::main().await
}
