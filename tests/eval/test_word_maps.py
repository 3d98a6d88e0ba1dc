"""The maps of self-attention over the words (model.extras.word_attention) come out of the Python
API beside the image maps, and the overlay page shades the earlier words by them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from captioning.api import Captioner
from captioning.cli import main
from captioning.train.loop import fit


@pytest.fixture(scope="module")
def word_run(tiny_config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("word_run")
    fit(tiny_config(out, "model.extras.word_attention=true", "model.extras.grid_attention=2", "train.max_steps=30"))
    return out / "best.pt"


def test_each_word_comes_with_its_weights_over_start_and_the_words_before_it(word_run, tiny_run) -> None:
    scene = sorted((tiny_run.data_root / "images" / "test").glob("*.png"))[0]
    result = Captioner.from_checkpoint(word_run, device="cpu").caption(str(scene), beam_size=2)
    n = len(result.tokens)
    assert n > 1 and result.alphas.shape[0] == n and result.word_alphas.shape == (n, n)
    np.testing.assert_allclose(result.word_alphas.sum(1), np.ones(n), rtol=1e-5)
    assert np.all(np.triu(result.word_alphas, k=1) == 0)  # nothing on words not said yet
    plain = Captioner.from_checkpoint(tiny_run.checkpoint, device="cpu").caption(str(scene))
    assert plain.word_alphas is None  # the paper's model attends over no words


def test_the_page_shades_the_earlier_words_by_the_weights_of_the_word_shown(word_run, tiny_run,
                                                                             tmp_path: Path) -> None:
    scene = sorted((tiny_run.data_root / "images" / "test").glob("*.png"))[1]
    assert main(["caption", "--checkpoint", str(word_run), str(scene), "--overlays", str(tmp_path)]) == 0
    result = Captioner.from_checkpoint(word_run, device="cpu").caption(str(scene))
    page = (tmp_path / "index.html").read_text()
    said = [json.loads(s.replace("&quot;", '"')) for s in re.findall(r'data-said="([^"]*)"', page)]
    assert len(said) == len(result.tokens)  # one row of weights per word; the image button has none
    for t, weights in enumerate(said):
        np.testing.assert_allclose(weights, result.word_alphas[t, :t + 1], atol=1e-3)
    row = re.search(r'<span class="said"[^>]*>((?:<span>[^<]*</span>)*)</span>', page)
    words = re.findall(r"<span>([^<]*)</span>", row.group(1))
    assert words == ["&lt;start&gt;", *result.tokens[:-1]]  # what a word can weigh: <start> and the words before
