"""Evaluating an edit run (FLUX Kontext fine-tuned on edit pairs): the held-out pairs to edit.

A run whose dataset ``data encode`` made from an edit-pair folder is evaluated on the pairs of its val
split (never trained on): each control image is edited with its prompt by ``FluxKontextPipeline``, base and
fine-tuned, and the grid shows control | base edit | fine-tuned edit. The pairs are found again in the
folder the dataset was encoded from (its flux-encoded.json names it), by the names the shards record.
"""

import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from flux_cluster.errors import FluxClusterError
from flux_cluster.evaluate.target import Target
from flux_cluster.outside import OutsideFileError, parse_json, read_json
from flux_cluster.safe_text import printable

if TYPE_CHECKING:
    from PIL.Image import Image

MAX_EDITS = 16
"""Held-out pairs edited at most (each --runs times per model): the grid's rows."""


@dataclass(frozen=True)
class Edits:
    names: list[str]
    """The targets' names in the folder (the samples' keys)."""
    prompts: list[str]
    controls: list["Image"]
    """Each control image, RGB, resolution square (as encoded for training)."""


def _encode_summary(data_root: Path) -> dict | None:
    from flux_cluster.data.prep.encode import SUMMARY_FILE

    try:
        summary = read_json(data_root / SUMMARY_FILE)
    except OutsideFileError:
        return None
    return summary if isinstance(summary, dict) else None


_MAX_SAMPLE_JSON = 64 * 1024
"""A sample's json member holds its key and a few numbers: a few hundred bytes."""


def val_keys(data_root: Path) -> list[str]:
    """The names of the val samples, in shard order, from the shards' json members (each bounded, its
    "key" a string: a damaged or crafted shard is one line naming it)."""
    keys = []
    for shard in sorted((data_root / "val").glob("*.tar")):
        where = printable(str(shard))
        try:
            with tarfile.open(shard) as archive:
                for member in archive:
                    if not member.name.endswith(".json"):
                        continue
                    handle = archive.extractfile(member) if member.size <= _MAX_SAMPLE_JSON else None
                    sample = parse_json(handle.read(), shard) if handle else None
                    key = sample.get("key") if isinstance(sample, dict) else None
                    if not isinstance(key, str):
                        name = printable(member.name[:200])
                        raise FluxClusterError(
                            f"{where}: {name}: expected a sample's json (at most {_MAX_SAMPLE_JSON:,} bytes) "
                            'with its "key" string'
                        )
                    keys.append(key)
        except OutsideFileError as exc:
            raise FluxClusterError(printable(str(exc))) from None
        except (tarfile.TarError, OSError, ValueError) as exc:
            raise FluxClusterError(f"{where}: unreadable val shard ({printable(str(exc)[:200])})") from None
    return keys


def edit_inputs(target: Target, resolution: int) -> Edits | None:
    """The held-out pairs of an edit run, None for any other target (a text-to-image run, weights or a
    pipeline alone)."""
    from flux_cluster.data.prep.edit_pairs import EditPair, is_edit_layout, scan_images
    from flux_cluster.data.prep.image_folder import ImageFolderError, load_image

    if target.data_root is None:
        return None
    summary = _encode_summary(target.data_root)
    if summary is None or not is_edit_layout(str(summary.get("layout"))):
        return None
    folder = Path(str(summary.get("images")))
    where = printable(f"{target.data_root}: edit pairs encoded from {folder}")
    try:
        records = {r.name: r for r in scan_images(folder).records if isinstance(r, EditPair)}
    except ImageFolderError as exc:
        raise FluxClusterError(f"{where}: cannot read the folder again ({exc})") from None
    names = val_keys(target.data_root)[:MAX_EDITS]
    missing = [name for name in names if name not in records]
    if missing or not names:
        first = f" (no pair {printable(missing[0][:200])})" if missing else " (no val pairs)"
        raise FluxClusterError(f"{where}: the held-out pairs are not all there any more{first}")
    try:
        controls = [load_image(records[n].control, resolution, folder) for n in names]
    except ImageFolderError as exc:
        raise FluxClusterError(f"{where}: {exc}") from None
    return Edits(names, [records[n].caption for n in names], controls)
