"""The German model that ships inside the package (flickr8k_de): it loads by name from Python and the
command line, describes scikit-image's photos in German as its card (flickr8k_de_soft.json) says,
names its language in its record and card, and leaves English the default. With the English model,
the package's shipped files stay within 30 MB."""

from __future__ import annotations

import json

import pytest

from captioning.api import Captioner
from captioning.checkpoint import load_checkpoint, weights_digest
from captioning.cli import main
from captioning.data.images import SAMPLE_PHOTOS, sample_photo
from captioning.shipped import PRETRAINED, pretrained_path
from tests.tiny import REPO

pytestmark = pytest.mark.usefixtures("no_network")
PATH = pretrained_path("flickr8k_de")
CARD = json.loads(PATH.with_suffix(".json").read_text())


@pytest.fixture(scope="module")
def captioner() -> Captioner:
    return Captioner.from_pretrained("flickr8k_de", device="cpu")


@pytest.fixture(scope="module")
def said(captioner):
    pytest.importorskip("skimage")
    return captioner.caption([sample_photo(name) for name in SAMPLE_PHOTOS])


def test_every_shipped_file_together_takes_at_most_30_mb() -> None:
    shipped = [path for path in (REPO / "captioning" / "pretrained").iterdir() if path.is_file()]
    assert {path.name for path in shipped} >= set(PRETRAINED.values())
    assert sum(path.stat().st_size for path in shipped) <= 30 * 10**6


def test_it_is_german_in_its_config_record_and_card_and_english_stays_the_default() -> None:
    payload = load_checkpoint(PATH)
    assert payload["config"]["data"]["language"] == "de"
    assert payload["config"]["data"]["token_file"] == "Flickr8k.de.token.txt"
    assert payload["record"]["data"]["language"] == "de" and CARD["release"]["language"] == "de"
    assert CARD["release"]["val"]["tokenizer"] == "the project's Unicode words (de)"
    assert "METEOR" not in CARD["release"]["val"]  # the packaged METEOR is English's
    assert "Multi30k" in CARD["release"]["licence"] and "research use" in CARD["release"]["licence"]
    assert CARD["release"] == payload["release"]
    assert weights_digest(payload["decoder"]) == payload["record"]["weights"]["decoder"]
    assert pretrained_path() == pretrained_path("flickr8k") != PATH
    assert load_checkpoint(pretrained_path())["config"]["data"].get("language", "en") == "en"


def test_it_describes_the_sample_photos_in_german_as_its_card_says(said) -> None:
    captions = {name: result.caption for name, result in zip(SAMPLE_PHOTOS, said)}
    assert captions == {name: sample["caption"] for name, sample in CARD["samples"].items()}
    for name, result in zip(SAMPLE_PHOTOS, said):
        assert [int(alpha.argmax()) for alpha in result.alphas] == CARD["samples"][name]["cells"], name
    words = {word for caption in captions.values() for word in caption.split()}
    assert words & {"ein", "eine", "einem", "einer", "mit", "auf", "und", "der", "die", "das"}  # German, not English


def test_the_caption_command_takes_it_by_name(tmp_path, capsys) -> None:
    pytest.importorskip("skimage")
    photo = tmp_path / "motorcycle.png"
    sample_photo("motorcycle").save(photo)
    assert main(["caption", str(photo), "--pretrained", "flickr8k_de", "--overlays", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == f"{photo}\t{CARD['samples']['motorcycle']['caption']}"
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert '<figcaption lang="de">' in page


def test_eval_takes_it_by_name_and_says_in_one_line_that_its_data_lacks_the_german_captions(tmp_path, capsys) -> None:
    entry = {"filename": "1000268201_693b08cb0e.jpg", "imgid": 0, "split": "val", "sentences": [{"raw": "A girl."}]}
    (tmp_path / "dataset_flickr8k.json").write_text(json.dumps({"images": [entry]}))
    assert main(["evaluate", "--pretrained", "flickr8k_de", "--split", "val", f"data.root={tmp_path}"]) == 2
    error = capsys.readouterr().err.strip()
    assert error == f"error: {tmp_path / 'Flickr8k.de.token.txt'}: captions file not found"


def test_the_docs_show_its_german_caption_beside_the_english_one() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    english = json.loads(pretrained_path().with_suffix(".json").read_text())
    picture = CARD["picture"]
    assert CARD["samples"][picture]["caption"] in readme and english["samples"][picture]["caption"] in readme
    results = " ".join((REPO / "docs" / "results.md").read_text(encoding="utf-8").split())
    val = CARD["release"]["val"]
    assert (f"BLEU-1 {val['Bleu_1']:.4f}, BLEU-4 {val['Bleu_4']:.4f}, ROUGE-L {val['ROUGE_L']:.4f}, "
            f"CIDEr {val['CIDEr']:.4f}") in results
