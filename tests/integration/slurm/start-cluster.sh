#!/usr/bin/env bash
# Starts a private Slurm cluster on this machine: one munged, one slurmctld and one slurmd per
# virtual node (n1..nN, all on 127.0.0.1), everything under DIR. Prints nothing on success but
# the SLURM_CONF path; every daemon's pid lands in DIR/pids/ so stop-cluster.sh can stop exactly
# the daemons this script started. Recipe: shared/notes/slurm-local-cluster.md.
#
#   start-cluster.sh DIR [NODES] [PORT_BASE]
#
# Exit 0: cluster up and every node idle. Exit 3: this machine cannot run Slurm (missing
# packages or not root); the reason is on stderr. Anything else: a real failure.
set -euo pipefail
dir=$(realpath -m "${1:?usage: start-cluster.sh DIR [NODES] [PORT_BASE]}")
nodes=${2:-4}
fixed_port_base=${3:-}
cannot() { echo "start-cluster: cannot run slurm here: $*" >&2; exit 3; }
for tool in munged mungekey slurmctld slurmd sinfo srun sbatch scontrol; do
  command -v "$tool" >/dev/null 2>&1 || [ -x "/usr/sbin/$tool" ] || cannot "$tool is not installed (scripts/install-deps.sh installs slurm-wlm and munge)"
done
[ "$(id -u)" -eq 0 ] || cannot "the slurm daemons of this test run as root (SlurmUser=root); run as root"
PATH=$PATH:/usr/sbin

mkdir -p "$dir"/{pids,log,state,spool,munge,pmix}
chmod 700 "$dir/munge"
# munge: a private key, socket and daemon; slurm reaches it through AuthInfo=socket=.
if [ ! -f "$dir/munge/munge.key" ]; then
  mungekey --create --keyfile="$dir/munge/munge.key" >/dev/null
  chmod 400 "$dir/munge/munge.key"
fi
socket="$dir/munge/munge.socket"
munged --force --socket="$socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/pids/munged.pid" --log-file="$dir/log/munged.log" \
  --seed-file="$dir/munge/munged.seed"
for _ in $(seq 50); do [ -S "$socket" ] && break; sleep 0.1; done
munge --socket="$socket" -n | unmunge --socket="$socket" >/dev/null || {
  echo "start-cluster: munge does not work, see $dir/log/munged.log" >&2; exit 1; }

# Ports: below the kernel's ephemeral range (an outgoing connection can hold any port inside it:
# CI once lost a slurmd to "Address already in use" on 34458), none of them bound by any socket
# now, and on a bind failure all over again on other ports (a port can still be taken between the
# check and slurmd's bind). A PORT_BASE given on the command line is used as it is, once.
ephemeral_low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
port_high=$(( ephemeral_low < 40000 ? ephemeral_low - nodes - 2 : 40000 ))
[ "$port_high" -gt 11000 ] || port_high=32000
ports_free() {  # ports_free FIRST COUNT: no TCP socket in any state has one of them as its port
  command -v ss >/dev/null 2>&1 || return 0
  local used
  used=$(ss -Htan 2>/dev/null | awk '{n = split($4, a, ":"); print a[n]}')
  for p in $(seq "$1" $(($1 + $2 - 1))); do
    grep -qx "$p" <<< "$used" && return 1
  done
  return 0
}
pick_port_base() {
  local base
  for _ in $(seq 200); do
    base=$((10000 + RANDOM % (port_high - 10000)))
    ports_free "$base" $((nodes + 1)) && { echo "$base"; return 0; }
  done
  echo "start-cluster: found no $((nodes + 1)) free ports below $port_high" >&2
  return 1
}
stop_slurm_daemons() {  # the slurm daemons of this try, not munged
  for f in "$dir"/pids/slurmd.*.pid "$dir"/pids/slurmctld.pid; do
    [ -f "$f" ] || continue
    pid=$(tr -dc 0-9 < "$f")
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null
  done
  for _ in $(seq 100); do
    alive=0
    for f in "$dir"/pids/slurmd.*.pid "$dir"/pids/slurmctld.pid; do
      [ -f "$f" ] || continue
      pid=$(tr -dc 0-9 < "$f")
      [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && alive=1
    done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for f in "$dir"/pids/slurmd.*.pid "$dir"/pids/slurmctld.pid; do
    [ -f "$f" ] || continue
    pid=$(tr -dc 0-9 < "$f")
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    rm -f "$f"
  done
}

start_slurm() {  # start_slurm PORT_BASE: 0 when every node is idle
port_base=$1
ctld_port=$port_base
first_node_port=$((port_base + 1))
last_node_port=$((port_base + nodes))
cpus=$(nproc)
cat > "$dir/slurm.conf" <<CONF
ClusterName=crucible
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$first_node_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/pids/slurmctld.pid
SlurmdPidFile=$dir/pids/slurmd.%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.%n.log
SlurmctldDebug=info
SlurmdDebug=info
ReturnToService=2
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=300
KillWait=10
MessageTimeout=10
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=n[1-$nodes] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$first_node_port-$last_node_port CPUs=$cpus RealMemory=2000
PartitionName=debug Nodes=n[1-$nodes] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -c -f "$SLURM_CONF"
# One config folder per slurmd, so each node's PMIx plugin gets its own temporary folder.
for k in $(seq "$nodes"); do
  mkdir -p "$dir/conf-n$k" "$dir/pmix/n$k"
  cp "$dir/slurm.conf" "$dir/conf-n$k/slurm.conf"
  echo "PMIxCliTmpDirBase=$dir/pmix/n$k" > "$dir/conf-n$k/mpi.conf"
  SLURM_CONF="$dir/conf-n$k/slurm.conf" slurmd -N "n$k" -f "$dir/conf-n$k/slurm.conf"
done
# Ready when sinfo lists every node idle (bounded wait).
for _ in $(seq 120); do
  idle=$(sinfo -h -N -o '%N %T' 2>/dev/null | awk '$2=="idle"' | wc -l || true)
  [ "$idle" -eq "$nodes" ] && return 0
  sleep 0.25
done
return 1
}

for try in 1 2 3 4 5; do
  if [ -n "$fixed_port_base" ]; then base=$fixed_port_base; else base=$(pick_port_base); fi
  if start_slurm "$base"; then echo "$SLURM_CONF"; exit 0; fi
  bind_failed=0
  grep -qs "Address already in use" "$dir"/log/slurm*.log && bind_failed=1
  [ -z "$fixed_port_base" ] && [ $bind_failed -eq 1 ] && [ $try -lt 5 ] || break
  echo "start-cluster: a port of $base..$((base + nodes)) was taken, trying other ports" >&2
  stop_slurm_daemons
  mkdir -p "$dir/log/try$try"
  mv "$dir"/log/slurm*.log "$dir/log/try$try/" 2>/dev/null || true
  rm -rf "$dir/state"/* "$dir/spool"/*
done
echo "start-cluster: nodes not idle after 30 s:" >&2
sinfo -N 2>&1 >&2 || true
exit 1
