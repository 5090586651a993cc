package anna

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"sync"
	"time"

	agentbox "agentbox.dev/go"
)

// Agentbox is the Factory of agentbox sessions: each session is the Sandbox of Scope
// (created on first use, found again by a later session of the same scope, its workspace
// kept), held under the scope's guard for the session's run.
type Agentbox struct {
	// Sandboxes is the namespace the sandboxes live in.
	Sandboxes *agentbox.Sandboxes
	// Scope is the isolation scope of the sessions.
	Scope agentbox.Scope
	// Image is the sandbox image; ImagePullPolicy its pull policy ("" : the cluster's).
	Image           string
	ImagePullPolicy string
	// Root is the workspace's directory in the sandbox ("" : MountWorkspace); the policy's
	// working directory is under it.
	Root string
	// MaxOutput caps each of an Exec's stdout and stderr (0 : agentbox.DefaultMaxOutput, 8
	// MiB); an output beyond it is an error (ErrOutputTruncated), never a short result alone.
	MaxOutput int
	// ReadyTimeout bounds the wait for the sandbox (0 : 2 minutes).
	ReadyTimeout time.Duration
	// Guard configures the scope's guard; Guard.Wait bounds the wait for another session of
	// the scope to end (0 : 30 s).
	Guard agentbox.GuardConfig
	// Allow narrows the contract's NetworkAllowAll to these destinations: address blocks
	// (CIDR) and domain names (Domain: "pypi.org", or "*.github.com" for the names below it),
	// the latter reached through agentbox's egress proxy. Set, a policy that allows the
	// network gets a sandbox with egress Allowlist of exactly these, which relies on the
	// cluster enforcing NetworkPolicy as NetworkDisabled does (the same fail-closed check);
	// NetworkDisabled stays egress None. Empty: NetworkAllowAll is egress All. An exact
	// Domain may carry a Credential (a Secret's key the proxy sends as a header to that
	// name, so the sandbox never holds it; the Secret's annotation
	// agentbox.dev/credential-domains must allow the domain). Checked by Supported (each
	// entry has exactly one of CIDR and Domain, a domain's ports are TCP, a credential goes
	// on an exact domain with a Secret name, key and header in the CRD's form).
	Allow []agentbox.EgressAllow
}

var _ Factory = (*Agentbox)(nil)

// Name is "agentbox".
func (f *Agentbox) Name() string { return "agentbox" }

// Available reports whether the cluster answers and serves Sandboxes.
func (f *Agentbox) Available() bool {
	if f.Sandboxes == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return f.Sandboxes.Ping(ctx) == nil
}

func (f *Agentbox) incompatible(p Policy, field, reason string) error {
	return &PolicyCompatibilityError{Backend: f.Name(), Policy: p, Reason: "Policy." + field + ": " + reason}
}

func (f *Agentbox) root() string {
	if f.Root == "" {
		return MountWorkspace
	}
	return f.Root
}

// workingDir is the policy's working directory in the sandbox ("" : the root).
func (f *Agentbox) workingDir(p Policy) (string, error) {
	return agentbox.Confine(f.root(), p.Filesystem.WorkingDir)
}

// Supported says whether agentbox can honour p (a PolicyCompatibilityError naming the field
// when not).
func (f *Agentbox) Supported(p Policy) error {
	r := f.root()
	if !strings.HasPrefix(r, "/") || strings.Contains("/"+r+"/", "/../") {
		return f.incompatible(p, "Filesystem", fmt.Sprintf("the factory's Root %q must be an absolute path without '..'", r))
	}
	if _, err := f.workingDir(p); err != nil {
		return f.incompatible(p, "Filesystem.WorkingDir", err.Error())
	}
	if len(p.Filesystem.Homes) > 0 {
		return f.incompatible(p, "Filesystem.Homes", "agentbox keeps one workspace per scope; it attaches no homes")
	}
	switch p.Network.Mode {
	case "", NetworkAllowAll, NetworkDisabled:
	default:
		return f.incompatible(p, "Network.Mode", fmt.Sprintf("unknown mode %q", p.Network.Mode))
	}
	if p.Network.Timeout != 0 {
		return f.incompatible(p, "Network.Timeout", "agentbox does not bound network operations")
	}
	if p.InheritEnv {
		return f.incompatible(p, "InheritEnv", "the runner's environment is not passed into the sandbox")
	}
	for k := range p.Env {
		if !agentbox.IsEnvName(k) {
			return f.incompatible(p, "Env", fmt.Sprintf("%q is not an environment variable name", k))
		}
	}
	if p.Timeout < 0 {
		return f.incompatible(p, "Timeout", "must not be negative")
	}
	if f.MaxOutput < 0 {
		return fmt.Errorf("%w: Agentbox.MaxOutput must not be negative", agentbox.ErrInvalid)
	}
	if err := checkAllow(f.Allow); err != nil {
		return err
	}
	return nil
}

// network maps p's network mode to the sandbox's (the contract's "" is NetworkAllowAll):
// disabled is egress None; allowed is All, or with Allow set an Allowlist of exactly it. The
// operator holds a sandbox whose egress relies on NetworkPolicy (None, Allowlist) not Ready
// where it cannot prove NetworkPolicy is enforced on its node, and CreateSession checks its
// NetworkEnforced condition itself (recoverEnforced): it fails closed there with a
// PolicyCompatibilityError naming the cause.
func (f *Agentbox) network(p Policy) *agentbox.NetworkSpec {
	switch {
	case p.NetworkModeOrDefault() == NetworkDisabled:
		return &agentbox.NetworkSpec{Egress: "None"}
	case len(f.Allow) > 0:
		allow := append([]agentbox.EgressAllow(nil), f.Allow...)
		for i, a := range allow {
			// A copy of the credential too: the spec shares nothing with the factory.
			if a.Credential != nil {
				c := *a.Credential
				allow[i].Credential = &c
			}
		}
		return &agentbox.NetworkSpec{Egress: "Allowlist", Allow: allow}
	}
	return &agentbox.NetworkSpec{Egress: "All"}
}

// egress is the sandbox's egress for p ([Agentbox.network]'s).
func (f *Agentbox) egress(p Policy) string { return f.network(p).Egress }

// reliesOnPolicy says whether p's sandbox is confined by a NetworkPolicy (egress None or
// Allowlist): then it is only used where enforcement is proven or attested.
func (f *Agentbox) reliesOnPolicy(p Policy) bool { return f.egress(p) != "All" }

// CreateSession is Open as a Session.
func (f *Agentbox) CreateSession(ctx context.Context, p Policy) (Session, error) {
	s, err := f.Open(ctx, p)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Open gets or creates the scope's Sandbox for p, takes the scope's guard, waits until the
// sandbox serves and starts its persistent shell.
func (f *Agentbox) Open(ctx context.Context, p Policy) (*AgentboxSession, error) {
	if err := f.Supported(p); err != nil {
		return nil, err
	}
	spec := agentbox.SandboxSpec{
		Image:           f.Image,
		ImagePullPolicy: f.ImagePullPolicy,
		Workspace:       &agentbox.WorkspaceSpec{Root: f.root()},
		Network:         f.network(p),
	}
	sbx, err := f.Sandboxes.GetOrCreate(ctx, f.Scope, spec)
	if err != nil {
		return nil, err
	}
	// A sandbox made earlier for the scope under another policy would not honour this one.
	if got := sbx.WorkspaceRoot(); got != f.root() {
		return nil, f.incompatible(p, "Filesystem", fmt.Sprintf("the scope's sandbox %s has its workspace at %s", sbx.Name(), got))
	}
	if got := sbx.Egress(); got != f.egress(p) {
		return nil, f.incompatible(p, "Network.Mode", fmt.Sprintf("the scope's sandbox %s has egress %s", sbx.Name(), got))
	}
	gcfg := f.Guard
	if gcfg.Wait == 0 {
		gcfg.Wait = 30 * time.Second
	}
	g := sbx.Guard(gcfg)
	if err := g.Acquire(ctx); err != nil {
		return nil, err
	}
	s, err := f.start(ctx, p, sbx, g)
	if err != nil {
		_ = g.Release(context.Background())
		return nil, err
	}
	return s, nil
}

func (f *Agentbox) start(ctx context.Context, p Policy, sbx *agentbox.Sandbox, g *agentbox.Guard) (*AgentboxSession, error) {
	wait := f.ReadyTimeout
	if wait == 0 {
		wait = 2 * time.Minute
	}
	// Recover, not only WaitReady: a status still Ready from a pod being deleted (the last
	// session's end) is not a sandbox that serves. With the network disabled, only where the
	// operator has NetworkPolicy proven enforced (fail closed).
	if err := f.recoverEnforced(ctx, p, sbx, wait); err != nil {
		return nil, err
	}
	wd, err := f.workingDir(p)
	if err != nil {
		return nil, f.incompatible(p, "Filesystem.WorkingDir", err.Error())
	}
	life, stop := context.WithCancel(g.Context())
	gone, err := sbx.Gone(life)
	if err != nil {
		stop()
		return nil, err
	}
	sh := sbx.Session(wd)
	if wd != sbx.WorkspaceRoot() {
		if err := sbx.Mkdir(ctx, wd); err != nil {
			stop()
			return nil, err
		}
	}
	if err := sh.Start(ctx); err != nil {
		stop()
		return nil, err
	}
	hostDir, err := sbx.HostDir(ctx)
	if err != nil {
		stop()
		return nil, err
	}
	s := &AgentboxSession{
		policy: p, root: f.root(), sbx: sbx, guard: g, shell: sh, wd: wd, maxOutput: f.MaxOutput,
		life: life, stop: stop, done: make(chan struct{}), procs: map[*process]struct{}{},
	}
	s.fs = &Files{s: s}
	// The host directory is pinned now (an open descriptor), when the runner sees it: see
	// ResolvePath.
	s.host, s.hostErr = openHostRoot(hostDir)
	go func() {
		select {
		case <-gone:
		case <-life.Done():
		}
		s.end()
	}()
	return s, nil
}

// AgentboxSession is the Session of an agentbox Sandbox; Open gives it with its extras (FS,
// ResolvePath).
type AgentboxSession struct {
	policy    Policy
	root      string
	sbx       *agentbox.Sandbox
	guard     *agentbox.Guard
	shell     *agentbox.Session
	wd        string
	maxOutput int
	host      *hostRoot // the workspace's directory on this host, pinned (nil: not here)
	hostErr   error     // why host is nil
	fs        *Files
	life      context.Context
	stop      context.CancelFunc
	done      chan struct{}
	once      sync.Once
	closed    sync.Once

	mu    sync.Mutex
	env   map[string]string // RefreshEnv's updates
	procs map[*process]struct{}
	ended []string // the AGENTBOX_PROCESS ids of started processes that have ended
}

var (
	_ Session      = (*AgentboxSession)(nil)
	_ EnvRefresher = (*AgentboxSession)(nil)
)

func (s *AgentboxSession) end() { s.once.Do(func() { close(s.done) }) }

// Policy is the policy the session was created with.
func (s *AgentboxSession) Policy() Policy { return s.policy }

// WorkingDir is the working directory in the sandbox.
func (s *AgentboxSession) WorkingDir() string { return s.wd }

// Sandbox is the session's Sandbox.
func (s *AgentboxSession) Sandbox() *agentbox.Sandbox { return s.sbx }

// Done is closed when the session ends: closed, its sandbox or pod gone, or its guard lost.
func (s *AgentboxSession) Done() <-chan struct{} { return s.done }

// Alive reports whether the session is still active.
func (s *AgentboxSession) Alive() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// RefreshEnv updates the environment later commands and processes get (over the policy's).
func (s *AgentboxSession) RefreshEnv(updates map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.env == nil {
		s.env = map[string]string{}
	}
	for k, v := range updates {
		s.env[k] = v
	}
}

// bound is ctx, also cancelled when the session ends (its guard lost, its pod gone).
func (s *AgentboxSession) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.life, cancel)
	return ctx, func() { stop(); cancel() }
}

// resolve is a sandbox path (relative to the working directory, or absolute under the
// root), confined lexically to the root.
func (s *AgentboxSession) resolve(p string) (string, error) {
	return confineTo(s.root, s.wd, p)
}

func confineTo(root, wd, p string) (string, error) {
	if p == "" {
		return wd, nil
	}
	if !strings.HasPrefix(p, "/") {
		p = wd + "/" + p
	}
	return agentbox.Confine(root, p)
}

func (s *AgentboxSession) envFor(extra map[string]string) (map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	env := make(map[string]string, len(s.policy.Env)+len(s.env)+len(extra))
	for _, m := range []map[string]string{s.policy.Env, s.env, extra} {
		for k, v := range m {
			if !agentbox.IsEnvName(k) {
				return nil, fmt.Errorf("%w: %q is not an environment variable name", agentbox.ErrInvalid, k)
			}
			env[k] = v
		}
	}
	return env, nil
}

// Exec runs a shell command line in the session's persistent shell and waits for it. A
// timeout kills the command's process group and is an error (agentbox.ErrExecTimeout,
// *agentbox.ExecTimeoutError) returned with the result so far; an output longer than the
// cap is an error (ErrOutputTruncated, *agentbox.OutputTruncatedError) returned with the
// output up to the cap.
func (s *AgentboxSession) Exec(ctx context.Context, command string, opts ExecOptions) (ExecResult, error) {
	if !s.Alive() {
		return ExecResult{}, ErrClosed
	}
	wd, err := s.resolve(opts.Cwd)
	if err != nil {
		return ExecResult{}, err
	}
	env, err := s.envFor(opts.Env)
	if err != nil {
		return ExecResult{}, err
	}
	o := agentbox.ExecOptions{Env: env, Workdir: wd, Timeout: opts.Timeout, MaxOutput: s.maxOutput, FailTruncated: true}
	if o.Timeout == 0 {
		o.Timeout = s.policy.Timeout
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	r, err := s.shell.Run(ctx, command, o)
	if r != nil {
		// A timeout or a truncation: the result comes with its error.
		return result(r), err
	}
	if s.life.Err() != nil {
		return ExecResult{}, fmt.Errorf("%w: %v", ErrClosed, err)
	}
	return ExecResult{}, err
}

func result(r *agentbox.ExecResult) ExecResult {
	return ExecResult{Stdout: string(r.Stdout), Stderr: string(r.Stderr), ExitCode: r.ExitCode}
}

// StartProcess starts Path with Args, its stdin, stdout and stderr streamed (a streaming
// exec). Close ends it and what it started in the pod; so does the session's Close.
func (s *AgentboxSession) StartProcess(ctx context.Context, req ProcessRequest) (ProcessHandle, error) {
	if !s.Alive() {
		return nil, ErrClosed
	}
	if req.Path == "" {
		return nil, fmt.Errorf("%w: ProcessRequest.Path is empty", agentbox.ErrInvalid)
	}
	wd, err := s.resolve(req.Cwd)
	if err != nil {
		return nil, err
	}
	env, err := s.envFor(req.Env)
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.bound(ctx)
	argv := append([]string{req.Path}, req.Args...)
	p, err := s.sbx.Start(ctx, argv, agentbox.ExecOptions{Env: env, Workdir: wd, Timeout: req.Timeout})
	if err != nil {
		cancel()
		return nil, err
	}
	h := &process{p: p, s: s}
	s.mu.Lock()
	s.procs[h] = struct{}{}
	s.mu.Unlock()
	go func() {
		<-p.Done()
		cancel()
		s.mu.Lock()
		delete(s.procs, h)
		s.ended = append(s.ended, p.ID())
		s.mu.Unlock()
	}()
	return h, nil
}

type process struct {
	p *agentbox.Process
	s *AgentboxSession
}

func readCloser(r io.Reader) io.ReadCloser {
	if rc, ok := r.(io.ReadCloser); ok {
		return rc
	}
	return io.NopCloser(r)
}

func (h *process) Stdin() io.WriteCloser      { return h.p.Stdin }
func (h *process) Stdout() io.ReadCloser      { return readCloser(h.p.Stdout) }
func (h *process) Stderr() io.ReadCloser      { return readCloser(h.p.Stderr) }
func (h *process) Close() error               { return h.p.Kill() }
func (h *process) ID() string                 { return h.p.ID() }
func (h *process) Process() *agentbox.Process { return h.p }

// PID is the process's id in the pod (-1 when it cannot be found: ended, or the pod gone).
func (h *process) PID() int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pid, err := h.p.PID(ctx)
	if err != nil {
		return -1
	}
	return pid
}

// Wait waits for the process's end (or ctx): its exit code (137 when killed).
func (h *process) Wait(ctx context.Context) (ExecResult, error) {
	select {
	case <-h.p.Done():
	case <-ctx.Done():
		return ExecResult{ExitCode: -1}, ctx.Err()
	}
	st, err := h.p.Wait()
	if err != nil {
		return ExecResult{ExitCode: -1}, err
	}
	if !st.HasCode {
		return ExecResult{ExitCode: -1}, fmt.Errorf("the process ended without an exit code: %s", st.Message)
	}
	return ExecResult{ExitCode: st.Code}, nil
}

// Close ends the session: the processes it started (killed in the pod, with what they
// started), its shell, its watches, the host directory it pinned, and the scope's guard
// (released).
func (s *AgentboxSession) Close() error {
	var err error
	s.closed.Do(func() {
		s.mu.Lock()
		procs := make([]*process, 0, len(s.procs))
		for h := range s.procs {
			procs = append(procs, h)
		}
		ended := s.ended
		s.mu.Unlock()
		var wg sync.WaitGroup
		errs := make([]error, len(procs)+1)
		for i, h := range procs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = h.p.Kill() }()
		}
		if len(ended) > 0 && s.Alive() {
			// What the ended ones started may live on (a daemon of an ended command).
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				errs[len(procs)] = s.sbx.KillProcesses(ctx, ended...)
			}()
		}
		wg.Wait()
		_ = s.shell.Close()
		s.stop()
		s.end()
		if s.host != nil {
			s.host.close()
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		errs = append(errs, s.guard.Release(ctx))
		err = errors.Join(errs...)
	})
	return err
}

// ResolvePath gives a host path for a sandbox path (relative to the working directory, or
// absolute under the root) when this process runs on the sandbox's node; elsewhere (the
// usual case) ErrNoHostPath: use Files() or FS().
//
// The path must exist, and no component of it may be a symlink (a symlink made in the
// sandbox could lead anywhere on the node): those are refused (agentbox.ErrPath;
// fs.ErrNotExist for a missing one: create files through Files()). The path returned is
// /proc/<pid>/fd/<n> of a descriptor this session opened on the file beneath the workspace's
// pinned directory in one step (openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, or a
// component-by-component O_NOFOLLOW walk): opening it opens that very file, whatever is
// renamed or swapped for a symlink in the workspace afterwards. It is valid in this process
// (and its children) until Close. A path joined beneath a returned directory is not covered:
// resolve each path.
func (s *AgentboxSession) ResolvePath(p string) (string, error) {
	if !s.Alive() {
		return "", ErrClosed
	}
	return resolveHost(s.host, s.hostErr, s.root, s.wd, p)
}

func resolveHost(h *hostRoot, hostErr error, root, wd, p string) (string, error) {
	abs, err := confineTo(root, wd, p)
	if err != nil {
		return "", err
	}
	if h == nil {
		return "", hostErr
	}
	rel := strings.TrimPrefix(strings.TrimPrefix(abs, root), "/")
	return h.resolve(rel, p)
}

// Files is the session's file access over the API server (paths as for ResolvePath).
func (s *AgentboxSession) Files() FileAccess { return s.fs }

// FS is Files with all its methods (Remove, Mkdir...), no type assertion needed.
func (s *AgentboxSession) FS() *Files { return s.fs }

// Files is a session's file access over the API server, in sandbox paths (relative to the
// working directory, or absolute under the root; '..' and symlinks leading out are
// refused). Errors are *fs.PathError, with fs.ErrNotExist for a missing file.
type Files struct{ s *AgentboxSession }

var _ FileAccess = (*Files)(nil)

func (f *Files) ctx() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	c2, c := f.s.bound(ctx)
	return c2, func() { c(); cancel() }
}

// ReadFile is a file's content.
func (f *Files) ReadFile(name string) ([]byte, error) {
	p, err := f.s.resolve(name)
	if err != nil {
		return nil, fsErr("read", name, err)
	}
	ctx, cancel := f.ctx()
	defer cancel()
	b, err := f.s.sbx.ReadFile(ctx, p)
	return b, fsErr("read", name, err)
}

// WriteFile writes a file atomically, creating its parents (mode 0: the default).
func (f *Files) WriteFile(name string, data []byte, perm fs.FileMode) error {
	p, err := f.s.resolve(name)
	if err != nil {
		return fsErr("write", name, err)
	}
	ctx, cancel := f.ctx()
	defer cancel()
	return fsErr("write", name, f.s.sbx.WriteFile(ctx, p, data, perm&fs.ModePerm))
}

// Stat says whether a path is a directory, and its size.
func (f *Files) Stat(name string) (FileInfo, error) {
	e, err := f.Lstat(name)
	if err != nil {
		return FileInfo{}, err
	}
	return FileInfo{IsDir: e.Kind == agentbox.KindDir, Size: e.Size}, nil
}

// Lstat is agentbox's entry for a path: kind, size, mode and modification time.
func (f *Files) Lstat(name string) (agentbox.DirEntry, error) {
	p, err := f.s.resolve(name)
	if err != nil {
		return agentbox.DirEntry{}, fsErr("stat", name, err)
	}
	ctx, cancel := f.ctx()
	defer cancel()
	e, err := f.s.sbx.Stat(ctx, p)
	return e, fsErr("stat", name, err)
}

// ReadDir lists a directory, sorted by name.
func (f *Files) ReadDir(name string) ([]DirEntry, error) {
	p, err := f.s.resolve(name)
	if err != nil {
		return nil, fsErr("readdir", name, err)
	}
	ctx, cancel := f.ctx()
	defer cancel()
	es, err := f.s.sbx.ReadDir(ctx, p)
	if err != nil {
		return nil, fsErr("readdir", name, err)
	}
	out := make([]DirEntry, len(es))
	for i, e := range es {
		out[i] = DirEntry{Name: e.Name, IsDir: e.Kind == agentbox.KindDir, Size: e.Size}
	}
	return out, nil
}

// Remove removes a file or an empty directory; RemoveAll a whole tree.
func (f *Files) Remove(name string) error { return f.remove(name, false) }

// RemoveAll removes a path and everything under it.
func (f *Files) RemoveAll(name string) error { return f.remove(name, true) }

func (f *Files) remove(name string, all bool) error {
	p, err := f.s.resolve(name)
	if err != nil {
		return fsErr("remove", name, err)
	}
	ctx, cancel := f.ctx()
	defer cancel()
	return fsErr("remove", name, f.s.sbx.Remove(ctx, p, all))
}

// Mkdir makes a directory and its parents.
func (f *Files) Mkdir(name string) error {
	p, err := f.s.resolve(name)
	if err != nil {
		return fsErr("mkdir", name, err)
	}
	ctx, cancel := f.ctx()
	defer cancel()
	return fsErr("mkdir", name, f.s.sbx.Mkdir(ctx, p))
}

// ProjectFiles writes files under dir (each Path relative to it, without '..'): one that
// exists with the same content and mode is left as it is, one that exists otherwise is
// ErrProjectionConflict (checked for every file before any is written).
func (f *Files) ProjectFiles(dir string, files []ProjectedFile) error {
	base, err := f.s.resolve(dir)
	if err != nil {
		return fsErr("project", dir, err)
	}
	ctx, cancel := f.ctx()
	defer cancel()
	var todo []ProjectedFile
	for _, pf := range files {
		if pf.Path == "" || strings.HasPrefix(pf.Path, "/") {
			return fsErr("project", pf.Path, fmt.Errorf("%w: a projected path must be relative", agentbox.ErrInvalid))
		}
		p, err := agentbox.Confine(f.s.root, path.Join(base, pf.Path))
		if err != nil {
			return fsErr("project", pf.Path, err)
		}
		e, err := f.s.sbx.Stat(ctx, p)
		switch {
		case errors.Is(err, agentbox.ErrFileNotFound):
			todo = append(todo, ProjectedFile{Path: p, Content: pf.Content, Mode: pf.Mode})
			continue
		case err != nil:
			return fsErr("project", pf.Path, err)
		}
		if e.Kind != agentbox.KindFile || (pf.Mode != 0 && fs.FileMode(e.Mode)&fs.ModePerm != pf.Mode&fs.ModePerm) {
			return fsErr("project", pf.Path, ErrProjectionConflict)
		}
		b, err := f.s.sbx.ReadFile(ctx, p)
		if err != nil {
			return fsErr("project", pf.Path, err)
		}
		if !bytes.Equal(b, pf.Content) {
			return fsErr("project", pf.Path, ErrProjectionConflict)
		}
	}
	for _, pf := range todo {
		if err := f.s.sbx.WriteFile(ctx, pf.Path, pf.Content, pf.Mode&fs.ModePerm); err != nil {
			return fsErr("project", pf.Path, err)
		}
	}
	return nil
}

// fsErr is a *fs.PathError, with fs.ErrNotExist for a missing file, so os-style callers
// (errors.Is(err, fs.ErrNotExist)) work.
func fsErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, agentbox.ErrFileNotFound) {
		err = fmt.Errorf("%w: %w", fs.ErrNotExist, err)
	}
	return &fs.PathError{Op: op, Path: name, Err: err}
}
