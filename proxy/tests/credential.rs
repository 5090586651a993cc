//! Credentials added at the hop, on loopback in process (no cluster): the "sandbox" (this
//! process from 127.0.0.1) sends plain HTTP for a credentialed name; the proxy opens TLS to a
//! loopback server whose certificate a CA made here signed (the CA given to the proxy as its
//! extra root), sets the header and relays. A server with a certificate of another CA is
//! refused before anything is sent to it; a CONNECT to the name is refused; the value is in
//! no response the sandbox gets and in no Debug print of the table.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use agentbox_proxy::credential;
use agentbox_proxy::rules::{AddressPolicy, Table};
use agentbox_proxy::server::{self, Settings, Shared};

const BOUND: Duration = Duration::from_secs(20);
const KEY: &str = "Bearer sk-loopback-7f3e9a1c";

/// A CA and a server certificate for `names` signed by it.
struct Pki {
    ca: CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

fn pki(names: &[&str]) -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let issuer = CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    Pki {
        ca: issuer.der().clone(),
        chain: vec![leaf.der().clone()],
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der())),
    }
}

/// A loopback TLS server answering one `200 seen` per connection; every request head it got
/// is recorded, and whether any connection finished a handshake.
struct TlsServer {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
}

async fn tls_server(p: &Pki) -> TlsServer {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(p.chain.clone(), p.key.clone_key())
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let heads = Arc::new(Mutex::new(Vec::new()));
    let h = Arc::clone(&heads);
    tokio::spawn(async move {
        loop {
            let Ok((c, _)) = l.accept().await else { return };
            let acceptor = acceptor.clone();
            let h = Arc::clone(&h);
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(c).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut tmp = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut tmp).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&tmp[..n]),
                    }
                }
                h.lock()
                    .unwrap()
                    .push(String::from_utf8_lossy(&buf).into_owned());
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nseen",
                    )
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    TlsServer { port, heads }
}

/// The proxy on loopback: `trusted` is its extra root; names all resolve to loopback.
async fn proxy(
    trusted: &CertificateDer<'static>,
    allow: serde_json::Value,
) -> (SocketAddr, Arc<Shared>) {
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    let settings = Settings {
        addresses: AddressPolicy {
            cluster: vec![],
            permitted: vec!["127.0.0.0/8".parse().unwrap()],
        },
        static_hosts: HashMap::from([
            ("api.cred.test".to_string(), vec![lo]),
            ("bad.cred.test".to_string(), vec![lo]),
            ("plain.cred.test".to_string(), vec![lo]),
        ]),
        head_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(60),
        max_per_sandbox: 16,
        max_connections: 64,
    };
    let shared = Shared::new(settings);
    shared.set_upstream_tls(credential::client_config(std::slice::from_ref(trusted)).unwrap());
    let table: Table = serde_json::from_value(serde_json::json!({"sandboxes": [
        {"ip": "127.0.0.1", "namespace": "ns", "name": "s", "allow": allow}
    ]}))
    .unwrap();
    let shown = format!("{table:?}");
    assert!(
        !shown.contains(KEY),
        "the table Debug-prints the value: {shown}"
    );
    shared.set_table(&table);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(server::serve(l, Arc::clone(&shared)));
    (addr, shared)
}

/// Sends `request` to the proxy and reads until it closes.
async fn ask(proxy: SocketAddr, request: String) -> String {
    let mut c = TcpStream::connect(proxy).await.unwrap();
    c.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(BOUND, c.read_to_end(&mut out))
        .await
        .expect("the proxy answers")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

fn cred_entry(name: &str, port: u16) -> serde_json::Value {
    serde_json::json!({"domain": name, "ports": [[port, port]],
                       "credential": {"header": "Authorization", "value": KEY}})
}

#[tokio::test]
async fn the_header_arrives_over_verified_tls_and_replaces_the_sandboxs() {
    let good = pki(&["api.cred.test"]);
    let server = tls_server(&good).await;
    let port = server.port;
    let (p, shared) = proxy(
        &good.ca,
        serde_json::json!([cred_entry("api.cred.test", port)]),
    )
    .await;
    let out = ask(
        p,
        format!(
            "GET http://api.cred.test:{port}/v1/models HTTP/1.1\r\nHost: api.cred.test:{port}\r\n\
             Authorization: Bearer the-sandbox-s-own\r\nX-Trace: 1\r\n\r\n"
        ),
    )
    .await;
    assert!(
        out.starts_with("HTTP/1.1 200") && out.ends_with("seen"),
        "{out}"
    );
    assert!(
        !out.contains(KEY),
        "the value came back to the sandbox: {out}"
    );
    let heads = server.heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    let h = &heads[0];
    assert!(h.starts_with("GET /v1/models HTTP/1.1\r\n"), "{h}");
    assert!(h.contains(&format!("Authorization: {KEY}\r\n")), "{h}");
    assert!(!h.contains("the-sandbox-s-own"), "{h}");
    assert_eq!(h.matches("uthorization").count(), 1, "{h}");
    assert!(h.contains("X-Trace: 1\r\n"), "{h}");
    let metrics = shared.metrics.encode();
    assert!(!metrics.contains(KEY), "{metrics}");
}

#[tokio::test]
async fn a_server_the_proxy_cannot_verify_gets_nothing() {
    let trusted = pki(&["api.cred.test"]);
    // A certificate for the name from another CA.
    {
        let name = "api.cred.test";
        let server = tls_server(&pki(&[name])).await;
        let port = server.port;
        let (p, shared) = proxy(&trusted.ca, serde_json::json!([cred_entry(name, port)])).await;
        let out = ask(
            p,
            format!("GET http://{name}:{port}/ HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n"),
        )
        .await;
        assert!(out.starts_with("HTTP/1.1 502"), "{out}");
        assert!(out.contains("did not verify"), "{out}");
        assert!(
            server.heads.lock().unwrap().is_empty(),
            "a request reached the server"
        );
        assert!(
            shared.metrics.encode().contains("upstream_unverified"),
            "{}",
            shared.metrics.encode()
        );
    }
    // A certificate of the trusted CA, but for another name.
    let wrong_name = pki(&["bad.cred.test"]);
    let server = tls_server(&wrong_name).await;
    let port = server.port;
    let (p, _) = proxy(
        &wrong_name.ca,
        serde_json::json!([cred_entry("api.cred.test", port)]),
    )
    .await;
    let out = ask(
        p,
        format!("GET http://api.cred.test:{port}/ HTTP/1.1\r\nHost: api.cred.test:{port}\r\n\r\n"),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 502"), "{out}");
    assert!(server.heads.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_credentialed_name_takes_no_connect_and_other_names_get_no_credential() {
    let good = pki(&["api.cred.test"]);
    let server = tls_server(&good).await;
    let port = server.port;
    // A plain (uncredentialed) listener for another allowed name.
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain_port = plain.local_addr().unwrap().port();
    let (p, _) = proxy(
        &good.ca,
        serde_json::json!([
            cred_entry("api.cred.test", port),
            {"domain": "*.cred.test"}
        ]),
    )
    .await;
    let out = ask(
        p,
        format!("CONNECT api.cred.test:{port} HTTP/1.1\r\nHost: api.cred.test:{port}\r\n\r\n"),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    assert!(out.contains("plain http://"), "{out}");
    // A port the credentialed entry does not list is refused, though the wildcard has it.
    let out = ask(
        p,
        format!("GET http://api.cred.test:{plain_port}/ HTTP/1.1\r\nHost: api.cred.test:{plain_port}\r\n\r\n"),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 403"), "{out}");
    // Another name of the wildcard goes as it is (plain HTTP), without the credential.
    let req = tokio::spawn(ask(
        p,
        format!(
            "GET http://plain.cred.test:{plain_port}/ HTTP/1.1\r\nHost: plain.cred.test:{plain_port}\r\n\r\n"
        ),
    ));
    let (mut c, _) = tokio::time::timeout(BOUND, plain.accept())
        .await
        .unwrap()
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(BOUND, c.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let got = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(got.starts_with("GET / HTTP/1.1"), "{got}");
    assert!(
        !got.contains(KEY),
        "the credential went to another name: {got}"
    );
    c.write_all(b"HTTP/1.0 200 OK\r\n\r\nplain").await.unwrap();
    drop(c);
    let out = req.await.unwrap();
    assert!(out.ends_with("plain"), "{out}");
    assert!(server.heads.lock().unwrap().is_empty());
}
