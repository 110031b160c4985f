"""Demo images: a small folder of generated, captioned pictures in any of the layouts ``data encode`` reads,
so the fine-tuning example runs without a dataset (``flux-cluster data demo-images``), and tests write
each layout."""

import json
from pathlib import Path

from flux_cluster.errors import FluxClusterError

_FOLDER_COLOURS = (
    ("red", (220, 30, 30)),
    ("green", (30, 200, 60)),
    ("blue", (30, 60, 220)),
    ("yellow", (230, 210, 40)),
    ("purple", (140, 40, 180)),
    ("orange", (240, 140, 20)),
    ("cyan", (40, 200, 210)),
    ("grey", (128, 128, 128)),
)


def write_image_folder(root: Path, layout: str, n: int, size: tuple[int, int] = (48, 40)) -> list[str]:
    """n captioned images in one of flux_cluster.data.prep.image_folder's layouts ("metadata.json" with imgs/,
    "metadata.jsonl", "captions.txt"), PNG, JPEG and WebP in turn; each a solid colour with a darker
    band so it is not flat, captioned "a red square 3". Returns the images' names (paths relative to
    root), sorted: the names scan_folder gives them."""
    from PIL import Image, ImageDraw

    if layout not in ("metadata.json", "metadata.jsonl", "captions.txt"):
        raise FluxClusterError(f"--layout {layout!r}: expected metadata.json, metadata.jsonl or captions.txt")
    root.mkdir(parents=True, exist_ok=True)
    folder = root / "imgs" if layout == "metadata.json" else root
    folder.mkdir(exist_ok=True)
    records = []
    for i in range(n):
        colour, rgb = _FOLDER_COLOURS[i % len(_FOLDER_COLOURS)]
        image = Image.new("RGB", size, rgb)
        ImageDraw.Draw(image).rectangle((0, 0, size[0] - 1, size[1] // 4), fill=tuple(c // 2 for c in rgb))
        file = f"img_{i:03d}.{('png', 'jpg', 'webp')[i % 3]}"
        image.save(folder / file, quality=95)
        records.append((file, f"a {colour} square {i}"))
    if layout == "metadata.json":
        entries = [{"file_name": file, "text": text} for file, text in records]
        (root / "metadata.json").write_text(json.dumps(entries, indent=1))
    elif layout == "metadata.jsonl":
        lines = [json.dumps({"file_name": file, "text": text}) for file, text in records]
        (root / "metadata.jsonl").write_text("".join(line + "\n" for line in lines))
    elif layout == "captions.txt":
        for file, text in records:
            (root / file).with_suffix(".txt").write_text(text + "\n")
    else:
        raise FluxClusterError(f"--layout {layout!r}: expected metadata.json, metadata.jsonl or captions.txt")
    prefix = "imgs/" if layout == "metadata.json" else ""
    return sorted(prefix + file for file, _ in records)
