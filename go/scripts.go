package agentbox

// The shared in-pod file scripts, byte for byte the other clients' (vectors: files.scripts).
const (
	// FilesPrologue resolves the root and confines $p: the nearest existing ancestor must resolve under the root.
	FilesPrologue = `trap 'cat >/dev/null 2>&1' EXIT
R=$(readlink -f "$1") || { echo "agentbox: workspace root $1 is missing" >&2; exit 96; }
p=$2
confine() {
  q=$1
  while [ ! -e "$q" ] && [ ! -L "$q" ]; do q=$(dirname "$q"); done
  r=$(readlink -f "$q") || { echo "agentbox: $1: cannot resolve" >&2; exit 97; }
  [ "$R" = / ] && return 0
  case "$r/" in "$R"/*) ;; *) echo "agentbox: $1 resolves outside the workspace" >&2; exit 97;; esac
}
confine "$p"
`
	ScriptRead = `[ -f "$p" ] || { echo "agentbox: $p: not a regular file" >&2; exit 96; }
exec cat "$p"
`
	ScriptWrite = `[ -d "$p" ] && { echo "agentbox: $p is a directory" >&2; exit 96; }
d=$(dirname "$p")
mkdir -p "$d" || exit 1
confine "$p"
t="$d/.agentbox-write.$$"
if cat > "$t"; then mv -f "$t" "$p"; else rm -f "$t"; exit 1; fi
`
	ScriptList = `[ -d "$p" ] || { echo "agentbox: $p: not a directory" >&2; exit 96; }
cd "$p" || exit 96
for f in * .*; do
  case $f in .|..) continue;; esac
  [ -e "./$f" ] || [ -L "./$f" ] || continue
  s=$(stat -c '%f %s %Y' "./$f") || continue
  printf '%s %s\0' "$s" "$f"
done
`
	ScriptUpload = `trap 'cat >/dev/null' EXIT
mkdir -p "$p" || exit 1
confine "$p"
find "$p" -type l | while IFS= read -r l; do
  r=$(readlink -f "$l") || continue
  [ "$R" = / ] && continue
  case "$r/" in "$R"/*) ;; *) echo "agentbox: $l resolves outside the workspace" >&2; exit 97;; esac
done || exit 97
s="${R%/}/.agentbox/tmp"
mkdir -p "$s" || { echo "agentbox: cannot make $s for the upload's spool" >&2; exit 95; }
confine "$s/upload"
find "$s" -maxdepth 1 -name 'upload-*.tar' -mmin +60 -exec rm -f -- {} + 2>/dev/null || :
sp="$s/upload-$$.tar"
trap 'rm -f -- "$sp"; cat >/dev/null' EXIT
trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM
if ! cat > "$sp"; then
  rm -f -- "$sp"
  echo "agentbox: the upload could not be written to its spool $sp (is the workspace's disk full?); nothing was extracted" >&2
  exit 95
fi
tar -x -o -f "$sp" -C "$p"
`
	ScriptDownload = `[ -d "$p" ] || { echo "agentbox: $p: not a directory" >&2; exit 96; }
exec tar -c -f - -C "$p" .
`
)
