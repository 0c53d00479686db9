#!/usr/bin/env bash
# Run crl_jax on every worker of a Cloud TPU VM slice: optionally create the slice, sync this
# checkout, install it into a virtual environment on each worker (skipped when setup.py is
# unchanged), then run experiments/run.py on all workers at once with jax.distributed, streaming
# their logs. Ctrl-C (or --stop) stops the run on every worker.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: launch_tpu.sh --tpu=NAME --zone=ZONE [options] -- [experiments/run.py flags]

Runs experiments/run.py (with CRL_JAX_DISTRIBUTED=1) on every worker of the TPU VM NAME.

Required:
  --tpu=NAME               TPU VM (slice) name
  --zone=ZONE              its zone, e.g. us-east5-a
Options:
  --project=PROJECT        Google Cloud project (default: gcloud's configured one)
  --create                 create the slice first
  --accelerator-type=TYPE  with --create (default: v5p-8)
  --version=RUNTIME        with --create, the TPU VM software version (default: v2-alpha-tpuv5)
  --remote-dir=DIR         checkout location on the workers, relative to home (default: crl_jax)
  --venv=DIR               virtual environment on the workers, relative to home (default: crl_jax_venv)
  --no-sync                skip copying this checkout to the workers
  --no-install             skip the install step
  --stop                   stop a run started earlier on the slice, then exit
  --dry-run                print the commands instead of running them
  -h, --help               this text

Everything after -- goes to experiments/run.py unchanged (quoted), e.g.
  launch_tpu.sh --tpu=crl --zone=us-east5-a -- --config=paper_scale.py --workdir=/mnt/shared/run1
The workdir must be one directory that every worker sees (an NFS or gcsfuse mount): checkpoints
are written collectively by all workers; logs and the report by worker 0.
EOF
}

TPU="" ZONE="" PROJECT="" CREATE=0 DRY_RUN=0 STOP=0 SYNC=1 INSTALL=1
ACCELERATOR="v5p-8" VERSION="v2-alpha-tpuv5" REMOTE_DIR="crl_jax" VENV="crl_jax_venv"
RUN_ARGS=()

die() { echo "launch_tpu.sh: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --tpu=*) TPU="${1#*=}" ;;
    --zone=*) ZONE="${1#*=}" ;;
    --project=*) PROJECT="${1#*=}" ;;
    --create) CREATE=1 ;;
    --accelerator-type=*) ACCELERATOR="${1#*=}" ;;
    --version=*) VERSION="${1#*=}" ;;
    --remote-dir=*) REMOTE_DIR="${1#*=}" ;;
    --venv=*) VENV="${1#*=}" ;;
    --no-sync) SYNC=0 ;;
    --no-install) INSTALL=0 ;;
    --stop) STOP=1 ;;
    --dry-run) DRY_RUN=1 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; RUN_ARGS=("$@"); break ;;
    *) usage >&2; die "unknown argument: $1 (run.py flags go after --)" ;;
  esac
  shift
done

[[ -n "$TPU" ]] || { usage >&2; die "--tpu=NAME is required"; }
[[ -n "$ZONE" ]] || { usage >&2; die "--zone=ZONE is required"; }
for dir in "$REMOTE_DIR" "$VENV"; do
  [[ "$dir" =~ ^[A-Za-z0-9._/-]+$ ]] || die "remote paths may hold only letters, digits and ._/-: $dir"
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LOCATION=(--zone="$ZONE")
[[ -n "$PROJECT" ]] && LOCATION+=(--project="$PROJECT")
TPU_VM=(gcloud compute tpus tpu-vm)
PID_FILE="crl_jax_run.pid"
LOG_FILE="crl_jax_run.log"

# One argument as the shell would need it: bare when safe, else in single quotes.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# Print (dry run) or run one command.
run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    local arg line=""
    for arg in "$@"; do line+="${line:+ }$(quote "$arg")"; done
    echo "$line"
  else
    "$@"
  fi
}

on_all_workers() {
  run "${TPU_VM[@]}" ssh "$TPU" "${LOCATION[@]}" --worker=all --command="$1"
}

# A command line for the workers' shell: its quotes and $(...) are meant for them, not for here.
# shellcheck disable=SC2016,SC2089
printf -v STOP_COMMAND 'if [ -f ~/%s ]; then kill -TERM -- -"$(cat ~/%s)" 2>/dev/null || true; rm -f ~/%s; fi' \
  "$PID_FILE" "$PID_FILE" "$PID_FILE"

if [[ "$STOP" == 1 ]]; then
  on_all_workers "$STOP_COMMAND"
  exit 0
fi

if [[ "$CREATE" == 1 ]]; then
  run "${TPU_VM[@]}" create "$TPU" "${LOCATION[@]}" --accelerator-type="$ACCELERATOR" \
    --version="$VERSION"
fi

if [[ "$SYNC" == 1 ]]; then
  TARBALL="${TMPDIR:-/tmp}/crl_jax_sync.tar.gz"
  if [[ "$DRY_RUN" == 1 ]]; then
    echo "(cd $(printf '%q' "$ROOT") && git ls-files -z --cached --others --exclude-standard" \
      "| tar --null -T - -czf $(printf '%q' "$TARBALL"))"
  else
    (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
      | tar --null -T - -czf "$TARBALL")
  fi
  run "${TPU_VM[@]}" scp "$TARBALL" "$TPU:crl_jax_sync.tar.gz" "${LOCATION[@]}" --worker=all
  on_all_workers "mkdir -p ~/$REMOTE_DIR && tar -xzf ~/crl_jax_sync.tar.gz -C ~/$REMOTE_DIR"
fi

if [[ "$INSTALL" == 1 ]]; then
  # Idempotent: the venv is made once; pip runs again only when setup.py changed.
  on_all_workers "cd ~/$REMOTE_DIR && { [ -x ~/$VENV/bin/python ] || python3 -m venv ~/$VENV; } \
&& { cmp -s setup.py ~/$VENV/.crl_jax_setup.py || { ~/$VENV/bin/pip install -q -e '.[tpu]' \
&& cp setup.py ~/$VENV/.crl_jax_setup.py; }; }"
fi

ARGS_QUOTED=""
if [[ ${#RUN_ARGS[@]} -gt 0 ]]; then
  ARGS_QUOTED="$(printf ' %q' "${RUN_ARGS[@]}")"
fi
# The run is its own session (setsid), so a dropped SSH connection does not end it and a stop
# reaches all its processes; tail streams its log until it exits; the exit status is the run's.
# shellcheck disable=SC2016  # $! and $pid must expand on the workers, not here
printf -v RUN_COMMAND '%s; %s; %s' \
  "cd ~/$REMOTE_DIR && CRL_JAX_DISTRIBUTED=1 setsid ~/$VENV/bin/python experiments/run.py$ARGS_QUOTED > ~/$LOG_FILE 2>&1 < /dev/null & pid=\$!" \
  "echo \"\$pid\" > ~/$PID_FILE; tail -n +1 -f --pid=\"\$pid\" ~/$LOG_FILE & wait \"\$pid\"" \
  "status=\$?; rm -f ~/$PID_FILE; exit \"\$status\""

if [[ "$DRY_RUN" == 0 ]]; then
  # shellcheck disable=SC2090  # STOP_COMMAND is one argument, quoted for the workers' shell
  trap 'echo "stopping the run on every worker" >&2; on_all_workers "$STOP_COMMAND"; exit 130' INT TERM
fi
on_all_workers "$RUN_COMMAND"
