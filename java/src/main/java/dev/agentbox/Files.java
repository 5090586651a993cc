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
  /**
   * Exit code of the upload script for "extracting the archive would pass the workspace's size
   * limit" (stderr names the sizes and the limit): nothing was extracted and no spool is left.
   */
  public static final int TOO_LARGE = 94;
  /** Largest file a read returns by default. */
  public static final int READ_CAP = 64 << 20;
  /** argv[0] of the file scripts. */
  public static final String ARGV0 = "agentbox-files";

  // The in-pod scripts: Scripts.java, generated from the Rust crate's (cargo run --bin clientgen).
  static final String PROLOGUE = Scripts.PROLOGUE;
  static final String READ = Scripts.READ;
  static final String WRITE = Scripts.WRITE;
  static final String LIST = Scripts.LIST;
  static final String UPLOAD = Scripts.UPLOAD;
  static final String DOWNLOAD = Scripts.DOWNLOAD;
  static final String STAT = Scripts.STAT;
  static final String RM = Scripts.RM;
  static final String MKDIR = Scripts.MKDIR;
  static final String WRITE_MODE = Scripts.WRITE_MODE;

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
    if (code != null && code == TOO_LARGE) {
      throw new UploadTooLargeException(code, msg);
    }
    throw new RemoteException(code, msg);
  }
}
