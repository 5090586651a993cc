package anna

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
)

// describe prints a declaration of this package in testdata/stella_sandbox.txt's notation.
func describe(name string, t reflect.Type) []string {
	q := func(t reflect.Type) string { return strings.ReplaceAll(t.String(), "anna.", "") }
	sig := func(f reflect.Type, skip int) string {
		var in, out []string
		for i := skip; i < f.NumIn(); i++ {
			in = append(in, q(f.In(i)))
		}
		for i := 0; i < f.NumOut(); i++ {
			out = append(out, q(f.Out(i)))
		}
		s := "(" + strings.Join(in, ", ") + ")"
		switch len(out) {
		case 0:
		case 1:
			s += " " + out[0]
		default:
			s += " (" + strings.Join(out, ", ") + ")"
		}
		return s
	}
	var lines []string
	switch t.Kind() {
	case reflect.Interface:
		var ms []string
		for i := 0; i < t.NumMethod(); i++ {
			m := t.Method(i)
			ms = append(ms, m.Name+sig(m.Type, 0))
		}
		return []string{fmt.Sprintf("type %s interface { %s }", name, strings.Join(ms, "; "))}
	case reflect.Struct:
		var fs []string
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			fs = append(fs, f.Name+" "+q(f.Type))
		}
		lines = append(lines, fmt.Sprintf("type %s struct { %s }", name, strings.Join(fs, "; ")))
	default:
		lines = append(lines, fmt.Sprintf("type %s %s", name, t.Kind()))
	}
	for _, r := range []reflect.Type{t, reflect.PointerTo(t)} {
		prefix := name
		if r.Kind() == reflect.Pointer {
			prefix = "*" + name
		}
		for i := 0; i < r.NumMethod(); i++ {
			m := r.Method(i)
			if r.Kind() == reflect.Pointer {
				if _, onValue := t.MethodByName(m.Name); onValue {
					continue
				}
			}
			lines = append(lines, fmt.Sprintf("method %s.%s%s", prefix, m.Name, sig(m.Type, 1)))
		}
	}
	return lines
}

func typeOf[T any]() reflect.Type { return reflect.TypeOf((*T)(nil)).Elem() }

// The declarations of go/anna are Stella's (testdata/stella_sandbox.txt, from Stella's
// public source at the commits it names): the same types, fields in the same order with the
// same types, the same method sets, constants and functions, so a runner written against
// Stella's pkg/sandbox compiles against this package.
func TestDeclarationsAreStellas(t *testing.T) {
	var got []string
	add := func(name string, t reflect.Type) { got = append(got, describe(name, t)...) }
	add("NetworkMode", typeOf[NetworkMode]())
	got = append(got,
		fmt.Sprintf("const NetworkDisabled NetworkMode = %q", string(NetworkDisabled)),
		fmt.Sprintf("const NetworkAllowAll NetworkMode = %q", string(NetworkAllowAll)))
	add("Policy", typeOf[Policy]())
	add("FilesystemPolicy", typeOf[FilesystemPolicy]())
	add("HomeAttachment", typeOf[HomeAttachment]())
	add("NetworkPolicy", typeOf[NetworkPolicy]())
	add("PolicyCompatibilityError", typeOf[PolicyCompatibilityError]())
	got = append(got, "func IsPolicyCompatibilityError"+strings.TrimPrefix(strings.ReplaceAll(reflect.TypeOf(IsPolicyCompatibilityError).String(), "anna.", ""), "func"))
	add("Factory", typeOf[Factory]())
	add("Session", typeOf[Session]())
	add("EnvRefresher", typeOf[EnvRefresher]())
	add("ExecOptions", typeOf[ExecOptions]())
	add("ExecResult", typeOf[ExecResult]())
	add("ProcessRequest", typeOf[ProcessRequest]())
	add("ProcessHandle", typeOf[ProcessHandle]())
	add("DirEntry", typeOf[DirEntry]())
	add("FileInfo", typeOf[FileInfo]())
	add("ProjectedFile", typeOf[ProjectedFile]())
	got = append(got, "var ErrProjectionConflict "+reflect.TypeOf(&ErrProjectionConflict).Elem().String())
	add("FileAccess", typeOf[FileAccess]())

	raw, err := os.ReadFile("testdata/stella_sandbox.txt")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, l := range strings.Split(string(raw), "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			want = append(want, l)
		}
	}
	for i := 0; i < max(len(got), len(want)); i++ {
		var g, w string
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g != w {
			t.Errorf("declaration %d:\n go/anna: %s\n Stella:  %s", i+1, g, w)
		}
	}
}

// What agentbox adds is reachable without a type assertion: Open gives the concrete session,
// which is a Session and an EnvRefresher, with FS (every file operation) and ResolvePath.
func TestAgentboxSessionHasItsExtrasWithoutAssertion(t *testing.T) {
	open := reflect.TypeOf((*Agentbox).Open)
	if open.Out(0) != reflect.TypeOf(&AgentboxSession{}) {
		t.Fatalf("Open gives %v", open.Out(0))
	}
	s := reflect.TypeOf(&AgentboxSession{})
	for _, m := range []string{"FS", "ResolvePath", "Sandbox", "RefreshEnv"} {
		if _, ok := s.MethodByName(m); !ok {
			t.Errorf("no %s", m)
		}
	}
	f := reflect.TypeOf(&Files{})
	for _, m := range []string{"ReadFile", "WriteFile", "Stat", "Lstat", "ReadDir", "Remove", "RemoveAll", "Mkdir", "ProjectFiles"} {
		if _, ok := f.MethodByName(m); !ok {
			t.Errorf("Files has no %s", m)
		}
	}
}
