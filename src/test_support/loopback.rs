//! The fake API server served over loopback HTTP, for scenarios whose reconcile execs into a
//! pod: kube opens exec as an upgraded connection, which needs a real HTTP connection (a
//! `tower` service in-process cannot hand one over). Every other request goes to the same
//! [`FakeApi`] as in-process. An exec runs its argv **on the host** (the pod's scripts are
//! plain `sh`, see `agentbox_api::remote`), speaking the remote-command protocol v5 back: stdout on
//! channel 1, stderr on 2, the exit status as a `Status` on 3, stdin from channel 0 until the
//! client half-closes it (`[255, 0]`).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::Role;

use super::FakeApi;

/// Serves `fake` on a loopback port; returns a client for it (namespace [`super::NS`]). The
/// server runs until the test's runtime ends.
pub(super) async fn serve(fake: Arc<FakeApi>) -> kube::Client {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let fake = fake.clone();
            let svc = hyper::service::service_fn(move |req| answer(fake.clone(), req));
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .with_upgrades()
                    .await;
            });
        }
    });
    let url = format!("http://{addr}").parse().expect("a URL");
    let mut config = kube::Config::new(url);
    config.default_namespace = super::NS.into();
    kube::Client::try_from(config).expect("a client")
}

async fn answer(
    fake: Arc<FakeApi>,
    mut req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    if path.ends_with("/exec") {
        fake.record(&method, &path);
        return Ok(upgrade_to_exec(&mut req));
    }
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let (code, value) = fake.answer(&method, &path, &body);
    let resp = Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            serde_json::to_vec(&value).unwrap_or_default(),
        )))
        .expect("a response");
    Ok(resp)
}

/// Accepts the WebSocket upgrade of an exec request and runs the command once upgraded.
fn upgrade_to_exec(req: &mut Request<Incoming>) -> Response<Full<Bytes>> {
    let argv: Vec<String> = form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.into_owned())
        .collect();
    let key = req
        .headers()
        .get(http::header::SEC_WEBSOCKET_KEY)
        .map(|k| k.as_bytes().to_vec())
        .unwrap_or_default();
    let on_upgrade = hyper::upgrade::on(req);
    tokio::spawn(async move {
        if let Ok(upgraded) = on_upgrade.await {
            let ws =
                WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
            run(ws, argv).await;
        }
    });
    Response::builder()
        .status(101)
        .header(http::header::CONNECTION, "Upgrade")
        .header(http::header::UPGRADE, "websocket")
        .header(http::header::SEC_WEBSOCKET_PROTOCOL, "v5.channel.k8s.io")
        .header(
            http::header::SEC_WEBSOCKET_ACCEPT,
            tokio_tungstenite::tungstenite::handshake::derive_accept_key(&key),
        )
        .body(Full::new(Bytes::new()))
        .expect("a response")
}

/// Runs `argv` on the host with the connection's channels as its stdio.
async fn run<S>(ws: WebSocketStream<S>, argv: Vec<String>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut tx, mut rx) = ws.split();
    let Some((prog, args)) = argv.split_first() else {
        return;
    };
    let mut child = match tokio::process::Command::new(prog)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(_) => return,
    };
    let mut stdin = child.stdin.take();
    tokio::spawn(async move {
        while let Some(Ok(Message::Binary(b))) = rx.next().await {
            match b.first() {
                Some(0) => {
                    let failed = match stdin.as_mut() {
                        Some(i) => i.write_all(&b[1..]).await.is_err(),
                        None => false,
                    };
                    if failed {
                        stdin = None;
                    }
                }
                // v5: the client half-closes channel 0 (stdin EOF).
                Some(255) if b.get(1) == Some(&0) => stdin = None,
                _ => {}
            }
        }
    });
    let (out_tx, mut out_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    let mut pumps = Vec::new();
    for (channel, pipe) in [
        (
            1u8,
            child.stdout.take().map(|p| Box::new(p) as Box<dyn Read>),
        ),
        (
            2u8,
            child.stderr.take().map(|p| Box::new(p) as Box<dyn Read>),
        ),
    ] {
        let out_tx = out_tx.clone();
        pumps.push(tokio::spawn(async move {
            let Some(mut pipe) = pipe else { return };
            let mut buf = vec![0u8; 64 * 1024];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut frame = vec![channel];
                frame.extend_from_slice(&buf[..n]);
                if out_tx.send(frame).await.is_err() {
                    break;
                }
            }
        }));
    }
    drop(out_tx);
    while let Some(frame) = out_rx.recv().await {
        if tx.send(Message::binary(frame)).await.is_err() {
            return;
        }
    }
    let code = child.wait().await.ok().and_then(|s| s.code()).unwrap_or(-1);
    let status = if code == 0 {
        json!({"metadata": {}, "status": "Success"})
    } else {
        json!({"metadata": {}, "status": "Failure", "reason": "NonZeroExitCode",
            "message": format!("command terminated with non-zero exit code: {code}"),
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}})
    };
    let mut frame = vec![3u8];
    frame.extend(serde_json::to_vec(&status).unwrap_or_default());
    let _ = tx.send(Message::binary(frame)).await;
    let _ = tx.close().await;
}

/// A child's output pipe.
trait Read: tokio::io::AsyncRead + Unpin + Send {}
impl<T: tokio::io::AsyncRead + Unpin + Send> Read for T {}
