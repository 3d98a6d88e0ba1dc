"""Evaluation: attention mass in boxes, word-object matching, relation checks, caption metrics, eval.py."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

import captioning.eval.metrics as evaluation
from captioning.cli import eval_main
from captioning.data.formats.karpathy import read_split
from captioning.data.shapes.scenes import SceneObjects, ShapeObject
from captioning.eval.correctness import box_mass, box_share
from captioning.eval.evaluate import scorer_for
from captioning.eval.metrics import OWN_TOKENIZER, PTB_TOKENIZER, caption_metrics, cider_per_image, java_available
from captioning.eval.shapes.scorer import correctness_scores, word_objects

SIDE, GRID = 224, 14
CELL = SIDE / GRID  # 16 pixels


def _one_hot(row: int, column: int, grid: int = GRID) -> np.ndarray:
    alpha = np.zeros((grid, grid), dtype=np.float32)
    alpha[row, column] = 1.0
    return alpha


def _cell_box(row: int, column: int, grow: float = 0.0) -> tuple[float, float, float, float]:
    """The pixels of a grid cell, grown by `grow` cells on every side."""
    return ((column - grow) * CELL, (row - grow) * CELL, (column + 1 + grow) * CELL, (row + 1 + grow) * CELL)


# box_mass / box_share ------------------------------------------------------------------------------


@pytest.mark.parametrize("cell", [(6, 7), (0, 0), (13, 13), (2, 11)])
def test_box_mass_of_a_one_hot_map(cell: tuple[int, int]) -> None:
    alpha = _one_hot(*cell)
    # Bilinear upsampling spreads a cell's weight up to one cell beyond it: a box around that
    # neighbourhood holds all of it, a box far away none.
    assert box_mass(alpha, _cell_box(*cell, grow=1.0), width=SIDE, height=SIDE) == pytest.approx(1.0, abs=1e-6)
    far = ((cell[1] + 7) % GRID, (cell[0] + 7) % GRID)
    assert box_mass(alpha, _cell_box(far[1], far[0]), width=SIDE, height=SIDE) == pytest.approx(0.0, abs=1e-9)
    own = box_mass(alpha, _cell_box(*cell), width=SIDE, height=SIDE)
    assert own > 0.5  # most of it lands on the cell itself
    for neighbour in ((cell[0] + 1, cell[1]), (cell[0], cell[1] - 1)):
        if 0 <= neighbour[0] < GRID and 0 <= neighbour[1] < GRID:
            assert box_mass(alpha, _cell_box(*neighbour), width=SIDE, height=SIDE) < own


def test_whole_image_box_holds_all_mass() -> None:
    alpha = np.random.default_rng(0).random((GRID, GRID))
    assert box_mass(alpha, (0, 0, SIDE, SIDE), width=SIDE, height=SIDE) == pytest.approx(1.0)


@pytest.mark.parametrize("box", [(0, 0, 112, 224), (10, 20, 60, 100), (100, 100, 132, 132)])
def test_uniform_map_gives_the_box_area_share(box: tuple[float, float, float, float]) -> None:
    area = (box[2] - box[0]) * (box[3] - box[1]) / SIDE**2
    uniform = box_mass(np.full((GRID, GRID), 1 / GRID**2), box, width=SIDE, height=SIDE)
    assert uniform == pytest.approx(area, rel=0.02)
    assert box_share(box, width=SIDE, height=SIDE) == pytest.approx(area, rel=0.02)
    assert box_share(box, width=SIDE, height=SIDE) == pytest.approx(uniform, rel=1e-6)


# word_objects and correctness_scores -----------------------------------------------------------------


def _words(text: str) -> list[str]:
    return text.split()


RED_CIRCLE = ShapeObject("circle", "red", "small", (16.0, 96.0, 48.0, 128.0))  # left, middle row
BLUE_SQUARE = ShapeObject("square", "blue", "large", (160.0, 80.0, 208.0, 128.0))  # right, middle row
GREEN_CIRCLE = ShapeObject("circle", "green", "small", (96.0, 0.0, 128.0, 32.0))  # top centre


def test_word_objects_matches_named_shapes() -> None:
    objects = [RED_CIRCLE, BLUE_SQUARE]
    words = _words("a red circle to the left of a blue square")
    assert word_objects(words, objects) == [(2, 0), (9, 1)]
    assert word_objects(_words("a blue square and a red circle"), objects) == [(2, 1), (6, 0)]
    assert word_objects(_words("a green triangle"), objects) == []  # absent from the image: skipped
    assert word_objects(_words("a yellow diamond above a red circle"), objects) == [(6, 0)]
    assert word_objects(_words("a circle"), objects) == [(1, 0)]  # unambiguous without a colour


def test_word_objects_uses_colour_to_disambiguate() -> None:
    objects = [RED_CIRCLE, BLUE_SQUARE, GREEN_CIRCLE]
    assert word_objects(_words("a green circle"), objects) == [(2, 2)]
    assert word_objects(_words("a red circle"), objects) == [(2, 0)]
    assert word_objects(_words("a circle"), objects) == []  # two circles: ambiguous, skipped


def test_correctness_scores_checks_relations_and_attention() -> None:
    truth = SceneObjects(objects=[RED_CIRCLE, BLUE_SQUARE], width=SIDE, height=SIDE)
    true_words = _words("a small red circle to the left of a large blue square")
    false_words = _words("a red circle to the right of a blue square")
    wrong_axis = _words("a red circle above a blue square")
    alphas = np.full((len(true_words), GRID, GRID), 1 / GRID**2, dtype=np.float32)
    alphas[3] = _one_hot(6, 1)  # "circle" looks at the circle (cell centre x 24, y 104)
    alphas[11] = _one_hot(13, 0)  # "square" looks at the bottom left corner, far from the square
    correct, chance, relations = correctness_scores(true_words, alphas, truth)
    assert relations == ["true"]
    assert len(correct) == len(chance) == 2
    assert correct[0] > 0.5 and correct[1] == pytest.approx(0.0, abs=1e-9)
    assert chance[0] == pytest.approx(box_share(RED_CIRCLE.box, width=SIDE, height=SIDE))
    assert chance[1] == pytest.approx(48 * 48 / SIDE**2, rel=0.02)
    assert correct[0] > 5 * chance[0]

    _, _, relations = correctness_scores(false_words, alphas[: len(false_words)], truth)
    assert relations == ["wrong"]
    _, _, relations = correctness_scores(wrong_axis, alphas[: len(wrong_axis)], truth)
    assert relations == ["wrong"]  # the two differ most along x, so "above" is not what holds
    _, _, relations = correctness_scores(_words("a blue square to the right of a red circle"), alphas, truth)
    assert relations == ["true"]


@pytest.mark.parametrize("stated", ["to the left of", "to the right of", "above", "below"])
def test_correctness_scores_relation_of_an_object_to_itself_is_false(stated) -> None:
    """A decoder that names A again as B ("a red circle to the right of a red circle") states
    nothing true. relation(A, A) returns "to the right of" (no offset on either axis), which a
    scorer that did not check for it counted as true."""
    truth = SceneObjects(objects=[RED_CIRCLE, BLUE_SQUARE], width=SIDE, height=SIDE)
    words = _words(f"a red circle {stated} a red circle")
    alphas = np.full((len(words), GRID, GRID), 1 / GRID**2, dtype=np.float32)
    _, _, relations = correctness_scores(words, alphas, truth)
    assert relations == ["self"]


def test_correctness_scores_relation_with_an_absent_object_is_false() -> None:
    truth = SceneObjects(objects=[RED_CIRCLE, BLUE_SQUARE], width=SIDE, height=SIDE)
    words = _words("a red circle to the left of a yellow diamond")
    alphas = np.full((len(words), GRID, GRID), 1 / GRID**2, dtype=np.float32)
    correct, _, relations = correctness_scores(words, alphas, truth)
    assert relations == ["absent"] and len(correct) == 1


# caption_metrics -----------------------------------------------------------------------------------

REFERENCES = {
    1: ["a red circle to the left of a blue square", "two shapes a red circle and a blue square"],
    2: ["a small yellow diamond on a light background", "a yellow diamond in the centre"],
    3: ["a green triangle above a purple circle", "a purple circle below a green triangle"],
}
IDENTICAL = {i: refs[0] for i, refs in REFERENCES.items()}
UNRELATED = {i: "zebras graze quietly near an old river bank" for i in REFERENCES}


def test_caption_metrics_identical_and_unrelated() -> None:
    same = caption_metrics(REFERENCES, IDENTICAL, full=False)
    assert {f"Bleu_{n}" for n in range(1, 5)} | {"CIDEr"} <= set(same)
    assert "METEOR" not in same
    assert same["Bleu_4"] == pytest.approx(1.0, abs=1e-6)
    assert same["CIDEr"] > 1.0
    other = caption_metrics(REFERENCES, UNRELATED, full=False)
    assert other["Bleu_4"] == pytest.approx(0.0, abs=1e-6)
    assert other["CIDEr"] == pytest.approx(0.0, abs=1e-6)
    assert other["Bleu_1"] < same["Bleu_1"]


def test_caption_metrics_use_the_project_tokenization() -> None:
    shouting = {i: caption.upper() + "." for i, caption in IDENTICAL.items()}
    assert caption_metrics(REFERENCES, shouting, full=False)["Bleu_4"] == pytest.approx(1.0, abs=1e-6)


@pytest.mark.skipif(not java_available(), reason="java is not installed")
def test_caption_metrics_full_with_java() -> None:
    metrics = caption_metrics(REFERENCES, IDENTICAL, full=True)
    assert {"Bleu_4", "METEOR", "ROUGE_L", "CIDEr"} <= set(metrics)
    assert metrics["METEOR"] > 0.9 and metrics["ROUGE_L"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["Bleu_4"] == pytest.approx(1.0, abs=1e-6)


def test_caption_metrics_without_java_warn_and_still_score(monkeypatch, capsys) -> None:
    monkeypatch.setattr(evaluation, "java_available", lambda: False)
    metrics = caption_metrics(REFERENCES, IDENTICAL, full=True)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "METEOR, SPICE and the PTB tokenizer need it" in err[0] and OWN_TOKENIZER in err[0]
    assert "METEOR" not in metrics
    assert {"Bleu_1", "Bleu_4", "ROUGE_L", "CIDEr"} <= set(metrics)
    assert metrics["ROUGE_L"] == pytest.approx(1.0, abs=1e-6) and metrics["Bleu_4"] == pytest.approx(1.0, abs=1e-6)


# eval.py on the tiny checkpoint --------------------------------------------------------------------


@pytest.mark.parametrize("java", [True, False])
def test_eval_prints_and_writes_the_tokenizer_its_metrics_were_computed_on(java, tiny_run, tmp_path, monkeypatch,
                                                                          capsys) -> None:
    """The two tokenizations give different numbers (docs/metrics.md): each number says which it is."""
    if java and not java_available():
        pytest.skip("java is not installed")
    monkeypatch.setattr(evaluation, "java_available", lambda: java)
    out = tmp_path / "metrics.json"
    assert eval_main(["--checkpoint", str(tiny_run.checkpoint), "--beam-size", "1", "--out", str(out),
                      f"data.root={tiny_run.data_root}"]) == 0
    label = PTB_TOKENIZER if java else OWN_TOKENIZER
    assert re.search(rf"^  tokenizer +{re.escape(label)}$", capsys.readouterr().out, flags=re.MULTILINE)
    written = json.loads(out.read_text())
    assert written["tokenizer"] == label and ("METEOR" in written) == java


def test_evaluate_checkpoint_scores_the_test_split_on_the_cpu_by_default(tiny_run) -> None:
    from captioning.eval.evaluate import evaluate_checkpoint

    evaluation = evaluate_checkpoint(tiny_run.checkpoint, overrides=[f"data.root={tiny_run.data_root}"], beam_size=1)
    test_ids = [r.image_id for r in read_split(tiny_run.data_root / "dataset_shapes.json", "test")]
    assert [r["image_id"] for r in evaluation.results] == test_ids and evaluation.beam_size == 1


def test_a_fine_tuned_checkpoint_is_scored_on_its_own_encoders_annotations_without_the_cache(tiny_run,
                                                                                          tmp_path: Path) -> None:
    """Its encoder's weights are in the checkpoint: the images are encoded live with them (here all
    zero, so every image looks alike and gets one caption), and no feature cache is read or made."""
    import shutil

    import torch

    from captioning.checkpoint import load_trained
    from captioning.eval.evaluate import evaluate_checkpoint

    root = tmp_path / "shapes"  # the tiny data without its feature cache
    root.mkdir()
    for item in tiny_run.data_root.iterdir():
        if item.name != "features":
            (root / item.name).symlink_to(item)
    model = load_trained(tiny_run.checkpoint).model()
    payload = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    payload["encoder"] = {name: torch.zeros_like(value) if value.is_floating_point() else value
                          for name, value in model.encoder.state_dict().items()}
    tuned = tmp_path / "tuned.pt"
    torch.save(payload, tuned)
    evaluation = evaluate_checkpoint(tuned, overrides=[f"data.root={root}"], beam_size=1)
    assert len({r["caption"] for r in evaluation.results}) == 1 and len(evaluation.results) == 8
    assert "attention_correctness" in evaluation.metrics  # scored on the checkpoint's grid
    assert not (root / "features").exists()
    cached = evaluate_checkpoint(tiny_run.checkpoint, overrides=[f"data.root={tiny_run.data_root}"], beam_size=1)
    assert len({r["caption"] for r in cached.results}) > 1  # the real annotations tell the images apart
    shutil.rmtree(root)


def test_an_ensemble_with_a_fine_tuned_member_is_scored_on_the_images_as_it_captions_them(tiny_run,
                                                                                          tmp_path: Path) -> None:
    """A fine-tuned checkpoint beside a frozen one: each decoder reads its own encoder's annotations,
    so the split's images are encoded live (no feature cache read or made), and the captions scored
    are those the Python API gives for the same image files."""
    import torch

    from captioning.api import Captioner
    from captioning.checkpoint import load_trained
    from captioning.eval.evaluate import evaluate_checkpoint

    root = tmp_path / "shapes"  # the tiny data without its feature cache
    root.mkdir()
    for item in tiny_run.data_root.iterdir():
        if item.name != "features":
            (root / item.name).symlink_to(item)
    generator = torch.Generator().manual_seed(3)
    payload = torch.load(tiny_run.checkpoint, map_location="cpu", weights_only=True)
    payload["encoder"] = {name: value * (1 + 0.2 * torch.randn(value.shape, generator=generator))
                          if value.is_floating_point() else value
                          for name, value in load_trained(tiny_run.checkpoint).encoder().state_dict().items()}
    tuned = tmp_path / "tuned.pt"
    torch.save(payload, tuned)
    checkpoints = [tiny_run.checkpoint, tuned]  # the frozen one first: its config names the data
    evaluation = evaluate_checkpoint(checkpoints, split="val", overrides=[f"data.root={root}"], beam_size=2)
    assert not (root / "features").exists()
    files = {r.image_id: r.path for r in read_split(root / "dataset_shapes.json", "val")}
    captioner = Captioner.from_checkpoint(checkpoints, device="cpu", overrides=["decode.beam_size=2"])
    said = captioner.caption([files[r["image_id"]] for r in evaluation.results])
    assert [r["caption"] for r in evaluation.results] == [result.caption for result in said]
    alone = evaluate_checkpoint(tiny_run.checkpoint, split="val", overrides=[f"data.root={tiny_run.data_root}"],
                                beam_size=2)
    assert [r["caption"] for r in alone.results] != [r["caption"] for r in evaluation.results]  # the tuned one heard


def test_evaluate_checkpoint_hands_the_splits_scoring_its_settings(tiny_run, monkeypatch) -> None:
    import captioning.eval.evaluate as evaluate

    handed = {}

    def scoring(decoder, annotations, **settings):
        handed.update(settings)
        return {}, []

    monkeypatch.setattr(evaluate, "evaluate_split", scoring)
    overrides = [f"data.root={tiny_run.data_root}", "data.max_bad_images=0.25", "decode.length_penalty=0.5"]
    evaluate.evaluate_checkpoint(tiny_run.checkpoint, overrides=overrides)
    assert {k: handed[k] for k in ("beam_size", "max_length", "length_penalty", "device", "hard_choice",
                                   "max_bad_images")} == {"beam_size": 2, "max_length": 12, "length_penalty": 0.5,
                                                          "device": "cpu", "hard_choice": "expectation",
                                                          "max_bad_images": 0.25}


def test_evaluate_checkpoint_names_the_checkpoint_in_its_errors(tiny_run, tmp_path: Path) -> None:
    import torch

    from captioning.config import ConfigError
    from captioning.eval.evaluate import evaluate_checkpoint

    checkpoint, data = str(tiny_run.checkpoint), f"data.root={tiny_run.data_root}"
    with pytest.raises(ConfigError, match=rf"^{re.escape(checkpoint)}: config with overrides: .*decode.beam_size"):
        evaluate_checkpoint(checkpoint, overrides=[data, "decode.beam_size=0"])
    with pytest.raises(ConfigError, match=rf"^{re.escape(checkpoint)}: decode.hard_choice=argmax applies to hard"):
        evaluate_checkpoint(checkpoint, overrides=[data], hard_choice="argmax")
    payload = torch.load(checkpoint, map_location="cpu", weights_only=True)
    payload["config"]["model"]["hidden_dim"] = -1
    broken = tmp_path / "broken.pt"
    torch.save(payload, broken)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(broken))}: config: .*hidden_dim"):
        evaluate_checkpoint(broken, overrides=[data])


def test_eval_main_writes_metrics_and_results(tiny_run, tmp_path: Path, capsys) -> None:
    out = tmp_path / "eval" / "metrics.json"
    code = eval_main(["--checkpoint", str(tiny_run.checkpoint), "--split", "test", "--beam-size", "2",
                      "--out", str(out), f"data.root={tiny_run.data_root}"])
    assert code == 0
    metrics = json.loads(out.read_text())
    expected = {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "ROUGE_L", "CIDEr", "attention_correctness",
                "attention_correctness_chance", "relation_accuracy", "relation_probe_accuracy"}
    if java_available():
        expected.add("METEOR")
    assert expected <= set(metrics), expected - set(metrics)
    assert metrics["split"] == "test" and metrics["beam_size"] == 2
    stated = metrics["relations_generated"]  # each stated relation gets one verdict
    held = round(metrics["relation_accuracy"] * stated) if stated else 0
    assert held + metrics["relations_wrong"] + metrics["relations_self"] + metrics["relations_absent"] == stated
    assert all(0.0 <= metrics[f"Bleu_{n}"] <= 1.0 for n in range(1, 5))
    if metrics["attention_words"]:
        assert 0.0 < metrics["attention_correctness_chance"] < 0.5  # shapes are small against the image
        assert 0.0 <= metrics["attention_correctness"] <= 1.0
    else:
        assert math.isnan(metrics["attention_correctness"])
    results = json.loads((out.parent / "metrics_captions.json").read_text())
    test_ids = [r.image_id for r in read_split(tiny_run.data_root / "dataset_shapes.json", "test")]
    assert [r["image_id"] for r in results] == test_ids
    assert all(set(r) == {"image_id", "caption"} and isinstance(r["caption"], str) for r in results)
    assert any(r["caption"] for r in results)
    printed = capsys.readouterr().out
    assert "CIDEr" in printed and str(out) in printed
    assert metrics["CIDEr"] >= 0.0


def test_eval_main_bad_override_is_one_line_error(tiny_run, capsys) -> None:
    code = eval_main(["--checkpoint", str(tiny_run.checkpoint), "data.nonsense=1"])
    assert code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nonsense" in err[0]


def test_evaluate_split_without_the_probe_scores_the_same_decoding(tiny_run) -> None:
    from captioning.checkpoint import decoder_from_checkpoint, load_checkpoint
    from captioning.config import load_config
    from captioning.data.splits import load_splits
    from captioning.data.vocab import Vocabulary
    from captioning.eval.evaluate import evaluate_split

    config = load_config(None, list(tiny_run.overrides))
    payload = load_checkpoint(tiny_run.checkpoint)
    test = load_splits(config, ("test",))["test"]
    vocab = Vocabulary(payload["vocab"])
    scored = [evaluate_split(decoder_from_checkpoint(payload, config), test.annotations, image_ids=test.image_ids,
                             references=test.references, vocab=vocab, grid=test.grid,
                             scorer=scorer_for(test, vocab, probe=probe), beam_size=2, full=False)
              for probe in (True, False)]
    (with_probe, results), (without, same_results) = scored
    assert results == same_results
    assert "relation_probe_accuracy" in with_probe and not any(key.startswith("relation_probe") for key in without)
    rest = {k: v for k, v in with_probe.items() if not k.startswith("relation_probe")}
    assert json.dumps(without, sort_keys=True) == json.dumps(rest, sort_keys=True)  # NaN where nothing was stated


@pytest.mark.parametrize(("override", "was"), [("model.extras.temperature=5", "1.0"), ("model.dropout=0", "0.3"),
                                             ("encoder.layer=stride32", "'stride16'"), ("data.image_size=128", "96")])
def test_an_evaluation_scores_the_model_the_checkpoint_holds(tiny_run, override: str, was: str, capsys) -> None:
    """An override of the model was taken, and its numbers were written under the checkpoint's name
    (a temperature of 5 moved the tiny run's CIDEr by a seventh); `caption` refused it already. The
    checkpoint's own values given again (tiny_run.overrides: the training's) are no change."""
    code = eval_main(["--checkpoint", str(tiny_run.checkpoint), "--split", "val", "--device", "cpu",
                      *tiny_run.overrides, override])
    key = override.split("=")[0]
    assert code == 2 and capsys.readouterr().err.splitlines() == [
        f"error: override '{override}': {key} is {was} in {tiny_run.checkpoint}, part of the model it holds; "
        "overrides may say where the data and weights are, and how to decode"]


def test_an_evaluation_may_decode_otherwise_and_compute_the_same_model_otherwise(tiny_run, tmp_path: Path) -> None:
    """What may change still does, and the metrics say how it decoded."""
    out = tmp_path / "metrics.json"
    assert eval_main(["--checkpoint", str(tiny_run.checkpoint), "--split", "val", "--device", "cpu", "--quiet",
                      "--out", str(out), *tiny_run.overrides, "model.fused=false", "decode.max_length=9"]) == 0
    assert json.loads(out.read_text())["decode"]["max_length"] == 9


def test_write_evaluation_makes_the_folders_and_names_the_captions_after_the_metrics(tmp_path: Path) -> None:
    from captioning.config import load_config
    from captioning.eval.evaluate import Evaluation, write_evaluation

    evaluation = Evaluation(metrics={"CIDEr": 0.5}, results=[{"image_id": 3, "caption": "a red circle"}],
                            config=load_config(None, ["decode.length_penalty=0.7", "decode.beam_size=5"]),
                            beam_size=2, hard_choice="expectation")
    out = tmp_path / "new" / "deeper" / "metrics_test.json"
    written = write_evaluation(evaluation, checkpoint="runs/x/best.pt", split="test", out=out, results=None)
    captions = out.with_name("metrics_test_captions.json")
    assert written == {"metrics": out, "captions": captions}
    assert json.loads(out.read_text()) == {"checkpoint": "runs/x/best.pt", "split": "test", "beam_size": 2,
                                           "hard_choice": "expectation", "tokenizer": OWN_TOKENIZER, "language": "en",
                                           "decode": {"max_length": 20, "length_penalty": 0.7, "no_repeat_ngram": 0,
                                                      "allow_unk": False},  # how it decoded, overrides and all
                                           "CIDEr": 0.5}
    assert len(out.read_text().splitlines()) == 2 + 8 + 5  # one entry a line, for people reading it in a terminal
    assert json.loads(captions.read_text()) == evaluation.results
    elsewhere = tmp_path / "other" / "folder" / "captions.json"  # its own folders too
    assert write_evaluation(evaluation, checkpoint="best.pt", split="val", out=None, results=elsewhere) == {
        "captions": elsewhere}
    assert json.loads(elsewhere.read_text()) == evaluation.results


def test_chair_counts_shape_nouns_of_shapes_the_image_does_not_have() -> None:
    """CHAIR-i: hallucinated mentions / mentions; CHAIR-s: captions with one / captions. By hand:
    image 0 (red circle, blue square) "a red circle above a blue triangle": 2 mentions, 1 wrong;
    image 1 (green circle) "a green circle": 1, 0; image 2 (blue square) "a diamond and a diamond":
    2, 2. CHAIR-i = 3/5, CHAIR-s = 2/3; scored in two parts and absorbed, the same."""
    from captioning.data.vocab import Vocabulary
    from captioning.eval.shapes.scorer import ShapesScorer

    truths = [SceneObjects(objects=[RED_CIRCLE, BLUE_SQUARE], width=SIDE, height=SIDE),
              SceneObjects(objects=[GREEN_CIRCLE], width=SIDE, height=SIDE),
              SceneObjects(objects=[BLUE_SQUARE], width=SIDE, height=SIDE)]
    captions = ["a red circle above a blue triangle", "a green circle", "a diamond and a diamond"]
    vocab = Vocabulary(["<pad>", "<start>", "<end>", "<unk>"])

    def scored(scorer: ShapesScorer, rows: range) -> ShapesScorer:
        for row in rows:
            words = captions[row].split()
            scorer.caption(row - rows.start, words, np.full((len(words), 2, 2), 0.25))
        return scorer

    whole = scored(ShapesScorer(truths, vocab, probe=False), range(3)).metrics()
    assert whole["CHAIR_i"] == pytest.approx(3 / 5) and whole["CHAIR_s"] == pytest.approx(2 / 3)
    first = scored(ShapesScorer(truths[:1], vocab, probe=False), range(0, 1))
    first.absorb(scored(ShapesScorer(truths[1:], vocab, probe=False), range(1, 3)))
    parts = first.metrics()
    assert (parts["CHAIR_i"], parts["CHAIR_s"]) == (whole["CHAIR_i"], whole["CHAIR_s"])


@pytest.mark.parametrize("ptb", [False, pytest.param(True, marks=pytest.mark.skipif(
    not java_available(), reason="java is not installed"))])
def test_each_images_cider_belongs_to_its_image_and_their_mean_is_the_corpus_cider(ptb) -> None:
    """cider_per_image: image 1 says one of its references, images 2 and 3 say nothing of theirs."""
    mixed = {1: IDENTICAL[1], 2: UNRELATED[2], 3: UNRELATED[3]}
    scores = cider_per_image(REFERENCES, mixed, ptb=ptb)
    assert set(scores) == set(REFERENCES)
    assert scores[2] == pytest.approx(0.0, abs=1e-9) and scores[3] == pytest.approx(0.0, abs=1e-9)
    assert scores[1] > 1.0
    corpus = caption_metrics(REFERENCES, mixed, full=False, ptb=ptb)["CIDEr"]
    assert sum(scores.values()) / len(scores) == pytest.approx(corpus, rel=1e-9)


@pytest.mark.skipif(not java_available(), reason="java is not installed (make test requires it)")
def test_each_images_cider_is_tokenized_as_the_corpus_cider_it_shares_out() -> None:
    """On captions that the PTB tokenizer and the project's split apart (contractions, hyphens,
    numbers), cider_per_image follows caption_metrics' tokenizer: PTB by default, the project's with
    ptb=False, Unicode words for another language whatever `ptb` says."""
    from tests.eval.test_metrics import HARD_CASES

    references = {i: refs[1:] for i, refs in HARD_CASES.items()}
    candidates = {i: refs[0] for i, refs in HARD_CASES.items()}

    def mean(scores: dict[int, float]) -> float:
        return sum(scores.values()) / len(scores)

    means = {}
    for ptb, language in ((True, "en"), (False, "en"), (True, "de")):
        means[ptb, language] = mean(cider_per_image(references, candidates, ptb=ptb, language=language))
        corpus = caption_metrics(references, candidates, full=False, ptb=ptb, language=language)["CIDEr"]
        assert means[ptb, language] == pytest.approx(corpus, rel=1e-9), (ptb, language)
    assert abs(means[True, "en"] - means[False, "en"]) > 0.05  # the two tokenizers part on these
    assert mean(cider_per_image(references, candidates)) == means[True, "en"]  # PTB by default
