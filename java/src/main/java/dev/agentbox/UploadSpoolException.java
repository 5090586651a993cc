package dev.agentbox;

/**
 * A tar upload's archive could not be written to its spool in the pod, most often because the
 * workspace's disk is full (the upload script's exit 95; the message has the pod's own words):
 * nothing was extracted and no spool is left.
 */
public class UploadSpoolException extends RemoteException {
  private static final long serialVersionUID = 1L;

  public UploadSpoolException(Integer exitCode, String stderr) {
    super(
        exitCode,
        "the upload could not be spooled in the pod (is the workspace's disk full?): " + stderr);
  }
}
