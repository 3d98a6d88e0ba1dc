"""Caption metrics on partial matches, against numbers counted by hand (n-gram by n-gram, below).

BLEU (Papineni et al., 2002): clipped n-gram precisions p_1..p_n, their geometric mean, a brevity
penalty when the candidate is shorter than the closest reference. CIDEr-D (Vedantam et al., 2015):
per n, the cosine of tf-idf vectors with the candidate's counts clipped at the reference's, times
exp(-(bigram-count difference)^2 / (2 * 6^2)), averaged over n = 1..4, times 10.
"""

from __future__ import annotations

import math
import os
import sys

import pytest

from captioning.eval.metrics import _java_chatter_held, caption_metrics, java_available
from captioning.train.cider import CiderD

# BLEU: one image, two references, all of 7 words: no brevity penalty.
BLEU_REFERENCES = {0: ["a red circle above a blue square", "a blue square below a red circle"]}
BLEU_CANDIDATE = {0: "a red circle above a red square"}
# unigrams: a x2 (clip 2), red x2 (clip 1: no reference has two), circle, above, square -> 6 / 7
# bigrams: a red x2 (clip 1), red circle, circle above, above a; red square misses -> 4 / 6
# trigrams: a red circle, red circle above, circle above a; above a red, a red square miss -> 3 / 5
# 4-grams: a red circle above, red circle above a; circle above a red, above a red square miss -> 2 / 4
PRECISIONS = (6 / 7, 4 / 6, 3 / 5, 2 / 4)
BLEU = {f"Bleu_{n}": math.prod(PRECISIONS[:n]) ** (1 / n) for n in range(1, 5)}

# CIDEr-D: two images, one reference each. "a" is in both references: idf log(2/2) = 0; every other
# n-gram has idf g = log 2 (an n-gram in no reference too: pycocoevalcap takes log max(1, df)).
CIDER_REFERENCES = {0: ["a red circle"], 1: ["a blue square"]}
CIDER_CANDIDATES = {0: "a red square shape", 1: "a blue blue square"}
PENALTY = math.exp(-(1 ** 2) / (2 * 6 ** 2))  # both candidates have 3 bigrams, their references 2
# image 0: n=1 red is shared: g^2 / (sqrt(3) g * sqrt(2) g); n=2 "a red" alike; n=3, n=4 share nothing
CIDER_0 = 10 / 4 * (1 / math.sqrt(6) + 1 / math.sqrt(6)) * PENALTY
# image 1: n=1 blue counts 2 in the candidate, clipped to the reference's 1: (min(2g, g) g + g g) / (sqrt(5) g *
# sqrt(2) g); n=2 "a blue", "blue square" shared: 2 g^2 / (sqrt(3) g * sqrt(2) g); n=3, n=4 share nothing
CIDER_1 = 10 / 4 * (2 / math.sqrt(10) + 2 / math.sqrt(6)) * PENALTY


def test_bleu_1_to_4_on_a_partial_match_are_the_clipped_precisions_counted_by_hand() -> None:
    metrics = caption_metrics(BLEU_REFERENCES, BLEU_CANDIDATE, full=False)
    for name, value in BLEU.items():
        assert metrics[name] == pytest.approx(value, rel=1e-6), name
    assert len({round(v, 6) for v in BLEU.values()}) == 4  # four different numbers: a name swap shows


def test_bleu_brevity_penalty_on_a_short_candidate() -> None:
    # 4 words against the closest reference of 7: BP = exp(1 - 7/4); "a red circle above" matches 4/4, 3/3, 2/2, 1/1
    metrics = caption_metrics(BLEU_REFERENCES, {0: "a red circle above"}, full=False)
    assert metrics["Bleu_4"] == pytest.approx(math.exp(1 - 7 / 4), rel=1e-6)


def test_cider_d_of_pycocoevalcap_on_a_partial_match_is_the_hand_count() -> None:
    metrics = caption_metrics(CIDER_REFERENCES, CIDER_CANDIDATES, full=False)
    assert metrics["CIDEr"] == pytest.approx((CIDER_0 + CIDER_1) / 2, rel=1e-6)


def test_the_projects_cider_d_on_a_partial_match_is_the_hand_count() -> None:
    cider = CiderD([[reference.split() for reference in CIDER_REFERENCES[i]] for i in (0, 1)])
    scores = cider.scores([CIDER_CANDIDATES[i].split() for i in (0, 1)], [0, 1])
    assert scores.tolist() == pytest.approx([CIDER_0, CIDER_1], rel=1e-6)


@pytest.mark.skipif(not java_available(), reason="java is not installed (make test requires it)")
def test_java_metrics_meteor_and_the_ptb_tokenizer() -> None:
    """With Java: METEOR is scored, and BLEU and ROUGE-L on the PTB tokenizer's tokens are still the
    hand counts (these captions tokenize alike). METEOR 1.5 weighs content and function words and
    penalizes fragmentation, so it is not counted by hand; its bound below 6/7 keeps ROUGE-L or
    BLEU-1 (both 6/7 here) from passing as METEOR (measured: 0.427)."""
    metrics = caption_metrics(BLEU_REFERENCES, BLEU_CANDIDATE, full=True)
    assert 0.3 < metrics["METEOR"] < 0.6
    for name, value in BLEU.items():
        assert metrics[name] == pytest.approx(value, rel=1e-6), name
    # ROUGE-L: the longest common subsequence with the first reference is 6 of 7 words both ways
    assert metrics["ROUGE_L"] == pytest.approx(6 / 7, rel=1e-6)


@pytest.mark.skipif(not java_available(), reason="java is not installed (make test requires it)")
def test_the_ptb_tokenizers_java_prints_nothing_among_the_results(capfd: pytest.CaptureFixture[str]) -> None:
    """Its Java writes a line a call to the process's stderr ("PTBTokenizer tokenized 99 tokens at
    ..."), under eval.py's table of numbers."""
    caption_metrics(BLEU_REFERENCES, BLEU_CANDIDATE, full=True)
    assert "PTBTokenizer" not in capfd.readouterr().err


def test_what_java_printed_is_shown_when_the_call_fails(capfd: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError), _java_chatter_held():
        os.write(2, b"Error: could not find or load main class\n")
        raise RuntimeError("the tokenizer failed")
    assert "could not find or load main class" in capfd.readouterr().err
    with _java_chatter_held():
        os.write(2, b"PTBTokenizer tokenized 9 tokens\n")
    print("after", file=sys.stderr)
    assert capfd.readouterr().err == "after\n"  # stderr is the process's again


# Where the two tokenizers can part: contractions, hyphens, numbers, quotes, symbols (docs/metrics.md).
HARD_CASES = {
    1: ["A man in a t-shirt can't find his e-mail.", "a man in a T-shirt cannot find the e-mail",
        "The man's t-shirt is blue; he's reading e-mail."],
    2: ["Two dogs ($5 each) are gonna run 3.5 miles!", "two dogs are going to run 3.5 miles",
        "2 dogs run for 3.5 miles, they're fast."],
    3: ["A 5'10\" woman holds a \"STOP\" sign.", "a woman holding a stop sign",
        "The woman's sign says 'stop' in red."],
    4: ["Don't park here: a no-parking sign & a cone.", "a no parking sign next to a cone",
        "A sign that reads \"don't park\", and an orange cone."],
}


def _tokenizer_gap(references: dict[int, list[str]]) -> dict[str, tuple[float, float]]:
    """metric -> (PTB tokenizer with Java, the project's tokenizer), each image's first reference
    scored as the candidate against its others."""
    from unittest import mock

    import captioning.eval.metrics as metrics

    candidates = {i: refs[0] for i, refs in references.items()}
    rest = {i: refs[1:] for i, refs in references.items()}
    standard = metrics.caption_metrics(rest, candidates, full=True)
    with mock.patch.object(metrics, "java_available", lambda: False), mock.patch("sys.stderr"):
        fallback = metrics.caption_metrics(rest, candidates, full=True)
    assert "METEOR" in standard and "METEOR" not in fallback  # the one with Java, the one without
    return {name: (standard[name], fallback[name]) for name in fallback}


@pytest.mark.skipif(not java_available(), reason="java is not installed (make test requires it)")
def test_the_java_free_tokenization_scores_the_shapes_and_fake_coco_captions_as_the_ptb_tokenizer_does(
        shapes_root) -> None:
    """Without Java, BLEU, ROUGE-L and CIDEr are computed on the project's tokenization. On the shapes
    references and the fake COCO's typed captions (curly quotes, capitals, punctuation) the numbers
    equal the PTB tokenizer's (docs/metrics.md); captions with contractions, hyphens and numbers move
    them (up to 0.25 CIDEr on HARD_CASES), which this test also sees."""
    from captioning.data.formats.karpathy import read_split
    from tests.data.test_coco import _captions

    shapes = {r.image_id: list(r.captions) for r in read_split(shapes_root / "dataset_shapes.json", "test")}
    fake_coco = {i: _captions(split, i) for i, split in enumerate(["train"] * 5 + ["val"])}
    for references in (shapes, fake_coco):
        for name, (ptb, own) in _tokenizer_gap(references).items():
            assert own == pytest.approx(ptb, abs=1e-9), name
    assert max(abs(ptb - own) for ptb, own in _tokenizer_gap(HARD_CASES).values()) > 0.1  # they part elsewhere


def _meteor_in_a_child(references, candidates, queue) -> None:
    queue.put(caption_metrics(references, candidates, full=True)["METEOR"])


@pytest.mark.skipif(not java_available(), reason="java is not installed (make test requires it)")
def test_one_meteor_server_a_process_scores_each_call_as_a_fresh_one_would(monkeypatch) -> None:
    """METEOR's Java takes seconds to start, so a process starts it once and asks it again: each call
    must score as a server of its own would. One that fails mid-answer is stopped and dropped, and a
    forked child starts its own rather than talk over its parent's pipes. (Last in its file: it ends
    with the server stopped.)"""
    import multiprocessing

    from pycocoevalcap.meteor import meteor

    from captioning.eval import metrics

    other_references = {1: ["a dog runs on the grass", "the dog is running outside"],
                        2: ["two people ride bicycles", "cyclists on a road"]}
    other_candidates = {1: "a dog is running on grass", 2: "two people on bikes"}
    started = []  # servers started here (one, unless an earlier test of this process left one running)
    real, real_init = meteor.Meteor, meteor.Meteor.__init__
    monkeypatch.setattr(meteor.Meteor, "__init__", lambda self: started.append(1) or real_init(self))
    first = caption_metrics(BLEU_REFERENCES, BLEU_CANDIDATE, full=True)["METEOR"]
    second = caption_metrics(other_references, other_candidates, full=True)["METEOR"]
    again = caption_metrics(BLEU_REFERENCES, BLEU_CANDIDATE, full=True)["METEOR"]
    assert len(started) <= 1 and again == first
    # a server of its own, in a process of its own (python -c, these captions alone), gave 0.27764874307317233
    assert second == pytest.approx(0.27764874307317233, rel=1e-9)

    class StandIn:  # for the child: no Java started to see which server it asks
        def __init__(self):
            self.lock = type("Lock", (), {"locked": lambda _: False})()
            self.meteor_p = type("Process", (), {"kill": lambda _: None, "wait": lambda _: None})()

        def compute_score(self, gts, res):
            return 0.5, []

    monkeypatch.setattr(meteor, "Meteor", StandIn)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_meteor_in_a_child, args=(other_references, other_candidates, queue))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0 and queue.get(timeout=5) == 0.5  # its own scorer, not the parent's server
    monkeypatch.setattr(meteor, "Meteor", real)
    assert caption_metrics(BLEU_REFERENCES, BLEU_CANDIDATE, full=True)["METEOR"] == first  # the parent's, unharmed
    server = metrics._meteors[os.getpid()]

    def cut_off(self, gts, res):  # as a reply that does not parse leaves it: the lock held
        self.lock.acquire()
        raise ValueError("cut off")

    monkeypatch.setattr(meteor.Meteor, "compute_score", cut_off)
    with pytest.raises(ValueError, match="cut off"):
        caption_metrics(BLEU_REFERENCES, BLEU_CANDIDATE, full=True)
    assert os.getpid() not in metrics._meteors and server.meteor_p.poll() is not None  # stopped, never asked again
    assert not server.lock.locked() and len(started) <= 1
