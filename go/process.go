package agentbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ProcessEnv names the environment entry Start gives every process it runs:
// AGENTBOX_PROCESS=<id>, a random id of its own. The processes it starts inherit it, which is
// how Kill finds the process and its children in the pod (whatever their process group; a
// child that scrubs its environment is not found).
const ProcessEnv = "AGENTBOX_PROCESS"

// killWait bounds Kill: the kill exec, then the end of the process's exec stream.
const killWait = 30 * time.Second

// ErrProcessKilled is what reads of a killed Process's stdout and stderr return.
var ErrProcessKilled = errors.New("agentbox: process killed")

// Process is a command started with Sandbox.Start: its stdin, stdout and stderr are streams
// (stdio MCP servers run this way). Its stdin is streamed to the command until Stdin is
// closed; stdout and stderr end with the command, checked whole by the exec frame's trailer.
type Process struct {
	// Stdin writes to the command; Close half-closes it (the command sees EOF).
	Stdin io.WriteCloser
	// Stdout and Stderr read the command's output; read both, or the command stalls once
	// their pipes are full. They are io.ReadClosers: closing one drops the rest of it.
	Stdout, Stderr io.Reader

	sbx     *Sandbox
	id      string
	cancel  context.CancelFunc
	done    chan struct{}
	once    sync.Once
	killErr error
	killed  atomic.Bool
	outR    *io.PipeReader
	errR    *io.PipeReader
	result  ExitStatus
	err     error
	pidOnce sync.Once
	pid     int
	pidErr  error
}

// procOut writes a process's output to its pipe until the process is killed, then drops it
// (nobody reads a killed process's output, and the exec stream must still reach its end).
type procOut struct {
	w      *io.PipeWriter
	killed *atomic.Bool
}

func (o procOut) Write(p []byte) (int, error) {
	if o.killed.Load() {
		return len(p), nil
	}
	n, err := o.w.Write(p)
	if err != nil && (o.killed.Load() || errors.Is(err, io.ErrClosedPipe)) {
		// Killed, or the reader closed its end: the rest is dropped, the stream read on.
		return len(p), nil
	}
	return n, err
}

// procIn reads a process's output pipe; once the process is killed, reads fail with
// ErrProcessKilled. Close closes the pipe (the output that still comes is dropped).
type procIn struct {
	r      *io.PipeReader
	killed *atomic.Bool
}

func (i procIn) Read(b []byte) (int, error) {
	n, err := i.r.Read(b)
	if err != nil && i.killed.Load() {
		return n, ErrProcessKilled
	}
	return n, err
}

func (i procIn) Close() error { return i.r.Close() }

// Start starts argv in the sandbox's pod with streamed stdio (opts.Stdin is ignored: write
// to Process.Stdin). The process and what it starts carry ProcessEnv, so Kill ends them all.
func (b *Sandbox) Start(ctx context.Context, argv []string, opts ExecOptions) (*Process, error) {
	id := NewMark()[len(MarkPrefix):]
	id = id[:len(id)-1]
	f := opts.frame(argv, b.WorkspaceRoot())
	env := make([]EnvVar, 0, len(f.Env)+1)
	for _, e := range f.Env {
		if e.Name != ProcessEnv {
			env = append(env, e)
		}
	}
	f.Env = append(env, EnvVar{ProcessEnv, id})
	if err := f.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	p := &Process{Stdin: inW, sbx: b, id: id, cancel: cancel, done: make(chan struct{}), outR: outR, errR: errR}
	p.Stdout, p.Stderr = procIn{outR, &p.killed}, procIn{errR, &p.killed}
	r, err := b.sbs.Client.ws.start(ctx, b.Namespace(), b.PodName(), execCall{frame: f, stdin: inR, stdinLen: -1, stdout: procOut{outW, &p.killed}, stderr: procOut{errW, &p.killed}})
	if err != nil {
		cancel()
		return nil, err
	}
	go func() {
		oc, err := r.wait()
		p.result, p.err = oc.status, err
		if err == nil {
			err = io.EOF
		}
		outW.CloseWithError(err)
		errW.CloseWithError(err)
		inR.CloseWithError(io.ErrClosedPipe)
		close(p.done)
	}()
	return p, nil
}

// Wait waits for the command's end: its exit status, or why it is unknown (ErrOutputCut,
// ErrTransport...). A killed command's status is that of SIGKILL (137).
func (p *Process) Wait() (ExitStatus, error) {
	<-p.done
	return p.result, p.err
}

// Done is closed when the command has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// ID is the process's ProcessEnv value.
func (p *Process) ID() string { return p.id }

// Kill ends the command and every process it started that carries its ProcessEnv entry, in
// the pod (a second exec sends them SIGKILL), then closes its stdin and waits for its exec
// stream to end (at most 30 s; then the connection is dropped). Reads of Stdout and Stderr
// fail with ErrProcessKilled from then on. The error is the kill exec's, if it failed; Wait
// has the command's end.
func (p *Process) Kill() error {
	p.once.Do(func() {
		p.killed.Store(true)
		p.outR.CloseWithError(ErrProcessKilled)
		p.errR.CloseWithError(ErrProcessKilled)
		ctx, cancel := context.WithTimeout(context.Background(), killWait)
		defer cancel()
		// Also when the command has ended: what it started may live on.
		p.killErr = p.sbx.KillProcesses(ctx, p.id)
		_ = p.Stdin.Close()
		select {
		case <-p.done:
		case <-ctx.Done():
			p.cancel()
			<-p.done
		}
	})
	return p.killErr
}

// PID is the command's process id in the pod (found by its ProcessEnv entry: the process
// carrying it whose parent does not; of several, the oldest: with a timeout the wrapper's
// watchdog sleep carries it too, started after the command). ErrNotFound once it has ended.
func (p *Process) PID(ctx context.Context) (int, error) {
	p.pidOnce.Do(func() {
		for i := 0; ; i++ {
			pids, err := p.sbx.processList(ctx, p.id)
			if err != nil {
				p.pidErr = err
				return
			}
			mine := map[int]bool{}
			for _, pp := range pids {
				mine[pp[0]] = true
			}
			for _, pp := range pids {
				if !mine[pp[1]] && (p.pid == 0 || pp[0] < p.pid) {
					p.pid = pp[0]
				}
			}
			if p.pid != 0 {
				return
			}
			// Not exec'd yet (the wrapper forks, then execs the command), or ended.
			select {
			case <-p.done:
				p.pidErr = fmt.Errorf("%w: process %s has ended", ErrNotFound, p.id)
				return
			case <-ctx.Done():
				p.pidErr = fmt.Errorf("%w: %v", ErrTransport, ctx.Err())
				return
			case <-time.After(time.Duration(i+1) * 20 * time.Millisecond):
			}
		}
	})
	return p.pid, p.pidErr
}

// KillProcesses sends SIGKILL, in the pod, to every process carrying ProcessEnv=<id> for
// one of ids (ScriptProcesses).
func (b *Sandbox) KillProcesses(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	r, err := b.fileExec(ctx, append([]string{"sh", "-c", ScriptProcesses, "agentbox-processes", "kill"}, ids...), nil, 64<<10)
	if err != nil {
		return err
	}
	if r.ExitCode != 0 {
		return &RemoteError{ExitCode: r.ExitCode, Stderr: strings.TrimSpace(string(r.Stderr))}
	}
	return nil
}

// processList is "<pid> <ppid>" of each process carrying ProcessEnv=<id>.
func (b *Sandbox) processList(ctx context.Context, id string) ([][2]int, error) {
	r, err := b.fileExec(ctx, []string{"sh", "-c", ScriptProcesses, "agentbox-processes", "list", id}, nil, 1<<20)
	if err != nil {
		return nil, err
	}
	if r.ExitCode != 0 {
		return nil, &RemoteError{ExitCode: r.ExitCode, Stderr: strings.TrimSpace(string(r.Stderr))}
	}
	var out [][2]int
	for _, line := range strings.Split(strings.TrimSpace(string(r.Stdout)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		a, err1 := strconv.Atoi(f[0])
		c, err2 := strconv.Atoi(f[1])
		if err1 == nil && err2 == nil {
			out = append(out, [2]int{a, c})
		}
	}
	return out, nil
}
