"""Demo images: a small folder of generated, captioned pictures in any of the layouts ``data encode`` reads,
so the fine-tuning example runs without a dataset (``flux-cluster data demo-images``), and tests write
each layout."""

import json
from pathlib import Path

from flux_cluster.errors import FluxClusterError

DEMO_EDIT_LAYOUTS = ("edit-pairs", "edit-pairs.jsonl")
"""Edit pairs (flux_cluster.data.prep.edit_pairs): control_images/ + training_images/, or a metadata.jsonl
with control_file_name."""

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

    if layout in DEMO_EDIT_LAYOUTS:
        return write_edit_pairs(root, layout, n, size)
    if layout not in ("metadata.json", "metadata.jsonl", "captions.txt"):
        raise FluxClusterError(
            f"--layout {layout!r}: expected metadata.json, metadata.jsonl, captions.txt, "
            f"{' or '.join(DEMO_EDIT_LAYOUTS)}"
        )
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


def write_edit_pairs(root: Path, layout: str, n: int, size: tuple[int, int] = (48, 40)) -> list[str]:
    """n edit pairs: a control (write_image_folder's picture, JPEG), its target (the picture flipped upside
    down, PNG) and the prompt "turn the red square 3 upside down"; "edit-pairs": control_images/ and
    training_images/ with NAME.txt, "edit-pairs.jsonl": a metadata.jsonl in the folder. Returns the targets'
    names (the samples' keys), sorted."""
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    for folder in ("control_images", "training_images"):
        (root / folder).mkdir(exist_ok=True)
    pictures = root / ".pictures"
    names = write_image_folder(pictures, "captions.txt", n, size)
    records = []
    for i, name in enumerate(names):
        stem = f"pair_{i:03d}"
        with Image.open(pictures / name) as picture:
            picture.convert("RGB").save(root / "control_images" / f"{stem}.jpg", quality=95)
            picture.convert("RGB").rotate(180).save(root / "training_images" / f"{stem}.png")
        caption = (pictures / name).with_suffix(".txt").read_text().strip()
        records.append((stem, f"turn the {caption.removeprefix('a ')} upside down"))
    for file in pictures.iterdir():
        file.unlink()
    pictures.rmdir()
    if layout == "edit-pairs":
        for stem, text in records:
            (root / "training_images" / f"{stem}.txt").write_text(text + "\n")
    else:
        paths = [
            (f"control_images/{stem}.jpg", f"training_images/{stem}.png", text) for stem, text in records
        ]
        lines = [json.dumps({"control_file_name": c, "file_name": f, "text": t}) for c, f, t in paths]
        (root / "metadata.jsonl").write_text("".join(line + "\n" for line in lines))
    return sorted(f"training_images/{stem}.png" for stem, _ in records)
