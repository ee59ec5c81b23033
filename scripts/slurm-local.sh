#!/usr/bin/env bash
# A real single-node Slurm on localhost, for tests and CI (after ../shared/recipes/slurm-local.md).
#
#   scripts/slurm-local.sh start [DIR]   start munged, slurmctld, slurmd (or reuse them); prints
#                                        `export SLURM_CONF=DIR/slurm.conf`
#   scripts/slurm-local.sh stop  [DIR]   stop what start started (by PID file, checking each PID)
#   scripts/slurm-local.sh status [DIR]
#
# Everything (config, state, logs, sockets) lives under DIR (default /tmp/powertrain-slurm), so
# nothing in /etc or /run changes. Needs Debian's slurm-wlm and root (scripts/setup.sh --system).
set -euo pipefail
cmd=${1:-status}
S=${2:-${POWERTRAIN_SLURM_DIR:-/tmp/powertrain-slurm}}
export SLURM_CONF=$S/slurm.conf

write_conf() {
  cat > "$S/slurm.conf" <<CONF
ClusterName=local
SlurmctldHost=localhost
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$S/munge-run/munge.socket.2
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/run/slurmctld.pid
SlurmdPidFile=$S/run/slurmd.pid
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=60
SlurmdParameters=config_overrides
NodeName=node0 NodeAddr=127.0.0.1 CPUs=8 RealMemory=16000 State=UNKNOWN
PartitionName=debug Nodes=node0 Default=YES MaxTime=INFINITE State=UP
CONF
}

alive() {  # alive PIDFILE NAME
  [ -f "$1" ] || return 1
  local p; p=$(cat "$1")
  [ "$(cat /proc/"$p"/comm 2>/dev/null)" = "$2" ] || return 1
  # a zombie (exited, not yet reaped by a PID 1 that does not reap) is not alive
  [ "$(awk '{print $3}' /proc/"$p"/stat 2>/dev/null)" != Z ]
}

case "$cmd" in
  start)
    command -v slurmctld >/dev/null || { echo "slurm-local: slurm-wlm is not installed (run scripts/setup.sh --system as root)" >&2; exit 3; }
    [ "$(id -u)" = 0 ] || { echo "slurm-local: needs root" >&2; exit 3; }
    mkdir -p "$S"/{state,spool,log,run,munge,munge-run}
    chown munge:munge "$S/munge" "$S/munge-run"; chmod 700 "$S/munge"; chmod 755 "$S/munge-run"
    write_conf
    if ! alive "$S/munge-run/munged.pid" munged; then
      [ -f "$S/munge/munge.key" ] || { mungekey -c -k "$S/munge/munge.key"; chown munge:munge "$S/munge/munge.key"; }
      rm -f "$S/munge-run/munge.socket.2"
      runuser -u munge -- munged --socket="$S/munge-run/munge.socket.2" --key-file="$S/munge/munge.key" \
        --pid-file="$S/munge-run/munged.pid" --log-file="$S/munge/munged.log" --seed-file="$S/munge/munged.seed"
      for _ in $(seq 200); do [ -S "$S/munge-run/munge.socket.2" ] && break; sleep 0.05; done
    fi
    alive "$S/run/slurmctld.pid" slurmctld || slurmctld
    alive "$S/run/slurmd.pid" slurmd || slurmd -N node0
    for _ in $(seq 300); do
      state=$(sinfo -h -o %T 2>/dev/null || true)
      [ "$state" = idle ] || [ "$state" = mixed ] || [ "$state" = allocated ] && break
      sleep 0.1
    done
    state=$(sinfo -h -o %T 2>/dev/null || true)
    case "$state" in idle|mixed|allocated) ;; *) echo "slurm-local: node did not come up (state '$state'); see $S/log" >&2; exit 1;; esac
    echo "export SLURM_CONF=$S/slurm.conf"
    ;;
  stop)
    for f in "$S/run/slurmd.pid:slurmd" "$S/run/slurmctld.pid:slurmctld" "$S/munge-run/munged.pid:munged"; do
      file=${f%%:*}; name=${f##*:}
      if alive "$file" "$name"; then kill "$(cat "$file")"; fi
    done
    # wait (bounded) until they are gone, so a start right after this one starts fresh daemons
    # instead of "reusing" ones that are shutting down
    for _ in $(seq 300); do
      alive "$S/run/slurmd.pid" slurmd || alive "$S/run/slurmctld.pid" slurmctld \
        || alive "$S/munge-run/munged.pid" munged || break
      sleep 0.1
    done
    ;;
  status)
    for f in "$S/munge-run/munged.pid:munged" "$S/run/slurmctld.pid:slurmctld" "$S/run/slurmd.pid:slurmd"; do
      file=${f%%:*}; name=${f##*:}
      if alive "$file" "$name"; then echo "$name: running (pid $(cat "$file"))"; else echo "$name: stopped"; fi
    done
    ;;
  *) echo "usage: scripts/slurm-local.sh start|stop|status [DIR]" >&2; exit 2 ;;
esac
