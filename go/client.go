package agentbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// The API group of agentbox's kinds.
const (
	Group   = "agentbox.dev"
	Version = "v1alpha1"
)

var (
	sandboxesGVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "sandboxes"}
	snapshotsGVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "sandboxsnapshots"}
	templatesGVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "sandboxtemplates"}
	leasesGVR    = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	podsGVR      = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
)

// requestTimeout bounds every request that is not a watch (no write without a timeout).
const requestTimeout = 30 * time.Second

// Client is a connection to one API server: the CRDs through a dynamic client, exec over
// WebSocket.
type Client struct {
	Config *rest.Config
	dyn    dynamic.Interface
	ws     *wsDialer
}

// NewClient is a client for cfg.
func NewClient(cfg *rest.Config) (*Client, error) {
	c := rest.CopyConfig(cfg)
	if c.UserAgent == "" {
		c.UserAgent = "agentbox-go"
	}
	// The defaults (5 QPS, burst 10) throttle a harness's bursts of execs and waits.
	if c.QPS == 0 {
		c.QPS, c.Burst = 100, 200
	}
	dyn, err := dynamic.NewForConfig(c)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTransport, err)
	}
	return &Client{Config: c, dyn: dyn, ws: &wsDialer{cfg: c}}, nil
}

// LoadConfig reads the in-cluster service account, else the kubeconfig ($KUBECONFIG or
// ~/.kube/config), and the namespace of its context ("default" when none).
func LoadConfig() (*rest.Config, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("%w: no Kubernetes configuration: %v", ErrTransport, err)
	}
	ns, _, err := cc.Namespace()
	if err != nil || ns == "" {
		ns = "default"
	}
	return cfg, ns, nil
}

// Sandboxes are the Sandboxes of one namespace.
type Sandboxes struct {
	Client    *Client
	Namespace string
}

// NewSandboxes is the Sandboxes of namespace ("" : the kubeconfig context's) with a client
// from LoadConfig.
func NewSandboxes(namespace string) (*Sandboxes, error) {
	cfg, ns, err := LoadConfig()
	if err != nil {
		return nil, err
	}
	if namespace == "" {
		namespace = ns
	}
	c, err := NewClient(cfg)
	if err != nil {
		return nil, err
	}
	return c.Sandboxes(namespace), nil
}

// Sandboxes of one namespace.
func (c *Client) Sandboxes(namespace string) *Sandboxes {
	return &Sandboxes{Client: c, Namespace: namespace}
}

func (s *Sandboxes) res(gvr schema.GroupVersionResource) dynamic.ResourceInterface {
	return s.Client.dyn.Resource(gvr).Namespace(s.Namespace)
}

// apiErr maps a client-go error onto this package's errors.
func apiErr(err error) error {
	if err == nil {
		return nil
	}
	var st apierrors.APIStatus
	if errors.As(err, &st) {
		s := st.Status()
		if s.Code != 0 {
			return &APIError{Code: int(s.Code), Reason: string(s.Reason), Message: s.Message}
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w: %v", ErrTransport, err)
}

func reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, requestTimeout)
}

// get reads one object; (nil, nil) when it does not exist.
func (s *Sandboxes) get(ctx context.Context, gvr schema.GroupVersionResource, name string) (map[string]any, error) {
	ctx, cancel := reqCtx(ctx)
	defer cancel()
	u, err := s.res(gvr).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, apiErr(err)
	}
	return u.Object, nil
}

func (s *Sandboxes) create(ctx context.Context, gvr schema.GroupVersionResource, obj map[string]any) (map[string]any, error) {
	ctx, cancel := reqCtx(ctx)
	defer cancel()
	u, err := s.res(gvr).Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	if err != nil {
		return nil, apiErr(err)
	}
	return u.Object, nil
}

func (s *Sandboxes) update(ctx context.Context, gvr schema.GroupVersionResource, obj map[string]any) (map[string]any, error) {
	ctx, cancel := reqCtx(ctx)
	defer cancel()
	u, err := s.res(gvr).Update(ctx, &unstructured.Unstructured{Object: obj}, metav1.UpdateOptions{})
	if err != nil {
		return nil, apiErr(err)
	}
	return u.Object, nil
}

// SandboxSpec is the spec of a Sandbox: the common fields typed, any other field of the CRD
// (kubectl explain sandbox.spec) in Extra, in its JSON form.
type SandboxSpec struct {
	Image           string          `json:"image,omitempty"`
	TemplateRef     *TemplateRef    `json:"templateRef,omitempty"`
	ImagePullPolicy string          `json:"imagePullPolicy,omitempty"`
	Command         []string        `json:"command,omitempty"`
	Args            []string        `json:"args,omitempty"`
	Env             []EnvVarSpec    `json:"env,omitempty"`
	Workspace       *WorkspaceSpec  `json:"workspace,omitempty"`
	Network         *NetworkSpec    `json:"network,omitempty"`
	Lifecycle       *LifecycleSpec  `json:"lifecycle,omitempty"`
	Snapshot        *SnapshotPolicy `json:"snapshot,omitempty"`
	Extra           map[string]any  `json:"-"`
}

// TemplateRef names the SandboxTemplate a Sandbox is made from.
type TemplateRef struct {
	Name string `json:"name"`
}

// EnvVarSpec is one environment variable of the sandbox container.
type EnvVarSpec struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// WorkspaceSpec is the workspace: its root in the container.
type WorkspaceSpec struct {
	Root string `json:"root,omitempty"`
}

// NetworkSpec is what the sandbox may reach: Egress "None" (nothing), "All", or "Allowlist"
// (only Allow); "" is the cluster's default ("None" unless the administrator changed it).
// Editable while the sandbox runs. A sandbox relying on a policy is Ready only where the
// operator proved NetworkPolicy is enforced (condition NetworkEnforced).
type NetworkSpec struct {
	Egress string        `json:"egress,omitempty"`
	Allow  []EgressAllow `json:"allow,omitempty"`
}

// EgressAllow is an allowed destination and its ports (none: every port): an address block
// in CIDR notation (CIDR), or a DNS name (Domain: "pypi.org", or "*.github.com" for the names
// below it) reached through agentbox's egress proxy. Exactly one of the two. An exact Domain
// may carry a Credential the proxy adds at the hop.
type EgressAllow struct {
	CIDR       string            `json:"cidr,omitempty"`
	Domain     string            `json:"domain,omitempty"`
	Ports      []EgressPort      `json:"ports,omitempty"`
	Credential *EgressCredential `json:"credential,omitempty"`
}

// EgressCredential is a key of a Secret (SecretName, in the sandbox's namespace) that the
// egress proxy sends as the header Header ("": Authorization) to the entry's exact domain, so
// the sandbox never holds it: the sandbox calls http://that-name/... through the proxy, which
// speaks TLS to the server, verifies it and sets the header. The Secret's annotation
// agentbox.dev/credential-domains must allow the domain (set by whoever owns the Secret);
// otherwise the sandbox gets no pod (reason CredentialRefused).
type EgressCredential struct {
	SecretName string `json:"secretName"`
	Key        string `json:"key"`
	Header     string `json:"header,omitempty"`
}

// EgressPort is a port (through EndPort, when set) of an allowed destination; Protocol is
// "TCP" (the default), "UDP" or "SCTP".
type EgressPort struct {
	Port     int32  `json:"port"`
	EndPort  int32  `json:"endPort,omitempty"`
	Protocol string `json:"protocol,omitempty"`
}

// LifecycleSpec is whether the sandbox has a pod ("Running") or not ("Suspended"), and after
// how long idle it suspends itself (a duration such as "15m").
type LifecycleSpec struct {
	Mode        string `json:"mode,omitempty"`
	IdleTimeout string `json:"idleTimeout,omitempty"`
}

// SnapshotPolicy is which snapshot a fresh workspace is restored from ("Latest", "None",
// "Named" with Name), and whether one is taken when the sandbox stops.
type SnapshotPolicy struct {
	Restore string `json:"restore,omitempty"`
	Name    string `json:"name,omitempty"`
	OnStop  bool   `json:"onStop,omitempty"`
}

// Map is the spec's JSON form.
func (s SandboxSpec) Map() (map[string]any, error) {
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, invalidf("spec: %v", err)
	}
	m := map[string]any{}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, invalidf("spec: %v", err)
	}
	for k, v := range s.Extra {
		m[k] = v
	}
	return m, nil
}

func sandboxObject(name string, scope Scope, spec map[string]any) map[string]any {
	meta := map[string]any{"name": name, "labels": toAny(ScopeLabels(scope))}
	if a := ScopeAnnotations(scope); len(a) > 0 {
		meta["annotations"] = toAny(a)
	}
	return map[string]any{
		"apiVersion": Group + "/" + Version,
		"kind":       "Sandbox",
		"metadata":   meta,
		"spec":       spec,
	}
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func scopeMap(s Scope) map[string]any {
	m := map[string]any{"kind": string(s.Kind)}
	if s.Agent != "" {
		m["agent"] = s.Agent
	}
	if s.User != "" {
		m["user"] = s.User
	}
	if s.Session != "" {
		m["session"] = s.Session
	}
	return m
}

func scopeOf(obj map[string]any) Scope {
	m := mapAt(obj, "spec", "scope")
	return Scope{Kind: ScopeKind(str(m["kind"])), Agent: str(m["agent"]), User: str(m["user"]), Session: str(m["session"])}
}

// mapAt walks nested maps; a missing level is an empty map.
func mapAt(obj map[string]any, path ...string) map[string]any {
	cur := obj
	for _, p := range path {
		next, _ := cur[p].(map[string]any)
		if next == nil {
			return map[string]any{}
		}
		cur = next
	}
	return cur
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

func intOf(v any) (int64, bool) {
	switch n := v.(type) {
	case int64:
		return n, true
	case int:
		return int64(n), true
	case float64:
		return int64(n), true
	case json.Number:
		i, err := n.Int64()
		return i, err == nil
	}
	return 0, false
}

// GetOrCreate is the Sandbox of scope: created from spec (its scope set to scope) under the
// scope's deterministic name, or the existing one if someone created it first, in any
// language: two racing callers get the same Sandbox. A suspended one is resumed.
func (s *Sandboxes) GetOrCreate(ctx context.Context, scope Scope, spec SandboxSpec) (*Sandbox, error) {
	if err := scope.Validate(); err != nil {
		return nil, err
	}
	body, err := spec.Map()
	if err != nil {
		return nil, err
	}
	body["scope"] = scopeMap(scope)
	name := SandboxNameForScope(scope)
	if spec.TemplateRef != nil {
		// Fail now, not after a wait for Ready: a sandbox would wait for its template.
		t, err := s.get(ctx, templatesGVR, spec.TemplateRef.Name)
		if err != nil {
			return nil, err
		}
		if t == nil {
			return nil, fmt.Errorf("%w: sandboxtemplate %s/%s", ErrNotFound, s.Namespace, spec.TemplateRef.Name)
		}
	}
	obj, err := s.create(ctx, sandboxesGVR, sandboxObject(name, scope, body))
	if errors.Is(err, ErrConflict) {
		obj, err = s.get(ctx, sandboxesGVR, name)
		if err == nil && obj == nil {
			err = fmt.Errorf("%w: sandbox %s/%s was deleted while it was read", ErrNotFound, s.Namespace, name)
		}
	}
	if err != nil {
		return nil, err
	}
	// The name is a hash of the scope; another scope under it was made by hand.
	if scopeOf(obj) != scope {
		return nil, fmt.Errorf("%w: sandbox %s exists with a different scope", ErrScopeMismatch, name)
	}
	sb := &Sandbox{sbs: s, Obj: obj}
	if str(mapAt(obj, "spec", "lifecycle")["mode"]) == "Suspended" {
		if err := sb.Resume(ctx); err != nil {
			return nil, err
		}
	}
	return sb, nil
}

// Open is an existing Sandbox by name (ErrNotFound if none).
func (s *Sandboxes) Open(ctx context.Context, name string) (*Sandbox, error) {
	obj, err := s.get(ctx, sandboxesGVR, name)
	if err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, fmt.Errorf("%w: sandbox %s/%s", ErrNotFound, s.Namespace, name)
	}
	return &Sandbox{sbs: s, Obj: obj}, nil
}

// OpenScope is the Sandbox of a scope, without creating it.
func (s *Sandboxes) OpenScope(ctx context.Context, scope Scope) (*Sandbox, error) {
	return s.Open(ctx, SandboxNameForScope(scope))
}

// Guard is the execution guard of a scope (not yet acquired).
func (s *Sandboxes) Guard(scope Scope, cfg GuardConfig) *Guard {
	return newGuard(s, LeaseName(ScopeKey(scope)), ScopeLabels(scope), cfg)
}

// Sandbox is one Sandbox: exec, sessions, files, lifecycle, snapshots and its scope's guard.
type Sandbox struct {
	sbs *Sandboxes
	// Obj is the Sandbox object as last read.
	Obj map[string]any
}

// Name of the Sandbox.
func (b *Sandbox) Name() string { return str(mapAt(b.Obj, "metadata")["name"]) }

// Namespace of the Sandbox.
func (b *Sandbox) Namespace() string { return b.sbs.Namespace }

// Scope of the Sandbox.
func (b *Sandbox) Scope() Scope { return scopeOf(b.Obj) }

// Phase as last read.
func (b *Sandbox) Phase() string { return str(mapAt(b.Obj, "status")["phase"]) }

// PodName is the sandbox's pod (from the status, else the deterministic name).
func (b *Sandbox) PodName() string {
	if p := str(mapAt(b.Obj, "status")["podName"]); p != "" {
		return p
	}
	return PodName(b.Name())
}

// WorkspaceRoot is the workspace root in the container.
func (b *Sandbox) WorkspaceRoot() string {
	if r := str(mapAt(b.Obj, "spec", "workspace")["root"]); r != "" {
		return r
	}
	return "/workspace"
}

// HostDir is the workspace's directory on its node (status.nodeName): the one the status
// records, else the one its pod mounts at the workspace root (its "workspace" volume); ""
// when neither is known.
func (b *Sandbox) HostDir(ctx context.Context) (string, error) {
	if d := str(mapAt(b.Obj, "status", "workspace")["hostDir"]); d != "" {
		return d, nil
	}
	pod, err := b.sbs.get(ctx, podsGVR, b.PodName())
	if err != nil || pod == nil {
		return "", err
	}
	vols, _ := mapAt(pod, "spec")["volumes"].([]any)
	for _, v := range vols {
		m, _ := v.(map[string]any)
		if str(m["name"]) == "workspace" {
			return str(mapAt(m, "hostPath")["path"]), nil
		}
	}
	return "", nil
}

// Refresh reads the Sandbox again.
func (b *Sandbox) Refresh(ctx context.Context) error {
	obj, err := b.sbs.get(ctx, sandboxesGVR, b.Name())
	if err != nil {
		return err
	}
	if obj == nil {
		return fmt.Errorf("%w: sandbox %s/%s", ErrNotFound, b.Namespace(), b.Name())
	}
	b.Obj = obj
	return nil
}

// Readiness is what a Sandbox's state means for a caller waiting for it.
type Readiness string

// The readinesses.
const (
	Ready     Readiness = "ready"
	Failed    Readiness = "failed"    // will not become Ready until its spec changes, or Stalled
	Suspended Readiness = "suspended" // by its spec
	Waiting   Readiness = "waiting"
)

// Stalled reports whether a Sandbox's Stalled condition is True for its current spec.
func Stalled(obj map[string]any) bool {
	gen, hasGen := intOf(mapAt(obj, "metadata")["generation"])
	conds, _ := mapAt(obj, "status")["conditions"].([]any)
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if str(m["type"]) == "Stalled" && str(m["status"]) == "True" {
			obs, hasObs := intOf(m["observedGeneration"])
			return !(hasObs && hasGen && obs < gen)
		}
	}
	return false
}

// ReadinessOf a Sandbox object (pure).
func ReadinessOf(obj map[string]any) Readiness {
	if str(mapAt(obj, "spec", "lifecycle")["mode"]) == "Suspended" {
		return Suspended
	}
	if Stalled(obj) {
		return Failed
	}
	st := mapAt(obj, "status")
	obs, hasObs := intOf(st["observedGeneration"])
	gen, hasGen := intOf(mapAt(obj, "metadata")["generation"])
	if hasObs && hasGen && obs < gen {
		return Waiting
	}
	switch str(st["phase"]) {
	case "Ready":
		return Ready
	case "Failed":
		return Failed
	}
	return Waiting
}

// FailingCondition is the reason and message of the condition that explains why an object is
// not Ready: its Ready condition when not True, else any False condition.
func FailingCondition(obj map[string]any) (string, string) {
	conds, _ := mapAt(obj, "status")["conditions"].([]any)
	var pick map[string]any
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if str(m["type"]) == "Ready" && str(m["status"]) != "True" {
			pick = m
			break
		}
	}
	if pick == nil {
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if str(m["status"]) == "False" {
				pick = m
				break
			}
		}
	}
	if pick == nil {
		return "", ""
	}
	return str(pick["reason"]), str(pick["message"])
}

// WaitReady waits with a watch until the Sandbox is Ready. Failed and Stalled end the wait at
// once (ErrSandboxFailed), so does a spec that suspends it (ErrSandboxSuspended); the timeout
// is ErrSandboxNotReady.
func (b *Sandbox) WaitReady(ctx context.Context, timeout time.Duration) error {
	name := b.Name()
	obj, err := b.sbs.watchUntil(ctx, sandboxesGVR, name, timeout, func(obj map[string]any) (bool, error) {
		if obj == nil {
			return false, fmt.Errorf("%w: sandbox %s/%s was deleted", ErrNotFound, b.Namespace(), name)
		}
		state := ReadinessOf(obj)
		reason, msg := FailingCondition(obj)
		phase := str(mapAt(obj, "status")["phase"])
		switch state {
		case Ready:
			return true, nil
		case Failed:
			if reason == "" {
				reason = "Failed"
			}
			return false, &SandboxError{Kind: ErrSandboxFailed, Name: name, Phase: phase, Reason: reason, Message: msg}
		case Suspended:
			return false, &SandboxError{Kind: ErrSandboxSuspended, Name: name, Phase: phase, Reason: "Suspended", Message: "spec.lifecycle.mode is Suspended; resume it"}
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	if obj == nil {
		if rerr := b.Refresh(ctx); rerr != nil {
			return rerr
		}
		reason, msg := FailingCondition(b.Obj)
		if msg == "" {
			msg = fmt.Sprintf("not Ready after %v", timeout)
		}
		return &SandboxError{Kind: ErrSandboxNotReady, Name: name, Phase: b.Phase(), Reason: reason, Message: msg}
	}
	b.Obj = obj
	return nil
}

// watchUntil watches one object until decide says true (returns it), decide fails, or the
// timeout passes (returns nil, nil). decide sees nil when the object does not exist.
func (s *Sandboxes) watchUntil(ctx context.Context, gvr schema.GroupVersionResource, name string, timeout time.Duration, decide func(map[string]any) (bool, error)) (map[string]any, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	sel := "metadata.name=" + name
	for {
		lctx, lcancel := reqCtx(ctx)
		list, err := s.res(gvr).List(lctx, metav1.ListOptions{FieldSelector: sel})
		lcancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil
			}
			return nil, apiErr(err)
		}
		var cur map[string]any
		if len(list.Items) > 0 {
			cur = list.Items[0].Object
		}
		done, err := decide(cur)
		if err != nil {
			return nil, err
		}
		if done {
			return cur, nil
		}
		w, err := s.res(gvr).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.GetResourceVersion(), AllowWatchBookmarks: true})
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil
			}
			return nil, apiErr(err)
		}
		for ev := range w.ResultChan() {
			var obj map[string]any
			switch ev.Type {
			case watch.Added, watch.Modified:
				u, ok := ev.Object.(*unstructured.Unstructured)
				if !ok {
					continue
				}
				obj = u.Object
			case watch.Deleted:
			default:
				continue
			}
			done, err := decide(obj)
			if err != nil {
				w.Stop()
				return nil, err
			}
			if done {
				w.Stop()
				return obj, nil
			}
		}
		w.Stop()
		if ctx.Err() != nil {
			return nil, nil
		}
		// The server ended the watch (or it expired): list again.
	}
}

func (b *Sandbox) setMode(ctx context.Context, mode string) error {
	ctx, cancel := reqCtx(ctx)
	defer cancel()
	patch := []byte(fmt.Sprintf(`{"spec":{"lifecycle":{"mode":%q}}}`, mode))
	u, err := b.sbs.res(sandboxesGVR).Patch(ctx, b.Name(), types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return apiErr(err)
	}
	b.Obj = u.Object
	return nil
}

// Suspend deletes the sandbox's pod and keeps its workspace on the node.
func (b *Sandbox) Suspend(ctx context.Context) error { return b.setMode(ctx, "Suspended") }

// Resume gives a suspended sandbox a new pod on its workspace; then WaitReady.
func (b *Sandbox) Resume(ctx context.Context) error { return b.setMode(ctx, "Running") }

// Delete deletes the Sandbox (its pod and workspace go; snapshots stay). With wait > 0 it
// returns once it is gone, or ErrSandboxNotDeleted when it still exists after wait.
func (b *Sandbox) Delete(ctx context.Context, wait time.Duration) error {
	rctx, cancel := reqCtx(ctx)
	err := b.sbs.res(sandboxesGVR).Delete(rctx, b.Name(), metav1.DeleteOptions{})
	cancel()
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return apiErr(err)
	}
	if wait <= 0 {
		return nil
	}
	obj, err := b.sbs.watchUntil(ctx, sandboxesGVR, b.Name(), wait, func(o map[string]any) (bool, error) { return o == nil, nil })
	if err != nil {
		return err
	}
	_ = obj
	cur, err := b.sbs.get(ctx, sandboxesGVR, b.Name())
	if err != nil {
		return err
	}
	if cur != nil {
		return &SandboxError{Kind: ErrSandboxNotDeleted, Name: b.Name(), Phase: "Terminating", Reason: "Timeout", Message: fmt.Sprintf("still exists after %v", wait)}
	}
	return nil
}

// Exec runs argv in the sandbox's pod to completion (in the workspace root unless
// opts.Workdir): its real exit code, stdout and stderr. A timeout kills its process group and
// returns an ExecTimeoutError with the output so far.
//
// A command killed for memory is an OutOfMemoryError (errors.Is ErrOutOfMemory).
func (b *Sandbox) Exec(ctx context.Context, argv []string, opts ExecOptions) (*ExecResult, error) {
	since := time.Now()
	res, err := b.sbs.Client.ws.collect(ctx, b.Namespace(), b.PodName(), opts.frame(argv, b.WorkspaceRoot()), opts)
	if err != nil && res == nil {
		return nil, b.explainFailure(ctx, since, err)
	}
	return res, err
}

// Run runs a shell command line (sh -c command); see Exec.
func (b *Sandbox) Run(ctx context.Context, command string, opts ExecOptions) (*ExecResult, error) {
	return b.Exec(ctx, []string{"sh", "-c", command}, opts)
}

// Guard is the execution guard of the sandbox's scope.
func (b *Sandbox) Guard(cfg GuardConfig) *Guard { return b.sbs.Guard(b.Scope(), cfg) }

func listOpts(selector string) metav1.ListOptions { return metav1.ListOptions{LabelSelector: selector} }

// Gone returns a channel closed when the sandbox stops serving in the pod it has now: the
// pod is deleted (or being deleted, or replaced), or the Sandbox is deleted or suspended.
// Watches end with ctx.
func (b *Sandbox) Gone(ctx context.Context) (<-chan struct{}, error) {
	pod, err := b.sbs.get(ctx, podsGVR, b.PodName())
	if err != nil {
		return nil, err
	}
	gone := make(chan struct{})
	var once sync.Once
	end := func() { once.Do(func() { close(gone) }) }
	if pod == nil {
		end()
		return gone, nil
	}
	uid := str(mapAt(pod, "metadata")["uid"])
	forever := 100 * 365 * 24 * time.Hour
	watchOne := func(gvr schema.GroupVersionResource, name string, over func(map[string]any) bool) {
		for ctx.Err() == nil {
			obj, err := b.sbs.watchUntil(ctx, gvr, name, forever, func(o map[string]any) (bool, error) { return over(o), nil })
			if obj != nil || err == nil && ctx.Err() == nil {
				end()
				return
			}
			if ctx.Err() != nil {
				return
			}
			// A failed list or watch (API server restarting): try again shortly.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}
	go watchOne(podsGVR, b.PodName(), func(o map[string]any) bool {
		if o == nil {
			return true
		}
		m := mapAt(o, "metadata")
		return str(m["uid"]) != uid || m["deletionTimestamp"] != nil
	})
	go watchOne(sandboxesGVR, b.Name(), func(o map[string]any) bool {
		return o == nil || str(mapAt(o, "spec", "lifecycle")["mode"]) == "Suspended"
	})
	return gone, nil
}

// Ping checks that the API server answers and serves Sandboxes in the namespace.
func (s *Sandboxes) Ping(ctx context.Context) error {
	ctx, cancel := reqCtx(ctx)
	defer cancel()
	_, err := s.res(sandboxesGVR).List(ctx, metav1.ListOptions{Limit: 1})
	return apiErr(err)
}

// Egress is spec.network.egress as last read ("" when unset: the cluster's default).
func (b *Sandbox) Egress() string {
	return str(mapAt(b.Obj, "spec", "network")["egress"])
}

// Pod is a handle on a pod that agentbox did not make (benchmarks, tests): commands run in
// its container named "sandbox", file paths are confined to root.
func (c *Client) Pod(namespace, pod, root string) *Sandbox {
	return &Sandbox{sbs: c.Sandboxes(namespace), Obj: map[string]any{
		"metadata": map[string]any{"name": pod},
		"spec":     map[string]any{"workspace": map[string]any{"root": root}},
		"status":   map[string]any{"podName": pod},
	}}
}

// Serving reports whether a Sandbox serves commands in pod (pure): Ready for its current
// spec, and its workspace initialised in exactly that pod, which is not being deleted. A
// status still Ready from a pod that was just deleted is not serving.
func Serving(obj, pod map[string]any) bool {
	if ReadinessOf(obj) != Ready || pod == nil {
		return false
	}
	meta := mapAt(pod, "metadata")
	if meta["deletionTimestamp"] != nil {
		return false
	}
	uid := str(meta["uid"])
	return uid != "" && str(mapAt(obj, "status", "workspace")["initializedPodUid"]) == uid
}

// Recover waits until the sandbox serves commands in a live pod: after its pod was deleted or
// evicted, its node lost, or the sandbox suspended (it is resumed), the operator starts a new
// pod on the workspace, and this returns once that pod is the one the workspace was
// initialised in. It fails as WaitReady does; a sandbox already serving returns at once.
func (b *Sandbox) Recover(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := b.Refresh(ctx); err != nil {
			return err
		}
		if ReadinessOf(b.Obj) == Suspended {
			if err := b.Resume(ctx); err != nil {
				return err
			}
		}
		pod, err := b.sbs.get(ctx, podsGVR, b.PodName())
		if err != nil {
			return err
		}
		if Serving(b.Obj, pod) {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			reason, msg := FailingCondition(b.Obj)
			if msg == "" {
				msg = fmt.Sprintf("not serving after %v", timeout)
			}
			return &SandboxError{Kind: ErrSandboxNotReady, Name: b.Name(), Phase: b.Phase(), Reason: reason, Message: msg}
		}
		if ReadinessOf(b.Obj) == Ready {
			// Ready, but from a pod that is gone or going: the new one follows shortly.
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(min(200*time.Millisecond, left)):
			}
			continue
		}
		if err := b.WaitReady(ctx, left); err != nil {
			return err
		}
	}
}
