//! agentbox-proxy: `agentbox-proxy serve --help` lists the settings; `agentbox-proxy
//! write-table` is what the operator runs in the proxy's pod to hand it a new table.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::io::Read;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ipnet::IpNet;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

use agentbox_proxy::rules::AddressPolicy;
use agentbox_proxy::server::{self, Settings, Shared};
use agentbox_proxy::table;

/// The default place of the table (an emptyDir of the proxy's pod).
const TABLE: &str = "/run/agentbox-proxy/table.json";

#[derive(Parser)]
#[command(name = "agentbox-proxy", version, about = "agentbox's egress proxy")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve: HTTP CONNECT (TLS, server name checked) and plain HTTP, by the table's allowlists.
    Serve(Serve),
    /// Check a table (JSON) and write it atomically where `serve` reads it: the table is the
    /// argument (how the operator sends it: an exec without a shell, in an image without one,
    /// cannot close stdin reliably), or stdin without one.
    WriteTable {
        /// The table file.
        #[arg(long, default_value = TABLE)]
        path: PathBuf,
        /// The table itself.
        table: Option<String>,
    },
    /// Exit 0 when a TCP connection to ADDR opens within two seconds: the chart's liveness
    /// and readiness probes, run in the pod (its loopback), so they need no route from the
    /// node to the pod network and no shell in the image.
    Probe {
        /// The address to connect to.
        #[arg(default_value = "127.0.0.1:3128")]
        addr: SocketAddr,
    },
}

#[derive(clap::Args)]
struct Serve {
    /// Where sandboxes connect.
    #[arg(long, default_value = "0.0.0.0:3128")]
    listen: SocketAddr,
    /// Where /metrics is served.
    #[arg(long, default_value = "0.0.0.0:9090")]
    metrics: SocketAddr,
    /// The table the operator writes.
    #[arg(long, default_value = TABLE)]
    table: PathBuf,
    /// The cluster's address blocks (pods, services, nodes): names leading there are refused
    /// unless the sandbox's own cidr entry allows them. Repeatable.
    #[arg(long = "cluster-cidr", value_name = "CIDR")]
    cluster_cidrs: Vec<IpNet>,
    /// Private blocks that names may lead to all the same (an internal mirror outside the
    /// cluster). Repeatable.
    #[arg(long = "permit-cidr", value_name = "CIDR")]
    permit_cidrs: Vec<IpNet>,
    /// NAME=IP: resolve NAME to IP without DNS (the administrator's; the test cluster has no
    /// DNS). Repeatable; a name given twice has every address.
    #[arg(long = "static-host", value_name = "NAME=IP")]
    static_hosts: Vec<String>,
    /// Seconds a client has for its request head (and its TLS ClientHello after CONNECT).
    #[arg(long, default_value_t = 10)]
    head_timeout: u64,
    /// Seconds to wait for a destination to accept.
    #[arg(long, default_value_t = 10)]
    connect_timeout: u64,
    /// Seconds a tunnel may stay idle (no byte either way) before it is closed.
    #[arg(long, default_value_t = 300)]
    idle_timeout: u64,
    /// Open connections one sandbox may hold.
    #[arg(long, default_value_t = 256)]
    max_per_sandbox: usize,
    /// Open connections the proxy holds in all.
    #[arg(long, default_value_t = 8192)]
    max_connections: usize,
    /// Log as JSON lines.
    #[arg(long)]
    log_json: bool,
}

fn static_hosts(v: &[String]) -> Result<HashMap<String, Vec<IpAddr>>, String> {
    let mut out: HashMap<String, Vec<IpAddr>> = HashMap::new();
    for s in v {
        let (name, ip) = s
            .split_once('=')
            .ok_or_else(|| format!("--static-host {s:?}: expected NAME=IP"))?;
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| format!("--static-host {s:?}: {ip:?} is not an IP address"))?;
        let name = agentbox_proxy::rules::host_name(name)
            .map_err(|e| format!("--static-host {s:?}: {e}"))?;
        out.entry(name).or_default().push(ip);
    }
    Ok(out)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::WriteTable { path, table: arg } => {
            let mut bytes = Vec::new();
            let limit = table::MAX_TABLE + 1;
            match arg {
                Some(t) => bytes = t.into_bytes(),
                None => {
                    if let Err(e) = std::io::stdin().take(limit).read_to_end(&mut bytes) {
                        eprintln!("agentbox-proxy write-table: stdin: {e}");
                        return ExitCode::FAILURE;
                    }
                }
            }
            match table::write(&path, &bytes) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("agentbox-proxy write-table: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Probe { addr } => {
            match std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("agentbox-proxy probe {addr}: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Serve(s) => {
            let filter =
                EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
            if s.log_json {
                tracing_subscriber::fmt()
                    .json()
                    .with_env_filter(filter)
                    .init();
            } else {
                // Colours only on a terminal: a container's log is read by tools and people
                // searching it for `sandbox=NAME`.
                use std::io::IsTerminal;
                tracing_subscriber::fmt()
                    .with_ansi(std::io::stdout().is_terminal())
                    .with_env_filter(filter)
                    .init();
            }
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("agentbox-proxy: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(serve(s)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

async fn serve(s: Serve) -> Result<(), String> {
    let settings = Settings {
        addresses: AddressPolicy {
            cluster: s.cluster_cidrs.iter().map(IpNet::trunc).collect(),
            permitted: s.permit_cidrs.iter().map(IpNet::trunc).collect(),
        },
        static_hosts: static_hosts(&s.static_hosts)?,
        head_timeout: Duration::from_secs(s.head_timeout.max(1)),
        connect_timeout: Duration::from_secs(s.connect_timeout.max(1)),
        idle_timeout: Duration::from_secs(s.idle_timeout.max(1)),
        max_per_sandbox: s.max_per_sandbox.max(1),
        max_connections: s.max_connections.max(1),
    };
    let shared = Shared::new(settings);
    let listener = TcpListener::bind(s.listen)
        .await
        .map_err(|e| format!("listen on {}: {e}", s.listen))?;
    let metrics = TcpListener::bind(s.metrics)
        .await
        .map_err(|e| format!("metrics on {}: {e}", s.metrics))?;
    tracing::info!(listen = %s.listen, metrics = %s.metrics, table = %s.table.display(), "serving");
    tokio::spawn(table::watch(
        s.table.clone(),
        Arc::clone(&shared),
        Duration::from_millis(250),
    ));
    tokio::spawn(serve_metrics(metrics, Arc::clone(&shared)));
    server::serve(listener, shared)
        .await
        .map_err(|e| format!("accept: {e}"))
}

/// Answers every connection with the metrics (one small HTTP/1.0 response, whatever was asked).
async fn serve_metrics(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((mut c, _)) = listener.accept().await else {
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let _ = tokio::time::timeout(Duration::from_secs(2), c.read(&mut buf)).await;
            let body = shared.metrics.encode();
            let head = format!(
                "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = c.write_all(head.as_bytes()).await;
            let _ = c.write_all(body.as_bytes()).await;
            let _ = c.shutdown().await;
        });
    }
}
