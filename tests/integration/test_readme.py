"""Every shell command in README.md's fenced ```bash blocks runs, in README order, from one fresh folder:
as printed, or where it needs a cluster, a GPU, a registry, a download or many minutes, as the stand-in
STAND_INS lists for it (why it cannot run here, and what runs instead). flux-cluster commands run through
the real CLI in this process (one import of torch and diffusers for all of them), so a README example the
CLI refuses fails here. A new README command with no run and no listed stand-in fails
test_every_readme_command_has_a_run_or_a_listed_stand_in."""

import json
import os
import re
import shlex
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SAMPLE = ROOT / "tests" / "data" / "mlperf_v51_sample.tar.xz"
SWEEP_NAME = "sweep-dgx_h100x8-20261124-101500"

ONE_PROMPT = "--prompts ~/one-prompt.txt"
"""evaluate on a CPU in seconds: one prompt (the scene writes it), not the 8 built-in ones."""
SMALL_EVAL = "--resolution 64 --max-sequence-length 16 --runs 1 --warmup 0 " + ONE_PROMPT
"""The defaults (512 px, 12 x 8 timed images per model) take minutes on a CPU."""

DRY = "{} --dry-run"
"""The same command, prepared and checked (run directory, job script, every config value), not submitted."""

STAND_INS: dict[str, tuple[str, str | None]] = {
    # command as the README prints it (comments dropped, spaces single) -> (why not as printed, instead);
    # instead: a command ("{}" is the README's), or None: not run (only for commands that are not
    # flux-cluster's; their script must exist)
    "tools/dev.sh run": (
        "installs the dependencies, then trains for 2 minutes; it runs 'flux-cluster submit --system local'",
        "flux-cluster submit --system local --dry-run",
    ),
    "tools/dev.sh test": ("sets up Slurm and runs the whole test suite", None),
    "tools/dev.sh unit": ("runs the unit half of this test suite", None),
    "tools/dev.sh lint": ("ruff and lint-imports over the whole tree: CI runs them", None),
    "tools/dev.sh lock": ("re-resolves requirements/runtime.lock with pip (needs the package index)", None),
    "source .venv/bin/activate": ("a shell's PATH: these commands run the venv's flux-cluster already", None),
    "flux-cluster submit --system dgx_h100x8 --nexp 10": ("needs a Slurm cluster", DRY),
    "flux-cluster submit --system dgx_h100x8 --set nodes=4 --set train.global_batch_size=1024": (
        "needs a Slurm cluster",
        DRY,
    ),
    "flux-cluster preflight --system mi300x8": ("needs a Slurm cluster of MI300X nodes", DRY),
    "flux-cluster status [RUN]": ("[RUN] is optional: the latest run", "flux-cluster status"),
    "flux-cluster logs [RUN] --follow [--task N]": (
        "the latest run is a dry run (never submitted), which has no output to follow",
        "flux-cluster logs",
    ),
    "flux-cluster cancel [RUN]": ("[RUN] is optional: the latest run", "flux-cluster cancel"),
    "flux-cluster runs requeue [RUN]": ("[RUN] is optional: the latest run", "flux-cluster runs requeue"),
    "flux-cluster report [PATHS]": (
        "nothing under ./runs has results yet: the MLPerf v5.1 sample",
        "flux-cluster report ~/training_results_v5.1 --no-check",
    ),
    "flux-cluster models tiny OUT [--variant dev]": (
        "OUT is a placeholder",
        "flux-cluster models tiny work/tiny-dev --variant dev",
    ),
    "flux-cluster data encode IMAGES OUT --model PIPELINE": (
        "placeholders: the fine-tuning example below runs it on real folders",
        "flux-cluster data encode --help",
    ),
    "flux-cluster evaluate RUN [--model PIPELINE]": (
        "placeholders: the fine-tuning example below runs it on a real run",
        "flux-cluster evaluate --help",
    ),
    "flux-cluster submit --system local --set train.benchmark=finetune --set train.mode=lora --set "
    "train.pretrained_path=work/demo/flux-tiny --set paths.data_root=work/demo/data --set train.epochs=5 "
    "--set train.global_batch_size=8 --set train.micro_batch_size=4": (
        "5 epochs take about 40 s on 2 cores: one epoch proves the same path",
        "{} --set train.epochs=1",
    ),
    "flux-cluster submit --system local --set train.benchmark=finetune --set train.mode=lora --set "
    "train.pretrained_path=work/demo/flux-tiny --set train.base_precision=fp8 --set "
    "paths.data_root=work/demo/data --set train.epochs=5 --set train.global_batch_size=8 --set "
    "train.micro_batch_size=2 --set train.optimizer=adamw8bit --set train.caption_dropout=0.1": (
        "tests/integration/test_quantized_finetune.py trains both precisions; here: checked, not run",
        DRY,
    ),
    "flux-cluster submit --system local --set train.benchmark=finetune --set train.mode=lora --set "
    "train.pretrained_path=work/demo/flux-tiny-nf4 --set train.base_precision=nf4 --set "
    "paths.data_root=work/demo/data --set train.epochs=5 --set train.global_batch_size=8 --set "
    "train.micro_batch_size=2 --set train.optimizer=adamw8bit --set train.caption_dropout=0.1": (
        "tests/integration/test_quantized_finetune.py trains both precisions; here: checked, not run",
        DRY,
    ),
    "flux-cluster evaluate runs/finetune/RUN": ("the defaults take minutes on a CPU", "{} " + SMALL_EVAL),
    "flux-cluster evaluate my_lora.safetensors --model FLUX_DIR": (
        "placeholders: the example run's LoRA and its pipeline; the defaults take minutes on a CPU",
        "flux-cluster evaluate runs/finetune/RUN/results/best_0/pytorch_lora_weights.safetensors "
        "--model work/demo/flux-tiny " + SMALL_EVAL,
    ),
    "flux-cluster evaluate FLUX_DIR --system aws_p5 --output work/evals/aws_p5.json": (
        "FLUX_DIR: the example's pipeline; the defaults take minutes on a CPU",
        "flux-cluster evaluate work/demo/flux-tiny --system aws_p5 --output work/evals/aws_p5.json "
        + SMALL_EVAL,
    ),
    "flux-cluster evaluate runs/finetune/RUN --submit --system dgx_h100x8 [--dry-run]": (
        "needs a Slurm cluster: the optional --dry-run given",
        "flux-cluster evaluate runs/finetune/RUN --submit --system dgx_h100x8 --dry-run",
    ),
    "flux-cluster data synth work/src --train 1024 --val 256": (
        "1,280 samples of the real shapes are about 3 GB: a few prove the same path",
        "flux-cluster data synth work/src --train 16 --val 8",
    ),
    "flux-cluster prepare-data --system dgx_h100x8 --submit": ("needs a Slurm cluster", DRY),
    "flux-cluster prepare-data --system dgx_h100x8 --stage verify": (
        "needs the cluster's data root (/lustre/...) and a Slurm cluster",
        "{} --submit --dry-run",
    ),
    "flux-cluster report runs/flux1 --price 2.99": (
        "no flux1 result here (a run trains for minutes): the MLPerf v5.1 sample instead",
        "flux-cluster report ~/training_results_v5.1 --no-check --price 2.99",
    ),
    "flux-cluster report runs/ft --price aws_p5=5.50 --price ondemand_h100x8=2.49": (
        "runs/ft is a reader's own folder: the fine-tuning example's runs/finetune",
        "flux-cluster report runs/finetune --price aws_p5=5.50 --price ondemand_h100x8=2.49",
    ),
    "flux-cluster report work/evals/ runs/ft -f html -o work/cmp.html": (
        "runs/ft is a reader's own folder: the fine-tuning example's runs/finetune",
        "flux-cluster report work/evals/ runs/finetune -f html -o work/cmp.html",
    ),
    "flux-cluster report --compare runs/h100x8 runs/mi300x8": (
        "no runs on two systems here: the MLPerf sample against the fine-tuning run",
        "flux-cluster report --compare ~/training_results_v5.1 runs/finetune --no-check",
    ),
    "flux-cluster sweep --system dgx_h100x8 --grid train.micro_batch_size=4,8,16,32 "
    "--grid train.compile=false,true --grid nodes=1,2,4 --synthetic --submit --max-parallel 4": (
        "needs a Slurm cluster of H100 nodes",
        DRY,
    ),
    "flux-cluster submit --system local --set train.benchmark=hf --set hf.model=work/hf/gpt2 --set "
    "hf.task=causal-lm --set hf.data=work/hf/text --set hf.seq_len=32 --set hf.max_samples=64 --set "
    "train.precision=amp-bf16 --set train.mode=lora --set train.lora_rank=8": (
        "15 s of training that tests/integration/test_hf_train.py does on 2 gloo ranks (gpt2, AMP, LoRA)",
        DRY,
    ),
    "flux-cluster submit --system local --set train.benchmark=hf --set hf.model=work/hf/vit --set "
    "hf.task=image-classification --set hf.data=work/hf/shapes --set train.precision=amp-bf16": (
        "15 s of training that tests/integration/test_hf_train.py does on 2 gloo ranks (vit, imagefolder)",
        DRY,
    ),
    "flux-cluster sweep --system local --job train --set train.benchmark=hf --set hf.model=work/hf/bert "
    "--set hf.task=text-classification --set hf.data=work/hf/reviews --grid train.precision=fp32,amp-bf16 "
    "--grid train.parallel=dp,ddp --grid train.mode=finetune,lora": (
        "8 more trainings of about 15 s: the hf runs above are compared the same way",
        DRY,
    ),
    f"flux-cluster sweep --resume {SWEEP_NAME} --wait": (
        "its points ran on a cluster: a sweep of that name is made here with every point answered "
        "(see _scene), so --resume finds nothing to run",
        "{}",
    ),
    "flux-cluster image build --system dgx_h100x8": (
        "needs docker and enroot (and a clean checkout, which a working tree under test may not be)",
        "{} --dry-run --allow-dirty",
    ),
    "flux-cluster image build --vendor amd --push registry.example.com/mlperf": (
        "needs podman or docker and a registry (and a clean checkout)",
        "{} --dry-run --allow-dirty",
    ),
    "flux-cluster image build --vendor nvidia --sqsh /lustre/mlperf/images/ --dry-run": (
        "the cluster's /lustre image folder: a folder here (and a clean checkout)",
        "flux-cluster image build --vendor nvidia --sqsh work/ --dry-run --allow-dirty",
    ),
    "flux-cluster evaluate runs/finetune/RUN --resolution 64 --max-sequence-length 16 --runs 2 --warmup 1": (
        "the README's CPU example (about a minute for 8 prompts): one prompt proves the same path",
        "{} " + ONE_PROMPT,
    ),
    "flux-cluster submit --system local --set train.benchmark=finetune --set train.mode=lora --set "
    "train.pretrained_path=work/demo/kontext-tiny --set paths.data_root=work/demo/pairs-data --set "
    "train.epochs=1": (
        "tests/integration/test_kontext.py trains and evaluates this example (40 s of CI): here checked, "
        "not run",
        DRY,
    ),
    "flux-cluster evaluate runs/finetune/RUN --resolution 64 --max-sequence-length 16 --steps 4 --runs 1 "
    "--warmup 0": (
        "the Kontext run above is only checked: RUN is the fine-tuning example's run (test_kontext.py "
        "evaluates edit pairs)",
        "{}",
    ),
    "flux-cluster submit --system local --set train.benchmark=hf --set hf.model=work/hf/bert --set "
    "hf.task=text-classification --set hf.data=work/hf/reviews --set hf.seq_len=128 --set "
    "train.micro_batch_size=8 --set train.epochs=3 --set train.precision=amp-bf16 --set train.parallel=dp": (
        "tests/integration/test_hf_train.py submits bert's DataParallel run; here: checked, not run (the "
        "report below compares the three bert runs left)",
        DRY,
    ),
    ".venv/bin/python -m pytest tests/unit/launch/test_golden.py --update-golden": (
        "rewrites tests/golden/",
        None,
    ),
    "bash slurm/local-cluster.sh start|stop|status|env|purge": ("needs root and changes the machine", None),
    ".venv/bin/python benchmarks/cli_startup.py": ("a benchmark: minutes", None),
    ".venv/bin/python benchmarks/data_prep.py": ("a benchmark: minutes", None),
    ".venv/bin/python benchmarks/train_throughput.py": ("needs a GPU", None),
    ".venv/bin/python benchmarks/report.py": ("a benchmark: minutes", None),
}

EXIT_CODES: dict[str, int] = {
    "flux-cluster logs": 2,  # the latest run is a dry run: 'never submitted', one line
    "flux-cluster runs requeue": 2,  # the latest run is a dry run of --system local: 'only Slurm runs'
}
"""The exit code a command (as run) must end with, where it is not 0."""


@dataclass(frozen=True)
class Command:
    text: str
    """As the README prints it: continuation lines joined, the comment dropped, spaces single."""
    line: int


def readme_commands(text: str | None = None) -> list[Command]:
    """The commands of every ```bash block, in order."""
    commands, block, start, pending = [], False, 0, ""
    for number, line in enumerate((README.read_text() if text is None else text).splitlines(), 1):
        if line.startswith("```"):
            block = line.strip() == "```bash" if not block else False
            continue
        if not block:
            continue
        if not pending:
            start = number
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        words = shlex.split(pending, comments=True)
        pending = ""
        if words:
            commands.append(Command(" ".join(words), start))
    return commands


def to_run(command: Command) -> str | None:
    _why, instead = STAND_INS.get(command.text, ("", "{}"))
    return None if instead is None else instead.replace("{}", command.text)


def test_every_readme_command_has_a_run_or_a_listed_stand_in() -> None:
    """A README command that is not flux-cluster's must be listed (it cannot run here as it is); every
    flux-cluster command runs, as printed or as its stand-in; no entry is left over from an old README."""
    commands = readme_commands()
    assert len(commands) > 40
    printed = {c.text for c in commands}
    assert not set(STAND_INS) - printed, (
        f"stand-ins for commands the README no longer has: {set(STAND_INS) - printed}"
    )
    for command in commands:
        run = to_run(command)
        if command.text.split()[0] != "flux-cluster":
            assert command.text in STAND_INS, (
                f"README line {command.line}: {command.text!r}: no run, no stand-in"
            )
        if run is None:
            assert not command.text.startswith("flux-cluster"), f"README line {command.line}: never run"
            script = next(w for w in command.text.split() if "/" in w and w != ".venv/bin/python")
            if not script.startswith(".venv/"):  # the venv is made by set-up
                assert (ROOT / script).is_file(), f"README line {command.line}: {script} does not exist"
        else:
            assert run.startswith("flux-cluster "), (
                f"README line {command.line}: {run!r} is not a CLI command"
            )
    # the commands not run still name what exists: tools/dev.sh's subcommands, the cluster script's verbs
    dev = (ROOT / "tools" / "dev.sh").read_text()
    for sub in ("run", "test", "lint", "lock"):
        assert f"    {sub})" in dev
    assert "submit --system local" in dev  # what 'tools/dev.sh run' runs, and its stand-in does
    cluster = (ROOT / "slurm" / "local-cluster.sh").read_text()
    for verb in ("start", "stop", "status", "env", "purge"):
        assert re.search(rf"usage: .*[{{|]{verb}[|}}]", cluster), verb


def test_the_parser_reads_continuations_and_comments() -> None:
    text = "x\n```bash\nflux-cluster a \\\n    --b c   # note\n# only a comment\n```\n```yaml\nk: v\n```\n"
    assert readme_commands(text) == [Command("flux-cluster a --b c", 3)]


def test_the_readmes_debian_packages_are_the_ones_set_up_installs() -> None:
    """One list: tools/dev.sh's DEBIAN_PACKAGES and slurm/local-cluster.sh's PACKAGES, as the README
    names them."""
    readme = README.read_text().replace("\n", " ")
    for script, name in (("tools/dev.sh", "DEBIAN_PACKAGES"), ("slurm/local-cluster.sh", "PACKAGES")):
        found = re.search(rf"^{name}=\(([^)]*)\)", (ROOT / script).read_text(), re.M)
        assert found, f"{script}: no {name}=(...)"
        packages = " ".join(found.group(1).split())
        assert f"`{packages}`" in readme, f"README does not list {script}'s packages as `{packages}`"


def test_examples_write_under_the_ignored_work_folder() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "/work/" in ignored and "/runs/" in ignored
    for command in readme_commands():
        for word in shlex.split(command.text)[1:]:
            word = word.split("=", 1)[-1]  # --set KEY=PATH
            if word.startswith("-") or "/" not in word or word.startswith(("~", "/", ".venv", "registry")):
                continue
            first = word.split("/")[0]
            assert first in {"work", "runs", "tools", "tests", "benchmarks", "slurm"} or word.startswith(
                "runs/"
            ), f"README line {command.line}: {word} is written or read outside work/ and runs/"


def _scene(home: Path) -> None:
    """What the README's commands assume exists beyond what earlier commands made: an MLPerf results
    folder in the home directory, and a sweep of the README's name whose points have their answer."""
    with tarfile.open(SAMPLE) as archive:
        archive.extractall(home, filter="data")
    (root,) = [p for p in home.iterdir() if p.is_dir() and p.name.startswith("mlperf")]
    root.rename(home / "training_results_v5.1")
    (home / "one-prompt.txt").write_text("a red fox in the snow\n")
    from flux_cluster.launch.sweep import create_sweep
    from flux_cluster.launch.sweep_plan import SweepRequest
    from flux_cluster.sweepdir import SweepState

    request = SweepRequest("local", {"train.micro_batch_size": ["1", "2"]}, synthetic=True, name=SWEEP_NAME)
    folder, state = create_sweep(request)
    for point in state.points:
        point.status, point.error = "oom", "stand-in: made by tests/integration/test_readme.py, never run"
    state.save(folder)
    assert SweepState.load(folder).points[0].status == "oom"


def _finetune_run(cwd: Path) -> str:
    """The latest run `submit` ran (not one a --dry-run stand-in only prepared)."""
    from flux_cluster.rundir import RunRecord

    runs = sorted((cwd / "runs" / "finetune").iterdir())
    ran = [run for run in runs if (record := RunRecord.load(run)) and record.launcher != "dry-run"]
    return str(ran[-1].relative_to(cwd))


def test_every_readme_command_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """README order, one fresh folder and home directory: each command must exit as expected."""
    from flux_cluster.cli import app

    home = tmp_path / "home"
    home.mkdir()
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("HOME", str(home))
    for name in (
        "FLUX_CLUSTER_RUNS",
        "FLUX_CLUSTER_SYSTEMS",
        "FLUX_CLUSTER_IMAGE",
        "FLUX_CLUSTER_REGISTRY",
        "XDG_CACHE_HOME",  # the fresh home's ~/.cache, not the session's (tests/conftest.py)
    ):
        monkeypatch.delenv(name, raising=False)
    _scene(home)
    # The libraries' log handlers are made once, on the stderr of the moment: here, not inside one
    # command's captured (then closed) stream
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.get_logger("diffusers")
    transformers_logging.get_logger("transformers")
    runner = CliRunner()
    timings, failed = [], []
    for command in readme_commands():
        run = to_run(command)
        if run is None:
            continue
        if "runs/finetune/RUN" in run:  # the run folder `submit` printed
            run = run.replace("runs/finetune/RUN", _finetune_run(cwd))
        words = [os.path.expanduser(w) for w in shlex.split(run)[1:]]
        out = None
        if ">" in words:
            out = Path(words[words.index(">") + 1])
            words = words[: words.index(">")]
        started = time.monotonic()
        result = runner.invoke(app, words)
        timings.append((time.monotonic() - started, run))
        expected = EXIT_CODES.get(run, 0)
        where = f"README line {command.line}: {run}"
        if result.exit_code != expected or "Traceback" in result.output:
            at = max(result.output.find("Traceback") - 1000, 0)
            failed.append(
                f"{where}: exit {result.exit_code}, expected {expected}\n{result.output[at:][:3000]}"
            )
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(result.stdout)
    print(
        "slowest README commands:",
        *(f"{s:.1f}s {c}" for s, c in sorted(timings, reverse=True)[:8]),
        sep="\n  ",
    )
    assert not failed, "\n".join(failed)
    # what the examples wrote, they wrote under work/ and runs/
    assert sorted(p.name for p in cwd.iterdir()) == ["runs", "work"]
    assert json.loads((cwd / "work" / "scores.json").read_text())["groups"]
    assert (cwd / "work" / "evals" / "aws_p5.json").is_file() and (cwd / "work" / "report.html").is_file()
