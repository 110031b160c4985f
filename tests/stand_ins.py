"""Recording stand-ins for cluster tools (srun, scontrol, docker, ...), to execute rendered job scripts
here. They record their argv and follow optional rules, so tests can make a step fail, take time, or
leave a file behind (as ranks do). They are a harness for the script's own logic; the real Slurm path
is tested in test_slurm.py."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from flux_cluster.config import SystemConfig
from flux_cluster.launch.plan import make_plan
from flux_cluster.launch.render import render_script

TOOLS = ["srun", "scontrol", "sinfo", "docker", "podman", "python3", "python", "sudo"]

# Rules (JSON in $STAND_IN_RULES): the first whose "match" is in the joined argv applies:
# {"match": str, "exit": int, "sleep": seconds, "touch": path}
RECORDER = """#!{python}
import json, os, sys, time
argv = [os.path.basename(sys.argv[0])] + sys.argv[1:]
with open(os.environ["RECORD_FILE"], "a") as out:
    probe = os.environ.get(os.environ.get("PROBE_VAR_NAME") or "-")
    out.write(json.dumps({"argv": argv, "probe": probe}) + "\\n")
joined = " ".join(argv)
for rule in json.loads(os.environ.get("STAND_IN_RULES") or "[]"):
    if rule["match"] in joined:
        time.sleep(rule.get("sleep", 0))
        if rule.get("touch"):
            open(rule["touch"], "w").close()
        sys.exit(rule.get("exit", 0))
"""


def install(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in TOOLS:
        path = bin_dir / tool
        path.write_text(RECORDER.replace("{python}", sys.executable))  # not via PATH: python3 is a stand-in
        path.chmod(0o755)


def render_case(config: SystemConfig, case: Path, job: str = "train") -> Path:
    plan = make_plan(config, job, case / "run", "x", 7)
    plan = type(plan)(**{**plan.__dict__, "python_fallback": "python3"})
    script = case / "job.sh"
    script.write_text(render_script(plan))
    return script


def start(
    script: Path,
    bin_dir: Path,
    rules: list[dict[str, Any]] = (),
    probe_var: str = "",
    array_task: str | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[str]:
    """Run the script as Slurm would start it (job 42 on one node); env adds or overrides variables."""
    slurm_env = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "RECORD_FILE": str(script.parent / "record.jsonl"),
        "HOME": str(script.parent),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_JOB_NUM_NODES": "1",
        "PROBE_VAR_NAME": probe_var,
        "STAND_IN_RULES": json.dumps(list(rules)),
    }
    if array_task is not None:
        slurm_env["SLURM_ARRAY_TASK_ID"] = array_task
    return subprocess.Popen(
        ["bash", str(script)],
        cwd=script.parent,
        env={**slurm_env, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def calls(case: Path) -> list[dict[str, Any]]:
    record = case / "record.jsonl"
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def run(script: Path, bin_dir: Path, **kwargs: Any) -> tuple[int, str]:
    process = start(script, bin_dir, **kwargs)
    output, _ = process.communicate(timeout=60)
    return process.returncode, output
