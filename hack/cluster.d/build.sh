# shellcheck shell=bash
# Build/caching helpers for hack/cluster. Sourced, not executed.
# Everything is cached by version under $CACHE (outside the work tree):
#   $CACHE/kubernetes/$K8S_VERSION/bin/{kube-apiserver,kube-controller-manager,kube-scheduler,kubelet}
#   $CACHE/etcd/$ETCD_VERSION/bin/etcd
#   $CACHE/helm/$HELM_VERSION/bin/helm   (+ symlink $CACHE/bin/helm)
# Builds go into a temp dir next to the destination and are moved into place with one rename,
# so a killed build never leaves a half-filled cache entry.

go_env() {
  if ! command -v go >/dev/null 2>&1; then
    if [[ -x /usr/local/go/bin/go ]]; then export PATH="$PATH:/usr/local/go/bin"
    else die "go toolchain not found (need Go >= 1.24; /usr/local/go/bin/go or on PATH)"; fi
  fi
  export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
}

# commit_dir TMPDIR DEST: atomically put TMPDIR/bin at DEST/bin
commit_dir() {
  local tmp=$1 dest=$2
  mkdir -p "$dest"
  rm -rf "$dest/bin.old"
  [[ -e $dest/bin ]] && mv "$dest/bin" "$dest/bin.old"
  mv -T "$tmp/bin" "$dest/bin"
  rm -rf "$dest/bin.old" "$tmp"
}

build_kubernetes() {
  local dest=$CACHE/kubernetes/$K8S_VERSION b ok=1
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    [[ -x $dest/bin/$b ]] || ok=0
  done
  ((ok)) && return 0
  go_env
  log "building kubernetes $K8S_VERSION from the Go module proxy (once per machine, ~5-6 min on 2 cores)"
  local t0=$SECONDS
  mkdir -p "$CACHE/kubernetes"
  local tmp; tmp=$(mktemp -d "$CACHE/kubernetes/.build-$K8S_VERSION.XXXXXX")
  local src=$tmp/src
  mkdir -p "$src" "$tmp/bin"
  local modjson gomod moddir
  modjson=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION")
  gomod=$(sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p' <<<"$modjson")
  moddir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p' <<<"$modjson")
  [[ -f $gomod && -d $moddir ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION"
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local staging
  staging=$(sed -n 's#^[[:space:]]*\(k8s.io/[^[:space:]]*\) => ./staging/src/.*#\1#p' "$gomod" | sort -u)
  [[ -n $staging ]] || die "no staging replaces found in $gomod"
  {
    echo "module agentbox.local/kubebuild"
    echo
    echo "go $(sed -n 's/^go \([0-9.]*\).*/\1/p' "$gomod")"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    local m; for m in $staging; do echo "	$m => $m v0.$minor.${K8S_VERSION##*.}"; done
    echo ")"
  } >"$src/go.mod"
  {
    echo "//go:build tools"
    echo
    echo "package tools"
    echo
    echo "import ("
    for b in kube-apiserver kubelet kube-controller-manager kube-scheduler; do
      echo "	_ \"k8s.io/kubernetes/cmd/$b/app\""
    done
    echo ")"
  } >"$src/tools.go"
  # main packages: the upstream main files verbatim (they only call app.NewXCommand()).
  local f
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    mkdir -p "$src/cmd/$b"
    case $b in
      kube-apiserver) f=apiserver.go ;;
      kube-controller-manager) f=controller-manager.go ;;
      kube-scheduler) f=scheduler.go ;;
      kubelet) f=kubelet.go ;;
    esac
    cp "$moddir/cmd/$b/$f" "$src/cmd/$b/main.go"
    chmod u+w "$src/cmd/$b/main.go"
  done
  local ld="-s -w" p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  (cd "$src" && GOFLAGS=-mod=mod go mod tidy >"$tmp/tidy.log" 2>&1) || { cat "$tmp/tidy.log" >&2; die "go mod tidy failed (see above)"; }
  (cd "$src" && go build -trimpath -ldflags "$ld" -o "$tmp/bin/" ./cmd/...) || die "kubernetes build failed"
  "$tmp/bin/kube-apiserver" --version | grep -q "$K8S_VERSION" || die "built kube-apiserver does not report $K8S_VERSION"
  commit_dir "$tmp" "$dest"
  log "kubernetes $K8S_VERSION built in $((SECONDS - t0))s"
}

build_etcd() {
  local dest=$CACHE/etcd/$ETCD_VERSION
  [[ -x $dest/bin/etcd ]] && return 0
  go_env
  log "building etcd $ETCD_VERSION from the Go module proxy (once per machine)"
  local t0=$SECONDS
  mkdir -p "$CACHE/etcd"
  local tmp; tmp=$(mktemp -d "$CACHE/etcd/.build-$ETCD_VERSION.XXXXXX")
  mkdir -p "$tmp/src" "$tmp/bin"
  cat >"$tmp/src/go.mod" <<GOMOD
module agentbox.local/etcdbuild

go 1.22

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
GOMOD
  cat >"$tmp/src/main.go" <<'GOMAIN'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GOMAIN
  local p=go.etcd.io/etcd/api/v3/version
  (cd "$tmp/src" && GOFLAGS=-mod=mod go mod tidy >"$tmp/tidy.log" 2>&1) || { cat "$tmp/tidy.log" >&2; die "etcd go mod tidy failed"; }
  (cd "$tmp/src" && go build -trimpath -ldflags "-s -w" -o "$tmp/bin/etcd" .) || die "etcd build failed"
  "$tmp/bin/etcd" --version | grep -q "${ETCD_VERSION#v}" || die "built etcd does not report $ETCD_VERSION"
  commit_dir "$tmp" "$dest"
  log "etcd $ETCD_VERSION built in $((SECONDS - t0))s"
}

build_helm() {
  local dest=$CACHE/helm/$HELM_VERSION
  if [[ ! -x $dest/bin/helm ]]; then
    go_env
    log "installing helm $HELM_VERSION from the Go module proxy (once per machine)"
    local t0=$SECONDS
    mkdir -p "$CACHE/helm"
    local tmp; tmp=$(mktemp -d "$CACHE/helm/.build-$HELM_VERSION.XXXXXX")
    mkdir -p "$tmp/bin"
    (cd "$tmp" && GOBIN="$tmp/bin" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >"$tmp/install.log" 2>&1) ||
      { cat "$tmp/install.log" >&2; die "helm install failed"; }
    commit_dir "$tmp" "$dest"
    log "helm $HELM_VERSION installed in $((SECONDS - t0))s"
  fi
  mkdir -p "$CACHE/bin"
  ln -sfn "$dest/bin/helm" "$CACHE/bin/helm.tmp" && mv -T "$CACHE/bin/helm.tmp" "$CACHE/bin/helm"
}

# gVisor (GVISOR_VERSION in hack/cluster): runsc from the Go module proxy, into $GVISOR_DIR/bin
# (gVisor's containerd shim does not work with this containerd: cluster.d/nodes.sh). Measured:
# 23 min 41 s of wall time at nice 19 on a 2-core machine busy with other builds and tests (load
# about 14), empty Go build cache, modules already downloaded; 175 s user + 21 s system CPU as
# `time -v` counts it, 676 MiB peak RSS. So `hack/cluster up` never waits for it: see
# gvisor_build_background.
gvisor_built() { [[ -x $GVISOR_DIR/bin/runsc ]]; }

build_gvisor() {
  gvisor_built && return 0
  go_env
  log "building gVisor $GVISOR_VERSION (runsc) from the Go module proxy (once per machine, ~25 min on 2 cores)"
  local t0=$SECONDS
  mkdir -p "$CACHE/gvisor"
  # A build stopped half-way (hack/cluster down) left its directory: this one holds the lock.
  rm -rf "$CACHE/gvisor/.build-$GVISOR_VERSION".*
  local tmp; tmp=$(mktemp -d "$CACHE/gvisor/.build-$GVISOR_VERSION.XXXXXX")
  mkdir -p "$tmp/bin"
  (cd "$tmp" && GOBIN="$tmp/bin" go install -trimpath \
    -ldflags "-s -w -X gvisor.dev/gvisor/runsc/version.version=$GVISOR_VERSION" \
    "gvisor.dev/gvisor/runsc@$GVISOR_VERSION" >"$tmp/install.log" 2>&1) ||
    { cat "$tmp/install.log" >&2; rm -rf "$tmp"; die "gVisor build failed"; }
  "$tmp/bin/runsc" --version | grep -q "$GVISOR_VERSION" || { rm -rf "$tmp"; die "built runsc does not report $GVISOR_VERSION"; }
  commit_dir "$tmp" "$GVISOR_DIR"
  log "gVisor $GVISOR_VERSION built in $((SECONDS - t0))s"
}

# The build in the background (AGENTBOX_GVISOR_BUILD=background, the default): detached from
# hack/cluster and from the lock, at nice 19 so that it takes only CPU the cluster and the tests
# leave idle, at most one at a time per machine (a lock file beside it). A cluster started while it
# runs uses Debian's runsc; the first `hack/cluster up` (or `hack/cluster gvisor`) after it has
# finished switches node 1 to the built one (a containerd restart, pods keep running), and a
# cluster started from scratch after it uses it from the start. AGENTBOX_GVISOR_BUILD=wait builds
# in the foreground before the cluster starts; =no never builds.
gvisor_build_background() {
  gvisor_built && return 0
  case ${AGENTBOX_GVISOR_BUILD:-background} in
    no) return 0 ;;
    wait) cmd_build_gvisor; return 0 ;;
    background) ;;
    *) die "AGENTBOX_GVISOR_BUILD: background, wait or no (not ${AGENTBOX_GVISOR_BUILD})" ;;
  esac
  mkdir -p "$CACHE/gvisor"
  # Already running (it holds the build's lock): leave it be.
  flock -n "$CACHE/gvisor/.lock" true || return 0
  local logf=$CACHE/gvisor/build-$GVISOR_VERSION.log
  log "gVisor $GVISOR_VERSION is not built: building it in the background (nice 19, log $logf); Debian's runsc until then"
  # Its own session (setsid execs in place: $! leads it), so that `hack/cluster down` stops the
  # build and everything go started by this PID's group; the next `up` starts it again, and go's
  # build cache keeps what was compiled.
  setsid nice -n 19 "$HERE/cluster" build-gvisor >>"$logf" 2>&1 </dev/null 9>&- &
  echo $! >"$CACHE/gvisor/.build.pid"
}

# Stops a background build this machine's `up` started (by its process group), if one runs.
gvisor_build_stop() {
  local pidf=$CACHE/gvisor/.build.pid pid
  pid=$(cat "$pidf" 2>/dev/null) || return 0
  rm -f "$pidf"
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  # Only the build's own session leader (its command line names build-gvisor), never a PID reused.
  grep -qa build-gvisor "/proc/$pid/cmdline" 2>/dev/null || return 0
  log "stopping the background gVisor build (process group $pid)"
  kill -TERM -- "-$pid" 2>/dev/null || true
}

cmd_build_gvisor() { # in the foreground, one build per machine at a time
  mkdir -p "$CACHE/gvisor"
  exec 8>>"$CACHE/gvisor/.lock"
  flock -w 7200 8 || die "another gVisor build is running"
  build_gvisor
  exec 8>&-
}
