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

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
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

// Verdicts of Judge and JudgeReading.
const (
	Take  = "Take"
	Wait  = "Wait"
	Queue = "Queue"
)

// Annotations of the guard Lease's queue slot (docs/protocol.md, "The scope guard").
const (
	// NextAnnotation is the holder identity of the contender queued next.
	NextAnnotation = "agentbox.dev/guard-next"
	// NextRenewAnnotation is when that contender last claimed or refreshed its place.
	NextRenewAnnotation = "agentbox.dev/guard-next-renew"
	// FairHolderAnnotation names the holder that took the Lease knowing the queue slot;
	// contenders write the slot only while the Lease's holder is the one named here.
	FairHolderAnnotation = "agentbox.dev/guard-fair-holder"
)

// Yield is the longest a holder whose hold was shared (its acquisition waited for another
// party, or it created the Lease or took it from another holder) leaves a free Lease without
// a claim to others after releasing it: the one that waited meanwhile may not have claimed the
// queue slot yet (its claim races a short turn), and the releaser, wanting the guard again at
// once, would take it first. The yield ends as soon as the Lease shows another party acting
// (a take or a claim), so the bound only matters when nobody else wants the guard any more.
const Yield = time.Second

// released: when each holder of this process last released a Lease after a shared hold.
var released sync.Map // leaseKey+"\n"+holder -> time.Time

func yieldLeft(key string) time.Duration {
	at, ok := released.Load(key)
	if !ok {
		return 0
	}
	return max(0, Yield-time.Since(at.(time.Time)))
}

// WatchFallback is the longest a waiting contender goes without reading the Lease again while
// it watches it (a third of the lease duration when that is shorter).
const WatchFallback = 2 * time.Second

// LeaseReading is a contender's reading of a lease: what it read, when, and how long (on its
// monotonic clock) it has seen the parts that matter unchanged.
type LeaseReading struct {
	Spec        map[string]any    // nil: no lease
	Annotations map[string]string // the queue slot
	Now         time.Time
	// UnchangedFor is how long holderIdentity and renewTime have been unchanged (not the
	// resourceVersion: queue claims change that while the holder is gone).
	UnchangedFor time.Duration
	// SlotUnchangedFor is how long the queue slot (owner and renew time) has been unchanged.
	SlotUnchangedFor time.Duration
}

func leaseDuration(spec map[string]any, def time.Duration) time.Duration {
	if f, ok := spec["leaseDurationSeconds"].(float64); ok && f > 0 && f == math.Trunc(f) {
		return time.Duration(f) * time.Second
	} else if n, ok := spec["leaseDurationSeconds"].(int64); ok && n > 0 {
		return time.Duration(n) * time.Second
	}
	return def
}

func leaseHeld(spec map[string]any, now time.Time, unchangedFor, clockSkew, duration time.Duration) bool {
	if spec == nil || str(spec["holderIdentity"]) == "" || unchangedFor >= duration {
		return false
	}
	if renew := str(spec["renewTime"]); renew != "" {
		t, err := ParseTime(renew)
		if err != nil {
			return true
		}
		if !t.Add(duration + clockSkew).After(now) {
			return false
		}
	}
	return true
}

// FreshSlot is the queue slot's owner if its claim is fresh (pure): named, and neither its
// renew time plus duration plus clockSkew is past nor has it been unchanged for duration; ""
// otherwise. A claim without a readable renew time is stale.
func FreshSlot(annotations map[string]string, now time.Time, slotUnchangedFor, duration, clockSkew time.Duration) string {
	owner, renew := annotations[NextAnnotation], annotations[NextRenewAnnotation]
	if owner == "" || renew == "" {
		return ""
	}
	t, err := ParseTime(renew)
	if err != nil || !t.Add(duration+clockSkew).After(now) || slotUnchangedFor >= duration {
		return ""
	}
	return owner
}

// Judge says whether a contender outside the queue may take over a lease spec it just read
// (pure): now is its wall clock, unchangedFor how long it has seen the holder and renewTime
// unchanged on its monotonic clock (vectors: guard.judge without "me").
func Judge(spec map[string]any, now time.Time, unchangedFor, clockSkew, defaultDuration time.Duration) string {
	return JudgeReading(LeaseReading{Spec: spec, Now: now, UnchangedFor: unchangedFor}, "", clockSkew, defaultDuration)
}

// JudgeReading says what contender me may do with a lease it just read (pure; vectors:
// guard.judge). With me "" (outside the queue): Take when free or expired, else Wait. Else a
// free lease is Take unless another's claim on the slot is fresh (Wait); a lease held by a
// holder that expects the queue is Queue when the slot is empty, stale or me's, else Wait;
// behind any other holder, Wait.
func JudgeReading(r LeaseReading, me string, clockSkew, defaultDuration time.Duration) string {
	duration := leaseDuration(r.Spec, defaultDuration)
	held := leaseHeld(r.Spec, r.Now, r.UnchangedFor, clockSkew, duration)
	if me == "" {
		if held {
			return Wait
		}
		return Take
	}
	slot := FreshSlot(r.Annotations, r.Now, r.SlotUnchangedFor, duration, clockSkew)
	othersQueued := slot != "" && slot != me
	if !held {
		if othersQueued {
			return Wait
		}
		return Take
	}
	fair, ok := r.Annotations[FairHolderAnnotation]
	if ok && fair == str(r.Spec["holderIdentity"]) && !othersQueued {
		return Queue
	}
	return Wait
}

func copyStrings(m map[string]string) map[string]string {
	out := make(map[string]string, len(m)+2)
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TakenAnnotations are the annotations written when taking a lease (pure): the queue slot
// cleared, the taker named as a holder that expects the queue.
func TakenAnnotations(old map[string]string, me string) map[string]string {
	a := copyStrings(old)
	delete(a, NextAnnotation)
	delete(a, NextRenewAnnotation)
	a[FairHolderAnnotation] = me
	return a
}

// ClaimedAnnotations are the annotations written when claiming or refreshing the queue slot
// at now (pure).
func ClaimedAnnotations(old map[string]string, me string, now time.Time) map[string]string {
	a := copyStrings(old)
	a[NextAnnotation] = me
	a[NextRenewAnnotation] = MicroTime(now)
	return a
}

// WithdrawnAnnotations are the annotations written by a contender that gives up waiting
// (pure): the slot cleared if it is still me's; nil when it is not (nothing to write).
func WithdrawnAnnotations(old map[string]string, me string) map[string]string {
	if old == nil || old[NextAnnotation] != me {
		return nil
	}
	a := copyStrings(old)
	delete(a, NextAnnotation)
	delete(a, NextRenewAnnotation)
	return a
}

// SharedHold says whether a hold makes its holder yield after releasing it (pure): its
// acquisition had to wait for another party (waiting out its own yield does not count), or the
// Lease it took (before: its annotations as taken, nil when it created the Lease) did not name
// me as its last fair holder. A contender outside the queue never yields.
func SharedHold(queue, waited bool, before map[string]string, me string) bool {
	last, ok := before[FairHolderAnnotation]
	return queue && (waited || !ok || last != me)
}

// YieldFor is how much longer a contender whose verdict is Take leaves the free Lease to others
// (pure): yieldLeft (Yield less the time since its last release of a shared hold) if the Lease
// still names me as its last fair holder and the queue slot is not me's, else 0. Only the last
// holder yields, so two harnesses that both released recently never both stand back.
func YieldFor(annotations map[string]string, me string, yieldLeft time.Duration) time.Duration {
	if annotations[NextAnnotation] == me || annotations[FairHolderAnnotation] != me {
		return 0
	}
	return yieldLeft
}

// ReleasedSpec is the spec written when releasing (pure): no holder and no times; the
// duration and the fencing token kept. The annotations (the queue slot) are kept as they are.
func ReleasedSpec(spec map[string]any) map[string]any {
	out := copyMap(spec)
	delete(out, "holderIdentity")
	delete(out, "acquireTime")
	delete(out, "renewTime")
	return out
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

	mu        sync.Mutex
	contended bool // a shared hold (waited, created, or taken from another): on release, yield (Yield)
	lease     map[string]any
	token     int64
	released  bool
	lostErr   error
	ctx       context.Context
	cancel    context.CancelFunc
	stop      chan struct{}
	stopped   chan struct{}
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
// ErrGuardTimeout), and starts renewing it. While it waits it holds the Lease's queue slot
// when it can and watches the Lease for a release (docs/protocol.md, "The scope guard").
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
	w := &waiter{g: g, wake: make(chan struct{}, 1)}
	defer w.close()
	for {
		attempt := time.Now()
		mayQueue := deadline.IsZero() || attempt.Before(deadline)
		st, err := w.step(ctx, mayQueue)
		if err != nil && (!retryable(err) || (!deadline.IsZero() && time.Now().After(deadline))) {
			return err
		}
		if st.took != nil {
			w.claimedAt = time.Time{}
			g.contended = SharedHold(true, w.waited, w.tookFrom, g.cfg.Holder)
			g.start(st.took, attempt)
			return nil
		}
		// Waiting out its own yield is not contention: a harness whose partner left would
		// otherwise yield again after every turn.
		if err != nil || st.again || w.yieldUntil.IsZero() {
			w.waited = true
		}
		if err == nil && st.again {
			// Lost a race: read the Lease itself at once. What the watch delivered so far
			// may be what the 409 was about (the watch trails the API server).
			w.latestMu.Lock()
			w.latest = nil
			w.latestMu.Unlock()
			continue
		}
		var pause time.Duration
		if err != nil {
			pause = time.Duration(float64(g.cfg.RetryInterval) * (0.5 + mrand.Float64()))
		} else {
			w.watchFrom(st.rv)
			pause = min(WatchFallback, g.cfg.RenewEvery())
			if !w.yieldUntil.IsZero() {
				pause = min(pause, max(0, time.Until(w.yieldUntil)))
				w.yieldUntil = time.Time{}
			}
			if !w.claimedAt.IsZero() {
				pause = min(pause, max(0, time.Until(w.claimedAt.Add(refreshEvery(g.cfg, st.duration)))))
			}
		}
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return &GuardError{Kind: ErrGuardTimeout, Lease: g.name, Holder: w.lastHolder}
			}
			pause = min(pause, left)
		}
		select {
		case <-ctx.Done():
			return &GuardError{Kind: ErrGuardTimeout, Lease: g.name, Holder: w.lastHolder}
		case <-w.wake:
		case <-time.After(pause):
		}
	}
}

// refreshEvery is the queue claim's refresh period: a third of the shorter of the two
// durations.
func refreshEvery(cfg GuardConfig, leaseDuration time.Duration) time.Duration {
	return min(time.Duration(cfg.DurationSecs())*time.Second, leaseDuration) / 3
}

// stillOurs: the Lease is still held by holder with fencing token token (whatever else
// changed: a contender's claim on the queue slot changes the resourceVersion only).
func stillOurs(lease map[string]any, holder string, token int64) bool {
	spec := mapAt(lease, "spec")
	t, _ := intOf(spec["leaseTransitions"])
	return lease != nil && str(spec["holderIdentity"]) == holder && t == token
}

func annotationsOf(obj map[string]any) map[string]string {
	out := map[string]string{}
	a, _ := mapAt(obj, "metadata")["annotations"].(map[string]any)
	for k, v := range a {
		out[k] = str(v)
	}
	return out
}

// waiter is a contender's state while it waits for one Lease.
type waiter struct {
	g                    *Guard
	holderKey, slotKey   string
	holderSeen, slotSeen time.Time
	lastHolder           string
	waited               bool              // this acquisition had to wait for another party
	tookFrom             map[string]string // the annotations of the Lease it took; nil: it created it
	yieldUntil           time.Time         // until when it yields a free Lease to others (Yield)
	claimedAt            time.Time         // when it last wrote its claim on the slot; zero: none
	wake                 chan struct{}
	stopWatch            context.CancelFunc
	// latest is the Lease as the watch last delivered it, not yet judged: read instead of a
	// GET (a waiter that reacts one request sooner claims the slot before a short turn ends).
	latestMu sync.Mutex
	latest   map[string]any
}

type stepResult struct {
	took     map[string]any
	again    bool
	rv       string
	duration time.Duration
}

func unchangedFor(key *string, since *time.Time, now time.Time, cur string) time.Duration {
	if *key != cur || since.IsZero() {
		*key, *since = cur, now
	}
	return now.Sub(*since)
}

// step is one attempt: read the Lease, judge it, and take it, claim the slot, or wait.
func (w *waiter) step(ctx context.Context, mayQueue bool) (stepResult, error) {
	g := w.g
	me := g.cfg.Holder
	now := time.Now()
	w.latestMu.Lock()
	cur := w.latest
	w.latest = nil
	w.latestMu.Unlock()
	if cur == nil {
		var err error
		if cur, err = g.sbs.get(ctx, leasesGVR, g.name); err != nil {
			return stepResult{}, err
		}
	}
	if cur == nil {
		meta := map[string]any{"name": g.name, "annotations": toAny(TakenAnnotations(nil, me))}
		if len(g.labels) > 0 {
			meta["labels"] = toAny(g.labels)
		}
		body := map[string]any{"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": TakenSpec(nil, g.cfg, now)}
		w.tookFrom = nil
		obj, err := g.sbs.create(ctx, leasesGVR, body)
		if errors.Is(err, ErrConflict) {
			return stepResult{again: true}, nil
		}
		return stepResult{took: obj}, err
	}
	meta := mapAt(cur, "metadata")
	rv := str(meta["resourceVersion"])
	spec, _ := cur["spec"].(map[string]any)
	ann := annotationsOf(cur)
	holder := str(spec["holderIdentity"])
	mono := time.Now()
	r := LeaseReading{
		Spec: spec, Annotations: ann, Now: now,
		UnchangedFor:     unchangedFor(&w.holderKey, &w.holderSeen, mono, holder+"\n"+str(spec["renewTime"])),
		SlotUnchangedFor: unchangedFor(&w.slotKey, &w.slotSeen, mono, ann[NextAnnotation]+"\n"+ann[NextRenewAnnotation]),
	}
	w.lastHolder = holder
	verdict := JudgeReading(r, me, g.cfg.ClockSkew, g.cfg.LeaseDuration)
	duration := leaseDuration(spec, g.cfg.LeaseDuration)
	if ann[NextAnnotation] != me {
		w.claimedAt = time.Time{}
	}
	wait := stepResult{rv: rv, duration: duration}
	switch verdict {
	case Wait:
		return wait, nil
	case Queue:
		due := w.claimedAt.IsZero() || time.Since(w.claimedAt) >= refreshEvery(g.cfg, duration)
		if !mayQueue || !due {
			return wait, nil
		}
		at := time.Now()
		meta["annotations"] = toAny(ClaimedAnnotations(ann, me, time.Now()))
		// Conditioned on the resourceVersion read: a 409 means the Lease changed.
		obj, err := g.sbs.update(ctx, leasesGVR, cur)
		if errors.Is(err, ErrConflict) {
			return stepResult{again: true}, nil
		}
		if err != nil {
			return stepResult{}, err
		}
		w.claimedAt = at
		return stepResult{rv: str(mapAt(obj, "metadata")["resourceVersion"]), duration: duration}, nil
	}
	if grace := YieldFor(ann, me, yieldLeft(g.releaseKey())); grace > 0 {
		// Just released after a shared hold: give whoever waited for it the time to claim the
		// slot or take it (ended early by a watch event showing it act).
		w.yieldUntil = time.Now().Add(grace)
		return wait, nil
	}
	w.tookFrom = ann
	if w.tookFrom == nil {
		w.tookFrom = map[string]string{}
	}
	cur["spec"] = TakenSpec(spec, g.cfg, now)
	meta["annotations"] = toAny(TakenAnnotations(ann, me))
	if len(g.labels) > 0 {
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
		return stepResult{again: true}, nil
	}
	return stepResult{took: obj}, err
}

func (w *waiter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// watchFrom starts watching the Lease (once) from rv: every event wakes the waiter. When the
// watch cannot be opened (no permission, no API server) it wakes it every retry interval.
func (w *waiter) watchFrom(rv string) {
	if w.stopWatch != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	w.stopWatch = cancel
	go func() {
		sel := "metadata.name=" + w.g.name
		for ctx.Err() == nil {
			timeout := int64(240)
			wi, err := w.g.sbs.res(leasesGVR).Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: rv, TimeoutSeconds: &timeout})
			if err != nil {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Duration(float64(w.g.cfg.RetryInterval) * (0.5 + mrand.Float64()))):
				}
				rv = ""
				w.signal()
				continue
			}
			for ev := range wi.ResultChan() {
				if ev.Type == watch.Error {
					rv = "" // too old a version (410): start from now
					w.signal()
					break
				}
				if u, ok := ev.Object.(*unstructured.Unstructured); ok {
					rv = u.GetResourceVersion()
					w.latestMu.Lock()
					w.latest = nil
					if ev.Type == watch.Added || ev.Type == watch.Modified {
						w.latest = u.Object
					}
					w.latestMu.Unlock()
				}
				if ev.Type != watch.Bookmark {
					w.signal()
				}
			}
			wi.Stop()
		}
	}()
}

// close stops watching and gives up the queue slot if this contender holds it (best effort:
// a claim left behind goes stale within a lease duration anyway).
func (w *waiter) close() {
	if w.stopWatch != nil {
		w.stopWatch()
	}
	if w.claimedAt.IsZero() {
		return
	}
	w.claimedAt = time.Time{}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	for range 3 {
		cur, err := w.g.sbs.get(ctx, leasesGVR, w.g.name)
		if err != nil || cur == nil {
			return
		}
		a := WithdrawnAnnotations(annotationsOf(cur), w.g.cfg.Holder)
		if a == nil {
			return
		}
		mapAt(cur, "metadata")["annotations"] = toAny(a)
		if _, err := w.g.sbs.update(ctx, leasesGVR, cur); !errors.Is(err, ErrConflict) {
			return
		}
	}
}

func (g *Guard) releaseKey() string {
	return g.sbs.Namespace + "/" + g.name + "\n" + g.cfg.Holder
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
		case errors.Is(err, ErrConflict):
			// Someone wrote the Lease: a contender's claim on the queue slot leaves it ours
			// (renew the fresh copy at once); anything else means it was taken.
			rctx, rcancel := context.WithDeadline(context.Background(), trustedUntil)
			cur, rerr := g.sbs.get(rctx, leasesGVR, g.name)
			rcancel()
			if rerr != nil && time.Now().Before(trustedUntil) {
				next = time.Now().Add(every / 4)
				continue
			}
			if rerr != nil || !stillOurs(cur, g.cfg.Holder, g.FencingToken()) {
				g.setLost()
				return
			}
			g.mu.Lock()
			g.lease = cur
			g.mu.Unlock()
			next = time.Now()
			continue
		case errors.Is(err, ErrNotFound):
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
	lease := g.lease
	g.mu.Unlock()
	for range 5 {
		body := copyMap(lease)
		body["spec"] = ReleasedSpec(mapAt(lease, "spec"))
		_, err := g.sbs.update(ctx, leasesGVR, body)
		if err == nil && g.contended {
			released.Store(g.releaseKey(), time.Now())
		}
		switch {
		case errors.Is(err, ErrNotFound):
			return &GuardError{Kind: ErrGuardLost, Lease: g.name}
		case errors.Is(err, ErrConflict):
			// A queued contender's claim changed the resourceVersion: release the fresh copy
			// if it is still ours. The slot is kept.
			cur, err := g.sbs.get(ctx, leasesGVR, g.name)
			if err != nil {
				return err
			}
			if !stillOurs(cur, g.cfg.Holder, g.FencingToken()) {
				return &GuardError{Kind: ErrGuardLost, Lease: g.name}
			}
			lease = cur
		default:
			return err
		}
	}
	return &GuardError{Kind: ErrGuardLost, Lease: g.name}
}
