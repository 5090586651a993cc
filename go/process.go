package agentbox

import (
	"context"
	"io"
	"sync"
)

// Process is a command started with Sandbox.Start: its stdin, stdout and stderr are streams
// (stdio MCP servers run this way). Its stdin is streamed to the command until Stdin is
// closed; stdout and stderr end with the command, checked whole by the exec frame's trailer.
type Process struct {
	// Stdin writes to the command; Close half-closes it (the command sees EOF).
	Stdin io.WriteCloser
	// Stdout and Stderr read the command's output; read both, or the command stalls once
	// their pipes are full.
	Stdout, Stderr io.Reader

	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
	result ExitStatus
	err    error
}

// Start starts argv in the sandbox's pod with streamed stdio (opts.Stdin is ignored: write
// to Process.Stdin).
func (b *Sandbox) Start(ctx context.Context, argv []string, opts ExecOptions) (*Process, error) {
	f := opts.frame(argv, b.WorkspaceRoot())
	if err := f.validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	r, err := b.sbs.Client.ws.start(ctx, b.Namespace(), b.PodName(), execCall{frame: f, stdin: inR, stdinLen: -1, stdout: outW, stderr: errW})
	if err != nil {
		cancel()
		return nil, err
	}
	p := &Process{Stdin: inW, Stdout: outR, Stderr: errR, cancel: cancel, done: make(chan struct{})}
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
// ErrTransport...).
func (p *Process) Wait() (ExitStatus, error) {
	<-p.done
	return p.result, p.err
}

// Done is closed when the command has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// Kill closes the command's stdin and its connection. A command that reads its stdin ends
// at the EOF; one with a timeout is killed by the watchdog at the latest.
func (p *Process) Kill() error {
	p.once.Do(func() {
		_ = p.Stdin.Close()
		p.cancel()
	})
	return nil
}
