"""EmbeddingGemma 2: gemma-embed's two stages on the shared engine equal `SentenceTransformer(ckpt).encode(...)`.

The reference is sentence-transformers itself on the same decoded inputs: real image, video and audio files from
samples/media (several aspect ratios, frame counts and clip lengths) and text lines, with and without a prompt,
on a checkpoint with a chat template (sentence-transformers' message route) and one without (its direct
processor route). Loading is spied on at the tensor level.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors
import torch
from helpers import ROOT, record_batches, spy_tensor_reads

from gemma_embed import engine
from gemma_embed.batching import longest_first
from gemma_embed.engine import Engine, encode_chain_list
from gemma_embed.errors import CheckpointError, ItemError, UsageError
from gemma_embed.media.audio import decode_audio
from gemma_embed.media.image import decode_image
from gemma_embed.media.video import FramePolicy, decode_video
from gemma_embed.models.base import Unit
from gemma_embed.models.embeddinggemma2 import (
    EmbeddingGemma2Preparer,
    EmbeddingGemma2TextTower,
    stage2_item,
)
from gemma_embed.models.gemma4 import Gemma4VisionTower
from gemma_embed.models.gemma4_audio import Gemma4AudioTower
from gemma_embed.models.loading import resolve_checkpoint
from gemma_embed.models.st_inputs import read_sentence_transformers

MEDIA = ROOT / "samples" / "media"
IMAGES = ["landscape.jpg", "panorama.jpg", "portrait.png", "square.webp", "tall.png", "pixel.png", "exif-rotated.jpg"]
VIDEOS = {"clip-h264.mp4": 5, "short-vp9.webm": 3, "vfr-h264.mkv": 2, "rotated-mpeg4.mp4": 4, "one-frame.avi": 1}
AUDIO = ["chirp-16k.wav", "chirp-16k.mp3", "chirp-22k.ogg", "stereo-44k.flac", "stereo-48k.m4a"]
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A photograph of a red car parked by the sea at sunset.",
    "Sound of rain falling on a tin roof.",
    "Video of a cat playing piano.",
    "a dog",
    "x",
]
TOLERANCE = 1e-5


def rel(ours: torch.Tensor, ref) -> float:
    ref = torch.as_tensor(np.asarray(ref), dtype=torch.float32).reshape(-1)
    ours = ours.float().reshape(-1)
    return float((ours - ref).norm() / ref.norm())


@pytest.fixture(scope="module")
def eg2_dirs(tmp_path_factory):
    """{True: checkpoint with the test chat template, False: without one}, built as the samples are."""
    from make_tiny_checkpoint import build_embeddinggemma2

    folder = tmp_path_factory.mktemp("eg2")
    return {
        True: build_embeddinggemma2(folder / "template", seed=3, chat_template=True),
        False: build_embeddinggemma2(folder / "plain", seed=4, chat_template=False),
    }


@pytest.fixture(scope="module")
def reference():
    """SentenceTransformer per checkpoint folder, loaded once."""
    from sentence_transformers import SentenceTransformer

    loaded: dict = {}

    def get(folder: Path, **kwargs):
        key = (str(folder), tuple(sorted(kwargs.items())))
        if key not in loaded:
            loaded[key] = SentenceTransformer(str(folder), device="cpu", **kwargs)
        return loaded[key]

    return get


class Stages:
    """The two stages of one checkpoint on the shared Engine, batched with a fixed cap (no speed tuning)."""

    def __init__(self, folder: Path, dim: int | None = None):
        self.checkpoint = resolve_checkpoint(str(folder))
        self.setup = read_sentence_transformers(self.checkpoint)
        self.text = Engine(
            EmbeddingGemma2TextTower(self.checkpoint, "cpu", torch.float32, self.setup, dim=dim),
            "retrieval",
            batch_cap=8,
        )
        self._towers: dict = {}

    def stage1(self, modality: str):
        if modality == "text":
            return None
        kind = "audio" if modality == "audio" else "vision"
        if kind not in self._towers:
            tower = (Gemma4AudioTower if kind == "audio" else Gemma4VisionTower)(self.checkpoint, "cpu", torch.float32)
            self._towers[kind] = Engine(tower, "language", batch_cap=8)
        return self._towers[kind]

    def embed(self, modality: str, decoded: list, **preparer_options) -> list:
        preparer = EmbeddingGemma2Preparer(self.checkpoint, modality, self.setup, **preparer_options)
        items = [preparer.prepare(d) for d in decoded]
        keys = [f"item{i}" for i in range(len(items))]
        if modality == "text":  # no tower: the text model alone
            return encode_chain_list([self.text], [None], items, keys)
        return encode_chain_list([self.stage1(modality), self.text], [None, stage2_item], items, keys)


@pytest.fixture(scope="module")
def stages(eg2_dirs):
    return {template: Stages(folder) for template, folder in eg2_dirs.items()}


def pil(images: list) -> list:
    """What a sentence-transformers user passes: the PIL images (our decoder's `DecodedImage.image`)."""
    return [decoded.image for decoded in images]


def assert_equal_to_reference(ours: list, ref, width: int = 384) -> None:
    assert len(ours) == len(ref)
    for vector, expected in zip(ours, ref, strict=True):
        assert not isinstance(vector, ItemError), vector
        assert vector.shape == (1, width)
        assert abs(float(vector.norm()) - 1.0) < 1e-5
        assert rel(vector, expected) < TOLERANCE


# sentence-transformers without a chat template hands a batch of images to the processor as one sample with many
# images (one vector back for the batch), so there the reference encodes media one item per call.
def media_batch_size(template: bool) -> int:
    return 32 if template else 1


# ------------------------------------------------------------------------------------------- equivalence


@pytest.mark.parametrize("template", [True, False], ids=["chat-template", "no-template"])
def test_images_of_several_aspect_ratios_equal_sentence_transformers(template, eg2_dirs, stages, reference):
    images = [decode_image(str(MEDIA / "images" / name)) for name in IMAGES]
    ours = stages[template].embed("image", images)
    ref = reference(eg2_dirs[template]).encode(pil(images), batch_size=media_batch_size(template))
    assert_equal_to_reference(ours, ref)


@pytest.mark.parametrize("template", [True, False], ids=["chat-template", "no-template"])
def test_videos_equal_sentence_transformers(template, eg2_dirs, stages, reference):
    videos = [decode_video(str(MEDIA / "video" / name), FramePolicy(num_frames=n)) for name, n in VIDEOS.items()]
    assert len({v.frames.shape[0] for v in videos}) > 1  # different frame counts
    ours = stages[template].embed("video", videos)
    ref = reference(eg2_dirs[template]).encode(
        [{"video": v.frames} for v in videos], batch_size=media_batch_size(template)
    )
    assert_equal_to_reference(ours, ref)


@pytest.mark.parametrize("template", [True, False], ids=["chat-template", "no-template"])
def test_audio_clips_of_different_lengths_equal_sentence_transformers(
    template, eg2_dirs, stages, reference, monkeypatch
):
    clips = [decode_audio(str(MEDIA / "audio" / name), sample_rate=16_000) for name in AUDIO]
    assert len({len(c.samples) for c in clips}) > 2
    audio_batches = record_batches(monkeypatch, Gemma4AudioTower)
    monkeypatch.setattr(engine, "padded_buckets", longest_first)  # clips of different rungs in one ragged batch
    ours = stages[template].embed("audio", clips)
    ref = reference(eg2_dirs[template]).encode(
        [{"array": c.samples, "sampling_rate": c.sample_rate} for c in clips], batch_size=media_batch_size(template)
    )
    assert_equal_to_reference(ours, ref)
    # Stage 1 ran clips of different lengths in one padded batch, not one at a time.
    assert any(len({u.length for u in batch}) > 1 for batch in audio_batches)


def test_audio_longer_than_30_s_is_cut_as_sentence_transformers_cuts_it(eg2_dirs, stages, reference):
    """The feature extractor sentence-transformers calls keeps the first 30 s; one vector for that part."""
    rng = np.random.default_rng(7)
    clip = (0.1 * rng.standard_normal(16_000 * 31)).astype(np.float32)
    ours = stages[True].embed("audio", [clip])
    ref = reference(eg2_dirs[True]).encode([{"array": clip, "sampling_rate": 16_000}])
    assert_equal_to_reference(ours, ref)


@pytest.mark.parametrize("template", [True, False], ids=["chat-template", "no-template"])
@pytest.mark.parametrize("prompt_name", [None, "query"])
def test_text_lines_equal_sentence_transformers(template, prompt_name, eg2_dirs, stages, reference, monkeypatch):
    batches = record_batches(monkeypatch, EmbeddingGemma2TextTower)
    ours = stages[template].embed("text", TEXTS, prompt_name=prompt_name)
    ref = reference(eg2_dirs[template]).encode(TEXTS, prompt_name=prompt_name)
    assert_equal_to_reference(ours, ref)
    # At least one stage-2 device batch held several items of different lengths (a padded ragged batch).
    assert any(len(batch) > 1 and len({u.length for u in batch}) > 1 for batch in batches)


def test_an_explicit_prompt_equals_sentence_transformers(eg2_dirs, stages, reference):
    prompt = "task: clustering | query: "
    ours = stages[True].embed("text", TEXTS[:3], prompt=prompt)
    assert_equal_to_reference(ours, reference(eg2_dirs[True]).encode(TEXTS[:3], prompt=prompt))


@pytest.mark.parametrize("template", [True, False], ids=["chat-template", "no-template"])
def test_a_prompt_with_images_follows_sentence_transformers(template, eg2_dirs, stages, reference):
    """With a chat template the prompt becomes a system message before the image; without one,
    sentence-transformers applies prompts to text only."""
    images = [decode_image(str(MEDIA / "images" / name)) for name in IMAGES[:2]]
    ours = stages[template].embed("image", images, prompt_name="query")
    ref = reference(eg2_dirs[template]).encode(pil(images), prompt_name="query", batch_size=media_batch_size(template))
    assert_equal_to_reference(ours, ref)
    plain = stages[template].embed("image", images)
    assert (rel(ours[0], plain[0].numpy()) > 1e-3) == template


def test_a_soft_token_budget_equals_sentence_transformers_processing_kwargs(eg2_dirs, stages, reference):
    images = [decode_image(str(MEDIA / "images" / name)) for name in IMAGES[:3]]
    ours = stages[True].embed("image", images, max_soft_tokens=140)
    ref = reference(eg2_dirs[True]).encode(pil(images), processing_kwargs={"image": {"max_soft_tokens": 140}})
    assert_equal_to_reference(ours, ref)


def test_pooling_without_the_prompt_equals_sentence_transformers(tmp_path, eg2_dirs, reference):
    """include_prompt=false: sentence-transformers leaves the prompt's tokens out of the mean (direct route)."""
    folder = tmp_path / "no-prompt-pooling"
    shutil.copytree(eg2_dirs[False], folder)
    pooling = folder / "1_Pooling" / "config.json"
    pooling.write_text(json.dumps({**json.loads(pooling.read_text()), "include_prompt": False}))
    ours = Stages(folder).embed("text", TEXTS, prompt_name="query")
    ref = reference(folder).encode(TEXTS, prompt_name="query")
    assert_equal_to_reference(ours, ref)
    with_prompt = reference(eg2_dirs[False]).encode(TEXTS, prompt_name="query")
    assert rel(ours[0], with_prompt[0]) > 1e-3  # the prompt's tokens really are left out


def test_truncate_dim_256_equals_sentence_transformers(eg2_dirs, reference):
    """SentenceTransformer(ckpt, truncate_dim=256) keeps the first 256 components of its normalised vector;
    gemma-embed renormalises them (the model card's Matryoshka recipe), which is that output with
    normalize_embeddings=True."""
    truncated = Stages(eg2_dirs[True], dim=256)
    images = [decode_image(str(MEDIA / "images" / name)) for name in IMAGES[:3]]
    st = reference(eg2_dirs[True], truncate_dim=256)
    for modality, inputs, st_inputs in (("text", TEXTS, TEXTS), ("image", images, pil(images))):
        ours = truncated.embed(modality, inputs)
        ref = st.encode(st_inputs, normalize_embeddings=True)
        assert ref.shape[1] == 256
        assert_equal_to_reference(ours, ref, width=256)
        raw = st.encode(st_inputs)  # what it returns by default: the same direction, shorter than 1
        assert np.all(np.linalg.norm(raw, axis=1) < 1.0)
        for vector, r in zip(ours, raw, strict=True):
            assert rel(vector, r / np.linalg.norm(r)) < TOLERANCE


def test_truncated_long_text_gets_the_template_suffix_back_as_sentence_transformers_does(tmp_path, eg2_dirs, reference):
    """With a max_seq_length, text is truncated; sentence-transformers then writes the chat template's suffix back
    over the last tokens. gemma-embed follows the same route."""
    folder = tmp_path / "short"
    shutil.copytree(eg2_dirs[True], folder)
    config_path = folder / "sentence_bert_config.json"
    config = json.loads(config_path.read_text())
    config["max_seq_length"] = 24
    config_path.write_text(json.dumps(config))
    long_text = " ".join(TEXTS)
    ours = Stages(folder).embed("text", [long_text, "short"])
    st = reference(folder)
    assert st.max_seq_length == 24
    assert_equal_to_reference(ours, st.encode([long_text, "short"]))


# ---------------------------------------------------------------------------------------- stage 2 batching


def test_padded_ragged_stage2_batches_equal_each_sequence_alone(stages):
    """Measured: right padding with the attention mask changes a vector by float32 rounding only (1e-7 to 2e-6
    relative: SDPA takes its masked kernel), so the engine may group sequences of different lengths."""
    s = stages[True]
    preparer = EmbeddingGemma2Preparer(s.checkpoint, "text", s.setup)
    units = [stage2_item(preparer.prepare(t), None).units[0] for t in TEXTS]
    tower = s.text.tower
    with torch.inference_mode():
        batched = tower.encode(units)
        alone = [tower.encode([u])[0] for u in units]
    assert len({u.length for u in units}) == len(units)
    worst = max(rel(b, a) for b, a in zip(batched, alone, strict=True))
    assert worst < TOLERANCE


def test_stage2_unit_refuses_rows_that_do_not_fill_the_slots(stages):
    s = stages[True]
    item = EmbeddingGemma2Preparer(s.checkpoint, "image", s.setup).prepare(
        decode_image(str(MEDIA / "images" / "square.webp"))
    )
    assert item.sequence.slots == sum(u.rows for u in item.units) > 0
    width = s.checkpoint.config.text_config.hidden_size
    with pytest.raises(ValueError, match="placeholder slots"):
        stage2_item(item, torch.zeros(item.sequence.slots - 1, width))
    unit = stage2_item(item, torch.zeros(item.sequence.slots, width)).units[0]
    assert isinstance(unit, Unit) and unit.length == item.sequence.input_ids.shape[0] and unit.rows == 1


def test_placeholder_ids_come_from_the_config(stages):
    s = stages[True]
    config = s.checkpoint.config
    item = EmbeddingGemma2Preparer(s.checkpoint, "audio", s.setup).prepare(
        decode_audio(str(MEDIA / "audio" / "chirp-16k.wav"), sample_rate=16_000)
    )
    ids = item.sequence.input_ids
    assert torch.equal(item.sequence.placeholders, ids == config.audio_token_id)
    assert int((ids == config.boa_token_id).sum()) == 1 and int((ids == config.eoa_token_index).sum()) == 1


# ------------------------------------------------------------------------------------------------ loading


@pytest.fixture
def read_keys(monkeypatch):
    """Every tensor key read through safetensors.safe_open, in order."""
    return spy_tensor_reads(monkeypatch)


TOWER_PREFIXES = ("vision_tower.", "embed_vision.", "audio_tower.", "embed_audio.")


def test_a_text_only_load_reads_no_tower_tensor(eg2_dirs, read_keys):
    checkpoint = resolve_checkpoint(str(eg2_dirs[True]))
    setup = read_sentence_transformers(checkpoint)
    EmbeddingGemma2TextTower(checkpoint, "cpu", torch.float32, setup)
    EmbeddingGemma2Preparer(checkpoint, "text", setup).prepare("hello")
    assert read_keys and all(k.startswith("language_model.") or k.startswith("linear.") for k in read_keys)
    assert not any(k.startswith(TOWER_PREFIXES) for k in read_keys)
    model_keys = [k for k in checkpoint.weight_map if k.startswith("language_model.")]
    assert sorted(k for k in read_keys if k.startswith("language_model.")) == sorted(model_keys)


def test_an_image_load_reads_no_audio_tensor(eg2_dirs, read_keys):
    checkpoint = resolve_checkpoint(str(eg2_dirs[True]))
    Gemma4VisionTower(checkpoint, "cpu", torch.float32)
    EmbeddingGemma2TextTower(checkpoint, "cpu", torch.float32)
    assert any(k.startswith("vision_tower.") for k in read_keys)
    assert any(k.startswith("embed_vision.") for k in read_keys)
    assert not any(k.startswith(("audio_tower.", "embed_audio.")) for k in read_keys)


def test_a_sharded_text_only_load_opens_only_the_text_models_files(tmp_path, monkeypatch):
    from make_tiny_checkpoint import build_embeddinggemma2

    folder = build_embeddinggemma2(tmp_path / "sharded", seed=5, max_shard_size="200KB")
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    text_files = {f for k, f in weight_map.items() if k.startswith("language_model.")}
    assert set(weight_map.values()) - text_files, "some weight file must hold only tower tensors"
    opened: list[str] = []
    real_open = safetensors.safe_open
    monkeypatch.setattr(
        safetensors, "safe_open", lambda p, *a, **k: opened.append(Path(p).name) or real_open(p, *a, **k)
    )
    EmbeddingGemma2TextTower(resolve_checkpoint(str(folder)), "cpu", torch.float32)
    weight_files = {name for name in opened if name.startswith("model-")}
    assert weight_files == text_files


def test_a_missing_text_model_tensor_is_named(tmp_path, eg2_dirs):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "broken"
    shutil.copytree(eg2_dirs[True], folder)
    tensors = load_file(folder / "model.safetensors")
    del tensors["language_model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match="layers.1.mlp.up_proj.weight"):
        EmbeddingGemma2TextTower(resolve_checkpoint(str(folder)), "cpu", torch.float32)


def test_the_text_model_equals_transformers_own(eg2_dirs):
    from transformers import AutoModel

    checkpoint = resolve_checkpoint(str(eg2_dirs[True]))
    ours = EmbeddingGemma2TextTower(checkpoint, "cpu", torch.float32).model
    full = AutoModel.from_pretrained(eg2_dirs[True]).eval()
    reference_state = full.language_model.state_dict()
    assert ours.state_dict().keys() == reference_state.keys()
    for name, value in ours.state_dict().items():
        assert torch.equal(value, reference_state[name]), name


# ------------------------------------------------------------------------------- sentence-transformers files


def test_reads_modules_prompts_and_message_route(eg2_dirs):
    setup = read_sentence_transformers(resolve_checkpoint(str(eg2_dirs[True])))
    assert setup.pooling_mode == "mean" and setup.normalizes and setup.dim == 384
    assert [step.folder for step in setup.head[:2]] == ["2_Dense", "3_Dense"]
    assert setup.prompts["query"].startswith("task: search result")
    assert setup.message_format == "structured"
    assert read_sentence_transformers(resolve_checkpoint(str(eg2_dirs[False]))).message_format is None
    with pytest.raises(UsageError, match="no prompt named 'nope'.*query"):
        setup.resolve_prompt(prompt_name="nope")


def test_unsupported_sentence_transformers_modules_are_refused_in_one_line(tmp_path, eg2_dirs):
    folder = tmp_path / "cls"
    shutil.copytree(eg2_dirs[True], folder)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 384, "pooling_mode": "cls"}))
    with pytest.raises(CheckpointError, match="pooling mode 'cls' is not supported") as caught:
        read_sentence_transformers(resolve_checkpoint(str(folder)))
    assert "\n" not in str(caught.value)
    modules = json.loads((folder / "modules.json").read_text())
    modules[2]["type"] = "my_package.Dense"
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"embedding_dimension": 384}))
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(CheckpointError, match="only sentence-transformers' own modules"):
        read_sentence_transformers(resolve_checkpoint(str(folder)))
