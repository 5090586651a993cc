package agentbox

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

func localSh() []string {
	if p, err := exec.LookPath("busybox"); err == nil {
		return []string{p, "sh"}
	}
	return []string{"sh"}
}

func runProcesses(t *testing.T, args ...string) string {
	t.Helper()
	sh := localSh()
	cmd := exec.Command(sh[0], append(append(append([]string{}, sh[1:]...), "-c", ScriptProcesses, "agentbox-processes"), args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %v %s", args, err, errb.String())
	}
	return out.String()
}

// The process script under a local sh: "list" finds the command and its children by their
// AGENTBOX_PROCESS entry (not the wrapper's shells), "kill" ends all of them, including a
// child in a process group and session of its own, and leaves other processes alone.
func TestProcessScriptFindsAndKillsTheProcessTree(t *testing.T) {
	id := strings.TrimSuffix(strings.TrimPrefix(NewMark(), MarkPrefix), "_")
	other := strings.TrimSuffix(strings.TrimPrefix(NewMark(), MarkPrefix), "_")
	sh := localSh()
	// The wrapper with the entry in its env list, as Start sends it: a child that leaves the
	// process group (setsid) and a grandchild.
	cmd := exec.Command(sh[0], append(append([]string{}, sh[1:]...), "-c", Wrapper, wrapperArgv0,
		"", StdinNone, "", "", "1", ProcessEnv+"="+id, "sh", "-c", "setsid sleep 1004 & sh -c 'sleep 1005' & wait")...)
	bystander := exec.Command("sleep", "1006")
	bystander.Env = append(os.Environ(), ProcessEnv+"="+other)
	for _, c := range []*exec.Cmd{cmd, bystander} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
	}
	defer func() { _ = bystander.Process.Kill(); _ = bystander.Wait() }()
	var lines []string
	for i := 0; i < 100; i++ {
		lines = strings.Fields(runProcesses(t, "list", id))
		if len(lines) >= 6 { // the sh and its two sleeps (the inner sh execs its sleep): pid and ppid each
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(lines) != 6 {
		t.Fatalf("listed %q", lines)
	}
	if !strings.Contains(" "+strings.Join(lines, " ")+" ", " "+strconv.Itoa(cmd.Process.Pid)+" ") {
		t.Fatalf("the wrapper (pid %d) is the command's parent: %q", cmd.Process.Pid, lines)
	}
	runProcesses(t, "kill", id)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the wrapper did not end after the kill")
	}
	if left := runProcesses(t, "list", id); left != "" {
		t.Fatalf("left running: %q", left)
	}
	if got := strings.Fields(runProcesses(t, "list", other)); len(got) != 2 || got[0] != strconv.Itoa(bystander.Process.Pid) {
		t.Fatalf("the bystander: %q", got)
	}
}
