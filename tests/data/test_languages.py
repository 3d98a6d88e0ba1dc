"""Captions in a language other than English: read from a token file beside the split file,
tokenized by Unicode words (German strings throughout), and refused settings said in one line."""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

from captioning.config import ConfigError, load_config
from captioning.data.formats.karpathy import read_split, read_token_file
from captioning.data.records import DatasetError, read_records
from captioning.data.tokenized import Tokenized
from captioning.data.vocab import Vocabulary, tokenization, tokenize
from tests.tiny import REPO

GERMAN = [
    "Zwei Hunde laufen über die Straße.",
    "ÄLTERE MÄNNER SITZEN AUF EINER BANK; ÖFFENTLICH, GRÜN!",
    "Ein Mädchen im T-Shirt springt – „fröhlich“ – ins Wasser...",
    "Eine Frau fährt Fahrrad, sitzen/liegen?",
]


@pytest.mark.parametrize("caption, words", [
    (GERMAN[0], ["zwei", "hunde", "laufen", "über", "die", "straße"]),
    (GERMAN[1], ["ältere", "männer", "sitzen", "auf", "einer", "bank", "öffentlich", "grün"]),
    (GERMAN[2], ["ein", "mädchen", "im", "t-shirt", "springt", "fröhlich", "ins", "wasser"]),
    (GERMAN[3], ["eine", "frau", "fährt", "fahrrad", "sitzen", "liegen"]),
    ("-Hund- 'Katze' geht's - ein", ["hund", "katze", "geht's", "ein"]),  # joiners join inside a word only
])
def test_german_is_lowered_by_unicode_and_stripped_of_punctuation_as_english_is(caption: str, words: list[str]) -> None:
    assert tokenize(caption, language="de") == words


def test_sharp_s_is_kept_and_capitals_with_umlauts_become_small_ones() -> None:
    assert tokenize("STRASSE Straße GROẞ Äpfel Öl Übung", language="de") == [
        "strasse", "straße", "groß", "äpfel", "öl", "übung"]  # a case fold would make "straße" "strasse"


def test_no_word_is_split_at_an_umlaut_however_it_was_typed() -> None:
    decomposed = unicodedata.normalize("NFD", "Müde Bären überqueren den Fluß")  # u + U+0308, as some keyboards
    assert decomposed != unicodedata.normalize("NFC", decomposed)
    assert tokenize(decomposed, language="de") == ["müde", "bären", "überqueren", "den", "fluß"]


def test_marks_that_sit_on_letters_stay_in_their_word_in_any_script() -> None:
    # Devanagari's vowel signs are marks (category Mc/Mn), not letters: a word is not cut at them
    assert tokenize("नमस्ते दुनिया।", language="hi") == ["नमस्ते", "दुनिया"]


def test_english_keeps_the_treebank_rules_and_other_languages_name_their_own_tokenization() -> None:
    assert tokenize("A dog's ball, red.") == ["a", "dog", "'s", "ball", "red"]  # English clitics, as trained
    assert tokenize("A dog's ball, red.", language="de") == ["a", "dog's", "ball", "red"]
    assert tokenization("de") != tokenization("en")  # so their kept token files never mix


def test_no_word_seen_at_least_the_threshold_becomes_unk() -> None:
    captions = [GERMAN[i % len(GERMAN)] for i in range(10)] + ["Ein Bär.", "Ein Bär läuft."]
    tokens = Tokenized.of([captions], language="de")
    counts = Counter(word for caption in tokens[0] for word in caption)
    vocab = Vocabulary.from_counts(tokens.counts(), min_count=2)
    assert {word for word, count in counts.items() if count >= 2} <= set(vocab.words)
    assert "bär" in vocab.index and "läuft" not in vocab.index  # twice, once
    encoded = vocab.encode(tokenize("Zwei Hunde laufen über die Straße.", language="de"))
    assert vocab.unk_id not in encoded


# a split file and captions of its images in Flickr8k's token format ---------------------------------

def _flickr(root: Path, *, captions: str) -> Path:
    entries = [{"filename": f"{name}.jpg", "split": split, "imgid": i, "sentences": [{"raw": f"An image {i}."}]}
               for i, (name, split) in enumerate([("a", "train"), ("b", "train"), ("c", "train"), ("d", "val")])]
    (root / "dataset_flickr8k.json").write_text(json.dumps({"images": entries}))
    (root / "captions.txt").write_text(captions, encoding="utf-8")
    return root


def _config(root: Path, *overrides: str):
    return load_config(REPO / "configs" / "flickr8k_de_soft.yaml",
                       [f"data.root={root}", "data.image_dir=.", "data.token_file=captions.txt", *overrides])


def test_the_token_file_gives_each_photo_its_captions_and_a_photo_without_one_is_left_out_said_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _flickr(tmp_path, captions="a.jpg#0\tEin Hund läuft.\na.jpg#1\tEin brauner Hund.\n\n"
                               "c.jpg#0\tEine Straße.\nd.jpg#0\tZwei Kinder.\nz.jpg#0\tNicht im Split.\n")
    config = _config(tmp_path)
    train = read_records(config.data, "train")
    assert [(r.path.name, r.captions) for r in train] == [("a.jpg", ("Ein Hund läuft.", "Ein brauner Hund.")),
                                                         ("c.jpg", ("Eine Straße.",))]
    read_records(config.data, "train")  # read again, as a run does: said once
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"note: {tmp_path / 'captions.txt'}: train: 1 of 3 images have no caption there, left out"]
    assert [r.captions for r in read_records(config.data, "val")] == [("Zwei Kinder.",)]


def test_the_english_token_file_reads_as_the_split_files_own_sentences(tmp_path: Path) -> None:
    _flickr(tmp_path, captions="".join(f"{name}.jpg#0\tAn image {i}.\n" for i, name in enumerate("abcd")))
    for split in ("train", "val"):
        from_file = read_records(_config(tmp_path, "data.language=en").data, split)
        assert from_file == read_split(tmp_path / "dataset_flickr8k.json", split, image_root=tmp_path)


@pytest.mark.parametrize("captions, problem", [
    ("a.jpg#0 Ein Hund ohne Tab.\n", "line 1 is not '<image file>#<i><TAB><caption>'"),
    ("a.jpg#0\tgut\nkein_hash\tEin Hund.\n", "line 2 is not"),
    ("x.jpg#0\tEin Hund.\n", "no caption of any of the 3 images of split 'train'"),
])
def test_a_token_file_that_cannot_be_read_is_one_line_naming_it(tmp_path: Path, captions: str, problem: str) -> None:
    _flickr(tmp_path, captions=captions)
    with pytest.raises(DatasetError, match=problem) as error:
        read_records(_config(tmp_path).data, "train")
    assert str(tmp_path / "captions.txt") in str(error.value)


def test_a_token_file_with_a_byte_order_mark_or_a_line_separator_in_a_caption_reads_whole(tmp_path: Path) -> None:
    """A byte-order mark was read into the first image's name, which then lost that caption; U+2028 or
    a form feed inside a caption cut its line in two, and the run stopped on the half with no tab."""
    (tmp_path / "captions.txt").write_bytes("\ufeffa.jpg#0\tEin Hund.\r\na.jpg#1\tEin Hund\u2028rennt.\r\n"
                                            "b.jpg#0\tEine\x0cKatze.\n".encode())
    assert read_token_file(tmp_path / "captions.txt") == {"a.jpg": ["Ein Hund.", "Ein Hund\u2028rennt."],
                                                          "b.jpg": ["Eine\x0cKatze."]}


def test_a_token_file_not_in_utf8_or_missing_is_one_line_naming_it(tmp_path: Path) -> None:
    (tmp_path / "latin1.txt").write_bytes("a.jpg#0\tEin Bär.\n".encode("latin-1"))
    with pytest.raises(DatasetError, match=r"latin1.txt: not UTF-8 text \(byte 13\)"):
        read_token_file(tmp_path / "latin1.txt")
    with pytest.raises(DatasetError, match="nowhere.txt: captions file not found"):
        read_token_file(tmp_path / "nowhere.txt")


@pytest.mark.parametrize("overrides, problem", [
    (["data.language=German"], "data.language 'German' is not a language tag"),
    (["data.mirror=true"], "data.mirror swaps the English words for left and right"),
    (["data.dataset=shapes"], "data.token_file is read beside a Karpathy-format split file"),
])
def test_settings_no_run_can_use_with_a_language_are_refused(overrides: list[str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_config(REPO / "configs" / "flickr8k_de_soft.yaml", overrides)


def test_any_language_tag_is_taken_and_english_mirrors() -> None:
    for tag in ("de", "pt-BR", "zh-Hant", "fil"):
        assert load_config(REPO / "configs" / "flickr8k_de_soft.yaml", [f"data.language={tag}"]).data.language == tag
    assert load_config(REPO / "configs" / "flickr8k_soft.yaml", ["data.mirror=true"]).data.mirror
