# A one-node Slurm cluster of the test's own, sourced by the slurm tests: munged with its own key
# and socket, slurmctld and slurmd on this machine with their own slurm.conf, state, spool, logs
# and ports, everything under one folder. slurm_install installs Debian's slurm-wlm and munge
# when missing; slurm_start starts the daemons and waits for the node; slurm_stop ends them
# (callers trap it on EXIT, so a failed test leaves no daemon behind).
#   slurm_install            0, or 77 with the reason on stdout (no root, no package)
#   slurm_start DIR CPUS     exports SLURM_CONF; 0 once the node is idle, else 1 with the logs
#   slurm_stop               ends the daemons slurm_start started (by their pids)

slurm_install() {
  local need=0 tool
  for tool in munged slurmctld slurmd srun sbatch squeue scontrol; do
    command -v "$tool" >/dev/null 2>&1 || need=1
  done
  [ "$need" -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "skip: Slurm is not installed and cannot be here (needs root and apt-get): apt-get install slurm-wlm munge"
    return 77
  fi
  echo "installing Slurm: apt-get install -y slurm-wlm munge"
  local log
  log=$(mktemp)
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge >"$log" 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get update >>"$log" 2>&1
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge >>"$log" 2>&1; then
      echo "skip: Slurm is not installed and apt-get could not install it: $(tail -n 1 "$log")"
      rm -f "$log"
      return 77
    fi
  fi
  rm -f "$log"
  for tool in munged slurmctld slurmd srun sbatch squeue scontrol; do
    command -v "$tool" >/dev/null 2>&1 ||
      { echo "skip: apt-get installed slurm-wlm and munge but there is no $tool"; return 77; }
  done
  return 0
}

SLURM_PIDS=()

slurm_stop() {
  local p
  [ "${#SLURM_PIDS[@]}" -gt 0 ] || return 0
  # the jobs first (a step's slurmstepd outlives slurmd), then the daemons, slurmd before slurmctld
  scancel --quiet --full --partition=test >/dev/null 2>&1
  for _ in $(seq 25); do [ -z "$(squeue -h 2>/dev/null)" ] && break; sleep 0.2; done
  for ((i = ${#SLURM_PIDS[@]} - 1; i >= 0; i--)); do
    p=${SLURM_PIDS[$i]}
    kill -TERM "$p" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null
    wait "$p" 2>/dev/null
  done
  SLURM_PIDS=()
}

# A TCP port nobody listens on, from a range chosen by the pid (two tests at once differ).
slurm_free_port() {
  local p=$1
  while [ "$p" -lt 65000 ]; do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
    p=$((p + 1))
  done
  echo 0
}

slurm_logs() {
  local f
  for f in "$SLURM_DIR"/log/*.log; do echo "--- $f"; tail -n 20 "$f"; done
}

slurm_start() {
  SLURM_DIR=$1
  local cpus=$2 host base ctld_port slurmd_port
  mkdir -p "$SLURM_DIR"/{munge,state,spool,log,run} && chmod 700 "$SLURM_DIR" "$SLURM_DIR/munge"
  host=$(hostname -s)
  base=$((20000 + ($$ % 2000) * 20))
  ctld_port=$(slurm_free_port "$base")
  slurmd_port=$(slurm_free_port $((ctld_port + 1)))

  # munge: a key of its own, its socket in the folder (slurm.conf's AuthInfo names it)
  dd if=/dev/urandom of="$SLURM_DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$SLURM_DIR/munge/munge.key"
  munged --foreground --force --key-file="$SLURM_DIR/munge/munge.key" \
    --socket="$SLURM_DIR/munge/munge.socket" --pid-file="$SLURM_DIR/munge/munged.pid" \
    --log-file="$SLURM_DIR/log/munged.log" --seed-file="$SLURM_DIR/munge/munged.seed" \
    --num-threads=2 >>"$SLURM_DIR/log/munged.log" 2>&1 &
  SLURM_PIDS+=($!)
  for _ in $(seq 50); do [ -S "$SLURM_DIR/munge/munge.socket" ] && break; sleep 0.1; done
  [ -S "$SLURM_DIR/munge/munge.socket" ] || { echo "munged did not start"; slurm_logs; return 1; }

  # no cgroups (a container may have none to give): processes tracked by their parents, tasks
  # unbound; the node's CPUs as stated here, whatever the machine has (config_overrides), so
  # ranks may outnumber cores as under mpirun --oversubscribe
  cat >"$SLURM_DIR/slurm.conf" <<CONF
ClusterName=tycho-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SLURM_DIR/munge/munge.socket
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/run/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/run/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
InactiveLimit=0
KillWait=5
MinJobAge=300
SlurmctldTimeout=30
SlurmdTimeout=30
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=1024 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
CONF
  export SLURM_CONF=$SLURM_DIR/slurm.conf
  slurmctld -D -i -f "$SLURM_CONF" >>"$SLURM_DIR/log/slurmctld.out" 2>&1 &
  SLURM_PIDS+=($!)
  slurmd -D -f "$SLURM_CONF" >>"$SLURM_DIR/log/slurmd.out" 2>&1 &
  SLURM_PIDS+=($!)
  local state=""
  for _ in $(seq 150); do
    state=$(sinfo -h -N -o %t 2>/dev/null | head -n 1)
    [ "$state" = idle ] && return 0
    sleep 0.2
  done
  echo "the test cluster's node did not become idle (state: ${state:-none})"
  slurm_logs
  return 1
}
