#!/bin/bash
# One short GPU window measures everything issue 26 asks of a GPU, in priority order, in under 8 minutes
# of wall time (compiles included): on a bare H100/H200 machine (torch 2.11 image) from the project root,
#   bash benchmarks/gpu_check.sh            (OUT=<folder> for the results; the device tool sets $OUT)
# Before: ../shared/tools/device-wheels.sh on the CPU machine (-> .whl/, carried along).
# Steps, each with its own timeout, all bounded by one deadline (GPU_CHECK_SECONDS, default 450):
#   1. bench1: ours vs peer, full checkpointing; ours none/ops/alternate/single (mbs 32, bf16, compiled);
#      then fp8 (torchao tensorwise) full and ops, each with a profiled step's top operators.
#   2. preflight --system local_gpu (~40 s);  3. a short submit --system local_gpu (60 steps, ~80 s);
#   4. the hf workload on a BERT-base-sized random-init model (text classification, synthetic data, ddp,
#      amp-bf16: samples/s, tokens/s, MFU; ~30 s) and the quantized-LoRA ladder on the proxy (LoRA over a
#      bf16 / fp8 / nf4 frozen base, eager, mbs 16: images/s and peak memory; ~30 s);
#   5. with whatever time is left: bench5 ours full/ops with the float32 gradient copy on one rank (as
#      before parallelize.reduce_dtype); bench2 fp8 rowwise full/ops; bench3 fp8 full with gc frozen;
#      bench4 fp8 ops at mbs 64.
# Writes to $OUT: steps.txt (each step's end, rc and seconds), bench*.json (all facts per case), bench*.md
# (docs/benchmarks.md-ready tables; ladder.md/json: the LoRA ladder), bench.log, job.log, hf.md (the hf
# run's report), hf_metrics.jsonl, profiles/ (per fp8 case: operators by host and
# GPU time), runs.tgz (the preflight/submit run folders without checkpoints), benchmarks.md (the tables
# joined, with the device line).
# GPU_CHECK_CPU=1: the same steps on the CPU with tiny sizes and the project's venv (checks the script).
set -u
OUT=${OUT:-/tmp/gpu_check_out}
mkdir -p "$OUT"
T0=$(date +%s)
BUDGET=${GPU_CHECK_SECONDS:-450}
el() { echo "[t+$(($(date +%s) - T0))s] $*" | tee -a "$OUT/steps.txt"; }
left() { echo $((BUDGET - ($(date +%s) - T0))); }
# timeout for a step: its cap, less what the later steps must keep ($2), never under 10 s
budget() { local t=$(($(left) - $2)); [ "$t" -gt "$1" ] && t=$1; [ "$t" -lt 10 ] && t=10; echo "$t"; }

if [ "${GPU_CHECK_CPU:-0}" = 1 ]; then
  PY=${PYTHON:-$PWD/.venv/bin/python}
  SYSTEM=local
  BENCH_SIZE=(--smoke --batches 2 --compile off --steps 2 --warmup 1)
  SUBMIT_SET=(--set train.synthetic_data.train=64 --set train.synthetic_data.val=16
    --set train.max_samples=64 --set train.eval_every_steps=4 --set train.log_every_steps=2)
  HF_SIZE=tiny
  HF_SET=(--set hf.synthetic_samples=32 --set hf.seq_len=32 --set train.micro_batch_size=4
    --set train.global_batch_size=8 --set train.log_every_steps=2)
  LADDER_MBS=2
  export PYTHONPATH=$PWD
else
  PY=python3
  SYSTEM=local_gpu
  BENCH_SIZE=(--batches 32 --compile on --steps 5 --warmup 2)
  SUBMIT_SET=(--set train.synthetic_data.train=384 --set train.synthetic_data.val=64
    --set train.max_samples=1920 --set train.eval_every_steps=30 --set train.log_every_steps=10)
  HF_SIZE=base  # bert-base's shape: 768 wide, 12 layers, 12 heads (flux_cluster/models/tiny_hf.py SIZES)
  HF_SET=(--set hf.synthetic_samples=2048 --set hf.seq_len=128 --set train.micro_batch_size=32
    --set train.global_batch_size=32 --set train.log_every_steps=16)
  LADDER_MBS=16
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || { el "install failed"; exit 1; }
  else
    el "no .whl/ here: using what the image has"
  fi
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
[ "${GPU_CHECK_CPU:-0}" = 1 ] || export XDG_CACHE_HOME=/tmp/cache
RUNS=$(mktemp -d /tmp/gpu_check_runs.XXXXXX)
mkdir -p /tmp/bin
printf '#!/bin/sh\nexec %s -m flux_cluster "$@"\n' "$PY" >/tmp/bin/flux-cluster
chmod +x /tmp/bin/flux-cluster
export PATH=/tmp/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$OUT/steps.txt" 2>/dev/null
"$PY" -c 'import torch; print("torch", torch.__version__)' >>"$OUT/steps.txt" 2>&1
el "installed"

B=("$PY" benchmarks/train_throughput.py "${BENCH_SIZE[@]}")
run_step() { # name timeout log command...
  local name=$1 limit=$2 log=$3 start rc
  shift 3
  start=$(date +%s)
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$OUT/$log"
  rc=${PIPESTATUS[0]}
  el "$name done rc=$rc in $(($(date +%s) - start))s (limit ${limit}s)"
}

# 1. bf16: ours vs peer at full checkpointing, ours' other modes; then fp8 with the fix (keeps 200 s for 2-4)
run_step bench1 "$(budget 300 200)" bench.log "${B[@]}" \
  --cases ours:full,peer:full,ours:none,ours:ops,ours:alternate,ours:single,ours-fp8:full,ours-fp8:ops \
  --profile "$OUT/profiles" --json "$OUT/bench1.json" --markdown "$OUT/bench1.md"

# 2. preflight (one rank: no bandwidth to measure)
run_step preflight "$(budget 60 135)" job.log flux-cluster preflight --system "$SYSTEM" --runs-dir "$RUNS"

# 3. a short training job with the system's defaults
run_step submit "$(budget 100 60)" job.log flux-cluster submit --system "$SYSTEM" --runs-dir "$RUNS" \
  "${SUBMIT_SET[@]}"

# 4. hf: a BERT-base-sized model built here, fine-tuned on synthetic text (ddp, amp-bf16); its report
HF_RUNS=$RUNS/hf
HF_MODEL=$RUNS/bert-$HF_SIZE
HF_BUILD='import sys; from flux_cluster.models.tiny_hf import write_tiny_hf
write_tiny_hf(sys.argv[1], kind="bert", size=sys.argv[2], force=True)'
# shellcheck disable=SC2016  # $1.. are bash -c's own arguments
run_step hf "$(budget 30 30)" job.log bash -c '"$1" -c "$2" "$3" "$4" && shift 4 && flux-cluster "$@"' hf \
  "$PY" "$HF_BUILD" "$HF_MODEL" "$HF_SIZE" submit --system "$SYSTEM" --runs-dir "$HF_RUNS" \
  --set train.benchmark=hf --set hf.model="$HF_MODEL" --set hf.task=text-classification \
  --set hf.data=synthetic --set train.parallel=ddp --set train.precision=amp-bf16 "${HF_SET[@]}"
flux-cluster report "$HF_RUNS" --no-check --format md -o "$OUT/hf.md" >>"$OUT/job.log" 2>&1
cat "$HF_RUNS"/*/results/metrics_0.jsonl >"$OUT/hf_metrics.jsonl" 2>/dev/null
# the ladder: LoRA over a frozen bf16 / fp8 / nf4 base of the proxy, eager (no compiles in 30 s)
run_step ladder "$(budget 30 0)" bench.log "${B[@]}" --compile off --steps 3 --warmup 1 \
  --cases "lora-bf16:full:$LADDER_MBS,lora-fp8:full:$LADDER_MBS,lora-nf4:full:$LADDER_MBS" \
  --json "$OUT/ladder.json" --markdown "$OUT/ladder.md"

# 5. what time is left: fp8 rowwise; garbage collection frozen (a host-gap suspect); fp8 at mbs 64
tail_step() { # name min-seconds-left bench-args...
  local name=$1 need=$2
  shift 2
  if [ "$(left)" -ge "$need" ] || [ "${GPU_CHECK_CPU:-0}" = 1 ]; then
    run_step "$name" "$(budget 300 0)" bench.log "${B[@]}" "$@" --json "$OUT/$name.json" --markdown "$OUT/$name.md"
  else
    el "$name skipped: $(left)s left"
  fi
}
# ours with the float32 gradient copy on one rank, as before parallelize.reduce_dtype: bench1's ours rows
# against these give the peak memory that change saves (CPU accounting: benchmarks/memory_accounting.py).
# First of the tail: bench2's rowwise compiles have run past their share before.
tail_step bench5 60 --cases ours:full,ours:ops --reduce-dtype float32
tail_step bench2 60 --cases ours-fp8:full,ours-fp8:ops --fp8-recipes rowwise
tail_step bench3 45 --cases ours-fp8:full --gc frozen
tail_step bench4 45 --cases ours-fp8:ops:64

(cd "$RUNS" && tar czf "$OUT/runs.tgz" --exclude='*.distcp' --exclude='*.pt' . 2>/dev/null)
{
  echo "# gpu_check $(date -u +%Y-%m-%dT%H:%MZ)"
  head -2 "$OUT/steps.txt"
  for f in "$OUT"/bench[1-5].md "$OUT"/ladder.md "$OUT"/hf.md; do
    [ -f "$f" ] && { echo; echo "## $(basename "$f" .md)"; echo; cat "$f"; }
  done
} >"$OUT/benchmarks.md"
el "all done"
