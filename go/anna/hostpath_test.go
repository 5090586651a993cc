//go:build linux

package anna

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	agentbox "agentbox.dev/go"
)

// node is a temporary directory standing for a node: ws is the sandbox's workspace
// directory in it, out a directory of the node outside the workspace with a secret.
func node(t *testing.T) (ws, out string) {
	t.Helper()
	base := t.TempDir()
	ws, out = filepath.Join(base, "ns", "uid"), filepath.Join(base, "etc")
	for _, d := range []string{ws, out, filepath.Join(ws, "dir"), filepath.Join(ws, "a")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(out, "passwd"), "root:secret")
	write(t, filepath.Join(ws, "dir", "f.txt"), "in the workspace")
	return ws, out
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func link(t *testing.T, target, at string) {
	t.Helper()
	if err := os.Symlink(target, at); err != nil {
		t.Fatal(err)
	}
}

// resolvers are ResolvePath's two ways: openat2 (when the kernel has it) and the
// component-by-component walk.
func resolvers(t *testing.T, ws string) map[string]func(string) (string, error) {
	out := map[string]func(string) (string, error){}
	for _, walk := range []bool{false, true} {
		h, err := openHostRoot(ws)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.close)
		name := "openat2"
		if walk {
			name = "walk"
		}
		out[name] = func(p string) (string, error) {
			if walk {
				noOpenat2.Store(true)
				defer noOpenat2.Store(false)
			}
			return resolveHost(h, nil, "/workspace", "/workspace/dir", p)
		}
	}
	return out
}

// Every symlink form made inside the sandbox is refused, whether it leads out of the
// workspace or not; '..' and paths outside the root are refused before the node is touched.
func TestResolvePathRefusesEverySymlinkForm(t *testing.T) {
	ws, out := node(t)
	link(t, out, filepath.Join(ws, "esc"))                                // absolute link to a directory
	link(t, "../../../../../../../../etc", filepath.Join(ws, "up"))       // relative ../../.. link
	link(t, filepath.Join(out, "passwd"), filepath.Join(ws, "pw"))        // link to one file
	link(t, out, filepath.Join(ws, "a", "mid"))                           // link in a middle component
	link(t, "/nonexistent/agentbox", filepath.Join(ws, "dangling"))       // dangling link
	link(t, "dir", filepath.Join(ws, "inside"))                           // a link that stays inside
	link(t, filepath.Join(ws, "dir", "f.txt"), filepath.Join(ws, "self")) // absolute, inside
	for name, resolve := range resolvers(t, ws) {
		for _, p := range []string{
			"/workspace/esc/passwd", "/workspace/esc", "/workspace/up/passwd", "/workspace/up",
			"/workspace/pw", "/workspace/a/mid/passwd", "/workspace/a/mid", "/workspace/dangling",
			"/workspace/dangling/x", "/workspace/inside/f.txt", "/workspace/self",
		} {
			got, err := resolve(p)
			var pe *agentbox.PathError
			if !errors.As(err, &pe) || pe.Reason != "Symlink" || !errors.Is(err, agentbox.ErrPath) {
				t.Errorf("%s: %s: got %q, %v", name, p, got, err)
			}
		}
		for _, p := range []string{"../etc/passwd", "/etc/passwd", "/workspace/../etc/passwd"} {
			if got, err := resolve(p); !errors.Is(err, agentbox.ErrPath) {
				t.Errorf("%s: %s: got %q, %v", name, p, got, err)
			}
		}
		if got, err := resolve("missing.txt"); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s: missing: got %q, %v", name, got, err)
		}
	}
}

// A file resolves to a path that reads and writes that file, relative or absolute; the
// root and a directory resolve too; the same file twice is one descriptor.
func TestResolvePathGivesThePinnedFile(t *testing.T) {
	ws, _ := node(t)
	for name, resolve := range resolvers(t, ws) {
		p, err := resolve("f.txt")
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !strings.HasPrefix(p, "/proc/") {
			t.Fatalf("%s: %s", name, p)
		}
		if b, err := os.ReadFile(p); err != nil || string(b) != "in the workspace" {
			t.Fatalf("%s: read %q %v", name, b, err)
		}
		if p2, err := resolve("/workspace/dir/f.txt"); err != nil || p2 != p {
			t.Fatalf("%s: again %q %v", name, p2, err)
		}
		r, err := resolve("/workspace")
		if err != nil {
			t.Fatalf("%s: root %v", name, err)
		}
		es, err := os.ReadDir(r)
		if err != nil || len(es) != 2 {
			t.Fatalf("%s: root listing %v %v", name, es, err)
		}
	}
	p, err := resolvers(t, ws)["openat2"]("f.txt")
	if err != nil {
		t.Fatal(err)
	}
	write(t, p, "written through the host path")
	if b, _ := os.ReadFile(filepath.Join(ws, "dir", "f.txt")); string(b) != "written through the host path" {
		t.Fatalf("write went elsewhere: %q", b)
	}
}

// A symlink swapped in between ResolvePath and the runner's use: the directory on the way
// renamed and replaced by a link out, or the file itself replaced by a link to the node's
// secret. Reads and writes through the returned path still reach the workspace's file.
func TestResolvePathCannotBeRedirectedAfterTheCheck(t *testing.T) {
	for _, way := range []string{"openat2", "walk"} {
		t.Run(way, func(t *testing.T) {
			ws, out := node(t)
			resolve := resolvers(t, ws)[way]
			p, err := resolve("/workspace/dir/f.txt")
			if err != nil {
				t.Fatal(err)
			}
			// The swap: dir → a link to the node's directory holding a file of the same name.
			write(t, filepath.Join(out, "f.txt"), "the node's secret")
			if err := os.Rename(filepath.Join(ws, "dir"), filepath.Join(ws, "moved")); err != nil {
				t.Fatal(err)
			}
			link(t, out, filepath.Join(ws, "dir"))
			if b, err := os.ReadFile(p); err != nil || string(b) != "in the workspace" {
				t.Fatalf("after the directory swap: %q %v", b, err)
			}
			write(t, p, "runner's write")
			if b, _ := os.ReadFile(filepath.Join(out, "f.txt")); string(b) != "the node's secret" {
				t.Fatalf("the write went out of the workspace: %q", b)
			}
			if b, _ := os.ReadFile(filepath.Join(ws, "moved", "f.txt")); string(b) != "runner's write" {
				t.Fatalf("the write missed the workspace's file: %q", b)
			}
			// The swap of the file itself for a link to the node's passwd.
			q, err := resolve("/workspace/moved/f.txt")
			if err != nil || q != p {
				t.Fatalf("moved: %q %v", q, err)
			}
			if err := os.Remove(filepath.Join(ws, "moved", "f.txt")); err != nil {
				t.Fatal(err)
			}
			link(t, filepath.Join(out, "passwd"), filepath.Join(ws, "moved", "f.txt"))
			if b, err := os.ReadFile(p); err != nil || string(b) != "runner's write" {
				t.Fatalf("after the file swap: %q %v", b, err)
			}
			// And a fresh resolution of the swapped paths is refused.
			for _, s := range []string{"/workspace/dir/f.txt", "/workspace/moved/f.txt"} {
				if _, err := resolve(s); !errors.Is(err, agentbox.ErrPath) {
					t.Fatalf("%s after the swap: %v", s, err)
				}
			}
		})
	}
}

// Where the workspace's directory is not on this host (the usual case), ResolvePath says so.
func TestResolvePathElsewhereIsErrNoHostPath(t *testing.T) {
	for _, dir := range []string{"", filepath.Join(t.TempDir(), "not-here")} {
		h, err := openHostRoot(dir)
		if h != nil || !errors.Is(err, ErrNoHostPath) {
			t.Fatalf("%q: %v", dir, err)
		}
		if _, err := resolveHost(h, err, "/workspace", "/workspace", "x"); !errors.Is(err, ErrNoHostPath) {
			t.Fatalf("%q: %v", dir, err)
		}
	}
	ws, _ := node(t)
	h, err := openHostRoot(ws)
	if err != nil {
		t.Fatal(err)
	}
	h.close()
	if _, err := resolveHost(h, nil, "/workspace", "/workspace", "dir"); !errors.Is(err, ErrClosed) {
		t.Fatalf("after close: %v", err)
	}
}
