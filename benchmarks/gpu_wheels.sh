#!/bin/bash
# The wheel kit benchmarks/gpu_check.sh installs on a bare GPU machine, made on this (CPU) machine, from the
# project's root:   bash benchmarks/gpu_wheels.sh        (then carry [".whl"] in the device call)
# 1. ../shared/tools/device-wheels.sh, where it is: the runtime lock's wheels the GPU image lacks;
# 2. requirements/bench.txt's wheels but triton (the image's own matches its torch): torchtitan and what its
#    FLUX path imports, and typing-extensions at the lock's version (typeguard needs >= 4.14).
set -euo pipefail
[[ -f requirements/bench.txt ]] || { echo "run this from the project's root (no requirements/bench.txt here)" >&2; exit 1; }
if [[ -f ../shared/tools/device-wheels.sh ]]; then
  bash ../shared/tools/device-wheels.sh
else
  echo "no ../shared/tools/device-wheels.sh: only the benchmark's wheels go into .whl/" >&2
  mkdir -p .whl
fi
mapfile -t reqs < <(grep -E '^[A-Za-z0-9_.-]+==' requirements/bench.txt | grep -v '^triton==';
  grep -E '^typing-extensions==' requirements/runtime.lock)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  -d .whl "${reqs[@]}" 2>&1 | grep -v '^WARNING' || true
shopt -s nocaseglob  # pip names wheels with underscores, in any case
for req in "${reqs[@]}"; do
  name=${req%%==*}; version=${req#*==}
  compgen -G ".whl/${name//-/_}-${version}-*.whl" >/dev/null || { echo "missing from .whl/: $req" >&2; exit 1; }
done
echo "$(find .whl -type f -name '*.whl' | wc -l) wheels in .whl ($(du -sh .whl | cut -f1)), torchtitan's FLUX included; carry [\".whl\"]."
