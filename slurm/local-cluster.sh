#!/usr/bin/env bash
# A throw-away Slurm cluster on localhost, for flux-cluster's test-suite.
#
#   local-cluster.sh install   apt-get install the Slurm/munge/MariaDB packages (root)
#   local-cluster.sh start     start munged, mysqld, slurmdbd, slurmctld, N slurmd (idempotent)
#   local-cluster.sh stop      cancel all jobs, stop our daemons by PID file (idempotent);
#                              the state (munge key, database, job ids) is kept for a
#                              fast warm start (~2 s instead of ~9 s)
#   local-cluster.sh purge     stop, then delete the state directory
#   local-cluster.sh status    print sinfo; exit 0 if healthy, else 1
#   local-cluster.sh env       print "export SLURM_CONF=..." (eval it in your shell)
#
# Every daemon runs as root from a private state directory, so nothing in /etc, /run
# or /var is touched and the system munge/mariadb/slurm services are not needed.
# Nodes n1..nN are emulated on this host with one slurmd each (MULTIPLE_SLURMD).
#
# Environment:
#   FLUX_SLURM_DIR        state directory            (default /tmp/flux-cluster-slurm)
#   FLUX_SLURM_NODES      number of nodes            (default 2)
#   FLUX_SLURM_PORT_BASE  first TCP port             (default 17000; uses base..base+N,
#                                                     base+500 slurmdbd, base+501 mysqld)
#   FLUX_SLURM_TIMEOUT    seconds to wait per step   (default 60)
set -euo pipefail

PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
CLUSTER=fluxlocal
PARTITION=debug

STATE_DIR=${FLUX_SLURM_DIR:-/tmp/flux-cluster-slurm}
[[ $STATE_DIR == /* ]] || STATE_DIR=$PWD/$STATE_DIR
STATE_DIR=${STATE_DIR%/}
NODES=${FLUX_SLURM_NODES:-2}
PORT_BASE=${FLUX_SLURM_PORT_BASE:-17000}
TIMEOUT=${FLUX_SLURM_TIMEOUT:-60}
NODE_CPUS=2
NODE_MEM=4000 # MB; must stay below physical memory or the node drains

CTLD_PORT=$PORT_BASE
DBD_PORT=$((PORT_BASE + 500))
MYSQL_PORT=$((PORT_BASE + 501))

MUNGE_DIR=$STATE_DIR/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket.2
MYSQL_DIR=$STATE_DIR/mysql
MYSQL_SOCKET=$MYSQL_DIR/mysqld.sock
RUN_DIR=$STATE_DIR/run
LOG_DIR=$STATE_DIR/log
MARKER=$STATE_DIR/.flux-cluster-slurm # proves the directory is ours before purge

# Clients (sinfo, sacctmgr, ...) and slurmdbd (which has no -f option and looks for
# slurmdbd.conf next to $SLURM_CONF) need this.  FLUX_SLURM_OWNER is inherited by
# every daemon we start; stop uses it to recognise our processes (see ours()).
export SLURM_CONF=$STATE_DIR/slurm.conf
export FLUX_SLURM_OWNER=$STATE_DIR

HOST=$(hostname -s 2>/dev/null || uname -n)
HOST=${HOST%%.*}

# ---------------------------------------------------------------------------- helpers

say() { printf 'local-cluster: %s\n' "$*"; }
err() { printf 'local-cluster: error: %s\n' "$*" >&2; }

# die_log MESSAGE LOGFILE... : print the message and the tail of each log, then exit 1.
die_log() {
  local msg=$1 log
  shift
  err "$msg"
  for log in "$@"; do
    [[ -s $log ]] || continue
    printf -- '----- last lines of %s -----\n' "$log" >&2
    tail -n 25 "$log" >&2
  done
  exit 1
}

require_root() {
  if ((EUID != 0)); then
    err "'$1' must run as root (the daemons run as root with SlurmUser=root)"
    exit 1
  fi
}

# alive PID : true if the process exists and is not a zombie (PID 1 here may not reap).
alive() {
  local stat
  read -r stat 2>/dev/null <"/proc/$1/stat" || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# ours PID NAME... : true if PID is alive, its argv[0] is one of NAMEs (prefix match, as
# slurmstepd rewrites its title) and it belongs to this state dir: environment marker,
# an argument pointing into the state dir, or (slurmstepd, whose environment slurmd
# scrubs) a working directory inside it.  Guards against stale/reused PIDs.
ours() {
  local pid=$1 argv0 name
  shift
  [[ $pid =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  # (slurmstepd's rewritten title may lack the terminating NUL)
  IFS= read -r -d '' argv0 <"/proc/$pid/cmdline" 2>/dev/null || [[ -n ${argv0:-} ]] || return 1
  argv0=${argv0##*/}
  for name in "$@"; do
    if [[ $argv0 == "$name" || $argv0 == "$name:"* ]]; then
      grep -qzxF -- "FLUX_SLURM_OWNER=$STATE_DIR" "/proc/$pid/environ" 2>/dev/null ||
        grep -qzF -- "$STATE_DIR/" "/proc/$pid/cmdline" 2>/dev/null ||
        [[ $(readlink "/proc/$pid/cwd" 2>/dev/null) == "$STATE_DIR"/* ]]
      return
    fi
  done
  return 1
}

# daemon_pid KIND [NODE] : print the PID of our running daemon KIND, or fail.
daemon_pid() {
  local pidfile pid names
  case $1 in
    munged) pidfile=$MUNGE_DIR/munged.pid names=(munged) ;;
    mysqld) pidfile=$MYSQL_DIR/mysqld.pid names=(mysqld mariadbd) ;;
    slurmdbd) pidfile=$RUN_DIR/slurmdbd.pid names=(slurmdbd) ;;
    slurmctld) pidfile=$RUN_DIR/slurmctld.pid names=(slurmctld) ;;
    slurmd) pidfile=$RUN_DIR/slurmd-$2.pid names=(slurmd) ;;
  esac
  [[ -r $pidfile ]] || return 1
  pid=$(<"$pidfile") || return 1
  pid=${pid//[[:space:]]/}
  ours "$pid" "${names[@]}" || return 1
  echo "$pid"
}

# wait_for LABEL KIND NODE CHECK LOG... : poll the function CHECK until it succeeds.
# Fails early (after a grace period) if daemon KIND/NODE died, or after $TIMEOUT
# seconds; either way the tails of the LOGs are printed.  KIND "-" skips the
# liveness test.
wait_for() {
  local label=$1 kind=$2 node=$3 check=$4 start=$SECONDS
  shift 4
  until "$check" >/dev/null 2>&1; do
    if ((SECONDS - start >= TIMEOUT)); then
      die_log "$label not ready after ${TIMEOUT}s" "$@"
    fi
    if [[ $kind != - ]] && ((SECONDS - start >= 5)) && ! daemon_pid "$kind" "$node" >/dev/null; then
      die_log "$label exited during startup" "$@"
    fi
    sleep 0.2
  done
}

node_names() {
  local i
  for ((i = 1; i <= NODES; i++)); do echo "n$i"; done
}

# --------------------------------------------------------------------- configuration

write_slurm_conf() {
  local node i=0
  cat <<EOF
# Generated by local-cluster.sh -- regenerated on every start.
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# Private munge socket; cred_expire (default 120 s, minimum 5) is also how long a requeued job waits
# (+1 s), and a step must launch within it: 10 s, as 5 s could expire before a step launches on a loaded
# 2-core CI machine.
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10

StateSaveLocation=$STATE_DIR/ctld
SlurmdSpoolDir=$STATE_DIR/spool/%n
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info

# No cgroups: works in containers/VMs without a delegated cgroup tree.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default memory request a single job would allocate the whole node.
DefMemPerCPU=1000
# Trust the node lines below (more CPUs than the host has) instead of draining nodes.
SlurmdParameters=config_overrides
# Schedule immediately on submit; sched_interval=1 so that jobs that become eligible by
# time alone (a requeued job waits cred_expire) start within ~1 s, not after up to 60 s.
SchedulerParameters=kill_invalid_depend,batch_sched_delay=0,sched_min_interval=0,sched_interval=1
JobRequeue=1
ReturnToService=2
MinJobAge=300
KillWait=5
InactiveLimit=0
MaxArraySize=1001
MailProg=/bin/true

JobCompType=jobcomp/filetxt
JobCompLoc=$LOG_DIR/jobcomp.txt
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
# sacct/sacctmgr take the munge socket from here (else they try /run/munge).
AccountingStoragePass=$MUNGE_SOCKET

EOF
  while read -r node; do
    i=$((i + 1))
    echo "NodeName=$node NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((PORT_BASE + i)) CPUs=$NODE_CPUS RealMemory=$NODE_MEM State=UNKNOWN"
  done < <(node_names)
  echo "PartitionName=$PARTITION Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP"
}

write_slurmdbd_conf() {
  cat <<EOF
# Generated by local-cluster.sh -- regenerated on every start.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN_DIR/slurmdbd.pid
LogFile=$LOG_DIR/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
}

# install_conf FILE MODE GENERATOR : (re)write FILE; refuse to change it under running daemons.
install_conf() {
  local file=$1 mode=$2 tmp
  tmp=$(mktemp "$file.XXXXXX")
  "$3" >"$tmp"
  chmod "$mode" "$tmp"
  if [[ -e $file ]] && ! cmp -s "$tmp" "$file" && any_daemon_running; then
    rm -f "$tmp"
    err "$file would change (FLUX_SLURM_NODES / FLUX_SLURM_PORT_BASE?) while daemons run; run 'stop' first"
    exit 1
  fi
  mv -f "$tmp" "$file"
}

prepare_state_dir() {
  local node
  mkdir -p "$STATE_DIR" "$RUN_DIR" "$LOG_DIR" "$STATE_DIR/ctld" "$MYSQL_DIR"
  touch "$MARKER"
  # munged insists that its directories are not group/other writable; o+x lets
  # non-root clients reach the socket.
  mkdir -p "$MUNGE_DIR"
  chmod 0711 "$MUNGE_DIR"
  # Job scripts are executed from the spool dir: must be 755.
  while read -r node; do
    mkdir -p "$STATE_DIR/spool/$node"
    chmod 0755 "$STATE_DIR/spool/$node"
  done < <(node_names)
  install_conf "$SLURM_CONF" 0644 write_slurm_conf
  # slurmdbd refuses a slurmdbd.conf readable by others (it holds StoragePass).
  install_conf "$STATE_DIR/slurmdbd.conf" 0600 write_slurmdbd_conf
}

# -------------------------------------------------------------------------- daemons

munge_ok() { munge -n -S "$MUNGE_SOCKET" | unmunge -S "$MUNGE_SOCKET"; }

start_munged() {
  daemon_pid munged >/dev/null && return
  if [[ ! -s $MUNGE_DIR/munge.key ]]; then
    (umask 077 && head -c 1024 /dev/urandom >"$MUNGE_DIR/munge.key")
  fi
  chmod 0400 "$MUNGE_DIR/munge.key"
  # --force: take over a stale socket left behind by a killed munged.
  munged --force --num-threads=4 \
    --key-file="$MUNGE_DIR/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
    --seed-file="$MUNGE_DIR/munged.seed" \
    </dev/null >>"$MUNGE_DIR/munged.log" 2>&1 ||
    die_log "munged failed to start" "$MUNGE_DIR/munged.log"
  wait_for munged munged - munge_ok "$MUNGE_DIR/munged.log"
}

mysql_cli() {
  local cli
  cli=$(command -v mariadb || command -v mysql)
  "$cli" --no-defaults --user=root --socket="$MYSQL_SOCKET" "$@"
}

mysql_ok() { mysql_cli -e 'SELECT 1'; }

start_mysqld() {
  local install_db
  daemon_pid mysqld >/dev/null && return
  if [[ ! -d $MYSQL_DIR/data/mysql ]]; then
    rm -rf "$MYSQL_DIR/data"
    install_db=$(command -v mariadb-install-db || command -v mysql_install_db)
    # root@localhost authenticates over the socket as the Unix root user: no password.
    "$install_db" --no-defaults --user=root --datadir="$MYSQL_DIR/data" \
      --auth-root-authentication-method=socket --skip-test-db \
      </dev/null >>"$MYSQL_DIR/install-db.log" 2>&1 ||
      die_log "mariadb-install-db failed" "$MYSQL_DIR/install-db.log"
  fi
  rm -f "$MYSQL_SOCKET" "$MYSQL_SOCKET.lock"
  # mysqld does not daemonize itself: setsid -f detaches it from our session and stdio.
  # Durability is traded for speed; this database is disposable.
  setsid -f "$(command -v mysqld || command -v mariadbd)" --no-defaults --user=root \
    --datadir="$MYSQL_DIR/data" --socket="$MYSQL_SOCKET" \
    --pid-file="$MYSQL_DIR/mysqld.pid" --log-error="$MYSQL_DIR/mysqld.log" \
    --bind-address=127.0.0.1 --port="$MYSQL_PORT" --skip-name-resolve \
    --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
    --innodb-flush-log-at-trx-commit=0 \
    --innodb-doublewrite=0 --skip-log-bin \
    </dev/null >>"$MYSQL_DIR/mysqld.log" 2>&1
  wait_for mysqld - - mysql_ok "$MYSQL_DIR/mysqld.log"
  # slurmdbd connects over TCP from 127.0.0.1 (with skip-name-resolve the host is the IP).
  mysql_cli -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" ||
    die_log "could not create the slurm_acct_db database" "$MYSQL_DIR/mysqld.log"
}

dbd_ok() { sacctmgr -n -P list cluster format=cluster; }

start_slurmdbd() {
  daemon_pid slurmdbd >/dev/null && return
  # No -f option: slurmdbd reads slurmdbd.conf from the directory of $SLURM_CONF.
  slurmdbd </dev/null >>"$LOG_DIR/slurmdbd.log" 2>&1 ||
    die_log "slurmdbd failed to start" "$LOG_DIR/slurmdbd.log"
  wait_for slurmdbd slurmdbd - dbd_ok "$LOG_DIR/slurmdbd.log"
}

# The cluster must exist in accounting, otherwise slurmctld's jobs never reach sacct.
register_cluster() {
  local clusters
  clusters=$(sacctmgr -n -P list cluster format=cluster) ||
    die_log "sacctmgr cannot reach slurmdbd" "$LOG_DIR/slurmdbd.log"
  if ! grep -qx "$CLUSTER" <<<"$clusters"; then
    sacctmgr -i add cluster "$CLUSTER" >/dev/null ||
      die_log "sacctmgr add cluster $CLUSTER failed" "$LOG_DIR/slurmdbd.log"
  fi
}

ctld_ok() { [[ $(scontrol ping 2>/dev/null) == *UP* ]]; }

start_slurmctld() {
  daemon_pid slurmctld >/dev/null && return
  # -i: do not refuse to start over a state file from an unclean shutdown.
  slurmctld -i -f "$SLURM_CONF" </dev/null >>"$LOG_DIR/slurmctld.log" 2>&1 ||
    die_log "slurmctld failed to start" "$LOG_DIR/slurmctld.log"
  wait_for slurmctld slurmctld - ctld_ok "$LOG_DIR/slurmctld.log"
}

start_slurmds() {
  local node
  while read -r node; do
    daemon_pid slurmd "$node" >/dev/null && continue
    slurmd -f "$SLURM_CONF" -N "$node" </dev/null >>"$LOG_DIR/slurmd-$node.log" 2>&1 ||
      die_log "slurmd $node failed to start" "$LOG_DIR/slurmd-$node.log"
  done < <(node_names)
}

# All N nodes respond and are usable (idle, or busy with jobs).
nodes_ok() {
  local states
  states=$(sinfo -h -N -p "$PARTITION" -o '%t') || return 1
  (($(grep -cxE 'idle|alloc|mix|comp' <<<"$states") == NODES))
}

# slurmctld has registered with slurmdbd (ControlHost set) and sacct answers.
accounting_ok() {
  [[ -n $(sacctmgr -n -P show cluster "$CLUSTER" format=controlhost) ]] &&
    sacct -n -X -a -S now-1minutes >/dev/null
}

wait_nodes() {
  local -a logs=("$LOG_DIR/slurmctld.log")
  local node
  while read -r node; do logs+=("$LOG_DIR/slurmd-$node.log"); done < <(node_names)
  wait_for "nodes (sinfo)" - - nodes_ok "${logs[@]}"
}

any_daemon_running() {
  local kind node
  for kind in munged mysqld slurmdbd slurmctld; do
    daemon_pid "$kind" >/dev/null && return 0
  done
  for node in "$RUN_DIR"/slurmd-*.pid; do
    node=${node##*/slurmd-}
    daemon_pid slurmd "${node%.pid}" >/dev/null && return 0
  done
  return 1
}

all_daemons_running() {
  local kind node
  for kind in munged mysqld slurmdbd slurmctld; do
    daemon_pid "$kind" >/dev/null || return 1
  done
  while read -r node; do
    daemon_pid slurmd "$node" >/dev/null || return 1
  done < <(node_names)
}

healthy() { all_daemons_running && nodes_ok >/dev/null 2>&1; }

# ------------------------------------------------------------------------- stopping

# Our slurmstepd processes (identified by their working directory, see ours()).
stepd_pids() {
  local dir pid
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    ours "$pid" slurmstepd && echo "$pid"
  done
  return 0
}

# stop_pid LABEL PID NAME... : SIGTERM, wait, then SIGKILL.  Re-checks identity each time.
stop_pid() {
  local label=$1 pid=$2 i
  shift 2
  ours "$pid" "$@" || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do # 15 s; mysqld and slurmctld save state on SIGTERM
    ours "$pid" "$@" || return 0
    sleep 0.1
  done
  err "$label ($pid) ignored SIGTERM; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
}

stop_daemon() {
  local kind=$1 node=${2:-} pid
  local -a names=("$kind")
  [[ $kind == mysqld ]] && names+=(mariadbd)
  if pid=$(daemon_pid "$kind" "$node"); then
    stop_pid "$kind${node:+ $node}" "$pid" "${names[@]}"
  fi
}

# descendants PID : print all descendants of PID (the job processes under a slurmstepd).
descendants() {
  local dir stat pid ppid
  local -A children=()
  for dir in /proc/[0-9]*; do
    read -r stat 2>/dev/null <"$dir/stat" || continue
    pid=${dir#/proc/}
    stat=${stat##*) }   # fields after "(comm) ": state ppid ...
    ppid=${stat#* }
    ppid=${ppid%% *}
    children[$ppid]+=" $pid"
  done
  local -a todo=("$1")
  local child
  while ((${#todo[@]})); do
    pid=${todo[0]}
    todo=("${todo[@]:1}")
    for child in ${children[$pid]:-}; do
      echo "$child"
      todo+=("$child")
    done
  done
}

# Cancel every job and wait until the jobs and their slurmstepd processes are gone
# (slurmstepd survives slurmd, and would keep running the job's processes).  If a
# slurmstepd is stuck (e.g. its slurmd died), kill it and the job processes below it.
cancel_all_jobs() {
  local jobs start=$SECONDS pid child
  if daemon_pid slurmctld >/dev/null && ctld_ok; then
    jobs=$(squeue -h -o '%i' 2>/dev/null) || jobs=
    if [[ -n $jobs ]]; then
      # shellcheck disable=SC2086 # one job id per word
      scancel $jobs 2>/dev/null || true
      while [[ -n $(squeue -h -o '%i' 2>/dev/null) ]] && ((SECONDS - start < 20)); do
        sleep 0.2
      done
    fi
  fi
  while [[ -n $(stepd_pids) ]] && ((SECONDS - start < 25)); do
    sleep 0.2
  done
  for pid in $(stepd_pids); do
    err "killing leftover slurmstepd $pid and its job processes"
    for child in $(descendants "$pid"); do
      kill -KILL "$child" 2>/dev/null || true
    done
    stop_pid slurmstepd "$pid" slurmstepd
  done
}

# ---------------------------------------------------------------------- subcommands

cmd_install() {
  local pkg missing=()
  if ((EUID != 0)); then
    echo "local-cluster.sh install: must be run as root (e.g. sudo $0 install)" >&2
    exit 1
  fi
  for pkg in "${PACKAGES[@]}"; do
    [[ $(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null) == "install ok installed" ]] ||
      missing+=("$pkg")
  done
  if ((${#missing[@]} == 0)); then
    say "packages already installed"
    return
  fi
  export DEBIAN_FRONTEND=noninteractive
  local -a apt_install=(apt-get install -y -qq --no-install-recommends "${missing[@]}")
  # Only refresh the package lists when there are none or the install fails with them.
  if ! compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null || ! "${apt_install[@]}"; then
    apt-get update -qq
    "${apt_install[@]}"
  fi
  say "installed: ${missing[*]}"
}

# The daemons outlive this script: they must not inherit the caller's open files (the lock that
# `flock LOCKFILE CMD` holds for a test run would stay held for as long as they run).  255: bash's script.
close_inherited_fds() {
  local fd
  for fd in "/proc/$$/fd"/*; do
    fd=${fd##*/}
    if ((fd > 2 && fd != 255)); then
      eval "exec $fd>&-" 2>/dev/null || true
    fi
  done
}

cmd_start() {
  local t0 tool
  for tool in munged munge mysqld slurmdbd slurmctld slurmd sacctmgr sinfo; do
    command -v "$tool" >/dev/null || {
      err "$tool not found; run '$0 install' first"
      exit 1
    }
  done
  if healthy; then
    say "already running ($NODES nodes, SLURM_CONF=$SLURM_CONF)"
    return
  fi
  t0=$(date +%s%N)
  close_inherited_fds
  prepare_state_dir
  start_munged
  start_mysqld
  start_slurmdbd
  register_cluster
  start_slurmctld
  start_slurmds
  wait_nodes
  wait_for "accounting (sacct)" - - accounting_ok "$LOG_DIR/slurmdbd.log" "$LOG_DIR/slurmctld.log"
  say "started cluster '$CLUSTER' with $NODES nodes in $((($(date +%s%N) - t0) / 1000000)) ms"
  say "use it with: export SLURM_CONF=$SLURM_CONF"
}

cmd_stop() {
  local node
  [[ -d $STATE_DIR ]] || {
    say "not running (no $STATE_DIR)"
    return
  }
  cancel_all_jobs
  # slurmctld first, so it saves idle node state and flushes accounting to slurmdbd.
  stop_daemon slurmctld
  for node in "$RUN_DIR"/slurmd-*.pid; do
    [[ -e $node ]] || continue
    node=${node##*/slurmd-}
    stop_daemon slurmd "${node%.pid}"
  done
  stop_daemon slurmdbd
  stop_daemon mysqld
  stop_daemon munged
  say "stopped (state kept in $STATE_DIR; 'purge' deletes it)"
}

cmd_purge() {
  cmd_stop
  if [[ -e $MARKER ]]; then
    rm -rf -- "$STATE_DIR"
    say "removed $STATE_DIR"
  elif [[ -d $STATE_DIR ]]; then
    err "$STATE_DIR lacks $MARKER; not deleting it"
    exit 1
  fi
}

cmd_status() {
  local kind node
  for kind in munged mysqld slurmdbd slurmctld; do
    daemon_pid "$kind" >/dev/null || echo "$kind: not running"
  done
  while read -r node; do
    daemon_pid slurmd "$node" >/dev/null || echo "slurmd $node: not running"
  done < <(node_names)
  if all_daemons_running; then
    sinfo -N -p "$PARTITION" || true
  fi
  if healthy; then
    echo "running (SLURM_CONF=$SLURM_CONF)"
  else
    echo "not running or unhealthy"
    return 1
  fi
}

cmd_env() { echo "export SLURM_CONF=$SLURM_CONF"; }

# Serialise start/stop/purge (e.g. parallel test workers) by re-running this script under
# flock, with a lock file next to the state dir.  -o: the daemons must not inherit it.
with_lock() {
  [[ -z ${FLUX_SLURM_LOCKED:-} ]] || return 0
  mkdir -p "${STATE_DIR%/*}"
  FLUX_SLURM_LOCKED=1 exec flock -o -w $((TIMEOUT * 3)) "$STATE_DIR.lock" \
    bash "${BASH_SOURCE[0]}" "$@"
}

main() {
  case ${1:-} in
    install) cmd_install ;;
    start | stop | purge)
      require_root "$1"
      with_lock "$@"
      "cmd_$1"
      ;;
    status) cmd_status ;;
    env) cmd_env ;;
    *)
      echo "usage: $0 {install|start|stop|purge|status|env}" >&2
      exit 2
      ;;
  esac
}

main "$@"
