package cluster

import (
	"context"
	"fmt"
	"time"

	agentbox "agentbox.dev/go"
)

func turn(ctx context.Context, sandboxes *agentbox.Sandboxes) error {
	scope := agentbox.UserScope("coder", "alice@example.com")
	spec := agentbox.SandboxSpec{Image: "docker.io/library/busybox:1.37"}
	sbx, err := sandboxes.GetOrCreate(ctx, scope, spec) // racing harnesses: one Sandbox
	if err != nil {
		return err
	}
	if err := sbx.WaitReady(ctx, 2*time.Minute); err != nil {
		return err
	}
	guard := sbx.Guard(agentbox.GuardConfig{Wait: time.Minute}) // the scope's Lease
	if err := guard.Acquire(ctx); err != nil {
		return err
	}
	defer guard.Release(ctx)
	r, err := sbx.Run(guard.Context(), "ls; exit 3", agentbox.ExecOptions{Timeout: 30 * time.Second})
	if err != nil {
		return err
	}
	fmt.Println(r.ExitCode) // 3: the real exit code
	// Paths are confined to the workspace.
	if err := sbx.WriteFile(ctx, "notes/todo.txt", []byte("ship it\n"), 0); err != nil {
		return err
	}
	session := sbx.Session("") // a persistent shell
	defer session.Close()
	r, err = session.Run(ctx, "cat notes/*", agentbox.ExecOptions{})
	if err != nil {
		return err
	}
	fmt.Print(string(r.Stdout)) // ship it
	return nil
}
