//! The proxy served on loopback, in process (no cluster): the "sandbox" is this process
//! connecting from 127.0.0.1 (the table says 127.0.0.1 is sandbox ns/s), the "outside" is a
//! loopback listener that loopback is permitted to reach (`permitted`), and names resolve by
//! the proxy's static table. Each refusal the sandbox could try is tried.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use agentbox_proxy::rules::{AddressPolicy, Table};
use agentbox_proxy::server::{self, Settings, Shared};

/// A guard for reads that must end: a failure here means the proxy hung, not that it was slow.
const BOUND: Duration = Duration::from_secs(20);

struct Fixture {
    proxy: SocketAddr,
    upstream: TcpListener,
    upstream_port: u16,
    shared: Arc<Shared>,
}

async fn fixture(tune: impl FnOnce(&mut Settings), allow: serde_json::Value) -> Fixture {
    let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_port = upstream.local_addr().unwrap().port();
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    let mut settings = Settings {
        addresses: AddressPolicy {
            cluster: vec![],
            permitted: vec!["127.0.0.0/8".parse().unwrap()],
        },
        static_hosts: HashMap::from([
            ("a.test".to_string(), vec![lo]),
            ("api.b.test".to_string(), vec![lo]),
            ("b.test".to_string(), vec![lo]),
            ("other.test".to_string(), vec![lo]),
            (
                "private.a.test".to_string(),
                vec!["10.9.9.9".parse().unwrap()],
            ),
            (
                "meta.a.test".to_string(),
                vec!["169.254.169.254".parse().unwrap()],
            ),
        ]),
        head_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(60),
        max_per_sandbox: 16,
        max_connections: 64,
    };
    tune(&mut settings);
    let shared = Shared::new(settings);
    let table: Table = serde_json::from_value(serde_json::json!({"sandboxes": [
        {"ip": "127.0.0.1", "namespace": "ns", "name": "s", "allow": allow}
    ]}))
    .unwrap();
    shared.set_table(&table);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = l.local_addr().unwrap();
    tokio::spawn(server::serve(l, Arc::clone(&shared)));
    Fixture {
        proxy,
        upstream,
        upstream_port,
        shared,
    }
}

fn default_allow() -> serde_json::Value {
    serde_json::json!([
        {"domain": "a.test"},
        {"domain": "*.a.test"},
        {"domain": "*.b.test"}
    ])
}

/// A real TLS ClientHello (rustls's) naming `sni`.
fn client_hello(sni: &str) -> Vec<u8> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(sni.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(cfg), name).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

/// Reads until the peer closes (bounded).
async fn read_all(s: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    tokio::time::timeout(BOUND, s.read_to_end(&mut out))
        .await
        .expect("the proxy closed the connection")
        .unwrap_or(0);
    out
}

/// Reads one response head (up to the blank line).
async fn read_head(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    while !out.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(BOUND, s.read(&mut b))
            .await
            .unwrap()
            .unwrap();
        if n == 0 {
            break;
        }
        out.push(b[0]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn connect_req(f: &Fixture, target: &str) -> (TcpStream, String) {
    let mut c = TcpStream::connect(f.proxy).await.unwrap();
    c.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut c).await;
    (c, head)
}

#[tokio::test]
async fn an_allowed_name_is_tunnelled_with_its_client_hello_to_the_checked_address() {
    let f = fixture(|_| {}, default_allow()).await;
    let (mut c, head) = connect_req(&f, &format!("a.test:{}", f.upstream_port)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let hello = client_hello("a.test");
    c.write_all(&hello).await.unwrap();
    let (mut up, _) = tokio::time::timeout(BOUND, f.upstream.accept())
        .await
        .unwrap()
        .unwrap();
    let mut got = vec![0u8; hello.len()];
    up.read_exact(&mut got).await.unwrap();
    assert_eq!(got, hello, "the upstream gets the ClientHello as sent");
    up.write_all(b"server-bytes").await.unwrap();
    drop(up);
    assert_eq!(read_all(&mut c).await, b"server-bytes");
    assert!(
        f.shared
            .metrics
            .encode()
            .contains("agentbox_proxy_accepted_total 1")
    );
}

#[tokio::test]
async fn a_server_name_other_than_the_connect_target_gets_no_tunnel() {
    let f = fixture(|_| {}, default_allow()).await;
    // other.test resolves like a.test, but the sandbox may not reach it: naming it in the
    // ClientHello while asking CONNECT for a.test is domain fronting.
    for sni in ["other.test", "b.test", "x.a.test"] {
        let (mut c, head) = connect_req(&f, &format!("a.test:{}", f.upstream_port)).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        c.write_all(&client_hello(sni)).await.unwrap();
        assert_eq!(read_all(&mut c).await, b"", "{sni}: closed without a byte");
    }
    // Not TLS at all after CONNECT: no server name to check.
    let (mut c, _) = connect_req(&f, &format!("a.test:{}", f.upstream_port)).await;
    c.write_all(b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_all(&mut c).await, b"");
    let nobody = tokio::time::timeout(Duration::from_millis(300), f.upstream.accept()).await;
    assert!(nobody.is_err(), "the upstream was never connected");
    let m = f.shared.metrics.encode();
    assert!(
        m.contains(r#"agentbox_proxy_refused_total{namespace="ns",sandbox="s",reason="server_name_mismatch"} 4"#),
        "{m}"
    );
}

#[tokio::test]
async fn names_outside_the_allowlist_bare_addresses_and_refused_classes_are_refused() {
    let f = fixture(|_| {}, default_allow()).await;
    let p = f.upstream_port;
    for (target, want) in [
        (format!("other.test:{p}"), "not in the sandbox's allowlist"),
        // The wildcard's parent is not below it.
        (format!("b.test:{p}"), "not in the sandbox's allowlist"),
        (format!("127.0.0.1:{p}"), "a bare address"),
        (format!("[::1]:{p}"), "a bare address"),
        (
            format!("private.a.test:{p}"),
            "resolves to a private address",
        ),
        (format!("meta.a.test:{p}"), "link-local (or metadata)"),
        (format!("unknown.a.test:{p}"), "does not resolve"),
        ("a.test".to_string(), "bad request"),
    ] {
        let (mut c, head) = connect_req(&f, &target).await;
        let body = String::from_utf8_lossy(&read_all(&mut c).await).into_owned();
        assert!(!head.starts_with("HTTP/1.1 200"), "{target}: {head}");
        assert!(body.contains(want), "{target}: {head}{body}");
    }
    // An allowed wildcard name does pass.
    let (_c, head) = connect_req(&f, &format!("api.b.test:{p}")).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[tokio::test]
async fn a_sandboxs_own_block_lets_a_name_lead_to_a_private_address() {
    // No administrator's permit: loopback is refused unless the sandbox's block allows it.
    let no_permit = |s: &mut Settings| s.addresses.permitted.clear();
    let f = fixture(no_permit, default_allow()).await;
    let (mut c, head) = connect_req(&f, &format!("a.test:{}", f.upstream_port)).await;
    let body = String::from_utf8_lossy(&read_all(&mut c).await).into_owned();
    assert!(
        head.contains("403") && body.contains("loopback"),
        "{head}{body}"
    );
    let mut allow = default_allow();
    allow
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"cidr": "127.0.0.1/32"}));
    let f = fixture(no_permit, allow).await;
    let (_c, head) = connect_req(&f, &format!("a.test:{}", f.upstream_port)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[tokio::test]
async fn plain_http_goes_by_host_in_origin_form_one_request_per_connection() {
    let f = fixture(|_| {}, default_allow()).await;
    let p = f.upstream_port;
    let mut c = TcpStream::connect(f.proxy).await.unwrap();
    c.write_all(
        format!("GET http://a.test:{p}/x?y=1 HTTP/1.1\r\nHost: a.test:{p}\r\nProxy-Authorization: secret\r\nConnection: keep-alive\r\nAccept: */*\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let (mut up, _) = tokio::time::timeout(BOUND, f.upstream.accept())
        .await
        .unwrap()
        .unwrap();
    let got = read_head(&mut up).await;
    assert!(got.starts_with("GET /x?y=1 HTTP/1.1\r\n"), "{got}");
    assert!(got.contains(&format!("Host: a.test:{p}\r\n")), "{got}");
    assert!(
        got.contains("Accept: */*\r\n") && got.contains("Connection: close\r\n"),
        "{got}"
    );
    assert!(
        !got.contains("Proxy-Authorization") && !got.contains("keep-alive"),
        "{got}"
    );
    up.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        .await
        .unwrap();
    drop(up);
    assert!(String::from_utf8_lossy(&read_all(&mut c).await).ends_with("ok"));

    for (req, want) in [
        // Host and target disagree.
        (
            format!("GET http://a.test:{p}/ HTTP/1.1\r\nHost: other.test:{p}\r\n\r\n"),
            "Host header differs",
        ),
        (
            format!("GET http://a.test:{p}/ HTTP/1.1\r\n\r\n"),
            "Host header differs",
        ),
        (
            format!("GET http://other.test:{p}/ HTTP/1.1\r\nHost: other.test:{p}\r\n\r\n"),
            "not in the sandbox's allowlist",
        ),
        (
            format!("GET http://127.0.0.1:{p}/ HTTP/1.1\r\nHost: 127.0.0.1:{p}\r\n\r\n"),
            "a bare address",
        ),
        // Origin form: no target to check (the proxy is no transparent one).
        (
            "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n".to_string(),
            "absolute http:// target",
        ),
        (
            "\x16\x03\x01\x02\x00garbage\r\n\r\n".to_string(),
            "not an HTTP request",
        ),
    ] {
        let mut c = TcpStream::connect(f.proxy).await.unwrap();
        c.write_all(req.as_bytes()).await.unwrap();
        let out = String::from_utf8_lossy(&read_all(&mut c).await).into_owned();
        assert!(out.contains(want), "{req:?}: {out}");
    }
}

#[tokio::test]
async fn an_unknown_source_is_refused_and_a_new_table_applies_to_the_next_connection() {
    let f = fixture(|_| {}, default_allow()).await;
    f.shared.set_table(&Table::default());
    let (mut c, head) = connect_req(&f, &format!("a.test:{}", f.upstream_port)).await;
    let body = String::from_utf8_lossy(&read_all(&mut c).await).into_owned();
    assert!(
        head.contains("403") && body.contains("not a sandbox"),
        "{head}{body}"
    );
    let t: Table = serde_json::from_value(serde_json::json!({"sandboxes": [
        {"ip": "127.0.0.1", "namespace": "ns", "name": "s", "allow": [{"domain": "other.test"}]}
    ]}))
    .unwrap();
    f.shared.set_table(&t);
    let (_c, head) = connect_req(&f, &format!("other.test:{}", f.upstream_port)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
}

#[tokio::test]
async fn a_sandbox_is_held_to_its_connection_limit_and_slow_heads_time_out() {
    let f = fixture(
        |s| {
            s.max_per_sandbox = 3;
            s.head_timeout = Duration::from_millis(300);
        },
        default_allow(),
    )
    .await;
    // Three connections that send nothing hold the sandbox's three slots...
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(TcpStream::connect(f.proxy).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // ...so a fourth is refused at once (unless the first ones already timed out: then it
    // gets in and times out too, which the loop below tells apart).
    let mut fourth = TcpStream::connect(f.proxy).await.unwrap();
    let out = String::from_utf8_lossy(&read_all(&mut fourth).await).into_owned();
    assert!(out.contains("429") || out.contains("408"), "{out}");
    // Each silent connection is answered 408 and closed: nothing stays open.
    for mut c in held {
        let out = String::from_utf8_lossy(&read_all(&mut c).await).into_owned();
        assert!(out.contains("408 Request Timeout"), "{out}");
    }
    // The count drops just after the close the client saw.
    let zero = async {
        while !f
            .shared
            .metrics
            .encode()
            .contains("agentbox_proxy_open_connections 0")
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(BOUND, zero)
        .await
        .expect("no connection stays counted");
}

#[tokio::test]
async fn an_idle_tunnel_is_closed() {
    let f = fixture(
        |s| s.idle_timeout = Duration::from_millis(300),
        default_allow(),
    )
    .await;
    let (mut c, head) = connect_req(&f, &format!("a.test:{}", f.upstream_port)).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    c.write_all(&client_hello("a.test")).await.unwrap();
    let (mut up, _) = tokio::time::timeout(BOUND, f.upstream.accept())
        .await
        .unwrap()
        .unwrap();
    // Neither side sends anything more: the proxy closes both.
    let mut sink = Vec::new();
    tokio::time::timeout(BOUND, up.read_to_end(&mut sink))
        .await
        .expect("the proxy closed the upstream side")
        .unwrap();
    read_all(&mut c).await;
}
