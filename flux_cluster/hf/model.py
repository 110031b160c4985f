"""The hf workload's model: AutoModelFor<task> and its tokenizer or image processor from a local folder
(local_files_only: no hub), LoRA adapters through peft with targets checked against the model."""

from pathlib import Path
from typing import Any

import torch

from flux_cluster.errors import FluxClusterError, allocation_failed, first_line
from flux_cluster.hf.inputs import check_fits_weights, check_loaded, check_model_folder
from flux_cluster.safe_text import printable

AUTO_CLASSES = {
    "text-classification": "AutoModelForSequenceClassification",
    "causal-lm": "AutoModelForCausalLM",
    "image-classification": "AutoModelForImageClassification",
}
TARGET_FALLBACK = ("query", "value", "q_proj", "v_proj", "q_lin", "v_lin", "c_attn", "qkv")
"""Attention projections tried, in order, for an architecture peft has no default targets for (ViT)."""
HEADS = ("classifier", "score")
"""Classification heads: new weights, so LoRA trains them whole (peft modules_to_save)."""


def _bad_folder(path: Path, task: str, exc: BaseException) -> FluxClusterError:
    first = first_line(exc)
    beside = "image processor" if task == "image-classification" else "tokenizer"
    return FluxClusterError(
        f"hf.model: {printable(str(path))}: expected a local {AUTO_CLASSES[task]} folder (config.json, "
        f"weights and its {beside}, as save_pretrained writes): {first}"
    )


def load_model(path: Path, task: str, num_labels: int | None = None) -> torch.nn.Module:
    """The model in fp32 (AMP casts in compute). A classification head with fewer labels than the data
    has is re-made with num_labels (the new head is trained from scratch, as fine-tuning does). The folder
    is checked first (hf/inputs.py: no custom code, bounded files, safetensors headers); a config.json that
    describes more weights than the folder holds is refused before anything is allocated, and a model most
    of whose weights were not in the files after loading (weights of another architecture) too."""
    import transformers

    if not (path / "config.json").exists():
        raise _bad_folder(path, task, FileNotFoundError("no config.json"))
    folder = check_model_folder(path)
    auto = getattr(transformers, AUTO_CLASSES[task])
    kwargs: dict[str, Any] = {"local_files_only": True, "dtype": torch.float32, "trust_remote_code": False}
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        check_fits_weights(folder, auto, config)  # the model as its files were saved
        if num_labels is not None and config.num_labels < num_labels:
            config.num_labels = num_labels
            kwargs["ignore_mismatched_sizes"] = True
            check_fits_weights(folder, auto, config, labels=num_labels)  # with the head the data asks for
        model, info = auto.from_pretrained(path, config=config, output_loading_info=True, **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _bad_folder(path, task, exc) from None
    except (RuntimeError, MemoryError) as exc:  # transformers' size mismatch (its report goes to the log)
        if allocation_failed(exc):  # not a file that does not fit: the model config.json gives is too big
            raise FluxClusterError(
                f"hf.model: {printable(str(path))}: out of memory building the model its config.json gives "
                f"({first_line(exc)})"
            ) from None
        raise FluxClusterError(
            f"hf.model: {printable(str(path))}: the weights do not have the shapes config.json gives; "
            f"expected the config.json saved with them ({first_line(exc)})"
        ) from None
    check_loaded(folder, model, info)
    return model


def match_padding(model: torch.nn.Module, pad_token_id: int | None) -> None:
    """The model pads with its tokenizer's pad token (synthetic data: its end of text): GPT-2-like models
    have none in their config, and their sequence classification refuses batches of more than one."""
    config = getattr(model, "config", None)
    if config is not None and pad_token_id is not None and getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = pad_token_id


def load_processor(path: Path, task: str) -> Any:
    """The tokenizer (text tasks) or image processor saved beside the model."""
    import transformers

    if not (path / "config.json").exists():
        raise _bad_folder(path, task, FileNotFoundError("no config.json"))
    check_model_folder(path)
    auto = transformers.AutoImageProcessor if task == "image-classification" else transformers.AutoTokenizer
    try:
        return auto.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _bad_folder(path, task, exc) from None


def leaf_names(model: torch.nn.Module) -> set[str]:
    """The last component of every module's name (what peft's target_modules match)."""
    return {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name}


def lora_targets(model: torch.nn.Module, wanted: list[str]) -> list[str]:
    """The modules that get adapters: wanted checked against the model, or (wanted empty) peft's default
    targets of the architecture, else the attention projections found by name. One line naming the
    modules that exist when none match."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    names = leaf_names(model)
    linear = linear_names(model)
    if wanted:
        wanted = [printable(t) for t in wanted]
        missing = [t for t in wanted if t.rsplit(".", 1)[-1] not in names]
        if missing:
            raise FluxClusterError(
                f"train.lora_targets: {', '.join(missing)} not in the model "
                f"({type(model).__name__}); its linear modules: {', '.join(linear)}"
            )
        # the head is trained whole (modules_to_save): peft refuses it as a target too, with a traceback
        heads = [t for t in wanted if t.rsplit(".", 1)[-1] in HEADS]
        if heads:
            raise FluxClusterError(
                f"train.lora_targets: {', '.join(heads)} is the classification head of the model "
                f"({type(model).__name__}), trained whole without an adapter; expected some of its other "
                f"linear modules: {', '.join(linear)}"
            )
        # present but no Linear/Conv1D (a LayerNorm, a whole block): peft would refuse with a traceback
        other = [t for t in wanted if t.rsplit(".", 1)[-1] not in linear]
        if other:
            raise FluxClusterError(
                f"train.lora_targets: {', '.join(other)} in the model ({type(model).__name__}) but not "
                f"linear; expected some of its linear modules: {', '.join(linear)}"
            )
        return wanted
    model_type = getattr(getattr(model, "config", None), "model_type", "")
    default = DEFAULTS.get(model_type) or [t for t in TARGET_FALLBACK if t in names]
    found = [t for t in default if t in names]
    if not found:
        raise FluxClusterError(
            f"train.lora_targets: no default for {model_type or type(model).__name__}; set it to some of "
            f"its linear modules: {', '.join(linear)}"
        )
    return found


def linear_names(model: torch.nn.Module) -> list[str]:
    """The leaf names of the model's modules an adapter can go on (Linear, GPT-2's Conv1D), heads aside."""
    return sorted(
        {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if _adaptable(m) and n} - set(HEADS)
    )


def _adaptable(module: torch.nn.Module) -> bool:
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, torch.nn.Linear | Conv1D)


def add_lora(model: torch.nn.Module, targets: list[str], rank: int, alpha: float) -> torch.nn.Module:
    """peft LoRA adapters on targets (the rest frozen); a classification head is trained whole."""
    from peft import LoraConfig, get_peft_model
    from transformers.pytorch_utils import Conv1D

    heads = [h for h in HEADS if h in leaf_names(model)]
    # GPT-2's projections are Conv1D: weights stored (in, out)
    transposed = any(
        isinstance(m, Conv1D) and n.rsplit(".", 1)[-1] in targets for n, m in model.named_modules()
    )
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=0.0,
        target_modules=targets,
        modules_to_save=heads or None,
        fan_in_fan_out=transposed,
    )
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # peft's own refusals (NoMatchingPeftModuleError and others)
        raise FluxClusterError(
            f"train.lora_targets: {', '.join(targets)}: peft cannot adapt them ({first_line(exc)}); "
            f"expected some of the model's linear modules: {', '.join(linear_names(model))}"
        ) from None
