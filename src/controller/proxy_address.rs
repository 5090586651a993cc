//! The egress proxy's address as sandboxes reach it. The chart names the proxy by its Service's
//! DNS name, but a sandbox whose egress is an allowlist reaches no DNS server (its
//! NetworkPolicy admits only its entries and the proxy), so its HTTP clients could not find the
//! proxy at all. A Service's ClusterIP never changes while the Service exists, so the operator
//! reads it once at start and gives sandboxes `http://<clusterIP>:<port>` instead.
//!
//! The parsing is pure ([`service_of`], [`with_host`]); [`resolve`] does the one read.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::Api;
use tracing::{info, warn};

/// A Service named by a URL's host: `<name>.<namespace>.svc[.<cluster domain>]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceName {
    /// The Service's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
}

/// The `(scheme, host, rest)` of an `http://` URL: `rest` is the port and path after the host.
fn split(url: &str) -> Option<(&str, &str, &str)> {
    let after = url.strip_prefix("http://")?;
    let end = after.find([':', '/']).unwrap_or(after.len());
    let (host, rest) = after.split_at(end);
    (!host.is_empty()).then_some(("http://", host, rest))
}

/// The Service a proxy URL names by its cluster DNS name, if it does.
pub fn service_of(url: &str) -> Option<ServiceName> {
    let (_, host, _) = split(url)?;
    let mut labels = host.split('.');
    let name = labels.next()?;
    let namespace = labels.next()?;
    if labels.next()? != "svc" || name.is_empty() || namespace.is_empty() {
        return None;
    }
    Some(ServiceName {
        name: name.to_string(),
        namespace: namespace.to_string(),
    })
}

/// `url` with its host replaced by `ip` (an IPv6 address in brackets).
pub fn with_host(url: &str, ip: &str) -> Option<String> {
    let (scheme, _, rest) = split(url)?;
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    Some(format!("{scheme}{host}{rest}"))
}

/// The ClusterIP of a Service, `None` for a headless one (or none assigned yet).
fn cluster_ip(service: &Service) -> Option<String> {
    let ip = service.spec.as_ref()?.cluster_ip.as_deref()?;
    (!ip.is_empty() && ip != "None").then(|| ip.to_string())
}

/// How long [`resolve`] waits for the Service to appear: the chart creates it with the
/// operator, and the API server may hand it out after the operator's pod starts.
const WAIT: Duration = Duration::from_secs(30);

/// `url` as sandboxes should get it: a Service's DNS name replaced by its ClusterIP, read once.
/// Any other URL, a headless Service, or one that cannot be read within [`WAIT`] leaves the URL
/// as it is (with a warning: sandboxes without DNS then cannot find the proxy).
pub async fn resolve(client: &kube::Client, url: &str) -> String {
    let Some(svc) = service_of(url) else {
        return url.to_string();
    };
    let api: Api<Service> = Api::namespaced(client.clone(), &svc.namespace);
    let deadline = tokio::time::Instant::now() + WAIT;
    let why = loop {
        let read = tokio::time::timeout(Duration::from_secs(10), api.get_opt(&svc.name)).await;
        let why = match read {
            Ok(Ok(Some(s))) => match cluster_ip(&s).and_then(|ip| with_host(url, &ip)) {
                Some(resolved) => {
                    info!(%url, %resolved, "egress proxy: sandboxes reach it by its Service's ClusterIP");
                    return resolved;
                }
                // A headless Service stays headless: no point in waiting.
                None => break "the Service has no ClusterIP (headless)".to_string(),
            },
            Ok(Ok(None)) => "the Service does not exist".to_string(),
            Ok(Err(e)) => format!("reading the Service failed: {e}"),
            Err(_) => "reading the Service timed out".to_string(),
        };
        if tokio::time::Instant::now() >= deadline {
            break why;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    };
    warn!(%url, service = %svc.name, namespace = %svc.namespace, "egress proxy: sandboxes get its DNS name, which a sandbox without DNS cannot resolve: {why}");
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_dns_name_is_recognised_with_or_without_the_cluster_domain() {
        let want = Some(ServiceName {
            name: "agentbox-proxy".into(),
            namespace: "agentbox-system".into(),
        });
        assert_eq!(
            service_of("http://agentbox-proxy.agentbox-system.svc:3128"),
            want
        );
        assert_eq!(
            service_of("http://agentbox-proxy.agentbox-system.svc.cluster.local:3128/"),
            want
        );
    }

    #[test]
    fn other_hosts_are_not_services() {
        for url in [
            "http://10.96.0.20:3128",
            "http://proxy.example.com:3128",
            "http://agentbox-proxy:3128",
            "http://a.b.svcx:3128",
            "https://agentbox-proxy.ns.svc:3128",
            "http://.ns.svc:3128",
            "http://",
        ] {
            assert_eq!(service_of(url), None, "{url}");
        }
    }

    #[test]
    fn the_host_is_replaced_and_the_port_and_path_kept() {
        assert_eq!(
            with_host("http://agentbox-proxy.ns.svc:3128", "10.96.0.20").as_deref(),
            Some("http://10.96.0.20:3128")
        );
        assert_eq!(
            with_host("http://p.ns.svc.cluster.local/x", "fd00::14").as_deref(),
            Some("http://[fd00::14]/x")
        );
        assert_eq!(with_host("ftp://p.ns.svc", "10.0.0.1"), None);
    }

    #[test]
    fn a_headless_service_has_no_cluster_ip() {
        let mut s = Service::default();
        assert_eq!(cluster_ip(&s), None);
        s.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
            cluster_ip: Some("None".into()),
            ..Default::default()
        });
        assert_eq!(cluster_ip(&s), None);
        s.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.20".into());
        assert_eq!(cluster_ip(&s).as_deref(), Some("10.96.0.20"));
    }
}
