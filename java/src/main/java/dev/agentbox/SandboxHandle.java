package dev.agentbox;

import io.fabric8.kubernetes.api.model.GenericKubernetesResource;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * A handle on one Sandbox: exec, sessions, files, lifecycle, snapshots and its scope's guard. Get
 * one from {@link Sandboxes}. Paths are relative to the workspace root (or absolute under it);
 * commands run in the workspace root unless their options say otherwise. The resource itself, as
 * the API server holds it, is {@link dev.agentbox.model.Sandbox} ({@link #resource()}); this
 * class was named {@code Sandbox} too until it took the name Rust's handle has.
 */
public final class SandboxHandle {
  private final Sandboxes sandboxes;
  private volatile GenericKubernetesResource obj;

  SandboxHandle(Sandboxes sandboxes, GenericKubernetesResource obj) {
    this.sandboxes = sandboxes;
    this.obj = obj;
  }

  private Kube kube() {
    return sandboxes.kube();
  }

  public String name() {
    return obj.getMetadata().getName();
  }

  public String namespace() {
    return sandboxes.namespace();
  }

  Map<String, Object> spec() {
    return Kube.obj(obj.getAdditionalProperties(), "spec");
  }

  /** The status as last read ({@code phase}, {@code conditions}, {@code podName}, ...). */
  public Map<String, Object> status() {
    return Kube.obj(obj.getAdditionalProperties(), "status");
  }

  /** The object as last read, typed. */
  public dev.agentbox.model.Sandbox resource() {
    return kube().call(() -> kube().client.getKubernetesSerialization()
        .convertValue(obj, dev.agentbox.model.Sandbox.class), "sandbox " + namespace() + "/" + name());
  }

  /** The isolation scope. */
  public Scope scope() {
    return Scope.fromMap(Kube.obj(spec(), "scope"));
  }

  /** The phase as last read, or null. */
  public String phase() {
    return Kube.str(status(), "phase");
  }

  String lifecycleMode() {
    return Kube.str(Kube.obj(spec(), "lifecycle"), "mode");
  }

  /** The sandbox's pod (from status, else the deterministic name). */
  public String podName() {
    String p = Kube.str(status(), "podName");
    return p != null ? p : Labels.podName(name());
  }

  /** The workspace root in the container. */
  public String workspaceRoot() {
    String r = Kube.str(Kube.obj(spec(), "workspace"), "root");
    return r != null ? r : "/workspace";
  }

  /** Reads the Sandbox again. */
  public SandboxHandle refresh() {
    GenericKubernetesResource o = kube().get(Kube.SANDBOXES, namespace(), name());
    if (o == null) {
      throw new NotFoundException("sandbox " + namespace() + "/" + name() + " not found");
    }
    obj = o;
    return this;
  }

  /** What a Sandbox's state means for a caller waiting for it (pure). */
  enum Readiness {
    READY, FAILED, SUSPENDED, WAITING
  }

  static boolean stalled(GenericKubernetesResource o) {
    Long generation = o.getMetadata().getGeneration();
    for (Object c : conditions(o)) {
      if ("Stalled".equals(Kube.str(c, "type")) && "True".equals(Kube.str(c, "status"))) {
        Long observed = Kube.num(c, "observedGeneration");
        return !(observed != null && generation != null && observed < generation);
      }
    }
    return false;
  }

  static List<Object> conditions(GenericKubernetesResource o) {
    Object c = Kube.obj(o.getAdditionalProperties(), "status").get("conditions");
    return c instanceof List<?> l ? Kube.cast(l) : List.of();
  }

  static Readiness readiness(GenericKubernetesResource o) {
    Map<String, Object> spec = Kube.obj(o.getAdditionalProperties(), "spec");
    // Suspended by the spec wins: a phase still Ready is about to change.
    if ("Suspended".equals(Kube.str(Kube.obj(spec, "lifecycle"), "mode"))) {
      return Readiness.SUSPENDED;
    }
    if (stalled(o)) {
      return Readiness.FAILED;
    }
    Map<String, Object> st = Kube.obj(o.getAdditionalProperties(), "status");
    Long observed = Kube.num(st, "observedGeneration");
    Long generation = o.getMetadata().getGeneration();
    if (observed != null && generation != null && observed < generation) {
      return Readiness.WAITING; // a status from before the latest spec change
    }
    String phase = Kube.str(st, "phase");
    if ("Ready".equals(phase)) {
      return Readiness.READY;
    }
    if ("Failed".equals(phase)) {
      return Readiness.FAILED;
    }
    return Readiness.WAITING;
  }

  /** Reason and message of the condition that explains why an object is not Ready. */
  static String[] failingCondition(GenericKubernetesResource o) {
    Object pick = null;
    for (Object c : conditions(o)) {
      if ("Ready".equals(Kube.str(c, "type")) && !"True".equals(Kube.str(c, "status"))) {
        pick = c;
        break;
      }
    }
    if (pick == null) {
      for (Object c : conditions(o)) {
        if ("False".equals(Kube.str(c, "status"))) {
          pick = c;
          break;
        }
      }
    }
    if (pick == null) {
      return new String[] {"", ""};
    }
    String r = Kube.str(pick, "reason");
    String m = Kube.str(pick, "message");
    return new String[] {r == null ? "" : r, m == null ? "" : m};
  }

  /**
   * Waits (on a watch) until the Sandbox is Ready. Raises at once {@link
   * SandboxFailedException} (with the failing condition's reason) when it fails or its start is
   * Stalled, {@link SandboxSuspendedException} when its spec suspends it, and {@link
   * SandboxNotReadyException} at the timeout.
   */
  public SandboxHandle waitReady(long timeoutMs) {
    GenericKubernetesResource o = kube().watchUntil(Kube.SANDBOXES, namespace(), name(), cur -> {
      if (cur == null) {
        throw new NotFoundException("sandbox " + namespace() + "/" + name() + " was deleted");
      }
      Readiness r = readiness(cur);
      if (r == Readiness.READY) {
        return true;
      }
      String[] rm = failingCondition(cur);
      String phase = Kube.str(Kube.obj(cur.getAdditionalProperties(), "status"), "phase");
      phase = phase == null ? "" : phase;
      if (r == Readiness.FAILED) {
        throw new SandboxFailedException(name(), phase, rm[0].isEmpty() ? "Failed" : rm[0], rm[1]);
      }
      if (r == Readiness.SUSPENDED) {
        throw new SandboxSuspendedException(name(), phase, "Suspended", "spec.lifecycle.mode is Suspended; resume it");
      }
      return false;
    }, timeoutMs);
    if (o == null) {
      refresh();
      String[] rm = failingCondition(obj);
      String phase = phase() == null ? "" : phase();
      throw new SandboxNotReadyException(name(), phase, rm[0],
          rm[1].isEmpty() ? "not Ready after " + timeoutMs + " ms" : rm[1]);
    }
    obj = o;
    return this;
  }

  /**
   * Waits until the sandbox serves commands in a live pod again — after its pod was deleted or
   * evicted, or the sandbox suspended (it is resumed): Ready, and its workspace initialised in
   * exactly the pod that now exists.
   */
  public SandboxHandle recover(long timeoutMs) {
    long deadline = System.nanoTime() + timeoutMs * 1_000_000;
    while (true) {
      refresh();
      if (readiness(obj) == Readiness.SUSPENDED) {
        resume();
      }
      GenericKubernetesResource pod = kube().get(Kube.PODS, namespace(), podName());
      if (serving(obj, pod)) {
        return this;
      }
      long left = (deadline - System.nanoTime()) / 1_000_000;
      if (left <= 0) {
        String[] rm = failingCondition(obj);
        throw new SandboxNotReadyException(name(), phase() == null ? "" : phase(), rm[0],
            rm[1].isEmpty() ? "not serving after " + timeoutMs + " ms" : rm[1]);
      }
      if (readiness(obj) == Readiness.READY) {
        try {
          Thread.sleep(Math.min(200, left));
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new AgentboxInterruptedException("interrupted while recovering sandbox " + name(), e);
        }
      } else {
        waitReady(left);
      }
    }
  }

  static boolean serving(GenericKubernetesResource o, GenericKubernetesResource pod) {
    if (readiness(o) != Readiness.READY || pod == null) {
      return false;
    }
    if (pod.getMetadata().getDeletionTimestamp() != null) {
      return false;
    }
    String uid = pod.getMetadata().getUid();
    Map<String, Object> ws = Kube.obj(Kube.obj(o.getAdditionalProperties(), "status"), "workspace");
    return uid != null && uid.equals(Kube.str(ws, "initializedPodUid"));
  }

  // ---- exec ----

  /**
   * Runs a command to completion under the lossless frame: its real exit code, stdout and
   * stderr (capped, with truncation flags). A timeout kills its process group in the pod and
   * raises {@link ExecTimeoutException}; a command killed for memory raises {@link
   * OutOfMemoryException}; output that arrived without its trailer raises {@link
   * OutputCutException}; output over {@link ExecOptions#maxOutput} is cut there and flagged
   * ({@link ExecResult#truncated()}). Interrupting the calling thread stops the command: it is
   * killed in the pod with every process it started, then {@link AgentboxInterruptedException}
   * is raised.
   */
  public ExecResult exec(ExecOptions o) {
    return Oom.explained(kube(), namespace(), podName(), () -> Exec.run(kube(), namespace(),
        podName(), Wire.SANDBOX_CONTAINER, o, o.workdir != null ? o.workdir : workspaceRoot()));
  }

  /** Runs a shell command line ({@code sh -c}). */
  public ExecResult exec(String shellCommand) {
    return exec(ExecOptions.shell(shellCommand));
  }

  /** A persistent shell (commands run in the workspace root unless told otherwise). */
  public Session session() {
    return session(workspaceRoot());
  }

  /** A persistent shell whose commands run in {@code workdir} unless told otherwise. */
  public Session session(String workdir) {
    kube().ensureOpen();
    return new Session(kube(), namespace(), podName(), workdir);
  }

  // ---- files ----

  private ExecResult runFile(Files.Request r, byte[] stdin, int maxOutput) {
    ExecOptions o = ExecOptions.argv(r.argv()).maxOutput(maxOutput);
    if (stdin != null) {
      o.stdin(stdin);
    }
    return Exec.run(kube(), namespace(), podName(), Wire.SANDBOX_CONTAINER, o);
  }

  /** A file's content; {@link FileTooLargeException} beyond {@code maxBytes}. */
  public byte[] read(String path, int maxBytes) {
    Files.Request r = Files.fileArgv(Files.READ, workspaceRoot(), path);
    ExecResult out = runFile(r, null, maxBytes);
    Files.check(r.confined(), out);
    if (out.stdoutTruncated()) {
      throw new FileTooLargeException(r.confined() + " is larger than " + maxBytes + " bytes");
    }
    return out.stdout();
  }

  public byte[] read(String path) {
    return read(path, Files.READ_CAP);
  }

  /** Writes a file atomically (temp file + rename), creating its parents. */
  public void write(String path, byte[] data) {
    Files.Request r = Files.fileArgv(Files.WRITE, workspaceRoot(), path);
    Files.check(r.confined(), runFile(r, data, 64 << 10));
  }

  /** Writes a file with a mode (like {@code 0755}). */
  public void write(String path, byte[] data, int mode) {
    if (mode < 0 || mode > 07777) {
      throw new InvalidRequestException("mode must be from 0 to 07777, not " + Integer.toOctalString(mode));
    }
    Files.Request r = Files.fileArgv(Files.WRITE_MODE, workspaceRoot(), path, Integer.toOctalString(mode));
    Files.check(r.confined(), runFile(r, data, 64 << 10));
  }

  /** The entries of a directory, sorted by name. */
  public List<Files.DirEntry> ls(String path) {
    Files.Request r = Files.fileArgv(Files.LIST, workspaceRoot(), path);
    ExecResult out = runFile(r, null, 64 << 20);
    Files.check(r.confined(), out);
    return Files.parseListing(out.stdout());
  }

  /** One entry (a symlink itself, not its target). */
  public Files.DirEntry stat(String path) {
    Files.Request r = Files.fileArgv(Files.STAT, workspaceRoot(), path);
    ExecResult out = runFile(r, null, 64 << 10);
    Files.check(r.confined(), out);
    List<Files.DirEntry> e = Files.parseListing(out.stdout());
    if (e.size() != 1) {
      throw new ProtocolException("stat " + r.confined() + ": " + out.stdoutText());
    }
    return e.get(0);
  }

  /** Whether the path exists (a dangling symlink does). */
  public boolean exists(String path) {
    try {
      stat(path);
      return true;
    } catch (RemoteFileNotFoundException e) {
      return false;
    }
  }

  /** Removes a file, symlink or empty directory; with {@code recursive}, a tree (never the root). */
  public void rm(String path, boolean recursive) {
    Files.Request r = Files.fileArgv(Files.RM, workspaceRoot(), path, recursive ? "r" : "");
    Files.check(r.confined(), runFile(r, null, 64 << 10));
  }

  /** Creates a directory (with its parents when {@code parents}). */
  public void mkdir(String path, boolean parents) {
    Files.Request r = Files.fileArgv(Files.MKDIR, workspaceRoot(), path, parents ? "p" : "");
    Files.check(r.confined(), runFile(r, null, 64 << 10));
  }

  /**
   * Extracts a tar stream into the workspace directory {@code remote} (created if missing,
   * existing files overwritten), streamed from {@code tar} until its end: the in-pod script
   * refuses a directory that resolves outside the workspace and symlinks already there that
   * lead out. Build the archive with any tar library or {@code tar -c}. In the pod the stream is
   * spooled to a file under the workspace's {@code .agentbox} state directory and extracted from
   * there, so the workspace's disk needs room for the archive beside its files while the upload
   * lasts; a spool that cannot be written (a full disk) is an {@link UploadSpoolException}, and
   * an upload that would pass the workspace's size limit an {@link UploadTooLargeException},
   * each with nothing extracted.
   */
  public void uploadTar(String remote, java.io.InputStream tar) {
    Files.Request r = Files.fileArgv(Files.UPLOAD, workspaceRoot(), remote);
    ExecOptions o = ExecOptions.argv(r.argv()).stdin(tar).maxOutput(64 << 10);
    Files.check(r.confined(), Exec.run(kube(), namespace(), podName(), Wire.SANDBOX_CONTAINER, o));
  }

  /**
   * Writes the workspace directory {@code remote} as a tar stream to {@code out}, streamed as
   * the pod produces it (nothing of it held in memory). Extract it with care: its members are
   * whatever the sandbox wrote.
   */
  public void downloadTar(String remote, java.io.OutputStream out) {
    Files.Request r = Files.fileArgv(Files.DOWNLOAD, workspaceRoot(), remote);
    ExecOptions o = ExecOptions.argv(r.argv()).stdoutTo(out).maxOutput(64 << 10);
    Files.check(r.confined(), Exec.run(kube(), namespace(), podName(), Wire.SANDBOX_CONTAINER, o));
  }

  // ---- lifecycle ----

  private void setMode(String mode) {
    obj = kube().mergePatch(Kube.SANDBOXES, namespace(), name(),
        "{\"spec\":{\"lifecycle\":{\"mode\":\"" + mode + "\"}}}");
  }

  /** Suspends the sandbox: its pod is deleted, its workspace kept on the node. */
  public void suspend() {
    setMode("Suspended");
  }

  /** Resumes a suspended sandbox (a new pod reuses the workspace); then {@link #waitReady}. */
  public void resume() {
    setMode("Running");
  }

  /**
   * Deletes the Sandbox (its pod and workspace go too; snapshots stay). With {@code wait},
   * returns once it is gone, or raises {@link SandboxNotDeletedException} after the timeout.
   */
  public void delete(boolean wait, long timeoutMs) {
    if (!kube().delete(Kube.SANDBOXES, namespace(), name())) {
      return;
    }
    if (wait) {
      GenericKubernetesResource left = kube().watchUntil(Kube.SANDBOXES, namespace(), name(),
          o -> o == null, timeoutMs);
      if (left != null || kube().get(Kube.SANDBOXES, namespace(), name()) != null) {
        throw new SandboxNotDeletedException(name(), timeoutMs);
      }
    }
  }

  // ---- snapshots ----

  /**
   * Asks the operator for a snapshot of the workspace (a new SandboxSnapshot, taken under the
   * scope's guard) and, with {@code wait}, waits until it is Ready.
   */
  public Snapshot snapshot(String name, boolean wait, long timeoutMs) {
    Map<String, Object> meta = new LinkedHashMap<>();
    meta.put("labels", new LinkedHashMap<>(Labels.scopeLabels(scope())));
    if (name != null) {
      meta.put("name", name);
    } else {
      meta.put("generateName", name() + "-");
    }
    Map<String, Object> spec = new LinkedHashMap<>();
    spec.put("sandboxRef", Map.of("name", name()));
    spec.put("deletionPolicy", "Delete");
    GenericKubernetesResource created = kube().create(Kube.SNAPSHOTS, namespace(),
        Kube.object(Kube.SNAPSHOTS, meta, "spec", spec));
    Snapshot s = Snapshot.from(created);
    return wait ? sandboxes.waitSnapshot(s.name(), timeoutMs) : s;
  }

  /** The scope's lineage, oldest first. */
  public List<Snapshot> snapshots() {
    return sandboxes.snapshots(scope());
  }

  /**
   * Replaces the workspace with a Ready snapshot's, the way the CRD restores (only a fresh
   * workspace is restored): the Sandbox is deleted and created again under the same name,
   * labels and spec with {@code snapshot.restore: Named}. Returns once created; then
   * {@link #waitReady}.
   */
  public SandboxHandle restore(String snapshot, long timeoutMs) {
    Snapshot snap = sandboxes.getSnapshot(snapshot);
    if (!snap.ready()) {
      throw new SnapshotFailedException(snapshot, snap.phase(), "NotReady", "only a Ready snapshot can be restored");
    }
    refresh();
    Map<String, Object> spec = new LinkedHashMap<>(spec());
    Map<String, Object> sn = new LinkedHashMap<>(Kube.obj(spec, "snapshot"));
    sn.put("restore", "Named");
    sn.put("name", snapshot);
    spec.put("snapshot", sn);
    Map<String, Object> meta = new LinkedHashMap<>();
    meta.put("name", name());
    meta.put("labels", obj.getMetadata().getLabels());
    meta.put("annotations", obj.getMetadata().getAnnotations());
    GenericKubernetesResource body = Kube.object(Kube.SANDBOXES, meta, "spec", spec);
    delete(true, timeoutMs);
    obj = kube().create(Kube.SANDBOXES, namespace(), body);
    return this;
  }

  /** The scope's execution guard ({@code waitMs} null: wait indefinitely); acquire it. */
  public Guard guard(Long waitMs) {
    kube().ensureOpen();
    return sandboxes.guard(scope(), waitMs, null);
  }

  /** The scope's execution guard with settings of its own. */
  public Guard guard(Long waitMs, GuardConfig config) {
    kube().ensureOpen();
    return sandboxes.guard(scope(), waitMs, config);
  }

  /** The harness state of this sandbox (no snapshot yet). */
  public SandboxState state() {
    return new SandboxState(IsolationKey.of(scope()), namespace(), name(), null);
  }
}
