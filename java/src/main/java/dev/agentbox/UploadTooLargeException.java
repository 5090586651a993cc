package dev.agentbox;

/**
 * A directory upload would pass the workspace's size limit ({@code workspace.sizeLimit}; the
 * upload script's exit 94, the message has the pod's own words with the sizes and the limit):
 * refused before anything was extracted, and no spool is left.
 */
public class UploadTooLargeException extends RemoteException {
  private static final long serialVersionUID = 1L;

  public UploadTooLargeException(Integer exitCode, String stderr) {
    super(exitCode, "the upload would pass the workspace's size limit: " + stderr);
  }
}
