# The progress and error lines of the hack/ scripts, in one format (sourced by them, not run):
#   step TEXT  a stage of a long command (run, test, bench, chaos): "==> [  12s] TEXT" on stdout
#   log TEXT   a detail, on stderr, after the script's name: "[cluster    3s] TEXT"
#   die TEXT   an error, on stderr, then exit 1
# Seconds count from the script's start (bash's SECONDS); the name is the script's file name
# unless HACK_NAME says otherwise.
HACK_NAME=${HACK_NAME:-$(basename "$0")}
step() { printf '\n==> [%4ds] %s\n' "$SECONDS" "$*"; }
log() { printf '[%s %4ds] %s\n' "$HACK_NAME" "$SECONDS" "$*" >&2; }
die() {
  printf '[%s] ERROR: %s\n' "$HACK_NAME" "$*" >&2
  exit 1
}
