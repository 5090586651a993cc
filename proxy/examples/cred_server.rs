//! A TLS server for tests/credential.rs (not shipped): `cred_server CERT.pem KEY.pem PORT
//! HEADS` answers every request with `200 cred-server-ok` and appends each request head it
//! received (`got: ` and the head's lines) to the file HEADS, which the test reads through
//! the pod's exec (not the pod's log: under gVisor on the test cluster a container's output
//! did not reach its log). Built static and copied into a busybox pod (the cluster has no image with
//! a TLS server).
#![forbid(unsafe_code)]

use std::io::Write;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, cert, key, port, heads] = args.as_slice() else {
        return Err("usage: cred_server CERT.pem KEY.pem PORT HEADS".into());
    };
    let heads = Arc::new(std::sync::Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(heads)?,
    ));
    let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let listener = tokio::net::TcpListener::bind(format!("0.0.0.0:{port}")).await?;
    println!("listening on {port}");
    loop {
        let (conn, peer) = listener.accept().await?;
        let acceptor = acceptor.clone();
        let heads = Arc::clone(&heads);
        tokio::spawn(async move {
            let mut tls = match acceptor.accept(conn).await {
                Ok(t) => t,
                Err(e) => {
                    println!("handshake from {peer} failed: {e}");
                    return;
                }
            };
            let mut head = Vec::new();
            let mut buf = [0u8; 4096];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 65536 {
                match tls.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            {
                let text = String::from_utf8_lossy(&head);
                let mut lines = String::new();
                for line in text.lines().filter(|l| !l.is_empty()) {
                    lines.push_str(&format!("got: {line}\n"));
                }
                if let Ok(mut f) = heads.lock() {
                    let _ = f.write_all(lines.as_bytes());
                    let _ = f.flush();
                }
            }
            let body = "cred-server-ok";
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tls.write_all(resp.as_bytes()).await;
            let _ = tls.shutdown().await;
        });
    }
}
