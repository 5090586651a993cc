package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	agentbox "agentbox.dev/go"
)

// hog is 200 MiB of zeros into tail, which holds them as one line: far past a 64 MiB limit, and
// bounded whatever the limit does.
const hog = "head -c 209715200 /dev/zero | tail"

func oomSandbox(t *testing.T, user string, extra map[string]any) *agentbox.Sandbox {
	t.Helper()
	ctx := context.Background()
	s := spec()
	s.Extra = map[string]any{"resources": map[string]any{
		"limits":   map[string]any{"memory": "64Mi"},
		"requests": map[string]any{"memory": "64Mi"},
	}}
	for k, v := range extra {
		s.Extra[k] = v
	}
	sbx, err := sandboxes.GetOrCreate(ctx, agentbox.UserScope("go-oom", ns+"-"+user), s)
	if err != nil {
		t.Fatal(err)
	}
	if err := sbx.WaitReady(ctx, 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, tail(opLog, 40))
	}
	return sbx
}

// A command its sandbox's memory limit kills is ErrOutOfMemory (one-shot exec and session), not
// exit code 137, and the sandbox carries on. (Under gVisor the whole container: the test below.)
func TestACommandKilledForMemoryIsOutOfMemory(t *testing.T) {
	ctx := context.Background()
	sbx := oomSandbox(t, "runc", nil)
	opts := agentbox.ExecOptions{Timeout: time.Minute}

	_, err := sbx.Run(ctx, hog, opts)
	var oom *agentbox.OutOfMemoryError
	if !errors.Is(err, agentbox.ErrOutOfMemory) || !errors.As(err, &oom) || oom.Container {
		t.Fatalf("exec: %v", err)
	}
	s := sbx.Session("")
	defer s.Close()
	if _, err := s.Run(ctx, hog, opts); !errors.As(err, &oom) || oom.Container {
		t.Fatalf("session: %v", err)
	}
	if r, err := s.Run(ctx, "echo still", agentbox.ExecOptions{}); err != nil || string(r.Stdout) != "still\n" {
		t.Fatalf("the session after: %+v %v", r, err)
	}
	if r, err := sbx.Run(ctx, "echo alive", agentbox.ExecOptions{}); err != nil || string(r.Stdout) != "alive\n" {
		t.Fatalf("exec after: %+v %v", r, err)
	}
}

// back waits until the sandbox answers again (the kubelet restarts a container killed for memory).
func back(t *testing.T, sbx *agentbox.Sandbox) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < 120; i++ {
		if r, err := sbx.Run(ctx, "echo back", agentbox.ExecOptions{}); err == nil && string(r.Stdout) == "back\n" {
			return
		}
		time.Sleep(time.Second)
	}
	t.Fatal("the sandbox did not come back after its container was killed")
}

// Under gVisor a command over the limit takes the whole sandbox with it (the kernel kills
// gVisor's runtime, which holds every process): ErrOutOfMemory with Container set, from the
// kubelet's OOMKilled (docs/security.md, "Memory under gVisor"), one-shot exec and session.
func TestUnderGVisorACommandKilledForMemoryIsOutOfMemoryOfTheContainer(t *testing.T) {
	ctx := context.Background()
	sbx := oomSandbox(t, "gvisor", map[string]any{"runtimeClassName": "gvisor"})
	opts := agentbox.ExecOptions{Timeout: time.Minute}

	_, err := sbx.Run(ctx, hog, opts)
	var oom *agentbox.OutOfMemoryError
	if !errors.Is(err, agentbox.ErrOutOfMemory) || !errors.As(err, &oom) || !oom.Container {
		t.Fatalf("exec: %v", err)
	}
	back(t, sbx)
	s := sbx.Session("")
	if _, err := s.Run(ctx, hog, opts); !errors.As(err, &oom) || !oom.Container {
		t.Fatalf("session: %v", err)
	}
	s.Close()
	back(t, sbx)
}
