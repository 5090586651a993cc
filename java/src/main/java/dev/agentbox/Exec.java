package dev.agentbox;

import io.fabric8.kubernetes.client.http.HttpClient;
import io.fabric8.kubernetes.client.http.WebSocket;
import java.io.IOException;
import java.io.InputStream;
import java.net.URI;
import java.net.URLEncoder;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * One-shot exec over {@code pods/exec} (docs/protocol.md, "What the client does"): a WebSocket
 * of fabric8's HTTP client with subprotocol {@code v5.channel.k8s.io}, the command under the
 * wrapper, the trailers held back from the output, stdin half-closed once both trailers arrived,
 * and {@link OutputCutException} when a stream ended without its trailer.
 *
 * <p>Not fabric8's {@code ExecWatch}: in kubernetes-client 8.0.0 it offers only
 * {@code v4.channel.k8s.io}, which cannot half-close stdin, and the wrapper's linger needs that.
 */
final class Exec {
  private Exec() {}

  /** What the listener hands to the reading thread. */
  private sealed interface Event permits Msg, Closed, Failed {}

  private record Msg(byte[] data) implements Event {}

  private record Closed(int code, String reason) implements Event {}

  private record Failed(Throwable error) implements Event {}

  /** An open exec connection: its events in order. */
  static final class Conn implements AutoCloseable {
    final WebSocket ws;
    final LinkedBlockingQueue<Object> events;
    /** Whether stdin is half-closed: no stdin frame may follow the close. */
    private boolean stdinClosed;

    Conn(WebSocket ws, LinkedBlockingQueue<Object> events) {
      this.ws = ws;
      this.events = events;
    }

    synchronized void send(int channel, byte[] data, int off, int len) {
      if (channel == Wire.STDIN_CHANNEL && stdinClosed) {
        throw new TransportException("exec: stdin is closed (the command has ended)");
      }
      byte[] frame = new byte[len + 1];
      frame[0] = (byte) channel;
      System.arraycopy(data, off, frame, 1, len);
      if (!ws.send(ByteBuffer.wrap(frame))) {
        throw new TransportException("exec: the connection is closed");
      }
    }

    synchronized boolean stdinClosed() {
      return stdinClosed;
    }

    synchronized void halfCloseStdin() {
      if (stdinClosed) {
        return;
      }
      stdinClosed = true;
      ws.send(ByteBuffer.wrap(new byte[] {(byte) Wire.CLOSE_CHANNEL, (byte) Wire.STDIN_CHANNEL}));
    }

    /** Waits for outgoing frames to drain below a bound (flow control for large stdin). */
    void drain(long bound) {
      while (ws.queueSize() > bound) {
        try {
          Thread.sleep(2);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new AgentboxInterruptedException("exec: interrupted while sending stdin", e);
        }
      }
    }

    @Override
    public void close() {
      ws.sendClose(1000, "");
    }
  }

  /** A message's bytes (channel first), or null when the event ends the connection. */
  static byte[] payloadOf(Object ev) {
    return ev instanceof Msg m ? m.data() : null;
  }

  static URI execUri(Kube kube, String ns, String pod, String container, List<String> argv) {
    StringBuilder q = new StringBuilder();
    q.append("container=").append(enc(container)).append("&stdin=true&stdout=true&stderr=true");
    for (String a : argv) {
      q.append("&command=").append(enc(a));
    }
    String base = kube.client.getMasterUrl().toString();
    if (!base.endsWith("/")) {
      base += "/";
    }
    return URI.create(base + "api/v1/namespaces/" + enc(ns) + "/pods/" + enc(pod) + "/exec?" + q);
  }

  private static String enc(String s) {
    return URLEncoder.encode(s, StandardCharsets.UTF_8).replace("+", "%20");
  }

  /** Opens the exec WebSocket. */
  static Conn connect(Kube kube, String ns, String pod, String container, List<String> argv) {
    return connect(kube, ns, pod, container, argv, 60_000);
  }

  /** Opens the exec WebSocket, waiting at most {@code waitMs} for the upgrade. */
  static Conn connect(Kube kube, String ns, String pod, String container, List<String> argv,
      long waitMs) {
    kube.ensureOpen();
    try {
      return open(kube, ns, pod, container, argv, waitMs);
    } catch (RuntimeException e) {
      // fabric8's own (a client closed meanwhile: IllegalStateException) as this client's
      throw kube.map(e, "pod " + ns + "/" + pod + " (exec)");
    }
  }

  private static Conn open(Kube kube, String ns, String pod, String container, List<String> argv,
      long waitMs) {
    HttpClient http = kube.client.getHttpClient();
    LinkedBlockingQueue<Object> events = new LinkedBlockingQueue<>();
    WebSocket.Listener listener = new WebSocket.Listener() {
      @Override
      public void onOpen(WebSocket ws) {
        ws.request();
      }

      @Override
      public void onMessage(WebSocket ws, ByteBuffer bytes) {
        byte[] b = new byte[bytes.remaining()];
        bytes.get(b);
        events.add(new Msg(b));
        ws.request();
      }

      @Override
      public void onMessage(WebSocket ws, String text) {
        events.add(new Msg(text.getBytes(StandardCharsets.UTF_8)));
        ws.request();
      }

      @Override
      public void onClose(WebSocket ws, int code, String reason) {
        events.add(new Closed(code, reason));
      }

      @Override
      public void onError(WebSocket ws, Throwable error) {
        events.add(new Failed(error));
      }
    };
    CompletableFuture<WebSocket> f = http.newWebSocketBuilder()
        .subprotocol(Wire.PROTOCOL)
        .uri(execUri(kube, ns, pod, container, argv))
        .connectTimeout(30, TimeUnit.SECONDS)
        .buildAsync(listener);
    try {
      return new Conn(f.get(waitMs, TimeUnit.MILLISECONDS), events);
    } catch (ExecutionException e) {
      throw mapConnectError(e.getCause(), ns, pod);
    } catch (TimeoutException e) {
      f.cancel(true);
      throw new TransportException("pod " + ns + "/" + pod + " (exec): connect timed out", e);
    } catch (InterruptedException e) {
      f.cancel(true);
      Thread.currentThread().interrupt();
      throw new AgentboxInterruptedException("pod " + ns + "/" + pod + " (exec): interrupted", e);
    }
  }

  private static AgentboxException mapConnectError(Throwable t, String ns, String pod) {
    String what = "pod " + ns + "/" + pod + " (exec)";
    if (t instanceof io.fabric8.kubernetes.client.http.WebSocketHandshakeException h) {
      int code = h.getResponse() == null ? 0 : h.getResponse().code();
      String body = "";
      try {
        body = h.getResponse() == null ? "" : String.valueOf(h.getResponse().body());
      } catch (RuntimeException e) {
        body = "";
      }
      if (code == 404) {
        return new NotFoundException(what + ": not found " + body, t);
      }
      if (code == 0) {
        return new TransportException(what + ": " + t.getMessage(), t);
      }
      return new ApiException(code, "", what + ": HTTP " + code + " " + body, t);
    }
    return new TransportException(what + ": " + t, t);
  }

  /** Runs one command to completion under the wrapper. */
  static ExecResult run(Kube kube, String ns, String pod, String container, ExecOptions o) {
    return run(kube, ns, pod, container, o, o.workdir);
  }

  /**
   * The same in {@code workdir} (the options' own, or a default such as the workspace root).
   * A command given up before its exit status arrived (the thread interrupted, the stdout sink
   * failing, the connection lost, no status after the timeout), or past its timeout, is killed
   * in the pod with every process it started ({@link #kill}) before the exception reaches the
   * caller.
   */
  static ExecResult run(Kube kube, String ns, String pod, String container, ExecOptions o,
      String workdir) {
    return run(kube, ns, pod, container, o, workdir, Wire.newProcessId(), 60_000);
  }

  /** {@code runId} null: no {@link Wire#PROCESS_ENV} and no kill (the kill script itself). */
  private static ExecResult run(Kube kube, String ns, String pod, String container, ExecOptions o,
      String workdir, String runId, long connectWaitMs) {
    String mode = o.stdinStream != null ? Wire.STDIN_STREAM
        : Wire.stdinMode(o.stdinBytes == null ? null : o.stdinBytes.length);
    String mark = Wire.newMark();
    List<java.util.Map.Entry<String, String>> env = o.env;
    if (runId != null) {
      Wire.validate(o.argv, o.timeoutMs, o.env); // the caller's, before ours is added
      env = new java.util.ArrayList<>(o.env);
      env.add(java.util.Map.entry(Wire.PROCESS_ENV, runId)); // last: it wins over a caller's
    }
    List<String> argv = Wire.remoteArgv(mark, mode, o.argv, o.timeoutMs, workdir, env);
    Conn c = connect(kube, ns, pod, container, argv, connectWaitMs);
    Thread pump = null;
    Pumped pumped = new Pumped();
    boolean[] ended = {false};
    try {
      if (o.stdinBytes != null && o.stdinBytes.length > 0) {
        byte[] in = o.stdinBytes;
        for (int i = 0; i < in.length; i += Wire.STDIN_FRAME) {
          c.send(Wire.STDIN_CHANNEL, in, i, Math.min(Wire.STDIN_FRAME, in.length - i));
          c.drain(4L * Wire.STDIN_FRAME);
        }
      } else if (o.stdinStream != null) {
        pump = pump(c, o.stdinStream, pumped);
      }
      ExecResult r = collect(c, o, mode, mark, ended);
      pumped.check();
      return r;
    } catch (RuntimeException e) {
      // Given up before its status, or killed at its timeout (the wrapper's watchdog kills the
      // command's process group; this also reaches what left it: setsid, a daemon's fork).
      if (runId != null && (!ended[0] || e instanceof ExecTimeoutException)) {
        c.close();
        RuntimeException k = kill(kube, ns, pod, runId);
        if (k != null) {
          e.addSuppressed(k);
        }
      }
      pumped.addTo(e); // the command's stdin may have been cut too
      throw e;
    } finally {
      if (pump != null) {
        pump.interrupt();
      }
      c.close();
    }
  }

  /**
   * Kills every process of the run {@code runId} in the pod ({@link Wire#PROCESSES}), on a
   * connection of its own, even from an interrupted thread (its flag is set again after).
   * Returns what went wrong, or null: the caller reports it beside its own failure.
   */
  static RuntimeException kill(Kube kube, String ns, String pod, String runId) {
    boolean interrupted = Thread.interrupted();
    try {
      ExecOptions k = ExecOptions.argv("sh", "-c", Wire.PROCESSES, "sh", "kill", runId)
          .timeout(java.time.Duration.ofSeconds(20)).maxOutput(4096);
      // a short connect: an API server out of reach must not hold the caller's failure long
      ExecResult r = run(kube, ns, pod, Wire.SANDBOX_CONTAINER, k, null, null, 10_000);
      if (r.exitCode() == null || r.exitCode() != 0) {
        return new ExecException("killing the command's processes in pod " + ns + "/" + pod
            + " failed (exit " + r.exitCode() + "): " + r.stderrText().strip());
      }
      return null;
    } catch (RuntimeException e) {
      return new ExecException("killing the command's processes in pod " + ns + "/" + pod
          + " failed: " + e.getMessage(), e);
    } finally {
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }

  /** What the stdin pump read, and whether its source failed. */
  private static final class Pumped {
    volatile long bytes;
    volatile IOException failed;

    /** A source that failed cut the command's stdin short: never a result as if whole. */
    void check() {
      IOException e = failed;
      if (e != null) {
        throw new ExecException("the stdin stream failed after " + bytes + " bytes, so the command"
            + " read its end there (its result is not returned): " + e.getMessage(), e);
      }
    }

    void addTo(RuntimeException primary) {
      IOException e = failed;
      if (e != null) {
        primary.addSuppressed(e);
      }
    }
  }

  private static Thread pump(Conn c, InputStream in, Pumped pumped) {
    Thread t = new Thread(() -> {
      byte[] buf = new byte[Wire.STDIN_FRAME];
      try (in) {
        int n;
        while ((n = in.read(buf)) >= 0) {
          if (n > 0) {
            c.send(Wire.STDIN_CHANNEL, buf, 0, n);
            pumped.bytes += n;
            c.drain(4L * Wire.STDIN_FRAME);
          }
        }
      } catch (IOException e) {
        // The command sees its stdin end here; the caller is told once the status arrives.
        // (Once stdin is closed the command has ended: what it did not read is not missed.)
        if (!c.stdinClosed()) {
          pumped.failed = e;
        }
      } catch (RuntimeException e) {
        // The connection is gone or the command ended without reading all of it: the reader
        // sees the first, and the second is the command's own choice.
      }
      try {
        c.halfCloseStdin();
      } catch (RuntimeException e) {
        // the connection is gone: the reader sees it
      }
    }, "agentbox-exec-stdin");
    t.setDaemon(true);
    t.start();
    return t;
  }

  private static ExecResult collect(Conn c, ExecOptions o, String mode, String mark,
      boolean[] ended) {
    Wire.TrailerFilter outT = new Wire.TrailerFilter(mark);
    Wire.TrailerFilter errT = new Wire.TrailerFilter(mark);
    Wire.Capped out = new Wire.Capped(o.maxOutput);
    Wire.Capped err = new Wire.Capped(o.maxOutput);
    long start = System.nanoTime();
    Long deadline = o.timeoutMs == null ? null : start + o.timeoutMs * 1_000_000;
    Long giveUp = null;
    boolean closedStdin = false;
    while (true) {
      long now = System.nanoTime();
      if (deadline != null && giveUp == null && now >= deadline) {
        giveUp = now + Wire.TIMEOUT_GRACE_MS * 1_000_000;
      }
      if (giveUp != null && now >= giveUp) {
        throw new ExecTimeoutException(
            "command timed out after " + o.timeoutMs + " ms and no exit status arrived", null);
      }
      long waitNs = giveUp != null ? giveUp - now : deadline != null ? deadline - now : 60_000_000_000L;
      Object ev;
      try {
        ev = c.events.poll(Math.max(waitNs, 1), TimeUnit.NANOSECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new AgentboxInterruptedException("interrupted while the command ran; it was killed in"
            + " the pod with every process it started", e);
      }
      if (ev == null) {
        continue;
      }
      if (ev instanceof Failed f) {
        throw new TransportException("exec stream failed: " + f.error(), f.error());
      }
      if (ev instanceof Closed) {
        throw new TransportException("exec stream failed: connection closed without an exit status"
            + cutNote(outT, errT));
      }
      byte[] data = ((Msg) ev).data();
      if (data.length < 1) {
        continue;
      }
      int ch = data[0] & 0xff;
      byte[] payload = java.util.Arrays.copyOfRange(data, 1, data.length);
      if (ch == Wire.STDOUT_CHANNEL) {
        byte[] passed = outT.push(payload);
        if (o.stdoutSink != null) {
          try {
            o.stdoutSink.write(passed);
          } catch (java.io.IOException e) {
            throw new ExecException("writing the command's stdout: " + e.getMessage(), e);
          }
        } else {
          out.push(passed);
        }
      } else if (ch == Wire.STDERR_CHANNEL) {
        err.push(errT.push(payload));
      } else if (ch == Wire.STATUS_CHANNEL) {
        ended[0] = true; // the wrapper has exited: nothing of the command is left to kill
        Wire.ExitStatus st = Wire.parseStatus(payload);
        if (!outT.complete()) {
          throw new OutputCutException("stdout", outT.received());
        }
        if (!errT.complete()) {
          throw new OutputCutException("stderr", errT.received());
        }
        if (outT.memory() || errT.memory()) {
          throw new OutOfMemoryException(false);
        }
        // The client's deadline starts before the in-pod watchdog's, so a command the
        // watchdog killed is always seen as timed out here.
        boolean timedOut = giveUp != null
            || (o.timeoutMs != null && System.nanoTime() - start >= o.timeoutMs * 1_000_000);
        ExecResult r = new ExecResult(st.code(), out.bytes(), err.bytes(), out.truncated(),
            err.truncated(), timedOut, st.message());
        if (timedOut) {
          throw new ExecTimeoutException("command timed out after " + o.timeoutMs + " ms", r);
        }
        return o.check ? r.check() : r;
      }
      if (!closedStdin && outT.complete() && errT.complete()) {
        // Both streams are whole: the command has ended. Stdin is half-closed now, also a
        // stream's: the wrapper's linger ends, and what the command left unread, which the
        // wrapper reads and drops, stops coming.
        c.halfCloseStdin();
        closedStdin = true;
      }
    }
  }

  private static String cutNote(Wire.TrailerFilter o, Wire.TrailerFilter e) {
    return " (stdout " + (o.complete() ? "whole" : "cut after " + o.received() + " bytes")
        + ", stderr " + (e.complete() ? "whole" : "cut after " + e.received() + " bytes") + ")";
  }
}
