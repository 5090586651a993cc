//! The harness-facing library: get or create the Sandbox of a scope, wait until it is Ready,
//! run commands in it, move files in and out, and take the scope's execution guard.
//!
//! ```no_run
//! use std::time::Duration;
//! use agentbox_client::client::Sandboxes;
//! use agentbox_api::crd::{Scope, ScopeKind, SandboxSpec};
//! use agentbox_api::exec::ExecRequest;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = agentbox_api::kube_client().await?;
//! let sandboxes = Sandboxes::new(client, "agents");
//! let scope = Scope {
//!     kind: ScopeKind::User,
//!     agent: Some("coder".into()),
//!     user: Some("alice@example.com".into()),
//!     session: None,
//! };
//! let template: SandboxSpec = serde_json::from_value(serde_json::json!({
//!     "image": "docker.io/library/busybox:1.37",
//!     "scope": {"kind": "User", "agent": "coder", "user": "alice@example.com"},
//! }))?;
//! // Two harnesses racing here get the same Sandbox (its name derives from the scope).
//! let mut sbx = sandboxes.get_or_create(&scope, template).await?;
//! sbx.wait_ready(Duration::from_secs(120)).await?;
//!
//! // One-shot exec: real exit code, timeout that kills, capped output. Runs in the workspace.
//! let out = sbx.exec(ExecRequest::shell("ls -la; exit 3").timeout(Duration::from_secs(30))).await?;
//! assert_eq!(out.status.code(), Some(3));
//!
//! // Files, confined to the workspace.
//! sbx.write_file("notes/todo.txt", "ship it\n").await?;
//! let text = sbx.read_file("notes/todo.txt").await?;
//!
//! // A persistent shell for fast tool loops (a few ms per command).
//! let session = sbx.session();
//! let out = session.run(ExecRequest::argv(["cat", "notes/todo.txt"])).await?;
//!
//! // Exclusive work in the scope: everything inside runs under the Lease.
//! let guard = sbx.guard(Some(Duration::from_secs(60))).await?;
//! guard.run(async { /* ... */ }).await?;
//! guard.release().await?;
//! # Ok(())
//! # }
//! ```

pub(crate) mod files;
mod kind;
mod snapshots;
mod watch;

pub use files::{DirEntry, EntryKind, PathError, Workspace, confine};

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};

use agentbox_api::crd::{
    GuardHold, LifecycleMode, PortEndpoint, Sandbox, SandboxPhase, SandboxPool, SandboxSpec,
    SandboxTemplate, Scope,
};
use agentbox_api::exec::{
    self, ExecError, ExecOutput, ExecRequest, ExecStream, ExitStatus, session::Session,
};
use agentbox_api::guard::{self, Guard, GuardConfig, GuardError};
use agentbox_api::labels;

/// Client errors.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API server refused or could not be reached. A refusal displays as the server's
    /// own words on one line ([`refusal`]), not kube's dump of the Status object.
    #[error("{}", kube_error(.0))]
    Kube(#[from] kube::Error),
    /// Exec failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The guard could not be taken or was lost.
    #[error(transparent)]
    Guard(#[from] GuardError),
    /// The sandbox cannot become Ready (phase Failed), with its condition's reason.
    #[error("sandbox {name} failed: {reason}: {message}")]
    Failed {
        /// Sandbox name.
        name: String,
        /// Reason of the failing condition.
        reason: String,
        /// Its message.
        message: String,
    },
    /// The sandbox did not become Ready in time, with what its conditions said last.
    #[error(
        "sandbox {name} not Ready after {waited:?} (phase {phase}){}",
        last_words(reason, message)
    )]
    NotReady {
        /// Sandbox name.
        name: String,
        /// How long we waited.
        waited: Duration,
        /// Phase last seen.
        phase: String,
        /// Reason of the condition that says why it is not Ready (as [`ClientError::Failed`]
        /// picks it); empty when none did.
        reason: String,
        /// Its message.
        message: String,
    },
    /// A deleted sandbox was still there after the wait (its finalizer's work, the on-stop
    /// snapshot among it, not done yet).
    #[error("sandbox {name} still being deleted after {waited:?}")]
    NotDeleted {
        /// Sandbox name.
        name: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The sandbox (or a file) does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// A path outside the workspace.
    #[error(transparent)]
    Path(#[from] PathError),
    /// A file larger than the read cap.
    #[error("{0} is larger than {1} bytes")]
    TooLarge(String, usize),
    /// A remote file operation failed.
    #[error("remote command failed ({status}): {stderr}")]
    Remote {
        /// How it ended.
        status: ExitStatus,
        /// What it said.
        stderr: String,
    },
    /// A directory upload's archive could not be written to its spool in the pod (most often
    /// the workspace's disk is full), with what the pod said: nothing was extracted and no
    /// spool is left ([`agentbox_api::remote::UPLOAD`]).
    #[error("the upload could not be spooled in the pod (is the workspace's disk full?): {0}")]
    UploadSpool(String),
    /// A directory upload would pass the workspace's size limit (`workspace.sizeLimit`), with
    /// what the pod said (the sizes and the limit): refused before anything was extracted, and
    /// no spool is left ([`agentbox_api::remote::UPLOAD`]).
    #[error("the upload would pass the workspace's size limit: {0}")]
    UploadTooLarge(String),
    /// Unexpected output from the pod.
    #[error("protocol: {0}")]
    Protocol(String),
    /// A local I/O or archive error.
    #[error("local: {0}")]
    Local(String),
    /// The Sandbox is suspended (`spec.lifecycle.mode: Suspended`): it has no pod and will
    /// not become Ready until it is resumed.
    #[error("sandbox {0} is suspended: resume it first")]
    Suspended(String),
    /// An existing Sandbox has this scope's name but another scope.
    #[error("sandbox {0} exists with a different scope")]
    ScopeMismatch(String),
}

impl ClientError {
    /// `Failed` for an object that cannot become Ready, with the reason and message of the
    /// condition that says why ([`why_not_ready`]).
    fn failed(
        name: &str,
        conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    ) -> Self {
        let (reason, message) = why_not_ready(conds);
        ClientError::Failed {
            name: name.to_string(),
            reason: if reason.is_empty() {
                "Failed".into()
            } else {
                reason
            },
            message,
        }
    }

    /// `NotReady` after waiting `waited` for `name`, last seen in `phase` with `conds`.
    pub(crate) fn not_ready(
        name: &str,
        waited: Duration,
        phase: String,
        conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    ) -> Self {
        let (reason, message) = why_not_ready(conds);
        ClientError::NotReady {
            name: name.to_string(),
            waited,
            phase,
            reason,
            message,
        }
    }
}

/// Why an object is not Ready, from its conditions: a `Stalled` one that is True (the start
/// cannot go on), else the `Ready` condition when it is not True, else any False one. Empty
/// when none says.
pub fn why_not_ready(
    conds: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
) -> (String, String) {
    conds
        .iter()
        .find(|c| c.type_ == agentbox_api::crd::STALLED && c.status == "True")
        .or_else(|| {
            conds
                .iter()
                .find(|c| c.type_ == "Ready" && c.status != "True")
        })
        .or_else(|| conds.iter().find(|c| c.status == "False"))
        .map(|c| (c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

/// How a [`ClientError::Kube`] reads: a refusal as [`refusal`], anything else as kube says it.
fn kube_error(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => refusal(s),
        other => other.to_string(),
    }
}

/// `: reason: message` for a [`ClientError::NotReady`], or nothing when no condition said.
fn last_words(reason: &str, message: &str) -> String {
    match (reason.is_empty(), message.is_empty()) {
        (true, true) => String::new(),
        (false, true) => format!(": {reason}"),
        (true, false) => format!(": {message}"),
        (false, false) => format!(": {reason}: {message}"),
    }
}

/// A refusal of the API server as one line: its message (which names the object and, for a
/// refused field, the field), the causes it does not already say (with their field), and its
/// code and reason.
pub fn refusal(s: &kube::core::Status) -> String {
    // The message may span lines (a list of field errors): one line, each part kept.
    let one_line = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = one_line(&s.message);
    let causes = s.details.as_ref().map_or(&[][..], |d| &d.causes[..]);
    for c in causes {
        let said = one_line(&c.message);
        if said.is_empty() || out.contains(&said) {
            continue;
        }
        let f = c.field.as_str();
        let part = if f.is_empty() || said.contains(f) {
            said
        } else {
            format!("{f}: {said}")
        };
        out.push_str(if out.is_empty() { "" } else { "; " });
        out.push_str(&part);
    }
    if out.is_empty() {
        out = "the API server refused the request".into();
    }
    let label = match (s.code, s.reason.as_str()) {
        (0, "") => String::new(),
        (0, r) => format!(" ({r})"),
        (c, "") => format!(" ({c})"),
        (c, r) => format!(" ({c} {r})"),
    };
    format!("{out}{label}")
}

/// Sandboxes of one namespace.
#[derive(Clone)]
pub struct Sandboxes {
    client: kube::Client,
    namespace: String,
    api: Api<Sandbox>,
}

impl Sandboxes {
    /// Sandboxes in `namespace`.
    pub fn new(client: kube::Client, namespace: impl Into<String>) -> Self {
        let namespace = namespace.into();
        Sandboxes {
            api: Api::namespaced(client.clone(), &namespace),
            client,
            namespace,
        }
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The Sandbox of `scope`: created from `template` (its scope is replaced by `scope`)
    /// under the scope's deterministic name, or the existing one if someone created it first —
    /// resumed when it is suspended (an idle sandbox the operator or someone suspended comes
    /// back; [`SandboxHandle::wait_ready`] then waits for its new pod).
    pub async fn get_or_create(
        &self,
        scope: &Scope,
        mut template: SandboxSpec,
    ) -> Result<SandboxHandle, ClientError> {
        let name = labels::sandbox_name_for_scope(scope);
        template.scope = scope.clone();
        if let Some(r) = &template.template_ref {
            // Fail now, not after a wait for Ready: a sandbox would wait for its template.
            let api: Api<SandboxTemplate> = Api::namespaced(self.client.clone(), &self.namespace);
            if api.get_opt(&r.name).await?.is_none() {
                return Err(ClientError::NotFound(format!(
                    "sandboxtemplate {}/{}",
                    self.namespace, r.name
                )));
            }
        }
        let obj = Sandbox {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels::scope_labels(scope)),
                annotations: Some(labels::scope_annotations(scope)).filter(|a| !a.is_empty()),
                ..Default::default()
            },
            spec: template,
            status: None,
        };
        let sandbox = match self.api.create(&PostParams::default(), &obj).await {
            Ok(s) => s,
            Err(kube::Error::Api(s)) if s.code == 409 => self.api.get(&name).await?,
            Err(e) => return Err(e.into()),
        };
        // The name is a hash of the scope; a mismatch means someone made it by hand.
        if sandbox.spec.scope != *scope {
            return Err(ClientError::ScopeMismatch(name));
        }
        let mut handle = self.handle(sandbox);
        if handle.sandbox.spec.lifecycle.mode == LifecycleMode::Suspended {
            handle.resume().await?;
        }
        Ok(handle)
    }

    /// The Sandbox of `scope` made from the SandboxTemplate `template` (see
    /// [`Sandboxes::get_or_create`]; [`SandboxSpec::from_template`] makes a spec to add
    /// files or env to). A template that does not exist is [`ClientError::NotFound`] at once,
    /// rather than a sandbox that waits for it.
    pub async fn get_or_create_from_template(
        &self,
        scope: &Scope,
        template: &str,
    ) -> Result<SandboxHandle, ClientError> {
        self.get_or_create(scope, SandboxSpec::from_template(template, scope.clone()))
            .await
    }

    /// Lists the namespace's SandboxTemplates.
    pub async fn templates(&self) -> Result<Vec<SandboxTemplate>, ClientError> {
        let api: Api<SandboxTemplate> = Api::namespaced(self.client.clone(), &self.namespace);
        Ok(api.list(&ListParams::default()).await?.items)
    }

    /// Lists the namespace's SandboxPools.
    pub async fn pools(&self) -> Result<Vec<SandboxPool>, ClientError> {
        let api: Api<SandboxPool> = Api::namespaced(self.client.clone(), &self.namespace);
        Ok(api.list(&ListParams::default()).await?.items)
    }

    /// Opens an existing Sandbox by name.
    pub async fn open(&self, name: &str) -> Result<SandboxHandle, ClientError> {
        match self.api.get_opt(name).await? {
            Some(s) => Ok(self.handle(s)),
            None => Err(ClientError::NotFound(format!(
                "sandbox {}/{name}",
                self.namespace
            ))),
        }
    }

    /// Opens the Sandbox of a scope (without creating it).
    pub async fn open_scope(&self, scope: &Scope) -> Result<SandboxHandle, ClientError> {
        self.open(&labels::sandbox_name_for_scope(scope)).await
    }

    /// Lists Sandboxes, optionally by a label selector (see [`labels::scope_selector`]).
    pub async fn list(&self, selector: Option<&str>) -> Result<Vec<Sandbox>, ClientError> {
        let mut lp = ListParams::default();
        if let Some(s) = selector {
            lp = lp.labels(s);
        }
        Ok(self.api.list(&lp).await?.items)
    }

    /// Takes the execution guard of `scope` (whether or not its Sandbox exists yet), waiting
    /// up to `wait` (`None` = indefinitely). To hold it over a Ready sandbox (which an idle
    /// timeout then cannot suspend), use [`SandboxHandle::ready_guard`].
    pub async fn guard(&self, scope: &Scope, wait: Option<Duration>) -> Result<Guard, ClientError> {
        Ok(guard::acquire_scope(
            self.client.clone(),
            &self.namespace,
            scope,
            &GuardConfig::default(),
            wait,
        )
        .await?)
    }

    fn handle(&self, sandbox: Sandbox) -> SandboxHandle {
        SandboxHandle {
            name: sandbox.metadata.name.clone().unwrap_or_default(),
            client: self.client.clone(),
            namespace: self.namespace.clone(),
            api: self.api.clone(),
            pods: Api::namespaced(self.client.clone(), &self.namespace),
            sandbox,
        }
    }
}

/// Whether the Sandbox's status describes its current spec (`observedGeneration` caught up
/// with `generation`; a status or object without them counts as current).
fn is_current(s: &Sandbox) -> bool {
    match (
        s.status.as_ref().and_then(|st| st.observed_generation),
        s.metadata.generation,
    ) {
        (Some(observed), Some(generation)) => observed >= generation,
        _ => true,
    }
}

/// One Sandbox: exec, files, sessions and its scope's guard.
#[derive(Clone)]
pub struct SandboxHandle {
    name: String,
    client: kube::Client,
    namespace: String,
    api: Api<Sandbox>,
    pods: Api<Pod>,
    sandbox: Sandbox,
}

impl SandboxHandle {
    /// The Sandbox's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Sandbox as last fetched.
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// Fetches the Sandbox again.
    pub async fn refresh(&mut self) -> Result<&Sandbox, ClientError> {
        self.sandbox = self.api.get(&self.name).await?;
        Ok(&self.sandbox)
    }

    /// The phase as last fetched.
    pub fn phase(&self) -> Option<SandboxPhase> {
        self.sandbox.status.as_ref().and_then(|s| s.phase)
    }

    /// Where the ports of `spec.ports` are reached, as last fetched (`status.endpoints`): the
    /// Service's cluster DNS name and, while the pod runs, its IP. Empty until the operator
    /// has recorded them; [`refresh`](Self::refresh) to see a new pod's IP.
    pub fn endpoints(&self) -> &[PortEndpoint] {
        self.sandbox
            .status
            .as_ref()
            .map_or(&[], |s| s.endpoints.as_slice())
    }

    /// The endpoint of one named port, as last fetched.
    pub fn endpoint(&self, port_name: &str) -> Option<&PortEndpoint> {
        self.endpoints().iter().find(|e| e.name == port_name)
    }

    /// The Pod API of the sandbox's namespace (for raw exec, e.g. an interactive TTY).
    pub fn pods(&self) -> Api<Pod> {
        self.pods.clone()
    }

    /// The workspace root (`spec.workspace.root`).
    pub fn workspace_root(&self) -> String {
        self.sandbox.spec.workspace.root.clone()
    }

    /// The sandbox's pod (from status, else the deterministic name).
    pub fn pod_name(&self) -> String {
        self.sandbox
            .status
            .as_ref()
            .and_then(|s| s.pod_name.clone())
            .unwrap_or_else(|| labels::pod_name(&self.name))
    }

    /// Suspends the sandbox: the operator deletes its pod (after the on-stop snapshot its
    /// policy asks for) and keeps the workspace on its node.
    pub async fn suspend(&mut self) -> Result<(), ClientError> {
        self.set_mode(LifecycleMode::Suspended).await
    }

    /// Resumes a suspended sandbox: the operator starts a pod on the workspace's node again.
    /// Follow with [`wait_ready`](Self::wait_ready).
    pub async fn resume(&mut self) -> Result<(), ClientError> {
        self.set_mode(LifecycleMode::Running).await
    }

    /// Suspends the sandbox under `guard`, the scope's guard the caller holds (and keeps until
    /// this returns): the operator stops the pod under that hold instead of taking the guard
    /// itself, so no other party can start work in the scope between the caller's last command
    /// and the suspension. Waits up to `timeout` until the Sandbox is Suspended.
    pub async fn suspend_under(
        &mut self,
        guard: &Guard,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        let hold = self.hold_of(guard)?;
        self.patch_mode(LifecycleMode::Suspended, Some(hold))
            .await?;
        guard.run(self.wait_suspended(timeout)).await?
    }

    /// Waits up to `timeout` until the Sandbox is Suspended (its pod gone).
    pub async fn wait_suspended(&mut self, timeout: Duration) -> Result<(), ClientError> {
        let suspended = |s: Option<&Sandbox>| {
            s.is_none_or(|s| {
                s.status.as_ref().and_then(|st| st.phase) == Some(SandboxPhase::Suspended)
            })
        };
        let waited = tokio::time::timeout(
            timeout,
            watch::until(self.api.clone(), &self.name, suspended),
        )
        .await;
        match waited {
            Ok(Ok(Some(s))) => {
                self.sandbox = s;
                Ok(())
            }
            Ok(Ok(None)) => Err(ClientError::NotFound(format!("sandbox {}", self.name))),
            Ok(Err(e)) => Err(ClientError::Protocol(format!(
                "watching {}: {e}",
                self.name
            ))),
            Err(_) => Err(ClientError::not_ready(
                &self.name,
                timeout,
                "not Suspended".into(),
                &[],
            )),
        }
    }

    /// The hand-off fields of `guard` ([`GuardHold`]): refused before any request when it is
    /// another scope's guard or is lost.
    pub fn hold_of(&self, guard: &Guard) -> Result<GuardHold, ClientError> {
        let want = labels::lease_name(&labels::scope_key(&self.sandbox.spec.scope));
        if guard.lease_name() != want {
            return Err(ClientError::ScopeMismatch(format!(
                "guard {} is not the guard of sandbox {}'s scope ({want})",
                guard.lease_name(),
                self.name
            )));
        }
        if guard.is_lost() {
            return Err(GuardError::Lost(want).into());
        }
        Ok(GuardHold {
            holder: guard.holder().to_string(),
            token: guard.token(),
        })
    }

    async fn set_mode(&mut self, mode: LifecycleMode) -> Result<(), ClientError> {
        self.patch_mode(mode, None).await
    }

    /// Sets the mode and the hold it is set under (`None` clears an earlier one).
    async fn patch_mode(
        &mut self,
        mode: LifecycleMode,
        hold: Option<GuardHold>,
    ) -> Result<(), ClientError> {
        let patch = serde_json::json!({"spec": {"lifecycle": {"mode": mode, "guard": hold}}});
        self.sandbox = self
            .api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Asks for the sandbox's deletion and returns (the operator removes its pod, Service and
    /// workspace, then the object). False when it was gone already.
    pub async fn request_delete(&self) -> Result<bool, ClientError> {
        match self.api.delete(&self.name, &DeleteParams::default()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes the sandbox (its pod, Service and workspace go with it; its snapshots stay)
    /// and waits up to `timeout` until the object is gone.
    pub async fn delete(&self, timeout: Duration) -> Result<(), ClientError> {
        if !self.request_delete().await? {
            return Ok(());
        }
        let gone = watch::until(self.api.clone(), &self.name, |s: Option<&Sandbox>| {
            s.is_none()
        });
        match tokio::time::timeout(timeout, gone).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(ClientError::Protocol(format!(
                "watching {}: {e}",
                self.name
            ))),
            Err(_) => Err(ClientError::NotDeleted {
                name: self.name.clone(),
                waited: timeout,
            }),
        }
    }

    /// Waits (with a watch) until the phase is Ready; fails at once with the failing
    /// condition's reason and message when the phase becomes Failed or the start is `Stalled`
    /// (refused for a reason waiting will not fix, such as another scope's snapshot).
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<(), ClientError> {
        // A suspended sandbox never becomes Ready by itself: say so at once instead of
        // waiting out the timeout.
        // A status from before the latest spec change (a resume of a sandbox whose idle
        // suspension was still under way can find it saying Ready) does not count.
        // A start refused for a reason waiting will not fix (`Stalled`) fails at once too.
        let done = |s: Option<&Sandbox>| {
            s.is_none_or(|s| {
                s.spec.lifecycle.mode == LifecycleMode::Suspended
                    || s.stalled().is_some()
                    || (is_current(s)
                        && matches!(
                            s.status.as_ref().and_then(|st| st.phase),
                            Some(SandboxPhase::Ready | SandboxPhase::Failed)
                        ))
            })
        };
        let waited =
            tokio::time::timeout(timeout, watch::until(self.api.clone(), &self.name, done)).await;
        match waited {
            Ok(Ok(Some(s))) => self.sandbox = s,
            Ok(Ok(None)) => {
                return Err(ClientError::NotFound(format!("sandbox {}", self.name)));
            }
            Ok(Err(e)) => {
                return Err(ClientError::Protocol(format!(
                    "watching {}: {e}",
                    self.name
                )));
            }
            Err(_) => {
                let last = self.refresh().await.ok().and_then(|s| s.status.clone());
                let phase = last
                    .as_ref()
                    .and_then(|st| st.phase)
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_else(|| "unknown".into());
                let conds = last.as_ref().map_or(&[][..], |st| &st.conditions[..]);
                return Err(ClientError::not_ready(&self.name, timeout, phase, conds));
            }
        }
        if self.sandbox.spec.lifecycle.mode == LifecycleMode::Suspended {
            return Err(ClientError::Suspended(self.name.clone()));
        }
        match self.phase() {
            Some(SandboxPhase::Ready) => Ok(()),
            _ => Err(ClientError::failed(
                &self.name,
                self.sandbox
                    .status
                    .as_ref()
                    .map_or(&[][..], |s| &s.conditions),
            )),
        }
    }

    fn in_workspace(&self, mut req: ExecRequest) -> ExecRequest {
        if req.workdir.is_none() {
            req.workdir = Some(self.workspace_root());
        }
        req
    }

    /// Runs a command (in the workspace root unless the request names a workdir).
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecOutput, ClientError> {
        self.exec_raw(self.in_workspace(req)).await
    }

    /// Runs a command and streams its output (see [`exec::stream`]).
    pub async fn exec_stream(&self, req: ExecRequest) -> Result<ExecStream, ClientError> {
        self.exec_stream_raw(self.in_workspace(req)).await
    }

    async fn exec_raw(&self, req: ExecRequest) -> Result<ExecOutput, ClientError> {
        let since = k8s_openapi::jiff::Timestamp::now();
        let pod = self.pod_name();
        match exec::run(&self.pods, &pod, exec::SANDBOX_CONTAINER, req).await {
            Ok(out) => Ok(out),
            Err(e) => {
                Err(
                    agentbox_api::oom::explain(&self.pods, &pod, exec::SANDBOX_CONTAINER, since, e)
                        .await
                        .into(),
                )
            }
        }
    }

    /// An exec's failure as the caller should see it (docs/protocol.md, "Out of memory"): one a
    /// dead container explains is [`ExecError::OutOfMemory`](exec::ExecError::OutOfMemory)
    /// (`container: true`) when the kubelet recorded the sandbox's container `OOMKilled` since
    /// `since`, the exec's start. [`Self::exec`] and [`Self::session`] do it themselves; a
    /// caller of [`Self::exec_stream`] passes the stream's error here.
    pub async fn explain_exec_error(
        &self,
        since: k8s_openapi::jiff::Timestamp,
        e: exec::ExecError,
    ) -> exec::ExecError {
        agentbox_api::oom::explain(
            &self.pods,
            &self.pod_name(),
            exec::SANDBOX_CONTAINER,
            since,
            e,
        )
        .await
    }

    async fn exec_stream_raw(&self, req: ExecRequest) -> Result<ExecStream, ClientError> {
        Ok(exec::stream(&self.pods, &self.pod_name(), exec::SANDBOX_CONTAINER, req).await?)
    }

    /// File access to the workspace (paths confined to the root).
    pub fn workspace(&self) -> Workspace {
        Workspace::new(
            self.pods.clone(),
            self.pod_name(),
            exec::SANDBOX_CONTAINER,
            self.workspace_root(),
        )
    }

    /// Reads a workspace file (up to 64 MiB). See [`Workspace::read_file`].
    pub async fn read_file(&self, path: &str) -> Result<Vec<u8>, ClientError> {
        self.workspace().read_file(path).await
    }

    /// Writes a workspace file, creating parents. See [`Workspace::write_file`].
    pub async fn write_file(
        &self,
        path: &str,
        content: impl Into<bytes::Bytes>,
    ) -> Result<(), ClientError> {
        self.workspace().write_file(path, content).await
    }

    /// Lists a workspace directory. See [`Workspace::list_dir`].
    pub async fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, ClientError> {
        self.workspace().list_dir(path).await
    }

    /// Uploads a local directory into the workspace. See [`Workspace::upload_dir`].
    pub async fn upload_dir(
        &self,
        local: &std::path::Path,
        remote: &str,
    ) -> Result<(), ClientError> {
        self.workspace().upload_dir(local, remote).await
    }

    /// Downloads a workspace directory. See [`Workspace::download_dir`].
    pub async fn download_dir(
        &self,
        remote: &str,
        local: &std::path::Path,
    ) -> Result<(), ClientError> {
        self.workspace().download_dir(remote, local).await
    }

    /// [`Self::upload_dir`] that reports the bytes sent. See [`Workspace::upload_dir_counted`].
    pub async fn upload_dir_counted(
        &self,
        local: &std::path::Path,
        remote: &str,
        on_bytes: impl Fn(u64) + Send + 'static,
    ) -> Result<(), ClientError> {
        self.workspace()
            .upload_dir_counted(local, remote, on_bytes)
            .await
    }

    /// [`Self::download_dir`] that reports the bytes received. See
    /// [`Workspace::download_dir_counted`].
    pub async fn download_dir_counted(
        &self,
        remote: &str,
        local: &std::path::Path,
        on_bytes: impl Fn(u64),
    ) -> Result<(), ClientError> {
        self.workspace()
            .download_dir_counted(remote, local, on_bytes)
            .await
    }

    /// A persistent shell in the sandbox (commands run in the workspace root by default). A
    /// command whose shell died with the container killed for memory fails with
    /// [`ExecError::OutOfMemory`](exec::ExecError::OutOfMemory) (`container: true`).
    pub fn session(&self) -> Session {
        Session::new(self.pods.clone(), self.pod_name(), exec::SANDBOX_CONTAINER)
            .with_workdir(self.workspace_root())
            .with_oom_check()
    }

    /// A harness's call in one step: waits until the sandbox is Ready (resuming it when it is
    /// suspended, as an idle timeout does), then takes the scope's guard (waiting up to
    /// `wait`) and returns it with the sandbox Ready. While the guard is held the operator
    /// cannot suspend the sandbox for idleness; it suspends only while holding the guard
    /// itself, so a suspension between the wait and the take is seen once the guard is ours,
    /// and the sandbox is resumed and waited for again. The guard comes after Ready because a
    /// start that restores a snapshot needs it (the operator restores under it).
    pub async fn ready_guard(
        &mut self,
        ready_timeout: Duration,
        wait: Option<Duration>,
    ) -> Result<Guard, ClientError> {
        for _ in 0..3 {
            if self.sandbox.spec.lifecycle.mode == LifecycleMode::Suspended {
                self.resume().await?;
            }
            match self.wait_ready(ready_timeout).await {
                Err(ClientError::Suspended(_)) => continue,
                other => other?,
            }
            let g = self.guard(wait).await?;
            if self.refresh().await?.spec.lifecycle.mode != LifecycleMode::Suspended {
                return Ok(g);
            }
            // Suspended for idleness just before the take: give the guard back, resume.
            let _ = g.release().await;
        }
        Err(ClientError::Suspended(self.name.clone()))
    }

    /// Takes the scope's execution guard with default settings, waiting up to `wait`
    /// (`None` = indefinitely).
    pub async fn guard(&self, wait: Option<Duration>) -> Result<Guard, ClientError> {
        self.guard_with(&GuardConfig::default(), wait).await
    }

    /// Takes the scope's execution guard with the given settings.
    pub async fn guard_with(
        &self,
        cfg: &GuardConfig,
        wait: Option<Duration>,
    ) -> Result<Guard, ClientError> {
        Ok(guard::acquire_scope(
            self.client.clone(),
            &self.namespace,
            &self.sandbox.spec.scope,
            cfg,
            wait,
        )
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(generation: Option<i64>, observed: Option<i64>) -> Sandbox {
        let mut s: Sandbox = serde_json::from_value(serde_json::json!({
            "apiVersion": "agentbox.dev/v1alpha1", "kind": "Sandbox",
            "metadata": {"name": "s"},
            "spec": {"image": "i", "scope": {"kind": "Global"}},
            "status": {"phase": "Ready"},
        }))
        .unwrap();
        s.metadata.generation = generation;
        if let Some(st) = s.status.as_mut() {
            st.observed_generation = observed;
        }
        s
    }

    #[test]
    fn a_status_from_before_the_latest_spec_change_is_not_current() {
        assert!(
            !is_current(&sandbox(Some(3), Some(2))),
            "resumed, not seen yet"
        );
        assert!(is_current(&sandbox(Some(3), Some(3))));
        assert!(is_current(&sandbox(Some(3), None)), "nothing to compare");
    }
}
