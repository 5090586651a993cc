# shellcheck shell=bash
# The test cluster's NetworkPolicy engine: kube-router in firewall-only mode (no routing, no
# service proxy: its GoBGP server, which GHSA-v5mh-h5hx-7v92 is about, never starts), built
# from the Go module proxy ($KUBE_ROUTER_VERSION is the newest the proxy serves). Sourced by
# hack/cluster, not executed.
#
# Why kube-router: it enforces with the iptables filter table and ipset, both of which this
# kernel offers (xt matches through nft_compat, or legacy x_tables), and bridge netfilter
# (`net.bridge.bridge-nf-call-iptables=1`) sends the traffic between pods on one bridge through
# them. sigs.k8s.io/kube-network-policies (v0.7.0, v0.8.0 on the proxy) needs nf_tables'
# `queue` expression, which this kernel lacks (CONFIG_NFT_QUEUE unset).
#
# gVisor pods are covered the same way: the test cluster's runsc runs with --network=host
# inside the pod's network namespace (see cluster.d/nodes.sh), so their packets leave through
# the pod's veth onto the bridge like a runc pod's.
#
# One instance per node, each on the node's own backend: all nodes of this machine share one
# network namespace, and a kube-router instance owns the whole filter table it sees (it saves,
# rewrites and restores it, and removes the chains and ipsets of pods that are not its node's).
# Node 1's instance uses iptables-nft, node i >= 2's iptables-legacy (both are evaluated by the
# kernel; neither sees the other's rules). Only 2 nodes are covered so: the kernel has just
# these two backends. Their ipsets share one namespace: kube-router names a policy's sets from
# the policy (KUBE-SRC-*, KUBE-DST-* over hashes of namespace and name) and fills them with the
# matching pods of the whole cluster, so both instances write the same sets with the same
# members; a set one instance no longer needs while the other's rules still use it cannot be
# destroyed (the kernel refuses: in use), and the next sync removes it.
#
#   hack/cluster netpol start   start the engine of every node that runs (no-op where it runs)
#   hack/cluster netpol stop    stop every node's engine (by PID) and remove its rules and sets:
#                               no NetworkPolicy is enforced until it starts again
#   hack/cluster netpol status  PIDs of the engines
# `up` starts it, `down` stops it.

KUBE_ROUTER_VERSION=v2.1.0
KUBE_ROUTER_BIN=$CACHE/kube-router/$KUBE_ROUTER_VERSION/bin/kube-router

build_kube_router() {
  [[ -x $KUBE_ROUTER_BIN ]] && return 0
  go_env
  log "building kube-router $KUBE_ROUTER_VERSION from the Go module proxy (once per machine)"
  mkdir -p "$CACHE/kube-router"
  local tmp; tmp=$(mktemp -d "$CACHE/kube-router/.build-$KUBE_ROUTER_VERSION.XXXXXX")
  mkdir -p "$tmp/bin"
  (cd "$tmp" && GOBIN=$tmp/bin go install -trimpath -ldflags "-s -w" \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION") ||
    die "building kube-router failed"
  commit_dir "$tmp" "$CACHE/kube-router/$KUBE_ROUTER_VERSION"
}

netpol_name() { echo "${N_PROC}kube-router"; }
# Node 1: the default iptables (nft backend); node >= 2: iptables-legacy. A directory of
# symlinks put first on the engine's PATH picks the backend (kube-router runs `iptables`,
# `iptables-save`, `iptables-restore` and `ipset` by name).
netpol_bin_dir() { echo "$N_DIR/netpol-bin"; }
netpol_backend() { ((N_I == 1)) && echo nft || echo legacy; }

write_netpol_bin_dir() {
  local dir b; dir=$(netpol_bin_dir)
  mkdir -p "$dir"
  for b in iptables iptables-save iptables-restore; do
    ln -sfn "/usr/sbin/${b/iptables/iptables-$(netpol_backend)}" "$dir/$b"
  done
}

ensure_bridge_netfilter() {
  # Pods on one bridge talk at L2: only with these set does their traffic pass through
  # iptables (br_netfilter), where the engine's rules are.
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 net.bridge.bridge-nf-call-ip6tables=1 ||
    die "bridge netfilter is not available (modprobe br_netfilter)"
}

start_netpol() { # node N_I's engine (no-op when it runs)
  local name; name=$(netpol_name)
  pid_of "$name" >/dev/null && return 0
  ((N_I <= 2)) || { log "node $N_NAME: no NetworkPolicy engine (only 2 nodes have a backend each)"; return 0; }
  build_kube_router
  ensure_bridge_netfilter
  write_netpol_bin_dir
  local old_path=$PATH
  PATH="$(netpol_bin_dir):$PATH"
  start_proc "$name" "$KUBE_ROUTER_BIN" \
    --kubeconfig "$ADMIN_KUBECONFIG" --hostname-override "$N_NAME" \
    --run-firewall=true --run-router=false --run-service-proxy=false \
    --enable-cni=false --enable-ipv6=false --health-port 0 --metrics-port 0 \
    --service-cluster-ip-range "$SERVICE_SUBNET" --iptables-sync-period 1m --v 1
  PATH=$old_path
  wait_comp "$name" "NetworkPolicy engine of $N_NAME" 30 netpol_programmed
}

# The engine has put its jump into the FORWARD chain of its backend.
netpol_programmed() {
  "$(netpol_bin_dir)/iptables" -w -S FORWARD 2>/dev/null | grep -q 'KUBE-ROUTER-FORWARD'
}

stop_netpol() { # node N_I's engine, and then its rules and sets
  local name; name=$(netpol_name)
  stop_components 10 "$name"
  [[ -d $(netpol_bin_dir) && -x $KUBE_ROUTER_BIN ]] || return 0
  # kube-router's own cleanup of what its firewall made (rules, chains, ipsets), on this node's
  # backend only; its routing and proxy cleanups find nothing of theirs here.
  PATH="$(netpol_bin_dir):$PATH" "$KUBE_ROUTER_BIN" --cleanup-config >>"$LOGS/$name.log" 2>&1 || true
}

netpol_nodes() { # indexes of the nodes whose kubelet runs
  local i
  pid_of kubelet >/dev/null && echo 1
  for i in $(extra_node_indexes); do
    use_node "$i"
    pid_of "${N_PROC}kubelet" >/dev/null && echo "$i"
  done
}

cmd_netpol() { # start|stop|status
  [[ $EUID -eq 0 ]] || die "must run as root"
  pick_kubectl
  local i name pid
  case ${1:-} in
    start)
      for i in $(netpol_nodes); do use_node "$i"; start_netpol; done
      log "NetworkPolicy engine running on $(netpol_nodes | wc -l) node(s)"
      ;;
    stop)
      use_node 1; stop_netpol
      for i in $(extra_node_indexes); do use_node "$i"; stop_netpol; done
      log "NetworkPolicy engine stopped (no NetworkPolicy is enforced)"
      ;;
    status)
      for i in 1 $(extra_node_indexes); do
        use_node "$i"; name=$(netpol_name)
        if pid=$(pid_of "$name"); then printf '%-28s running  pid %s (%s)\n' "$name" "$pid" "$(netpol_backend)"
        else printf '%-28s DOWN\n' "$name"; fi
      done
      ;;
    *) die "usage: $0 netpol start|stop|status" ;;
  esac
}
