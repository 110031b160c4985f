#!/usr/bin/env bash
# The README's two commands:
#   tools/dev.sh run    set up, then run the main job on the embedded default (--system local)
#   tools/dev.sh test   set up (Python deps; as root the Debian packages below and Slurm's), then run all tests
# Also: tools/dev.sh unit (the fast half: tests/unit, no Slurm, podman or multi-rank runs),
#       tools/dev.sh setup (set-up only), tools/dev.sh lint (ruff, import contracts),
#       tools/dev.sh lock (re-resolve requirements/runtime.lock).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${FLUX_CLUSTER_VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
# chromium: headless check of the HTML report; podman, runc, debootstrap: the image build test.
DEBIAN_PACKAGES=(shellcheck chromium podman runc debootstrap)

say() { printf '\033[1m[dev]\033[0m %s\n' "$*" >&2; }

setup_python() {
    "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || { say "Python 3.11 or newer is needed ($PYTHON is $("$PYTHON" -V 2>&1))"; exit 1; }
    [[ -x "$VENV/bin/python" ]] || { say "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
    local stamp="$VENV/.flux-cluster-installed"
    local want
    want=$(cat "$ROOT/pyproject.toml" "$ROOT/constraints.txt" "$ROOT/requirements/runtime.lock" \
        "$ROOT/requirements/bench.txt" | sha256sum | cut -d' ' -f1)
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        return
    fi
    say "installing Python dependencies into $VENV (torch 2.13.0 first, then requirements/runtime.lock)"
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # torch first and pinned: energon, accelerate and peft require torch unpinned and would pull a CUDA build.
    "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" torch==2.13.0
    # The locked versions are the ones the images install: tests run against exactly those.
    "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" -r "$ROOT/requirements/runtime.lock"
    "$VENV/bin/python" -m pip install -q -c "$ROOT/constraints.txt" -c "$ROOT/requirements/runtime.lock" -e "${ROOT}[test]"
    # Benchmark-only (torchtitan's FLUX beside ours): pinned, without the trainer's own dependencies.
    "$VENV/bin/python" -m pip install -q --no-deps -c "$ROOT/constraints.txt" -c "$ROOT/requirements/runtime.lock" \
        -r "$ROOT/requirements/bench.txt"
    echo "$want" > "$stamp"
}

setup_system() {
    if [[ $(id -u) -ne 0 ]]; then
        say "not root: skipping Debian packages (Slurm, shellcheck); tests that need them will skip"
        return
    fi
    local missing=()
    for pkg in "${DEBIAN_PACKAGES[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
    if ((${#missing[@]})); then
        say "installing Debian packages: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    bash "$ROOT/slurm/local-cluster.sh" install
}

cmd=${1:-}
shift || true
case "$cmd" in
    setup)
        setup_python
        setup_system
        ;;
    run)
        setup_python
        cd "$ROOT"
        exec "$VENV/bin/flux-cluster" submit --system local "$@"
        ;;
    lock)
        setup_python
        cd "$ROOT"
        "$VENV/bin/python" -m flux_cluster.image.lock write
        ;;
    lint)
        setup_python
        "$VENV/bin/ruff" check "$ROOT"
        "$VENV/bin/ruff" format --check "$ROOT"
        # The floors of the README's package map (pyproject.toml [tool.importlinter]).
        (cd "$ROOT" && "$VENV/bin/lint-imports" --no-cache --no-logo)
        ;;
    unit)
        # Python dependencies only: the unit tests need no Debian package and no Slurm.
        setup_python
        cd "$ROOT"
        exec "$VENV/bin/python" -m pytest tests/unit "$@"
        ;;
    test)
        setup_python
        setup_system
        cd "$ROOT"
        "$VENV/bin/ruff" check .
        "$VENV/bin/ruff" format --check .
        # Two workers: the Slurm and image build tests, which mostly wait, beside the others (tests/conftest.py).
        exec "$VENV/bin/python" -m pytest -n 2 "$@"
        ;;
    *)
        sed -n '2,7p' "${BASH_SOURCE[0]}" >&2
        exit 2
        ;;
esac
