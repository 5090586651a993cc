//! The proxy's listener: each connection is a sandbox's (found by its source address in the
//! table), asking with HTTP CONNECT (then its TLS ClientHello's server name must be the
//! CONNECT target) or a plain HTTP request in absolute form (then its Host must be the
//! request's target). The name must be in the sandbox's allowlist; the proxy resolves it
//! itself and connects to the very address it checked. Connections are bounded per sandbox
//! and in all, their heads must arrive in time, and an idle tunnel is closed.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, timeout};

use crate::credential;
use crate::metrics::Metrics;
use crate::rules::{self, AddressPolicy, Index, Refusal, Sandbox};

/// The largest request head the proxy reads (a proxy request's head is small).
pub const MAX_HEAD: usize = 16 * 1024;
/// The most bytes of a TLS ClientHello the proxy reads before it knows the server name.
pub const MAX_HELLO: usize = 64 * 1024;
/// The copy buffer of each direction of a tunnel: with two per connection, the proxy's
/// memory per open connection is bounded by about twice this.
const COPY_BUF: usize = 16 * 1024;

/// The proxy's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Addresses that names may not lead to, and the administrator's exceptions.
    pub addresses: AddressPolicy,
    /// Names resolved without DNS (the administrator's, such as the test cluster's outside
    /// servers); never set by a sandbox.
    pub static_hosts: HashMap<String, Vec<IpAddr>>,
    /// How long a client has to send its request head, and its ClientHello after CONNECT.
    pub head_timeout: Duration,
    /// How long the proxy waits for the destination to accept.
    pub connect_timeout: Duration,
    /// A tunnel with no byte in either direction for this long is closed.
    pub idle_timeout: Duration,
    /// Open connections one sandbox may hold.
    pub max_per_sandbox: usize,
    /// Open connections the proxy holds in all.
    pub max_connections: usize,
}

/// What every connection shares: the table, the counters and the limits.
pub struct Shared {
    settings: Settings,
    index: RwLock<Arc<Index>>,
    open: Mutex<HashMap<IpAddr, usize>>,
    slots: Arc<Semaphore>,
    /// The TLS client of credentialed names ([`crate::credential`]); the compiled-in roots
    /// until [`Shared::set_upstream_tls`].
    upstream_tls: RwLock<Option<Arc<rustls::ClientConfig>>>,
    /// The metrics the proxy serves.
    pub metrics: Metrics,
}

impl Shared {
    /// Shared state with an empty table (everything refused until the operator writes one).
    pub fn new(settings: Settings) -> Arc<Shared> {
        let slots = Arc::new(Semaphore::new(settings.max_connections));
        Arc::new(Shared {
            settings,
            index: RwLock::new(Arc::new(Index::default())),
            open: Mutex::new(HashMap::new()),
            slots,
            upstream_tls: RwLock::new(None),
            metrics: Metrics::new(),
        })
    }

    /// Sets the TLS client of credentialed names (roots with the administrator's extra CA).
    pub fn set_upstream_tls(&self, cfg: Arc<rustls::ClientConfig>) {
        if let Ok(mut g) = self.upstream_tls.write() {
            *g = Some(cfg);
        }
    }

    fn upstream_tls(&self) -> Result<Arc<rustls::ClientConfig>, Refusal> {
        if let Some(c) = self.upstream_tls.read().ok().and_then(|g| g.clone()) {
            return Ok(c);
        }
        let c = credential::client_config(&[]).map_err(|_| Refusal::UpstreamUnverified)?;
        self.set_upstream_tls(Arc::clone(&c));
        Ok(c)
    }

    /// Replaces the table: new connections are checked against it at once (open tunnels keep
    /// going; an allowlist edit applies to the next connection).
    pub fn set_table(&self, table: &rules::Table) {
        let index = Arc::new(Index::new(table));
        self.metrics.sandboxes.set(index.len() as i64);
        if let Ok(mut g) = self.index.write() {
            *g = index;
        }
    }

    fn index(&self) -> Arc<Index> {
        self.index
            .read()
            .map(|g| Arc::clone(&g))
            .unwrap_or_default()
    }

    /// One more connection of `ip`, if under its limit; released when the guard drops.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<OpenGuard> {
        let mut open = self.open.lock().ok()?;
        let n = open.entry(ip).or_insert(0);
        if *n >= self.settings.max_per_sandbox {
            return None;
        }
        *n += 1;
        self.metrics.open.inc();
        Some(OpenGuard {
            shared: Arc::clone(self),
            ip,
        })
    }
}

/// Counts one open connection of a source until dropped.
struct OpenGuard {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.shared.metrics.open.dec();
        if let Ok(mut open) = self.shared.open.lock()
            && let Some(n) = open.get_mut(&self.ip)
        {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Accepts connections for ever (an accept that fails, out of file descriptors say, is
/// logged and retried after a pause: the proxy does not stop for it).
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    loop {
        let (conn, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        // The whole proxy's bound first: a permit or the connection is closed at once.
        let Ok(permit) = Arc::clone(&shared.slots).try_acquire_owned() else {
            refuse_log(&shared, None, peer.ip(), "-", &Refusal::ProxyLimit);
            drop(conn);
            continue;
        };
        tokio::spawn(async move {
            handle(conn, peer, shared, permit).await;
        });
    }
}

fn refuse_log(
    shared: &Shared,
    sandbox: Option<&Sandbox>,
    source: IpAddr,
    destination: &str,
    why: &Refusal,
) {
    let (ns, name) = sandbox.map_or(("", ""), |s| (s.namespace.as_str(), s.name.as_str()));
    shared.metrics.refused(ns, name, why.reason());
    tracing::warn!(
        namespace = %ns,
        sandbox = %name,
        source = %source,
        destination = %destination,
        reason = %why.reason(),
        "refused: {why}"
    );
}

async fn handle(
    mut conn: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    _permit: OwnedSemaphorePermit,
) {
    let _ = conn.set_nodelay(true);
    let source = rules::canonical(peer.ip());
    let index = shared.index();
    let Some(sandbox) = index.sandbox(source).cloned() else {
        refuse_log(&shared, None, source, "-", &Refusal::UnknownSource);
        let _ = respond(&mut conn, 403, &Refusal::UnknownSource).await;
        return;
    };
    let Some(_open) = shared.admit(source) else {
        refuse_log(&shared, Some(&sandbox), source, "-", &Refusal::SandboxLimit);
        let _ = respond(&mut conn, 429, &Refusal::SandboxLimit).await;
        return;
    };
    let mut dest = String::from("-");
    match proxy(&mut conn, &sandbox, &shared, &mut dest).await {
        Ok(Some(Upstream::Tls(upstream))) => {
            shared.metrics.accepted.inc();
            tracing::debug!(namespace = %sandbox.namespace, sandbox = %sandbox.name, destination = %dest, "credentialed request");
            pipe(conn, *upstream, shared.settings.idle_timeout).await;
        }
        Ok(Some(Upstream::Tcp(upstream))) => {
            shared.metrics.accepted.inc();
            tracing::debug!(namespace = %sandbox.namespace, sandbox = %sandbox.name, destination = %dest, "tunnel");
            pipe(conn, upstream, shared.settings.idle_timeout).await;
        }
        Ok(None) => {}
        Err((why, answer)) => {
            refuse_log(&shared, Some(&sandbox), source, &dest, &why);
            if answer {
                let code = match why {
                    Refusal::BadRequest(_) => 400,
                    Refusal::Timeout => 408,
                    Refusal::Upstream | Refusal::Unresolved | Refusal::UpstreamUnverified => 502,
                    _ => 403,
                };
                let _ = respond(&mut conn, code, &why).await;
            }
        }
    }
}

async fn respond(conn: &mut TcpStream, code: u16, why: &Refusal) -> std::io::Result<()> {
    let text = match code {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        429 => "Too Many Requests",
        _ => "Bad Gateway",
    };
    let body = format!("agentbox egress proxy: {why}\n");
    let msg = format!(
        "HTTP/1.1 {code} {text}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(msg.as_bytes()).await?;
    conn.shutdown().await
}

/// A refusal and whether the client may still be answered with an HTTP status (not after a
/// CONNECT's 200).
type Refused = (Refusal, bool);

/// The connection to the destination: a TCP stream the sandbox's bytes go through as they
/// are, or TLS the proxy opened for a credentialed name.
enum Upstream {
    Tcp(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

/// Reads and checks the request; returns the connected upstream with everything the client
/// sent so far already written to it, or `None` when nothing more is to be done.
async fn proxy(
    conn: &mut TcpStream,
    sandbox: &Sandbox,
    shared: &Shared,
    dest: &mut String,
) -> Result<Option<Upstream>, Refused> {
    let s = &shared.settings;
    let mut buf = Vec::with_capacity(2048);
    let deadline = Instant::now() + s.head_timeout;
    let head = loop {
        let mut tmp = [0u8; 2048];
        let n = match tokio::time::timeout_at(deadline, conn.read(&mut tmp)).await {
            Err(_) => return Err((Refusal::Timeout, true)),
            Ok(Err(_)) | Ok(Ok(0)) => return Ok(None),
            Ok(Ok(n)) => n,
        };
        buf.extend_from_slice(&tmp[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => break Head::from(&req, len)?,
            Ok(httparse::Status::Partial) if buf.len() < MAX_HEAD => continue,
            Ok(httparse::Status::Partial) => {
                return Err((Refusal::BadRequest("the request head is too large"), true));
            }
            Err(_) => return Err((Refusal::BadRequest("not an HTTP request"), true)),
        }
    };
    let rest = buf.split_off(head.len);
    if head.method == "CONNECT" {
        let (host, port) = rules::split_authority(&head.target, None).map_err(|e| (e, true))?;
        *dest = format!("{host}:{port}");
        let host = rules::host_name(&host).map_err(|e| (e, true))?;
        if sandbox.credential_for(&host).is_some() {
            return Err((Refusal::CredentialTunnel, true));
        }
        sandbox.allows_name(&host, port).map_err(|e| (e, true))?;
        let addr = resolve_checked(sandbox, &host, port, s)
            .await
            .map_err(|e| (e, true))?;
        conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await
            .map_err(|_| (Refusal::Upstream, false))?;
        // The tunnel's first bytes must be a TLS ClientHello naming the same host.
        let (sni, hello) = read_client_hello(conn, rest, deadline_from_now(s.head_timeout)).await?;
        match sni {
            Some(name) if rules::host_name(&name).ok().as_deref() == Some(host.as_str()) => {}
            _ => return Err((Refusal::ServerNameMismatch, false)),
        }
        let mut up = connect(addr, port, s.connect_timeout)
            .await
            .map_err(|e| (e, false))?;
        up.write_all(&hello)
            .await
            .map_err(|_| (Refusal::Upstream, false))?;
        Ok(Some(Upstream::Tcp(up)))
    } else {
        // Plain HTTP in absolute form: http://host[:port]/path.
        let Some(after) = head.target.strip_prefix("http://") else {
            return Err((
                Refusal::BadRequest(
                    "a plain request needs an absolute http:// target (https goes through CONNECT)",
                ),
                true,
            ));
        };
        let (auth, path) = match after.find('/') {
            Some(i) => (&after[..i], &after[i..]),
            None => (after, "/"),
        };
        if auth.contains('@') {
            return Err((Refusal::BadRequest("credentials in the target"), true));
        }
        let (host, port) = rules::split_authority(auth, Some(80)).map_err(|e| (e, true))?;
        *dest = format!("{host}:{port}");
        let host = rules::host_name(&host).map_err(|e| (e, true))?;
        let Some(h) = head.host.as_deref() else {
            return Err((Refusal::HostMismatch, true));
        };
        let (hh, hp) =
            rules::split_authority(h, Some(80)).map_err(|_| (Refusal::HostMismatch, true))?;
        if rules::host_name(&hh).ok().as_deref() != Some(host.as_str()) || hp != port {
            return Err((Refusal::HostMismatch, true));
        }
        if let Some((_, cred)) = sandbox.credential_for(&host) {
            let cred = cred.clone();
            return credentialed(
                sandbox, shared, &head, &host, port, path, &cred, &rest, dest,
            )
            .await
            .map(|t| Some(Upstream::Tls(Box::new(t))))
            .map_err(|e| (e, true));
        }
        sandbox.allows_name(&host, port).map_err(|e| (e, true))?;
        let addr = resolve_checked(sandbox, &host, port, s)
            .await
            .map_err(|e| (e, true))?;
        let mut up = connect(addr, port, s.connect_timeout)
            .await
            .map_err(|e| (e, true))?;
        // The request in origin form, without the proxy's own headers, one request per
        // connection: the next one on this connection could name another host.
        let mut out = format!("{} {} HTTP/1.{}\r\n", head.method, path, head.version);
        for (name, value) in &head.headers {
            let lower = name.to_ascii_lowercase();
            if lower.starts_with("proxy-") || lower == "connection" || lower == "keep-alive" {
                continue;
            }
            out.push_str(name);
            out.push_str(": ");
            out.push_str(value);
            out.push_str("\r\n");
        }
        out.push_str("Connection: close\r\n\r\n");
        up.write_all(out.as_bytes())
            .await
            .map_err(|_| (Refusal::Upstream, true))?;
        up.write_all(&rest)
            .await
            .map_err(|_| (Refusal::Upstream, true))?;
        Ok(Some(Upstream::Tcp(up)))
    }
}

/// A plain HTTP request for a credentialed name: TLS to the server (verified for `host`),
/// the request with the credential's header, and whatever body bytes came with the head.
#[allow(clippy::too_many_arguments)]
async fn credentialed(
    sandbox: &Sandbox,
    shared: &Shared,
    head: &Head,
    host: &str,
    port: u16,
    path: &str,
    cred: &credential::Credential,
    rest: &[u8],
    dest: &mut String,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, Refusal> {
    let s = &shared.settings;
    if !cred.usable() {
        return Err(Refusal::CredentialUnusable);
    }
    let tls_port = credential::upstream_port(port);
    *dest = format!("{host}:{tls_port} (tls, credential)");
    sandbox.allows_name(host, tls_port)?;
    let addr = resolve_checked(sandbox, host, tls_port, s).await?;
    let tcp = connect(addr, tls_port, s.connect_timeout).await?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|_| Refusal::BadRequest("the name is no TLS server name"))?;
    let connector = tokio_rustls::TlsConnector::from(shared.upstream_tls()?);
    let mut tls = match timeout(s.connect_timeout, connector.connect(name, tcp)).await {
        Ok(Ok(t)) => t,
        _ => return Err(Refusal::UpstreamUnverified),
    };
    let out = credential::request_head(&head.method, path, head.version, &head.headers, cred);
    tls.write_all(out.as_bytes())
        .await
        .map_err(|_| Refusal::Upstream)?;
    tls.write_all(rest).await.map_err(|_| Refusal::Upstream)?;
    tls.flush().await.map_err(|_| Refusal::Upstream)?;
    Ok(tls)
}

fn deadline_from_now(d: Duration) -> Instant {
    Instant::now() + d
}

/// A parsed request head.
struct Head {
    method: String,
    target: String,
    version: u8,
    host: Option<String>,
    headers: Vec<(String, String)>,
    len: usize,
}

impl Head {
    fn from(req: &httparse::Request<'_, '_>, len: usize) -> Result<Head, Refused> {
        let bad = |w| (Refusal::BadRequest(w), true);
        let method = req.method.ok_or_else(|| bad("no method"))?.to_string();
        let target = req.path.ok_or_else(|| bad("no target"))?.to_string();
        let mut headers = Vec::with_capacity(req.headers.len());
        let mut host = None;
        for h in req.headers.iter() {
            let value = std::str::from_utf8(h.value)
                .map_err(|_| bad("a header is not text"))?
                .to_string();
            if h.name.eq_ignore_ascii_case("host") {
                if host.is_some() {
                    return Err(bad("two Host headers"));
                }
                host = Some(value.clone());
            }
            headers.push((h.name.to_string(), value));
        }
        Ok(Head {
            method,
            target,
            version: req.version.unwrap_or(1),
            host,
            headers,
            len,
        })
    }
}

/// Reads the tunnel's first TLS record(s) until rustls's server-side parser has the whole
/// ClientHello; returns its server name and every byte read (to send on).
async fn read_client_hello(
    conn: &mut TcpStream,
    mut already: Vec<u8>,
    deadline: Instant,
) -> Result<(Option<String>, Vec<u8>), Refused> {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut fed = 0;
    loop {
        while fed < already.len() {
            let mut slice = &already[fed..];
            match acceptor.read_tls(&mut slice) {
                Ok(0) => break,
                Ok(n) => fed += n,
                Err(_) => return Err((Refusal::ServerNameMismatch, false)),
            }
        }
        match acceptor.accept() {
            Ok(Some(accepted)) => {
                let name = accepted.client_hello().server_name().map(str::to_string);
                return Ok((name, already));
            }
            Ok(None) => {}
            // Not TLS (or not a ClientHello): no server name to check, so no tunnel.
            Err(_) => return Err((Refusal::ServerNameMismatch, false)),
        }
        if already.len() >= MAX_HELLO {
            return Err((Refusal::ServerNameMismatch, false));
        }
        let mut tmp = [0u8; 4096];
        let n = match tokio::time::timeout_at(deadline, conn.read(&mut tmp)).await {
            Err(_) => return Err((Refusal::Timeout, false)),
            Ok(Err(_)) | Ok(Ok(0)) => return Err((Refusal::ServerNameMismatch, false)),
            Ok(Ok(n)) => n,
        };
        already.extend_from_slice(&tmp[..n]);
    }
}

/// Resolves `host` (the administrator's static names first, then the system resolver) and
/// picks the first address the sandbox may reach: the one the proxy then connects to.
async fn resolve_checked(
    sandbox: &Sandbox,
    host: &str,
    port: u16,
    s: &Settings,
) -> Result<IpAddr, Refusal> {
    let addrs: Vec<IpAddr> = match s.static_hosts.get(host) {
        Some(a) => a.clone(),
        None => match timeout(s.connect_timeout, tokio::net::lookup_host((host, port))).await {
            Ok(Ok(it)) => it.map(|a| a.ip()).collect(),
            _ => return Err(Refusal::Unresolved),
        },
    };
    sandbox.pick_address(&addrs, port, &s.addresses)
}

async fn connect(ip: IpAddr, port: u16, within: Duration) -> Result<TcpStream, Refusal> {
    match timeout(within, TcpStream::connect((ip, port))).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
        _ => Err(Refusal::Upstream),
    }
}

/// Copies both ways until both sides are done or nothing moved for `idle`.
pub async fn pipe<A, B>(a: A, b: B, idle: Duration)
where
    A: AsyncRead + AsyncWrite,
    B: AsyncRead + AsyncWrite,
{
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let (mut ar, mut aw) = tokio::io::split(a);
    let (mut br, mut bw) = tokio::io::split(b);
    let both = async {
        tokio::join!(
            copy_half(&mut ar, &mut bw, &last, start),
            copy_half(&mut br, &mut aw, &last, start)
        )
    };
    let watchdog = async {
        let tick = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        loop {
            tokio::time::sleep(tick).await;
            let since =
                (start.elapsed().as_millis() as u64).saturating_sub(last.load(Ordering::Relaxed));
            if since >= idle.as_millis() as u64 {
                break;
            }
        }
    };
    tokio::select! {
        _ = both => {}
        _ = watchdog => {}
    }
}

async fn copy_half<R, W>(r: &mut R, w: &mut W, last: &AtomicU64, start: Instant)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; COPY_BUF];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
        if w.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = w.shutdown().await;
}
