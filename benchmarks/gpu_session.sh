#!/usr/bin/env bash
# One call on the lent GPU machine: build, then the named steps, each with its own time limit and
# log under $OUT/logs (tarred at the end: only 8 files come back). Usage:
#   bash benchmarks/gpu_session.sh STEP [STEP ...]
# Steps: build pytest1 diagnose fleetnode compile1 sdc1 overlap1 suite1 (one GPU); model2 two18 wall16 fleet2
# (two GPUs: prepared for a session that is lent the two-GPU kind; not run yet).
# Session 15 (one GPU, issues 23-29): smoke pytestgpu work26 check27 monitor28 plan29; then bert26 pytestnew.
# Session 16 (one GPU, issues 32-36): build16 truth32 bert32 old32 vision32; then build16 smoke; then noise32 pytestgpu.
# Session 17 had no device time; waiting for the next: build16 noise32 (issue 36: GradMarks' norms, ABBA), then build16 smoke.
# Session 18 (one GPU, issue 40): build16 ledger40; then build16 smoke.
# Session 21 (one GPU, issue 42): build16 smoke; then build16 server42 pytestgpu.
# Session 22 (one GPU, issues 41-42): build16 server42 pytestgpu; then build16 server42 smoke.
set -u
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the tree this script runs in (build16 copies its native module beside it)
OUT=${OUT:-/tmp/out}
L=$OUT/logs
export MGPU_BENCH_DB=${MGPU_BENCH_DB:-$OUT/logs/history.sqlite3}  # the store on, as users run it; it comes back with the logs
mkdir -p "$L"
PY=python3
MB="$PY -m mgpu_bench.cli"
# The lent machine ends a call at 600 s and returns only what lies under $OUT then: every step's
# limit is cut to what is left of SESSION_BUDGET_S (default 570 s from the start of this script),
# a step with under 10 s left is skipped, and the logs are tarred after every step.
SESSION_BUDGET_S=${SESSION_BUDGET_S:-570}
left() { echo $((SESSION_BUDGET_S - SECONDS)); }
run() { # name seconds command...
  local name=$1 secs=$2; shift 2
  local rest; rest=$(left)
  if [ "$rest" -lt 10 ]; then echo "== $name: skipped, ${rest} s left of ${SESSION_BUDGET_S}"; return 0; fi
  [ "$secs" -gt "$rest" ] && secs=$rest
  echo "== $name ($(date +%T), limit $secs s)"
  ( timeout "$secs" "$@" ) > "$L/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc"; tail -n 25 "$L/$name.log"
  tar czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null
  return 0
}

build() {
  nvidia-smi > "$L/nvidia-smi.txt" 2>&1
  nvidia-smi -q -d POWER,CLOCK >> "$L/nvidia-smi.txt" 2>&1
  run build 600 $PY -m pip install --no-build-isolation --no-deps -e .
  $PY -c "import mgpu_bench._native as n, torch; print('native NCCL', n.nccl_version(), 'torch', torch.__version__)"
}

build16() {  # no editable install: the extension built once into a target folder and copied beside the sources,
  # so that a second tree (.old: the release before, for A/B runs) imports its own Python with the same native module
  nvidia-smi > "$L/nvidia-smi.txt" 2>&1
  nvidia-smi -q -d POWER,CLOCK >> "$L/nvidia-smi.txt" 2>&1
  CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90 run build 300 $PY -m pip install --no-build-isolation --no-deps --target /tmp/mgpu-site .
  for tree in . .old; do
    [ -d "$tree/mgpu_bench" ] && cp /tmp/mgpu-site/mgpu_bench/_native*.so /tmp/mgpu-site/mgpu_bench/_build_config.py "$tree/mgpu_bench/"
  done
  $PY -c "import mgpu_bench._native as n, torch, mgpu_bench; print('native NCCL', n.nccl_version(), 'torch', torch.__version__, mgpu_bench.__file__)" | tee -a "$L/nvidia-smi.txt"
}

truth32() {  # issues 32 and 36: the monitor's headline against the loop's wall clock with stalls; its overhead and the noise scale's
  run step-truth 300 $PY benchmarks/step_truth.py truth overhead noise --reps 5
}

noise32() {  # issues 32 and 36: the hook alone and the noise scale at noise_every 1 and 8 against plain DDP, ABBA
  run step-noise 300 $PY benchmarks/step_truth.py noise --reps 5
}

bert32() {  # issue 32: model hf:bert-large against a plain loop over one fixed batch, A B B A
  local m="model --model hf:bert-large --seq-len 512 --batch-size 16 --steps 30 --warmup-steps 5 --gpus 1"
  run plain-bert-1 100 $PY benchmarks/plain_bert_loop.py --seq-len 512 --batch-size 16 --steps 30
  # shellcheck disable=SC2086
  run model-bert-1 120 $MB $m --json "$L/model-bert-1.json"
  # shellcheck disable=SC2086
  run model-bert-2 120 $MB $m --json "$L/model-bert-2.json"
  run plain-bert-2 100 $PY benchmarks/plain_bert_loop.py --seq-len 512 --batch-size 16 --steps 30
}

vision32() {  # issue 32: resnet50 no slower than session 15 (4,684 samples/s at batch 256)
  run model-resnet50 150 $MB model --model torchvision:resnet50 --batch-size 256 --steps 30 --warmup-steps 5 --gpus 1 --json "$L/model-resnet50.json"
}

old32() {  # issue 32: the default model run, this tree against the release before (.old), A B B A
  run model-default-new-1 120 $MB model --json "$L/model-default-new-1.json"
  run model-default-old-1 120 bash -c "cd .old && PYTHONPATH=. $MB model --no-store --json $L/model-default-old-1.json"
  run model-default-old-2 120 bash -c "cd .old && PYTHONPATH=. $MB model --no-store --json $L/model-default-old-2.json"
  run model-default-new-2 120 $MB model --json "$L/model-default-new-2.json"
}

pytest1() { run pytest-gpu 480 $PY -m pytest -m gpu -q -p no:cacheprovider tests/; }

diagnose() {
  # healthy: gemm and a 350m step on one GPU, nobody else on it
  run gemm-healthy 120 $MB gemm --dtype bf16 --json "$L/gemm-healthy.json" --no-store
  run model-healthy 240 $MB model --model 350m --steps 20 --warmup-steps 5 --gpus 1 --json "$L/model-healthy.json" --no-store
  run profile-kernels 180 $PY benchmarks/profile_kernels.py "$L/kernels_350m_1xh200.json.gz"
  # another job on GPU 0: a bf16 matmul loop holding 24 GiB
  $PY benchmarks/gpu_hog.py 0 150 24 > "$L/hog.log" 2>&1 &
  HOG=$!
  sleep 12
  $PY - > "$L/nvml-processes.json" 2>&1 <<'PYEOF'
import json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
procs = [{"pid": p.pid, "usedGpuMemory": p.usedGpuMemory} for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
print(json.dumps({"processes": procs, "utilization": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
                  "default_limit_mw": pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h),
                  "constraints_mw": list(pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h)),
                  "enforced_mw": pynvml.nvmlDeviceGetEnforcedPowerLimit(h)}))
PYEOF
  run gemm-shared 120 $MB gemm --dtype bf16 --json "$L/gemm-shared.json" --no-store
  run model-shared 240 $MB model --model 350m --steps 20 --warmup-steps 5 --gpus 1 --json "$L/model-shared.json" --no-store
  run oom-shared 240 $MB model --model 1.3b --batch-size 48 --steps 3 --warmup-steps 1 --gpus 1 --no-store
  kill $HOG 2>/dev/null; wait $HOG 2>/dev/null
}

fleetnode() { run pytest-fleet 300 $PY -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu_fleet.py; }

compile1() {  # issue 16: model --compile against a plain compiled loop, 350m seq 2048 batch 8, one GPU
  run plain-eager 300 $PY benchmarks/plain_gpt_loop.py --steps 30
  run plain-compiled 400 $PY benchmarks/plain_gpt_loop.py --steps 30 --compile
  run model-compiled 500 $MB model --model 350m --seq-len 2048 --batch-size 8 --steps 30 --warmup-steps 5 --gpus 1 --compile --no-profile --json "$L/model-compiled.json" --no-store
  run model-eager 300 $MB model --model 350m --seq-len 2048 --batch-size 8 --steps 30 --warmup-steps 5 --gpus 1 --no-profile --json "$L/model-eager.json" --no-store
}

sdc1() {  # issue 18: determinism on one H200, then the command as a user runs it
  run sdc-determinism 300 $PY benchmarks/sdc_determinism.py --repetitions 100
  run sdc-command 200 $MB sdc --json "$L/sdc.json" --report "$L/sdc-report" --no-store
}

overlap1() {  # issue 18: overlap on one GPU (interference needs two: the command says so)
  run overlap-command 200 $MB overlap --json "$L/overlap.json" --no-store
}

suite1() { run suite-quick 420 $MB suite --quick --report "$L/suite" --no-store; }

model2() {
  run model-ddp 420 $MB model --model 350m --scaling 1,2 --steps 20 --warmup-steps 5 --json "$L/model-ddp.json" --no-store
  run model-fsdp 420 $MB model --model 350m --scaling 1,2 --parallel fsdp --steps 20 --warmup-steps 5 --json "$L/model-fsdp.json" --no-store
}

two18() {  # issue 18 on two GPUs: sdc across GPUs, overlap against a real allreduce, comm --tune's target
  run sdc-determinism2 300 $PY benchmarks/sdc_determinism.py --repetitions 100
  run overlap2 200 $MB overlap --json "$L/overlap2.json" --no-store
  run tune2 200 $MB comm --tune --sizes 1M-1G --json "$L/tune2.json" --no-store
  run pytest-two 480 $PY -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu_sdc.py tests/test_gpu_overlap.py tests/test_gpu_comm_tune.py
}

wall16() {  # issue 16: comm's whole process against the same sweep without it (2 GPUs), wall clock each
  run comm-wall 120 bash -c "for i in 1 2 3; do /usr/bin/time -f 'comm process %e s' $MB comm --ops allreduce --sizes 1M-1G --no-store > /dev/null; done"
}

fleet2() {  # issue 15: two torchrun agents, one GPU each, NCCL forced onto sockets between them
  local port=29611
  for rank in 0 1; do
    CUDA_VISIBLE_DEVICES=$rank NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 timeout 300 $PY -m torch.distributed.run \
      --nnodes 2 --node-rank $rank --nproc-per-node 1 --master-addr 127.0.0.1 --master-port $port \
      -m mgpu_bench.cli fleet --timeout 60 --json "$L/fleet2-$rank.json" --no-store > "$L/fleet2-$rank.log" 2>&1 &
  done
  wait
  tail -n 30 "$L/fleet2-0.log"
}

smoke() {  # issue 23: the smoke run, store on; its tarball (documents for the fixtures, logs) beside the logs.
  # MGPU_SMOKE_ONLY (rows) splits it over calls: smoke.tgz is then named after SMOKE_PART.
  local part=${SMOKE_PART:-all}
  MGPU_SMOKE_BUDGET_S=$(($(left) - 15)) run "gpu-smoke-$part" 590 bash benchmarks/gpu_smoke.sh "$OUT/smoke"
  cp "$OUT/smoke/smoke.tgz" "$OUT/smoke-$part.tgz" 2>/dev/null; cp "$OUT/smoke/summary.txt" "$L/smoke-summary-$part.txt" 2>/dev/null
  rm -rf "$OUT/smoke"
}

server42() {  # issue 42: ranks forked from the rank server use CUDA; the server never loads the driver
  run pytest-rank-server 120 $PY -m pytest -m gpu -v -p no:cacheprovider tests/test_gpu_rank_server.py
  # which of the server's imports maps libcuda (a mapped library is no initialised driver)
  for m in torch torch.distributed torch._dynamo mgpu_bench.core.rank_server; do
    $PY -c "import $m; print('$m: libcuda mapped' if 'libcuda.so' in open('/proc/self/maps').read() else '$m: not mapped')"
  done >> "$L/pytest-rank-server.log" 2>&1
}

pytestgpu() {  # issue 23: -m gpu under 5 minutes on one H200, every test passing; durations for RESULTS
  run pytest-gpu 420 $PY -m pytest -m gpu -q -p no:cacheprovider --durations=40 tests/
}

work26() {  # issue 26: resnet50 and bert-large against plain loops of the same model; FLOPs of 350m counted
  run plain-resnet50 240 $PY benchmarks/plain_vision_loop.py --model resnet50 --batch-size 256 --image-size 224 --steps 30
  run model-resnet50 300 $MB model --model torchvision:resnet50 --batch-size 256 --steps 30 --warmup-steps 5 --gpus 1 --json "$L/model-resnet50.json"
  run plain-bert16 240 $PY benchmarks/plain_bert_loop.py --seq-len 512 --batch-size 16 --steps 30
  run model-bert16 300 $MB model --model hf:bert-large --seq-len 512 --batch-size 16 --steps 30 --warmup-steps 5 --gpus 1 --json "$L/model-bert16.json"
  run flops-350m 120 $PY -c "from mgpu_bench import workloads as W; w=W.resolve('350m'); m=w.count_flops(8); g=w.count_flops(8,'cuda:0'); f,t=w.formula_flops(8); print(f'350m b8 s2048: meta {m.per_sample/1e9:.1f}, cuda {g.per_sample/1e9:.1f} GFLOP/sample; {t} {f/8/1e9:.1f} ({100*(m.flops/f-1):+.2f}% meta, {100*(g.flops/f-1):+.2f}% cuda)')"
}

check27() {  # issue 27: check on the healthy GPU, then with a GEMM of another process on it (NPD form)
  run check-healthy 120 bash -c "time $MB check --json $L/check-healthy.json; echo exit \$?"
  run check-npd 120 bash -c "$MB check --format npd; echo exit \$?"
  $PY benchmarks/gpu_hog.py 0 100 24 > "$L/hog27.log" 2>&1 &
  local hog=$!
  sleep 10
  run check-shared 120 bash -c "time $MB check --format npd --json $L/check-shared.json; echo exit \$?"
  kill $hog 2>/dev/null; wait $hog 2>/dev/null
}

monitor28() {  # issue 28: the 350m loop with and without StepMonitor, beside mgpu-bench model
  run monitor-overhead 420 $PY benchmarks/monitor_overhead.py --model 350m --seq-len 2048 --batch-size 8 --steps 30 --reps 5
}

bert26() {  # issue 26: bert-large against its plain loop, A B C A B C (C: the same command with Python's GC off)
  local m="model --model hf:bert-large --seq-len 512 --batch-size 16 --steps 30 --warmup-steps 5 --gpus 1 --no-store"
  local rep
  for rep in 1 2; do
    run "plain-bert16-$rep" 120 $PY benchmarks/plain_bert_loop.py --seq-len 512 --batch-size 16 --steps 30
    run "model-bert16-$rep" 150 $MB $m --json "$L/model-bert16-$rep.json"
    # shellcheck disable=SC2086
    run "model-bert16-nogc-$rep" 150 $PY -c "import gc, sys; gc.disable(); sys.argv = ['mgpu-bench', *sys.argv[1:]]
from mgpu_bench.cli import main; main()" $m --json "$L/model-bert16-nogc-$rep.json"
  done
}

pytestnew() {  # the GPU tests of issues 26-28
  run pytest-gpu-new 200 $PY -m pytest -m gpu -q -p no:cacheprovider --durations=20 tests/test_gpu_workloads.py \
    tests/test_monitor_gpu.py tests/test_check.py
}

plan29() {  # issue 29: held-out points on one H200
  run plan-holdout 540 $PY benchmarks/plan_holdout.py gpu --json "$L/plan-holdout.json"
}

ledger40() {  # issue 40: a job waiting on its DataLoader, monitor and model --data both; the monitor's cost (ABBA),
  # the noise scale's at noise_every 8 and the reference steps' with the default marks (DDP on this one GPU)
  run ledger-loader 240 $PY benchmarks/ledger_gpu.py --json-dir "$L"
  run ledger-overhead 200 $PY benchmarks/step_truth.py overhead --reps 5 --block 20
  run ledger-noise 300 $PY benchmarks/step_truth.py noise reference --marks-only --reps 5 --block 20
}

for step in "$@"; do "$step"; done
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
