"""The model that ships inside the package (captioning/pretrained/): it loads without a checkpoint,
describes scikit-image's real photos as its card (flickr8k_soft.json) and the docs say, looks where
the card says, and is the file and the preprocessing its record names."""

from __future__ import annotations

import json

import pytest
import torch

from captioning.api import Captioner
from captioning.checkpoint import load_checkpoint, weights_digest
from captioning.cli import main
from captioning.data.images import SAMPLE_PHOTOS, sample_photo
from captioning.model.encoder import IMAGENET_MEAN, IMAGENET_STD, weights_identity
from captioning.model.ensemble import Ensemble, JoinedEncoder
from captioning.shipped import PRETRAINED, pretrained_path
from tests.tiny import REPO

pytestmark = pytest.mark.usefixtures("no_network")
CARD = json.loads(pretrained_path().with_suffix(".json").read_text())


@pytest.fixture(scope="module")
def captioner() -> Captioner:
    return Captioner.from_pretrained(device="cpu")


@pytest.fixture(scope="module")
def photos():
    pytest.importorskip("skimage")
    return [sample_photo(name) for name in SAMPLE_PHOTOS]


@pytest.fixture(scope="module")
def said(captioner, photos):
    return captioner.caption(photos)


def test_the_shipped_file_is_small_and_holds_no_training_state() -> None:
    path = pretrained_path()
    assert path.stat().st_size <= 20 * 2**20
    payload = load_checkpoint(path)
    assert {"optimizer", "scheduler", "rng", "encoder"}.isdisjoint(payload)
    assert payload["config"]["encoder"]["name"] == "efficientnet_lite2"  # weights from their own package
    assert "research use" in payload["release"]["licence"] and "Flickr8k" in payload["release"]["data"]
    assert payload["release"]["val"] == CARD["release"]["val"]


def test_its_weights_are_the_recorded_ones() -> None:
    """The decoder's weights hash to what the record says, and the encoder's weights file is the one
    the model was trained on (another file under the package's name would change every caption)."""
    payload = load_checkpoint(pretrained_path())
    assert weights_digest(payload["decoder"]) == payload["record"]["weights"]["decoder"]
    assert [weights_digest(m["decoder"]) for m in payload.get("members", [])] == payload["record"]["weights"].get(
        "members", [])
    assert [weights_digest(m["encoder"]) if "encoder" in m else None for m in payload.get("members", [])] == \
        payload["record"]["weights"].get("member_encoders", [None] * len(payload.get("members", [])))
    assert payload["record"]["preprocessing"]["weights"] == weights_identity("efficientnet_lite2", None)


def test_it_is_three_runs_decoded_together_from_one_file_one_over_its_own_fine_tuned_encoder(captioner) -> None:
    """Three runs, cut into one file (shipped.for_captioning's members): captioning reads it as one
    ensemble, each decoder keeps its own run's record, and the card names every run's kept results.
    The third fine-tuned Lite2 from block5: the file holds those stages of its own, stored in int8,
    and its decoder reads that encoder's annotations while the stages before block5 run once."""
    payload = load_checkpoint(pretrained_path())
    decoder, encoder = captioner.model.decoder, captioner.model.encoder
    assert isinstance(decoder, Ensemble) and len(decoder.members) == 3 and decoder.views == [0, 0, 1]
    assert [m["record"]["weights"]["decoder"] for m in payload["members"]] == payload["record"]["weights"]["members"]
    assert payload["record"]["weights"]["decoder"] not in payload["record"]["weights"]["members"]
    tuned = payload["members"][1]
    assert tuned["config"]["encoder"]["fine_tune_from"] == "block5"
    assert {name.split(".")[1] for name in tuned["encoder"]} == {"block5", "block6"}
    assert tuned["encoder"]["body.block6.0.conv_pwl.weight"].dtype == torch.int8
    assert isinstance(encoder, JoinedEncoder) and [name for name, _ in encoder.encoders[0].body.named_children()][
        encoder.shared] == "block5"
    kept = [part.split(".json")[0] for part in CARD["release"]["cut_from"].split("results/")[1:]]
    assert len(kept) == 3 and all((REPO / "studies/flickr8k/results" / f"{run}.json").is_file() for run in kept)
    assert all(f"--checkpoint runs/flickr8k/{run}/best.pt --run {run}" in CARD["release"]["command"] for run in kept)
    assert "--precision int8 " in CARD["release"]["command"] and "int8" in CARD["release"]["weights"]


def test_it_describes_real_photos_as_its_card_says(said) -> None:
    assert {name: result.caption for name, result in zip(SAMPLE_PHOTOS, said)} == {
        name: sample["caption"] for name, sample in CARD["samples"].items()}


def test_each_word_looks_where_its_card_says(said) -> None:
    for name, result in zip(SAMPLE_PHOTOS, said):
        assert [int(alpha.argmax()) for alpha in result.alphas] == CARD["samples"][name]["cells"], name
        assert result.alphas.shape[1:] == tuple(load_checkpoint(pretrained_path())["grid"])


def test_the_docs_show_what_it_says() -> None:
    readme = (REPO / "README.md").read_text()
    results = (REPO / "docs" / "results.md").read_text()
    for sample in CARD["samples"].values():
        assert sample["caption"] in results
    assert CARD["samples"][CARD["picture"]]["caption"] in readme
    assert f"docs/images/flickr8k_{CARD['picture']}.jpg" in readme and (REPO / "docs" / "images" /
                                                                          f"flickr8k_{CARD['picture']}.jpg").is_file()
    # the shipped model's section gives the card's own numbers, to the card's four digits
    val = CARD["release"]["val"]
    card_line = (f"BLEU-1 {val['Bleu_1']:.4f}, BLEU-4 {val['Bleu_4']:.4f}, METEOR {val['METEOR']:.4f}, "
                 f"ROUGE-L {val['ROUGE_L']:.4f}, CIDEr {val['CIDEr']:.4f}")
    assert card_line in " ".join(results.split())


def test_other_preprocessing_changes_what_it_says(captioner, photos, said, monkeypatch) -> None:
    """The card's captions are tied to the preprocessing: with ImageNet's mean and std in place of
    EfficientNet's [-1, 1] scaling, the words and where they look change."""
    monkeypatch.setattr(captioner.model.encoder, "mean", IMAGENET_MEAN)
    monkeypatch.setattr(captioner.model.encoder, "std", IMAGENET_STD)
    other = captioner.caption(photos)
    captions = [r.caption for r in other] != [r.caption for r in said]
    cells = [[int(a.argmax()) for a in r.alphas] for r in other] != [[int(a.argmax()) for a in r.alphas] for r in said]
    assert captions or cells


def test_the_caption_command_uses_it_without_a_checkpoint_and_says_what_its_card_says(tmp_path, capsys) -> None:
    """`make demo`'s last two steps: the sample photos written as files, then captioned."""
    pytest.importorskip("skimage")
    assert main(["sample-photos", "--out", str(tmp_path / "photos")]) == 0
    written = capsys.readouterr().out.split()
    assert written == [str(tmp_path / "photos" / f"{name}.png") for name in SAMPLE_PHOTOS]
    assert main(["caption", str(tmp_path / "photos"), "--overlays", str(tmp_path / "overlays")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t") for line in lines] == [
        [path, CARD["samples"][name]["caption"]] for path, name in zip(written, SAMPLE_PHOTOS)]
    assert (tmp_path / "overlays" / "index.html").is_file()


def test_an_unknown_shipped_model_is_one_line() -> None:
    from captioning.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="no shipped model named 'coco'"):
        Captioner.from_pretrained("coco")
    assert list(PRETRAINED) == ["flickr8k", "flickr8k_de"]  # the first, English, is the default


def test_it_decodes_in_float32(captioner) -> None:
    assert all(p.dtype == torch.float32 for p in captioner.model.decoder.parameters())


def _strings(value) -> list[str]:
    """Every string in a checkpoint's plain data (its tensors left out)."""
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in [str(key), *_strings(item)]]
    if isinstance(value, (list, tuple)):
        return [text for item in value for text in _strings(item)]
    return [value] if isinstance(value, str) else []


def test_it_carries_no_path_of_the_machine_that_trained_it() -> None:
    payload = load_checkpoint(pretrained_path())
    plain = {key: value for key, value in payload.items() if key != "decoder"}
    assert not [text for text in _strings(plain) if text.startswith(("/", "~"))]
    assert payload["config"]["data"]["root"] == "data/flickr8k" and payload["config"]["data"]["cache_root"] is None


def test_it_says_what_it_is_to_inspect_and_verify(capsys) -> None:
    """A released model: inspect shows its card's numbers and how to score them again; verify without
    its data says the same in one line (exit 2), not that it was saved after its last validation."""
    path = pretrained_path()
    payload = load_checkpoint(path)
    release = payload["release"]
    assert release == CARD["release"] and release["val"]["tokenizer"].startswith("PTB")
    assert f"--run {release['cut_from'].split('results/')[1].split('.json')[0]} " in release["command"]
    assert release["scored"].startswith(f"captioning verify captioning/pretrained/{path.name} data.root=DATA")
    history = payload["progress"]["history"]
    assert history[-1]["step"] == payload["progress"]["step"] and history[-1]["Bleu_4"] == pytest.approx(
        payload["progress"]["best_metric"])
    assert main(["inspect", str(path)]) == 0
    shown = capsys.readouterr().out
    assert "  released    flickr8k: a released model" in shown
    assert "\n  ensemble    3 decoders caption together" in shown and "\n  member 3    " in shown
    assert "encoder fine-tuned from block5" in shown
    assert f"  release val          Bleu_1 {release['val']['Bleu_1']:.4f}, " in shown
    assert main(["verify", str(path), "data.root=/nowhere"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {path}: a released model (flickr8k), whose card gives on "
                                               f"val (beam 3, {release['val']['tokenizer']}): Bleu_1 ")
    assert err[0].endswith(f"captioning verify {path} data.root=DIR")
