"""The HTML page of hits: one self-contained page, thumbnails of image and video hits and players for audio hits
embedded as data: URIs; the thumbnails the server shows too."""

from __future__ import annotations

import base64
import html
import io

from gemma_embed.search.hits import SearchHit

THUMBNAIL_PX = 224
AUDIO_PREVIEW_S = 15.0


def render_html(hits: list[SearchHit], query: str, modality: str = "", index: str = "") -> str:
    """One self-contained page: every image and video thumbnail and audio clip is embedded (data: URIs)."""
    return render_html_many([(query, hits)], modality, index)


def render_html_many(groups: list[tuple[str, list[SearchHit]]], modality: str = "", index: str = "") -> str:
    """One page for many queries: each query's title and hits (one query: its title is the page's)."""
    sections = []
    for query, hits in groups:
        cards = []
        for hit in hits:
            media = _media_html(hit, modality)
            time = f" at {hit.timestamp:.2f} s" if hit.timestamp is not None else ""
            text = ""
            if hit.text is not None:  # the text as stored, whole; an ellipsis where it is a longer text's beginning
                text = f"<p class=text>{html.escape(hit.text)}{'&hellip;' if hit.text_cut else ''}</p>"
            cards.append(
                "<li><div class=media>{}</div><div class=info><b>#{}</b> {:.4f}{}<br><code>{}</code><br>"
                "<small>{}</small>{}</div></li>".format(
                    media,
                    hit.rank,
                    hit.score,
                    html.escape(time),
                    html.escape(hit.key),
                    html.escape(hit.path or ""),
                    text,
                )
            )
        heading = "h1" if len(groups) == 1 else "h2"
        sections.append(
            f"<{heading}>{html.escape(query)}</{heading}><p>index: <code>{html.escape(index)}</code>, "
            f"{len(hits)} results</p><ul>{''.join(cards)}</ul>"
        )
    return (
        "<!doctype html><html><head><meta charset=utf-8><title>gemma-embed search</title><style>"
        "body{font-family:sans-serif;margin:2em}ul{list-style:none;padding:0}"
        "li{display:flex;gap:1em;align-items:center;margin:.6em 0}"
        ".media{width:" + str(THUMBNAIL_PX) + "px;text-align:center}img{max-width:100%}audio{width:100%}"
        ".text{white-space:pre-wrap;margin:.3em 0 0}"
        "</style></head><body>" + "".join(sections) + "</body></html>\n"
    )


def _media_html(hit: SearchHit, modality: str) -> str:
    if not hit.path:
        return ""
    kind = modality or _guess_modality(hit.item)
    try:
        if kind == "audio":
            return f'<audio controls src="{_wav_uri(hit.path)}"></audio>'
        picture = preview_image(hit.path, hit.item, hit.frame, kind)
        return _img(picture) if picture is not None else ""
    except Exception as exc:  # noqa: BLE001 - a missing or unreadable file is shown, not fatal
        return f"<small>(unavailable: {html.escape(' '.join(str(exc).split()))})</small>"


def preview_image(path: str, item: dict, frame: int | None = None, modality: str = ""):
    """What a hit shows, as a PIL image: an image item's picture, a video item's frame (`frame`, or the middle
    sampled one); None for other items. Raises the decoder's error for a missing or unreadable file."""
    kind = modality or _guess_modality(item)
    if kind in ("images", "image"):
        from gemma_embed.media.image import decode_image

        return decode_image(path).image
    if kind == "video":
        from PIL import Image

        from gemma_embed.media.video import decode_frame

        indices = item.get("frame_indices") or [0]
        frame = frame if frame is not None else len(indices) // 2  # pooled: the middle frame
        return Image.fromarray(decode_frame(path, int(indices[frame])))
    return None


def _guess_modality(item: dict) -> str:
    if "frame_indices" in item:
        return "video"
    if "sample_rate" in item or "duration_s" in item:
        return "audio"
    if "width" in item:
        return "images"
    return ""


def thumbnail_jpeg(image) -> bytes:
    """A picture at most THUMBNAIL_PX on its longer side, as JPEG bytes (the page's and the server's thumbnails)."""
    image = image.convert("RGB")
    image.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=80)
    return buffer.getvalue()


def _img(image) -> str:
    return f'<img alt="" src="data:image/jpeg;base64,{base64.b64encode(thumbnail_jpeg(image)).decode()}">'


def _wav_uri(path: str) -> str:
    """The clip's first AUDIO_PREVIEW_S seconds as 16 kHz mono 16-bit WAV."""
    import soundfile

    from gemma_embed.media.audio import decode_audio

    rate = 16_000
    samples = decode_audio(path, sample_rate=rate).samples[: int(AUDIO_PREVIEW_S * rate)]
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format="WAV", subtype="PCM_16")
    return "data:audio/wav;base64," + base64.b64encode(buffer.getvalue()).decode()
