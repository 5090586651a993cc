//! The operator process: API client, health and metrics endpoints, leader election, the
//! controllers, and a graceful stop on SIGTERM/SIGINT.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::server::{self, Health};
use agentbox_api::guard::{self, GuardConfig};
use agentbox_api::labels;

/// Why the operator stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// No usable kubeconfig or in-cluster configuration.
    #[error("kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// The leader lease could not be taken (API unreachable or refused).
    #[error("leader election: {0}")]
    Election(#[source] guard::GuardError),
    /// Another replica took over (or renewal failed); exit so the replica restarts clean.
    #[error("lost leadership")]
    LostLeadership,
    /// The health/metrics endpoint could not bind.
    #[error("serving {addr}: {source}")]
    Serve {
        /// Address.
        addr: std::net::SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Runs the operator until SIGTERM/SIGINT (Ok) or lost leadership (Err).
pub async fn run(config: Config) -> Result<(), OperatorError> {
    // kube's default stack with TCP_NODELAY and our User-Agent (see agentbox_api::kubeclient).
    let client =
        agentbox_api::kubeclient::kube_client_as(agentbox_api::kubeclient::OPERATOR_USER_AGENT)
            .await
            .map_err(OperatorError::Client)?;
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    // The resident set against the memory limit, leader or standby alike.
    tokio::spawn(crate::headroom::run(metrics.clone()));

    let listener = tokio::net::TcpListener::bind(config.metrics_addr)
        .await
        .map_err(|source| OperatorError::Serve {
            addr: config.metrics_addr,
            source,
        })?;
    let health = Health {
        metrics: metrics.clone(),
        ready: ready.clone(),
    };
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let r = axum::serve(listener, server::router(health))
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
        if let Err(e) = r {
            error!("health endpoint stopped: {e}");
        }
    });

    // Ready once the API server answers, leader or standby alike.
    let probe_client = client.clone();
    let probe_ready = ready.clone();
    tokio::spawn(async move {
        loop {
            if probe_client.apiserver_version().await.is_ok() {
                probe_ready.store(true, Ordering::Relaxed);
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });

    // Sandboxes get the proxy's Service by its ClusterIP: an allowlisted sandbox has no DNS.
    let mut config = config;
    config.egress_proxy_url =
        crate::controller::proxy_address::resolve(&client, &config.egress_proxy_url).await;

    if !config.leader_election {
        info!(identity = %config.identity, "leader election disabled; reconciling");
        metrics.leader.set(1);
        let stop = shutdown.clone();
        crate::controller::run(
            client,
            config,
            metrics,
            async move { stop.cancelled().await },
        )
        .await;
        return Ok(());
    }

    let leases: Api<Lease> = Api::namespaced(client.clone(), config.lease_namespace());
    let gcfg = GuardConfig {
        lease_duration: Duration::from_secs(u64::from(config.lease_seconds.max(2))),
        holder: config.identity.clone(),
        retry_interval: Duration::from_secs(1),
        // the standby waits without queueing: the leader holds until it stops or is lost
        queue: false,
        ..GuardConfig::default()
    };
    let lease_labels =
        BTreeMap::from([(labels::MANAGED_BY.to_string(), labels::MANAGER.to_string())]);
    info!(identity = %config.identity, lease = %config.leader_election_name, namespace = %config.lease_namespace(), "waiting for leadership");
    let leader = tokio::select! {
        g = guard::acquire(&leases, &config.leader_election_name, lease_labels, &gcfg, None) => {
            g.map_err(OperatorError::Election)?
        }
        _ = shutdown.cancelled() => return Ok(()),
    };
    info!(identity = %config.identity, token = leader.token(), "became leader");
    metrics.leader.set(1);
    let stop = shutdown.clone();
    let lost = leader.cancellation();
    crate::controller::run(client, config, metrics.clone(), async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = lost.cancelled() => {}
        }
    })
    .await;
    metrics.leader.set(0);
    if leader.is_lost() {
        error!("lost leadership; exiting so that this replica restarts as a follower");
        return Err(OperatorError::LostLeadership);
    }
    // Hand over at once instead of making the next leader wait out the lease.
    if let Err(e) = leader.release().await {
        warn!("releasing the leader lease: {e}");
    }
    info!("stopped");
    Ok(())
}

async fn stop_on_signal(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        error!("cannot install signal handlers");
        return;
    };
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: shutting down"),
        _ = int.recv() => info!("SIGINT: shutting down"),
    }
    token.cancel();
}
