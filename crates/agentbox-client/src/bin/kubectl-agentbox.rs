//! `kubectl-agentbox`: the `agentbox` CLI under the name kubectl looks for on the PATH, so it
//! also runs as `kubectl agentbox ...`; all of it is in `agentbox_client::cli`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    agentbox_client::cli::entry()
}
