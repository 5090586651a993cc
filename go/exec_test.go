package agentbox

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	gws "github.com/gorilla/websocket"
	"k8s.io/client-go/rest"
)

// fakeExec is an API server's pods/exec endpoint that plays one exec: it reads the wrapped
// argv, then lets play run the connection.
type fakeExec struct {
	play func(t *testing.T, c *gws.Conn, argv []string)
	t    *testing.T
}

func (f fakeExec) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !gws.IsWebSocketUpgrade(r) {
		// A client that looks at the pod after a failed exec (is it out of memory?): no pod.
		http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`, http.StatusNotFound)
		return
	}
	up := gws.Upgrader{Subprotocols: []string{Protocol}, ReadBufferSize: wsBuffer, WriteBufferSize: wsBuffer}
	c, err := up.Upgrade(w, r, nil)
	if err != nil {
		f.t.Error(err)
		return
	}
	defer c.Close()
	f.play(f.t, c, r.URL.Query()["command"])
}

func send(c *gws.Conn, ch byte, s string) {
	_ = c.WriteMessage(gws.BinaryMessage, append([]byte{ch}, s...))
}

// readStdin reads stdin messages until the half-close: what arrived.
func readStdin(c *gws.Conn) (string, error) {
	var got bytes.Buffer
	for {
		_, m, err := c.ReadMessage()
		if err != nil {
			return got.String(), err
		}
		if len(m) == 2 && m[0] == CloseChannel && m[1] == StdinChannel {
			return got.String(), nil
		}
		if m[0] == StdinChannel {
			got.Write(m[1:])
		}
	}
}

const success = `{"metadata":{},"status":"Success"}`

func sandboxOn(t *testing.T, play func(t *testing.T, c *gws.Conn, argv []string)) *Sandbox {
	srv := httptest.NewServer(fakeExec{play: play, t: t})
	t.Cleanup(srv.Close)
	c, err := NewClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c.Pod("ns", "pod", "/workspace")
}

// The client half-closes stdin only after both trailers, sends exactly K bytes, and gives
// the output without the marks.
func TestExecClosesStdinAfterBothTrailers(t *testing.T) {
	sbx := sandboxOn(t, func(t *testing.T, c *gws.Conn, argv []string) {
		mark, mode := argv[4], argv[5]
		if !strings.HasPrefix(mark, MarkPrefix) || mode != "5" {
			t.Errorf("mark %q mode %q", mark, mode)
		}
		msgs := make(chan []byte, 16)
		go func() {
			defer close(msgs)
			for {
				_, m, err := c.ReadMessage()
				if err != nil {
					return
				}
				msgs <- m
			}
		}()
		next := func() []byte {
			select {
			case m := <-msgs:
				return m
			case <-time.After(5 * time.Second):
				return nil
			}
		}
		var in []byte
		for len(in) < 5 {
			m := next()
			if m == nil || m[0] != StdinChannel {
				t.Errorf("stdin: %q", m)
				return
			}
			in = append(in, m[1:]...)
		}
		send(c, StdoutChannel, "out:"+string(in)+mark[:7])
		send(c, StdoutChannel, mark[7:])
		time.Sleep(100 * time.Millisecond)
		select {
		case m := <-msgs:
			t.Errorf("before the stderr trailer: %q", m)
			return
		default:
		}
		send(c, StderrChannel, "e"+mark)
		if m := next(); !bytes.Equal(m, []byte{CloseChannel, StdinChannel}) {
			t.Errorf("after both trailers: %q", m)
		}
		send(c, StatusChannel, `{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}`)
	})
	r, err := sbx.Exec(context.Background(), []string{"cat"}, ExecOptions{Stdin: strings.NewReader("hello")})
	if err != nil || r.ExitCode != 3 || string(r.Stdout) != "out:hello" || string(r.Stderr) != "e" {
		t.Fatalf("%+v %v", r, err)
	}
}

// A stream that ends without its mark is an output-cut error naming it, never a short
// result.
func TestAStreamWithoutItsTrailerIsOutputCut(t *testing.T) {
	for _, stream := range []string{"stdout", "stderr"} {
		sbx := sandboxOn(t, func(t *testing.T, c *gws.Conn, argv []string) {
			mark := argv[4]
			if stream == "stdout" {
				send(c, StdoutChannel, "partial"+mark[:3])
				send(c, StderrChannel, mark)
			} else {
				send(c, StdoutChannel, "all"+mark)
				send(c, StderrChannel, "err")
			}
			send(c, StatusChannel, success)
		})
		_, err := sbx.Exec(context.Background(), []string{"true"}, ExecOptions{})
		var oc *OutputCutError
		if !errors.As(err, &oc) || !errors.Is(err, ErrOutputCut) || oc.Stream != stream {
			t.Fatalf("%s: %v", stream, err)
		}
		if stream == "stdout" && oc.Received != 10 {
			t.Fatalf("received %d", oc.Received)
		}
	}
}

// A stream of unknown length goes out as mode "=" and is half-closed at its end; the
// connection's end without a status is a transport error.
func TestStreamedStdinAndAConnectionWithoutStatus(t *testing.T) {
	sbx := sandboxOn(t, func(t *testing.T, c *gws.Conn, argv []string) {
		if argv[5] != StdinStream {
			t.Errorf("mode %q", argv[5])
		}
		got, err := readStdin(c)
		if err != nil || got != "streamed" {
			t.Errorf("stdin %q %v", got, err)
		}
		send(c, StdoutChannel, got+argv[4])
		send(c, StderrChannel, argv[4])
		send(c, StatusChannel, success)
	})
	r, err := sbx.Exec(context.Background(), []string{"cat"}, ExecOptions{Stdin: io.MultiReader(strings.NewReader("streamed"))})
	if err != nil || string(r.Stdout) != "streamed" {
		t.Fatalf("%+v %v", r, err)
	}
	gone := sandboxOn(t, func(t *testing.T, c *gws.Conn, argv []string) {
		send(c, StdoutChannel, "x")
	})
	if _, err := gone.Exec(context.Background(), []string{"true"}, ExecOptions{}); !errors.Is(err, ErrTransport) {
		t.Fatalf("no status: %v", err)
	}
}

// A command that ended without reading its stdin: both trailers end the sending, and the
// half-close goes out at once, not after the rest of the stdin.
func TestBothTrailersStopTheStdinAndCloseIt(t *testing.T) {
	const k = 32 << 20
	got := make(chan int, 1)
	sbx := sandboxOn(t, func(t *testing.T, c *gws.Conn, argv []string) {
		mark := argv[4]
		send(c, StdoutChannel, mark)
		send(c, StderrChannel, mark)
		n := 0
		for {
			_, m, err := c.ReadMessage()
			if err != nil {
				t.Error(err)
				return
			}
			if bytes.Equal(m, []byte{CloseChannel, StdinChannel}) {
				break
			}
			n += len(m) - 1
		}
		got <- n
		send(c, StatusChannel, success)
	})
	r, err := sbx.Exec(context.Background(), []string{"true"}, ExecOptions{Stdin: bytes.NewReader(make([]byte, k))})
	if err != nil || !r.OK() {
		t.Fatalf("%+v %v", r, err)
	}
	if n := <-got; n >= k {
		t.Fatalf("all %d bytes were sent before the close", n)
	}
}

// The memory trailer on both streams (the wrapper found the command killed for memory) is an
// OutOfMemoryError, not exit code 137.
func TestTheMemoryTrailerIsOutOfMemory(t *testing.T) {
	sbx := sandboxOn(t, func(t *testing.T, c *gws.Conn, argv []string) {
		m := MemoryTrailer(argv[4])
		send(c, StdoutChannel, "some output"+m)
		send(c, StderrChannel, m)
		_, _ = readStdin(c)
		send(c, StatusChannel, `{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"137"}]}}`)
	})
	_, err := sbx.Exec(context.Background(), []string{"hog"}, ExecOptions{})
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) || !errors.Is(err, ErrOutOfMemory) || oom.Container {
		t.Fatalf("%v", err)
	}
}
