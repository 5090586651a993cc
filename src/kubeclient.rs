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
use kube::client::{ClientBuilder, ConfigExt};
use kube::{Client, Config};
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

/// A client from the inferred configuration (kubeconfig, else in-cluster), with `TCP_NODELAY`.
/// Use this instead of [`Client::try_default`].
pub async fn kube_client() -> Result<Client, kube::Error> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    client_from_config(config)
}

/// The User-Agent of the operator's requests. kube sends none, so without it the API server's
/// audit log cannot tell the operator's writes from a harness's or kubectl's made with the same
/// credentials.
pub const OPERATOR_USER_AGENT: &str = concat!("agentbox-operator/", env!("CARGO_PKG_VERSION"));

/// [`kube_client`] that names itself `user_agent` in every request.
pub async fn kube_client_as(user_agent: &'static str) -> Result<Client, kube::Error> {
    // reqwest re-exports the `http` crate kube's headers are typed with.
    use reqwest::header::{HeaderValue, USER_AGENT};
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
