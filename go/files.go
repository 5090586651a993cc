package agentbox

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// File protocol constants (vectors: files).
const (
	// ExitEscapes is the file scripts' exit code for "resolves outside the workspace".
	ExitEscapes = 97
	// ExitMissing is their exit code for "missing or of the wrong type".
	ExitMissing = 96
	// ExitSpoolFailed is the upload script's exit code for "the archive could not be written
	// to its spool" (a full disk, most often): nothing was extracted, no spool is left.
	ExitSpoolFailed = 95
	// ExitUploadTooLarge is the upload script's exit code for "extracting the archive would pass
	// the workspace's size limit" (stderr names the sizes and the limit): nothing was extracted,
	// no spool is left.
	ExitUploadTooLarge = 94
	// ReadCap is the largest file ReadFile returns by default.
	ReadCap = 64 << 20
	// FilesArgv0 is argv[0] of the file scripts.
	FilesArgv0 = "agentbox-files"
)

func splitClean(p string) []string {
	var out []string
	for _, c := range strings.Split(p, "/") {
		if c != "" && c != "." {
			out = append(out, c)
		}
	}
	return out
}

// Confine maps path (relative to root, or absolute under it) to an absolute, normalised path
// under root; it refuses ".." anywhere and absolute paths outside the root with a PathError,
// before any request. "" and "." are the root. Pure: symlinks are checked in the pod
// (vectors: confine).
func Confine(root, path string) (string, error) {
	if strings.ContainsRune(path, 0) || !strings.HasPrefix(root, "/") {
		return "", &PathError{Path: path, Reason: "Invalid", Msg: fmt.Sprintf("invalid path %q", path)}
	}
	rootParts := splitClean(root)
	for _, c := range rootParts {
		if c == ".." {
			return "", &PathError{Path: root, Reason: "Invalid", Msg: fmt.Sprintf("invalid path %q", root)}
		}
	}
	parts := splitClean(path)
	for _, c := range parts {
		if c == ".." {
			return "", &PathError{Path: path, Reason: "DotDot", Msg: fmt.Sprintf("path %q contains '..'", path)}
		}
	}
	rel := parts
	if strings.HasPrefix(path, "/") {
		ok := len(parts) >= len(rootParts)
		for i := 0; ok && i < len(rootParts); i++ {
			ok = parts[i] == rootParts[i]
		}
		if !ok {
			return "", &PathError{Path: path, Reason: "OutsideRoot", Msg: fmt.Sprintf("path %q is outside the workspace root %q", path, root)}
		}
		rel = parts[len(rootParts):]
	}
	return "/" + strings.Join(append(append([]string{}, rootParts...), rel...), "/"), nil
}

// FileArgv is the argv that runs a file script on path in the pod, and the confined path
// (vectors: files.requests).
func FileArgv(script, root, path string, extra ...string) ([]string, string, error) {
	p, err := Confine(root, path)
	if err != nil {
		return nil, "", err
	}
	return append([]string{"sh", "-c", FilesPrologue + script, FilesArgv0, root, p}, extra...), p, nil
}

// EntryKind is the type of a directory entry.
type EntryKind string

// The entry kinds (symlinks are not followed).
const (
	KindFile    EntryKind = "File"
	KindDir     EntryKind = "Dir"
	KindSymlink EntryKind = "Symlink"
	KindOther   EntryKind = "Other" // device, FIFO, socket
)

// DirEntry is one entry of a workspace directory.
type DirEntry struct {
	Name  string
	Kind  EntryKind
	Size  int64
	Mode  uint32 // permission bits (0o644)
	MTime int64  // seconds since the epoch
}

// ParseListing parses the NUL-separated "<hex mode> <size> <mtime> <name>" records of the
// list script, sorted by name (vectors: files.listings).
func ParseListing(raw []byte) ([]DirEntry, error) {
	var out []DirEntry
	for _, rec := range bytes.Split(raw, []byte{0}) {
		if len(rec) == 0 {
			continue
		}
		f := bytes.SplitN(rec, []byte{' '}, 4)
		if len(f) != 4 {
			return nil, protocolf("bad listing record %q", rec)
		}
		mode, err1 := strconv.ParseUint(string(f[0]), 16, 32)
		size, err2 := strconv.ParseInt(string(f[1]), 10, 64)
		mtime, err3 := strconv.ParseInt(string(f[2]), 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || size < 0 {
			return nil, protocolf("bad listing record %q", rec)
		}
		kind := KindOther
		switch mode & 0o170000 {
		case 0o100000:
			kind = KindFile
		case 0o040000:
			kind = KindDir
		case 0o120000:
			kind = KindSymlink
		}
		out = append(out, DirEntry{Name: string(f[3]), Kind: kind, Size: size, Mode: uint32(mode & 0o7777), MTime: mtime})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// checkFile maps a file script's exit to an error.
func checkFile(p string, r *ExecResult) error {
	msg := strings.TrimSpace(string(r.Stderr))
	switch r.ExitCode {
	case 0:
		return nil
	case ExitEscapes:
		return &PathError{Path: p, Reason: "Escapes", Msg: fmt.Sprintf("path %q resolves outside the workspace (symlink)", p)}
	case ExitMissing:
		return fmt.Errorf("%w: %s", ErrFileNotFound, msg)
	}
	return &RemoteError{ExitCode: r.ExitCode, Stderr: msg}
}

func (b *Sandbox) fileExec(ctx context.Context, argv []string, stdin io.Reader, maxOut int) (*ExecResult, error) {
	o := ExecOptions{Stdin: stdin, MaxOutput: maxOut}
	return b.sbs.Client.ws.collect(ctx, b.Namespace(), b.PodName(), Frame{Argv: argv}, o)
}

// ReadFile is a workspace file's content (ErrFileTooLarge beyond ReadCap, ErrFileNotFound
// when missing).
func (b *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	argv, p, err := FileArgv(ScriptRead, b.WorkspaceRoot(), path)
	if err != nil {
		return nil, err
	}
	r, err := b.fileExec(ctx, argv, nil, ReadCap)
	if err != nil {
		return nil, err
	}
	if err := checkFile(p, r); err != nil {
		return nil, err
	}
	if r.StdoutTruncated {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrFileTooLarge, p, ReadCap)
	}
	return r.Stdout, nil
}

// WriteFile writes a workspace file atomically (temp file and rename), creating its parents;
// mode 0 keeps the default (0644 under the usual umask).
func (b *Sandbox) WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error {
	return b.WriteFrom(ctx, path, bytes.NewReader(data), mode)
}

// WriteFrom writes a workspace file from a reader (streamed to its EOF unless it has a
// Len()), atomically.
func (b *Sandbox) WriteFrom(ctx context.Context, path string, r io.Reader, mode fs.FileMode) error {
	var argv []string
	var p string
	var err error
	if mode == 0 {
		argv, p, err = FileArgv(ScriptWrite, b.WorkspaceRoot(), path)
	} else {
		if mode&^0o7777 != 0 {
			return invalidf("mode must be from 0 to 0o7777, not %o", mode)
		}
		argv, p, err = FileArgv(scriptWriteMode, b.WorkspaceRoot(), path, strconv.FormatUint(uint64(mode), 8))
	}
	if err != nil {
		return err
	}
	res, err := b.fileExec(ctx, argv, r, 64<<10)
	if err != nil {
		return err
	}
	return checkFile(p, res)
}

// ReadDir lists a workspace directory, sorted by name.
func (b *Sandbox) ReadDir(ctx context.Context, path string) ([]DirEntry, error) {
	argv, p, err := FileArgv(ScriptList, b.WorkspaceRoot(), path)
	if err != nil {
		return nil, err
	}
	r, err := b.fileExec(ctx, argv, nil, 64<<20)
	if err != nil {
		return nil, err
	}
	if err := checkFile(p, r); err != nil {
		return nil, err
	}
	return ParseListing(r.Stdout)
}

// Stat is one workspace entry (a symlink itself, not its target).
func (b *Sandbox) Stat(ctx context.Context, path string) (DirEntry, error) {
	argv, p, err := FileArgv(scriptStat, b.WorkspaceRoot(), path)
	if err != nil {
		return DirEntry{}, err
	}
	r, err := b.fileExec(ctx, argv, nil, 64<<10)
	if err != nil {
		return DirEntry{}, err
	}
	if err := checkFile(p, r); err != nil {
		return DirEntry{}, err
	}
	e, err := ParseListing(r.Stdout)
	if err != nil {
		return DirEntry{}, err
	}
	if len(e) != 1 {
		return DirEntry{}, protocolf("stat %s: %q", p, r.Stdout)
	}
	return e[0], nil
}

// Remove removes a file, a symlink or an empty directory; with recursive, a whole tree. The
// workspace root itself is never removed.
func (b *Sandbox) Remove(ctx context.Context, path string, recursive bool) error {
	flag := ""
	if recursive {
		flag = "r"
	}
	argv, p, err := FileArgv(scriptRm, b.WorkspaceRoot(), path, flag)
	if err != nil {
		return err
	}
	r, err := b.fileExec(ctx, argv, nil, 64<<10)
	if err != nil {
		return err
	}
	return checkFile(p, r)
}

// Mkdir creates a workspace directory with its parents.
func (b *Sandbox) Mkdir(ctx context.Context, path string) error {
	argv, p, err := FileArgv(scriptMkdir, b.WorkspaceRoot(), path, "p")
	if err != nil {
		return err
	}
	r, err := b.fileExec(ctx, argv, nil, 64<<10)
	if err != nil {
		return err
	}
	return checkFile(p, r)
}

// UploadDir copies the local directory local into the workspace directory remote (created if
// missing; existing files overwritten) as a tar stream built on the fly. Symlinks are sent as
// symlinks, never followed. In the pod the stream is spooled to a file under the workspace's
// .agentbox state directory and extracted from there, so the workspace's disk needs room for
// the archive beside its files while the upload lasts; a spool that cannot be written (a full
// disk) is a *RemoteError that Is ErrUploadSpool, and an upload that would pass the workspace's
// size limit one that Is ErrUploadTooLarge, each with nothing extracted.
func (b *Sandbox) UploadDir(ctx context.Context, local, remote string) error {
	if st, err := os.Stat(local); err != nil || !st.IsDir() {
		return invalidf("%s is not a directory", local)
	}
	argv, p, err := FileArgv(ScriptUpload, b.WorkspaceRoot(), remote)
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	built := make(chan error, 1)
	go func() {
		err := writeTar(pw, local)
		pw.CloseWithError(err)
		built <- err
	}()
	r, err := b.fileExec(ctx, argv, pr, 64<<10)
	pr.CloseWithError(errors.New("upload ended"))
	berr := <-built
	if err != nil {
		return err
	}
	if err := checkFile(p, r); err != nil {
		return err
	}
	return berr
}

func writeTar(w io.Writer, root string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		h.Name = "./" + filepath.ToSlash(rel)
		if rel == "." {
			h.Name = "./"
		} else if info.IsDir() {
			h.Name += "/"
		}
		h.Uname, h.Gname = "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// DownloadDir copies the workspace directory remote into the local directory local (created
// if missing), streaming the tar archive; members that would land outside local (absolute
// paths, "..", links leaving it) are refused.
func (b *Sandbox) DownloadDir(ctx context.Context, remote, local string) error {
	argv, p, err := FileArgv(ScriptDownload, b.WorkspaceRoot(), remote)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(local, 0o755); err != nil {
		return err
	}
	pr, pw := io.Pipe()
	unpacked := make(chan error, 1)
	go func() {
		err := readTar(pr, local)
		// Drain what is left so the exec never blocks on a failed unpack.
		_, _ = io.Copy(io.Discard, pr)
		unpacked <- err
	}()
	errb := &capped{cap: 64 << 10}
	oc, err := b.sbs.Client.ws.run(ctx, b.Namespace(), b.PodName(), execCall{frame: Frame{Argv: argv}, stdout: pw, stderr: errb})
	pw.Close()
	uerr := <-unpacked
	if err != nil {
		return err
	}
	code := oc.status.Code
	if !oc.status.HasCode {
		code = -1
	}
	if err := checkFile(p, &ExecResult{ExitCode: code, Stderr: errb.buf}); err != nil {
		return err
	}
	if uerr != nil {
		return fmt.Errorf("%w: refused the archive from %s: %v", ErrProtocol, p, uerr)
	}
	return nil
}

func readTar(r io.Reader, dst string) error {
	root, err := filepath.Abs(dst)
	if err != nil {
		return err
	}
	inside := func(p string) bool { return p == root || strings.HasPrefix(p, root+string(os.PathSeparator)) }
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if filepath.IsAbs(h.Name) {
			return fmt.Errorf("member %q is absolute", h.Name)
		}
		target := filepath.Join(root, h.Name)
		if !inside(target) {
			return fmt.Errorf("member %q leaves the directory", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, fs.FileMode(h.Mode)&0o777)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			f.Close()
			if err != nil {
				return err
			}
			_ = os.Chtimes(target, time.Now(), h.ModTime)
		case tar.TypeSymlink:
			dest := h.Linkname
			if !filepath.IsAbs(dest) {
				dest = filepath.Join(filepath.Dir(target), dest)
			}
			if filepath.IsAbs(h.Linkname) || !inside(filepath.Clean(dest)) {
				return fmt.Errorf("link %q -> %q leaves the directory", h.Name, h.Linkname)
			}
			_ = os.Remove(target)
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		default:
			// Hard links, devices and FIFOs are not copied out of a sandbox.
		}
	}
}
