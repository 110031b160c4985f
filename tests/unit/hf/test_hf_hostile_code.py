"""No model folder's code runs (issue 42 item 1), beyond the hf loader (test_hf_hostile_model.py): the
CLIP folder evaluate scores with is loaded with trust_remote_code=False, and no rank has a stdin to
answer transformers' "run the custom code? [y/N]" with: not a local run's job script, not torchrun's
ranks started by hand."""

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from flux_cluster.errors import FluxClusterError


def test_a_clip_folder_with_custom_processor_code_runs_nothing_when_stdin_says_yes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import CLIPConfig, CLIPModel

    from flux_cluster.evaluate.clip import ClipScorer

    tiny = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = CLIPConfig(
        text_config={**tiny, "vocab_size": 50}, vision_config={**tiny, "image_size": 8, "patch_size": 4}
    )
    folder = tmp_path / "clip"
    CLIPModel(config).save_pretrained(folder)
    marker = tmp_path / "ran"
    (folder / "evil.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n")
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "EvilProcessor",
                "auto_map": {"AutoImageProcessor": "evil.EvilProcessor"},
            }
        )
    )
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n" * 8))
    with pytest.raises(FluxClusterError) as error:
        ClipScorer.load(folder, tmp_path, torch.device("cpu"))
    assert not marker.exists(), "the folder's code ran"
    assert str(error.value).startswith(f"{folder}: cannot load a CLIP model") and "\n" not in str(error.value)


@contextmanager
def _stdin_says(text: str) -> Iterator[None]:
    """This process's file descriptor 0 reads text (what a child started without stdin= inherits)."""
    read, write = os.pipe()
    os.write(write, text.encode())
    os.close(write)
    saved = os.dup(0)
    os.dup2(read, 0)
    os.close(read)
    try:
        yield
    finally:
        os.dup2(saved, 0)
        os.close(saved)


def test_a_local_runs_job_script_reads_no_stdin(tmp_path: Path) -> None:
    from flux_cluster.launch.local_runner import run_local

    script = tmp_path / "job.sh"
    script.write_text('read -r answer || true\necho "answer=[${answer:-}]"\n')
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with _stdin_says("y\n"):
        assert run_local(script, run_dir, echo=False) == 0
    from flux_cluster.rundir import local_log

    assert "answer=[]" in local_log(run_dir).read_text()


def test_torchrun_and_its_ranks_read_no_stdin() -> None:
    """The local launcher's first step (a job script run by hand in a terminal, or fed by a pipe)."""
    code = (
        "import sys; from flux_cluster.jobs.local_launch import no_stdin\n"
        "no_stdin(); print(repr(sys.stdin.read()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], input="y\n", capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.strip() == "''", done.stderr[-2000:]
