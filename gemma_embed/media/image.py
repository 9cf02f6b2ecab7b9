"""Images: Pillow decode of the first frame, EXIF orientation, transformers' own RGB conversion, and a
decompression-bomb guard.

The conversion to RGB is transformers' `image_transforms.convert_to_rgb`, the function its image processors
(torchvision and PIL backends alike, `do_convert_rgb=True` in Gemma 4's) apply to a PIL image: an image with an
alpha band or a `transparency` entry (RGBA, LA, PA, P or L with tRNS, and LAB, whose "A" band it counts) is
composited onto white, every other mode goes through Pillow's `convert("RGB")` (CMYK, 1, I;16 and I clipped to
0..255, F, YCbCr, ...). Calling that function, not a copy of it, keeps the two equal as transformers changes.
An RGB image without transparency is the one case it leaves as it is (`convert("RGB")` of RGB is a plain copy):
that image is returned without the round trip, which held four copies of the pixels at once (the decode alone
peaked at 18 bytes a pixel, now 8; with the processor's own copies 14: bench/MEMORY.md).
(`transformers.image_utils.load_image`, used when a processor is handed a file path, converts with a plain
`convert("RGB")` instead, which drops alpha without compositing; the processor's conversion is the one applied
to the image itself, and the one the tests hold this decoder to.)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from gemma_embed import capture
from gemma_embed.media import MAX_PIXELS, as_file
from gemma_embed.memory import decode_peaks, decode_room

# Pillow's own default. Checked on the header, before any pixel is decoded.
MAX_PIXELS = Image.MAX_IMAGE_PIXELS or MAX_PIXELS

# Formats Pillow registers but cannot decode here, by reason (see `extensions`).
IDENTIFY_ONLY = {"MPEG"}  # Pillow reads an MPEG file's header only; videos go to `gemma-embed video`
# Formats whose Pillow plugin runs an outside program on the file: EPS (and PS, the same plugin) starts Ghostscript,
# a PostScript interpreter with a long record of code execution from crafted files. Never opened, by the batch
# tool or the server: a folder of a user's own files holds downloads and attachments too, and an image embedding
# of a PostScript drawing is not worth running an interpreter on it (docs/inputs.md).
RUNS_A_PROGRAM = frozenset({"EPS"})
# What the server opens from its clients: the formats a browser shows (AVIF where this Pillow reads it). The rest
# of Pillow's decoders (TIFF, PCX, ICNS, SGI, ...) are code a client could reach that no web page needs.
BROWSER_FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP", "AVIF")


class ImageDecodeError(ValueError):
    pass


@dataclass
class DecodedImage:
    image: Image.Image  # upright RGB, the first frame
    mode: str  # the file's Pillow mode before the conversion (RGBA, P, I;16, CMYK, ...)
    format: str  # Pillow's format name (PNG, JPEG, ...)
    frames_in_file: int = 1  # frames or pages in the file; only the first is embedded
    meta: dict = field(init=False)

    def __post_init__(self) -> None:
        self.meta = {"image_format": self.format, "mode": self.mode, "frames_in_file": self.frames_in_file}

    @property
    def width(self) -> int:
        return self.image.width

    @property
    def height(self) -> int:
        return self.image.height


def composited(image: Image.Image) -> bool:
    """Whether transformers' conversion composites the image onto white: an alpha band or a transparency entry
    (`convert_to_rgb`'s own test). The header tells it."""
    return "A" in image.getbands() or image.info.get("transparency") is not None


def converts_to_rgb(image: Image.Image) -> bool:
    """Whether transformers' conversion changes anything: every mode but RGB, and RGB composited onto white."""
    return image.mode != "RGB" or composited(image)


def to_rgb(image: Image.Image) -> Image.Image:
    """transformers' conversion of a PIL image to RGB (alpha composited onto white)."""
    from transformers.image_transforms import convert_to_rgb

    return Image.fromarray(convert_to_rgb(image, return_numpy=True), "RGB")


def decode_image(content: str | bytes, max_pixels: int = MAX_PIXELS) -> DecodedImage:
    """The upright first frame of an image file (a path) or of an image's bytes, as RGB, converted as transformers
    converts; ImageDecodeError with a one-line reason otherwise. Pillow tells formats by their content, so bytes
    need no name."""
    try:
        with Image.open(as_file(content), formats=opened_formats()) as img:
            width, height = img.size
            if width * height > max_pixels:
                raise ImageDecodeError(
                    f"{width}x{height} pixels exceeds the limit of {max_pixels} (decompression-bomb guard)"
                )
            frames = int(getattr(img, "n_frames", 1) or 1)
            if frames > 1:
                img.seek(0)
            decode_room.admit(decode_peaks.image_decode_peak(width, height, composited(img)))  # waits for room in a run
            img.load()
            mode, fmt = img.mode, img.format or ""
            if not converts_to_rgb(img):
                # transformers' conversion would be `convert("RGB")`, a copy with the same pixels: the upright
                # copy is that image (it also outlives the file, whose closing frees the decoded pixels).
                return DecodedImage(ImageOps.exif_transpose(img), mode, fmt, frames)
            ImageOps.exif_transpose(img, in_place=True)  # no copy: the conversion makes the new image
            return DecodedImage(to_rgb(img), mode, fmt, frames)
    except ImageDecodeError:
        raise
    except UnidentifiedImageError:
        raise ImageDecodeError("not a recognised image format") from None
    except Image.DecompressionBombError as exc:
        raise ImageDecodeError(f"decompression-bomb guard: {exc}") from None
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ImageDecodeError(f"cannot decode image: {_with_library_cause(reason)}") from None
    except (ValueError, SyntaxError, KeyError, EOFError) as exc:
        raise ImageDecodeError(f"cannot decode image: {_with_library_cause(str(exc) or type(exc).__name__)}") from None


def opened_formats() -> list[str]:
    """Every format Pillow registers, less those that run an outside program (RUNS_A_PROGRAM); the common ones
    first, as Pillow's own open tries them (its preinit set) before loading and trying every other plugin."""
    Image.init()
    common = [fmt for fmt in ("BMP", "GIF", "JPEG", "PPM", "PNG") if fmt in Image.ID]
    return common + [fmt for fmt in Image.ID if fmt not in RUNS_A_PROGRAM and fmt not in common]


def browser_format(data: bytes) -> str | None:
    """The format of an image's bytes when it is one a browser shows (BROWSER_FORMATS), else None. Pillow reads the
    header only, trying those formats' openers and no other (no pixel is decoded here)."""
    import io

    Image.init()
    formats = [fmt for fmt in BROWSER_FORMATS if fmt in Image.OPEN]
    try:
        with Image.open(io.BytesIO(data), formats=formats) as img:
            return img.format
    except Exception:  # noqa: BLE001 - whatever the header is, it is not one of those formats
        return None


def decode_image_value(value) -> DecodedImage:
    """`decode_image`, also for a PIL image a Python caller holds: upright and converted exactly as a file's
    first frame is."""
    if not isinstance(value, Image.Image):
        return decode_image(value)
    mode, fmt = value.mode, value.format or ""
    return DecodedImage(to_rgb(ImageOps.exif_transpose(value)), mode, fmt, int(getattr(value, "n_frames", 1) or 1))


def _with_library_cause(reason: str) -> str:
    """Pillow's reason, led by what a C library printed while this image decoded (libtiff prints the cause,
    "WEBP compression support is not configured", and Pillow raises only "decoder error -2")."""
    printed = [m.removeprefix("stderr: ") for m in capture.current_messages() if m.startswith("stderr: ")]
    own = [line for line in printed if not capture.SHARED.search(line)] or printed
    if not own:
        return reason
    cause = capture.SHARED.sub("", own[-1])
    # libtiff names the file it was handed; Pillow hands it a placeholder name, not the real path.
    module, sep, text = cause.partition(": ")
    if sep and module.endswith((".tif", ".tiff")):
        cause = text
    return f"{cause.rstrip('.')} ({reason})"


def extensions() -> set[str]:
    """Every extension Pillow registers for a format it can open and decode here.

    From `Image.registered_extensions()`, keeping formats with an opener (MPO files open through the JPEG
    opener), and leaving out what cannot decode on this machine: save-only formats (PDF, PALM), stub formats
    with no handler installed (BUFR, GRIB, HDF5, and WMF/EMF off Windows), EPS/PS (RUNS_A_PROGRAM: never, even
    with Ghostscript installed), and identify-only MPEG.
    """
    Image.init()
    found = set()
    for ext, fmt in Image.registered_extensions().items():
        if fmt in IDENTIFY_ONLY:
            continue
        if fmt == "MPO":
            found.add(ext)
            continue
        opener = Image.OPEN.get(fmt)
        if opener is None:
            continue
        factory = opener[0]
        if isinstance(factory, type) and issubclass(factory, ImageFile.StubImageFile):
            module = __import__(factory.__module__, fromlist=["_handler"])
            if getattr(module, "_handler", None) is None:
                continue
        if fmt in RUNS_A_PROGRAM:
            continue
        found.add(ext.lower())
    return found
