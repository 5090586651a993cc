package agentbox

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// Snapshot is a SandboxSnapshot as last read: one immutable workspace tarball in the object
// store.
type Snapshot struct {
	Name         string
	Sandbox      string // the Sandbox it was taken from
	Phase        string // Pending, Running, Ready or Failed ("" before the operator saw it)
	ScopeKey     string
	SHA256       string
	SizeBytes    int64
	FencingToken int64
	CompletedAt  string
	Obj          map[string]any
}

// SnapshotFrom reads a SandboxSnapshot object.
func SnapshotFrom(obj map[string]any) Snapshot {
	st := mapAt(obj, "status")
	s := Snapshot{
		Name:        str(mapAt(obj, "metadata")["name"]),
		Sandbox:     str(mapAt(obj, "spec", "sandboxRef")["name"]),
		Phase:       str(st["phase"]),
		ScopeKey:    str(st["scopeKey"]),
		SHA256:      str(st["sha256"]),
		CompletedAt: str(st["completedAt"]),
		Obj:         obj,
	}
	if s.ScopeKey == "" {
		s.ScopeKey = str(mapAt(obj, "metadata", "labels")[LabelScopeKey])
	}
	s.SizeBytes, _ = intOf(st["sizeBytes"])
	s.FencingToken, _ = intOf(st["fencingToken"])
	return s
}

// Snapshot asks the operator for a snapshot of the workspace (a new SandboxSnapshot, taken
// under the scope's guard, named <sandbox>-<random> when name is ""), and with wait > 0 waits
// until it is Ready.
func (b *Sandbox) Snapshot(ctx context.Context, name string, wait time.Duration) (Snapshot, error) {
	meta := map[string]any{"labels": toAny(ScopeLabels(b.Scope()))}
	if name != "" {
		meta["name"] = name
	} else {
		meta["generateName"] = b.Name() + "-"
	}
	body := map[string]any{
		"apiVersion": Group + "/" + Version,
		"kind":       "SandboxSnapshot",
		"metadata":   meta,
		"spec":       map[string]any{"sandboxRef": map[string]any{"name": b.Name()}, "deletionPolicy": "Delete"},
	}
	obj, err := b.sbs.create(ctx, snapshotsGVR, body)
	if err != nil {
		return Snapshot{}, err
	}
	snap := SnapshotFrom(obj)
	if wait <= 0 {
		return snap, nil
	}
	return b.sbs.WaitSnapshot(ctx, snap.Name, wait)
}

// GetSnapshot reads a SandboxSnapshot.
func (s *Sandboxes) GetSnapshot(ctx context.Context, name string) (Snapshot, error) {
	obj, err := s.get(ctx, snapshotsGVR, name)
	if err != nil {
		return Snapshot{}, err
	}
	if obj == nil {
		return Snapshot{}, fmt.Errorf("%w: sandboxsnapshot %s/%s", ErrNotFound, s.Namespace, name)
	}
	return SnapshotFrom(obj), nil
}

// WaitSnapshot waits with a watch until the snapshot is Ready; ErrSnapshotFailed at once
// when it fails, or at the timeout.
func (s *Sandboxes) WaitSnapshot(ctx context.Context, name string, timeout time.Duration) (Snapshot, error) {
	obj, err := s.watchUntil(ctx, snapshotsGVR, name, timeout, func(o map[string]any) (bool, error) {
		if o == nil {
			return false, fmt.Errorf("%w: sandboxsnapshot %s/%s was deleted", ErrNotFound, s.Namespace, name)
		}
		switch str(mapAt(o, "status")["phase"]) {
		case "Failed":
			reason, msg := FailingCondition(o)
			if reason == "" {
				reason = "Failed"
			}
			return false, &SnapshotError{Name: name, Phase: "Failed", Reason: reason, Message: msg}
		case "Ready":
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return Snapshot{}, err
	}
	if obj == nil {
		phase := "Pending"
		if last, err := s.GetSnapshot(ctx, name); err == nil && last.Phase != "" {
			phase = last.Phase
		}
		return Snapshot{}, &SnapshotError{Name: name, Phase: phase, Reason: "Timeout", Message: fmt.Sprintf("not Ready after %v", timeout)}
	}
	return SnapshotFrom(obj), nil
}

// Snapshots is a scope's lineage, oldest first in the operator's order (completion time, then
// fencing token, then name; unfinished ones first).
func (s *Sandboxes) Snapshots(ctx context.Context, scope Scope) ([]Snapshot, error) {
	rctx, cancel := reqCtx(ctx)
	defer cancel()
	list, err := s.res(snapshotsGVR).List(rctx, listOpts(ScopeSelector(scope)))
	if err != nil {
		return nil, apiErr(err)
	}
	out := make([]Snapshot, 0, len(list.Items))
	for _, it := range list.Items {
		out = append(out, SnapshotFrom(it.Object))
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if (a.CompletedAt != "") != (b.CompletedAt != "") {
			return a.CompletedAt == ""
		}
		if a.CompletedAt != b.CompletedAt {
			return a.CompletedAt < b.CompletedAt
		}
		if a.FencingToken != b.FencingToken {
			return a.FencingToken < b.FencingToken
		}
		return a.Name < b.Name
	})
	return out, nil
}

// Restore replaces the workspace with a Ready snapshot's, the way the CRD restores (only a
// fresh workspace is restored): the Sandbox is deleted and created again under the same name,
// labels and spec with snapshot.restore Named. Then WaitReady.
func (b *Sandbox) Restore(ctx context.Context, snapshot string, timeout time.Duration) error {
	snap, err := b.sbs.GetSnapshot(ctx, snapshot)
	if err != nil {
		return err
	}
	if snap.Phase != "Ready" {
		return &SnapshotError{Name: snapshot, Phase: snap.Phase, Reason: "NotReady", Message: "only a Ready snapshot can be restored"}
	}
	if err := b.Refresh(ctx); err != nil {
		return err
	}
	meta := mapAt(b.Obj, "metadata")
	newMeta := map[string]any{}
	for _, k := range []string{"name", "labels", "annotations"} {
		if v, ok := meta[k]; ok {
			newMeta[k] = v
		}
	}
	spec := copyMap(mapAt(b.Obj, "spec"))
	sp := copyMap(mapAt(spec, "snapshot"))
	sp["restore"], sp["name"] = "Named", snapshot
	spec["snapshot"] = sp
	body := map[string]any{"apiVersion": Group + "/" + Version, "kind": "Sandbox", "metadata": newMeta, "spec": spec}
	if err := b.Delete(ctx, timeout); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	obj, err := b.sbs.create(ctx, sandboxesGVR, body)
	if err != nil {
		return err
	}
	b.Obj = obj
	return nil
}
