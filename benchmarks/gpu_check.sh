#!/bin/bash
# One short GPU window measures everything issue 26 asks of a GPU, in priority order, in under 10 minutes
# of wall time (compiles included): on a bare H100/H200 machine (torch 2.11 image) from the project root,
#   bash benchmarks/gpu_check.sh            (OUT=<folder> for the results; the device tool sets $OUT)
# Before: ../shared/tools/device-wheels.sh on the CPU machine (-> .whl/, carried along).
# Steps, each with its own timeout, all bounded by one deadline (GPU_CHECK_SECONDS, default 570):
#   1. bench1: ours vs peer, full checkpointing; ours ops+2 (2 blocks checkpointed whole, the rest by
#      ops), fp8 (torchao tensorwise) ops, ops+1 and ops+2 (mbs 32, compiled), each with a profiled step's
#      top operators;
#   2. the quantized-LoRA ladder on the proxy (LoRA over a bf16 / fp8 / nf4 frozen base, eager, mbs 16:
#      images/s and peak memory; ~30 s);  3. the hf workload on a BERT-base-sized random-init model (text
#      classification, synthetic data, ddp, amp-bf16: samples/s, tokens/s, MFU; ~60 s);
#   4. preflight --system local_gpu (~45 s);  5. a short submit --system local_gpu (60 steps, ~100 s);
#   6. with whatever time is left: bench2 fp8 rowwise ops+2 and ops.
# Brings back in $OUT (the device tool returns at most 8 files): steps.txt (each step's end, rc and
# seconds), benchmarks.md (every table, with the device line), bench1.md/json, and all.tgz: bench*.json
# (all facts per case), bench*.md, ladder.md/json, hf.md (the hf run's report), hf_metrics.jsonl,
# bench.log, job.log, profiles/ (per case: operators by host and GPU time), runs.tgz (the preflight and
# submit run folders without checkpoints).
# GPU_CHECK_CPU=1: the same steps on the CPU with tiny sizes and the project's venv (checks the script).
set -u
# The device tool brings back at most 8 files from $OUT: everything is written to a work folder, and $OUT
# gets steps.txt, benchmarks.md, bench1.md/json (after bench1, so a killed call still has them) and all.tgz.
FINAL=${OUT:-/tmp/gpu_check_out}
OUT=$(mktemp -d /tmp/gpu_check_work.XXXXXX)
mkdir -p "$FINAL"
T0=$(date +%s)
BUDGET=${GPU_CHECK_SECONDS:-570}
el() { echo "[t+$(($(date +%s) - T0))s] $*" | tee -a "$OUT/steps.txt"; cp "$OUT/steps.txt" "$FINAL/"; }
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

# 1. ours vs the peer at full checkpointing; ops+N (N blocks checkpointed whole, the rest by ops), bf16
#    and fp8: the goal is 1.25x the peer's full at its peak +5% (keeps 250 s for 2-5)
run_step bench1 "$(budget 300 250)" bench.log "${B[@]}" \
  --cases ours:full,peer:full,ours:ops+2,ours-fp8:ops+2,ours-fp8:ops+1,ours-fp8:ops \
  --profile "$OUT/profiles" --json "$OUT/bench1.json" --markdown "$OUT/bench1.md"
cp "$OUT"/bench1.* "$FINAL/" 2>/dev/null

# 2. the ladder: LoRA over a frozen bf16 / fp8 / nf4 base of the proxy, eager (no compiles)
run_step ladder "$(budget 40 210)" bench.log "${B[@]}" --compile off --steps 3 --warmup 1 \
  --cases "lora-bf16:full:$LADDER_MBS,lora-fp8:full:$LADDER_MBS,lora-nf4:full:$LADDER_MBS" \
  --json "$OUT/ladder.json" --markdown "$OUT/ladder.md"

# 3. hf: a BERT-base-sized model built here, fine-tuned on synthetic text (ddp, amp-bf16); its report
HF_RUNS=$RUNS/hf
HF_MODEL=$RUNS/bert-$HF_SIZE
HF_BUILD='import sys; from flux_cluster.models.tiny_hf import write_tiny_hf
write_tiny_hf(sys.argv[1], kind="bert", size=sys.argv[2], force=True)'
# shellcheck disable=SC2016  # $1.. are bash -c's own arguments
run_step hf "$(budget 75 135)" job.log bash -c '"$1" -c "$2" "$3" "$4" && shift 4 && flux-cluster "$@"' hf \
  "$PY" "$HF_BUILD" "$HF_MODEL" "$HF_SIZE" submit --system "$SYSTEM" --runs-dir "$HF_RUNS" \
  --set train.benchmark=hf --set hf.model="$HF_MODEL" --set hf.task=text-classification \
  --set hf.data=synthetic --set train.parallel=ddp --set train.precision=amp-bf16 "${HF_SET[@]}"
flux-cluster report "$HF_RUNS" --no-check --format md -o "$OUT/hf.md" >>"$OUT/job.log" 2>&1
cat "$HF_RUNS"/*/results/metrics_0.jsonl >"$OUT/hf_metrics.jsonl" 2>/dev/null
# 4. preflight (one rank: no bandwidth to measure)
run_step preflight "$(budget 60 75)" job.log flux-cluster preflight --system "$SYSTEM" --runs-dir "$RUNS"

# 5. a short training job with the system's defaults
run_step submit "$(budget 100 0)" job.log flux-cluster submit --system "$SYSTEM" --runs-dir "$RUNS" \
  "${SUBMIT_SET[@]}"

# 6. with what time is left: fp8 rowwise
tail_step() { # name min-seconds-left bench-args...
  local name=$1 need=$2
  shift 2
  if [ "$(left)" -ge "$need" ] || [ "${GPU_CHECK_CPU:-0}" = 1 ]; then
    run_step "$name" "$(budget 300 0)" bench.log "${B[@]}" "$@" --json "$OUT/$name.json" --markdown "$OUT/$name.md"
  else
    el "$name skipped: $(left)s left"
  fi
}
tail_step bench2 60 --cases ours-fp8:ops+2,ours-fp8:ops --fp8-recipes rowwise

(cd "$RUNS" && tar czf "$OUT/runs.tgz" --exclude='*.distcp' --exclude='*.pt' --exclude='*.safetensors' \
  --exclude='*.bin' . 2>/dev/null)
{
  echo "# gpu_check $(date -u +%Y-%m-%dT%H:%MZ)"
  head -2 "$OUT/steps.txt"
  for f in "$OUT"/bench[1-5].md "$OUT"/ladder.md "$OUT"/hf.md; do
    [ -f "$f" ] && { echo; echo "## $(basename "$f" .md)"; echo; cat "$f"; }
  done
} >"$OUT/benchmarks.md"
el "all done"
cp "$OUT/benchmarks.md" "$OUT/steps.txt" "$FINAL/"
tar czf "$FINAL/all.tgz" -C "$OUT" .
# the device tool brings back files up to 16 MiB: past that, the archive without the run folders
[ "$(stat -c %s "$FINAL/all.tgz")" -lt 16000000 ] || tar czf "$FINAL/all.tgz" -C "$OUT" --exclude=runs.tgz .
