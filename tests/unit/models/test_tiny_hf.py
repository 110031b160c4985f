"""models tiny --kind bert|gpt2|vit (issue 30): tiny random-init Hugging Face models that the Auto classes
load offline, with tokenizers that split any English text and an image processor, as the hf workload loads
them."""

from pathlib import Path

import pytest

from flux_cluster.errors import FluxClusterError
from flux_cluster.models.tiny_hf import IMAGE_LABELS, IMAGE_SIZE, LABELS, write_tiny_hf

TEXT = "Hello, World! The café's 3rd review: 'superb' (10/10) — really?"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_hf")
    return {kind: write_tiny_hf(root / kind, kind=kind) for kind in ("bert", "gpt2", "vit")}  # type: ignore[arg-type]


def test_bert_loads_offline_as_a_sequence_classifier_with_its_tokenizer(models: dict[str, Path]) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(models["bert"], local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(models["bert"], local_files_only=True)
    assert type(tokenizer).__name__.startswith("BertTokenizer") and (models["bert"] / "vocab.txt").is_file()
    batch = tokenizer([TEXT, "ok"], padding=True, truncation=True, return_tensors="pt")
    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0])
    assert "[UNK]" not in tokens and tokens[:3] == ["[CLS]", "h", "##e"]  # lowercased, character pieces
    out = model(**batch, labels=torch.tensor([0, 1]))
    assert out.logits.shape == (2, len(LABELS)) and torch.isfinite(out.loss)
    assert model.config.id2label == dict(enumerate(LABELS))
    # common words and data synth-hf's are whole tokens, as in bert-base's vocabulary: a review's adjective
    # is one token to learn, not a dozen characters
    assert tokenizer.tokenize("The movie was superb, the plot felt clumsy!") == [
        *("the", "movie", "was", "superb", ",", "the", "plot", "felt", "clumsy", "!"),
    ]


def test_gpt2_loads_offline_as_a_causal_lm_whose_tokenizer_pads_and_round_trips(
    models: dict[str, Path],
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(models["gpt2"], local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(models["gpt2"], local_files_only=True)
    assert {"vocab.json", "merges.txt"} <= {p.name for p in models["gpt2"].iterdir()}
    assert tokenizer.pad_token == tokenizer.eos_token == "<|endoftext|>"
    batch = tokenizer([TEXT, "ok"], padding=True, return_tensors="pt")
    assert tokenizer.decode(batch["input_ids"][0]) == TEXT  # byte-level: any text, no unknown token
    out = model(**batch, labels=batch["input_ids"])
    assert out.logits.shape[-1] == len(tokenizer) and torch.isfinite(out.loss)


def test_vit_loads_offline_as_an_image_classifier_with_its_processor(models: dict[str, Path]) -> None:
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModelForImageClassification

    model = AutoModelForImageClassification.from_pretrained(models["vit"], local_files_only=True)
    processor = AutoImageProcessor.from_pretrained(models["vit"], local_files_only=True)
    pixels = processor([Image.new("RGB", (50, 40), "red")], return_tensors="pt")["pixel_values"]
    assert pixels.shape == (1, 3, IMAGE_SIZE, IMAGE_SIZE)
    assert model(pixel_values=pixels).logits.shape == (1, len(IMAGE_LABELS))


def test_the_same_seed_writes_the_same_weights_and_out_is_checked(
    models: dict[str, Path], tmp_path: Path
) -> None:
    again = write_tiny_hf(tmp_path / "again", kind="vit")
    weights = "model.safetensors"
    assert (again / weights).read_bytes() == (models["vit"] / weights).read_bytes()
    with pytest.raises(FluxClusterError, match="folder is not empty"):
        write_tiny_hf(again, kind="vit")
    with pytest.raises(FluxClusterError, match="expected one of bert, gpt2, vit"):
        write_tiny_hf(tmp_path / "x", kind="t5")  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists()
