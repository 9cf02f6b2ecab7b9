"""Decode peaks: the host memory one item will need to decode and prepare, estimated from its header.

Measured constants, one per kind of file; the decoders say them to the decode room (`decode_room.admit`) once they
have read a header, and the room admits the item when it fits. Pure: plain numbers in, bytes out.
"""

from __future__ import annotations

import math

# Peak host memory of one image through `media.image.decode_image` and the Gemma 4 image preparer, per pixel of
# the file (width x height), measured with VmHWM in a fresh process (mmap threshold pinned, as the CLI runs), Pillow
# 13.0, transformers 5.24 (`python -m bench.bench_memory --decode`; bench/MEMORY.md has the table):
# - files transformers' conversion leaves as they are (RGB without transparency): 14.0 B/px for PNG, JPEG and TIFF
#   at 2000x2000, 3000x3000 and 9400x9400 (the decoded image, 4 B/px in Pillow, held while the processor makes its
#   own RGB copy, 4 B/px, and turns that into a numpy array through a bytes copy, 3 + 3); 16.0-16.2 for WebP
#   (libwebp's own buffer);
# - files it composites onto white (an alpha band or a transparency entry): 22.0 B/px for RGBA and LA PNGs and RGB
#   PNGs with tRNS (the RGBA copy, the white background, the composite and their numpy copies), 19.0 for P with
#   tRNS, 16.0 for RGBA WebP.
# Other conversions (L, 1, P, I;16, CMYK) peak at 14.0, in the processor, as RGB files do. The constants are the
# worst of each kind plus about 5% (page rounding, the small allocations around), and a test holds them there.
IMAGE_PEAK_BYTES_PER_PIXEL = 17
IMAGE_COMPOSITED_PEAK_BYTES_PER_PIXEL = 23


def image_decode_peak(width: int, height: int, composited: bool) -> int:
    """Estimated peak host bytes of decoding and preparing one image, from its header: its size, and whether it
    has alpha or a transparency entry (composited onto white)."""
    per_pixel = IMAGE_COMPOSITED_PEAK_BYTES_PER_PIXEL if composited else IMAGE_PEAK_BYTES_PER_PIXEL
    return max(0, int(width)) * max(0, int(height)) * per_pixel


# The same for a video through `media.video.decode_video` and the Gemma 4 video preparer, per pixel of the sampled
# frames (frames x width x height): 8.8 B/px for 32 frames of 1920x1080 H.264 (the decoded frames, 3 B/px, their
# stacked copy and the processor's), 12.2 for 32 frames of a rotated 1280x720 MPEG-4 clip (the rotation's copy).
VIDEO_PEAK_BYTES_PER_PIXEL = 13
# And for audio through `media.audio.decode_audio` and the audio preparer, per sample at the target rate (mono):
# 11.4 B for 600 s of 44.1 kHz stereo WAV or FLAC resampled to 16 kHz, 12.7 for the same as MP3 (the resampled
# parts and their concatenation, 4 + 4, then the mel features).
AUDIO_PEAK_BYTES_PER_SAMPLE = 14
# An audio stream whose header gives no duration is estimated as this long.
AUDIO_UNKNOWN_DURATION_S = 600


def video_decode_peak(frames: int, width: int, height: int) -> int:
    """Estimated peak host bytes of decoding and preparing the sampled frames of one video."""
    return max(0, int(frames)) * max(0, int(width)) * max(0, int(height)) * VIDEO_PEAK_BYTES_PER_PIXEL


def audio_decode_peak(duration_s: float | None, sample_rate: int) -> int:
    """Estimated peak host bytes of decoding and preparing one audio clip of this many seconds (None: unknown) at
    the preparer's sample rate."""
    seconds = AUDIO_UNKNOWN_DURATION_S if duration_s is None or not math.isfinite(duration_s) else duration_s
    return int(max(0.0, float(seconds)) * max(0, int(sample_rate)) * AUDIO_PEAK_BYTES_PER_SAMPLE)
