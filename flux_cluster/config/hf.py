"""The ``hf`` section of a system config: which Hugging Face model, task and data the ``hf`` workload
(``--set train.benchmark=hf``, configs/benchmarks/hf.yaml) fine-tunes. Only that workload reads it.

The rest of a run's settings come from the ``train`` section as for every workload: ``train.mode``
(finetune | lora), ``train.parallel`` (ddp | dp | fsdp), ``train.precision`` (fp32 | amp-bf16 | amp-fp16),
``train.epochs``, ``train.micro_batch_size``, ``train.global_batch_size``, ``train.learning_rate``,
``train.lora_rank``/``lora_alpha``/``lora_targets``, ``train.log_every_steps``, ``train.tensorboard``,
``train.checkpoint_every_steps``/``_every_minutes``/``keep_checkpoints``/``checkpoint_dir`` (resume).
Model hubs are never contacted: the model folder and the data are local.
"""

import os
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, Field

from flux_cluster.config.section import SECTION
from flux_cluster.errors import FluxClusterError
from flux_cluster.outside import MIB, OutsideFileError, read_json_object
from flux_cluster.safe_text import printable

HF_BENCHMARK = "hf"
"""The train.benchmark name of the workload (configs/benchmarks/hf.yaml)."""
HfTask = Literal["text-classification", "causal-lm", "image-classification"]
HF_TASKS: tuple[str, ...] = get_args(HfTask)
ARCHITECTURE_TASKS: tuple[tuple[str, HfTask], ...] = (
    ("ForSequenceClassification", "text-classification"),
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForImageClassification", "image-classification"),
)
"""How a config.json architecture's name ends -> the hf.task it implies (BertForSequenceClassification,
GPT2LMHeadModel, LlamaForCausalLM, ViTForImageClassification); others (BertForMaskedLM, BertModel) imply
none."""
MODEL_CONFIG_LIMIT = 4 * MIB
"""A model's config.json is a few KiB; more is not one."""
SYNTHETIC = "synthetic"
"""hf.data's value for random inputs of the model's own shapes (vocabulary, labels, image size)."""


class HfConfig(BaseModel):
    model_config = SECTION

    model: str | None = None
    """Local model folder (config.json and weights, as save_pretrained writes it, with its tokenizer or
    image processor), loaded with AutoModelFor<task> and local_files_only. Needed by train.benchmark hf."""
    task: HfTask | None = None
    """'text-classification' (AutoModelForSequenceClassification), 'causal-lm' (AutoModelForCausalLM) or
    'image-classification' (AutoModelForImageClassification). Unset: what the architecture named in
    hf.model's config.json implies (model_task), resolved with the config, so a run's config.yaml records
    it."""
    data: str | None = None
    """Local data: a folder saved by datasets' save_to_disk (a Dataset or a DatasetDict with train and
    optionally validation/test splits), a .jsonl/.json/.csv/.parquet file or a folder of them (train*/val*/
    test* files name the splits), an imagefolder (one subfolder per class, or train/ and val/ of those),
    or 'synthetic': random inputs of the model's shapes. Needed by train.benchmark hf."""
    seq_len: int = Field(default=128, ge=8, le=1_000_000)
    """Text tasks: tokens per sample (truncated or padded to it; causal-lm packs the text into blocks of
    it). The seed's --seq_len."""
    max_samples: int | None = Field(default=None, ge=1)
    """Use at most this many train samples (and as many val samples, at most); None: all. The seed's
    --max_samples."""
    synthetic_samples: int = Field(default=256, ge=1)
    """hf.data synthetic: train samples to generate (val: an eighth of them, at least one batch)."""
    val_fraction: float = Field(default=0.1, ge=0, lt=1)
    """Share of the train data held out for evaluation when the data has no validation split; 0: no
    evaluation."""
    text_column: str = "text"
    """Text column of a text dataset."""
    label_column: str = "label"
    """Label column of a classification dataset (integers, or names mapped to integers in sorted order)."""
    image_column: str = "image"
    """Image column of a save_to_disk or Parquet image dataset (imagefolders need none)."""


def model_task(folder: str | os.PathLike[str]) -> tuple[HfTask, str] | None:
    """(task, architecture) that folder/config.json's ``architectures`` imply; None when there is no
    config.json here (a container's path: hf.task is then needed); one line when it is unreadable or its
    architectures imply no task, or several. Bounded read; a hub snapshot's link is followed to its blob."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    try:
        config = read_json_object(os.path.realpath(path), MODEL_CONFIG_LIMIT)
    except OutsideFileError as exc:
        reason = str(exc).removeprefix(f"{os.path.realpath(path)}: ")
        raise FluxClusterError(f"hf.task: not set, and {path} is not readable ({reason})") from None
    named = config.get("architectures")
    names = [n for n in named if isinstance(n, str)] if isinstance(named, list) else []
    found = {(task, name) for name in names for end, task in ARCHITECTURE_TASKS if name.endswith(end)}
    if len({task for task, _ in found}) == 1:
        return min(found, key=lambda pair: names.index(pair[1]))
    shown = ", ".join(printable(n)[:80] for n in names[:4]) or "no architecture"
    implied = "several tasks" if found else "no task"
    raise FluxClusterError(
        f"hf.task: {path} names {shown}, which implies {implied}: set hf.task to one of {', '.join(HF_TASKS)}"
    )


def with_model_task(hf: "HfConfig", benchmark: str, sources: dict[str, str]) -> "HfConfig":
    """The hf workload's hf.task, when unset, from the architecture hf.model's config.json names (its
    source recorded in ``sources``)."""
    if benchmark != HF_BENCHMARK or hf.task is not None or hf.model is None:
        return hf
    found = model_task(hf.model)
    if found is None:  # not here (a container's path): resolve_training asks for hf.task
        return hf
    task, architecture = found
    sources["hf.task"] = f"{Path(hf.model) / 'config.json'} ({architecture})"
    return hf.model_copy(update={"task": task})
