//! `agentbox` (also `kubectl agentbox`): the command line; all of it is in `agentbox_client::cli`.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    agentbox_client::cli::entry()
}
