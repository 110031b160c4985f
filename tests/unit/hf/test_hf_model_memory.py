"""An hf model too big to build is said to be out of memory, not to have weights that do not fit."""

import json
from pathlib import Path

import pytest

from flux_cluster.errors import FluxClusterError
from flux_cluster.hf.model import load_model
from flux_cluster.models.tiny_hf import write_tiny_hf


def test_an_allocation_failure_is_reported_as_one_not_as_mismatched_weights(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A wider head than the file's (num_labels) re-makes mismatched layers: a 2**40-wide one fails to
    # allocate (128 TiB: refused at once by the CPU allocator) before anything is held.
    folder = write_tiny_hf(tmp_path / "bert", kind="bert", seed=0)
    config = json.loads((folder / "config.json").read_text()) | {"intermediate_size": 2**40}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(FluxClusterError) as caught:  # refused from the files' sizes, nothing allocated
        load_model(folder, "text-classification", num_labels=3)
    assert "describes a bert model of" in str(caught.value)
    # past that check (a config whose weights the files do hold can still be too big to build here)
    monkeypatch.setattr("flux_cluster.hf.model.check_fits_weights", lambda *args, **kwargs: None)
    with pytest.raises(FluxClusterError) as caught:
        load_model(folder, "text-classification", num_labels=3)
    message = str(caught.value)
    assert "out of memory building the model its config.json gives" in message, message
    assert "do not have the shapes" not in message and "\n" not in message


def test_a_head_too_wide_for_the_model_blames_the_datas_labels_not_config_json(tmp_path: Path) -> None:
    """200,000 distinct labels (a free-text column) widen the head past what the files hold: the line names
    hf.data and the label count; config.json itself is as saved. A handful of labels loads."""
    folder = write_tiny_hf(tmp_path / "bert", kind="bert", seed=0)
    with pytest.raises(FluxClusterError) as caught:
        load_model(folder, "text-classification", num_labels=200_000)
    message = str(caught.value)
    assert message.startswith("hf.data: 200,000 distinct labels make a classification head"), message
    assert "config.json" not in message and "\n" not in message
    assert load_model(folder, "text-classification", num_labels=5).config.num_labels == 5
