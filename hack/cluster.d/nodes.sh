# shellcheck shell=bash
# Nodes of the local cluster, sourced by hack/cluster.
#
# Node 1 (agentbox-node) is this host as it is: its containerd and kubelet run in the host's
# mount namespace and its workspace root is the host's /var/lib/agentbox/workspaces.
#
# Node i >= 2 (agentbox-node-i, `hack/cluster up --nodes N`) is a second real kubelet on the same
# machine with everything of its own: containerd (root, state, socket, config), CNI network and
# bridge (abx<i-1>, pod subnet 10.244.<i-1>.0/24), kubelet root dir, certificates, ports
# (12250+10(i-1) and 12248+10(i-1)), cgroup root (agentbox-i) and a node name mapped to
# 127.0.0.i in /etc/hosts. Its containerd and kubelet run in a mount namespace of their own
# (unshare --mount --propagation private) in which a node-only directory is bind-mounted over the
# workspace root (nosuid,nodev, 0700, like node 1's): hostPath volumes resolve in the runtime's
# mount namespace, so node i's pods see node i's workspaces and never node 1's, and node 1 (the
# host) never sees node i's. The same namespace gives node i private copies of the few fixed
# paths a kubelet or CNI writes outside its root (/var/lib/kubelet's device-plugins socket,
# /var/lib/cni's result cache, /var/log/containers), so two kubelets never clean up each other's.
# When the node's processes are gone the namespace and every mount in it go with them.
#
# Nodes i >= 2 register with the taint agentbox.dev/test-node=<name>:NoSchedule: only pods that
# tolerate it land there (the two-node tests), so other tests, which look at workspace
# directories on the host (node 1), never get a pod on a node whose workspaces they cannot see.
#
# State of node i: $STATE/nodes/agentbox-node-i/ (its disk, the workspaces, included);
# PIDs: $RUN/agentbox-node-i.{containerd,kubelet}.pid; logs: $LOGS/agentbox-node-i.*.log.

NODE_TAINT_KEY=agentbox.dev/test-node
MAX_NODES=9

use_node() { # index: sets the N_* variables describing node i
  local i=$1
  [[ $i =~ ^[1-9]$ ]] || die "node index must be 1..$MAX_NODES: $i"
  N_I=$i
  if ((i == 1)); then
    N_NAME=$NODE_NAME N_IP=127.0.0.1 N_DIR=$STATE N_CONF=$CONF N_PKI=$PKI N_RUN=$RUN
    N_SOCK=$CTRD_SOCK N_CTRD=$STATE/containerd N_KROOT=$KUBELET_ROOT N_CNI=$STATE/cni
    N_BRIDGE=$BRIDGE N_NET=$CNI_NETWORK N_SUBNET=$POD_SUBNET N_CGROUP=$CGROUP_ROOT
    N_PORT=$KUBELET_PORT N_HEALTHZ=$KUBELET_HEALTHZ_PORT N_PODLOGS=$LOGS/pods
    N_PROC="" N_DISK="" N_TAINTS=""
  else
    N_NAME=$NODE_NAME-$i N_IP=127.0.0.$i N_DIR=$STATE/nodes/$NODE_NAME-$i
    N_CONF=$N_DIR/config N_PKI=$N_DIR/pki N_RUN=$N_DIR/run N_SOCK=$N_DIR/run/containerd.sock
    N_CTRD=$N_DIR/containerd N_KROOT=$N_DIR/kubelet N_CNI=$N_DIR/cni
    N_BRIDGE=abx$((i - 1)) N_NET=$CNI_NETWORK-$i N_SUBNET=10.244.$((i - 1)).0/24
    N_CGROUP=$CGROUP_ROOT-$i N_PORT=$((KUBELET_PORT + 10 * (i - 1)))
    N_HEALTHZ=$((KUBELET_HEALTHZ_PORT + 10 * (i - 1))) N_PODLOGS=$LOGS/$N_NAME.pods
    N_PROC=$N_NAME. N_DISK=$N_DIR/disk
    N_TAINTS=$'\nregisterWithTaints:\n'"- {key: $NODE_TAINT_KEY, value: $N_NAME, effect: NoSchedule}"
  fi
}

node_index() { # name -> index
  local i
  for ((i = 1; i <= MAX_NODES; i++)); do
    use_node "$i"
    [[ $N_NAME == "$1" ]] && { echo "$i"; return 0; }
  done
  die "no such node: $1 (nodes are $NODE_NAME and $NODE_NAME-2 ... $NODE_NAME-$MAX_NODES)"
}

extra_node_indexes() { # indexes of the nodes >= 2 that have state
  local d
  for d in "$STATE"/nodes/"$NODE_NAME"-[2-9]; do
    [[ -d $d ]] && echo "${d##*-}"
  done
}

node_ctr() { ctr -n k8s.io --address "$N_SOCK" "$@"; }

node_ready_named() { # name [since]: Ready, and (with since, RFC 3339 UTC, microseconds) the node's
  # Lease renewed since then: a node stopped and started within the grace still shows Ready.
  [[ $(kc get node "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]] || return 1
  [[ -z ${2:-} ]] && return 0
  local renewed
  renewed=$(kc -n kube-node-lease get lease "$1" -o 'jsonpath={.spec.renewTime}' 2>/dev/null) || return 1
  [[ -n $renewed && ! $renewed < $2 ]]
}

# gVisor: the RuntimeClass gvisor, containerd CRI handler "runsc", in one of two flavours
# (gvisor_flavour; `hack/cluster status` says which is in use):
# - built: gVisor GVISOR_VERSION, built once per machine into GVISOR_DIR (cluster.d/build.sh),
#   on the systrap platform (no KVM here; ptrace, the old default, is slower) with directfs (the
#   Sentry opens the container's files itself from descriptors the gofer hands it, instead of
#   asking the gofer for every file operation; runsc's default, passed to be sure), and
#   --oci-seccomp: the pod's seccomp profile (RuntimeDefault for every sandbox) filters the
#   guest's system calls inside the Sentry (docs/security.md, "Seccomp under gVisor").
# - debian: Debian's runsc (gVisor 2022-12, ptrace platform), the fallback while the build is not
#   cached (or with AGENTBOX_GVISOR=debian); it has no --oci-seccomp of use here (not passed).
# Both run through containerd's own runc v2 shim, whose BinaryName is a wrapper adding runsc's
# flags (one wrapper and one runsc root per flavour, so that pods started before a switch keep
# theirs). gVisor's own shim (containerd-shim-runsc-v1, built from the same version) does not
# work with this containerd (Debian's 1.6.20), tried: it must lower its daemon's oom_score_adj
# (-999), which needs CAP_SYS_RESOURCE, which this machine's root lacks ("failed to set OOM
# Score on shim: permission denied"), and once that is let pass it answers containerd 2.x's
# bootstrap (JSON) where 1.6 expects a bare address ("dial unix {"version":2,...}"); 1.6 also
# ignores the handler's runtime_path (an absolute path in runtime_type works).
# The CRI plugin starts every container of a pod (the pause container first) through the
# handler's shim, and runsc reads the CRI annotations (io.kubernetes.cri.container-type /
# sandbox-id) and puts the pod's containers into one gVisor sandbox, which joins the pod's netns
# (set up by CNI). Found on this cluster (kernel 6.18) with Debian's runsc, and kept for the
# built one (the shim-facing behaviour is the same):
# - --network=host: with runsc's own netstack (the default, --network=sandbox) the pod never
#   starts: "cannot run with network enabled in root network namespace". runsc 2022-12 tells the
#   root netns by /proc/sys/net/core/rmem_default existing, which kernel 6.x shows in every
#   netns. host: the sandbox's sockets are host sockets, but in the pod's netns (its IP, its
#   bridge, its policies): pod-to-pod traffic works both ways. Newer gVisor fixes the check.
# - `runsc start` of a pod's second container spawns that container's gofer with start's
#   stdout/stderr; the runc shim reads those until EOF, so StartContainer hung as long as the
#   gofer lived. start's output goes to /dev/null (its errors are in the --log file the shim
#   reads anyway).
# - A pod's second container: runsc writes the sandbox's PID to the shim's --pid-file, and the shim
#   learns a container's exit by reaping that PID, so a stopped container never exited for it and
#   pods stayed Terminating for ever. The wrapper gives the shim a waiter's PID (`runsc wait`).
# - `runsc kill` of a pod sandbox already gone fails "sandbox is not running", which the shim
#   does not read as "already exited": StopPodSandbox failed for ever. It succeeds now.
# - Out of memory: the kernel kills the Sentry, in the pause container's memory cgroup under the
#   pod's (whose limit it hit); the shim watches the cgroup of the PID it is given for OOM
#   (memory.oom_control, cgroup v1) and tells containerd, whose CRI then records OOMKilled. The
#   waiter below was outside the pod's cgroups, so the kubelet recorded "Error". The wrapper moves
#   the waiter into the container's own memory cgroup (a v1 OOM notification reaches every
#   cgroup below the one out of memory) before the shim reads its PID; the runsc processes the
#   waiter runs leave that cgroup before they start, so that the pod is charged for a shell only.
#   (cgroup v2 is not handled: there the waiter stays where it was, and OOM is "Error".)
# - --net-raw: without it runsc removes CAP_NET_RAW from every container, so a Sandbox that the
#   operator's --allowed-capabilities lets add NET_RAW silently lacked it under gVisor (seen by
#   tests/security.rs in hack/test's gVisor matrix). Sandboxes drop NET_RAW by default, under
#   both runtimes; with the flag, gVisor gives a container exactly the capabilities its spec has.
# Neither (no build, no Debian runsc): no handler, nothing changes.
DEBIAN_RUNSC=/usr/bin/runsc
gvisor_flavour() { # built | debian | none
  if [[ ${AGENTBOX_GVISOR:-} != debian ]] && gvisor_built; then echo built
  elif [[ -x $DEBIAN_RUNSC ]]; then echo debian
  else echo none; fi
}
gvisor_describe() { # one line for hack/cluster status
  case $(gvisor_flavour) in
    built) echo "gVisor $GVISOR_VERSION built in $GVISOR_DIR, systrap, directfs, oci-seccomp, runc shim + wrapper" ;;
    debian) echo "Debian's runsc $(dpkg-query -W -f='${Version}' runsc 2>/dev/null), ptrace, runc shim + wrapper" ;;
  esac
}
runsc_wrapper() { # per flavour (debian keeps the name it always had)
  case $(gvisor_flavour) in
    built) echo "$N_CONF/gvisor-wrapper" ;;
    *) echo "$N_CONF/runsc-wrapper" ;;
  esac
}
runsc_root() {
  case $(gvisor_flavour) in
    built) echo "$N_RUN/gvisor" ;;
    *) echo "$N_RUN/runsc" ;;
  esac
}
write_runsc_wrapper() {
  local run
  # The shim adds --root/--log/--log-format; the flags before them are ours. --debug-log: runsc's
  # own per-command logs, where its refusals are explained.
  case $(gvisor_flavour) in
    built) run="$GVISOR_DIR/bin/runsc --platform=systrap --directfs --oci-seccomp" ;;
    debian) run="$DEBIAN_RUNSC --platform=ptrace" ;;
    *) return 0 ;;
  esac
  run+=" --network=host --net-raw --debug-log=$N_DIR/runsc-logs/"
  mkdir -p "$(runsc_root)" "$N_DIR/runsc-logs"
  cat >"$(runsc_wrapper).tmp" <<EOF
#!/bin/sh
RUNSC="$run"
EOF
  cat >>"$(runsc_wrapper).tmp" <<'EOF'
case " $* " in
*" start "*) exec $RUNSC "$@" >/dev/null 2>&1 ;;
*" create "*) ;;
*" kill "*)
  # A pod's sandbox whose gVisor sandbox is already gone: runsc says "sandbox is not running",
  # which the shim does not take for "already exited" (as it does runc's "container not
  # running"), so StopPodSandbox failed for ever. Killing what no longer (or never) ran succeeds.
  $RUNSC "$@" && exit 0
  rc=$? id=
  for a in "$@"; do case $a in [0-9a-f]*[0-9a-f]) [ ${#a} -ge 32 ] && id=$a ;; esac; done
  root=$(echo " $* " | sed -n 's/.* --root[= ]\([^ ]*\) .*/\1/p')
  st=$($RUNSC --root="$root" state "$id" 2>/dev/null | sed -n 's/.*status.: .\([a-z]*\).*/\1/p')
  case $st in running | paused) exit $rc ;; esac
  exit 0 ;;
*) exec $RUNSC "$@" ;;
esac
bundle=. pidfile= id= prev= root=
for a in "$@"; do
  case $prev in --bundle | -b) bundle=$a ;; --pid-file) pidfile=$a ;; --root) root=$a ;; esac
  case $a in --bundle=*) bundle=${a#*=} ;; --pid-file=*) pidfile=${a#*=} ;; --root=*) root=${a#*=} ;; esac
  prev=$a id=$a
done
$RUNSC "$@" || exit $?
[ -n "$pidfile" ] || exit 0
grep -q '"io.kubernetes.cri.container-type": *"container"' "$bundle/config.json" || exit 0
# A container joining a pod's sandbox: the PID runsc wrote is the sandbox's, alive until the
# whole pod goes. The shim reaps that PID to learn the container's exit, so it would wait
# forever (pods stuck Terminating). Hand it a waiter instead: a child of the shim (its
# subreaper once we exit) that exits with the container, with its exit code. It runs runsc
# through `out`, which first moves itself back to this wrapper's memory cgroup.
mem=$(sed -n 's/^[0-9]*:memory:\(.*\)/\1/p' /proc/self/cgroup)
setsid sh -c '
  runsc=$0 id=$1 mem=$2
  out() { sh -c "[ -z \"\$0\" ] || echo \$\$ >/sys/fs/cgroup/memory\$0/cgroup.procs; exec \"\$@\"" "$mem" $runsc "$@"; }
  while [ "$(out state "$id" 2>/dev/null | sed -n "s/.*status.: .\([a-z]*\).*/\1/p")" = created ]; do
    sleep 0.05
  done
  st=$(out wait "$id" 2>/dev/null | sed -n "s/.*exitStatus.: *\(-*[0-9]*\).*/\1/p")
  case $st in "" | -*) exit 137 ;; esac
  exit $((st > 255 ? st >> 8 : st))' "$RUNSC --root=$root" "$id" "$mem" </dev/null >/dev/null 2>&1 &
waiter=$!
# Into the container's memory cgroup (cgroup v1, cgroupfs paths) before the shim reads the PID.
cg=$(sed -n 's/.*"cgroupsPath": *"\([^"]*\)".*/\1/p' "$bundle/config.json")
if [ -n "$mem" ] && [ -n "$cg" ] && [ -d "/sys/fs/cgroup/memory$cg" ]; then
  echo "$waiter" >"/sys/fs/cgroup/memory$cg/cgroup.procs" || true
fi
printf %s "$waiter" >"$pidfile" # no newline: the shim parses it as is
EOF
  chmod 755 "$(runsc_wrapper).tmp"
  mv "$(runsc_wrapper).tmp" "$(runsc_wrapper)"
}
runsc_runtime_config() { # the containerd CRI runtime handler "runsc" (empty without gVisor)
  [[ $(gvisor_flavour) != none ]] || return 0
  cat <<EOF
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runsc.options]
  SystemdCgroup = false
  BinaryName = "$(runsc_wrapper)"
  Root = "$(runsc_root)"
EOF
}

write_node_configs() { # the CNI network, containerd and kubelet configuration of node N_I
  mkdir -p "$N_CNI/net.d" "$N_CNI/ipam"
  # Isolated bridge: no gateway, no masquerade, no routes. Pods reach nothing but each other.
  # (containerd's CRI adds the loopback network by itself, from /usr/lib/cni/loopback.)
  cat >"$N_CNI/net.d/10-agentbox.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$N_NET",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$N_BRIDGE",
      "isGateway": false,
      "isDefaultGateway": false,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$N_SUBNET"}]],
        "dataDir": "$N_CNI/ipam"
      }
    }
  ]
}
EOF

  local cni_bin=/usr/lib/cni
  [[ -x $cni_bin/bridge ]] || cni_bin=/opt/cni/bin
  local netns_opt=""
  if grep -q netns_mounts_under_state_dir /usr/bin/containerd 2>/dev/null; then
    netns_opt="netns_mounts_under_state_dir = true"
  fi
  mkdir -p "$N_CTRD/root" "$N_CTRD/state" "$N_CTRD/opt" "$N_RUN/runc"
  write_runsc_wrapper
  cat >"$N_CONF/containerd.toml" <<EOF
version = 2
root = "$N_CTRD/root"
state = "$N_CTRD/state"
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "$N_SOCK"

[ttrpc]
  address = "$N_RUN/containerd.ttrpc.sock"

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$N_CTRD/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  max_concurrent_downloads = 1
  $netns_opt

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
  discard_unpacked_layers = false

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "$(command -v runc || echo /usr/sbin/runc)"
  Root = "$N_RUN/runc"

$(runsc_runtime_config)

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "$cni_bin"
  conf_dir = "$N_CNI/net.d"
  max_conf_num = 1
EOF


  cat >"$N_CONF/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $N_IP
port: $N_PORT
readOnlyPort: 0
healthzBindAddress: $N_IP
healthzPort: $N_HEALTHZ
tlsCertFile: $N_PKI/kubelet-server.crt
tlsPrivateKeyFile: $N_PKI/kubelet-server.key
rotateCertificates: false
serverTLSBootstrap: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true, cacheTTL: 30s}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
  webhook: {cacheAuthorizedTTL: 30s, cacheUnauthorizedTTL: 5s}
containerRuntimeEndpoint: unix://$N_SOCK
cgroupDriver: cgroupfs
cgroupRoot: /$N_CGROUP
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
# Every pod's process ceiling on the node (pids.max of its pod cgroup): above agentbox's
# per-sandbox limit (1024 by default, set lower by its helper), so a pod of anything else, or a
# sandbox without a limit, cannot take every process id of the node (pid_max 32768 here).
podPidsLimit: ${AGENTBOX_POD_PIDS_LIMIT:-4096}
protectKernelDefaults: false
resolvConf: $CONF/resolv.conf
# No DNS server runs here. Without a clusterDNS the kubelet writes a MissingClusterDNS Warning
# Event on every sync of every ClusterFirst pod (a claim's adopting patch is one): an API write
# no real cluster makes, on the claim's path. Loopback in the pod's own network namespace has
# nothing listening, so lookups still fail at once.
clusterDNS: [127.0.0.1]
clusterDomain: cluster.local
podLogsDir: $N_PODLOGS
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 87600h
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
evictionPressureTransitionPeriod: 10s
serializeImagePulls: false
registerNode: true
nodeStatusUpdateFrequency: 10s
# The Node Lease is renewed every quarter of this (5 s), well inside the controller-manager's
# node grace (AGENTBOX_NODE_GRACE_SECONDS), so a busy machine does not flap a live node.
nodeLeaseDurationSeconds: 20$N_TAINTS
syncFrequency: 10s
fileCheckFrequency: 20s
shutdownGracePeriod: 0s
logging: {format: text}
EOF
}

# Run (as argv of bash -c) by a node >= 2's containerd launch, after unshare has made a private
# mount namespace: bind the node's own directories over the shared paths, then exec containerd.
# Its kubelet joins this namespace (nsenter), and so do the shims, runc and containers it starts.
# shellcheck disable=SC2016 # expanded by that bash, from its arguments
# The new namespace starts with private copies of the host's mounts: drop those of node 1 under
# the state dir (its pods' rootfs, volumes, netns), or this node would pin them until it stops.
NODE_NS_SETUP='set -e
root=$1 dir=$2 state=$3; shift 3
awk -v s="$state/" '"'"'index($5, s) == 1 {print $5}'"'"' /proc/self/mountinfo | sort -r |
  while IFS= read -r m; do umount -l "$(printf "%b" "$m")" 2>/dev/null || true; done
mount --bind "$dir/disk/workspaces" "$root"
mount -o remount,bind,nosuid,nodev "$root"
for p in /var/lib/kubelet /var/lib/cni /var/log/containers; do
  mount --bind "$dir/host$p" "$p"
done
exec "$@"'

ensure_node_dirs() { # directories of node N_I (>= 2) and the host paths its namespace binds over
  mkdir -p "$N_CONF" "$N_PKI" "$N_RUN" "$N_KROOT" "$N_CNI" "$N_PODLOGS" \
    "$N_DIR"/host/var/lib/{kubelet,cni} "$N_DIR/host/var/log/containers" \
    /var/lib/kubelet /var/lib/cni /var/log/containers "$NODE_ROOT"
  # The node's disk: root-only, like node 1's workspace root (see ensure_node_root).
  mkdir -p "$N_DISK/workspaces"
  chmod 0700 "$N_DISK" "$N_DISK/workspaces"
}

gen_node_pki() { # kubelet serving and client certificates of node N_I (>= 2), signed by the CA
  umask 077
  OUT_PKI=$N_PKI gen_cert kubelet-server "/CN=$N_NAME" serverAuth "DNS:$N_NAME,IP:$N_IP"
  OUT_PKI=$N_PKI gen_cert kubelet-client "/O=system:nodes/CN=system:node:$N_NAME" clientAuth
  umask 022
  chmod 644 "$N_PKI"/*.crt
  kubeconfig "$N_CONF/kubelet.kubeconfig" "system:node:$N_NAME" kubelet-client "$N_PKI"
}

start_containerd() { # node N_I's containerd, with its state as it is
  if ((N_I == 1)); then
    start_proc containerd /usr/bin/containerd --config "$CONF/containerd.toml"
  else
    LAUNCH=(unshare --mount --propagation private -- bash -c "$NODE_NS_SETUP" node-ns "$NODE_ROOT" "$N_DIR" "$STATE")
    start_proc "${N_PROC}containerd" /usr/bin/containerd --config "$N_CONF/containerd.toml"
    LAUNCH=()
  fi
}

start_kubelet() { # node N_I's kubelet (in its containerd's mount namespace for nodes >= 2)
  if ((N_I > 1)); then
    local ctrd
    ctrd=$(pid_of "${N_PROC}containerd") || die "containerd of $N_NAME is not running"
    LAUNCH=(nsenter "--mount=/proc/$ctrd/ns/mnt" --)
  fi
  start_proc "${N_PROC}kubelet" "$KBIN/kubelet" \
    --config "$N_CONF/kubelet.yaml" --kubeconfig "$N_CONF/kubelet.kubeconfig" \
    --root-dir "$N_KROOT" --hostname-override "$N_NAME" --v 1
  # shellcheck disable=SC2034 # read by start_proc
  LAUNCH=()
}

wait_containerd() {
  wait_comp "${N_PROC}containerd" "containerd socket of $N_NAME" 30 test -S "$N_SOCK"
  wait_comp "${N_PROC}containerd" "containerd of $N_NAME" 30 node_ctr version
}

start_node() { # containerd, images and kubelet of node N_I; waits until the Node is Ready
  if ((N_I == 1)); then
    ensure_node_root
    mkdir -p "$KUBELET_ROOT"
  else
    ensure_node_dirs
  fi
  ensure_cgroup_root "$N_CGROUP"
  ensure_hosts_entry "$N_IP" "$N_NAME"
  start_containerd
  wait_containerd
  import_images
  ensure_base_image_names
  # Ready as posted by this kubelet: after a quick stop/start the API still shows the old status.
  local since; since=$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ) # the Lease's renewTime format
  start_kubelet
  wait_comp "${N_PROC}kubelet" "node $N_NAME Ready" 90 node_ready_named "$N_NAME" "$since"
}

# A node lost at once: SIGKILL (by PID) its kubelet, its containerd, its pods' shims and every
# container process in its cgroup root; nothing is told, nothing is cleaned up. Its state stays
# for start_node; a node >= 2's mount namespace goes with its last process.
kill_node() {
  local pids=() p n
  for n in kubelet containerd; do
    if p=$(pid_of "$N_PROC$n"); then pids+=("$p"); fi
  done
  while IFS= read -r p; do pids+=("$p"); done < <(our_shim_pids "$N_SOCK")
  ((${#pids[@]})) && kill -KILL "${pids[@]}" 2>/dev/null
  kill_cgroup_procs "$N_CGROUP"
  local i left
  for ((i = 0; i < 100; i++)); do
    left=()
    for p in "${pids[@]}"; do running "$p" && left+=("$p"); done
    ((${#left[@]})) || break
    sleep 0.05
  done
  rm -f "$RUN/${N_PROC}kubelet.pid" "$RUN/${N_PROC}containerd.pid"
}

# Everything node N_I (>= 2) made on this machine: its processes, bridge, cgroups, stale shim
# sockets, its directory (state, disk and workspaces) and its /etc/hosts line. The API's Node
# object is not touched.
remove_node_local() {
  kill_node
  stop_netpol
  ip link show "$N_BRIDGE" >/dev/null 2>&1 && ip link del "$N_BRIDGE" 2>/dev/null || true
  local d
  for d in /sys/fs/cgroup/*/"$N_CGROUP"; do
    [[ -d $d ]] && find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
  drop_dead_shim_sockets
  rm -rf --one-file-system "$N_DIR" "$N_PODLOGS"
  rmdir "$STATE/nodes" 2>/dev/null || true
  # its /etc/hosts line (node 1's stays, as it always has), rewritten in place: /etc/hosts may
  # be a bind mount that a rename (sed -i) cannot replace
  local line="$N_IP $N_NAME # agentbox test cluster (hack/cluster)" hosts
  if grep -qxF "$line" /etc/hosts; then
    hosts=$(grep -vxF "$line" /etc/hosts)
    printf '%s\n' "$hosts" >/etc/hosts
  fi
}

# ---------------------------------------------------------------------- node commands ---
up_extra_nodes() { # count: nodes 2..count up (added to a running cluster; kept when up)
  local n=$1 i
  ((n > 1)) || return 0
  build_images # (cached) the pause and base image archives every node imports
  for ((i = 2; i <= n; i++)); do
    use_node "$i"
    if alive "${N_PROC}containerd" "${N_PROC}kubelet" && node_ready_named "$N_NAME"; then
      import_images
      ensure_base_image_names
      continue
    fi
    kill_node # leftovers of a node that died or half started
    if [[ ! -s $N_CONF/kubelet.kubeconfig || ! -s $N_CONF/kubelet.yaml ]]; then
      ensure_node_dirs
      gen_node_pki
      write_node_configs
    fi
    local t0=$SECONDS
    start_node
    log "node $N_NAME Ready in $((SECONDS - t0))s (taint $NODE_TAINT_KEY=$N_NAME:NoSchedule)"
  done
  use_node 1
}

cmd_stop_node() { # name
  pick_kubectl
  local i; i=$(node_index "${1:?usage: $0 stop-node NAME}")
  use_node "$i"
  kill_node
  log "node $N_NAME killed (kubelet, containerd, shims, containers: SIGKILL); the API marks it NotReady after the node grace"
}

cmd_start_node() { # name
  pick_kubectl
  local i; i=$(node_index "${1:?usage: $0 start-node NAME}")
  use_node "$i"
  [[ -s $N_CONF/kubelet.yaml ]] || die "node $N_NAME was never created (hack/cluster up --nodes $i)"
  if alive "${N_PROC}containerd" "${N_PROC}kubelet" && node_ready_named "$N_NAME"; then
    log "node $N_NAME already running and Ready"
    return 0
  fi
  kill_node # whatever half of it is left
  build_images # (cached) the archives start_node imports if the runtime lost them
  local t0=$SECONDS
  start_node
  log "node $N_NAME Ready again in $((SECONDS - t0))s"
}

cmd_remove_node() { # name: a node >= 2 and everything it made, its Node object included
  local i; i=$(node_index "${1:?usage: $0 remove-node NAME}")
  ((i > 1)) || die "$NODE_NAME is the cluster's own node: use hack/cluster down"
  use_node "$i"
  remove_node_local
  if [[ -f $ADMIN_KUBECONFIG ]]; then
    pick_kubectl
    kc delete node "$N_NAME" --ignore-not-found --wait=false >/dev/null || true
  fi
  log "node $N_NAME removed"
}

status_extra_nodes() { # prints the nodes >= 2 (a stopped one is a state, not a failure)
  local i n pid
  for i in $(extra_node_indexes); do
    use_node "$i"
    for n in containerd kubelet; do
      if pid=$(pid_of "$N_PROC$n"); then
        printf '%-28s running  pid %s\n' "$N_PROC$n" "$pid"
      else
        printf '%-28s DOWN (hack/cluster start-node %s)\n' "$N_PROC$n" "$N_NAME"
      fi
    done
    if [[ -f $ADMIN_KUBECONFIG ]] && node_ready_named "$N_NAME"; then
      printf '%-28s Ready\n' "node/$N_NAME"
    else
      printf '%-28s NOT READY\n' "node/$N_NAME"
    fi
  done
  use_node 1
}

# The node-loss timing the running control plane uses (its flags, else Kubernetes' defaults).
running_flag() { # component flag default
  local pid args=() i
  if pid=$(pid_of "$1"); then
    mapfile -d '' -t args 2>/dev/null <"/proc/$pid/cmdline" || true
    for ((i = 0; i < ${#args[@]}; i++)); do
      [[ ${args[i]} == "$2="* ]] && { echo "${args[i]#*=}"; return 0; }
      [[ ${args[i]} == "$2" && $((i + 1)) -lt ${#args[@]} ]] && { echo "${args[i + 1]}"; return 0; }
    done
  fi
  echo "$3"
}
duration_seconds() { # Go duration of whole seconds (20s, 1m0s) -> seconds
  local d=$1 s=0
  [[ $d =~ ^(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?$ ]] || { echo "$d"; return 0; }
  s=$((${BASH_REMATCH[2]:-0} * 3600 + ${BASH_REMATCH[4]:-0} * 60 + ${BASH_REMATCH[6]:-0}))
  echo "$s"
}
