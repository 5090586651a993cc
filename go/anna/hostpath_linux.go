//go:build linux

package anna

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	agentbox "agentbox.dev/go"
	"golang.org/x/sys/unix"
)

// hostRoot is the workspace's directory on this host, pinned by a descriptor, and the
// descriptors ResolvePath opened beneath it (kept until close: the paths it returned name
// them).
type hostRoot struct {
	mu     sync.Mutex
	dir    int // O_PATH descriptor of the workspace's directory; -1 once closed
	pinned map[[2]uint64]int
}

// openHostRoot pins dir, the workspace's directory on the node as the Sandbox's status
// names it; ErrNoHostPath when this host has no such directory (the runner is elsewhere).
// The directory's own ancestors are the operator's (its node root), not the sandbox's: they
// are followed as they are.
func openHostRoot(dir string) (*hostRoot, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w (the sandbox has no host directory in its status)", ErrNoHostPath)
	}
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w (%s is not a directory here: %v)", ErrNoHostPath, dir, err)
	}
	return &hostRoot{dir: fd, pinned: map[[2]uint64]int{}}, nil
}

func (h *hostRoot) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dir < 0 {
		return
	}
	for _, fd := range h.pinned {
		_ = unix.Close(fd)
	}
	h.pinned = nil
	_ = unix.Close(h.dir)
	h.dir = -1
}

// resolve opens rel (slash-separated components, no "." or "..": agentbox.Confine's output
// less the root; "" is the root) beneath the pinned directory without following any symlink
// and returns /proc/<pid>/fd/<n> of that descriptor. Opening that path reopens the inode the
// descriptor holds (a /proc magic link is not resolved again by name), so what is renamed or
// replaced by a symlink in the workspace afterwards cannot redirect it. One descriptor per
// file: the same file resolved again gives the same path.
func (h *hostRoot) resolve(rel, asked string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.dir < 0 {
		return "", ErrClosed
	}
	fd, err := openBeneath(h.dir, rel)
	if err != nil {
		return "", hostPathErr(asked, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return "", hostPathErr(asked, err)
	}
	key := [2]uint64{uint64(st.Dev), st.Ino}
	if old, ok := h.pinned[key]; ok {
		_ = unix.Close(fd)
		fd = old
	} else {
		h.pinned[key] = fd
	}
	return fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), fd), nil
}

func hostPathErr(asked string, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("%w: %s does not exist in the workspace (create files through Files())", fs.ErrNotExist, asked)
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV), errors.Is(err, errSymlink):
		return &agentbox.PathError{Path: asked, Reason: "Symlink", Msg: fmt.Sprintf("path %q passes through a symlink (refused: it could lead out of the workspace)", asked)}
	}
	return &agentbox.PathError{Path: asked, Reason: "Invalid", Msg: fmt.Sprintf("path %q cannot be resolved on the node: %v", asked, err)}
}

var errSymlink = errors.New("a component is a symlink")

// noOpenat2 is set once the kernel said it has no openat2 (Linux < 5.6, or a seccomp
// filter refusing it): then openBeneath walks.
var noOpenat2 atomic.Bool

// openBeneath opens rel beneath dir as an O_PATH descriptor, refusing symlinks in every
// component and any escape from dir: openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS (one
// step in the kernel), else a walk.
func openBeneath(dir int, rel string) (int, error) {
	if !noOpenat2.Load() {
		p := rel
		if p == "" {
			p = "."
		}
		for {
			fd, err := unix.Openat2(dir, p, &unix.OpenHow{
				Flags:   unix.O_PATH | unix.O_CLOEXEC,
				Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
			})
			if err == unix.EAGAIN || err == unix.EINTR { // a rename raced the lookup
				continue
			}
			if err == unix.ENOSYS {
				noOpenat2.Store(true)
				break
			}
			return fd, err
		}
	}
	return walkBeneath(dir, rel)
}

// walkBeneath opens rel beneath dir one component at a time, each with O_NOFOLLOW relative
// to the descriptor of the one before: a component that is a symlink is refused (O_PATH with
// O_NOFOLLOW opens the link itself, seen by fstat), so nothing is followed and, with no ".."
// components, nothing leaves dir.
func walkBeneath(dir int, rel string) (int, error) {
	cur, err := unix.Openat(dir, ".", unix.O_PATH|unix.O_CLOEXEC|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, err
	}
	if rel == "" {
		return cur, nil
	}
	for _, c := range strings.Split(rel, "/") {
		if c == "" || c == "." || c == ".." {
			_ = unix.Close(cur)
			return -1, unix.EINVAL
		}
		next, err := unix.Openat(cur, c, unix.O_PATH|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		_ = unix.Close(cur)
		if err != nil {
			return -1, err
		}
		var st unix.Stat_t
		if err := unix.Fstat(next, &st); err != nil {
			_ = unix.Close(next)
			return -1, err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			_ = unix.Close(next)
			return -1, errSymlink
		}
		cur = next
	}
	return cur, nil
}
