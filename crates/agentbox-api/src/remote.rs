//! What agentbox runs inside a sandbox's pod, in one place: every shell script, the operator's
//! (workspace init, snapshot, restore) and the clients' (the exec wrapper, a persistent
//! session's command line, file operations), and the builders of their arguments. The scripts
//! use only POSIX `sh`, `tar`, `mkdir`, `mv`, `rm`, `cat`, `head -c`, `readlink -f`, `stat -c`,
//! `setsid`, `wc`, `du -s -k` (and `dd` when present), as busybox has them; the tests below run
//! each with the host's. Paths are judged before any script runs by [`crate::paths`].
//!
//! Everything a script leaves in the workspace lives under [`STATE_DIR`], which the operator
//! reserves (admission and the archive validator refuse user paths there).

/// The scripts below spell out the operator's state directory; a test checks that they name
/// this one.
pub use crate::paths::STATE_DIR;
/// Marker file, relative to the workspace root. Written last, so it means "initialised".
#[cfg(feature = "operator")]
pub const MARKER: &str = ".agentbox/marker";

/// The argv that runs `script` with `sh -c`, `$0` = `sh`, then `args` as `$1`...
pub fn sh<S: Into<String>>(script: &str, args: impl IntoIterator<Item = S>) -> Vec<String> {
    let mut argv = vec!["sh".to_string(), "-c".into(), script.into(), "sh".into()];
    argv.extend(args.into_iter().map(Into::into));
    argv
}

/// Default entrypoint: stay alive and exit promptly on TERM, since commands arrive by exec.
#[cfg(feature = "operator")]
pub const KEEP_ALIVE: &str = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

/// Probe: prints the marker's content when the workspace is initialised. `$1` is the root.
#[cfg(feature = "operator")]
pub const PROBE_SCRIPT: &str = r#"cat -- "$1/.agentbox/marker" 2>/dev/null || true"#;

/// The marker a warm pod's pool writes ([`WARM_INIT_SCRIPT`]), naming no sandbox. It counts as
/// a sandbox's marker only once the sandbox's status has recorded its workspace ready
/// (`workspace.rootReady`, written with Ready after the start's command): a claim with nothing
/// to restore or write runs no command and leaves it as its workspace's, while a start that
/// stopped between the adoption and that status finds the workspace uninitialised.
#[cfg(feature = "operator")]
pub const WARM_MARKER: &str = "warm";

/// A warm pod's share of initialisation, the part that names no sandbox: the state directory
/// [`INIT_SCRIPT`] makes and the pool's marker ([`WARM_MARKER`]), nothing of any scope. `$1` is
/// the root. Fails on a directory that has a marker of its own (a sandbox's, a link, anything
/// but a regular file: writing into a FIFO would block): a warm pod's directory was never a
/// sandbox's. Run again, it finds its own marker and succeeds.
#[cfg(feature = "operator")]
pub const WARM_INIT_SCRIPT: &str = r#"set -eu
mkdir -p -- "$1/.agentbox/tmp"
m="$1/.agentbox/marker"
if [ -h "$m" ] || { [ -e "$m" ] && [ ! -f "$m" ]; }; then
  echo "the warm workspace has a marker" >&2; exit 1
fi
if [ -s "$m" ]; then
  w=; IFS= read -r w < "$m" || :
  if [ "$w" != warm ]; then echo "the warm workspace has a marker" >&2; exit 1; fi
else
  printf warm > "$m"
fi
"#;

/// Initialisation: `$1` root, `$2` marker content, `$3` how files arrive (0: none, no stdin;
/// 1: an archive on stdin; 2: inline, as the last arguments), `$4` number of directories to
/// replace, then those directories, then the number of parent directories to create, then
/// those, then (2) each file as four arguments ([`InlineFile::args`]): its path, the umask that
/// creates it with its mode, a mode to set afterwards (empty when the umask did), and its
/// content as a `printf` format. Inline files cost no process but `printf` (a builtin) where
/// `tar` is one more, which is most of a claim's time with files. The marker is written last,
/// so a failed run leaves the workspace uninitialised: a marker that exists is replaced
/// atomically (`mv`), a first one is written in place (no `mv` process on a claim's path: an
/// interrupted write leaves it empty, which the probe reads as absent, i.e. never initialised).
#[cfg(feature = "operator")]
pub const INIT_SCRIPT: &str = r#"set -eu
root="$1"; marker="$2"; files="$3"; n="$4"; shift 4
cd "$root"
[ -d .agentbox/tmp ] || mkdir -p .agentbox/tmp
i=0
while [ "$i" -lt "$n" ]; do rm -rf -- "./$1"; shift; i=$((i+1)); done
n="$1"; shift; i=0
while [ "$i" -lt "$n" ]; do mkdir -p -- "./$1"; shift; i=$((i+1)); done
if [ "$files" = 1 ]; then tar -x -f -; fi
while [ "$#" -ge 4 ]; do
  if [ -e "./$1" ] || [ -h "./$1" ]; then rm -f -- "./$1"; fi
  umask "$2"; printf "$4" > "./$1"
  if [ -n "$3" ]; then chmod "$3" "./$1"; fi
  shift 4
done
if [ -e .agentbox/marker ] || [ -h .agentbox/marker ]; then
  printf '%s' "$marker" > .agentbox/marker.tmp
  mv -f .agentbox/marker.tmp .agentbox/marker
else
  printf '%s' "$marker" > .agentbox/marker
fi
"#;

/// How [`INIT_SCRIPT`] gets the workspace's files.
#[cfg(feature = "operator")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilesVia {
    /// No files.
    None,
    /// A tar archive on stdin (an exec: a session command takes no stdin).
    Archive,
    /// As arguments ([`InlineFile`]): for small files, over a warm pod's open shell.
    Inline,
}

/// A file [`INIT_SCRIPT`] writes from its arguments.
#[cfg(feature = "operator")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InlineFile<'a> {
    /// Path relative to the workspace root.
    pub path: &'a str,
    /// Permission bits.
    pub mode: u32,
    /// Content.
    pub data: &'a [u8],
}

#[cfg(feature = "operator")]
impl InlineFile<'_> {
    /// Its four arguments: path, umask, mode to set afterwards (empty when the umask gives
    /// it: no `chmod` process), content as a `printf` format ([`printf_format`]).
    pub fn args(&self) -> [String; 4] {
        let mode = self.mode & 0o7777;
        // A new file gets 0666 less the umask: exact for modes without execute or special bits.
        let umask = 0o777 & !mode;
        let chmod = if mode & !0o666 == 0 {
            String::new()
        } else {
            format!("{mode:o}")
        };
        [
            self.path.to_string(),
            format!("{umask:04o}"),
            chmod,
            printf_format(self.data),
        ]
    }
}

/// `data` as a `printf` format that prints exactly it: ASCII letters, digits and ` ._/,:=+`
/// as themselves, every other byte a three-digit octal escape (so no `%`, `\` or leading `-`
/// is ever read as anything but a byte, and NUL and non-UTF-8 bytes pass).
#[cfg(feature = "operator")]
pub fn printf_format(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len() * 2);
    for &b in data {
        if b.is_ascii_alphanumeric() || b" ._/,:=+".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\{b:03o}"));
        }
    }
    out
}

/// Arguments of [`INIT_SCRIPT`]: the root, the marker's content, how files arrive, the
/// directories to replace, the parent directories to create, and (inline) the files.
#[cfg(feature = "operator")]
pub fn init_args(
    root: &str,
    marker: &str,
    via: FilesVia,
    (replace_dirs, parents): (&[String], &[String]),
    inline: &[InlineFile<'_>],
) -> Vec<String> {
    let code = match via {
        FilesVia::None => "0",
        FilesVia::Archive => "1",
        FilesVia::Inline => "2",
    };
    let mut args = vec![
        root.to_string(),
        marker.to_string(),
        code.to_string(),
        replace_dirs.len().to_string(),
    ];
    args.extend(replace_dirs.iter().cloned());
    args.push(parents.len().to_string());
    args.extend(parents.iter().cloned());
    if via == FilesVia::Inline {
        args.extend(inline.iter().flat_map(InlineFile::args));
    }
    args
}

/// The `tar -c` script. `$1` root, `$2` number of expanded directories, then those
/// directories (ancestors of host mounts, listed entry by entry instead of archived whole),
/// then the excluded paths (host mounts). `.agentbox` is always excluded. busybox tar has no
/// `--exclude`, so the members are named one by one at the top and in expanded directories.
#[cfg(feature = "operator")]
pub const TAR_SCRIPT: &str = r#"set -u
root=$1; n=$2; shift 2
nl='
'
anc=; i=0
while [ "$i" -lt "$n" ]; do anc="$anc$1$nl"; shift; i=$((i+1)); done
ex=".agentbox$nl"
for m in "$@"; do ex="$ex$m$nl"; done
cd "$root" || exit 1
# A workspace without its marker was lost or never initialised: archiving it would pass off
# an empty or partial tree as the sandbox's state.
[ -f .agentbox/marker ] || { echo "the workspace has no agentbox marker (lost or not initialised)" >&2; exit 1; }
listed() { case "$nl$2" in *"$nl$1$nl"*) return 0;; esac; return 1; }
set --
dirs=$anc
IFS=$nl
for d in "" $dirs; do
  IFS=' 	'
  p=${d:+$d/}
  for f in "$p"* "$p".[!.]* "$p"..?*; do
    { [ -e "$f" ] || [ -L "$f" ]; } || continue
    listed "$f" "$anc" && continue
    listed "$f" "$ex" && continue
    set -- "$@" "./$f"
  done
  IFS=$nl
done
IFS=' 	'
# Output still on its way when the exec's process exits can be dropped on the way out
# (kubernetes/kubernetes#124571: the streaming connection is closed right after the exit
# status, and a reader slower than tar loses the tail). So the script exits only when the
# operator ends its stdin, which it does once the archive's end marker has arrived; `read -t`
# caps the wait should that never come, and shells without `-t` skip it. (A v4 exec cannot end
# stdin without closing the connection, as for every exec with stdin: snapshots need v5.)
linger() { while read -r -t 600 _ 2>/dev/null; do :; done; }
if [ "$#" -eq 0 ]; then head -c 1024 /dev/zero; linger; exit 0; fi
# busybox tar writes a header, a file's bytes and its padding one write each; read straight
# from its pipe, a workspace of small files reaches the operator as a message per write. dd
# gathers the output into 64 KiB writes. sh has no pipefail: tar's exit status comes back
# through fd 3 (dd's failures show as a cut archive, which the operator refuses).
if command -v dd >/dev/null 2>&1; then
  exec 4>&1
  st=$( { { tar -c -f - "$@" 3>&- 4>&- </dev/null; echo $? >&3; } | dd ibs=131072 obs=65536 2>/dev/null >&4 3>&-; } 3>&1 )
else
  tar -c -f - "$@" </dev/null; st=$?
fi
# Only a whole archive has an end marker to wait for.
[ "${st:-1}" = 0 ] && linger
exit "${st:-1}"
"#;

/// Arguments of [`TAR_SCRIPT`] for a sandbox: its root, then the ancestors of its host mounts,
/// then the mounts.
#[cfg(feature = "operator")]
pub fn tar_args(root: &str, mounts: &[String]) -> Vec<String> {
    let mounts: Vec<String> = mounts
        .iter()
        .map(|m| crate::paths::normalize(m))
        .filter(|m| !m.is_empty())
        .collect();
    let mut ancestors: Vec<String> = mounts
        .iter()
        .flat_map(|m| {
            let parts: Vec<&str> = m.split('/').collect();
            (1..parts.len()).map(move |i| parts[..i].join("/"))
        })
        .collect();
    ancestors.sort();
    ancestors.dedup();
    let mut args = vec![root.to_string(), ancestors.len().to_string()];
    args.extend(ancestors);
    args.extend(mounts);
    args
}

/// The restore's spool, written by [`SPOOL_SCRIPT`] and read by [`EXTRACT_SCRIPT`]: `$2` is
/// the restore's id. Beside the staging directory, never in it (a member of that name would
/// land on it), under the state directory that no member can name.
#[cfg(feature = "operator")]
pub const SPOOL: &str = ".agentbox/spool-$2.tar";

/// Receiving a restore's archive: `$1` root, `$2` id; the archive on stdin, written whole into
/// the spool file ([`SPOOL`]) before anything is extracted. busybox `tar` reading a pipe takes
/// a few hundred bytes per read and so wakes the pipe's writer (the container runtime's copy
/// loop) again and again; `cat` takes what is there and `tar` then reads a file (docs/
/// benchmarks.md, the transport rows). A failed write (a full disk) removes what was written.
#[cfg(feature = "operator")]
pub const SPOOL_SCRIPT: &str = r#"set -eu
cd "$1"
mkdir -p .agentbox
sp=".agentbox/spool-$2.tar"
rm -f -- "$sp"
cat > "$sp" || { r=$?; rm -f -- "$sp"; exit "$r"; }
"#;

/// Extraction of the spool ([`SPOOL`], written by [`SPOOL_SCRIPT`]) into a new staging
/// directory: `$1` root, `$2` id. The spool goes however it ends. `-v` lists each member as
/// it is extracted: the operator's progress deadline counts that output, so a `tar` that
/// stops is caught as a stream that stops reading is.
#[cfg(feature = "operator")]
pub const EXTRACT_SCRIPT: &str = r#"set -eu
cd "$1"
st=".agentbox/staging-$2"; sp=".agentbox/spool-$2.tar"
trap 'rm -f -- "$sp"' EXIT
[ -f "$sp" ] || { echo "no spooled archive" >&2; exit 1; }
rm -rf -- "$st"
mkdir -- "$st"
tar -x -v -f "$sp" -C "$st"
"#;

/// Extraction into a new staging directory straight from stdin: `$1` root, `$2` id; the
/// archive on stdin. For archives whose members are large (a pipe costs nothing per byte,
/// only per read), where a spool would only write everything twice.
#[cfg(feature = "operator")]
pub const EXTRACT_STREAM_SCRIPT: &str = r#"set -eu
cd "$1"
mkdir -p .agentbox
st=".agentbox/staging-$2"
rm -rf -- "$st"
mkdir -- "$st"
tar -x -f - -C "$st"
"#;

/// Removes a staging directory and the restore's spool: `$1` root, `$2` id.
#[cfg(feature = "operator")]
pub const DISCARD_SCRIPT: &str =
    r#"cd "$1" && rm -rf -- ".agentbox/staging-$2" ".agentbox/old-$2" ".agentbox/spool-$2.tar""#;

/// The swap: `$1` root, `$2` id, then top-level names to leave alone (they hold host mounts).
/// Undoes its own moves when one fails.
#[cfg(feature = "operator")]
pub const SWAP_SCRIPT: &str = r#"set -u
root=$1; id=$2; shift 2
nl='
'
keep=".agentbox$nl"
for k in "$@"; do keep="$keep$k$nl"; done
kept() { case "$nl$keep" in *"$nl$1$nl"*) return 0;; esac; return 1; }
cd "$root" || exit 1
st=".agentbox/staging-$id"; old=".agentbox/old-$id"
[ -d "$st" ] || { echo "no staging directory" >&2; exit 1; }
rm -rf -- "$old"; mkdir -- "$old" || exit 1
back() {
  for f in "$old"/* "$old"/.[!.]* "$old"/..?*; do
    { [ -e "$f" ] || [ -L "$f" ]; } || continue
    mv -- "$f" ./ || echo "could not move back $f" >&2
  done
  rmdir -- "$old" 2>/dev/null
}
for f in * .[!.]* ..?*; do
  { [ -e "$f" ] || [ -L "$f" ]; } || continue
  kept "$f" && continue
  mv -- "$f" "$old/" || { echo "moving $f aside failed" >&2; back; exit 1; }
done
for f in "$st"/* "$st"/.[!.]* "$st"/..?*; do
  { [ -e "$f" ] || [ -L "$f" ]; } || continue
  b=${f##*/}
  kept "$b" && continue
  if ! mv -- "$f" "./$b"; then
    echo "moving $b in failed" >&2
    for g in * .[!.]* ..?*; do
      { [ -e "$g" ] || [ -L "$g" ]; } || continue
      kept "$g" && continue
      rm -rf -- "$g"
    done
    back; exit 1
  fi
done
rm -rf -- "$st" "$old"
"#;

/// Arguments of [`SWAP_SCRIPT`]: the root, the staging id, then the top-level names to leave
/// alone.
#[cfg(feature = "operator")]
pub fn swap_args(root: &str, id: &str, keep: &[String]) -> Vec<String> {
    let mut args = vec![root.to_string(), id.to_string()];
    args.extend(keep.iter().cloned());
    args
}

// --- file operations of the clients (crates/agentbox-client/src/client/files.rs) -------------------------------------

/// Exit code of the in-pod scripts for "resolves outside the workspace".
pub const ESCAPES: i32 = 97;
/// Exit code of the in-pod scripts for "missing or of the wrong type".
pub const MISSING: i32 = 96;
/// Exit code of [`UPLOAD`] for "the archive could not be written to its spool" (most often
/// the workspace's disk is full; stderr has the writer's own words): nothing was extracted and
/// no spool is left.
pub const SPOOL_FAILED: i32 = 95;
/// Exit code of [`UPLOAD`] for "extracting the archive would pass the workspace's size limit"
/// ([`LIMIT_ENV`]; stderr names the sizes and the limit): nothing was extracted and no spool is
/// left.
pub const TOO_LARGE: i32 = 94;
/// The sandbox container's environment variable that holds its workspace's size limit in bytes,
/// set by the operator only when a limit is enforced (`workspace.sizeLimit`); [`UPLOAD`] checks
/// an upload against it before extracting anything.
pub const LIMIT_ENV: &str = "AGENTBOX_WORKSPACE_LIMIT_BYTES";

/// Shared prologue: `$1` root, `$2` path (absolute, from [`confine`]). `confine P` exits
/// [`ESCAPES`] unless the nearest existing ancestor of P resolves under the resolved root.
///
/// Its first line: whatever ends a script (a refusal before it read its stdin, say), the rest
/// of its stdin is read and dropped, as [`UPLOAD`] does: an exec whose process exits with a
/// large stdin unread can leave the client waiting for ever to send it (a `write_file` of a
/// directory's path). Scripts without stdin read an empty one.
pub const PROLOGUE: &str = r#"trap 'cat >/dev/null 2>&1' EXIT
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
"#;

pub const READ: &str = r#"[ -f "$p" ] || { echo "agentbox: $p: not a regular file" >&2; exit 96; }
exec cat "$p"
"#;

pub const WRITE: &str = r#"[ -d "$p" ] && { echo "agentbox: $p is a directory" >&2; exit 96; }
d=$(dirname "$p")
mkdir -p "$d" || exit 1
confine "$p"
t="$d/.agentbox-write.$$"
if cat > "$t"; then mv -f "$t" "$p"; else rm -f "$t"; exit 1; fi
"#;

pub const LIST: &str = r#"[ -d "$p" ] || { echo "agentbox: $p: not a directory" >&2; exit 96; }
cd "$p" || exit 96
for f in * .*; do
  case $f in .|..) continue;; esac
  [ -e "./$f" ] || [ -L "./$f" ] || continue
  s=$(stat -c '%f %s %Y' "./$f") || continue
  printf '%s %s\0' "$s" "$f"
done
"#;

/// Upload: refuse when a symlink already in the destination tree leads out of the workspace
/// (tar would write through it); receive the archive whole into a spool file, then extract it
/// from there without restoring owners.
///
/// Why a spool: busybox `tar` reading a pipe takes a few hundred bytes per read and so wakes
/// the container runtime's copy loop again and again; issue 32 measured 20,000 small files
/// streamed into `tar -x` in 2.1 s where `cat` into a file took 0.11 s and `tar -x -f` of that
/// file 0.09 s (restores spool for the same reason, [`SPOOL_SCRIPT`]). Where the disk, not the
/// transport, is the slow part, the two come out even (the spool then adds the extraction after
/// the transfer instead of beside it), and a file of 200 MB took ~0.7 s more (one more write
/// and read of the archive in the pod). What the spool always buys: a full disk extracts
/// nothing, and `tar` never stops reading a stream the client is still sending.
///
/// The cost: the spool takes the archive's size on the workspace's filesystem while the upload
/// lasts (up to twice the archive's size with what is extracted, until the spool goes at the
/// end). It lives in the operator's state directory under the workspace root
/// (`.agentbox/tmp/upload-PID.tar`, made when missing and confined like the destination), never
/// among the user's files; snapshots leave that directory out. It is removed however the
/// script ends (extracted, tar failed, interrupted by a signal it can catch); only a SIGKILL
/// leaves it behind, and the next upload removes a spool nobody has written for an hour (a
/// live upload's is written to as it arrives, and `tar` holds it open once it reads it, so
/// removing it then takes nothing from that upload). A spool that cannot be written whole (a full disk, a file size limit) is
/// removed before anything is extracted, and the script exits [`SPOOL_FAILED`] with the
/// writer's own error and a line that names the spool.
///
/// With a size limit ([`LIMIT_ENV`], which the operator sets only where one is enforced), the
/// spool is checked before anything is extracted, so an upload that would pass the limit fails
/// whole (a hard limit would otherwise stop `tar` midway, leaving part of the upload in place):
/// the workspace's use (`du`, the spool included, as it stays until extraction ends) plus what
/// extraction needs must not pass the limit, else the script exits [`TOO_LARGE`] naming the
/// numbers. What extraction needs is taken as the archive's size (every member's bytes and a
/// 512-byte header) plus one 4 KiB block per member (a file's last partial block, a directory's
/// own): never less than what `tar -x` writes. It is conservative: a file the upload replaces
/// counts twice (its old copy is in the use), and `du`'s count may lag a btrfs quota's by its
/// metadata, so an upload within a few blocks of the limit can still meet it midway.
///
/// Whatever ends the script, the rest of its stdin is read and dropped first (the `EXIT`
/// trap): a script that exits with the client's stream unread leaves the client waiting
/// forever on an exec whose stdin no one reads (seen with an upload refused by the symlink
/// check, and with `tar -x` failing midway when it read the stream itself). So a refusal
/// costs the transfer, and is reported.
pub const UPLOAD: &str = r#"trap 'cat >/dev/null' EXIT
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
lim=${AGENTBOX_WORKSPACE_LIMIT_BYTES:-}
case $lim in *[!0-9]*) lim=;; esac
if ! cat > "$sp"; then
  rm -f -- "$sp"
  echo "agentbox: the upload could not be written to its spool $sp (is the workspace's disk full?${lim:+ its size limit is $lim bytes}); nothing was extracted" >&2
  exit 95
fi
if [ -n "$lim" ]; then
  a=$(wc -c < "$sp"); m=$(tar -t -f "$sp" | wc -l); u=$(du -s -k "$R" 2>/dev/null)
  a=${a##*[!0-9]}; m=${m##*[!0-9]}; u=${u%%[!0-9]*}
  need=$((${a:-0} + ${m:-0} * 4096)); used=$((${u:-0} * 1024))
  if [ $((used + need)) -gt "$lim" ]; then
    echo "agentbox: the upload would pass the workspace's size limit of $lim bytes: extracting it needs up to $need bytes ($a in its archive, $m entries) and the workspace holds $used (its spool included); nothing was extracted" >&2
    exit 94
  fi
fi
tar -x -o -f "$sp" -C "$p"
"#;

pub const DOWNLOAD: &str = r#"[ -d "$p" ] || { echo "agentbox: $p: not a directory" >&2; exit 96; }
exec tar -c -f - -C "$p" .
"#;

/// A write that also sets the file's mode (`$3`, octal): [`WRITE`] with a `chmod` before the
/// rename. The Python, Go and Java clients' `write(..., mode)`.
pub const WRITE_MODE: &str = r#"[ -d "$p" ] && { echo "agentbox: $p is a directory" >&2; exit 96; }
d=$(dirname "$p")
mkdir -p "$d" || exit 1
confine "$p"
t="$d/.agentbox-write.$$"
if cat > "$t" && chmod "$3" "$t"; then mv -f "$t" "$p"; else rm -f "$t"; exit 1; fi
"#;

/// One entry's `%f %s %Y NAME\0`, as [`LIST`] prints each (a symlink itself, not its target).
/// The Python, Go and Java clients' `stat`.
pub const STAT: &str = r#"[ -e "$p" ] || [ -L "$p" ] || { echo "agentbox: $p: no such file or directory" >&2; exit 96; }
s=$(stat -c '%f %s %Y' "$p") || exit 1
printf '%s %s\0' "$s" "${p##*/}"
"#;

/// Removes `$p` (`$3` = `r`: recursively), never the workspace root itself. The Python, Go
/// and Java clients' `remove`.
pub const RM: &str = r#"[ -e "$p" ] || [ -L "$p" ] || { echo "agentbox: $p: no such file or directory" >&2; exit 96; }
[ "$(readlink -f "$p")" = "$R" ] && { echo "agentbox: refusing to remove the workspace root" >&2; exit 1; }
if [ "$3" = r ]; then exec rm -rf -- "$p"; fi
if [ -d "$p" ] && [ ! -L "$p" ]; then exec rmdir -- "$p"; fi
exec rm -f -- "$p"
"#;

/// Makes directory `$p` (`$3` = `p`: with its parents), then confines what was made. The
/// Python, Go and Java clients' `mkdir`.
pub const MKDIR: &str = r#"if [ "$3" = p ]; then mkdir -p -- "$p" || exit 1; else mkdir -- "$p" || exit 1; fi
confine "$p"
"#;

// --- commands (crates/agentbox-api/src/exec.rs, crates/agentbox-api/src/exec/session.rs) ---------------------------------------------

/// The `sh` wrapper every one-shot exec runs under (docs/protocol.md, "Exec"):
/// `sh -c WRAPPER agentbox-exec MARK STDIN TIMEOUT WORKDIR N ENV... ARGV...`.
///
/// - `MARK`: printed on stdout and on stderr once the command has ended, so the client knows
///   each stream is whole only when it ends with it (output still on its way when a process
///   exits can be dropped: kubernetes/kubernetes#124571). Then the wrapper lingers: it exits,
///   letting the exit status go out, only once the client has half-closed stdin, which it does
///   after reading both marks. `read -t` bounds the wait should the client vanish; a shell
///   without `-t` (dash) waits for the EOF the end of the connection gives. An empty `MARK`
///   (a command in a persistent session, whose shell outlives it) means no trailer, no linger,
///   and the command is `exec`ed when it has no timeout.
/// - `STDIN`: `-` the command's stdin is `/dev/null` (the exec's stays open for the linger);
///   a decimal `K` the command reads exactly the first `K` bytes (`head -c`), then EOF; `=` it
///   reads the exec's stdin until the client half-closes it. With `K` or `=`, what the
///   command left unread is read and dropped after the marks, until the client half-closes
///   (which it does once it has both marks): a command that exits without reading its stdin
///   left the exec's stdin unread, and the client waiting for ever to send the rest
///   (`agentbox exec -i … -- sh -c 'exit 3' < 8 MB` hung).
/// - `TIMEOUT` (seconds, empty = none): the command runs under `setsid` (its own process
///   group; it is not a group leader as a child of `&`, so busybox `setsid` does not fork and
///   the exit code is kept). stdin is passed through fd 3 because a non-interactive shell
///   points the stdin of `&` commands at /dev/null. The watchdog holds no stdio (or the exec
///   would stay open until it exits), kills the whole group when the time is up, and is itself
///   stopped when the command ends, unless members of the group are still alive: those are
///   killed at the deadline too. `wait`'s stderr is dropped: ash reports a killed job
///   ("Killed") there, which is not the command's output.
/// - `WORKDIR` (empty = keep): a failed `cd` is exit code 126.
/// - `N` `NAME=value` entries, exported.
///
/// The command runs as `( exec "$@" )`: a program, never a shell builtin or this script's
/// function, as when the runtime starts it directly; one it cannot find is exit code 127 with
/// the shell's message on stderr.
///
/// Out of memory: with a `MARK`, the wrapper reads its container's OOM kill counter
/// ([`OOM_KILLS`]) before the command, and again when the command's code is 137 (SIGKILL);
/// when the counter rose, the kernel's OOM killer killed it (or a process of its, whose death
/// gave it that code), and the trailer on both streams is the *memory trailer*
/// ([`memory_trailer`]: the mark with its last character replaced by `!`) instead of the mark.
pub const WRAPPER: &str = r#"m=$1; i=$2; t=$3; d=$4; n=$5; shift 5
_ab_oom() { _ab_k=; for _ab_f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do [ -r "$_ab_f" ] || continue; while read -r _ab_x _ab_y; do [ "$_ab_x" = oom_kill ] && _ab_k=$_ab_y; done <"$_ab_f"; break; done; }
_ab_k=; [ -z "$m" ] || _ab_oom; _ab_o=$_ab_k
while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n-1)); done
run() {
  if [ -n "$d" ]; then cd -- "$d" || return 126; fi
  if [ -z "$t" ]; then
    [ -n "$m" ] || exec "$@"
    ( exec "$@" ); return
  fi
  exec 3<&0
  setsid "$@" <&3 3<&- &
  p=$!
  exec 3<&-
  ( trap 'kill $s 2>/dev/null; exit 0' TERM; sleep "$t" & s=$!; wait $s && kill -s KILL -- -$p ) </dev/null >/dev/null 2>&1 &
  w=$!
  wait $p 2>/dev/null; r=$?
  kill -0 -- -$p 2>/dev/null || kill $w 2>/dev/null
  return $r
}
case $i in
  -) run "$@" </dev/null ;;
  =) run "$@" ;;
  *) head -c "$i" | run "$@" ;;
esac
r=$?
[ -n "$m" ] || exit $r
if [ $r = 137 ] && [ -n "$_ab_o" ]; then _ab_oom; [ -n "$_ab_k" ] && [ "$_ab_k" -gt "$_ab_o" ] 2>/dev/null && m=${m%?}!; fi
printf %s "$m"; printf %s "$m" >&2
[ "$i" = - ] || { cat >/dev/null 2>&1 || while read -r _; do :; done; exit $r; }
while read -r -t 600 _ 2>/dev/null; s=$?; [ $s = 0 ]; do :; done
[ $s = 2 ] && while read -r _; do :; done
exit $r
"#;

/// The files whose `oom_kill` line counts the OOM kills in the container's memory cgroup, as a
/// container sees its own cgroup: cgroup v1 (`memory.oom_control`), then v2 (`memory.events`).
/// The kernel counts a kill in the cgroup of the process it killed, whichever limit (the
/// container's, the pod's, the node's) ran out. A runtime that shows neither (gVisor's own
/// cgroupfs) gives no count, and the wrapper no memory trailer.
pub const OOM_KILLS: [&str; 2] = [
    "/sys/fs/cgroup/memory/memory.oom_control",
    "/sys/fs/cgroup/memory.events",
];

/// The trailer [`WRAPPER`] prints instead of `mark` when the command was killed for memory:
/// `mark` with its last character replaced by `!` (`__AGENTBOX_<hex>!`).
pub fn memory_trailer(mark: &str) -> String {
    let mut m = mark.to_string();
    m.pop();
    m.push(MEMORY_FLAG);
    m
}

/// What marks "killed for memory": the last character of the memory trailer, and what follows
/// the exit code in a persistent session's end sentinel (`<mark>137!`).
pub const MEMORY_FLAG: char = '!';

/// The environment entry a streamed exec's command gets ([`crate::exec::stream`]):
/// `AGENTBOX_PROCESS=<id>`, a random id of its own. What the command starts inherits it, which
/// is how [`PROCESSES`] finds the command and its children to kill them, whatever their
/// process group (a child that scrubs its environment is not found).
pub const PROCESS_ENV: &str = "AGENTBOX_PROCESS";

/// The script behind killing a streamed command in the pod (a second exec; dropping the
/// connection does not stop a command that ignores the end of its stdin). Arguments: a mode,
/// then process ids. `kill`: SIGKILL every process whose initial environment holds
/// `AGENTBOX_PROCESS=<id>` for one of the ids, in rounds until a round finds none (a process
/// that forks while it is being killed is found in the next one; more than 50 rounds is exit
/// code 1). `list`: print `<pid> <ppid>` of each such process. `/proc/<pid>/environ` is the
/// environment the process was exec'd with, so the wrapper's shells (which export the entry to
/// the command only) and this script never match.
pub const PROCESSES: &str = r#"mode=$1; shift; ids=$*
round=0
while :; do
  k=0
  for d in /proc/[0-9]*; do
    e=$(tr '\0' '\n' <"$d/environ" 2>/dev/null) || continue
    for id in $ids; do
      case "
$e
" in
      *"
AGENTBOX_PROCESS=$id
"*)
        if [ "$mode" = kill ]; then
          kill -s KILL "${d#/proc/}" 2>/dev/null && k=$((k+1))
        else
          read -r s <"$d/stat" 2>/dev/null || continue
          s=${s##*) }; set -- $s; echo "${d#/proc/} $2"
        fi
        ;;
      esac
    done
  done
  [ "$mode" = kill ] || exit 0
  round=$((round+1))
  [ $k = 0 ] && exit 0
  [ $round -lt 50 ] || { echo "agentbox: processes still forking after $round rounds of kills" >&2; exit 1; }
done
"#;

/// What a persistent session's shell starts with when the session has a directory (`$1`): the
/// shell runs there, so a command without a workdir of its own needs no [`WRAPPER`] (no extra
/// `sh` per command). A directory it cannot enter ends it at once (sh says why on stderr).
pub const SESSION_SHELL: &str = r#"cd -- "$1" && exec sh"#;

/// The argv of a persistent session's shell: `sh`, or [`SESSION_SHELL`] in `workdir`
/// (vectors: `session.shell_argv`).
pub fn session_shell_argv(workdir: Option<&str>) -> Vec<String> {
    match workdir {
        Some(dir) => sh(SESSION_SHELL, [dir]),
        None => vec!["sh".to_string()],
    }
}

/// The line a persistent session writes to its shell for one command (`argv`, already wrapped
/// by [`WRAPPER`] where needed). `exec` inside the subshell: one fork per command; stdin from
/// `/dev/null` so that the command cannot eat the following lines. The start sentinel goes out
/// before the command, the end sentinels (stdout with the exit code, stderr bare) after it,
/// each carrying `mark` (a fresh nonce).
pub fn session_line(argv: &[String], mark: &str) -> String {
    let cmd: Vec<String> = argv.iter().map(|a| sh_quote(a)).collect();
    framed(&format!("exec {}", cmd.join(" ")), mark)
}

/// `body` run in a subshell with stdin from `/dev/null`, between the sentinels of `mark`. The
/// end sentinel on stdout carries the exit code, followed by [`MEMORY_FLAG`] when the code is
/// 137 and the container's OOM kill counter ([`OOM_KILLS`], read by [`SESSION_OOM`] before and
/// after) rose meanwhile.
fn framed(body: &str, mark: &str) -> String {
    format!(
        "printf '%s+\\n' '{mark}'; {SESSION_OOM} _ab_o=$_ab_k; ( {body} ) </dev/null; _ab_r=$?; _ab_m=; if [ $_ab_r = 137 ] && [ -n \"$_ab_o\" ]; then {SESSION_OOM} [ -n \"$_ab_k\" ] && [ \"$_ab_k\" -gt \"$_ab_o\" ] 2>/dev/null && _ab_m='{MEMORY_FLAG}'; fi; printf '%s%d%s\\n' '{mark}' \"$_ab_r\" \"$_ab_m\"; printf '%s\\n' '{mark}' >&2\n"
    )
}

/// A persistent session's read of the container's OOM kill counter into `$_ab_k` (empty when
/// no file of [`OOM_KILLS`] is readable): builtins only, no process.
pub const SESSION_OOM: &str = r#"_ab_k=; for _ab_f in /sys/fs/cgroup/memory/memory.oom_control /sys/fs/cgroup/memory.events; do [ -r "$_ab_f" ] || continue; while read -r _ab_x _ab_y; do [ "$_ab_x" = oom_kill ] && _ab_k=$_ab_y; done <"$_ab_f"; break; done;"#;

/// A persistent session's end-sentinel trailer (what follows the mark on stdout, up to the
/// newline): the exit code, and whether the command was killed for memory (the code followed
/// by [`MEMORY_FLAG`]). `None`: not a trailer the session line writes.
pub fn parse_session_end(trailer: &str) -> Option<(i32, bool)> {
    let t = trailer.trim();
    let (code, oom) = match t.strip_suffix(MEMORY_FLAG) {
        Some(c) => (c, true),
        None => (t, false),
    };
    code.parse().ok().map(|c| (c, oom))
}

/// The line a persistent session writes to run the operator's own `script` with `args` as
/// its positional parameters, framed as [`session_line`] frames a command: in a subshell of
/// the session's shell (`eval` of the quoted script), not in a new `sh -c`, so a short script
/// costs one fork and the processes it starts itself.
pub fn session_script_line(script: &str, args: &[String], mark: &str) -> String {
    let args: Vec<String> = args.iter().map(|a| sh_quote(a)).collect();
    framed(
        &format!("set -- {}; eval {}", args.join(" "), sh_quote(script)),
        mark,
    )
}

/// Single-quotes `s` for `sh`.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};
    use std::process::{Command, Stdio};

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("agentbox-remote-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    /// Runs `script` with the host's `sh`, `args`, and `stdin`; returns success and stdout.
    fn run(script: &str, args: Vec<String>, stdin: &[u8]) -> (bool, Vec<u8>, String) {
        let (code, out, err) = run_argv(&sh(script, args), stdin);
        (code == 0, out, err)
    }

    fn path(p: &Path) -> String {
        p.to_string_lossy().into_owned()
    }

    #[test]
    fn every_script_names_the_one_state_directory() {
        assert_eq!(MARKER, format!("{STATE_DIR}/marker"));
        for s in [
            PROBE_SCRIPT,
            INIT_SCRIPT,
            WARM_INIT_SCRIPT,
            TAR_SCRIPT,
            SPOOL_SCRIPT,
            EXTRACT_SCRIPT,
            EXTRACT_STREAM_SCRIPT,
            DISCARD_SCRIPT,
            SWAP_SCRIPT,
        ] {
            assert!(s.contains(STATE_DIR), "{s}");
        }
    }

    #[test]
    fn the_warm_init_makes_the_state_directory_and_the_pools_marker() {
        let dir = scratch("warm");
        let (ok, _, err) = run(WARM_INIT_SCRIPT, vec![path(&dir)], b"");
        assert!(ok, "{err}");
        assert!(dir.join(STATE_DIR).join("tmp").is_dir());
        assert_eq!(
            std::fs::read_to_string(dir.join(MARKER)).expect("marker"),
            WARM_MARKER
        );
        let (ok, _, err) = run(WARM_INIT_SCRIPT, vec![path(&dir)], b"");
        assert!(ok, "again: a no-op ({err})");
        let (ok, out, _) = run(PROBE_SCRIPT, vec![path(&dir)], b"");
        assert!(ok && out == WARM_MARKER.as_bytes(), "{out:?}");
        // An empty one (a write cut short) is written again.
        std::fs::write(dir.join(MARKER), "").expect("empty marker");
        let (ok, _, err) = run(WARM_INIT_SCRIPT, vec![path(&dir)], b"");
        assert!(ok, "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.join(MARKER)).expect("marker"),
            WARM_MARKER
        );
        // A sandbox's marker, or a link, is refused.
        std::fs::write(dir.join(MARKER), "uid-1").expect("marker");
        let (ok, _, err) = run(WARM_INIT_SCRIPT, vec![path(&dir)], b"");
        assert!(!ok && err.contains("marker"), "{err}");
        std::fs::remove_file(dir.join(MARKER)).expect("rm");
        std::os::unix::fs::symlink("/etc/hostname", dir.join(MARKER)).expect("link");
        let (ok, _, err) = run(WARM_INIT_SCRIPT, vec![path(&dir)], b"");
        assert!(!ok && err.contains("marker"), "{err}");
        // A FIFO is refused too, not written into (which would block).
        std::fs::remove_file(dir.join(MARKER)).expect("rm");
        let made = std::process::Command::new("mkfifo")
            .arg(dir.join(MARKER))
            .status()
            .expect("mkfifo");
        assert!(made.success());
        let (ok, _, err) = run(WARM_INIT_SCRIPT, vec![path(&dir)], b"");
        assert!(!ok && err.contains("marker"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_probe_prints_the_marker_only_when_there_is_one() {
        let dir = scratch("probe");
        let (ok, out, _) = run(PROBE_SCRIPT, vec![path(&dir)], b"");
        assert!(ok && out.is_empty(), "no marker: nothing, and no failure");
        std::fs::create_dir_all(dir.join(STATE_DIR)).expect("mkdir");
        std::fs::write(dir.join(MARKER), "uid-1").expect("marker");
        let (ok, out, _) = run(PROBE_SCRIPT, vec![path(&dir)], b"");
        assert!(ok);
        assert_eq!(out, b"uid-1");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_first_marker_is_written_in_place_and_one_that_exists_is_replaced_whole() {
        let dir = scratch("marker");
        let root = dir.join("ws");
        std::fs::create_dir_all(root.join(STATE_DIR)).expect("mkdir");
        let init = |uid: &str| {
            run(
                INIT_SCRIPT,
                init_args(&path(&root), uid, FilesVia::None, (&[], &[]), &[]),
                b"",
            )
        };
        // An empty marker (a first write interrupted) reads as none: never initialised.
        std::fs::write(root.join(MARKER), "").expect("empty marker");
        let (ok, out, _) = run(PROBE_SCRIPT, vec![path(&root)], b"");
        assert!(ok && out.is_empty());
        std::fs::remove_file(root.join(MARKER)).expect("rm");
        let (ok, _, err) = init("uid-1");
        assert!(ok, "{err}");
        assert_eq!(
            std::fs::read_to_string(root.join(MARKER)).expect("marker"),
            "uid-1"
        );
        // Written again over one that exists: by rename, the old one whole until then.
        let (ok, _, err) = init("uid-2");
        assert!(ok, "{err}");
        assert_eq!(
            std::fs::read_to_string(root.join(MARKER)).expect("marker"),
            "uid-2"
        );
        assert!(!root.join(".agentbox/marker.tmp").exists());
        // A marker planted as a symlink is replaced, its target untouched.
        let target = dir.join("outside");
        std::fs::write(&target, "keep").expect("target");
        std::fs::remove_file(root.join(MARKER)).expect("rm");
        std::os::unix::fs::symlink(&target, root.join(MARKER)).expect("symlink");
        let (ok, _, err) = init("uid-3");
        assert!(ok, "{err}");
        assert_eq!(std::fs::read_to_string(&target).expect("target"), "keep");
        assert!(
            !std::fs::symlink_metadata(root.join(MARKER))
                .expect("marker")
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            std::fs::read_to_string(root.join(MARKER)).expect("marker"),
            "uid-3"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A tar archive of `files` (name, content).
    fn archive<D: AsRef<[u8]>>(files: &[(&str, D)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let data = data.as_ref();
            let mut h = tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, data).expect("append");
        }
        b.into_inner().expect("archive")
    }

    #[test]
    fn a_restore_stages_then_swaps_in_leaving_mounts_and_state_alone() {
        let dir = scratch("restore");
        std::fs::create_dir_all(dir.join(STATE_DIR)).expect("mkdir");
        std::fs::write(dir.join(MARKER), "m").expect("marker");
        std::fs::write(dir.join("old.txt"), "old").expect("old");
        std::fs::create_dir_all(dir.join("mnt")).expect("mount dir");
        std::fs::write(dir.join("mnt/host"), "h").expect("host file");
        let root = path(&dir);
        let stdin = archive(&[("new.txt", "new"), ("mnt", "not swapped in")]);
        let (ok, _, err) = run(SPOOL_SCRIPT, vec![root.clone(), "id1".into()], &stdin);
        assert!(ok, "{err}");
        assert_eq!(
            std::fs::read(dir.join(".agentbox/spool-id1.tar")).expect("spool"),
            stdin
        );
        let (ok, out, err) = run(EXTRACT_SCRIPT, vec![root.clone(), "id1".into()], b"");
        assert!(ok, "{err}");
        assert!(dir.join(".agentbox/staging-id1/new.txt").is_file());
        assert!(
            String::from_utf8_lossy(&out).contains("new.txt"),
            "the member list is the extraction's progress: {out:?}"
        );
        assert!(
            !dir.join(".agentbox/spool-id1.tar").exists(),
            "the extraction removes the spool"
        );
        let (ok, _, err) = run(SWAP_SCRIPT, swap_args(&root, "id1", &["mnt".into()]), b"");
        assert!(ok, "{err}");
        assert_eq!(
            std::fs::read_to_string(dir.join("new.txt")).expect("new"),
            "new"
        );
        assert!(!dir.join("old.txt").exists(), "the old entries go");
        assert_eq!(
            std::fs::read_to_string(dir.join("mnt/host")).expect("kept"),
            "h"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join(MARKER)).expect("marker"),
            "m"
        );
        assert!(!dir.join(".agentbox/staging-id1").exists());
        assert!(!dir.join(".agentbox/old-id1").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_swap_without_staging_fails_and_discard_removes_what_extract_left() {
        let dir = scratch("discard");
        std::fs::write(dir.join("keep.txt"), "k").expect("file");
        let root = path(&dir);
        let (ok, _, err) = run(SWAP_SCRIPT, swap_args(&root, "none", &[]), b"");
        assert!(!ok && err.contains("no staging directory"), "{err}");
        assert!(dir.join("keep.txt").is_file(), "the workspace is untouched");
        let stdin = archive(&[("a", "1")]);
        let (ok, _, err) = run(
            EXTRACT_STREAM_SCRIPT,
            vec![root.clone(), "id2".into()],
            &stdin,
        );
        assert!(ok, "{err}");
        assert!(dir.join(".agentbox/staging-id2/a").is_file());
        // A spool written and never extracted (the digest did not match, or it stalled).
        let (ok, _, err) = run(SPOOL_SCRIPT, vec![root.clone(), "id2".into()], &stdin);
        assert!(ok, "{err}");
        let (ok, _, _) = run(DISCARD_SCRIPT, vec![root, "id2".into()], b"");
        assert!(ok);
        assert!(!dir.join(".agentbox/staging-id2").exists());
        assert!(!dir.join(".agentbox/spool-id2.tar").exists());
        assert!(dir.join("keep.txt").is_file());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_spool_on_a_full_disk_fails_with_the_reason_and_leaves_nothing() {
        let dir = scratch("spool-full");
        std::fs::write(dir.join("keep.txt"), "k").expect("file");
        let root = path(&dir);
        // The image's `cat`, first in PATH, writing where the kernel answers every write with
        // ENOSPC: the real error of a full disk, from the real `cat`.
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        let real = String::from_utf8(
            Command::new("sh")
                .args(["-c", "command -v cat"])
                .output()
                .expect("which cat")
                .stdout,
        )
        .expect("utf-8");
        std::fs::write(
            bin.join("cat"),
            format!("#!/bin/sh\nexec {} \"$@\" > /dev/full\n", real.trim()),
        )
        .expect("planted cat");
        let mut perms = std::fs::metadata(bin.join("cat"))
            .expect("meta")
            .permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(bin.join("cat"), perms).expect("chmod");
        let path_var = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = Command::new("sh")
            .args(["-c", SPOOL_SCRIPT, "sh", &root, "id3"])
            .env("PATH", &path_var)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                let mut stdin = c.stdin.take().expect("stdin");
                // The writer may see the pipe close once `cat` fails.
                let _ = stdin.write_all(&archive(&[("a", "1")]));
                drop(stdin);
                c.wait_with_output()
            })
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(err.contains("No space left on device"), "{err}");
        assert!(!dir.join(".agentbox/spool-id3.tar").exists(), "removed");
        assert!(!dir.join(".agentbox/staging-id3").exists());
        // Nothing to extract then, and the extraction says so.
        let (ok, _, err) = run(EXTRACT_SCRIPT, vec![root, "id3".into()], b"");
        assert!(!ok && err.contains("no spooled archive"), "{err}");
        assert!(!dir.join(".agentbox/staging-id3").exists());
        assert_eq!(
            std::fs::read_to_string(dir.join("keep.txt")).expect("kept"),
            "k"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tar_args_expand_mount_ancestors() {
        assert_eq!(tar_args("/workspace", &[]), vec!["/workspace", "0"]);
        assert_eq!(
            tar_args("/w", &["data".into(), "./a/b/c/".into()]),
            vec!["/w", "2", "a", "a/b", "data", "a/b/c"]
        );
    }

    /// Runs [`TAR_SCRIPT`] with the host's `sh` and `tar` on a scratch workspace; returns the
    /// exit status, the member names, and stderr.
    fn run_tar_script(root: &std::path::Path, mounts: &[String]) -> (bool, Vec<String>, String) {
        let out = Command::new("sh")
            .args(["-c", TAR_SCRIPT, "sh"])
            .args(tar_args(&root.to_string_lossy(), mounts))
            .output()
            .expect("run sh");
        let mut names = Vec::new();
        if out.status.success() {
            let mut ar = tar::Archive::new(&out.stdout[..]);
            for e in ar.entries().expect("entries") {
                let e = e.expect("entry");
                names.push(e.path().expect("path").to_string_lossy().into_owned());
            }
            names.sort();
        }
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), names, err)
    }

    #[test]
    fn tar_script_keeps_tar_s_exit_status_through_its_dd_stage() {
        let dir = scratch("status");
        std::fs::create_dir_all(dir.join(".agentbox")).expect("mkdir");
        std::fs::write(dir.join(".agentbox/marker"), "m").expect("marker");
        std::fs::write(dir.join("f"), "x").expect("write");
        // A tar that prints a little and fails, first in PATH.
        let bin = scratch("status-bin");
        std::fs::write(bin.join("tar"), "#!/bin/sh\nprintf partial\nexit 3\n").expect("fake tar");
        Command::new("chmod")
            .args(["0755", &bin.join("tar").to_string_lossy()])
            .status()
            .expect("chmod");
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let out = Command::new("sh")
            .args(["-c", TAR_SCRIPT, "sh"])
            .args(tar_args(&dir.to_string_lossy(), &[]))
            .env("PATH", path)
            .output()
            .expect("run sh");
        assert_eq!(
            out.status.code(),
            Some(3),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.stdout, b"partial");
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&bin);
    }

    #[test]
    fn tar_script_refuses_a_workspace_without_its_marker() {
        let dir = scratch("nomarker");
        std::fs::write(dir.join("f"), "x").expect("write");
        let (ok, _, err) = run_tar_script(&dir, &[]);
        assert!(!ok, "a workspace without a marker must not be archived");
        assert!(err.contains("no agentbox marker"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tar_script_archives_all_but_its_own_dir_and_mounts() {
        let dir = scratch("ok");
        std::fs::create_dir_all(dir.join(".agentbox")).expect("mkdir");
        std::fs::write(dir.join(".agentbox/marker"), "m").expect("marker");
        std::fs::create_dir_all(dir.join("a/mnt")).expect("mkdir");
        std::fs::write(dir.join("a/mnt/secret"), "s").expect("write");
        std::fs::write(dir.join("a/keep"), "k").expect("write");
        std::fs::write(dir.join(".hidden"), "h").expect("write");
        let (ok, names, err) = run_tar_script(&dir, &["a/mnt".into()]);
        assert!(ok, "{err}");
        assert_eq!(names, vec!["./.hidden", "./a/keep"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Runs `argv` on the host with `stdin`; returns the exit code, stdout and stderr.
    fn run_argv(argv: &[String], stdin: &[u8]) -> (i32, Vec<u8>, String) {
        let (code, out, err, _) = run_fed(argv, stdin);
        (code, out, err)
    }

    /// [`run_argv`], and whether all of `stdin` was taken (a script that exits with its stdin
    /// unread fails the write).
    fn run_fed(argv: &[String], stdin: &[u8]) -> (i32, Vec<u8>, String, bool) {
        use std::io::Write;
        let mut child = Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run");
        let wrote = child
            .stdin
            .take()
            .is_some_and(|mut i| i.write_all(stdin).is_ok());
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code().unwrap_or(-1), out.stdout, err, wrote)
    }

    #[test]
    fn a_session_runs_the_init_script_inline_and_keeps_going_after_it() {
        let root = scratch("session-init");
        std::fs::create_dir_all(root.join(".agentbox/tmp")).expect("warm state dir");
        // With a file passed inline, as a claim with files sends it.
        let file = InlineFile {
            path: "task.md",
            mode: 0o644,
            data: b"it's 100% \\done\n",
        };
        let args = init_args(&path(&root), "uid-7", FilesVia::Inline, (&[], &[]), &[file]);
        // The init, a failing script (set -e inside stops only its subshell), then a plain
        // command: each framed with its own status, the shell's directory untouched by the
        // init's `cd`.
        let lines = [
            session_script_line(INIT_SCRIPT, &args, "__A_"),
            session_script_line("set -eu\nfalse\necho never", &[], "__B_"),
            session_line(&["pwd".to_string()], "__C_"),
        ]
        .concat();
        let (code, out, err) = run_argv(&["sh".to_string()], lines.as_bytes());
        assert_eq!(code, 0, "{err}");
        assert_eq!(
            std::fs::read_to_string(root.join(MARKER)).expect("marker"),
            "uid-7"
        );
        assert!(!root.join(".agentbox/marker.tmp").exists());
        assert_eq!(
            std::fs::read(root.join("task.md")).expect("the file"),
            file.data
        );
        let out = String::from_utf8_lossy(&out);
        let here = std::env::current_dir().expect("cwd");
        assert_eq!(
            out,
            format!(
                "__A_+\n__A_0\n__B_+\n__B_1\n__C_+\n{}\n__C_0\n",
                here.display()
            ),
        );
        assert_eq!(err, "__A_\n__B_\n__C_\n");
        let _ = std::fs::remove_dir_all(&root);
    }

    /// The argv the clients build for a file script (`sh -c PROLOGUE+script`).
    fn file_op(script: &str, root: &Path, p: &str) -> Vec<String> {
        let (argv, _) = crate::files::file_argv(script, &path(root), p).expect("a confined path");
        argv
    }

    #[test]
    fn file_scripts_write_read_and_list_inside_the_workspace() {
        let root = scratch("files");
        let (code, _, err) = run_argv(&file_op(WRITE, &root, "a/b/c.txt"), b"hello");
        assert_eq!(code, 0, "{err}");
        let (code, out, err) = run_argv(&file_op(READ, &root, "a/b/c.txt"), b"");
        assert_eq!((code, out.as_slice()), (0, &b"hello"[..]), "{err}");
        let (code, out, err) = run_argv(&file_op(LIST, &root, "a/b"), b"");
        assert_eq!(code, 0, "{err}");
        let entries = crate::files::parse_listing(&out).expect("listing");
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].name, "c.txt");
        assert_eq!(entries[0].size, 5);
        // No temporary file is left beside the written one.
        let names: Vec<_> = std::fs::read_dir(root.join("a/b")).unwrap().collect();
        assert_eq!(names.len(), 1);
        let (code, _, _) = run_argv(&file_op(READ, &root, "a/missing"), b"");
        assert_eq!(code, MISSING);
        let (code, _, _) = run_argv(&file_op(READ, &root, "a"), b"");
        assert_eq!(code, MISSING, "a directory is not a regular file");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn file_scripts_refuse_a_symlink_leading_out_of_the_workspace() {
        let root = scratch("files-escape");
        let outside = scratch("files-outside");
        std::fs::write(outside.join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
        let (code, out, _) = run_argv(&file_op(READ, &root, "out/secret"), b"");
        assert_eq!((code, out.len()), (ESCAPES, 0));
        let (code, _, _) = run_argv(&file_op(WRITE, &root, "out/new"), b"x");
        assert_eq!(code, ESCAPES);
        assert!(!outside.join("new").exists());
        let (code, _, _) = run_argv(&file_op(UPLOAD, &root, "out"), b"");
        assert_eq!(code, ESCAPES);
        // A link that stays inside is followed.
        std::fs::write(root.join("f"), b"in").unwrap();
        std::os::unix::fs::symlink(root.join("f"), root.join("g")).unwrap();
        let (code, out, _) = run_argv(&file_op(READ, &root, "g"), b"");
        assert_eq!((code, out.as_slice()), (0, &b"in"[..]));
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_dir_all(&outside);
    }

    /// The spools an upload left in the state directory of `root`.
    fn spools(root: &Path) -> Vec<String> {
        std::fs::read_dir(root.join(".agentbox/tmp"))
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The names under `dir`, recursively, sorted.
    fn tree(dir: &Path) -> Vec<String> {
        let mut v = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let e = e.unwrap().path();
                v.push(path(e.strip_prefix(dir).unwrap()));
                if e.is_dir() && !e.is_symlink() {
                    stack.push(e);
                }
            }
        }
        v.sort();
        v
    }

    /// The busybox tools the upload script uses, first on a `PATH` (as in the sandbox image),
    /// when the host has busybox.
    fn busybox_path() -> Option<PathBuf> {
        let bb = ["/usr/bin/busybox", "/bin/busybox"]
            .into_iter()
            .find(|p| Path::new(p).exists())?;
        let dir = scratch("busybox-bin");
        for tool in [
            "sh", "tar", "cat", "mkdir", "rm", "find", "readlink", "dirname", "wc", "du",
        ] {
            std::os::unix::fs::symlink(bb, dir.join(tool)).unwrap();
        }
        Some(dir)
    }

    /// The host's own tools (`None`), then busybox's first on the `PATH`, where it is installed.
    fn toolsets(busybox: Option<&Path>) -> Vec<Option<&Path>> {
        std::iter::once(None).chain(busybox.map(Some)).collect()
    }

    /// The upload argv for `dest` under `root`, run by `sh -c` with a file size limit of
    /// `fsize` 512-byte blocks (SIGXFSZ ignored, so a write past it fails with EFBIG as a write
    /// to a full disk fails with ENOSPC), with `bin` first on the `PATH` when given.
    fn upload_run(
        root: &Path,
        dest: &str,
        stdin: &[u8],
        fsize: Option<u32>,
        bin: Option<&Path>,
    ) -> (i32, String, bool) {
        upload_limited(root, dest, stdin, (fsize, None), bin)
    }

    /// [`upload_run`] with the workspace's size limit `size_limit` in [`LIMIT_ENV`], as the operator
    /// gives a limited sandbox's container.
    fn upload_limited(
        root: &Path,
        dest: &str,
        stdin: &[u8],
        (fsize, size_limit): (Option<u32>, Option<u64>),
        bin: Option<&Path>,
    ) -> (i32, String, bool) {
        use std::io::Write;
        let mut argv = vec!["sh".to_string(), "-c".to_string()];
        let limit = fsize.map_or(String::new(), |n| format!("trap '' XFSZ; ulimit -f {n}; "));
        argv.push(format!("{limit}exec \"$@\""));
        argv.push("sh".to_string());
        argv.extend(file_op(UPLOAD, root, dest));
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        cmd.env_remove(LIMIT_ENV);
        if let Some(bytes) = size_limit {
            cmd.env(LIMIT_ENV, bytes.to_string());
        }
        if let Some(bin) = bin {
            let old = std::env::var("PATH").unwrap_or_default();
            cmd.env("PATH", format!("{}:{old}", bin.display()));
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run");
        let mut i = child.stdin.take().unwrap();
        let wrote = i.write_all(stdin).is_ok();
        drop(i);
        let out = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code().unwrap_or(-1), err, wrote)
    }

    #[test]
    fn a_file_script_that_refuses_reads_its_stdin_first() {
        // A write onto a directory's path, and one outside the workspace: both refused
        // before `cat` reads anything, with more stdin than a pipe holds. Unread, the
        // client's send would fail here (and, through an exec, wait for ever).
        let root = scratch("files-refuse");
        std::fs::create_dir_all(root.join("dir")).unwrap();
        let outside = scratch("files-refuse-outside");
        std::os::unix::fs::symlink(&outside, root.join("out")).unwrap();
        let data = vec![b'x'; 1 << 20];
        for (path, code) in [("dir", MISSING), ("out/x", ESCAPES)] {
            let (got, _, err, wrote) = run_fed(&file_op(WRITE, &root, path), &data);
            assert_eq!(got, code, "{path}: {err}");
            assert!(wrote, "{path}: the script exited with its stdin unread");
        }
        assert!(!outside.join("x").exists());
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_dir_all(&outside);
    }

    #[test]
    fn upload_and_download_carry_a_directory_as_tar() {
        let src = scratch("files-src");
        std::fs::create_dir_all(src.join("d")).unwrap();
        std::fs::write(src.join("d/x"), b"xx").unwrap();
        let (code, tar, err) = run_argv(&file_op(DOWNLOAD, &src, "d"), b"");
        assert_eq!(code, 0, "{err}");
        let dst = scratch("files-dst");
        let (code, _, err) = run_argv(&file_op(UPLOAD, &dst, "e"), &tar);
        assert_eq!(code, 0, "{err}");
        assert_eq!(std::fs::read(dst.join("e/x")).unwrap(), b"xx");
        // The spool went, and was never among the user's files.
        assert!(spools(&dst).is_empty(), "{:?}", spools(&dst));
        assert_eq!(tree(&dst.join("e")), ["x"]);
        let _ = std::fs::remove_dir_all(&src);
        let _ = std::fs::remove_dir_all(&dst);
    }

    #[test]
    fn an_upload_spools_then_extracts_and_leaves_no_spool_however_it_ends() {
        let big: Vec<u8> = (0..=255u8).cycle().take(64 << 10).collect();
        let files = [
            ("a/one.txt", b"one".to_vec()),
            ("a/big.bin", big.clone()),
            ("b/two.txt", b"two".to_vec()),
        ];
        let tar = archive(&files);
        let bb = busybox_path();
        for bin in toolsets(bb.as_deref()) {
            let what = format!("{bin:?}");
            // Whole: extracted, and the spool is gone.
            let root = scratch("upload-ok");
            let (code, err, _) = upload_run(&root, "dst", &tar, None, bin);
            assert_eq!(code, 0, "{what}: {err}");
            assert_eq!(std::fs::read(root.join("dst/a/big.bin")).unwrap(), big);
            assert_eq!(std::fs::read(root.join("dst/b/two.txt")).unwrap(), b"two");
            assert!(spools(&root).is_empty(), "{what}");
            let _ = std::fs::remove_dir_all(&root);

            // A tar that fails midway (the archive is cut inside a member): tar's own exit code
            // and words, and no spool left.
            let root = scratch("upload-cut");
            let cut = &tar[..2048 + 512 + 10_000];
            let (code, err, _) = upload_run(&root, "dst", cut, None, bin);
            assert!(code != 0 && code != SPOOL_FAILED, "{what}: {code} {err}");
            assert!(spools(&root).is_empty(), "{what}");
            let _ = std::fs::remove_dir_all(&root);

            // The spool cannot be written whole (a file size limit of 16 KiB for a 70 KiB
            // archive, as a full disk): nothing extracted, no spool, the cause named, and
            // the rest of the stream read.
            let root = scratch("upload-full");
            let (code, err, wrote) = upload_run(&root, "dst", &tar, Some(32), bin);
            assert_eq!(code, SPOOL_FAILED, "{what}: {err}");
            assert!(wrote, "the script stopped reading its stdin: {what}: {err}");
            assert!(
                err.contains("could not be written to its spool") && err.contains("disk full"),
                "{what}: {err}"
            );
            assert!(
                err.contains("large"),
                "the writer's own error: {what}: {err}"
            );
            assert!(tree(&root.join("dst")).is_empty(), "{what}");
            assert!(spools(&root).is_empty(), "{what}");
            let _ = std::fs::remove_dir_all(&root);

            // A destination holding a symlink that leads out is refused before anything is
            // spooled, and the stream is still read whole (the client is not left waiting).
            let root = scratch("upload-link-escape");
            let outside = scratch("upload-link-outside");
            std::fs::create_dir_all(root.join("dst")).unwrap();
            std::os::unix::fs::symlink(&outside, root.join("dst/out")).unwrap();
            let (code, err, wrote) = upload_run(&root, "dst", &tar, None, bin);
            assert_eq!(code, ESCAPES, "{what}: {err}");
            assert!(wrote, "the script stopped reading its stdin: {what}: {err}");
            assert!(tree(&outside).is_empty(), "{what}");
            assert!(spools(&root).is_empty(), "{what}");
            for d in [root, outside] {
                let _ = std::fs::remove_dir_all(d);
            }

            // A state directory that leads out of the workspace is refused before anything
            // is written there.
            let root = scratch("upload-state-escape");
            let outside = scratch("upload-state-outside");
            std::fs::create_dir_all(root.join(".agentbox")).unwrap();
            std::os::unix::fs::symlink(&outside, root.join(".agentbox/tmp")).unwrap();
            let (code, err, wrote) = upload_run(&root, "dst", &tar, None, bin);
            assert_eq!(code, ESCAPES, "{what}: {err}");
            assert!(wrote, "the script stopped reading its stdin: {what}: {err}");
            assert!(tree(&outside).is_empty(), "{what}");
            assert!(tree(&root.join("dst")).is_empty(), "{what}");
            for d in [root, outside] {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        if let Some(b) = bb {
            let _ = std::fs::remove_dir_all(b);
        }
    }

    #[test]
    fn an_upload_that_would_pass_the_size_limit_extracts_nothing() {
        assert!(UPLOAD.contains(&format!("${{{LIMIT_ENV}:-}}")));
        let big: Vec<u8> = (0..=255u8).cycle().take(256 << 10).collect();
        let tar = archive(&[("a/big.bin", big.as_slice()), ("a/one.txt", &b"one"[..])]);
        let n = tar.len() as u64;
        let bb = busybox_path();
        for bin in toolsets(bb.as_deref()) {
            let what = format!("{bin:?}");
            let root = scratch("upload-limit");
            std::fs::create_dir_all(root.join("dst")).unwrap();
            std::fs::write(root.join("dst/keep.txt"), b"kept").unwrap();
            // The spool (the archive's size) fits, the spool and what extraction writes do
            // not: refused with the numbers, nothing extracted, no spool, the stream read whole.
            let limit = n + n / 2;
            let (code, err, wrote) = upload_limited(&root, "dst", &tar, (None, Some(limit)), bin);
            assert_eq!(code, TOO_LARGE, "{what}: {err}");
            assert!(wrote, "the script stopped reading its stdin: {what}: {err}");
            assert!(
                err.contains(&format!("size limit of {limit} bytes"))
                    && err.contains(&format!("{n} in its archive, 2 entries"))
                    && err.contains("nothing was extracted"),
                "{what}: {err}"
            );
            assert_eq!(tree(&root.join("dst")), ["keep.txt"], "{what}");
            assert!(spools(&root).is_empty(), "{what}");

            // Room for the spool and the files beside it: extracted.
            let limit = 4 * n;
            let (code, err, _) = upload_limited(&root, "dst", &tar, (None, Some(limit)), bin);
            assert_eq!(code, 0, "{what}: {err}");
            assert_eq!(std::fs::read(root.join("dst/a/big.bin")).unwrap(), big);
            assert!(spools(&root).is_empty(), "{what}");

            // A spool that cannot be written says the limit too.
            let (code, err, _) = upload_limited(&root, "dst", &tar, (Some(32), Some(limit)), bin);
            assert_eq!(code, SPOOL_FAILED, "{what}: {err}");
            assert!(
                err.contains(&format!("its size limit is {limit} bytes")),
                "{what}: {err}"
            );
            let _ = std::fs::remove_dir_all(&root);
        }
        if let Some(b) = bb {
            let _ = std::fs::remove_dir_all(b);
        }
    }

    /// The shells the wrapper is tried with: busybox's (the sandbox image's), dash and bash
    /// (other images' `sh`), each that the host has.
    fn shells() -> Vec<Vec<String>> {
        let has = |p: &str| {
            Command::new(p)
                .arg("-c")
                .arg("true")
                .status()
                .is_ok_and(|s| s.success())
        };
        let mut v = Vec::new();
        if Command::new("busybox")
            .args(["sh", "-c", "true"])
            .status()
            .is_ok_and(|s| s.success())
        {
            v.push(vec!["busybox".to_string(), "sh".to_string()]);
        }
        for sh in ["dash", "bash"] {
            if has(sh) {
                v.push(vec![sh.to_string()]);
            }
        }
        assert!(!v.is_empty(), "no shell to try the wrapper with");
        v
    }

    const MK: &str = "__AGENTBOX_00112233445566778899aabbccddeeff_";

    /// `SHELL -c WRAPPER agentbox-exec MARK STDIN TIMEOUT WORKDIR N ENV... ARGV...`.
    fn wrapped(
        shell: &[String],
        (mark, stdin): (&str, &str),
        timeout: &str,
        dir: &str,
        env: &[&str],
        argv: &[&str],
    ) -> Vec<String> {
        let mut v: Vec<String> = shell.to_vec();
        v.extend(
            ["-c", WRAPPER, "agentbox-exec", mark, stdin, timeout, dir]
                .iter()
                .map(|s| s.to_string()),
        );
        v.push(env.len().to_string());
        v.extend(env.iter().chain(argv).map(|s| s.to_string()));
        v
    }

    /// `out` without its trailing mark; fails when it does not end with it.
    fn unmarked(out: &[u8]) -> String {
        let s = String::from_utf8_lossy(out).into_owned();
        s.strip_suffix(MK)
            .unwrap_or_else(|| panic!("no trailer in {s:?}"))
            .to_string()
    }

    #[test]
    fn an_upload_removes_the_spools_nobody_has_written_for_an_hour() {
        // One left by an upload that was SIGKILLed two hours ago, one of an upload under way.
        let tar = archive(&[("a.txt", b"a")]);
        let bb = busybox_path();
        for bin in toolsets(bb.as_deref()) {
            let what = format!("{bin:?}");
            let root = scratch("upload-stale");
            let tmp = root.join(".agentbox/tmp");
            std::fs::create_dir_all(&tmp).unwrap();
            let (stale, live) = (
                tmp.join("upload-4000001.tar"),
                tmp.join("upload-4000002.tar"),
            );
            std::fs::write(&stale, b"left behind").unwrap();
            std::fs::write(&live, b"arriving").unwrap();
            let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
            std::fs::File::options()
                .write(true)
                .open(&stale)
                .and_then(|f| f.set_modified(two_hours_ago))
                .unwrap();
            let (code, err, _) = upload_run(&root, "dst", &tar, None, bin);
            assert_eq!(code, 0, "{what}: {err}");
            assert_eq!(std::fs::read(root.join("dst/a.txt")).unwrap(), b"a");
            assert_eq!(spools(&root), vec!["upload-4000002.tar"], "{what}");
            let _ = std::fs::remove_dir_all(&root);
        }
    }

    /// The wrapper and the session line with the counter files replaced by `counter` (a file
    /// of the test's, in cgroup v1's format), so a command can "be killed for memory": it
    /// raises the count and kills itself with SIGKILL.
    fn with_counter(script: &str, counter: &Path) -> String {
        let c = counter.to_string_lossy();
        script
            .replace(OOM_KILLS[0], &c)
            .replace(OOM_KILLS[1], "/nonexistent/memory.events")
    }

    #[test]
    fn the_wrapper_and_a_session_say_killed_for_memory_only_for_sigkill_with_the_counter_risen() {
        let dir = scratch("oom");
        let counter = dir.join("memory.oom_control");
        let write = |n: u32| {
            std::fs::write(
                &counter,
                format!("oom_kill_disable 0\nunder_oom 0\noom_kill {n}\n"),
            )
            .unwrap()
        };
        let bump = format!(
            "printf 'oom_kill_disable 0\\nunder_oom 0\\noom_kill 8\\n' > {}",
            counter.to_string_lossy()
        );
        let memory = memory_trailer(MK);
        // (command, the memory trailer expected)
        let cases = [
            (format!("{bump}; kill -9 $$"), true),
            ("kill -9 $$".to_string(), false),
            (format!("{bump}; exit 3"), false),
            (format!("{bump}; exit 0"), false),
        ];
        let wrapper = with_counter(WRAPPER, &counter);
        for sh in shells() {
            for (cmd, oom) in &cases {
                for timeout in ["", "30.000"] {
                    write(7);
                    let mut argv = sh.clone();
                    argv.extend(
                        [
                            "-c",
                            &wrapper,
                            "agentbox-exec",
                            MK,
                            "-",
                            timeout,
                            "",
                            "0",
                            "sh",
                            "-c",
                            cmd,
                        ]
                        .iter()
                        .map(|s| s.to_string()),
                    );
                    let (code, out, err) = run_argv(&argv, b"");
                    let end = if *oom { &memory } else { MK };
                    let what = format!("{sh:?} {cmd} timeout {timeout:?}: {err}");
                    assert!(String::from_utf8_lossy(&out).ends_with(end), "{what}");
                    assert!(err.ends_with(end), "{what}");
                    assert!(!err.contains("integer"), "{what}");
                    if cmd.ends_with("kill -9 $$") {
                        assert_eq!(code, 137, "{what}");
                    }
                }
            }
            // No counter file at all (gVisor's cgroupfs): the plain mark, whatever the code.
            let mut argv = sh.clone();
            let none = WRAPPER
                .replace(OOM_KILLS[0], "/nonexistent/a")
                .replace(OOM_KILLS[1], "/nonexistent/b");
            argv.extend(
                [
                    "-c",
                    &none,
                    "agentbox-exec",
                    MK,
                    "-",
                    "",
                    "",
                    "0",
                    "sh",
                    "-c",
                    "kill -9 $$",
                ]
                .iter()
                .map(|s| s.to_string()),
            );
            let (code, out, err) = run_argv(&argv, b"");
            assert_eq!((code, unmarked(&out).as_str()), (137, ""), "{sh:?}: {err}");
            // A persistent session's line: the end sentinel carries the flag after the code.
            for (cmd, oom) in &cases {
                write(7);
                let line = with_counter(
                    &session_line(&["sh".into(), "-c".into(), cmd.clone()], "M"),
                    &counter,
                );
                let mut argv = sh.clone();
                argv.extend(["-c".to_string(), line]);
                let (_, out, err) = run_argv(&argv, b"");
                let out = String::from_utf8_lossy(&out).into_owned();
                let end = out
                    .rsplit("M")
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .to_string();
                let (code, memory) = parse_session_end(&end).unwrap_or_else(|| panic!("{out:?}"));
                assert_eq!(memory, *oom, "{sh:?} {cmd}: {out:?} {err}");
                if cmd.ends_with("kill -9 $$") {
                    assert_eq!(code, 137);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn session_end_trailers_carry_the_code_and_the_memory_flag() {
        assert_eq!(parse_session_end("0"), Some((0, false)));
        assert_eq!(parse_session_end("137!"), Some((137, true)));
        assert_eq!(parse_session_end(" 42 "), Some((42, false)));
        assert_eq!(parse_session_end("!"), None);
        assert_eq!(parse_session_end("137!!"), None);
        assert_eq!(memory_trailer(MK), format!("{}!", &MK[..MK.len() - 1]));
        // The wrapper and the session read the files this crate documents.
        for f in OOM_KILLS {
            assert!(WRAPPER.contains(f) && SESSION_OOM.contains(f), "{f}");
        }
    }

    #[test]
    fn a_command_that_leaves_its_stdin_unread_has_it_read_after_the_marks() {
        let data = vec![b'x'; 1 << 20];
        for sh in shells() {
            for mode in ["=".to_string(), data.len().to_string()] {
                let argv = wrapped(&sh, (MK, &mode), "", "", &[], &["sh", "-c", "exit 3"]);
                let (code, out, _, wrote) = run_fed(&argv, &data);
                assert_eq!(code, 3, "{sh:?} {mode}");
                assert_eq!(unmarked(&out), "", "{sh:?} {mode}");
                assert!(wrote, "{sh:?} {mode}: the wrapper left its stdin unread");
            }
        }
    }

    #[test]
    fn the_wrapper_sets_workdir_and_env_keeps_the_exit_code_and_ends_both_streams_with_the_mark() {
        let dir = scratch("wrapper");
        for sh in shells() {
            let argv = wrapped(
                &sh,
                (MK, "-"),
                "",
                &path(&dir),
                &["A=1 2", "B=x"],
                &["sh", "-c", "pwd; echo \"$A|$B\"; echo e >&2; exit 7"],
            );
            let (code, out, err) = run_argv(&argv, b"");
            assert_eq!(code, 7, "{sh:?}: {err}");
            assert_eq!(unmarked(&out), format!("{}\n1 2|x\n", path(&dir)), "{sh:?}");
            assert_eq!(unmarked(err.as_bytes()), "e\n", "{sh:?}");
            let (code, out, err) = run_argv(
                &wrapped(&sh, (MK, "-"), "", "/no/such/dir", &[], &["true"]),
                b"",
            );
            assert_eq!(code, 126, "{sh:?}");
            assert_eq!(unmarked(&out), "");
            assert!(
                unmarked(err.as_bytes()).contains("/no/such/dir"),
                "{sh:?}: {err}"
            );
            // A program that does not exist: 127 and the shell's message, as in any shell; a
            // name that is a shell builtin or the wrapper's function runs the program.
            let (code, _, err) = run_argv(
                &wrapped(&sh, (MK, "-"), "", "", &[], &["agentbox-no-such-program"]),
                b"",
            );
            assert_eq!(code, 127, "{sh:?}");
            assert!(unmarked(err.as_bytes()).contains("agentbox-no-such-program"));
            let (code, _, _) = run_argv(&wrapped(&sh, (MK, "-"), "", "", &[], &["run"]), b"");
            assert_eq!(code, 127, "{sh:?}: `run` is no program here");
            let (code, out, _) =
                run_argv(&wrapped(&sh, (MK, "-"), "", "", &[], &["exit", "3"]), b"");
            assert_eq!(
                (code, out.is_empty()),
                (127, false),
                "{sh:?}: not the builtin"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_wrapper_gives_the_command_the_stdin_its_mode_says() {
        for sh in shells() {
            // `-`: nothing; the bytes sent are the linger's.
            let (code, out, _) = run_argv(&wrapped(&sh, (MK, "-"), "", "", &[], &["cat"]), b"in");
            assert_eq!((code, unmarked(&out)), (0, String::new()), "{sh:?}");
            // `K`: exactly the first K bytes, then EOF.
            let (code, out, _) = run_argv(&wrapped(&sh, (MK, "3"), "", "", &[], &["cat"]), b"abc");
            assert_eq!((code, unmarked(&out)), (0, "abc".to_string()), "{sh:?}");
            let (code, out, _) = run_argv(
                &wrapped(&sh, (MK, "3"), "", "", &[], &["sh", "-c", "cat; echo; cat"]),
                b"abcdef",
            );
            assert_eq!((code, unmarked(&out)), (0, "abc\n".to_string()), "{sh:?}");
            // `=`: all of it, to the end.
            let (code, out, _) =
                run_argv(&wrapped(&sh, (MK, "="), "", "", &[], &["cat"]), b"abcdef");
            assert_eq!((code, unmarked(&out)), (0, "abcdef".to_string()), "{sh:?}");
            // With a timeout too (stdin through fd 3).
            let (code, out, _) = run_argv(&wrapped(&sh, (MK, "2"), "5", "", &[], &["cat"]), b"in");
            assert_eq!((code, unmarked(&out)), (0, "in".to_string()), "{sh:?}");
            let (code, out, _) = run_argv(&wrapped(&sh, (MK, "="), "5", "", &[], &["cat"]), b"in");
            assert_eq!((code, unmarked(&out)), (0, "in".to_string()), "{sh:?}");
        }
    }

    #[test]
    fn the_wrapper_kills_a_command_past_its_timeout_and_still_ends_with_the_mark() {
        for sh in shells() {
            let (code, out, _) = run_argv(
                &wrapped(
                    &sh,
                    (MK, "-"),
                    "0.2",
                    "",
                    &[],
                    &["sh", "-c", "sleep 30; echo late"],
                ),
                b"",
            );
            assert_eq!(code, 137, "{sh:?}");
            assert_eq!(unmarked(&out), "", "{sh:?}");
        }
    }

    #[test]
    fn the_wrapper_lingers_until_stdin_ends_except_without_a_mark() {
        use std::io::{Read, Write};
        for sh in shells() {
            // A stream (`=`) too: what the command left unread is read until the client's EOF.
            for mode in ["-", "2", "="] {
                let argv = wrapped(&sh, (MK, mode), "", "", &[], &["echo", "hi"]);
                let mut child = Command::new(&argv[0])
                    .args(&argv[1..])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("run");
                let mut stdin = child.stdin.take().expect("stdin");
                let input: &[u8] = if mode == "-" { b"" } else { b"ab" };
                stdin.write_all(input).expect("write");
                stdin.flush().expect("flush");
                let mut stdout = child.stdout.take().expect("stdout");
                let want = format!("hi\n{MK}");
                let mut got = vec![0u8; want.len()];
                stdout
                    .read_exact(&mut got)
                    .expect("the output and its mark");
                assert_eq!(String::from_utf8_lossy(&got), want, "{sh:?} {mode}");
                let mut err = vec![0u8; MK.len()];
                let mut stderr = child.stderr.take().expect("stderr");
                stderr.read_exact(&mut err).expect("the stderr mark");
                // Both marks are out and the command has ended: the wrapper waits for the
                // client's EOF all the same.
                std::thread::sleep(std::time::Duration::from_millis(300));
                assert!(
                    child.try_wait().expect("wait").is_none(),
                    "{sh:?} {mode}: exited early"
                );
                drop(stdin);
                let st = child.wait().expect("wait");
                assert_eq!(st.code(), Some(0), "{sh:?} {mode}");
            }
            // An empty mark: no linger (stdin stays open here, and it ends anyway).
            for (mark, mode) in [("", "-")] {
                let argv = wrapped(&sh, (mark, mode), "", "", &["A=1"], &["echo", "hi"]);
                let mut child = Command::new(&argv[0])
                    .args(&argv[1..])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("run");
                let stdin = child.stdin.take();
                // Bounded, so that a wrapper that lingers fails here rather than hangs.
                let mut ended = false;
                for _ in 0..200 {
                    if child.try_wait().expect("wait").is_some() {
                        ended = true;
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                assert!(ended, "{sh:?} {mark:?} {mode}: lingered with stdin open");
                drop(stdin);
                let out = child.wait_with_output().expect("wait");
                if mark.is_empty() {
                    assert_eq!(out.stdout, b"hi\n", "{sh:?}: no trailer");
                    assert!(out.stderr.is_empty(), "{sh:?}");
                } else {
                    assert_eq!(unmarked(&out.stdout), "hi\n", "{sh:?}");
                }
            }
        }
    }

    #[test]
    fn session_lines_frame_each_command_with_its_nonce() {
        let mark = "__AGENTBOX_test_";
        let mut input = session_line(&["echo".into(), "it's".into()], mark);
        input.push_str(&session_line(
            &["sh".into(), "-c".into(), "cat; exit 3".into()],
            mark,
        ));
        let (code, out, err) = run_argv(&["sh".to_string()], input.as_bytes());
        assert_eq!(code, 0);
        assert_eq!(
            String::from_utf8_lossy(&out),
            format!("{mark}+\nit's\n{mark}0\n{mark}+\n{mark}3\n"),
            "the second command's stdin is /dev/null, not the following lines"
        );
        assert_eq!(err, format!("{mark}\n{mark}\n"));
    }
}
