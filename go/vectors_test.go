package agentbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"
)

// vectors is tests/vectors/protocol.json, written by `cargo run --bin vectorgen` from the
// Rust code: every rule of docs/protocol.md, byte for byte.
var vectors = func() map[string]any {
	raw, err := os.ReadFile("../tests/vectors/protocol.json")
	if err != nil {
		panic(err)
	}
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		panic(err)
	}
	return v
}()

func vec(path ...string) any {
	var cur any = vectors
	for _, p := range path {
		cur = cur.(map[string]any)[p]
	}
	return cur
}

func cases(path ...string) []map[string]any {
	var out []map[string]any
	for _, c := range vec(path...).([]any) {
		out = append(out, c.(map[string]any))
	}
	return out
}

func strs(v any) []string {
	out := []string{}
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}

func strMap(v any) map[string]string {
	out := map[string]string{}
	for k, s := range v.(map[string]any) {
		out[k] = s.(string)
	}
	return out
}

func num(v any) int64 { return int64(v.(float64)) }

// Format 2 is the lossless exec frame's (the trailer cases, requests with a stdin); format 1
// the earlier frame's.
func TestTheVectorFileIsTheFormatThisSuiteReads(t *testing.T) {
	if f := vec("format").(float64); f != 1 && f != 2 {
		t.Fatalf("format %v", f)
	}
	if (vec("format").(float64) == 2) != losslessVectors() {
		t.Fatal("format 2 without the trailer cases, or the other way round")
	}
}

func TestLabelAndAnnotationKeys(t *testing.T) {
	v := vec("labels").(map[string]any)
	got := map[string]any{
		"scope": LabelScope, "scope_key": LabelScopeKey, "agent": LabelAgent, "user": LabelUser,
		"session": LabelSession, "sandbox": LabelSandbox, "managed_by": LabelManagedBy,
		"manager": Manager, "agent_id": AnnotAgentID, "user_id": AnnotUserID,
		"session_id": AnnotSessionID, "scope_key_len": float64(ScopeKeyLen), "max_label": float64(MaxLabel),
	}
	if !reflect.DeepEqual(got, v) {
		t.Fatalf("got %v\nwant %v", got, v)
	}
}

func TestScopeKeysLabelsAndNames(t *testing.T) {
	for _, c := range cases("scopes") {
		sm := strMap(c["scope"])
		s := Scope{Kind: ScopeKind(sm["kind"]), Agent: sm["agent"], User: sm["user"], Session: sm["session"]}
		if err := s.Validate(); err != nil {
			t.Fatalf("%v: %v", s, err)
		}
		if !reflect.DeepEqual(strMap(scopeMap(s)), sm) {
			t.Errorf("%v: JSON form %v", s, scopeMap(s))
		}
		key := ScopeKey(s)
		name := SandboxNameForScope(s)
		checks := []struct {
			what      string
			got, want any
		}{
			{"key", key, c["scope_key"]},
			{"labels", ScopeLabels(s), strMap(c["labels"])},
			{"annotations", ScopeAnnotations(s), strMap(c["annotations"])},
			{"selector", ScopeSelector(s), c["selector"]},
			{"sandbox name", name, c["sandbox_name"]},
			{"pod name", PodName(name), c["pod_name"]},
			{"sandbox label", SandboxLabelValue(name), c["sandbox_label_value"]},
			{"lease", LeaseName(key), c["lease_name"]},
		}
		for _, ch := range checks {
			if !reflect.DeepEqual(ch.got, ch.want) {
				t.Errorf("%v: %s: got %v want %v", s, ch.what, ch.got, ch.want)
			}
		}
	}
}

func TestLabelValueValidity(t *testing.T) {
	for _, c := range cases("label_values") {
		if got := IsValidLabelValue(c["value"].(string)); got != c["valid"].(bool) {
			t.Errorf("%q: got %v", c["value"], got)
		}
	}
}

func TestBoundedNames(t *testing.T) {
	for _, c := range cases("bounded_names") {
		if got := BoundedName(c["base"].(string), int(num(c["max"]))); got != c["name"] {
			t.Errorf("%q %v: got %q want %q", c["base"], c["max"], got, c["name"])
		}
	}
}

func TestPathConfinement(t *testing.T) {
	for _, c := range cases("confine") {
		got, err := Confine(c["root"].(string), c["path"].(string))
		if want, ok := c["ok"]; ok {
			if err != nil || got != want {
				t.Errorf("%v|%v: got %q, %v; want %q", c["root"], c["path"], got, err, want)
			}
			continue
		}
		var pe *PathError
		if !errors.As(err, &pe) || pe.Reason != c["error"] || !errors.Is(err, ErrPath) {
			t.Errorf("%v|%v: got %q, %v; want error %v", c["root"], c["path"], got, err, c["error"])
		}
	}
}

func TestExecConstants(t *testing.T) {
	v := vec("exec").(map[string]any)
	ch := v["channels"].(map[string]any)
	got := []int64{StdinChannel, StdoutChannel, StderrChannel, StatusChannel, CloseChannel, StdinFrame, DefaultMaxOutput, TimeoutGrace.Milliseconds()}
	want := []int64{num(ch["stdin"]), num(ch["stdout"]), num(ch["stderr"]), num(ch["status"]), num(ch["close"]), num(v["stdin_frame"]), num(v["default_max_output"]), num(v["timeout_grace_ms"])}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
	if v["container"] != SandboxContainer {
		t.Fatalf("container %v", v["container"])
	}
	// The first (preferred) protocol is the one this client offers, alone (docs/protocol.md).
	if strs(v["protocols"])[0] != Protocol {
		t.Fatalf("protocols %v", v["protocols"])
	}
}

// frameOf reads a vector request.
func frameOf(r map[string]any) Frame {
	f := Frame{Argv: strs(r["argv"])}
	for _, e := range r["env"].([]any) {
		p := strs(e)
		f.Env = append(f.Env, EnvVar{p[0], p[1]})
	}
	if w, ok := r["workdir"].(string); ok {
		f.Workdir = w
	}
	if ms, ok := r["timeout_ms"].(float64); ok {
		d := time.Duration(ms) * time.Millisecond
		f.Timeout = &d
	}
	return f
}

func TestSleepArg(t *testing.T) {
	for _, c := range cases("exec", "sleep_arg") {
		if got := SleepArg(time.Duration(num(c["ms"])) * time.Millisecond); got != c["arg"] {
			t.Errorf("%v ms: got %q want %q", c["ms"], got, c["arg"])
		}
	}
}

func TestExitStatusFromTheStatusChannel(t *testing.T) {
	for _, c := range cases("exec", "status") {
		raw, _ := json.Marshal(c["status"])
		out := c["outcome"].(map[string]any)
		st, err := ParseStatus(raw)
		switch {
		case out["code"] != nil:
			if err != nil || !st.HasCode || st.Code != int(num(out["code"])) {
				t.Errorf("%s: got %+v, %v", raw, st, err)
			}
		case out["unknown"] != nil:
			if err != nil || st.HasCode || st.Message != out["unknown"] {
				t.Errorf("%s: got %+v, %v", raw, st, err)
			}
		default:
			if !errors.Is(err, ErrCommandNotStarted) || err.Error() != out["not_started"] {
				t.Errorf("%s: got %+v, %v", raw, st, err)
			}
		}
	}
	if _, err := ParseStatus([]byte("{nope")); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a status that is not JSON: %v", err)
	}
}

func TestSessionFraming(t *testing.T) {
	for _, c := range cases("session", "framing") {
		start, _ := c["start"].(string)
		f := NewFramer(start, c["end"].(string), int(num(c["cap"])))
		got := map[string]any{"incomplete": true}
		for i, ch := range strs(c["chunks"]) {
			done, tr, rest, err := f.Feed([]byte(ch))
			if err != nil {
				if !errors.Is(err, ErrSession) {
					t.Errorf("error %v", err)
				}
				got = map[string]any{"error": "Session", "after_chunk": float64(i)}
				break
			}
			if done {
				got = map[string]any{"trailer": tr, "rest": string(rest), "after_chunk": float64(i)}
				break
			}
		}
		if !reflect.DeepEqual(got, c["outcome"]) {
			t.Errorf("%q: got %v want %v", c["chunks"], got, c["outcome"])
		}
		if string(f.Out()) != c["out"] || f.Truncated() != c["truncated"] {
			t.Errorf("%q: out %q truncated %v", c["chunks"], f.Out(), f.Truncated())
		}
	}
}

func TestFileScriptsAreTheRustOnes(t *testing.T) {
	v := vec("files").(map[string]any)
	got := map[string]any{"read": ScriptRead, "write": ScriptWrite, "list": ScriptList, "upload": ScriptUpload, "download": ScriptDownload}
	if !reflect.DeepEqual(got, v["scripts"]) || v["prologue"] != FilesPrologue || v["argv0"] != FilesArgv0 {
		t.Fatal("the file scripts differ from the vectors'")
	}
	if num(v["exit_escapes"]) != ExitEscapes || num(v["exit_missing"]) != ExitMissing || num(v["exit_spool_failed"]) != ExitSpoolFailed || num(v["exit_too_large"]) != ExitUploadTooLarge || num(v["read_cap"]) != ReadCap {
		t.Fatal("the file constants differ from the vectors'")
	}
}

func TestAFailedUploadSpoolIsItsOwnError(t *testing.T) {
	r := &ExecResult{ExitCode: ExitSpoolFailed, Stderr: []byte("cat: write error: No space left on device\n")}
	err := checkFile("/workspace/src", r)
	var re *RemoteError
	if !errors.Is(err, ErrUploadSpool) || !errors.Is(err, ErrRemote) || !errors.As(err, &re) || re.ExitCode != ExitSpoolFailed {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(err.Error(), "disk full") || !strings.Contains(err.Error(), "No space left on device") {
		t.Fatalf("the message names no cause: %v", err)
	}
	other := checkFile("/workspace/src", &ExecResult{ExitCode: 1})
	if errors.Is(other, ErrUploadSpool) || !errors.Is(other, ErrRemote) {
		t.Fatalf("exit 1: %v", other)
	}
}

func TestAnUploadPastTheSizeLimitIsItsOwnError(t *testing.T) {
	said := "agentbox: the upload would pass the workspace's size limit of 67108864 bytes: extracting it needs up to 41947136 bytes"
	err := checkFile("/workspace/src", &ExecResult{ExitCode: ExitUploadTooLarge, Stderr: []byte(said + "\n")})
	var re *RemoteError
	if !errors.Is(err, ErrUploadTooLarge) || !errors.Is(err, ErrRemote) || errors.Is(err, ErrUploadSpool) || !errors.As(err, &re) || re.ExitCode != ExitUploadTooLarge {
		t.Fatalf("got %v", err)
	}
	if !strings.Contains(err.Error(), "size limit of 67108864 bytes") || KindOf(err) != "UploadTooLarge" {
		t.Fatalf("the message names no cause, or the kind is wrong: %v (%s)", err, KindOf(err))
	}
	v := vec("files").(map[string]any)
	if !strings.Contains(ScriptUpload, "${"+v["limit_env"].(string)+":-}") {
		t.Fatal("the upload script does not read the vectors' limit variable")
	}
}

func TestFileRequestArgv(t *testing.T) {
	scripts := map[string]string{"read": ScriptRead, "write": ScriptWrite, "list": ScriptList, "upload": ScriptUpload, "download": ScriptDownload}
	for _, c := range cases("files", "requests") {
		argv, p, err := FileArgv(scripts[c["script"].(string)], c["root"].(string), c["path"].(string))
		if e, ok := c["error"]; ok {
			var pe *PathError
			if !errors.As(err, &pe) || pe.Reason != e {
				t.Errorf("%v: got %v want %v", c["path"], err, e)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(argv, strs(c["argv"])) || p != c["confined"] {
			t.Errorf("%v %v: got %q %q %v", c["script"], c["path"], argv, p, err)
		}
	}
}

func TestListingRecords(t *testing.T) {
	for _, c := range cases("files", "listings") {
		got, err := ParseListing([]byte(c["raw"].(string)))
		if c["error"] == true {
			if !errors.Is(err, ErrProtocol) {
				t.Errorf("%q: got %v, %v", c["raw"], got, err)
			}
			continue
		}
		want := []any{}
		gotAny := []any{}
		for _, e := range got {
			gotAny = append(gotAny, map[string]any{"name": e.Name, "kind": string(e.Kind), "size": float64(e.Size), "mode": float64(e.Mode), "mtime": float64(e.MTime)})
		}
		want = append(want, c["entries"].([]any)...)
		if err != nil || !reflect.DeepEqual(gotAny, want) {
			t.Errorf("%q: got %v, %v want %v", c["raw"], gotAny, err, want)
		}
	}
}

func TestGuardDefaults(t *testing.T) {
	d := vec("guard", "defaults").(map[string]any)
	if DefaultLeaseDuration.Milliseconds() != num(d["lease_duration_ms"]) || DefaultRetryInterval.Milliseconds() != num(d["retry_interval_ms"]) || DefaultClockSkew.Milliseconds() != num(d["clock_skew_ms"]) {
		t.Fatalf("defaults %v", d)
	}
}

func specOf(v any) map[string]any {
	m, _ := v.(map[string]any)
	return m
}

func stringsOf(v any) map[string]string {
	m, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	out := map[string]string{}
	for k, x := range m {
		out[k] = x.(string)
	}
	return out
}

func TestGuardVerdicts(t *testing.T) {
	for _, c := range cases("guard", "judge") {
		now, err := ParseTime(c["now"].(string))
		if err != nil {
			t.Fatal(err)
		}
		ms := func(k string) time.Duration {
			if _, ok := c[k]; !ok {
				return 0
			}
			return time.Duration(num(c[k])) * time.Millisecond
		}
		me, _ := c["me"].(string)
		r := LeaseReading{Spec: specOf(c["spec"]), Annotations: stringsOf(c["annotations"]), Now: now, UnchangedFor: ms("unchanged_for_ms"), SlotUnchangedFor: ms("slot_unchanged_for_ms")}
		got := JudgeReading(r, me, ms("clock_skew_ms"), ms("default_duration_ms"))
		if got != c["verdict"] {
			t.Errorf("%v: got %s", c, got)
		}
		if _, queued := c["me"]; !queued {
			if old := Judge(r.Spec, now, r.UnchangedFor, ms("clock_skew_ms"), ms("default_duration_ms")); old != c["verdict"] {
				t.Errorf("%v: Judge got %s", c, old)
			}
		}
	}
}

func TestGuardAnnotationNames(t *testing.T) {
	n := vec("guard", "annotation_names").(map[string]any)
	if n["next"] != NextAnnotation || n["next_renew"] != NextRenewAnnotation || n["fair_holder"] != FairHolderAnnotation {
		t.Fatalf("names %v", n)
	}
	d := vec("guard", "defaults").(map[string]any)
	if WatchFallback.Milliseconds() != num(d["watch_fallback_ms"]) || Yield.Milliseconds() != num(d["yield_ms"]) {
		t.Fatalf("watch fallback %v, yield %v", WatchFallback, Yield)
	}
}

func TestGuardSharedHoldAndYield(t *testing.T) {
	for _, c := range cases("guard", "shared_hold") {
		var before map[string]string
		if c["before"] != nil {
			before = stringsOf(c["before"])
		}
		got := SharedHold(c["queue"].(bool), c["waited"].(bool), before, c["me"].(string))
		if got != c["shared"].(bool) {
			t.Errorf("shared_hold %v: got %v", c, got)
		}
	}
	for _, c := range cases("guard", "yield") {
		var a map[string]string
		if c["annotations"] != nil {
			a = stringsOf(c["annotations"])
		}
		got := YieldFor(a, c["me"].(string), time.Duration(num(c["yield_left_ms"]))*time.Millisecond)
		if got.Milliseconds() != num(c["yield_ms"]) {
			t.Errorf("yield %v: got %v", c, got)
		}
	}
}

func TestGuardAnnotationWrites(t *testing.T) {
	for _, c := range cases("guard", "annotations") {
		before, me := stringsOf(c["before"]), c["me"].(string)
		now, _ := ParseTime(c["now"].(string))
		var got map[string]string
		switch c["op"] {
		case "take":
			got = TakenAnnotations(before, me)
		case "claim":
			got = ClaimedAnnotations(before, me, now)
		default:
			got = WithdrawnAnnotations(before, me)
		}
		if want := stringsOf(c["after"]); !reflect.DeepEqual(got, want) {
			t.Errorf("%v: got %v want %v", c, got, want)
		}
	}
}

func TestGuardReleasedSpec(t *testing.T) {
	for _, c := range cases("guard", "released_spec") {
		if got := ReleasedSpec(specOf(c["before"])); !reflect.DeepEqual(got, c["after"]) {
			t.Errorf("got %v want %v", got, c["after"])
		}
	}
}

func TestGuardTakenSpec(t *testing.T) {
	for _, c := range cases("guard", "taken_spec") {
		now, _ := ParseTime(c["now"].(string))
		cfg := GuardConfig{LeaseDuration: time.Duration(num(c["lease_duration_ms"])) * time.Millisecond, Holder: c["holder"].(string)}
		raw, _ := json.Marshal(TakenSpec(specOf(c["old"]), cfg, now))
		var got map[string]any
		_ = json.Unmarshal(raw, &got)
		if !reflect.DeepEqual(got, c["spec"]) {
			t.Errorf("got %v want %v", got, c["spec"])
		}
	}
}

func TestGuardTimings(t *testing.T) {
	for _, c := range cases("guard", "timings") {
		cfg := GuardConfig{LeaseDuration: time.Duration(num(c["lease_duration_ms"])) * time.Millisecond}
		if cfg.DurationSecs() != num(c["duration_secs"]) || cfg.RenewEvery().Milliseconds() != num(c["renew_every_ms"]) || cfg.TrustWindow().Round(time.Millisecond).Milliseconds() != num(c["trust_window_ms"]) {
			t.Errorf("%v: %d %v %v", c, cfg.DurationSecs(), cfg.RenewEvery(), cfg.TrustWindow())
		}
	}
}

func TestMicroTimeRoundTrips(t *testing.T) {
	want := time.Date(2027, 1, 15, 8, 0, 30, 123456000, time.UTC)
	if MicroTime(want) != "2027-01-15T08:00:30.123456Z" {
		t.Fatal(MicroTime(want))
	}
	for _, s := range []string{"2027-01-15T08:00:30.123456Z", "2027-01-15T09:00:30.123456+01:00"} {
		got, err := ParseTime(s)
		if err != nil || !got.Equal(want) {
			t.Errorf("%s: %v %v", s, got, err)
		}
	}
}

// The exec frame's vectors. Until the lossless frame's vectors are on this branch (requests
// that name a stdin, the trailer cases), the vectors state the earlier frame (TIMEOUT
// WORKDIR N ENV ARGV, no MARK and STDIN): this client's argv must then carry the same
// parameters after its MARK and STDIN. With them, everything is compared byte for byte, the
// wrapper included.
func losslessVectors() bool {
	_, ok := vec("exec").(map[string]any)["trailer"]
	return ok
}

// stdinOfRequest is the STDIN of a vector request: null none, a number of bytes, "stream".
func stdinOfRequest(r map[string]any) string {
	switch v := r["stdin"].(type) {
	case float64:
		return stdinArg(true, int64(v))
	case string:
		if v == "stream" {
			return StdinStream
		}
		panic("unknown stdin " + v)
	}
	return StdinNone
}

// The process script and its environment entry are the vectors' (Rust's remote::PROCESSES).
func TestProcessScriptIsTheVectors(t *testing.T) {
	if vec("exec", "process_env").(string) != ProcessEnv {
		t.Fatalf("ProcessEnv differs from the vectors' exec.process_env")
	}
	if s := vec("exec", "processes_script").(string); s != ScriptProcesses {
		t.Fatalf("ScriptProcesses differs from the vectors' exec.processes_script:\n%s", s)
	}
}

func TestWrapperIsTheVectors(t *testing.T) {
	w := vec("exec", "wrapper").(string)
	if losslessVectors() {
		if w != Wrapper {
			t.Fatalf("Wrapper differs from the vectors' exec.wrapper:\n%s", w)
		}
		return
	}
	// The earlier frame's wrapper: this one must differ from it (it adds the trailer and the
	// linger), and keep its timeout logic, line for line.
	if w == Wrapper {
		t.Fatal("Wrapper is the earlier frame's")
	}
	for _, line := range []string{
		`while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n-1)); done`,
		`( trap 'kill $s 2>/dev/null; exit 0' TERM; sleep "$t" & s=$!; wait $s && kill -s KILL -- -$p ) </dev/null >/dev/null 2>&1 &`,
		`kill -0 -- -$p 2>/dev/null || kill $w 2>/dev/null`,
	} {
		if !strings.Contains(w, line) || !strings.Contains(Wrapper, line) {
			t.Errorf("line %q is not in both wrappers", line)
		}
	}
}

func TestRemoteArgv(t *testing.T) {
	lossless := losslessVectors()
	for _, c := range cases("exec", "remote_argv") {
		r := c["request"].(map[string]any)
		f := frameOf(r)
		mark, _ := c["mark"].(string)
		stdin := stdinOfRequest(r)
		got, err := RemoteArgv(f, mark, stdin)
		if e, ok := c["error"]; ok {
			if e != "Invalid" || !errors.Is(err, ErrInvalid) {
				t.Errorf("%v: got %q, %v", r, got, err)
			}
			continue
		}
		want := strs(c["remote_argv"])
		if err != nil {
			t.Errorf("%v: %v", r, err)
			continue
		}
		if lossless {
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%v:\ngot  %q\nwant %q", r, got, want)
			}
			continue
		}
		// Earlier frame: a bare command, or sh -c W agentbox-exec T D N ENV... ARGV.
		if got[3] != wrapperArgv0 || got[4] != mark || got[5] != stdin {
			t.Errorf("%v: head %q", r, got[:6])
		}
		wantTail := want
		if len(want) > 3 && want[0] == "sh" && want[3] == wrapperArgv0 {
			wantTail = want[4:]
		} else {
			// No prologue then: empty timeout and workdir, no env.
			wantTail = append([]string{"", "", "0"}, want...)
		}
		if !reflect.DeepEqual(got[6:], wantTail) {
			t.Errorf("%v:\ngot  %q\nwant %q", r, got[6:], wantTail)
		}
	}
}

func TestTrailer(t *testing.T) {
	if !losslessVectors() {
		t.Log("the vectors have no trailer cases yet; TestTrailerHoldsBackOnlyWhatCouldStartTheMark checks the rule")
		return
	}
	for _, c := range cases("exec", "trailer") {
		tr := NewTrailer(c["mark"].(string))
		var out []byte
		passed := []string{}
		for _, ch := range strs(c["chunks"]) {
			p := tr.Feed([]byte(ch))
			passed = append(passed, string(p))
			out = append(out, p...)
		}
		if !reflect.DeepEqual(passed, strs(c["passed"])) || string(out) != c["out"] || tr.Complete() != c["whole"] || tr.Received != num(c["received"]) {
			t.Errorf("%q: passed %q whole %v received %d", c["chunks"], passed, tr.Complete(), tr.Received)
		}
		if m, ok := c["memory"].(bool); ok && tr.Memory() != m {
			t.Errorf("%q: memory %v", c["chunks"], tr.Memory())
		}
	}
}

func TestSessionEndTrailers(t *testing.T) {
	for _, c := range cases("session", "end_trailers") {
		code, memory, ok := ParseSessionEnd(c["trailer"].(string))
		if _, bad := c["unparsable"]; bad {
			if ok {
				t.Errorf("%q: parsed as %d %v", c["trailer"], code, memory)
			}
			continue
		}
		if !ok || int64(code) != num(c["code"]) || memory != c["memory"] {
			t.Errorf("%q: %d %v %v", c["trailer"], code, memory, ok)
		}
	}
}

func TestOutOfMemory(t *testing.T) {
	o := vec("oom").(map[string]any)
	if o["reason"] != OOMKilled || o["memory_flag"] != MemoryFlag ||
		num(o["clock_skew_ms"]) != OOMClockSkew.Milliseconds() ||
		num(o["settle_ms"]) != OOMSettle.Milliseconds() || num(o["poll_ms"]) != OOMPoll.Milliseconds() {
		t.Errorf("constants differ from the vectors: %v", o)
	}
	mt := o["memory_trailer"].(map[string]any)
	if MemoryTrailer(mt["mark"].(string)) != mt["trailer"] {
		t.Errorf("memory trailer of %q: %q", mt["mark"], MemoryTrailer(mt["mark"].(string)))
	}
	for _, f := range strs(o["counter_files"]) {
		if !strings.Contains(Wrapper, f) || !strings.Contains(SessionOOM, f) {
			t.Errorf("%s is not read by the wrapper and the session", f)
		}
	}
	for _, c := range cases("oom", "container") {
		since, err := time.Parse(time.RFC3339, c["since"].(string))
		if err != nil {
			t.Fatal(err)
		}
		pod := map[string]any{"status": c["status"]}
		if got := OOMKilledSince(pod, SandboxContainer, since); got != c["killed"] {
			t.Errorf("%v: killed %v", c["status"], got)
		}
	}
	if !errors.Is(&OutOfMemoryError{Container: true}, ErrOutOfMemory) {
		t.Error("OutOfMemoryError is not ErrOutOfMemory")
	}
}

func TestSessionCommandLine(t *testing.T) {
	lossless := losslessVectors()
	for _, c := range cases("session", "command_lines") {
		f := frameOf(c["request"].(map[string]any))
		args, err := SessionArgv(f)
		if _, ok := c["error"]; ok {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%v: %v", f, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got := CommandLine(args, c["mark"].(string))
		if lossless || f.bare() {
			if got != c["line"] {
				t.Errorf("%v:\ngot  %q\nwant %q", f, got, c["line"])
			}
			continue
		}
		// Earlier frame: the same line around the earlier argv; this one has an empty mark
		// and no stdin after agentbox-exec.
		old := strings.Replace(got, ShQuote(Wrapper), "W", 1)
		old = strings.Replace(old, "'agentbox-exec' '' '-' ", "'agentbox-exec' ", 1)
		want := strings.Replace(c["line"].(string), ShQuote(vec("exec", "wrapper").(string)), "W", 1)
		if old != want {
			t.Errorf("%v:\ngot  %q\nwant %q", f, old, want)
		}
	}
}

func TestSessionShellArgv(t *testing.T) {
	for _, c := range cases("session", "shell_argv") {
		wd, _ := c["workdir"].(string)
		got := sessionShell(wd)
		want := c["argv"].([]any)
		if len(got) != len(want) {
			t.Fatalf("%q: got %q want %q", wd, got, want)
		}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("%q: got %q want %q", wd, got, want)
			}
		}
	}
}

// TestErrorKinds: every error kind of the vectors that names a Go sentinel has it in
// errorKinds (kinds.go, generated from the same Rust table), none is there that the vectors do
// not name, and KindOf names each typed error's most specific kind.
func TestErrorKinds(t *testing.T) {
	inTable := map[string]error{}
	for _, k := range errorKinds {
		if k.err == nil || inTable[k.kind] != nil {
			t.Fatalf("kind %q: nil or twice in errorKinds", k.kind)
		}
		inTable[k.kind] = k.err
	}
	named := 0
	for _, raw := range vec("error_kinds").([]any) {
		k := raw.(map[string]any)
		name := k["kind"].(string)
		if k["go"] == nil {
			if inTable[name] != nil {
				t.Errorf("kind %s has no Go sentinel in the vectors but one in errorKinds", name)
			}
			continue
		}
		named++
		err := inTable[name]
		if err == nil {
			t.Errorf("kind %s (%v) has no sentinel in errorKinds: run `cargo run --bin clientgen`", name, k["go"])
			continue
		}
		if got := KindOf(err); got != name {
			t.Errorf("KindOf(%v) = %q, want %q", err, got, name)
		}
	}
	if named != len(errorKinds) {
		t.Errorf("the vectors name %d Go sentinels, errorKinds has %d", named, len(errorKinds))
	}

	res := &ExecResult{ExitCode: 2, StdoutTruncated: true}
	for _, c := range []struct {
		err  error
		want string
	}{
		{&APIError{Code: 404}, "NotFound"},
		{&APIError{Code: 409}, "Conflict"},
		{&APIError{Code: 422}, "InvalidSpec"},
		{&APIError{Code: 500}, "Api"},
		{invalidf("bad %s", "scope"), "InvalidRequest"},
		{&PathError{Path: "../x", Reason: "DotDot"}, "Path"},
		{protocolf("what"), "Protocol"},
		{&SandboxError{Kind: ErrSandboxFailed}, "SandboxFailed"},
		{&SandboxError{Kind: ErrSandboxNotReady}, "SandboxNotReady"},
		{&SnapshotError{Name: "s"}, "SnapshotFailed"},
		{&GuardError{Kind: ErrGuardLost}, "GuardLost"},
		{&GuardError{Kind: ErrGuardTimeout}, "GuardTimeout"},
		{&RemoteError{ExitCode: 1}, "Remote"},
		{&RemoteError{ExitCode: ExitSpoolFailed}, "UploadSpool"},
		{&RemoteError{ExitCode: ExitUploadTooLarge}, "UploadTooLarge"},
		{&OutputCutError{Stream: "stdout"}, "OutputCut"},
		{&OutputTruncatedError{Limit: 1, Result: res}, "OutputTruncated"},
		{&ExecTimeoutError{Timeout: 1}, "ExecTimeout"},
		{&CommandError{Result: res}, "Command"},
		{&OutOfMemoryError{}, "OutOfMemory"},
		{fmt.Errorf("wrapped: %w", ErrSession), "Session"},
		{errors.New("not ours"), ""},
		{nil, ""},
	} {
		if got := KindOf(c.err); got != c.want {
			t.Errorf("KindOf(%#v) = %q, want %q", c.err, got, c.want)
		}
	}
}
