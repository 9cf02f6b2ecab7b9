"""Images: Pillow decode with EXIF orientation, RGB conversion and a decompression-bomb guard."""

from __future__ import annotations

import warnings

from PIL import Image, ImageOps, UnidentifiedImageError

from gemma_embed.media import MAX_PIXELS

# Pillow's own default. Checked on the header, before any pixel is decoded.
MAX_PIXELS = Image.MAX_IMAGE_PIXELS or MAX_PIXELS


class ImageDecodeError(ValueError):
    pass


def decode_image(path: str, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """Return the upright RGB image; raise ImageDecodeError with a one-line reason."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                width, height = img.size
                if width * height > max_pixels:
                    raise ImageDecodeError(
                        f"{width}x{height} pixels exceeds the limit of {max_pixels} (decompression-bomb guard)"
                    )
                img.load()
                upright = ImageOps.exif_transpose(img)
                return upright.convert("RGB")
    except ImageDecodeError:
        raise
    except UnidentifiedImageError:
        raise ImageDecodeError("not a recognised image format") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageDecodeError(f"decompression-bomb guard: {exc}") from None
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ImageDecodeError(f"cannot decode image: {reason}") from None
    except (ValueError, SyntaxError) as exc:
        raise ImageDecodeError(f"cannot decode image: {exc}") from None
