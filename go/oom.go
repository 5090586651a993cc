package agentbox

import (
	"context"
	"errors"
	"time"
)

// Out of memory, as the kubelet records it (docs/protocol.md, "Out of memory"): a command the
// kernel's OOM killer ends while its container lives on is told by the wrapper itself (its
// memory trailer); a whole container killed for memory (under gVisor the sandbox's own runtime
// counts against limits.memory, so running out ends every process in it) breaks the exec's
// connection, and the client finds the kubelet's OOMKilled in the pod's status.
const (
	// OOMKilled is the kubelet's reason for a container the kernel killed for memory.
	OOMKilled = "OOMKilled"
	// OOMClockSkew: how far before an exec's start a container's OOMKilled may have finished
	// and still be taken for the exec's cause (client and node clocks may differ).
	OOMClockSkew = 5 * time.Second
	// OOMSettle: how long a client looks for the kubelet's record after an exec failed.
	OOMSettle = 10 * time.Second
	// OOMPoll: how often it looks meanwhile.
	OOMPoll = 400 * time.Millisecond
)

// OOMKilledSince reports whether pod's status records container killed for memory (reason
// OOMKilled in its state or last state) at or after since less OOMClockSkew; a termination
// without finishedAt counts (vectors: oom.container).
func OOMKilledSince(pod map[string]any, container string, since time.Time) bool {
	status, _ := pod["status"].(map[string]any)
	statuses, _ := status["containerStatuses"].([]any)
	after := since.Add(-OOMClockSkew)
	for _, c := range statuses {
		cs, _ := c.(map[string]any)
		if cs["name"] != container {
			continue
		}
		for _, key := range []string{"state", "lastState"} {
			st, _ := cs[key].(map[string]any)
			t, _ := st["terminated"].(map[string]any)
			if t == nil || t["reason"] != OOMKilled {
				continue
			}
			finished, _ := t["finishedAt"].(string)
			if finished == "" {
				return true
			}
			at, err := time.Parse(time.RFC3339, finished)
			if err == nil && !at.Before(after) {
				return true
			}
		}
	}
	return false
}

// explainFailure is err as the caller should see it: one that a dead container explains (a
// cut stream, a broken connection, a command or session that could not go on) becomes an
// OutOfMemoryError{Container: true} when the kubelet recorded the sandbox's container
// OOMKilled since since (looking for up to OOMSettle); anything else is returned as it is.
func (b *Sandbox) explainFailure(ctx context.Context, since time.Time, err error) error {
	if err == nil || !(errors.Is(err, ErrTransport) || errors.Is(err, ErrOutputCut) ||
		errors.Is(err, ErrCommandNotStarted) || errors.Is(err, ErrSession)) {
		return err
	}
	until := time.Now().Add(OOMSettle)
	for {
		pod, gerr := b.sbs.get(ctx, podsGVR, b.PodName())
		if gerr != nil || pod == nil {
			// Gone, or the API server out of reach: not known to be out of memory.
			return err
		}
		if OOMKilledSince(pod, SandboxContainer, since) {
			return &OutOfMemoryError{Container: true}
		}
		if time.Now().Add(OOMPoll).After(until) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(OOMPoll):
		}
	}
}
