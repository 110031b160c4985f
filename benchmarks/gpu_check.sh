#!/bin/bash
# One short GPU window measures everything issue 41 asks of a GPU, most important first, in under 10 minutes
# of wall time (compiles included): on a bare H100/H200 machine (torch 2.11 image) from the project root,
#   bash benchmarks/gpu_check.sh            (OUT=<folder> for the results; the device tool sets $OUT)
# Before, on the CPU machine: bash benchmarks/gpu_wheels.sh (-> .whl/: the runtime kit and torchtitan's).
# Steps, each with its own timeout, all bounded by one deadline (GPU_CHECK_SECONDS, default 570); planned
# on an H200 (install ~18 s, a compiled proxy case ~40 s, a process start ~15 s):
#   1. bench1 (~215 s): torchtitan's own FLUX (torchtitan 0.2.2: full checkpointing, compiled per block),
#      ours ops+2, ours fp8 ops+2 tensorwise and rowwise, the peer's full (the seeds' way); mbs 32,
#      compiled, one profiled step each: the goals table (ours / torchtitan's best bf16, fp8 / bf16 per
#      recipe, best MFU) and where each step's time goes (fp8 vs bf16 GEMMs, casts, amax);
#   2. ladder (~35 s): LoRA over a bf16 / fp8 / nf4 frozen base of the proxy (eager, mbs 16: images/s,
#      peak memory);
#   3. curve (~245 s): the micro-batch curve, a throughput sweep of the proxy at micro-batch
#      1, 2, 4, ..., 64 (flux-cluster sweep --job throughput: one process per point, compiled), its report,
#      and `flux-cluster forecast` for dgx_h200x8 at 1-64 nodes where that command exists;
#   4. hf (~60 s): a BERT-base-sized random-init model fine-tuned on synthetic text (ddp, amp-bf16);
#   5. with whatever time is left: evaluate's latency p50/p99 at the proxy width (a random-init pipeline,
#      256 px, 4 steps), torchtitan without checkpointing and with its float8, ours fp8 at mbs 64 (MFU),
#      preflight and a short submit.
# Brings back in $OUT (the device tool returns at most 8 files): steps.txt (each step's end, rc and
# seconds), benchmarks.md (every table, with the device line), bench1.md/json (after bench1, so a killed
# call still has them), all.tgz (bench*.json/md, ladder, curve.md, forecast.md, hf.md, eval.json, the
# profiles, bench.log, job.log, runs.tgz: the sweep's, hf's, evaluate's and the other run folders without
# checkpoints, so the forecast can be made again on the CPU machine).
# GPU_CHECK_CPU=1: the same steps on the CPU with tiny sizes and the project's venv (checks the script).
set -u
FINAL=${OUT:-/tmp/gpu_check_out}
OUT=$(mktemp -d /tmp/gpu_check_work.XXXXXX)
mkdir -p "$FINAL"
T0=$(date +%s)
CPU=${GPU_CHECK_CPU:-0}
SLACK=$((CPU == 1 ? 5 : 1))  # the CPU check times the script, not the GPU: every cap 5x as long
BUDGET=$((${GPU_CHECK_SECONDS:-570} * SLACK))
el() { echo "[t+$(($(date +%s) - T0))s] $*" | tee -a "$OUT/steps.txt"; cp "$OUT/steps.txt" "$FINAL/"; }
left() { echo $((BUDGET - ($(date +%s) - T0))); }
# timeout for a step: its cap, less what the later steps must keep ($2), never under 10 s
budget() {
  local cap=$(($1 * SLACK)) t=$(($(left) - $2 * SLACK))
  [ "$t" -gt "$cap" ] && t=$cap
  [ "$t" -lt 10 ] && t=10
  echo "$t"
}

CURVE=64,1,32,2,16,4,8  # both ends first: a point cut by the deadline is one from the middle
if [ "$CPU" = 1 ]; then
  PY=${PYTHON:-$PWD/.venv/bin/python}
  SYSTEM=local
  BENCH_SIZE=(--smoke --batches 2 --compile off --steps 2 --warmup 1)
  SUBMIT_SET=(--set train.synthetic_data.train=64 --set train.synthetic_data.val=16
    --set train.max_samples=64 --set train.eval_every_steps=4 --set train.log_every_steps=2)
  HF_SIZE=tiny
  HF_SET=(--set hf.synthetic_samples=32 --set hf.seq_len=32 --set train.micro_batch_size=4
    --set train.global_batch_size=8 --set train.log_every_steps=2)
  LADDER_MBS=2
  CURVE=16,1,4  # a wide range: the tiny steps grow past the CPU noise
  CURVE_SET=(--set train.model=tiny)
  EVAL_PRESET=tiny
  EVAL_SET=(--resolution 64 --runs 2 --warmup 1)
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
  # the proxy on this GPU: its memory (local_gpu says an H100's 80 GB) for checkpointing 'auto'
  MIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  GPU_GB=$((${MIB:-81920} / 1024))
  CURVE_SET=(--set train.model=proxy --set "gpu_memory_gb=$GPU_GB")
  EVAL_PRESET=proxy
  EVAL_SET=(--resolution 256 --runs 4 --warmup 1)
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || { el "install failed"; exit 1; }
  else
    el "no .whl/ here (bash benchmarks/gpu_wheels.sh on the CPU machine): using what the image has"
  fi
  export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
[ "$CPU" = 1 ] || export XDG_CACHE_HOME=/tmp/cache
RUNS=$(mktemp -d /tmp/gpu_check_runs.XXXXXX)
mkdir -p /tmp/bin
printf '#!/bin/sh\nexec %s -m flux_cluster "$@"\n' "$PY" >/tmp/bin/flux-cluster
chmod +x /tmp/bin/flux-cluster
export PATH=/tmp/bin:$PATH
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$OUT/steps.txt" 2>/dev/null
"$PY" -c 'import torch; print("torch", torch.__version__)' >>"$OUT/steps.txt" 2>&1
"$PY" -c 'import torchtitan, importlib.metadata as m; print("torchtitan", m.version("torchtitan"))' \
  >>"$OUT/steps.txt" 2>&1 || echo "torchtitan: not importable (its cases will say why)" >>"$OUT/steps.txt"
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

# 1. torchtitan's own FLUX, ours and the peer side by side, fp8 both recipes; goals and fp8's profile
#    (keeps 320 s for 2-4)
run_step bench1 "$(budget 230 320)" bench.log "${B[@]}" \
  --cases torchtitan:full,ours:ops+2,ours-fp8:ops+2,peer:full --fp8-recipes tensorwise,rowwise \
  --profile "$OUT/profiles" --json "$OUT/bench1.json" --markdown "$OUT/bench1.md"
cp "$OUT"/bench1.* "$FINAL/" 2>/dev/null

# 2. the ladder: LoRA over a frozen bf16 / fp8 / nf4 base of the proxy, eager (no compiles)
run_step ladder "$(budget 40 285)" bench.log "${B[@]}" --compile off --steps 3 --warmup 1 \
  --cases "lora-bf16:full:$LADDER_MBS,lora-fp8:full:$LADDER_MBS,lora-nf4:full:$LADDER_MBS" \
  --json "$OUT/ladder.json" --markdown "$OUT/ladder.md"

# 3. the micro-batch curve: a throughput sweep (one step's worth per point), kept for `flux-cluster
#    forecast`; a point cut by the deadline leaves the finished ones readable
SWEEP=$RUNS/mbs-curve
run_step curve "$(budget 250 65)" job.log flux-cluster sweep --system "$SYSTEM" --job throughput --synthetic \
  "${CURVE_SET[@]}" --grid "train.micro_batch_size=$CURVE" --warmup-steps 2 --steps 5 \
  --runs-dir "$RUNS" --name mbs-curve
flux-cluster report "$SWEEP" --format md -o "$OUT/curve.md" >>"$OUT/job.log" 2>&1
if flux-cluster forecast --help >/dev/null 2>&1; then
  run_step forecast "$(budget 30 0)" forecast.md flux-cluster forecast --from "$SWEEP" --system dgx_h200x8 \
    "${CURVE_SET[@]}" \
    --gpus 8,16,32,64,128,256,512 --format md
else
  el "forecast skipped: no 'flux-cluster forecast' here (run it on the CPU machine on runs.tgz's mbs-curve)"
fi

# 4. hf: a BERT-base-sized model built here, fine-tuned on synthetic text (ddp, amp-bf16); its report
HF_RUNS=$RUNS/hf
HF_MODEL=$RUNS/bert-$HF_SIZE
HF_BUILD='import sys; from flux_cluster.models.tiny_hf import write_tiny_hf
write_tiny_hf(sys.argv[1], kind="bert", size=sys.argv[2], force=True)'
# shellcheck disable=SC2016  # $1.. are bash -c's own arguments
run_step hf "$(budget 75 0)" job.log bash -c '"$1" -c "$2" "$3" "$4" && shift 4 && flux-cluster "$@"' hf \
  "$PY" "$HF_BUILD" "$HF_MODEL" "$HF_SIZE" submit --system "$SYSTEM" --runs-dir "$HF_RUNS" \
  --set train.benchmark=hf --set hf.model="$HF_MODEL" --set hf.task=text-classification \
  --set hf.data=synthetic --set train.parallel=ddp --set train.precision=amp-bf16 "${HF_SET[@]}"
flux-cluster report "$HF_RUNS" --no-check --format md -o "$OUT/hf.md" >>"$OUT/job.log" 2>&1
cat "$HF_RUNS"/*/results/metrics_0.jsonl >"$OUT/hf_metrics.jsonl" 2>/dev/null

# 5. with what time is left (the CPU check runs them all)
tail_ok() { # name min-seconds-left
  if [ "$(left)" -ge "$2" ] || [ "$CPU" = 1 ]; then return 0; fi
  el "$1 skipped: $(left)s left"
  return 1
}
# evaluate's latency at the proxy width: a random-init pipeline written here (bf16, ~5 GB), then timed
EVAL_MODEL=$RUNS/pipeline-$EVAL_PRESET
EVAL_BUILD='import sys; from flux_cluster.models.tiny import write_tiny_pipeline
write_tiny_pipeline(sys.argv[1], preset=sys.argv[2], force=True)'
# shellcheck disable=SC2016
tail_ok eval 110 && run_step eval "$(budget 150 0)" job.log \
  bash -c '"$1" -c "$2" "$3" "$4" && shift 4 && flux-cluster "$@"' eval "$PY" "$EVAL_BUILD" "$EVAL_MODEL" \
  "$EVAL_PRESET" evaluate "$EVAL_MODEL" --system "$SYSTEM" "${EVAL_SET[@]}" --output "$OUT/eval/eval.json"
bench_tail() { # name min-seconds-left bench-args...
  local name=$1 need=$2
  shift 2
  tail_ok "$name" "$need" && run_step "$name" "$(budget 200 0)" bench.log "${B[@]}" "$@" \
    --json "$OUT/$name.json" --markdown "$OUT/$name.md"
}
# torchtitan's best bf16 might be without checkpointing; its float8 (tensorwise) where the GPU has it
bench_tail bench2 90 --cases torchtitan:none,torchtitan-fp8:full --fp8-recipes tensorwise
bench_tail bench3 50 --cases ours-fp8:ops+2:64 --fp8-recipes tensorwise
tail_ok preflight 60 && run_step preflight "$(budget 60 0)" job.log flux-cluster preflight --system "$SYSTEM" \
  --runs-dir "$RUNS"
tail_ok submit 100 && run_step submit "$(budget 100 0)" job.log flux-cluster submit --system "$SYSTEM" \
  --runs-dir "$RUNS" "${SUBMIT_SET[@]}"

cp "$OUT/eval/eval.json" "$OUT/eval.json" 2>/dev/null
rm -rf "$EVAL_MODEL"  # the random weights (GBs at the proxy width): nothing to bring back
(cd "$RUNS" && tar czf "$OUT/runs.tgz" --exclude='*.distcp' --exclude='*.pt' --exclude='*.safetensors' \
  --exclude='*.bin' . 2>/dev/null)
{
  echo "# gpu_check $(date -u +%Y-%m-%dT%H:%MZ)"
  head -3 "$OUT/steps.txt"
  for f in "$OUT"/bench[1-5].md "$OUT"/ladder.md "$OUT"/curve.md "$OUT"/forecast.md "$OUT"/hf.md; do
    [ -f "$f" ] && { echo; echo "## $(basename "$f" .md)"; echo; cat "$f"; }
  done
  [ -f "$OUT/eval.json" ] && { echo; echo "## eval"; echo; echo '```'; cat "$OUT/eval.json"; echo '```'; }
} >"$OUT/benchmarks.md"
el "all done"
cp "$OUT/benchmarks.md" "$OUT/steps.txt" "$FINAL/"
tar czf "$FINAL/all.tgz" -C "$OUT" .
# the device tool brings back files up to 16 MiB: past that, the archive without the run folders
[ "$(stat -c %s "$FINAL/all.tgz")" -lt 16000000 ] || tar czf "$FINAL/all.tgz" -C "$OUT" --exclude=runs.tgz .
