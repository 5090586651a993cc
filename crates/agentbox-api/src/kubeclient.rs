//! The Kubernetes API client every agentbox process uses (operator, CLI, harness library).
//!
//! It is kube's default stack (rustls, connect/read/write timeouts, base URI, server-error
//! retries, authentication, extra headers) over a TCP connector with `TCP_NODELAY` set.
//! kube's own [`kube::Client::try_default`] leaves Nagle's algorithm on, so the small frames of
//! an exec (the request, stdin, the close) wait for the peer's delayed ACK: about 40 ms per
//! one-shot exec on Linux. With a proxy configured, kube's own stack is used unchanged.

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::retry::RetryPolicy;
use std::path::PathBuf;

use kube::client::{ClientBuilder, ConfigExt};
use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};
use kube::{Client, Config};
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// A client from the inferred configuration (kubeconfig, else in-cluster), with `TCP_NODELAY`.
/// Use this instead of [`Client::try_default`].
pub async fn kube_client() -> Result<Client, kube::Error> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    client_from_config(config)
}

/// What a command-line tool was told about its cluster: kubectl's `--kubeconfig` and
/// `--context`, each `None` when not given (then defaulting as kubectl's do).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeconfigSelection {
    /// The kubeconfig file (default: `$KUBECONFIG`, else `~/.kube/config`).
    pub kubeconfig: Option<PathBuf>,
    /// The context to use (default: the kubeconfig's current context).
    pub context: Option<String>,
}

/// Why a client for a [`KubeconfigSelection`] could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientConfigError {
    /// The kubeconfig could not be read or its context not loaded.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[source] KubeconfigError),
    /// `--context` names a context the kubeconfig does not have.
    #[error("context {context:?} is not in the kubeconfig (its contexts: {known})")]
    UnknownContext {
        /// The context asked for.
        context: String,
        /// The contexts the kubeconfig has, comma-separated.
        known: String,
    },
    /// Building the client failed.
    #[error(transparent)]
    Client(#[from] kube::Error),
}

/// A client for what the command line selected: [`kube_client`] when nothing was (so
/// in-cluster configuration still works), else the kubeconfig file and context given.
pub async fn kube_client_for(sel: &KubeconfigSelection) -> Result<Client, ClientConfigError> {
    if sel.kubeconfig.is_none() && sel.context.is_none() {
        return Ok(kube_client().await?);
    }
    let kubeconfig = match &sel.kubeconfig {
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    }
    .map_err(ClientConfigError::Kubeconfig)?;
    if let Some(context) = &sel.context {
        check_context(&kubeconfig, context)?;
    }
    let options = KubeConfigOptions {
        context: sel.context.clone(),
        ..Default::default()
    };
    let config = Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(ClientConfigError::Kubeconfig)?;
    Ok(client_from_config(config)?)
}

/// Refuses a context the kubeconfig lacks, naming the ones it has (kube's own error reads
/// "failed to load current context", which sends the user looking at the wrong thing).
fn check_context(kubeconfig: &Kubeconfig, context: &str) -> Result<(), ClientConfigError> {
    if kubeconfig.contexts.iter().any(|c| c.name == context) {
        return Ok(());
    }
    let known: Vec<&str> = kubeconfig
        .contexts
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    Err(ClientConfigError::UnknownContext {
        context: context.to_string(),
        known: if known.is_empty() {
            "none".into()
        } else {
            known.join(", ")
        },
    })
}

/// The User-Agent of the operator's requests. kube sends none, so without it the API server's
/// audit log cannot tell the operator's writes from a harness's or kubectl's made with the same
/// credentials.
pub const OPERATOR_USER_AGENT: &str = concat!("agentbox-operator/", env!("CARGO_PKG_VERSION"));

/// [`kube_client`] that names itself `user_agent` in every request.
pub async fn kube_client_as(user_agent: &'static str) -> Result<Client, kube::Error> {
    use http::header::{HeaderValue, USER_AGENT};
    let mut config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    config
        .headers
        .push((USER_AGENT, HeaderValue::from_static(user_agent)));
    client_from_config(config)
}

/// A client for `config`, with `TCP_NODELAY` on its connections (see the module docs).
pub fn client_from_config(config: Config) -> Result<Client, kube::Error> {
    if config.proxy_url.is_some() {
        // Proxies (HTTP CONNECT, SOCKS5) are kube's business.
        return Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(ClientBuilder::new(service, config.default_namespace).build())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO_CONTEXTS: &str = "
apiVersion: v1
kind: Config
current-context: a
clusters:
- name: c
  cluster: {server: 'https://127.0.0.1:6443'}
users:
- name: u
  user: {token: t}
contexts:
- name: a
  context: {cluster: c, user: u}
- name: b
  context: {cluster: c, user: u, namespace: other}
";

    #[test]
    fn an_unknown_context_names_the_known_ones() {
        let kc = Kubeconfig::from_yaml(TWO_CONTEXTS).unwrap();
        assert!(check_context(&kc, "b").is_ok());
        let err = check_context(&kc, "nope").unwrap_err().to_string();
        assert_eq!(
            err,
            "context \"nope\" is not in the kubeconfig (its contexts: a, b)"
        );
    }

    #[tokio::test]
    async fn the_selected_file_and_context_are_used() {
        let dir = std::env::temp_dir().join(format!("agentbox-kc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config");
        std::fs::write(&path, TWO_CONTEXTS).unwrap();
        let sel = KubeconfigSelection {
            kubeconfig: Some(path.clone()),
            context: Some("b".into()),
        };
        let client = kube_client_for(&sel).await.unwrap();
        assert_eq!(client.default_namespace(), "other");
        let missing = KubeconfigSelection {
            kubeconfig: Some(dir.join("absent")),
            context: None,
        };
        match kube_client_for(&missing).await {
            Err(ClientConfigError::Kubeconfig(e)) => {
                assert!(e.to_string().contains("absent"), "names the file: {e}")
            }
            Err(e) => panic!("expected a kubeconfig error, got {e}"),
            Ok(_) => panic!("a missing kubeconfig made a client"),
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
