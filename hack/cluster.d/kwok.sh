# shellcheck shell=bash
# Simulated nodes (KWOK, sigs.k8s.io/kwok), sourced by hack/cluster (issue 44): `hack/cluster
# kwok up N` runs one kwok process against the cluster's API server and keeps N fake Nodes
# (agentbox-kwok-1 ... agentbox-kwok-N) Ready; the scheduler places pods on them and kwok reports
# those pods Running and Ready, but nothing runs: no kubelet, no runtime, no exec. What the
# operator does with thousands of pods and nodes can be measured (benches/scale.rs, kwok mode);
# workspaces, exec and the node's own costs cannot.
#
# Each fake Node is labelled KWOK_LABEL and tainted KWOK_LABEL:NoSchedule, so only pods that ask
# for it land there (the scale bench's sandboxes tolerate it; helper pods bound to a node by name
# are not scheduled and go there regardless). Addresses stay on loopback: every fake Node's
# InternalIP is 127.0.0.1 and its Hostname localhost (the API server prefers Hostname), its
# kubelet port one nothing listens on, so an exec or log request fails at once with "connection
# refused"; the pods' addresses come from KWOK_POD_CIDR, also loopback.
#
# State: the process as $RUN/kwok.pid (start_proc), its log $LOGS/kwok.log; the binary and the
# stages it plays (from the kwok module's own kustomize/stage files) in $CACHE/kwok/$KWOK_VERSION.

KWOK_VERSION=v0.8.0
KWOK_DIR=$CACHE/kwok/$KWOK_VERSION
KWOK_LABEL_KEY=agentbox.dev/simulated
KWOK_LABEL_VALUE=kwok
KWOK_NODE_PREFIX=agentbox-kwok-
KWOK_POD_CIDR=127.100.0.0/16
# The fake kubelet's port: nothing listens there (node 1's kubelet is on KUBELET_PORT).
KWOK_KUBELET_PORT=10250
# kwok's own server (metrics, health): on loopback (its default is every interface at 10250).
KWOK_SERVER_ADDRESS=127.0.0.1:10247
# Pods a fake node takes (the kubelet's default maxPods).
KWOK_MAX_PODS=110
KWOK_MAX_NODES=500

kwok_built() { [[ -x $KWOK_DIR/bin/kwok && -s $KWOK_DIR/bin/stages.yaml ]]; }

# The kwok binary and its stages, once per machine (cached by version; built in a temp dir and
# moved into place in one rename, like the other builds).
build_kwok() {
  kwok_built && return 0
  go_env
  log "building kwok $KWOK_VERSION from the Go module proxy (once per machine)"
  local t0=$SECONDS
  mkdir -p "$CACHE/kwok"
  local tmp; tmp=$(mktemp -d "$CACHE/kwok/.build-$KWOK_VERSION.XXXXXX")
  mkdir -p "$tmp/bin"
  local modjson moddir
  modjson=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION") ||
    { rm -rf "$tmp"; die "could not download sigs.k8s.io/kwok@$KWOK_VERSION"; }
  moddir=$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",*$/\1/p' <<<"$modjson")
  [[ -d $moddir ]] || { rm -rf "$tmp"; die "no module directory for sigs.k8s.io/kwok@$KWOK_VERSION"; }
  (cd "$tmp" && GOBIN="$tmp/bin" go install -trimpath -ldflags "-s -w" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >"$tmp/install.log" 2>&1) ||
    { cat "$tmp/install.log" >&2; rm -rf "$tmp"; die "kwok build failed"; }
  # The stages kwokctl gives a cluster: nodes initialised and kept alive by their Leases, pods
  # made Running and Ready (a Job's pods completed), deleted pods removed.
  local f
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    [[ -f $moddir/kustomize/stage/$f ]] || { rm -rf "$tmp"; die "kwok module has no kustomize/stage/$f"; }
    echo "---"
    cat "$moddir/kustomize/stage/$f"
  done >"$tmp/bin/stages.yaml"
  "$tmp/bin/kwok" --version 2>&1 | grep -q "${KWOK_VERSION#v}" ||
    { rm -rf "$tmp"; die "built kwok does not report $KWOK_VERSION"; }
  commit_dir "$tmp" "$KWOK_DIR"
  log "kwok $KWOK_VERSION built in $((SECONDS - t0))s"
}

kwok_selector() { echo "$KWOK_LABEL_KEY=$KWOK_LABEL_VALUE"; }

kwok_node() { # name: a fake Node's manifest (status too: a Node keeps the status it is created with)
  cat <<EOF
apiVersion: v1
kind: Node
metadata:
  name: $1
  labels:
    $KWOK_LABEL_KEY: $KWOK_LABEL_VALUE
    kubernetes.io/hostname: $1
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
  annotations:
    node.alpha.kubernetes.io/ttl: "0"
spec:
  taints:
  - {key: $KWOK_LABEL_KEY, value: $KWOK_LABEL_VALUE, effect: NoSchedule}
status:
  addresses:
  - {type: InternalIP, address: 127.0.0.1}
  - {type: Hostname, address: localhost}
  daemonEndpoints:
    kubeletEndpoint: {Port: $KWOK_KUBELET_PORT}
  allocatable: {cpu: "32", memory: 256Gi, pods: "$KWOK_MAX_PODS"}
  capacity: {cpu: "32", memory: 256Gi, pods: "$KWOK_MAX_PODS"}
EOF
}

kwok_nodes() { kc get nodes -l "$(kwok_selector)" -o name 2>/dev/null | sed 's#^node/##'; }

kwok_ready_count() {
  kc get nodes -l "$(kwok_selector)" \
    -o jsonpath='{range .items[*]}{range .status.conditions[?(@.type=="Ready")]}{.status}{"\n"}{end}{end}' 2>/dev/null |
    grep -c '^True$' || true
}

start_kwok() {
  pid_of kwok >/dev/null && return 0
  start_proc kwok "$KWOK_DIR/bin/kwok" --config "$KWOK_DIR/bin/stages.yaml" \
    --kubeconfig "$ADMIN_KUBECONFIG" --manage-nodes-with-label-selector "$(kwok_selector)" \
    --node-ip 127.0.0.1 --node-port "$KWOK_KUBELET_PORT" --cidr "$KWOK_POD_CIDR" \
    --node-lease-duration-seconds 40 --server-address "$KWOK_SERVER_ADDRESS"
  sleep 1
  pid_of kwok >/dev/null || die "kwok exited at start (log: $LOGS/kwok.log): $(tail -n 5 "$LOGS/kwok.log" 2>/dev/null)"
}

cmd_kwok_up() { # N
  local n=${1:-}
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= KWOK_MAX_NODES)) || die "usage: $0 kwok up N (1..$KWOK_MAX_NODES)"
  healthy || die "the cluster is not up (hack/cluster up)"
  kwok_built || die "kwok is not built (hack/cluster kwok build)"
  start_kwok
  local i name have manifests=""
  have=" $(kwok_nodes | tr '\n' ' ') "
  for ((i = 1; i <= n; i++)); do
    name=$KWOK_NODE_PREFIX$i
    [[ $have == *" $name "* ]] || manifests+=$(kwok_node "$name")$'\n---\n'
  done
  if [[ -n $manifests ]]; then
    kc create -f - >/dev/null <<<"$manifests" || die "creating the kwok nodes failed"
  fi
  # Fewer than before: the ones past N go.
  for name in $(kwok_nodes); do
    i=${name#"$KWOK_NODE_PREFIX"}
    [[ $i =~ ^[0-9]+$ ]] && ((i > n)) && kc delete node "$name" --wait=false >/dev/null
  done
  local t0=$SECONDS ready=0
  while ((SECONDS - t0 < 120)); do
    ready=$(kwok_ready_count)
    ((ready >= n)) && break
    pid_of kwok >/dev/null || die "kwok exited (log: $LOGS/kwok.log): $(tail -n 5 "$LOGS/kwok.log")"
    sleep 1
  done
  ((ready >= n)) || die "$ready of $n kwok nodes Ready after 120 s (log: $LOGS/kwok.log)"
  log "kwok: $n simulated node(s) Ready (${KWOK_NODE_PREFIX}1..$n, label and NoSchedule taint $(kwok_selector)), kwok pid $(pid_of kwok)"
}

# The fake Nodes deleted (the pods bound to them go with the pod garbage collector), then kwok
# stopped by its PID. Safe when nothing runs.
cmd_kwok_down() {
  local nodes
  nodes=$(kwok_nodes | tr '\n' ' ')
  if [[ -n ${nodes// /} ]]; then
    # shellcheck disable=SC2086 # one word per node
    kc delete node $nodes --wait=false >/dev/null || die "deleting the kwok nodes failed"
  fi
  stop_kwok
  log "kwok: nodes deleted, kwok stopped"
}

stop_kwok() { stop_components 10 kwok; }

cmd_kwok_status() {
  local pid
  if pid=$(pid_of kwok); then
    printf '%-28s running  pid %s, %s simulated node(s) Ready\n' kwok "$pid" "$(kwok_ready_count)"
  else
    printf '%-28s DOWN\n' kwok
    return 1
  fi
}

# The build holds a lock of its own, never the cluster's: `hack/cluster up` elsewhere must not
# wait for it.
kwok_build_locked() {
  mkdir -p "$CACHE/kwok"
  exec 8>>"$CACHE/kwok/.lock"
  flock -w 900 8 || die "another kwok build is running"
  build_kwok
  exec 8>&-
}

cmd_kwok() { # up N | down | status | build
  pick_kubectl
  use_node 1
  case ${1:-} in
    up) shift; kwok_build_locked; lock; cmd_kwok_up "$@" ;;
    down) lock; cmd_kwok_down ;;
    status) cmd_kwok_status ;;
    build) kwok_build_locked ;; # the binary alone (no cluster needed)
    *) die "usage: $0 kwok up N|down|status|build" ;;
  esac
}
