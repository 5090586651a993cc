package agentbox

import (
	"bytes"
	"os/exec"
	"reflect"
	"testing"
)

// The wrapper run by a local sh (busybox's when there, as in the sandbox image): exit codes,
// the trailer on both streams after the output, each stdin mode, the workdir, the env and
// the timeout's kill of the process group.
func TestWrapperRunsUnderSh(t *testing.T) {
	shell := []string{"sh"}
	if p, err := exec.LookPath("busybox"); err == nil {
		shell = []string{p, "sh"}
	}
	const m = "__AGENTBOX_0123456789abcdef0123456789abcdef_"
	for _, c := range []struct {
		params   []string
		stdin    string
		code     int
		out, err string
	}{
		{[]string{m, StdinNone, "", "", "0", "sh", "-c", "echo hi; echo err >&2; exit 3"}, "", 3, "hi\n" + m, "err\n" + m},
		{[]string{m, StdinExact(5), "", "", "0", "sh", "-c", "cat; exit 4"}, "abcdefgh", 4, "abcde" + m, m},
		{[]string{m, StdinStream, "", "", "0", "cat"}, "stream", 0, "stream" + m, m},
		{[]string{m, StdinNone, "0.300", "/", "1", "A=x y", "sh", "-c", "echo $A; pwd; sleep 5; echo no"}, "", 137, "x y\n/\n" + m, m},
		{[]string{m, StdinExact(3), "2.000", "", "0", "sh", "-c", "cat; exit 9"}, "xyz", 9, "xyz" + m, m},
		{[]string{"", StdinNone, "", "", "0", "echo", "bare"}, "", 0, "bare\n", ""},
		{[]string{m, StdinNone, "", "/nonexistent-dir", "0", "true"}, "", 126, m, ""},
	} {
		args := append(append(append([]string{}, shell[1:]...), "-c", Wrapper, wrapperArgv0), c.params...)
		cmd := exec.Command(shell[0], args...)
		cmd.Stdin = bytes.NewReader([]byte(c.stdin))
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != c.code || out.String() != c.out {
			t.Errorf("%q: exit %d stdout %q", c.params, code, out.String())
		}
		if c.err != "" && errb.String() != c.err || c.err == "" && c.params[0] != "" && !bytes.HasSuffix(errb.Bytes(), []byte(m)) {
			t.Errorf("%q: stderr %q", c.params, errb.String())
		}
	}
}

func TestTrailerHoldsBackOnlyWhatCouldStartTheMark(t *testing.T) {
	const m = "__AB_"
	for _, c := range []struct {
		chunks   []string
		passed   string
		complete bool
	}{
		{[]string{"hello", "__AB_"}, "hello", true},
		{[]string{"hel", "lo__", "A", "B_"}, "hello", true},
		{[]string{"x_", "_A"}, "x", false},              // "__A" held: it may start the mark
		{[]string{"__AB_", "more"}, "__AB_more", false}, // a mark followed by output is output
		{[]string{"a__AB", "x__AB_"}, "a__ABx", true},   // a broken start is passed on
		{[]string{"", "_"}, "", false},                  // held, not complete
		{[]string{"__AB___AB_"}, "__AB_", true},         // a mark in the output, then the trailer
	} {
		tr := NewTrailer(m)
		var got []byte
		for _, ch := range c.chunks {
			got = append(got, tr.Feed([]byte(ch))...)
		}
		if string(got) != c.passed || tr.Complete() != c.complete {
			t.Errorf("%q: passed %q complete %v", c.chunks, got, tr.Complete())
		}
	}
	tr := NewTrailer("")
	if got := tr.Feed([]byte("x")); !reflect.DeepEqual(got, []byte("x")) || !tr.Complete() {
		t.Fatal("an empty mark must pass everything")
	}
}

func TestScopeValidation(t *testing.T) {
	for _, s := range []Scope{{Kind: "Nope"}, {Kind: ScopeSession, Agent: "a"}, {Kind: ScopeAgent, Agent: "a", User: "u"}, {Kind: ScopeGlobal, Agent: "a"}, {Kind: ScopeAgent, Agent: string(make([]byte, 254))}} {
		if err := s.Validate(); err == nil {
			t.Errorf("%v accepted", s)
		}
	}
	for _, s := range []Scope{SessionScope("a", "s"), UserScope("a", "u"), AgentScope("a"), GlobalScope()} {
		if err := s.Validate(); err != nil {
			t.Errorf("%v: %v", s, err)
		}
	}
}
