"""The sample grid: a row per prompt, base | tuned, same prompt and seed."""

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from PIL.Image import Image

LABEL_HEIGHT = 14
MAX_ROWS = 16
"""More prompts than this are timed and scored, but only the first ones are drawn."""


def grid_png(columns: Sequence[tuple[str, Sequence["Image"]]], prompts: Sequence[str]) -> bytes:
    """PNG bytes of a grid whose columns are (title, one image per prompt); each row is captioned with its
    prompt, cut to the row's width."""
    from PIL import Image, ImageDraw, ImageFont

    rows = min(len(prompts), MAX_ROWS)
    width, height = columns[0][1][0].size
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
            canvas.paste(images[r].convert("RGB").resize((width, height)), (c * width, top + LABEL_HEIGHT))
    out = io.BytesIO()
    canvas.save(out, format="PNG")
    return out.getvalue()
