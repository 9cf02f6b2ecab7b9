"""Rebuild tests/media/: real files other projects made, plus files derived from them with the libraries' own
encoders in the modes and containers the real ones lack. SOURCES.md lists every file, where it came from and
its licence.

    python tests/media/make_media.py          # writes tests/media/{images,audio,video,bad}/

Real files are copied from what this machine's Python packages ship: CPython's own test data (`test/imghdrdata`,
`test/audiodata`; PSF licence) and scikit-learn's sample photo (`sklearn/datasets/images/flower.jpg`, CC BY 2.0).
The derived files start from those pixels and samples and are written by Pillow, PyAV (FFmpeg) and soundfile;
a few get one byte patched afterwards to carry a defect found in real collections (a Latin-1 tag, a TIFF tag
that overruns the file, a compression libtiff was built without). Deterministic: no randomness, fixed sizes.
"""

from __future__ import annotations

import shutil
import struct
import sysconfig
from fractions import Fraction
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CPYTHON_TEST = Path(sysconfig.get_path("stdlib")) / "test"
CPYTHON_IMAGES = ["python.bmp", "python.gif", "python.png", "python.pbm", "python.pgm", "python.ppm"]
CPYTHON_IMAGES += ["python.ras", "python.sgi", "python.tiff", "python.webp", "python.xbm", "python.jpg"]
CPYTHON_AUDIO = ["pluck-pcm16.wav", "pluck-pcm24.aiff", "pluck-ulaw.au", "pluck-alaw.aifc"]
SIZE = (96, 64)  # the photo, scaled down: every derived image is a few KB


def flower_path() -> Path:
    import sklearn

    return Path(sklearn.__file__).parent / "datasets" / "images" / "flower.jpg"


def copy_real(images: Path, audio: Path) -> None:
    for name in CPYTHON_IMAGES:
        shutil.copy(CPYTHON_TEST / "imghdrdata" / name, images / name)
    for name in CPYTHON_AUDIO:
        shutil.copy(CPYTHON_TEST / "audiodata" / name, audio / name)
    shutil.copy(flower_path(), images / "flower.jpg")


def derived_images(images: Path, bad: Path) -> None:
    from PIL import Image, TiffImagePlugin

    base = Image.open(flower_path()).convert("RGB").resize(SIZE, Image.Resampling.LANCZOS)
    y, x = np.mgrid[0 : SIZE[1], 0 : SIZE[0]]
    radial = np.hypot(x - SIZE[0] / 2, y - SIZE[1] / 2) / np.hypot(SIZE[0] / 2, SIZE[1] / 2)
    alpha = Image.fromarray((255 * (1 - radial.clip(0, 1))).astype(np.uint8))  # opaque centre, clear corners
    gray = base.convert("L")

    rgba = base.copy()
    rgba.putalpha(alpha)
    rgba.save(images / "rgba.png")
    la = gray.copy()
    la.putalpha(alpha)
    la.save(images / "la.png")
    pa = base.quantize(32).convert("PA")
    pa.putalpha(alpha)
    pa.save(images / "pa.tif", compression="tiff_adobe_deflate")
    base.convert("CMYK").save(images / "cmyk.jpg", quality=90)
    base.convert("CMYK").save(images / "cmyk.tif", compression="tiff_adobe_deflate")
    wide = np.asarray(gray, dtype=np.uint16) * 257  # the full 16-bit range, as a scanner writes it
    Image.fromarray(wide).save(images / "gray16.png")  # I;16
    Image.fromarray(np.asarray(gray, dtype=np.int32) * 3 - 200, "I").save(
        images / "int32.tif", compression="tiff_adobe_deflate"
    )  # I, beyond 0..255
    Image.fromarray(np.asarray(gray, dtype=np.float32) * 1.5 - 40.0, "F").save(
        images / "float32.tif", compression="tiff_adobe_deflate"
    )  # F
    gray.convert("1").save(images / "bilevel.png")  # 1
    base.convert("LAB").save(images / "lab.tif", compression="tiff_adobe_deflate")
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: rotate 90 degrees clockwise to display (a phone's portrait photo)
    base.save(images / "exif-rotated.jpg", exif=exif.tobytes(), quality=90)

    frames = [base.rotate(angle) for angle in (0, 20, 40)]
    transparent = [f.quantize(64) for f in frames]
    transparent[0].save(images / "animated.gif", save_all=True, append_images=transparent[1:], transparency=0)
    with_alpha = []
    for f in frames:
        g = f.copy()
        g.putalpha(alpha)
        with_alpha.append(g)
    with_alpha[0].save(images / "animated.png", save_all=True, append_images=with_alpha[1:])  # APNG
    with_alpha[0].save(images / "animated.webp", save_all=True, append_images=with_alpha[1:], lossless=True)
    frames[0].save(images / "multipage.tif", save_all=True, append_images=frames[1:2], compression="tiff_adobe_deflate")

    logo = Image.open(CPYTHON_TEST / "imghdrdata" / "python.png").convert("RGBA")
    logo.save(images / "logo.ico", sizes=[(16, 16), (8, 8)])
    logo.save(images / "logo.tga")
    logo.save(images / "logo.jp2")
    logo.save(images / "logo.avif")

    # A TIFF whose ImageDescription claims more bytes than the file has: Pillow warns and skips the tag.
    info = TiffImagePlugin.ImageFileDirectory_v2()
    info[270] = "description"
    base.save(images / "tag-overflow.tif", compression="tiff_adobe_deflate", tiffinfo=info)
    _patch_tiff_tag(images / "tag-overflow.tif", 270, count=1_000_000)
    # A TIFF compressed with WebP, which this libtiff was built without (libtiff prints why; Pillow does not).
    base.save(bad / "webp-compressed.tif", compression="tiff_adobe_deflate")
    _patch_tiff_tag(bad / "webp-compressed.tif", 259, short_value=50001)


def _patch_tiff_tag(path: Path, tag: int, count: int | None = None, short_value: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    assert data[:2] == b"II", "Pillow writes little-endian TIFF"
    ifd = struct.unpack_from("<I", data, 4)[0]
    for k in range(struct.unpack_from("<H", data, ifd)[0]):
        entry = ifd + 2 + 12 * k
        if struct.unpack_from("<H", data, entry)[0] == tag:
            if count is not None:
                struct.pack_into("<I", data, entry + 4, count)
            if short_value is not None:
                struct.pack_into("<H", data, entry + 8, short_value)
            path.write_bytes(bytes(data))
            return
    raise ValueError(f"{path}: no tag {tag}")


def _pluck(rate: int = 16000) -> np.ndarray:
    import soundfile as sf

    samples, source_rate = sf.read(CPYTHON_TEST / "audiodata" / "pluck-pcm16.wav", dtype="float32", always_2d=True)
    return samples.mean(axis=1), source_rate


def _latin1(path: Path, placeholder: bytes) -> None:
    """Turn the last byte of a tag written as ASCII into 0xED (Latin-1 'í'): no longer valid UTF-8."""
    data = path.read_bytes()
    assert data.count(placeholder) == 1, path
    path.write_bytes(data.replace(placeholder, placeholder[:-1] + b"\xed"))


def derived_media(audio: Path, video: Path, bad: Path) -> None:
    import av
    import soundfile as sf
    from PIL import Image

    samples, rate = _pluck()
    # An audio-only MP4 (m4a) whose title is Latin-1: 'Pluck cami' + 0xED.
    with av.open(str(audio / "latin1-title.m4a"), "w", format="ipod") as container:
        container.metadata["title"] = "Pluck camiX"
        stream = container.add_stream("aac", rate=rate, layout="mono")
        _encode_audio(container, stream, samples, rate)
    _latin1(audio / "latin1-title.m4a", b"Pluck camiX")

    # A video with a soundtrack and a Latin-1 title: frames from the photo, the pluck as its sound.
    base = Image.open(flower_path()).convert("RGB").resize((96, 64))
    with av.open(str(video / "latin1-title.mp4"), "w") as container:
        container.metadata["title"] = "Flower camiX"
        stream = container.add_stream("libx264", rate=10, options={"crf": "30"})
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        sound = container.add_stream("aac", rate=rate, layout="mono")
        for index in range(8):
            frame = av.VideoFrame.from_ndarray(np.asarray(base.rotate(index * 10)), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
        _encode_audio(container, sound, samples, rate)
    _latin1(video / "latin1-title.mp4", b"Flower camiX")

    # 1x1-pixel frames (4:4:4, since 4:2:0 needs even sizes).
    with av.open(str(video / "one-pixel.mp4"), "w") as container:
        stream = container.add_stream("libx264", rate=10)
        stream.width, stream.height, stream.pix_fmt = 1, 1, "yuv444p"
        for index in range(5):
            pixel = np.full((1, 1, 3), (40 * index, 200 - 30 * index, 90), np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixel, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)

    sf.write(bad / "five-samples.wav", samples[2000:2005], rate, subtype="PCM_16")  # one frame needs 161
    (bad / "headerless.raw").write_bytes((np.clip(samples, -1, 1) * 32767).astype("<i2")[:4000].tobytes())


def _encode_audio(container, stream, samples: np.ndarray, rate: int) -> None:
    import av

    frame = av.AudioFrame.from_ndarray(samples[None, :].astype(np.float32), format="flt", layout="mono")
    frame.sample_rate = rate
    frame.pts, frame.time_base = 0, Fraction(1, rate)
    for packet in stream.encode(frame):
        container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def main() -> None:
    folders = {name: HERE / name for name in ("images", "audio", "video", "bad")}
    for folder in folders.values():
        folder.mkdir(exist_ok=True)
    copy_real(folders["images"], folders["audio"])
    derived_images(folders["images"], folders["bad"])
    derived_media(folders["audio"], folders["video"], folders["bad"])
    total = sum(p.stat().st_size for p in HERE.rglob("*") if p.is_file())
    print(f"tests/media: {sum(1 for p in HERE.rglob('*') if p.is_file())} files, {total / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
