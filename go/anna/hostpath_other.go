//go:build !linux

package anna

import "fmt"

// hostRoot is never there off Linux: ResolvePath needs openat2 or O_PATH to be safe.
type hostRoot struct{}

func openHostRoot(dir string) (*hostRoot, error) {
	return nil, fmt.Errorf("%w (host paths are resolved on Linux only)", ErrNoHostPath)
}

func (h *hostRoot) close() {}

func (h *hostRoot) resolve(rel, asked string) (string, error) { return "", ErrNoHostPath }
