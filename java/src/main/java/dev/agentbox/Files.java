package dev.agentbox;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;

/**
 * File access in a sandbox's workspace, over exec, confined to the workspace root twice: here,
 * before any request ({@link #confine} refuses {@code ..} and absolute paths outside the root),
 * and in the pod, where the nearest existing ancestor of the path is resolved with
 * {@code readlink -f} and must still lie under the resolved root, so a symlink cannot lead out.
 * The shared scripts are the Rust crate's byte for byte (checked against its vectors);
 * {@code STAT}, {@code RM} and {@code MKDIR} are the Python SDK's, on the same prologue.
 */
public final class Files {
  private Files() {}

  /** Exit code of the in-pod scripts for "resolves outside the workspace". */
  public static final int ESCAPES = 97;
  /** Exit code of the in-pod scripts for "missing or of the wrong type". */
  public static final int MISSING = 96;
  /**
   * Exit code of the upload script for "the archive could not be written to its spool" (a full
   * disk, most often): nothing was extracted and no spool is left.
   */
  public static final int SPOOL_FAILED = 95;
  /** Largest file a read returns by default. */
  public static final int READ_CAP = 64 << 20;
  /** argv[0] of the file scripts. */
  public static final String ARGV0 = "agentbox-files";

  static final String PROLOGUE =
      "trap 'cat >/dev/null 2>&1' EXIT\n"
          + "R=$(readlink -f \"$1\") || { echo \"agentbox: workspace root $1 is missing\" >&2; exit 96; }\n"
          + "p=$2\n"
          + "confine() {\n"
          + "  q=$1\n"
          + "  while [ ! -e \"$q\" ] && [ ! -L \"$q\" ]; do q=$(dirname \"$q\"); done\n"
          + "  r=$(readlink -f \"$q\") || { echo \"agentbox: $1: cannot resolve\" >&2; exit 97; }\n"
          + "  [ \"$R\" = / ] && return 0\n"
          + "  case \"$r/\" in \"$R\"/*) ;; *) echo \"agentbox: $1 resolves outside the workspace\" >&2; exit 97;; esac\n"
          + "}\n"
          + "confine \"$p\"\n";

  static final String READ =
      "[ -f \"$p\" ] || { echo \"agentbox: $p: not a regular file\" >&2; exit 96; }\n"
          + "exec cat \"$p\"\n";

  static final String WRITE =
      "[ -d \"$p\" ] && { echo \"agentbox: $p is a directory\" >&2; exit 96; }\n"
          + "d=$(dirname \"$p\")\n"
          + "mkdir -p \"$d\" || exit 1\n"
          + "confine \"$p\"\n"
          + "t=\"$d/.agentbox-write.$$\"\n"
          + "if cat > \"$t\"; then mv -f \"$t\" \"$p\"; else rm -f \"$t\"; exit 1; fi\n";

  static final String LIST =
      "[ -d \"$p\" ] || { echo \"agentbox: $p: not a directory\" >&2; exit 96; }\n"
          + "cd \"$p\" || exit 96\n"
          + "for f in * .*; do\n"
          + "  case $f in .|..) continue;; esac\n"
          + "  [ -e \"./$f\" ] || [ -L \"./$f\" ] || continue\n"
          + "  s=$(stat -c '%f %s %Y' \"./$f\") || continue\n"
          + "  printf '%s %s\\0' \"$s\" \"$f\"\n"
          + "done\n";

  static final String UPLOAD =
      "trap 'cat >/dev/null' EXIT\n"
          + "mkdir -p \"$p\" || exit 1\n"
          + "confine \"$p\"\n"
          + "find \"$p\" -type l | while IFS= read -r l; do\n"
          + "  r=$(readlink -f \"$l\") || continue\n"
          + "  [ \"$R\" = / ] && continue\n"
          + "  case \"$r/\" in \"$R\"/*) ;; *) echo \"agentbox: $l resolves outside the workspace\" >&2; exit 97;; esac\n"
          + "done || exit 97\n"
          + "s=\"${R%/}/.agentbox/tmp\"\n"
          + "mkdir -p \"$s\" || { echo \"agentbox: cannot make $s for the upload's spool\" >&2; exit 95; }\n"
          + "confine \"$s/upload\"\n"
          + "find \"$s\" -maxdepth 1 -name 'upload-*.tar' -mmin +60 -exec rm -f -- {} + 2>/dev/null || :\n"
          + "sp=\"$s/upload-$$.tar\"\n"
          + "trap 'rm -f -- \"$sp\"; cat >/dev/null' EXIT\n"
          + "trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM\n"
          + "if ! cat > \"$sp\"; then\n"
          + "  rm -f -- \"$sp\"\n"
          + "  echo \"agentbox: the upload could not be written to its spool $sp (is the workspace's disk full?); nothing was extracted\" >&2\n"
          + "  exit 95\n"
          + "fi\n"
          + "tar -x -o -f \"$sp\" -C \"$p\"\n";

  static final String DOWNLOAD =
      "[ -d \"$p\" ] || { echo \"agentbox: $p: not a directory\" >&2; exit 96; }\n"
          + "exec tar -c -f - -C \"$p\" .\n";

  static final String STAT =
      "[ -e \"$p\" ] || [ -L \"$p\" ] || { echo \"agentbox: $p: no such file or directory\" >&2; exit 96; }\n"
          + "s=$(stat -c '%f %s %Y' \"$p\") || exit 1\n"
          + "printf '%s %s\\0' \"$s\" \"${p##*/}\"\n";

  static final String RM =
      "[ -e \"$p\" ] || [ -L \"$p\" ] || { echo \"agentbox: $p: no such file or directory\" >&2; exit 96; }\n"
          + "[ \"$(readlink -f \"$p\")\" = \"$R\" ] && { echo \"agentbox: refusing to remove the workspace root\" >&2; exit 1; }\n"
          + "if [ \"$3\" = r ]; then exec rm -rf -- \"$p\"; fi\n"
          + "if [ -d \"$p\" ] && [ ! -L \"$p\" ]; then exec rmdir -- \"$p\"; fi\n"
          + "exec rm -f -- \"$p\"\n";

  static final String MKDIR =
      "if [ \"$3\" = p ]; then mkdir -p -- \"$p\" || exit 1; else mkdir -- \"$p\" || exit 1; fi\n"
          + "confine \"$p\"\n";
  /** This client's write with a mode ({@code $3}, octal). */
  static final String WRITE_MODE =
      WRITE.replace("if cat > \"$t\"; then", "if cat > \"$t\" && chmod \"$3\" \"$t\"; then");

  /**
   * Maps {@code path} (relative to {@code root}, or absolute under it) to an absolute,
   * normalised path under {@code root}; refuses {@code ..} anywhere and absolute paths outside
   * the root with {@link PathException}. {@code ""} and {@code "."} are the root. Pure: symlinks
   * are checked in the pod.
   */
  public static String confine(String root, String path) {
    if (path == null) {
      throw new PathException("null", "Invalid", "invalid path null");
    }
    if (path.indexOf('\0') >= 0 || !root.startsWith("/")) {
      throw new PathException(path, "Invalid", "invalid path '" + path + "'");
    }
    List<String> rootParts = parts(root);
    if (rootParts.contains("..")) {
      throw new PathException(root, "Invalid", "invalid path '" + root + "'");
    }
    List<String> p = parts(path);
    if (p.contains("..")) {
      throw new PathException(path, "DotDot", "path '" + path + "' contains '..'");
    }
    List<String> rel = p;
    if (path.startsWith("/")) {
      if (p.size() < rootParts.size() || !p.subList(0, rootParts.size()).equals(rootParts)) {
        throw new PathException(path, "OutsideRoot",
            "path '" + path + "' is outside the workspace root '" + root + "'");
      }
      rel = p.subList(rootParts.size(), p.size());
    }
    List<String> all = new ArrayList<>(rootParts);
    all.addAll(rel);
    return "/" + String.join("/", all);
  }

  private static List<String> parts(String s) {
    List<String> out = new ArrayList<>();
    for (String c : s.split("/", -1)) {
      if (!c.isEmpty() && !c.equals(".")) {
        out.add(c);
      }
    }
    return out;
  }

  /** The argv of a file script on a confined path, and that path. */
  public record Request(List<String> argv, String confined) {}

  /** The argv that runs a file script on {@code path} in the pod. */
  public static Request fileArgv(String script, String root, String path, String... extra) {
    String p = confine(root, path);
    List<String> argv = new ArrayList<>(List.of("sh", "-c", PROLOGUE + script, ARGV0, root, p));
    argv.addAll(Arrays.asList(extra));
    return new Request(argv, p);
  }

  /** Kind of a directory entry. */
  public enum Kind {
    FILE, DIR, SYMLINK, OTHER
  }

  /** One entry of a workspace directory (symlinks are not followed). */
  public record DirEntry(String name, Kind kind, long size, int mode, long mtime) {}

  /**
   * Parses the NUL-separated {@code "<hex mode> <size> <mtime> <name>"} records of the list
   * script, sorted by name (bytewise).
   */
  public static List<DirEntry> parseListing(byte[] raw) {
    List<DirEntry> out = new ArrayList<>();
    int start = 0;
    for (int i = 0; i <= raw.length; i++) {
      if (i == raw.length || raw[i] == 0) {
        if (i > start) {
          out.add(record(Arrays.copyOfRange(raw, start, i)));
        }
        start = i + 1;
      }
    }
    out.sort(Comparator.comparing(e -> e.name().getBytes(StandardCharsets.UTF_8), Arrays::compareUnsigned));
    return out;
  }

  private static DirEntry record(byte[] rec) {
    String s = new String(rec, StandardCharsets.UTF_8);
    String[] f = new String(rec, StandardCharsets.ISO_8859_1).split(" ", 4);
    if (f.length != 4) {
      throw new ProtocolException("bad listing record '" + s + "'");
    }
    int mode;
    long size;
    long mtime;
    try {
      mode = Integer.parseInt(f[0], 16);
      size = Long.parseLong(f[1]);
      mtime = Long.parseLong(f[2]);
    } catch (NumberFormatException e) {
      throw new ProtocolException("bad listing record '" + s + "': " + e.getMessage(), e);
    }
    if (mode < 0 || size < 0 || !f[0].matches("[0-9a-fA-F]+") || !f[1].matches("[0-9]+")) {
      throw new ProtocolException("bad listing record '" + s + "'");
    }
    // the name is the rest after the third space, in bytes (ISO-8859-1 kept them one to one)
    String name = new String(f[3].getBytes(StandardCharsets.ISO_8859_1), StandardCharsets.UTF_8);
    Kind kind = switch (mode & 0170000) {
      case 0100000 -> Kind.FILE;
      case 0040000 -> Kind.DIR;
      case 0120000 -> Kind.SYMLINK;
      default -> Kind.OTHER;
    };
    return new DirEntry(name, kind, size, mode & 07777, mtime);
  }

  /** Maps a file script's exit to an error. */
  static void check(String path, ExecResult r) {
    Integer code = r.exitCode();
    if (code != null && code == 0) {
      return;
    }
    String msg = r.stderrText().strip();
    if (code != null && code == ESCAPES) {
      throw new PathException(path, "Escapes", "path '" + path + "' resolves outside the workspace (symlink)");
    }
    if (code != null && code == MISSING) {
      throw new RemoteFileNotFoundException(msg);
    }
    if (code != null && code == SPOOL_FAILED) {
      throw new UploadSpoolException(code, msg);
    }
    throw new RemoteException(code, msg);
  }
}
