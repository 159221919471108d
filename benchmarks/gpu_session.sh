#!/usr/bin/env bash
# One call on the lent GPU machine: build, then the named steps, each with its own time limit and
# log under $OUT/logs (tarred at the end: only 8 files come back). Usage:
#   bash benchmarks/gpu_session.sh STEP [STEP ...]
# Steps: build pytest1 diagnose fleetnode compile1 sdc1 overlap1 suite1 (one GPU); model2 two18 wall16 fleet2
# (two GPUs: prepared for a session that is lent the two-GPU kind; not run yet).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
L=$OUT/logs
mkdir -p "$L"
PY=python3
MB="$PY -m mgpu_bench.cli"
run() { # name seconds command...
  local name=$1 secs=$2; shift 2
  echo "== $name ($(date +%T))"
  ( timeout "$secs" "$@" ) > "$L/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc"; tail -n 25 "$L/$name.log"
  return 0
}

build() {
  nvidia-smi > "$L/nvidia-smi.txt" 2>&1
  nvidia-smi -q -d POWER,CLOCK >> "$L/nvidia-smi.txt" 2>&1
  run build 600 $PY -m pip install --no-build-isolation --no-deps -e .
  $PY -c "import mgpu_bench._native as n, torch; print('native NCCL', n.nccl_version(), 'torch', torch.__version__)"
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

for step in "$@"; do "$step"; done
tar czf "$OUT/logs.tgz" -C "$OUT" logs
rm -rf "$L"
