package agentbox

// Why this file speaks the remote-command protocol itself rather than through client-go's
// remotecommand WebSocket executor: the exec frame (docs/protocol.md) needs the half-close of
// stdin to be sent when both trailers have arrived, not when a reader ends, and the status
// channel read as the vectors state it (the executor parses exit codes strictly, turns a
// status without a code into a bare error and cannot tell "never started" from "no code").
// The connection's TLS, auth and proxies are client-go's (rest.Config, transport).

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync"
	"time"

	gws "github.com/gorilla/websocket"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
)

// wsDialer opens exec connections to one API server.
type wsDialer struct {
	cfg *rest.Config

	once   sync.Once
	tcfg   *transport.Config
	tlsCfg *tls.Config
	err    error
}

// upgrade is client-go's transport/websocket RoundTripper with larger buffers: gorilla splits
// a message larger than its write buffer (client-go's is 32 KiB) into continuation frames,
// which the API server's remote-command endpoint takes for messages of their own; stdin goes
// out in messages of StdinFrame bytes, each in one frame.
type upgrade struct {
	tls   *tls.Config
	proxy func(*http.Request) (*url.URL, error)
	conn  *gws.Conn
}

const wsBuffer = StdinFrame + 1024

func (u *upgrade) RoundTrip(req *http.Request) (*http.Response, error) {
	protocols := req.Header["Sec-Websocket-Protocol"]
	req.Header.Del("Sec-Websocket-Protocol")
	d := gws.Dialer{Proxy: u.proxy, TLSClientConfig: u.tls, Subprotocols: protocols, ReadBufferSize: wsBuffer, WriteBufferSize: wsBuffer}
	switch req.URL.Scheme {
	case "https":
		req.URL.Scheme = "wss"
	case "http":
		req.URL.Scheme = "ws"
	}
	conn, resp, err := d.DialContext(req.Context(), req.URL.String(), req.Header)
	if err != nil {
		if resp != nil && resp.Body != nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			return nil, fmt.Errorf("%v (%s): %s", err, resp.Status, bytes.TrimSpace(body))
		}
		return nil, err
	}
	u.conn = conn
	return resp, nil
}

func (d *wsDialer) dial(ctx context.Context, ns, pod, container string, argv []string) (*gws.Conn, error) {
	d.once.Do(func() {
		d.tcfg, d.err = d.cfg.TransportConfig()
		if d.err == nil {
			d.tlsCfg, d.err = transport.TLSConfigFor(d.tcfg)
		}
	})
	if d.err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTransport, d.err)
	}
	host := d.cfg.Host
	u, err := url.Parse(host)
	if err != nil || u.Scheme == "" {
		u, err = url.Parse("https://" + host)
		if err != nil {
			return nil, fmt.Errorf("%w: bad API server address %q", ErrTransport, host)
		}
	}
	u.Path = fmt.Sprintf("%s/api/v1/namespaces/%s/pods/%s/exec", trimSlash(u.Path), url.PathEscape(ns), url.PathEscape(pod))
	q := url.Values{}
	q.Set("container", container)
	q.Set("stdin", "true")
	q.Set("stdout", "true")
	q.Set("stderr", "true")
	for _, a := range argv {
		q.Add("command", a)
	}
	u.RawQuery = q.Encode()
	proxy := d.cfg.Proxy
	if proxy == nil {
		proxy = http.ProxyFromEnvironment
	}
	up := &upgrade{tls: d.tlsCfg, proxy: proxy}
	rt, err := transport.HTTPWrappersForConfig(d.tcfg, up)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTransport, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTransport, err)
	}
	req.Header["Sec-Websocket-Protocol"] = []string{Protocol}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return nil, fmt.Errorf("%w: exec in pod %s/%s: %v", ErrTransport, ns, pod, err)
	}
	if resp.Body != nil {
		resp.Body.Close()
	}
	conn := up.conn
	if conn.Subprotocol() != Protocol {
		conn.Close()
		return nil, fmt.Errorf("%w: the API server did not accept %s (Kubernetes >= 1.30 needed)", ErrProtocol, Protocol)
	}
	return conn, nil
}

func trimSlash(s string) string {
	for len(s) > 0 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}

// wsExec is one exec connection: a reader that demultiplexes the channels, and writes under
// a lock.
type wsExec struct {
	conn        *gws.Conn
	wmu         sync.Mutex
	stdinClosed bool
}

var errStdinClosed = errors.New("stdin is closed")

func (w *wsExec) write(ch byte, p []byte) error {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if ch == StdinChannel && w.stdinClosed {
		return errStdinClosed
	}
	wr, err := w.conn.NextWriter(gws.BinaryMessage)
	if err != nil {
		return err
	}
	if _, err := wr.Write([]byte{ch}); err != nil {
		return err
	}
	if _, err := wr.Write(p); err != nil {
		return err
	}
	return wr.Close()
}

// closeStdin half-closes stdin, once; nothing is sent on it after.
func (w *wsExec) closeStdin() error {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	if w.stdinClosed {
		return nil
	}
	w.stdinClosed = true
	return w.conn.WriteMessage(gws.BinaryMessage, []byte{CloseChannel, StdinChannel})
}

// sendAll sends r in frames of at most StdinFrame bytes, up to n bytes (n < 0: until EOF).
func (w *wsExec) sendAll(r io.Reader, n int64) error {
	buf := make([]byte, StdinFrame)
	if n >= 0 {
		r = io.LimitReader(r, n)
	}
	for {
		k, err := r.Read(buf)
		if k > 0 {
			if werr := w.write(StdinChannel, buf[:k]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// execCall is one framed command: what to run and where its output goes.
type execCall struct {
	frame    Frame
	noMark   bool      // no trailer and no linger (never for a one-shot exec)
	stdin    io.Reader // nil: none
	stdinLen int64     // >= 0: exactly that many bytes; < 0: until EOF
	stdout   io.Writer
	stderr   io.Writer
}

// execOutcome is how a framed command ended.
type execOutcome struct {
	status   ExitStatus
	timedOut bool
}

type chanEvent struct {
	ch   byte
	data []byte
	err  error
}

// run runs one framed command to its exit status (docs/protocol.md, "What the client does").
func (d *wsDialer) run(ctx context.Context, ns, pod string, c execCall) (execOutcome, error) {
	r, err := d.start(ctx, ns, pod, c)
	if err != nil {
		return execOutcome{}, err
	}
	return r.wait()
}

// running is a framed command whose connection is open.
type running struct {
	ctx, dctx context.Context
	cancel    context.CancelFunc
	conn      *gws.Conn
	w         *wsExec
	c         execCall
	mark      string
	mode      string
	start     time.Time
}

// start opens the exec connection of a framed command.
func (d *wsDialer) start(ctx context.Context, ns, pod string, c execCall) (*running, error) {
	mark := ""
	if !c.noMark {
		mark = NewMark()
	}
	mode := stdinArg(c.stdin != nil, c.stdinLen)
	if mode == StdinNone {
		c.stdin = nil
	}
	argv, err := RemoteArgv(c.frame, mark, mode)
	if err != nil {
		return nil, err
	}
	r := &running{ctx: ctx, c: c, mark: mark, mode: mode, start: time.Now()}
	r.dctx, r.cancel = context.WithCancel(ctx)
	if c.frame.Timeout != nil {
		r.cancel()
		r.dctx, r.cancel = context.WithTimeout(ctx, *c.frame.Timeout+TimeoutGrace)
	}
	conn, err := d.dial(r.dctx, ns, pod, SandboxContainer, argv)
	if err != nil {
		r.cancel()
		return nil, err
	}
	r.conn, r.w = conn, &wsExec{conn: conn}
	return r, nil
}

// wait pumps the connection until the exit status, then closes it.
func (r *running) wait() (execOutcome, error) {
	defer r.cancel()
	conn, w, c, mark, mode, start, dctx, ctx := r.conn, r.w, r.c, r.mark, r.mode, r.start, r.dctx, r.ctx
	defer conn.Close()

	events := make(chan chanEvent, 16)
	done := make(chan struct{})
	defer close(done)
	go func() {
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
			case events <- ev:
			case <-done:
				return
			}
			if err != nil || ev.ch == StatusChannel {
				return
			}
		}
	}()

	// Stdin: a stream is half-closed at its end; with an exact length or none, the close
	// waits for both trailers (the linger). Both trailers also end the sending of a stdin the
	// command did not read (it ended): the close goes out at once.
	out, errT := NewTrailer(mark), NewTrailer(mark)
	go func() {
		if c.stdin != nil {
			// A failed send shows in the exec's end (a command need not read its stdin).
			if err := w.sendAll(c.stdin, c.stdinLen); err != nil {
				return
			}
		}
		if mode == StdinStream || mark == "" {
			_ = w.closeStdin()
		}
	}()
	ping := time.NewTicker(pingEvery)
	defer ping.Stop()
	signalled := false
	for {
		select {
		case <-dctx.Done():
			if c.frame.Timeout != nil && ctx.Err() == nil {
				return execOutcome{timedOut: true}, &ExecTimeoutError{Timeout: c.frame.Timeout.Seconds()}
			}
			return execOutcome{}, fmt.Errorf("%w: %v", ErrTransport, ctx.Err())
		case <-ping.C:
			_ = conn.WriteControl(gws.PingMessage, nil, time.Now().Add(10*time.Second))
		case ev := <-events:
			if ev.err != nil {
				return execOutcome{}, fmt.Errorf("%w: exec stream failed: connection closed without an exit status: %v", ErrTransport, ev.err)
			}
			switch ev.ch {
			case StdoutChannel:
				if p := out.Feed(ev.data); len(p) > 0 && c.stdout != nil {
					if _, err := c.stdout.Write(p); err != nil {
						return execOutcome{}, err
					}
				}
			case StderrChannel:
				if p := errT.Feed(ev.data); len(p) > 0 && c.stderr != nil {
					if _, err := c.stderr.Write(p); err != nil {
						return execOutcome{}, err
					}
				}
			case StatusChannel:
				st, err := ParseStatus(ev.data)
				if err != nil {
					return execOutcome{}, err
				}
				if !out.Complete() {
					return execOutcome{}, &OutputCutError{Stream: "stdout", Received: out.Received}
				}
				if !errT.Complete() {
					return execOutcome{}, &OutputCutError{Stream: "stderr", Received: errT.Received}
				}
				if out.Memory() || errT.Memory() {
					return execOutcome{}, &OutOfMemoryError{}
				}
				timedOut := c.frame.Timeout != nil && time.Since(start) >= *c.frame.Timeout
				return execOutcome{status: st, timedOut: timedOut}, nil
			}
			if !signalled && mark != "" && out.Complete() && errT.Complete() {
				signalled = true
				_ = w.closeStdin()
			}
		}
	}
}

// ExecOptions are the settings of one command.
type ExecOptions struct {
	// Stdin is sent to the command, then closed. A reader with a Len() (bytes.Reader,
	// strings.Reader, bytes.Buffer) is sent as exactly that many bytes; any other is streamed
	// to its EOF.
	Stdin io.Reader
	// Env is added to the command's environment.
	Env map[string]string
	// Workdir is where it runs; "" is the workspace root.
	Workdir string
	// Timeout kills the command's whole process group in the pod; 0 is none.
	Timeout time.Duration
	// MaxOutput caps each of stdout and stderr; 0 is DefaultMaxOutput. What goes beyond it is
	// dropped, and the result says so (StdoutTruncated, StderrTruncated).
	MaxOutput int
	// FailTruncated makes an output beyond MaxOutput an OutputTruncatedError (with the
	// result), not only a flag.
	FailTruncated bool
	// Check turns a non-zero exit into a CommandError.
	Check bool
}

// ExecResult is the collected result of a command.
type ExecResult struct {
	ExitCode        int // from the status channel; -1 when the runtime reported none
	Stdout, Stderr  []byte
	StdoutTruncated bool // stdout was longer than the cap; the rest was dropped
	StderrTruncated bool
	TimedOut        bool   // the timeout passed before the command ended (it was killed)
	StatusMessage   string // the runtime's message when there is no exit code
}

// OK is exit code 0 and no timeout.
func (r *ExecResult) OK() bool { return r.ExitCode == 0 && !r.TimedOut }

func (o ExecOptions) frame(argv []string, root string) Frame {
	f := Frame{Argv: argv, Env: envList(o.Env), Workdir: o.Workdir}
	if f.Workdir == "" {
		f.Workdir = root
	}
	if o.Timeout > 0 {
		t := o.Timeout
		f.Timeout = &t
	}
	return f
}

func stdinOf(r io.Reader) (io.Reader, int64) {
	if r == nil {
		return nil, -1
	}
	if l, ok := r.(interface{ Len() int }); ok {
		return r, int64(l.Len())
	}
	return r, -1
}

func (d *wsDialer) collect(ctx context.Context, ns, pod string, f Frame, o ExecOptions) (*ExecResult, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	if o.MaxOutput < 0 {
		return nil, invalidf("MaxOutput must not be negative")
	}
	limit := o.MaxOutput
	if limit == 0 {
		limit = DefaultMaxOutput
	}
	out, errb := &capped{cap: limit}, &capped{cap: limit}
	in, n := stdinOf(o.Stdin)
	oc, err := d.run(ctx, ns, pod, execCall{frame: f, stdin: in, stdinLen: n, stdout: out, stderr: errb})
	if err != nil {
		var te *ExecTimeoutError
		if errors.As(err, &te) {
			return nil, err
		}
		return nil, err
	}
	res := &ExecResult{
		ExitCode: oc.status.Code, Stdout: out.buf, Stderr: errb.buf,
		StdoutTruncated: out.truncated, StderrTruncated: errb.truncated,
		TimedOut: oc.timedOut, StatusMessage: oc.status.Message,
	}
	if !oc.status.HasCode {
		res.ExitCode = -1
	}
	return res, o.verdict(res, f.Timeout, limit)
}

// verdict is the error a finished command's result calls for under o: its timeout, then a
// failed check, then a truncation asked to fail.
func (o ExecOptions) verdict(res *ExecResult, timeout *time.Duration, limit int) error {
	if res.TimedOut {
		return &ExecTimeoutError{Timeout: timeout.Seconds(), Result: res}
	}
	if o.Check && res.ExitCode != 0 {
		return &CommandError{Result: res}
	}
	if o.FailTruncated && (res.StdoutTruncated || res.StderrTruncated) {
		return &OutputTruncatedError{Limit: limit, Result: res}
	}
	return nil
}
