"""The sample grid: a row per prompt, base | tuned, same prompt and seed."""

import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL.Image import Image

LABEL_HEIGHT = 14
MAX_ROWS = 16
"""More prompts than this are timed and scored, but only the first ones are drawn."""
THUMBNAIL = 256
"""The grid's images are at most this wide and high: the full-size ones are kept beside it (images_dir)."""
COLORS = 256
"""The grid is a palette PNG: a grid of 16 rows stays near 1 MiB (full-colour 512 px samples made 9.5 MB,
past what the report shows)."""


def grid_png(columns: Sequence[tuple[str, Sequence["Image"]]], prompts: Sequence[str]) -> bytes:
    """PNG bytes of a grid whose columns are (title, one image per prompt); each row is captioned with its
    prompt, cut to the row's width."""
    from PIL import Image, ImageDraw, ImageFont

    rows = min(len(prompts), MAX_ROWS)
    width, height = columns[0][1][0].size
    scale = min(1.0, THUMBNAIL / max(width, height))
    width, height = max(1, round(width * scale)), max(1, round(height * scale))
    font = ImageFont.load_default()
    canvas = Image.new("RGB", (width * len(columns), LABEL_HEIGHT + rows * (LABEL_HEIGHT + height)), "white")
    draw = ImageDraw.Draw(canvas)
    for c, (title, _) in enumerate(columns):
        draw.text((c * width + 2, 1), title, fill="black", font=font)
    for r in range(rows):
        top = LABEL_HEIGHT + r * (LABEL_HEIGHT + height)
        # ASCII: Pillow's fallback bitmap font has no other glyphs
        # at most a line's worth before measuring: trimming measures once per character cut
        caption = " ".join(prompts[r][:400].split()).encode("ascii", "replace").decode()
        while len(caption) > 3 and draw.textlength(caption, font=font) > canvas.width - 4:
            caption = caption[: len(caption) - 4] + "..."
        draw.text((2, top + 1), caption, fill="dimgray", font=font)
        for c, (_, images) in enumerate(columns):
            thumbnail = images[r].convert("RGB").resize((width, height), Image.Resampling.LANCZOS)
            canvas.paste(thumbnail, (c * width, top + LABEL_HEIGHT))
    out = io.BytesIO()
    canvas.quantize(COLORS, dither=Image.Dither.FLOYDSTEINBERG).save(out, format="PNG", optimize=True)
    return out.getvalue()


def images_dir(grid_name: str) -> str:
    """The folder beside a grid holding every prompt's full-size images (eval_grid.png -> eval_images/)."""
    return grid_name.removesuffix("_grid.png") + "_images"


def save_images(columns: Sequence[tuple[str, Sequence["Image"]]], folder: Path) -> None:
    """Every prompt's image of each column at full size: p000_base.png, p000_tuned.png, ..."""
    folder.mkdir(parents=True, exist_ok=True)
    for title, images in columns:
        for p, image in enumerate(images):
            image.save(folder / f"p{p:03d}_{title}.png", format="PNG")
