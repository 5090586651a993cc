package agentbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	mrand "math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"
)

// GuardConfig are the settings of a scope's guard.
type GuardConfig struct {
	// LeaseDuration is how long the lease stays valid without renewal (whole seconds on the
	// Lease, at least 1); 0 is 15 s.
	LeaseDuration time.Duration
	// RenewInterval is the renewal period; 0 is a third of the lease duration.
	RenewInterval time.Duration
	// RetryInterval is the polling period while the lease is held by another (jittered
	// ±50%); 0 is 200 ms.
	RetryInterval time.Duration
	// ClockSkew is the allowance for clock differences when judging expiry from renewTime;
	// 0 is 2 s.
	ClockSkew time.Duration
	// Holder is the identity written to holderIdentity; "" is HolderIdentity().
	Holder string
	// Wait bounds Acquire's wait for a lease held by another; 0 waits as long as the context.
	Wait time.Duration
}

// Guard defaults (vectors: guard.defaults).
const (
	DefaultLeaseDuration = 15 * time.Second
	DefaultRetryInterval = 200 * time.Millisecond
	DefaultClockSkew     = 2 * time.Second
)

func (c GuardConfig) withDefaults() GuardConfig {
	if c.LeaseDuration == 0 {
		c.LeaseDuration = DefaultLeaseDuration
	}
	if c.RetryInterval == 0 {
		c.RetryInterval = DefaultRetryInterval
	}
	if c.ClockSkew == 0 {
		c.ClockSkew = DefaultClockSkew
	}
	if c.Holder == "" {
		c.Holder = HolderIdentity()
	}
	return c
}

// DurationSecs is leaseDurationSeconds: whole seconds, at least 1.
func (c GuardConfig) DurationSecs() int64 {
	d := c.LeaseDuration
	if d == 0 {
		d = DefaultLeaseDuration
	}
	return max(int64(d/time.Second), 1)
}

// RenewEvery is the renewal period.
func (c GuardConfig) RenewEvery() time.Duration {
	if c.RenewInterval > 0 {
		return c.RenewInterval
	}
	return time.Duration(c.DurationSecs()) * time.Second / 3
}

// TrustWindow is how long after the start of the last successful renewal the lease is still
// trusted: the duration less a margin, since others may take over right at the duration.
func (c GuardConfig) TrustWindow() time.Duration {
	d := float64(c.DurationSecs())
	margin := math.Min(math.Max(d/5, 0.5), d/2)
	return time.Duration((d - margin) * float64(time.Second))
}

// HolderIdentity is hostname/pid/random, unique per guard user (as the other clients').
func HolderIdentity() string {
	host := os.Getenv("HOSTNAME")
	if host == "" {
		if b, err := os.ReadFile("/etc/hostname"); err == nil {
			host = strings.TrimSpace(string(b))
		}
	}
	if host == "" {
		host, _ = os.Hostname()
	}
	if host == "" {
		host = "unknown"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// MicroTime formats a MicroTime as the API server writes it.
func MicroTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z") }

// ParseTime parses a Kubernetes Time or MicroTime (RFC 3339, any fraction digits).
func ParseTime(s string) (time.Time, error) {
	return time.Parse(time.RFC3339Nano, strings.TrimSpace(s))
}

// Verdicts of Judge.
const (
	Take = "Take"
	Wait = "Wait"
)

// Judge says whether a contender may take over a lease spec it just read (pure): now is its
// wall clock, unchangedFor how long it has seen the current resourceVersion on its monotonic
// clock (vectors: guard.judge).
func Judge(spec map[string]any, now time.Time, unchangedFor, clockSkew, defaultDuration time.Duration) string {
	if spec == nil || str(spec["holderIdentity"]) == "" {
		return Take
	}
	duration := defaultDuration
	if f, ok := spec["leaseDurationSeconds"].(float64); ok && f > 0 && f == math.Trunc(f) {
		duration = time.Duration(f) * time.Second
	} else if n, ok := spec["leaseDurationSeconds"].(int64); ok && n > 0 {
		duration = time.Duration(n) * time.Second
	}
	if unchangedFor >= duration {
		return Take
	}
	if renew := str(spec["renewTime"]); renew != "" {
		t, err := ParseTime(renew)
		if err != nil {
			return Wait
		}
		if !t.Add(duration + clockSkew).After(now) {
			return Take
		}
	}
	return Wait
}

// TakenSpec is the spec written when taking a lease: this holder, times now, transitions
// bumped (the fencing token).
func TakenSpec(old map[string]any, cfg GuardConfig, now time.Time) map[string]any {
	var transitions int64
	if old != nil {
		transitions, _ = intOf(old["leaseTransitions"])
	}
	t := MicroTime(now)
	return map[string]any{
		"acquireTime":          t,
		"holderIdentity":       cfg.Holder,
		"leaseDurationSeconds": cfg.DurationSecs(),
		"leaseTransitions":     min(transitions+1, math.MaxInt32),
		"renewTime":            t,
	}
}

// Guard is the execution guard of one scope: its Lease (docs/protocol.md, "The scope
// guard"). Acquire takes it, a background renewal keeps it, Release gives it back. When it is
// lost, Context is cancelled and Err says so.
type Guard struct {
	sbs    *Sandboxes
	name   string
	labels map[string]string
	cfg    GuardConfig

	mu       sync.Mutex
	lease    map[string]any
	token    int64
	released bool
	lostErr  error
	ctx      context.Context
	cancel   context.CancelFunc
	stop     chan struct{}
	stopped  chan struct{}
}

func newGuard(s *Sandboxes, name string, labels map[string]string, cfg GuardConfig) *Guard {
	ctx, cancel := context.WithCancel(context.Background())
	return &Guard{sbs: s, name: name, labels: labels, cfg: cfg.withDefaults(), ctx: ctx, cancel: cancel, stop: make(chan struct{}), stopped: make(chan struct{})}
}

// LeaseName is the name of the Lease.
func (g *Guard) LeaseName() string { return g.name }

// Holder is this holder's identity.
func (g *Guard) Holder() string { return g.cfg.Holder }

// FencingToken is leaseTransitions after this acquisition: greater than any earlier
// holder's. 0 until acquired.
func (g *Guard) FencingToken() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.token
}

// Context is cancelled when the guard is lost or released: run the guarded work under it.
func (g *Guard) Context() context.Context { return g.ctx }

// Err is ErrGuardLost (a GuardError) once the guard was lost, else nil.
func (g *Guard) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lostErr
}

// Held reports acquired, not released and not lost.
func (g *Guard) Held() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lease != nil && !g.released && g.lostErr == nil
}

func retryable(err error) bool {
	if errors.Is(err, ErrTransport) || errors.Is(err, ErrConflict) {
		return true
	}
	var ae *APIError
	return errors.As(err, &ae) && (ae.Code >= 500 || ae.Code == 429)
}

// Acquire takes the lease, waiting while another holds it (up to cfg.Wait, then
// ErrGuardTimeout), and starts renewing it.
func (g *Guard) Acquire(ctx context.Context) error {
	g.mu.Lock()
	if g.lease != nil {
		g.mu.Unlock()
		return fmt.Errorf("%w: guard already acquired", ErrInvalid)
	}
	g.mu.Unlock()
	var deadline time.Time
	if g.cfg.Wait > 0 {
		deadline = time.Now().Add(g.cfg.Wait)
	}
	seenRV, seenAt := "", time.Now()
	lastHolder := ""
	for {
		attempt := time.Now()
		lease, holder, err := g.tryTake(ctx, &seenRV, &seenAt)
		if holder != "" {
			lastHolder = holder
		}
		if err != nil && (!retryable(err) || (!deadline.IsZero() && time.Now().After(deadline))) {
			return err
		}
		if lease != nil {
			g.start(lease, attempt)
			return nil
		}
		pause := time.Duration(float64(g.cfg.RetryInterval) * (0.5 + mrand.Float64()))
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return &GuardError{Kind: ErrGuardTimeout, Lease: g.name, Holder: lastHolder}
			}
			pause = min(pause, left)
		}
		select {
		case <-ctx.Done():
			return &GuardError{Kind: ErrGuardTimeout, Lease: g.name, Holder: lastHolder}
		case <-time.After(pause):
		}
	}
}

func (g *Guard) tryTake(ctx context.Context, seenRV *string, seenAt *time.Time) (map[string]any, string, error) {
	now := time.Now()
	cur, err := g.sbs.get(ctx, leasesGVR, g.name)
	if err != nil {
		return nil, "", err
	}
	if cur == nil {
		meta := map[string]any{"name": g.name}
		if len(g.labels) > 0 {
			meta["labels"] = toAny(g.labels)
		}
		body := map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": TakenSpec(nil, g.cfg, now)}
		obj, err := g.sbs.create(ctx, leasesGVR, body)
		if errors.Is(err, ErrConflict) {
			return nil, "", nil
		}
		return obj, "", err
	}
	rv := str(mapAt(cur, "metadata")["resourceVersion"])
	if rv != *seenRV {
		*seenRV, *seenAt = rv, time.Now()
	}
	spec, _ := cur["spec"].(map[string]any)
	holder := str(mapAt(cur, "spec")["holderIdentity"])
	if Judge(spec, now, time.Since(*seenAt), g.cfg.ClockSkew, g.cfg.LeaseDuration) == Wait {
		return nil, holder, nil
	}
	cur["spec"] = TakenSpec(spec, g.cfg, now)
	if len(g.labels) > 0 {
		meta := cur["metadata"].(map[string]any)
		l, _ := meta["labels"].(map[string]any)
		if l == nil {
			l = map[string]any{}
		}
		for k, v := range g.labels {
			l[k] = v
		}
		meta["labels"] = l
	}
	// The body carries metadata.resourceVersion: the API server refuses (409) if anyone wrote
	// the lease since it was read.
	obj, err := g.sbs.update(ctx, leasesGVR, cur)
	if errors.Is(err, ErrConflict) {
		return nil, holder, nil
	}
	return obj, holder, err
}

func (g *Guard) start(lease map[string]any, sent time.Time) {
	g.mu.Lock()
	g.lease = lease
	g.token, _ = intOf(mapAt(lease, "spec")["leaseTransitions"])
	g.mu.Unlock()
	go g.renewLoop(sent)
}

func (g *Guard) setLost() {
	g.mu.Lock()
	if g.lostErr == nil {
		g.lostErr = &GuardError{Kind: ErrGuardLost, Lease: g.name}
	}
	g.mu.Unlock()
	g.cancel()
}

func (g *Guard) renewLoop(lastOK time.Time) {
	defer close(g.stopped)
	every, trust := g.cfg.RenewEvery(), g.cfg.TrustWindow()
	next := lastOK.Add(every)
	for {
		trustedUntil := lastOK.Add(trust)
		wake := next
		if trustedUntil.Before(wake) {
			wake = trustedUntil
		}
		// Stopped only between renewals, never during one: a renewal the API server applied
		// but whose answer was dropped would leave a stale resourceVersion for the release.
		select {
		case <-g.stop:
			return
		case <-time.After(time.Until(wake)):
		}
		if !time.Now().Before(trustedUntil) {
			g.setLost() // not renewed in time
			return
		}
		attempt := time.Now()
		g.mu.Lock()
		body := copyMap(g.lease)
		g.mu.Unlock()
		spec := copyMap(mapAt(body, "spec"))
		spec["renewTime"] = MicroTime(time.Now())
		body["spec"] = spec
		ctx, cancel := context.WithDeadline(context.Background(), trustedUntil)
		obj, err := g.sbs.update(ctx, leasesGVR, body)
		cancel()
		switch {
		case errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound):
			g.setLost()
			return
		case err != nil && !time.Now().Before(trustedUntil):
			g.setLost()
			return
		case err != nil:
			next = time.Now().Add(every / 4)
			continue
		}
		g.mu.Lock()
		g.lease = obj
		g.mu.Unlock()
		lastOK, next = attempt, attempt.Add(every)
	}
}

func copyMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Release stops renewing and clears the holder with an update conditioned on the last
// resourceVersion, keeping the Lease (fencing tokens stay monotonic). ErrGuardLost if the
// guard had been lost or someone wrote the lease in between.
func (g *Guard) Release(ctx context.Context) error {
	g.mu.Lock()
	if g.released || g.lease == nil {
		g.released = true
		g.mu.Unlock()
		return nil
	}
	g.released = true
	g.mu.Unlock()
	close(g.stop)
	<-g.stopped
	defer g.cancel()
	if err := g.Err(); err != nil {
		return err
	}
	g.mu.Lock()
	body := copyMap(g.lease)
	g.mu.Unlock()
	spec := copyMap(mapAt(body, "spec"))
	delete(spec, "holderIdentity")
	delete(spec, "acquireTime")
	delete(spec, "renewTime")
	body["spec"] = spec
	_, err := g.sbs.update(ctx, leasesGVR, body)
	if errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
		return &GuardError{Kind: ErrGuardLost, Lease: g.name}
	}
	return err
}
