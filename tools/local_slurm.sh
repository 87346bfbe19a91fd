#!/usr/bin/env bash
# A real 2-node SLURM cluster on this one machine, for tests and local sweeps (docs/SLURM.md).
#
#   tools/local_slurm.sh up [--accounting | --no-accounting]
#       install (apt-get, once) and start munge, slurmctld and two slurmd (node1, node2);
#       idempotent; waits until both nodes are up (idle, or running jobs if it was up already).
#       --accounting also runs MariaDB and slurmdbd so that sacct works; the choice is kept in
#       the state dir for later `up`s (MGBENCH_SLURM_ACCOUNTING=1 or 0 does the same).
#   tools/local_slurm.sh status   sinfo of the local cluster (exit 1 when it is not up)
#   tools/local_slurm.sh down     cancel its jobs, stop every daemon it started
#   tools/local_slurm.sh env      print `export SLURM_CONF=...` for the shell (eval "$(... env)")
#
# Everything lives in one state dir ($MGBENCH_SLURM_DIR, default /tmp/mgbench-slurm): slurm.conf,
# its own munge key and socket, pid files, logs, spool, saved controller state, the job
# completion log (jobcomp.txt) and, with accounting, the database. No systemd: daemons are
# started directly and leave pid files in the state dir. Ports (127.0.0.1): $MGBENCH_SLURM_PORT
# (slurmctld, default 16817), +1 and +2 node1's and node2's slurmd, +3 MariaDB, +4 slurmdbd.
# Needs root (SlurmUser=root) and, on first use, Debian's slurmctld, slurmd, slurm-client and
# munge packages (SLURM 22.05 on Debian 12); slurmdbd and mariadb-server for --accounting.
set -euo pipefail

STATE=${MGBENCH_SLURM_DIR:-/tmp/mgbench-slurm}
PORT=${MGBENCH_SLURM_PORT:-16817}
NODES=(node1 node2)
CONF=$STATE/slurm.conf
MUNGE_SOCKET=$STATE/munge/munge.socket.2
PACKAGES=(slurmctld slurmd slurm-client munge)
DB_PACKAGES=(slurmdbd mariadb-server)
DB_PORT=$((PORT + 3))
DBD_PORT=$((PORT + 4))
ACCOUNTING=0
export SLURM_CONF=$CONF

die() { echo "local_slurm: $*" >&2; exit 1; }
log() { echo "local_slurm: $*" >&2; }

pid_alive() {  # pid_alive FILE: the pid in FILE is a live process
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

install_packages() {  # install_packages PACKAGE...: those not installed yet, with apt-get
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    command -v apt-get >/dev/null || die "missing ${missing[*]} and no apt-get to install them"
    log "installing ${missing[*]} (apt-get) ..."
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >"$STATE/apt.log" 2>&1 \
        || { tail -5 "$STATE/apt.log" >&2; die "apt-get update failed"; }
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$STATE/apt.log" 2>&1 \
        || { tail -20 "$STATE/apt.log" >&2; die "apt-get install ${missing[*]} failed"; }
}

accounting_lines() {
    if ((ACCOUNTING)); then
        # AccountingStoragePass names the munge socket for slurmctld's connection to slurmdbd.
        printf '%s\n' "AccountingStorageType=accounting_storage/slurmdbd" \
            "AccountingStorageHost=127.0.0.1" "AccountingStoragePort=$DBD_PORT" \
            "AccountingStoragePass=$MUNGE_SOCKET"
    else
        echo "AccountingStorageType=accounting_storage/none"
    fi
}

write_config() {  # writes slurm.conf; fails (1) when it was already as it should be
    local host cpus=2 mem=2000
    host=$(hostname -s)
    mkdir -p "$STATE"/{munge,log,ctld,spool,run}
    chmod 0755 "$STATE" "$STATE/munge"
    if [[ ! -s $STATE/munge/munge.key ]]; then
        dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
    fi
    chmod 0400 "$STATE/munge/munge.key"
    cat >"$CONF.new" <<EOF
# Written by tools/local_slurm.sh: a 2-node cluster on one machine ($host).
ClusterName=mgbench
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups here: processes are tracked through /proc, tasks are not confined.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
ReturnToService=2
SlurmdParameters=config_overrides
# Fast turnaround for tests: kill 5 s after SIGTERM, no grace past the time limit.
KillWait=5
OverTimeLimit=0
InactiveLimit=0
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=60
# Job states: scontrol show job (for MinJobAge seconds), the job completion log, and sacct
# only with slurmdbd (up --accounting): SLURM has no file-based accounting storage any more.
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
$(accounting_lines)
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.txt
NodeName=${NODES[0]} NodeAddr=127.0.0.1 Port=$((PORT + 1)) CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=${NODES[1]} NodeAddr=127.0.0.1 Port=$((PORT + 2)) CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=${NODES[0]},${NODES[1]} Default=YES MaxTime=INFINITE State=UP
EOF
    # Plain `sinfo`/`sbatch` (no SLURM_CONF) find this cluster too, unless the machine has its
    # own slurm.conf: then only SLURM_CONF does.
    if [[ -d /etc/slurm && -w /etc/slurm ]] \
        && { [[ ! -e /etc/slurm/slurm.conf ]] || [[ $(readlink /etc/slurm/slurm.conf) == "$CONF" ]]; }; then
        ln -sfn "$CONF" /etc/slurm/slurm.conf
    fi
    name_nodes
    if cmp -s "$CONF.new" "$CONF"; then
        rm -f "$CONF.new"
        return 1
    fi
    mv "$CONF.new" "$CONF"
}

HOSTS_TAG="# mgbench local slurm"

name_nodes() {
    # The node names resolve (to 127.0.0.1, their NodeAddr), as a cluster's hostnames do: the
    # frameworks' own SLURM support (jax.distributed, TF's SlurmClusterResolver, torchrun's
    # rendezvous) reaches the first node by the name SLURM gives it.
    local missing=() n
    for n in "${NODES[@]}"; do getent hosts "$n" >/dev/null || missing+=("$n"); done
    ((${#missing[@]})) || return 0
    [[ -w /etc/hosts ]] || { log "cannot name ${missing[*]} in /etc/hosts (not writable)"; return 0; }
    echo "127.0.0.1 ${missing[*]} $HOSTS_TAG" >>/etc/hosts
}

unname_nodes() {
    if grep -q "$HOSTS_TAG" /etc/hosts 2>/dev/null && [[ -w /etc/hosts ]]; then
        # /etc/hosts may be a bind mount: rewrite it in place, never replace the file
        local kept
        kept=$(grep -v "$HOSTS_TAG" /etc/hosts)
        printf '%s\n' "$kept" >/etc/hosts
    fi
}

start_munge() {
    pid_alive "$STATE/run/munged.pid" && return 0
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    munged --key-file="$STATE/munge/munge.key" --socket="$MUNGE_SOCKET" \
        --pid-file="$STATE/run/munged.pid" --log-file="$STATE/log/munged.log" \
        --seed-file="$STATE/munge/munged.seed" --force \
        || die "munged did not start: $(tail -n 3 "$STATE/log/munged.log" 2>/dev/null)"
}

mariadb_client() {
    mariadb --no-defaults --socket="$STATE/run/mariadb.sock" -u root "$@"
}

start_mariadb() {
    local i
    pid_alive "$STATE/run/mariadb.pid" && return 0
    if [[ ! -d $STATE/mariadb/mysql ]]; then
        mariadb-install-db --no-defaults --user=root --datadir="$STATE/mariadb" \
            --auth-root-authentication-method=socket --skip-test-db \
            >"$STATE/log/mariadb-install.log" 2>&1 \
            || die "mariadb-install-db failed: $(tail -n 5 "$STATE/log/mariadb-install.log")"
    fi
    setsid mariadbd --no-defaults --user=root --datadir="$STATE/mariadb" \
        --socket="$STATE/run/mariadb.sock" --port="$DB_PORT" --bind-address=127.0.0.1 \
        --pid-file="$STATE/run/mariadb.pid" --log-error="$STATE/log/mariadb.log" \
        --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
        </dev/null >/dev/null 2>&1 &
    for ((i = 0; i < 60; i++)); do
        mariadb_client -e 'SELECT 1' >/dev/null 2>&1 && return 0
        sleep 0.5
    done
    die "mariadbd did not start: $(tail -n 5 "$STATE/log/mariadb.log" 2>/dev/null)"
}

start_slurmdbd() {
    local pass i
    pid_alive "$STATE/run/slurmdbd.pid" && return 0
    if [[ ! -s $STATE/run/mariadb.pass ]]; then
        (umask 077; od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$STATE/run/mariadb.pass")
    fi
    pass=$(cat "$STATE/run/mariadb.pass")
    mariadb_client -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
        ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" \
        || die "could not create the database user for slurmdbd"
    # slurmdbd reads slurmdbd.conf next to $SLURM_CONF; it must be private to SlurmUser.
    (umask 077; cat >"$STATE/slurmdbd.conf" <<EOF
# Written by tools/local_slurm.sh
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$pass
StorageLoc=slurm_acct_db
EOF
    )
    slurmdbd || die "slurmdbd did not start: $(tail -n 5 "$STATE/log/slurmdbd.log" 2>/dev/null)"
    for ((i = 0; i < 60; i++)); do
        (: >"/dev/tcp/127.0.0.1/$DBD_PORT") 2>/dev/null && return 0
        sleep 0.5
    done
    die "slurmdbd does not listen on $DBD_PORT: $(tail -n 5 "$STATE/log/slurmdbd.log" 2>/dev/null)"
}

start_slurmctld() {
    pid_alive "$STATE/run/slurmctld.pid" && return 0
    slurmctld -f "$CONF" \
        || die "slurmctld did not start: $(tail -n 5 "$STATE/log/slurmctld.log" 2>/dev/null)"
}

start_slurmd() {  # start_slurmd NODE
    pid_alive "$STATE/run/slurmd-$1.pid" && return 0
    mkdir -p "$STATE/spool/$1"
    slurmd -f "$CONF" -N "$1" \
        || die "slurmd $1 did not start: $(tail -n 5 "$STATE/log/slurmd-$1.log" 2>/dev/null)"
}

stop_daemons() {  # stop_daemons NAME...: SIGTERM the daemons of run/NAME.pid, wait for them
    local name f pids=() i
    for name in "$@"; do
        f=$STATE/run/$name.pid
        if pid_alive "$f"; then
            pids+=("$(cat "$f")")
            kill "${pids[-1]}" 2>/dev/null || true
        fi
        rm -f "$f"
    done
    ((${#pids[@]})) || return 0
    for ((i = 0; i < 150; i++)); do
        kill -0 "${pids[@]}" 2>/dev/null || return 0  # kill -0 succeeds while any one lives
        sleep 0.1
    done
    for i in "${pids[@]}"; do kill -9 "$i" 2>/dev/null || true; done
}

all_running() {
    local f extra=()
    [[ -e $STATE/accounting ]] && extra=(mariadb slurmdbd)
    for f in munged "${extra[@]}" slurmctld "${NODES[@]/#/slurmd-}"; do
        pid_alive "$STATE/run/$f.pid" || return 1
    done
}

ready_nodes() {  # how many nodes are registered and in service: idle, or busy with jobs
    sinfo -h -N -p debug -o '%N %T' 2>/dev/null \
        | awk '$2 ~ /^(idle|mixed|allocated|completing)$/ {n++} END {print n + 0}'
}

cmd_up() {
    local t0=$SECONDS f
    [[ $(id -u) == 0 ]] || die "needs root (SlurmUser=root, apt-get)"
    mkdir -p "$STATE"
    case ${1:-} in
        --accounting) ACCOUNTING=1 ;;
        --no-accounting) ACCOUNTING=0 ;;
        "") case ${MGBENCH_SLURM_ACCOUNTING:-} in
                1) ACCOUNTING=1 ;;
                0) ACCOUNTING=0 ;;
                *) if [[ -e $STATE/accounting ]]; then ACCOUNTING=1; fi ;;
            esac ;;
        *) die "unknown option $1 (up [--accounting | --no-accounting])" ;;
    esac
    install_packages "${PACKAGES[@]}"
    if ((ACCOUNTING)); then install_packages "${DB_PACKAGES[@]}"; fi
    if write_config; then
        # slurm.conf changed (first start, accounting switched, a newer script): daemons that
        # run with the old one restart; their jobs keep running.
        stop_daemons "${NODES[@]/#/slurmd-}" slurmctld
    fi
    start_munge
    if ((ACCOUNTING)); then
        touch "$STATE/accounting"
        start_mariadb
        start_slurmdbd
    else
        rm -f "$STATE/accounting"
        stop_daemons slurmdbd
        stop_daemons mariadb
    fi
    start_slurmctld
    for f in "${NODES[@]}"; do start_slurmd "$f"; done
    local deadline=$((SECONDS + 90)) n=0
    while ((SECONDS < deadline)); do
        n=$(ready_nodes)
        ((n == ${#NODES[@]})) && break
        # A node left DOWN or DRAINED by an earlier run is brought back.
        for f in $(sinfo -h -N -p debug -t down,drain,fail -o %N 2>/dev/null); do
            scontrol update nodename="$f" state=resume >/dev/null 2>&1 || true
        done
        sleep 1
    done
    if ((n != ${#NODES[@]})); then
        sinfo -N >&2 || true
        die "nodes not up after 90 s; logs in $STATE/log"
    fi
    echo "local slurm up: ${#NODES[@]} nodes $(sinfo -h -p debug -o %T | sort -u | paste -sd/)" \
        "(${NODES[*]}), partition debug, accounting $( ((ACCOUNTING)) && echo on || echo off)," \
        "SLURM_CONF=$CONF ($((SECONDS - t0)) s)"
}

cmd_down() {
    local i
    if pid_alive "$STATE/run/slurmctld.pid"; then
        # No job left behind: cancel them all and give their steps a moment to end.
        if [[ -n $(squeue -h -o %i 2>/dev/null) ]]; then
            # shellcheck disable=SC2046
            scancel --full $(squeue -h -o %i) 2>/dev/null || true
            for ((i = 0; i < 30; i++)); do
                [[ -z $(squeue -h -o %i 2>/dev/null) ]] && break
                sleep 0.5
            done
        fi
    fi
    stop_daemons "${NODES[@]/#/slurmd-}" slurmctld
    stop_daemons slurmdbd
    stop_daemons mariadb munged
    if [[ $(readlink /etc/slurm/slurm.conf 2>/dev/null) == "$CONF" ]]; then
        rm -f /etc/slurm/slurm.conf
    fi
    unname_nodes
    echo "local slurm down"
}

cmd_status() {
    all_running || { echo "local slurm not running (state dir $STATE)"; return 1; }
    sinfo -N -o '%N %P %T %c %m'
}

case ${1:-} in
    up) cmd_up "${@:2}" ;;
    down) cmd_down ;;
    status) cmd_status ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 up [--accounting | --no-accounting] | down | status | env" >&2; exit 2 ;;
esac
