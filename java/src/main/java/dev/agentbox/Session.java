package dev.agentbox;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * A persistent shell in a sandbox: one long-lived {@code sh} over one exec with stdin open, for
 * tool loops where a new exec per command costs too much. Each command is framed by sentinels
 * with a fresh mark ({@link SessionFrames}); state does not carry over between commands (use
 * workdir and env). A shell found dead before a command starts is replaced and the command sent
 * again (once); one that dies while a command runs fails it with {@link SessionException}.
 * Commands run one at a time (callers queue). Close it when done.
 *
 * <p>Every process a session's shell starts carries that shell's {@link Wire#PROCESS_ENV}: {@link
 * #close()} kills them all in the pod (a command running in another thread, and what commands
 * left in the background: a server that ignores the end of its input included), and so does a
 * shell given up (a command interrupted, its connection lost, no status after its timeout).
 */
public final class Session implements AutoCloseable {
  private final Kube kube;
  private final String namespace;
  private final String pod;
  private final String workdir;
  private final Object lock = new Object();
  private Exec.Conn shell;
  /** The {@link Wire#PROCESS_ENV} of the current shell (null: none started). */
  private volatile String runId;
  private volatile boolean closed;
  private byte[] outPending = new byte[0];
  private byte[] errPending = new byte[0];

  Session(Kube kube, String namespace, String pod, String workdir) {
    this.kube = kube;
    this.namespace = namespace;
    this.pod = pod;
    this.workdir = workdir;
  }

  /**
   * Runs one command in the shell (no stdin: use one-shot exec for that). A command killed for
   * memory raises {@link OutOfMemoryException}: the command alone, or (its shell gone with the
   * container, which the kubelet recorded {@code OOMKilled}) the whole container.
   */
  public ExecResult run(ExecOptions o) {
    return Oom.explained(kube, namespace, pod, () -> runFramed(o));
  }

  private ExecResult runFramed(ExecOptions o) {
    if (closed) {
      throw new ClientClosedException("the session is closed");
    }
    if (o.stdinBytes != null || o.stdinStream != null) {
      throw new InvalidRequestException("a session command takes no stdin; use SandboxHandle.exec");
    }
    // The shell already runs in the session's workdir: only a command's own is sent.
    List<String> argv = Wire.sessionArgv(o.argv, o.timeoutMs, o.workdir, o.env);
    String mark = Wire.newMark();
    String line = SessionFrames.commandLine(argv, mark);
    ExecResult r;
    synchronized (lock) {
      r = null;
      for (int attempt = 1; attempt <= 2 && r == null; attempt++) {
        try {
          r = once(line, mark, o);
        } catch (NotStarted e) {
          drop(null);
          if (attempt == 2) {
            throw new SessionException("the command did not start: " + e.getMessage());
          }
        } catch (RuntimeException e) {
          // The frames may be out of step now: this shell cannot be trusted, and what it runs
          // is killed (an interrupted command must end in the pod too).
          if (closed) {
            drop(null); // close() has killed them already
            throw new ClientClosedException("the session was closed while the command ran; it was"
                + " killed", e);
          }
          drop(e);
          throw e;
        }
      }
      if (closed) {
        // close() killed the command under us: its exit status is that kill's, not its own
        drop(null);
        throw new ClientClosedException("the session was closed while the command ran; it was killed");
      }
    }
    if (r.timedOut()) {
      throw new ExecTimeoutException("command timed out after " + o.timeoutMs + " ms", r);
    }
    return o.check ? r.check() : r;
  }

  /** Runs a shell command line. */
  public ExecResult run(String command) {
    return run(ExecOptions.shell(command));
  }

  private static final class NotStarted extends Exception {
    private static final long serialVersionUID = 1L;

    NotStarted(String m) {
      super(m);
    }
  }

  /**
   * Gives the shell up: its connection closed and, unless {@code cause} is null, every process
   * it started killed in the pod (what failed there is added to {@code cause}).
   */
  private void drop(RuntimeException cause) {
    Exec.Conn c = shell;
    String id = runId;
    shell = null;
    runId = null;
    outPending = new byte[0];
    errPending = new byte[0];
    if (c != null) {
      try {
        c.close();
      } catch (RuntimeException e) {
        // already gone
      }
      if (cause != null && id != null) {
        RuntimeException k = Exec.kill(kube, namespace, pod, id);
        if (k != null) {
          cause.addSuppressed(k);
        }
      }
    }
  }

  private ExecResult once(String line, String mark, ExecOptions o) throws NotStarted {
    if (shell == null) {
      shell = Exec.connect(
          kube, namespace, pod, Wire.SANDBOX_CONTAINER, Wire.sessionShellArgv(workdir));
      // The shell's first line marks everything it will start (Wire.PROCESS_ENV): close() finds
      // it all by that, also what was put in the background or left a process group.
      runId = Wire.newProcessId();
      line = "export " + Wire.PROCESS_ENV + "=" + runId + "\n" + line;
    }
    byte[] l = line.getBytes(StandardCharsets.UTF_8);
    try {
      shell.send(Wire.STDIN_CHANNEL, l, 0, l.length);
    } catch (RuntimeException e) {
      throw new NotStarted("writing the command: " + e.getMessage());
    }
    SessionFrames.Framer out = new SessionFrames.Framer(mark + "+\n", mark, o.maxOutput);
    SessionFrames.Framer err = new SessionFrames.Framer(null, mark, o.maxOutput);
    long start = System.nanoTime();
    Long giveUp = o.timeoutMs == null ? null : start + (o.timeoutMs + Wire.TIMEOUT_GRACE_MS) * 1_000_000;
    String code = null;
    boolean errDone = false;
    if (outPending.length > 0) {
      SessionFrames.Done d = out.feed(outPending);
      outPending = new byte[0];
      if (d != null) {
        code = d.trailer();
        outPending = d.rest();
      }
    }
    if (errPending.length > 0) {
      SessionFrames.Done d = err.feed(errPending);
      errPending = new byte[0];
      if (d != null) {
        errDone = true;
        errPending = d.rest();
      }
    }
    while (code == null || !errDone) {
      long wait = giveUp == null ? 60_000_000_000L : giveUp - System.nanoTime();
      if (wait <= 0) {
        throw new ExecTimeoutException("command timed out after " + o.timeoutMs + " ms and no exit status arrived", null);
      }
      Object ev;
      try {
        ev = shell.events.poll(wait, TimeUnit.NANOSECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new AgentboxInterruptedException("interrupted while a session command ran; the"
            + " session's shell and every process it started were killed", e);
      }
      if (ev == null) {
        continue;
      }
      byte[] data = Exec.payloadOf(ev);
      if (data == null) {
        died(out, err, workdir);
      }
      if (data.length < 1) {
        continue;
      }
      int ch = data[0] & 0xff;
      byte[] p = java.util.Arrays.copyOfRange(data, 1, data.length);
      if (ch == Wire.STDOUT_CHANNEL) {
        if (code == null) {
          SessionFrames.Done d = out.feed(p);
          if (d != null) {
            code = d.trailer();
            outPending = d.rest();
          }
        } else {
          outPending = concat(outPending, p);
        }
      } else if (ch == Wire.STDERR_CHANNEL) {
        if (!errDone) {
          SessionFrames.Done d = err.feed(p);
          if (d != null) {
            errDone = true;
            errPending = d.rest();
          }
        } else {
          errPending = concat(errPending, p);
        }
      } else if (ch == Wire.STATUS_CHANNEL) {
        died(out, err, workdir);
      }
    }
    Integer exit;
    String message = "";
    Wire.SessionEnd end = Wire.parseSessionEnd(code);
    if (end == null) {
      exit = null;
      message = "unparsable status '" + code + "'";
    } else if (end.memory()) {
      throw new OutOfMemoryException(false);
    } else {
      exit = end.code();
    }
    boolean timedOut = o.timeoutMs != null && System.nanoTime() - start >= o.timeoutMs * 1_000_000;
    return new ExecResult(exit, out.out().bytes(), err.out().bytes(), out.out().truncated(),
        err.out().truncated(), timedOut, message);
  }

  private static void died(SessionFrames.Framer out, SessionFrames.Framer err, String workdir)
      throws NotStarted {
    if (out.awaitingStart()) {
      // The directory named here: what the shell said on stderr may be cut by its exit.
      String why = "the shell exited" + (workdir == null ? "" : " (started in " + workdir + ")");
      String said = new String(err.out().bytes(), StandardCharsets.UTF_8).strip();
      throw new NotStarted(said.isEmpty() ? why : why + ": " + said);
    }
    throw new SessionException("the shell exited while a command ran; it may have run in part");
  }

  private static byte[] concat(byte[] a, byte[] b) {
    byte[] c = new byte[a.length + b.length];
    System.arraycopy(a, 0, c, 0, a.length);
    System.arraycopy(b, 0, c, a.length, b.length);
    return c;
  }

  /**
   * Ends the session: every process its shell started is killed in the pod (a command running
   * in another thread now, which then raises {@link ClientClosedException}, and whatever was
   * left in the background), then the shell ends. Later {@link #run} calls raise {@link
   * ClientClosedException}. Idempotent; never throws.
   */
  @Override
  public void close() {
    closed = true;
    // Not under the lock: a command running now holds it until it ends, and this ends it.
    String id = runId;
    if (id != null) {
      Exec.kill(kube, namespace, pod, id);
    }
    synchronized (lock) {
      if (shell != null) {
        try {
          shell.halfCloseStdin();
        } catch (RuntimeException e) {
          // gone already
        }
      }
      drop(null);
    }
  }
}
