package agentbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	gws "github.com/gorilla/websocket"
)

// maxTrailer is the longest trailer accepted after an end sentinel.
const maxTrailer = 32

// ShQuote single-quotes s for sh.
func ShQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// SessionArgv is what a persistent shell runs for one command: the argv itself when it needs
// no prologue, else the wrapper with an empty MARK (no trailer, no linger: the shell stays
// alive, so nothing is cut) and no stdin.
func SessionArgv(f Frame) ([]string, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	if f.bare() {
		return append([]string(nil), f.Argv...), nil
	}
	return RemoteArgv(f, "", StdinNone)
}

// CommandLine is the line written to the shell for one command (vectors:
// session.command_lines): a start sentinel on stdout, the command in a subshell with stdin
// from /dev/null, an end sentinel with $? on stdout and one on stderr.
func CommandLine(argv []string, mark string) string {
	q := make([]string, len(argv))
	for i, a := range argv {
		q[i] = ShQuote(a)
	}
	// The end sentinel carries $?, and "!" after it when the command died of SIGKILL with the
	// container's OOM kill counter risen meanwhile.
	return fmt.Sprintf("printf '%%s+\\n' '%s'; %s _ab_o=$_ab_k; ( exec %s ) </dev/null; _ab_r=$?; _ab_m=; if [ $_ab_r = 137 ] && [ -n \"$_ab_o\" ]; then %s [ -n \"$_ab_k\" ] && [ \"$_ab_k\" -gt \"$_ab_o\" ] 2>/dev/null && _ab_m='%s'; fi; printf '%%s%%d%%s\\n' '%s' \"$_ab_r\" \"$_ab_m\"; printf '%%s\\n' '%s' >&2\n",
		mark, SessionOOM, strings.Join(q, " "), SessionOOM, MemoryFlag, mark, mark)
}

// Framer parses one command's frame on one stream (vectors: session.framing): it skips to the
// start sentinel (if any), collects output (capped) up to the end sentinel, then takes the
// text up to the next newline as the trailer. Memory stays bounded by the cap plus a
// sentinel's length.
type Framer struct {
	start []byte // nil once seen (or when there is none)
	end   []byte
	buf   []byte
	out   capped
}

// NewFramer is a framer; start "" means no start sentinel.
func NewFramer(start, end string, cap int) *Framer {
	f := &Framer{end: []byte(end), out: capped{cap: cap}}
	if start != "" {
		f.start = []byte(start)
	}
	return f
}

// Out is the output collected so far; Truncated whether the cap dropped some.
func (f *Framer) Out() []byte { return f.out.buf }

// Truncated reports whether the cap dropped output.
func (f *Framer) Truncated() bool { return f.out.truncated }

// AwaitingStart reports whether the start sentinel is still to come.
func (f *Framer) AwaitingStart() bool { return f.start != nil }

// Feed takes bytes; once the frame is complete it returns done, the trailer and the bytes
// after the frame.
func (f *Framer) Feed(data []byte) (done bool, trailer string, rest []byte, err error) {
	f.buf = append(f.buf, data...)
	if f.start != nil {
		p := bytes.Index(f.buf, f.start)
		if p < 0 {
			// Stray output of earlier commands' background jobs: dropped, keeping a possible
			// sentinel prefix.
			keep := min(len(f.start)-1, len(f.buf))
			f.buf = append(f.buf[:0], f.buf[len(f.buf)-keep:]...)
			return false, "", nil, nil
		}
		f.buf = f.buf[p+len(f.start):]
		f.start = nil
	}
	p := bytes.Index(f.buf, f.end)
	if p < 0 {
		keep := min(len(f.end)-1, len(f.buf))
		n := len(f.buf) - keep
		_, _ = f.out.Write(f.buf[:n])
		f.buf = append([]byte(nil), f.buf[n:]...)
		return false, "", nil, nil
	}
	_, _ = f.out.Write(f.buf[:p])
	after := f.buf[p+len(f.end):]
	nl := bytes.IndexByte(after, '\n')
	if nl < 0 {
		if len(after) > maxTrailer {
			return false, "", nil, fmt.Errorf("%w: malformed frame trailer from the shell", ErrSession)
		}
		f.buf = append([]byte(nil), f.buf[p:]...)
		return false, "", nil, nil
	}
	trailer = string(after[:nl])
	rest = append([]byte(nil), after[nl+1:]...)
	f.buf = nil
	return true, trailer, rest, nil
}

// Session is a persistent shell in one sandbox pod: one long-lived sh over one exec, for tool
// loops where a new exec per command costs too much. Commands run one at a time; state does
// not carry over between them (use Workdir and Env). A shell found dead before a command
// starts is replaced and the command sent again (once); one that dies while a command runs
// fails it with ErrSession.
type Session struct {
	sb  *Sandbox
	cwd string
	mu  sync.Mutex
	sh  *shell
}

type shell struct {
	w          *wsExec
	done       chan struct{}
	events     chan chanEvent
	outPending []byte
	errPending []byte
}

// Session is a persistent shell whose commands run in cwd ("" : the workspace root). It
// starts with its first command; Close ends it.
func (b *Sandbox) Session(cwd string) *Session {
	if cwd == "" {
		cwd = b.WorkspaceRoot()
	}
	return &Session{sb: b, cwd: cwd}
}

var errNotStarted = errors.New("the command did not start")

// sessionShell is the argv of a session's shell: sh started in cwd, so that a command
// without its own Workdir needs no wrapper (no extra sh per command); a cwd it cannot enter
// ends it at once (sh says why on stderr).
func sessionShell(cwd string) []string {
	if cwd == "" {
		return []string{"sh"}
	}
	return []string{"sh", "-c", scriptSessionShell, "sh", cwd}
}

func (s *Session) spawn(ctx context.Context) (*shell, error) {
	conn, err := s.sb.sbs.Client.ws.dial(ctx, s.sb.Namespace(), s.sb.PodName(), SandboxContainer, sessionShell(s.cwd))
	if err != nil {
		return nil, err
	}
	sh := &shell{w: &wsExec{conn: conn}, events: make(chan chanEvent, 64), done: make(chan struct{})}
	go func() {
		defer close(sh.events)
		for {
			typ, data, err := conn.ReadMessage()
			var ev chanEvent
			switch {
			case err != nil:
				ev = chanEvent{err: err}
			case typ != gws.BinaryMessage || len(data) < 1:
				continue
			default:
				ev = chanEvent{ch: data[0], data: data[1:]}
			}
			select {
			case sh.events <- ev:
			case <-sh.done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	return sh, nil
}

// Start starts the shell now rather than with the first command.
func (s *Session) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sh != nil {
		return nil
	}
	sh, err := s.spawn(ctx)
	if err != nil {
		return err
	}
	s.sh = sh
	return nil
}

// Run runs one shell command line (sh -c command) in the session; see Exec.
func (s *Session) Run(ctx context.Context, command string, opts ExecOptions) (*ExecResult, error) {
	return s.Exec(ctx, []string{"sh", "-c", command}, opts)
}

// Exec runs argv in the shell (no stdin: use a one-shot exec for that). A timeout kills the
// command's process group as in a one-shot exec and returns an ExecTimeoutError.
func (s *Session) Exec(ctx context.Context, argv []string, opts ExecOptions) (*ExecResult, error) {
	if opts.Stdin != nil {
		return nil, invalidf("a session command reads no stdin; use Sandbox.Exec")
	}
	// The shell already runs in s.cwd: only a Workdir of the command's own is sent.
	f := opts.frame(argv, "")
	args, err := SessionArgv(f)
	if err != nil {
		return nil, err
	}
	limit := opts.MaxOutput
	if limit < 0 {
		return nil, invalidf("MaxOutput must not be negative")
	}
	if limit == 0 {
		limit = DefaultMaxOutput
	}
	mark := NewMark()
	line := CommandLine(args, mark)
	since := time.Now()
	res, err := s.run(ctx, line, mark, f.Timeout, limit)
	if err != nil {
		// A shell that died with its container: the kubelet may say it was out of memory.
		return nil, s.sb.explainFailure(ctx, since, err)
	}
	return res, opts.verdict(res, f.Timeout, limit)
}

func (s *Session) run(ctx context.Context, line, mark string, timeout *time.Duration, limit int) (*ExecResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for attempt := 1; ; attempt++ {
		res, err := s.runOnce(ctx, line, mark, timeout, limit)
		if err == nil {
			return res, nil
		}
		s.drop()
		if errors.Is(err, errNotStarted) && attempt < 2 {
			continue
		}
		if errors.Is(err, errNotStarted) {
			return nil, fmt.Errorf("%w: %v", ErrSession, err)
		}
		return nil, err
	}
}

func (s *Session) drop() {
	if s.sh != nil {
		close(s.sh.done)
		s.sh.w.conn.Close()
		s.sh = nil
	}
}

func (s *Session) runOnce(ctx context.Context, line, mark string, timeout *time.Duration, limit int) (*ExecResult, error) {
	if s.sh == nil {
		sh, err := s.spawn(ctx)
		if err != nil {
			return nil, err
		}
		s.sh = sh
	}
	sh := s.sh
	if err := sh.w.write(StdinChannel, []byte(line)); err != nil {
		return nil, fmt.Errorf("%w: writing the command: %v", errNotStarted, err)
	}
	out := NewFramer(mark+"+\n", mark, limit)
	errF := NewFramer("", mark, limit)
	start := time.Now()
	var deadline <-chan time.Time
	if timeout != nil {
		t := time.NewTimer(*timeout + TimeoutGrace)
		defer t.Stop()
		deadline = t.C
	}
	code, codeDone, errDone := "", false, false
	feed := func(f *Framer, data []byte, isOut bool) error {
		done, tr, rest, err := f.Feed(data)
		if err != nil || !done {
			return err
		}
		if isOut {
			code, codeDone, sh.outPending = tr, true, rest
		} else {
			errDone, sh.errPending = true, rest
		}
		return nil
	}
	if p := sh.outPending; len(p) > 0 {
		sh.outPending = nil
		if err := feed(out, p, true); err != nil {
			return nil, err
		}
	}
	if p := sh.errPending; len(p) > 0 {
		sh.errPending = nil
		if err := feed(errF, p, false); err != nil {
			return nil, err
		}
	}
	died := func() error {
		if out.AwaitingStart() {
			// Named here: what the shell said on stderr may be cut by its exit.
			why := "the shell exited"
			if s.cwd != "" {
				why += " (started in " + s.cwd + ")"
			}
			if said := strings.TrimSpace(string(errF.Out())); said != "" {
				why += ": " + said
			}
			return fmt.Errorf("%w: %s", errNotStarted, why)
		}
		return fmt.Errorf("%w: the shell exited while a command ran; it may have run in part", ErrSession)
	}
	for !codeDone || !errDone {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-deadline:
			return nil, &ExecTimeoutError{Timeout: timeout.Seconds()}
		case ev, ok := <-sh.events:
			if !ok || ev.err != nil {
				return nil, died()
			}
			switch ev.ch {
			case StdoutChannel:
				if codeDone {
					sh.outPending = append(sh.outPending, ev.data...)
				} else if err := feed(out, ev.data, true); err != nil {
					return nil, err
				}
			case StderrChannel:
				if errDone {
					sh.errPending = append(sh.errPending, ev.data...)
				} else if err := feed(errF, ev.data, false); err != nil {
					return nil, err
				}
			case StatusChannel:
				return nil, died()
			}
		}
	}
	res := &ExecResult{Stdout: out.Out(), Stderr: errF.Out(), StdoutTruncated: out.Truncated(), StderrTruncated: errF.Truncated()}
	n, memory, ok := ParseSessionEnd(code)
	switch {
	case !ok:
		res.ExitCode, res.StatusMessage = -1, fmt.Sprintf("unparsable status %q", code)
	case memory:
		return nil, &OutOfMemoryError{}
	default:
		res.ExitCode = n
	}
	res.TimedOut = timeout != nil && time.Since(start) >= *timeout
	return res, nil
}

// Close ends the shell (closing its stdin lets it exit).
func (s *Session) Close() error {
	s.mu.Lock()
	sh := s.sh
	s.sh = nil
	s.mu.Unlock()
	if sh != nil {
		close(sh.done)
		_ = sh.w.closeStdin()
		return sh.w.conn.Close()
	}
	return nil
}
