#!/usr/bin/env bash
# Installs flux-cluster into a vendor PyTorch image without touching the image's torch.
# Run by docker/nvidia/Dockerfile and docker/amd/Dockerfile, from the image's working directory:
#   install.sh deps      requirements/runtime.lock with --no-deps: exactly the versions CI tested
#   install.sh project   the project itself, built with the locked hatchling (no download at build time)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOCK=requirements/runtime.lock
STATE=/var/lib/flux-cluster-build

fail() { printf 'install.sh: %s\n' "$*" >&2; exit 1; }
torch_identity() { python -c 'import torch; print(torch.__version__, torch.__file__)'; }
# The lock wins over a base image's pip constraints (NGC sets PIP_CONSTRAINT): the checks below make
# sure torch is untouched and no new dependency conflict appears.
pip_install() { env -u PIP_CONSTRAINT python -m pip install --no-cache-dir --no-input --no-deps "$@"; }
pip_problems() { python -m pip check 2>&1 | grep -v '^No broken requirements found' | sort || true; }

case "${1:-}" in
    deps)
        mkdir -p "$STATE"
        torch_identity > "$STATE/torch" || fail "the base image has no importable torch"
        pip_problems > "$STATE/pip-check"
        echo "base torch: $(cat "$STATE/torch")"
        pip_install --requirement "$LOCK"
        [[ "$(torch_identity)" == "$(cat "$STATE/torch")" ]] || fail "installing the lock changed torch"
        python "$HERE/lock.py" check "$LOCK" || fail "installed versions differ from $LOCK"
        ;;
    project)
        pip_install --no-build-isolation .
        [[ "$(torch_identity)" == "$(cat "$STATE/torch")" ]] || fail "installing the project changed torch"
        new=$(comm -13 "$STATE/pip-check" <(pip_problems))
        [[ -z "$new" ]] || fail "new dependency conflicts: $new"
        # Import what a training rank imports, so a missing or broken dependency fails the build, not the job.
        python -c 'import flux_cluster.jobs.train, flux_cluster.training.loop, flux_cluster.data.loader, megatron.energon, peft'
        flux-cluster --version
        rm -rf "$STATE"
        ;;
    *)
        fail "usage: install.sh deps|project"
        ;;
esac
