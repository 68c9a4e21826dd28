"""Image items -> RGB PIL images at their own size, with bomb checks before decoding.

Images are converted to RGB (alpha dropped, no EXIF rotation) and NOT resized here: the vision
processing (`engine.media.vision`) alone resizes into the pixel window (SPEC section 6).

The declared dimensions (read from the header by `Image.open`, which decodes no pixels) are checked
against `limits.image_pixels` before `load()`; Pillow's own bomb guard (2x its global limit) is mapped
to the same reason. CPU only, blocking; thread-safe (no global Pillow setting is changed).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from engine.media.errors import bad_source, bomb, undecodable
from engine.media.limits import MediaLimits

IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")
"""Pillow decoders tried on image bytes; anything else is media_undecodable."""


def check_dimensions(width: int, height: int, max_pixels: int, max_aspect: float, kind: str) -> None:
    """Refuse empty images (undecodable), bombs (declared pixels above the cap) and extreme aspect ratios."""
    if width <= 0 or height <= 0:
        raise undecodable(f"{kind} has no pixels")
    if width * height > max_pixels:
        raise bomb(f"{kind} declares {width}x{height} pixels, more than {max_pixels}")
    if max(width, height) / min(width, height) > max_aspect:
        raise undecodable(f"{kind} aspect ratio is above {max_aspect:g}:1")


def finish_image(image: Image.Image) -> Image.Image:
    """Pillow's RGB conversion (alpha channels are dropped, not composited); nothing else."""
    return image if image.mode == "RGB" else image.convert("RGB")


def image_from_object(item: object, limits: MediaLimits) -> Image.Image:
    """Validate a Python-API image: a PIL image or an (H, W, 3) uint8 RGB array."""
    if isinstance(item, Image.Image):
        check_dimensions(item.width, item.height, limits.image_pixels, limits.max_aspect_ratio, "image")
        try:
            return finish_image(item)
        except (OSError, ValueError) as exc:
            raise undecodable("image cannot be converted to RGB") from exc
    array = np.asarray(item)
    if array.ndim != 3 or array.shape[2] != 3 or array.dtype != np.uint8:
        raise bad_source("image arrays must be (H, W, 3) uint8 RGB")
    check_dimensions(array.shape[1], array.shape[0], limits.image_pixels, limits.max_aspect_ratio, "image")
    return Image.fromarray(np.ascontiguousarray(array))


def decode_image(data: bytes, limits: MediaLimits) -> Image.Image:
    """Decode image bytes to an RGB image at its own size (first frame of animations).

    Raises `MediaError`: media_bomb (declared pixels above `limits.image_pixels`, before any pixel is
    decoded), media_undecodable (unknown format, wrong magic, truncated or corrupt data, extreme aspect).
    """
    try:
        # Pillow warns above its global limit and raises above twice it; both exceed our own cap.
        image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise bomb("image declares too many pixels") from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise undecodable("image format not recognised") from exc
    with image:
        check_dimensions(image.width, image.height, limits.image_pixels, limits.max_aspect_ratio, "image")
        try:
            image.seek(0)
            image.load()
            result = finish_image(image)
        except (OSError, ValueError, SyntaxError, EOFError) as exc:
            raise undecodable("image data is corrupt or truncated") from exc
        # Closing `image` invalidates its pixels, so never hand out the object itself.
        return result.copy() if result is image else result
