#!/usr/bin/env bash
# The GPU smoke run (issue 23): every README tour command that runs on the GPUs present, as a user
# runs it, with the history store ON (a temporary database, never --no-store). For each command:
# its exit code against the one the README documents, the "stored as rN" line, then
# `history show rN`, `report rN` (report.html where the probe writes one) and `compare rN` against
# itself. One line per command and a summary; exit code 0 when every command is ok, 1 otherwise.
#
#   bash benchmarks/gpu_smoke.sh OUTDIR       # from the repository root, after
#                                             # python3 -m pip install --no-build-isolation --no-deps -e .
#
# OUTDIR (default $OUT, else /tmp/out) receives:
#   docs/NAME-NxGPU.json   every result document produced (--json), named ready to become a test
#                          fixture: python benchmarks/trim_fixture.py OUTDIR/docs/*.json --parts
#                          --out tests/fixtures/gpu
#   logs/                  each command's output, its report folder, the history database
#   summary.txt            the lines printed at the end
#   smoke.tgz              docs/, logs/ and summary.txt in one file (a machine that returns few files)
#
# Environment:
#   NCCL_NVLS_ENABLE       the lent 2-GPU machine needs NCCL_NVLS_ENABLE=0 (its rule, not the
#                          product's: mgpu-bench never sets NCCL variables, and neither does this
#                          script): export it before calling the script there.
#   PYTHON                 the interpreter with mgpu-bench installed [default: python3].
#   MGPU_SMOKE_CPU=1       CPU mode: the rows that need a GPU are skipped, the others (comm on gloo
#                          processes) run the same loop (tests/test_gpu_documents.py runs it so).
#   MGPU_SMOKE_ONLY        names of rows to run, comma-separated [default: all].
#   MGPU_SMOKE_TABLE       a file of rows in the table's format, run instead of the table below.
#   MGPU_SMOKE_BUDGET_S    seconds the whole run may take (a machine lent by the call): each row's
#                          limit is cut to what is left, and a row that would start with under 20 s
#                          left is skipped, saying so [default: no limit].
#
# On one H200 the table is sized to finish in about 5 minutes (an estimate: the suite about 2 of
# them, its round 3 finding the largest batch of 350m for about a minute): each probe at quick
# sizes (few sizes, short bursts, the 125m or tiny model, few steps), the suite with --quick
# --duration 5s. What the suite runs as its own probes (gemm --duration, memory --max-batch 350m,
# memory --bandwidth with the churn) is not run again alone: trim_fixture.py --parts makes
# fixtures of the suite's probe documents.
set -u

# -- the commands ---------------------------------------------------------------------------------
# name | GPUs it needs (0: runs without GPUs too; cpu: runs on CPU processes, CUDA_VISIBLE_DEVICES='',
# wherever the script runs) | exit code the README documents (several joined by commas: plan-tp-pp
# exits 1, no estimate, where no 8-GPU node's allreduce figure is stored, as on a 1-GPU machine)
# | time limit (s) | stores a run (yes/no) | the command: mgpu-bench's arguments, {dir} a folder of
# its own (for --report); --json is added. A command that starts with ":" is a function below.
# One line per command: later issues add theirs here.
TABLE='
comm-small          | cpu | 0 | 120 | yes | comm --sizes 4K,256K
comm-1x             | 1 | 2 | 60  | no  | comm --sizes 1M
comm                | 2 | 0 | 120 | yes | comm --report {dir}
comm-all-ops        | 2 | 0 | 180 | yes | comm --ops all --sizes 8,1K,64M --dtype bf16
comm-torch          | 2 | 0 | 180 | yes | comm --backend torch --sizes 1M-64M
comm-graph-2x       | 2 | 0 | 120 | yes | comm --gpus 0,1 --graph --sizes 8-1M
comm-tune-1x        | 1 | 2 | 120 | no  | comm --tune --gpus 1
comm-tune-2x        | 2 | 0 | 300 | yes | comm --tune --sizes 1M-64M
topo                | 1 | 0 | 60  | no  | topo
links               | 1 | 0 | 120 | yes | links --report {dir}
gemm-dtypes         | 1 | 0 | 180 | yes | gemm --dtype bf16,fp16,tf32,fp8,fp32,fp64
gemm-shapes         | 1 | 0 | 120 | yes | gemm --shape 4096x8192x1024,8192
gemm-search         | 1 | 0 | 180 | yes | gemm --search --search-range 4096:8192:4096 --search-refine 2
memory              | 1 | 0 | 120 | yes | memory
memory-bandwidth    | 1 | 0 | 120 | yes | memory --bandwidth --no-churn
memory-torch        | 1 | 0 | 240 | yes | memory --no-churn --torch-allocators default,expandable --model tiny --steps 5 --seq-lens 64-256
model               | 1 | 0 | 180 | yes | model --model 125m --seq-len 512 --steps 8 --warmup-steps 2 --gpus 1
model-compile       | 1 | 0 | 300 | yes | model --model tiny --compile --steps 8 --warmup-steps 3 --gpus 1
model-data-both     | 1 | 0 | 180 | yes | model --model 125m --seq-len 512 --steps 8 --warmup-steps 2 --gpus 1 --data both --num-workers 4
model-checkpointing | 1 | 0 | 180 | yes | model --model 125m --seq-len 512 --steps 8 --warmup-steps 2 --gpus 1 --checkpointing
model-scaling-2x    | 2 | 0 | 300 | yes | model --model 125m --seq-len 512 --steps 8 --warmup-steps 2 --scaling 1,2
model-fsdp-2x       | 2 | 0 | 300 | yes | model --model 125m --seq-len 512 --steps 8 --warmup-steps 2 --gpus 2 --parallel fsdp
sdc                 | 1 | 0 | 120 | yes | sdc --repetitions 3 --gemms 16
overlap             | 1 | 0 | 120 | yes | overlap --duration 2s --report {dir}
fleet-2x            | 2 | 0 | 300 | yes | :fleet_two_nodes
model-torchvision   | 1 | 0 | 240 | yes | model --model torchvision:resnet50 --batch-size 64 --steps 8 --warmup-steps 3 --gpus 1
model-hf            | 1 | 0 | 240 | yes | model --model hf:bert-base --seq-len 512 --batch-size 8 --steps 8 --warmup-steps 2 --gpus 1
model-hf-config     | 1 | 0 | 180 | yes | model --model hf:tests/workloads/tiny_bert.json --seq-len 128 --batch-size 32 --steps 8 --warmup-steps 2 --gpus 1
model-module        | 1 | 0 | 180 | yes | model --model tests/workloads/small_step.py:workload --batch-size 64 --steps 8 --warmup-steps 2 --gpus 1 --data both
memory-max-batch-hf | 1 | 0 | 300 | yes | memory --no-churn --max-batch hf:bert-base --seq-len 512
check               | 1 | 0 | 90  | yes | check --budget 60s
plan                | 1 | 0 | 120 | yes | plan --model 125m --seq-len 512 --tokens 10B --gpus 8 --network NDR
monitor             | 1 | 0 | 240 | yes | :monitor_job
nccl-tests-import   | 0 | 0 | 60  | yes | :nccl_import
side-by-side        | 1 | 0 | 60  | no  | :side_by_side
plan-tp-pp          | 1 | 0,1 | 120 | yes | plan --model layers=96,width=12288 --tokens 300B --gpus 1024 --parallel tp=8,pp=16 --global-batch 1536 --gpus-per-node 8 --network NDR
history-prune       | 0 | 0 | 60  | no  | :prune_dry_run
suite-quick         | 1 | 0 | 420 | yes | suite --quick --duration 5s --report {dir}
'

# -- functions for the commands a launcher starts -------------------------------------------------

# fleet compares nodes: two torchrun agents on this host, one GPU each, as two nodes (README:
# Finding the bad node); rank 0 writes the document ($1) and stores the pass. NCCL between the
# two goes over sockets, as between nodes: NCCL_P2P_DISABLE and NCCL_SHM_DISABLE are this
# emulation's (as benchmarks/gpu_session.sh fleet2), not the product's (which sets none).
fleet_two_nodes() {
  local json=$1 port
  port=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  local pids=() rc=0 rank
  for rank in 0 1; do
    CUDA_VISIBLE_DEVICES=$rank NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 \
      $PY -m torch.distributed.run --nnodes 2 --node-rank $rank --nproc-per-node 1 \
      --master-addr 127.0.0.1 --master-port "$port" -m mgpu_bench.cli fleet --timeout 60 \
      $([ $rank = 0 ] && echo "--json $json") &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=$?; done
  return $rc
}

# StepMonitor in a job of its own (benchmarks/monitor_example.py, the README's loop): stored like
# every run; $1 its --json.
monitor_job() {
  $PY benchmarks/monitor_example.py --json "$1"
}

# A nccl-tests log into the history (README: Machines side by side); $1 gets the stored run's document.
nccl_import() {
  local id
  $PY -m mgpu_bench.cli history add tests/fixtures/nccl-tests/all_reduce_perf_2xh200.log || return
  id=$($PY -m mgpu_bench.cli history list --kind comm | grep -o '^ *r[0-9][0-9]*' | head -n 1 | tr -d ' ')
  echo "stored as $id (history add's run, as the loop reads it)"
  $PY -c 'import json, sys; from mgpu_bench.history import History
with History.open(readonly=True) as h: json.dump(h.get(sys.argv[1]).document, open(sys.argv[2], "w"))' "$id" "$1"
}

# The two newest gemm runs of this smoke side by side (one machine: the table of two runs of it).
side_by_side() {
  local ids
  ids=$($PY -m mgpu_bench.cli history list --kind gemm | grep -o '^ *r[0-9][0-9]*' | head -n 2 | tr -d ' ')
  # shellcheck disable=SC2086
  $PY -m mgpu_bench.cli side-by-side $ids --json "$1"
}

# history prune as a cron job would run it, --dry-run: what would go, nothing removed.
prune_dry_run() {
  $PY -m mgpu_bench.cli history prune --keep 1 --dry-run
}

# -- the loop -------------------------------------------------------------------------------------

OUTDIR=${1:-${OUT:-/tmp/out}}
PY=${PYTHON:-python3}
MB="$PY -m mgpu_bench.cli"
DOCS=$OUTDIR/docs
LOGS=$OUTDIR/logs
mkdir -p "$DOCS" "$LOGS" || exit 2
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mgpu-smoke-XXXXXX") || exit 2
export MGPU_BENCH_DB=$WORK/history.sqlite3  # the store ON, in a database of this run's own
export PYTHONUNBUFFERED=1
[ -n "${MGPU_SMOKE_TABLE:-}" ] && TABLE=$(cat "$MGPU_SMOKE_TABLE")

if [ "${MGPU_SMOKE_CPU:-0}" = 1 ]; then
  NGPU=0
  export CUDA_VISIBLE_DEVICES=  # CPU processes even where GPUs are
else
  NGPU=$($PY -c 'from mgpu_bench.machine.selection import visible_gpu_count as n; print(n())' 2>/dev/null || echo 0)
fi
if [ "$NGPU" -gt 0 ]; then
  MODEL=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
  MODEL=$(echo "${MODEL:-gpu}" | tr 'A-Z ' 'a-z-' | sed -e 's/^nvidia-//' -e 's/[^a-z0-9-]//g')
  TAG=${NGPU}x$MODEL
  nvidia-smi > "$LOGS/nvidia-smi.txt" 2>&1
else
  TAG=cpu
fi
echo "gpu_smoke: $NGPU GPU(s) ($TAG), history in $MGPU_BENCH_DB, documents in $DOCS"
$PY -c 'import mgpu_bench, mgpu_bench._native as n, torch; print("mgpu-bench", mgpu_bench.__version__, "from",
mgpu_bench.__file__, "| NCCL", n.nccl_version(), "| torch", torch.__version__)' 2>&1 | tee "$LOGS/versions.txt"

said() {  # the line of log $1 that says why a command failed: its error, else its last line
  local line
  line=$(grep -e 'mgpu-bench: error' -e 'mgpu-bench: the run' -e 'Error' "$1" | tail -n 1)
  echo "${line:-$(tail -n 1 "$1")}"
}

wanted() {  # is row $1 among MGPU_SMOKE_ONLY (or is every row wanted)?
  [ -z "${MGPU_SMOKE_ONLY:-}" ] && return 0
  case ",$MGPU_SMOKE_ONLY," in *",$1,"*) return 0 ;; esac
  return 1
}

# check NAME ID: history show, report and compare of stored run ID; prints "ok" or why not.
check() {
  local name=$1 id=$2 rep=$LOGS/$1-stored-report log=$LOGS/$1-check.log
  if ! $MB history show "$id" > "$log" 2>&1; then echo "history show $id failed: $(said "$log")"; return; fi
  if ! $MB report "$id" --out "$rep" >> "$log" 2>&1; then echo "report $id failed: $(said "$log")"; return; fi
  local kind
  kind=$(sed -n "s/^run $id: \([a-z]*\).*/\1/p" "$log" | head -n 1)
  if [ "$kind" != links ] && [ ! -f "$rep/report.html" ]; then echo "report $id wrote no report.html"; return; fi
  if ! $MB compare "$id" --baseline "$id" >> "$log" 2>&1; then
    echo "compare $id with itself failed: $(grep -m 1 'not comparable' "$log" || said "$log")"
    return
  fi
  echo ok
}

T_START=$SECONDS
declare -a NAMES=()
declare -A SKIP=() STATUS=() IDS=() WALL=() CODE=()
trim() { local s=$1; s=${s#"${s%%[![:space:]]*}"}; printf '%s' "${s%"${s##*[![:space:]]}"}"; }
while IFS='|' read -r name gpus want limit stores cmd; do
  name=$(trim "$name")
  [ -z "$name" ] && continue
  case "$name" in \#*) continue ;; esac
  gpus=$(trim "$gpus"); want=$(trim "$want"); limit=$(trim "$limit"); stores=$(trim "$stores"); cmd=$(trim "$cmd")
  wanted "$name" || continue
  NAMES+=("$name")
  cpu_only=0
  if [ "$gpus" = cpu ]; then cpu_only=1; gpus=0; fi
  if [ "$NGPU" -lt "$gpus" ]; then
    SKIP[$name]="skipped: needs $gpus GPU(s), $NGPU present"
    printf '%-20s %s\n' "$name" "${SKIP[$name]}"
    continue
  fi
  if [ -n "${MGPU_SMOKE_BUDGET_S:-}" ]; then
    rest=$((MGPU_SMOKE_BUDGET_S - (SECONDS - T_START)))
    if [ "$rest" -lt 20 ]; then
      SKIP[$name]="skipped: ${rest} s left of MGPU_SMOKE_BUDGET_S=$MGPU_SMOKE_BUDGET_S"
      printf '%-20s %s\n' "$name" "${SKIP[$name]}"
      continue
    fi
    [ "$limit" -gt "$rest" ] && limit=$rest
  fi
  json=$DOCS/$name-$TAG.json
  dir=$LOGS/$name-report
  log=$LOGS/$name.log
  t0=$SECONDS
  if [ "$cpu_only" = 1 ]; then
    # shellcheck disable=SC2086
    ( export CUDA_VISIBLE_DEVICES=; timeout "$limit" $MB ${cmd//\{dir\}/$dir} --json "$json" ) < /dev/null > "$log" 2>&1
  elif [ "${cmd:0:1}" = : ]; then
    ( timeout "$limit" bash -c "$(declare -f fleet_two_nodes monitor_job nccl_import side_by_side prune_dry_run); PY='$PY'; ${cmd:1} '$json'" ) < /dev/null > "$log" 2>&1
  else
    args=${cmd//\{dir\}/$dir}
    # shellcheck disable=SC2086  # the table's arguments are split as a shell splits them
    ( timeout "$limit" $MB $args --json "$json" ) < /dev/null > "$log" 2>&1
  fi
  rc=$?
  WALL[$name]=$((SECONDS - t0)); CODE[$name]=$rc
  id=$(grep -o 'stored as r[0-9]*' "$log" | head -n 1 | cut -d' ' -f3)
  IDS[$name]=${id:--}
  why=""
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    why="timed out after $limit s"
  elif [[ ",$want," != *",$rc,"* ]]; then  # want: one code, or several joined by commas (0,1)
    why="exit $rc, the README says $want: $(said "$log")"
  elif [ "$stores" = yes ] && [ -z "$id" ]; then
    why="not stored: $(grep -m 1 'not stored' "$log" || echo 'no "stored as rN" line')"
  elif [ "$stores" = yes ] && [ ! -s "$json" ]; then
    why="no result document at $json"
  fi
  if [ -n "$why" ]; then
    STATUS[$name]="FAIL: $why"
  elif [ "$stores" = yes ]; then
    STATUS[$name]=checking
    check "$name" "$id" < /dev/null > "$LOGS/$name.checked" &  # CPU only: runs beside the next GPU command
  else
    STATUS[$name]=ok
  fi
  printf '%-20s exit %-3s %5s s  %-5s %s\n' "$name" "$rc" "${WALL[$name]}" "${IDS[$name]}" "${STATUS[$name]}"
done <<< "$TABLE"
wait

ok=0; failed=0; skipped=0
{
  echo "== gpu_smoke on $NGPU GPU(s) ($TAG): name, exit code, seconds, stored run, result"
  for name in "${NAMES[@]}"; do
    if [ -n "${SKIP[$name]:-}" ]; then
      printf '%-20s %s\n' "$name" "${SKIP[$name]}"; skipped=$((skipped + 1)); continue
    fi
    status=${STATUS[$name]}
    if [ "$status" = checking ]; then
      status=$(cat "$LOGS/$name.checked" 2>/dev/null)
      [ "$status" = ok ] || status="FAIL: ${status:-its checks said nothing}"
    fi
    case "$status" in ok) ok=$((ok + 1)) ;; *) failed=$((failed + 1)) ;; esac
    printf '%-20s exit %-3s %5s s  %-5s %s\n' "$name" "${CODE[$name]}" "${WALL[$name]}" "${IDS[$name]}" "$status"
  done
  echo "gpu_smoke: $ok ok, $failed FAIL, $skipped skipped in $((SECONDS - T_START)) s on $NGPU GPU(s) ($TAG); documents in $DOCS"
} | tee "$OUTDIR/summary.txt"
cp "$MGPU_BENCH_DB" "$LOGS/history.sqlite3" 2>/dev/null
rm -rf "$WORK"
tar czf "$OUTDIR/smoke.tgz" -C "$OUTDIR" docs logs summary.txt
grep -q "^gpu_smoke: .* 0 FAIL" "$OUTDIR/summary.txt"
