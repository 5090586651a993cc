package agentbox

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Exec wire constants (docs/protocol.md, vectors: exec).
const (
	// SandboxContainer is the container of every sandbox pod.
	SandboxContainer = "sandbox"
	// Protocol is the only remote-command subprotocol offered: v5 can half-close stdin, which
	// the exec frame needs (the wrapper lingers until the client closes stdin).
	Protocol      = "v5.channel.k8s.io"
	StdinChannel  = 0
	StdoutChannel = 1
	StderrChannel = 2
	StatusChannel = 3
	// CloseChannel: v5's [CloseChannel, n] half-closes channel n.
	CloseChannel = 255
	// StdinFrame is the largest stdin message: one per 256 KiB, not per 4 KiB.
	StdinFrame = 256 << 10
	// DefaultMaxOutput is the default cap on each of stdout and stderr.
	DefaultMaxOutput = 8 << 20
	// TimeoutGrace is how long to wait for the exit status after a timeout fired: it bounds a
	// wedged connection; the in-pod watchdog has killed the command by then.
	TimeoutGrace = 15 * time.Second
	// pingEvery keeps a silent exec's connection alive through idle timeouts of proxies.
	pingEvery = 60 * time.Second
	// MarkPrefix starts every trailer mark.
	MarkPrefix = "__AGENTBOX_"
	// argv0 of the wrapper.
	wrapperArgv0 = "agentbox-exec"
)

// Stdin modes of the wrapper.
const (
	StdinNone   = "-" // the command reads nothing; the exec's stdin stays open for the linger
	StdinStream = "=" // the command reads the exec's stdin until the client half-closes it
)

// StdinExact is the mode in which the command reads exactly n bytes, then EOF.
func StdinExact(n int64) string { return strconv.FormatInt(n, 10) }

// stdinArg is the wrapper's STDIN for a command with stdin or none, of n bytes (n < 0: a
// stream of unknown length). Zero bytes is no stdin (vectors: exec.remote_argv).
func stdinArg(present bool, n int64) string {
	switch {
	case !present || n == 0:
		return StdinNone
	case n < 0:
		return StdinStream
	}
	return StdinExact(n)
}

// NewMark is a fresh trailer: MarkPrefix + 32 lowercase hex digits + "_".
func NewMark() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on Linux; a fixed mark would still be correct, only
		// guessable by the command.
		panic(fmt.Sprintf("agentbox: crypto/rand: %v", err))
	}
	return MarkPrefix + hex.EncodeToString(b[:]) + "_"
}

// EnvVar is one NAME=value entry of a command's environment.
type EnvVar struct{ Name, Value string }

// envList is env sorted by name (a map has no order; the argv must be deterministic).
func envList(env map[string]string) []EnvVar {
	out := make([]EnvVar, 0, len(env))
	for k, v := range env {
		out = append(out, EnvVar{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// IsEnvName reports whether name is a portable environment variable name.
func IsEnvName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9' {
			continue
		}
		return false
	}
	return true
}

// SleepArg is the sleep argument of a timeout: seconds with millisecond precision, at least
// 1 ms.
func SleepArg(d time.Duration) string {
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return fmt.Sprintf("%d.%03d", ms/1000, ms%1000)
}

// Frame is what a command needs around it: the request as the protocol's vectors state it.
type Frame struct {
	Argv    []string
	Env     []EnvVar
	Workdir string         // "" keeps the container's
	Timeout *time.Duration // nil: none
}

func (f Frame) validate() error {
	if len(f.Argv) == 0 {
		return invalidf("invalid exec request: empty argv")
	}
	if f.Timeout != nil && *f.Timeout < 0 {
		return invalidf("timeout must not be negative, not %v", *f.Timeout)
	}
	for _, e := range f.Env {
		if !IsEnvName(e.Name) {
			return invalidf("invalid exec request: invalid environment variable name %q", e.Name)
		}
	}
	return nil
}

// bare reports whether the command needs no prologue (a session's plain command).
func (f Frame) bare() bool { return f.Timeout == nil && f.Workdir == "" && len(f.Env) == 0 }

// RemoteArgv is the argv sent to the container: sh -c Wrapper agentbox-exec MARK STDIN
// TIMEOUT WORKDIR N ENV... ARGV... (vectors: exec.remote_argv).
func RemoteArgv(f Frame, mark, stdin string) ([]string, error) {
	if err := f.validate(); err != nil {
		return nil, err
	}
	t := ""
	if f.Timeout != nil {
		t = SleepArg(*f.Timeout)
	}
	out := make([]string, 0, 9+len(f.Env)+len(f.Argv))
	out = append(out, "sh", "-c", Wrapper, wrapperArgv0, mark, stdin, t, f.Workdir, strconv.Itoa(len(f.Env)))
	for _, e := range f.Env {
		out = append(out, e.Name+"="+e.Value)
	}
	return append(out, f.Argv...), nil
}

// ExitStatus is how a command ended: Code from the status channel, or HasCode false with the
// runtime's Message when it ended without one.
type ExitStatus struct {
	Code    int
	HasCode bool
	Message string
}

type wireStatus struct {
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
	Details *struct {
		Causes []struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"causes"`
	} `json:"details"`
}

// ParseStatus reads the metav1.Status of the status channel: Success is 0, NonZeroExitCode
// carries the code in a cause with reason ExitCode; anything else means the command never
// started (ErrCommandNotStarted).
func ParseStatus(raw []byte) (ExitStatus, error) {
	var s wireStatus
	if err := json.Unmarshal(raw, &s); err != nil {
		return ExitStatus{}, protocolf("bad status: %v", err)
	}
	if s.Status == "Success" {
		return ExitStatus{Code: 0, HasCode: true}, nil
	}
	if s.Reason == "NonZeroExitCode" {
		if s.Details != nil {
			for _, c := range s.Details.Causes {
				if c.Reason != "ExitCode" {
					continue
				}
				if n, err := strconv.Atoi(strings.TrimSpace(c.Message)); err == nil {
					return ExitStatus{Code: n, HasCode: true}, nil
				}
			}
		}
		return ExitStatus{Message: s.Message}, nil
	}
	msg := s.Message
	if msg == "" {
		msg = s.Reason
	}
	if msg == "" {
		msg = "exec failed without a message"
	}
	return ExitStatus{}, &notStartedError{msg}
}

type notStartedError struct{ msg string }

func (e *notStartedError) Error() string   { return e.msg }
func (e *notStartedError) Is(t error) bool { return t == ErrCommandNotStarted }

// MemoryFlag ends the memory trailer (in place of the mark's last character) and follows the
// exit code in a session's end sentinel: the command was killed for memory.
const MemoryFlag = "!"

// MemoryTrailer is what the wrapper prints instead of mark when the command was killed for
// memory: mark with its last character replaced by "!".
func MemoryTrailer(mark string) string {
	if mark == "" {
		return ""
	}
	return mark[:len(mark)-1] + MemoryFlag
}

// ParseSessionEnd reads a session's end-sentinel trailer: the exit code, and whether the
// command was killed for memory (the code followed by "!"); ok is false when it is not one.
func ParseSessionEnd(trailer string) (code int, memory bool, ok bool) {
	t := strings.TrimSpace(trailer)
	if m, found := strings.CutSuffix(t, MemoryFlag); found {
		t, memory = m, true
	}
	n, err := strconv.Atoi(t)
	if err != nil {
		return 0, false, false
	}
	return n, memory, true
}

// Trailer strips a stream's trailer mark as output arrives (docs/protocol.md, "What the
// client does", 3): it holds back the longest suffix of what arrived that is a prefix of the
// mark or of the memory trailer and passes the rest on, so the mark never reaches the caller
// and ordinary output is held back only while it ends like the start of a mark. An empty mark
// passes everything.
type Trailer struct {
	mark     []byte
	memory   []byte
	held     []byte
	Received int64 // bytes of the stream received
}

// NewTrailer is a filter for mark.
func NewTrailer(mark string) *Trailer {
	return &Trailer{mark: []byte(mark), memory: []byte(MemoryTrailer(mark))}
}

// Feed takes a chunk of the stream and returns what may be passed on now.
func (t *Trailer) Feed(p []byte) []byte {
	t.Received += int64(len(p))
	if len(t.mark) == 0 {
		return p
	}
	buf := p
	if len(t.held) > 0 {
		buf = append(append([]byte(nil), t.held...), p...)
	}
	k := min(len(buf), len(t.mark))
	for ; k > 0; k-- {
		if bytes.Equal(buf[len(buf)-k:], t.mark[:k]) || bytes.Equal(buf[len(buf)-k:], t.memory[:k]) {
			break
		}
	}
	t.held = append(t.held[:0], buf[len(buf)-k:]...)
	return buf[:len(buf)-k]
}

// Complete reports whether the stream so far ends with the whole mark or memory trailer.
func (t *Trailer) Complete() bool { return len(t.mark) == 0 || len(t.held) == len(t.mark) }

// Memory reports whether the stream so far ends with the memory trailer: the wrapper found the
// command killed for memory.
func (t *Trailer) Memory() bool { return len(t.mark) > 0 && bytes.Equal(t.held, t.memory) }

// Held is what is held back (at the end of a cut stream: the start of a mark, or output).
func (t *Trailer) Held() []byte { return t.held }

// capped is a byte buffer that keeps at most cap bytes and remembers whether it dropped any.
type capped struct {
	buf       []byte
	cap       int
	truncated bool
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.cap - len(c.buf)
	if len(p) > room {
		c.truncated = true
		if room > 0 {
			c.buf = append(c.buf, p[:room]...)
		}
	} else {
		c.buf = append(c.buf, p...)
	}
	return len(p), nil
}
