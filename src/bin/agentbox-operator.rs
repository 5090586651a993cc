//! The agentbox operator: `agentbox-operator --help` lists the settings.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let config = match agentbox_operator::config::Config::parse().validated() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agentbox-operator: {e}");
            return ExitCode::from(2);
        }
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if config.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    match agentbox_operator::operator::run(config).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
