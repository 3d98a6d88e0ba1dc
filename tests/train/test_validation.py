"""Validation shared by the processes of a run: each decodes its part of the images, rank 0 gathers
the parts in order and scores them, and the metrics are one process's, to the last digit."""

from __future__ import annotations

import math

import pytest

from captioning.checkpoint import decoder_from_checkpoint, load_checkpoint
from captioning.config import from_dict
from captioning.data.splits import load_splits
from captioning.data.vocab import Vocabulary
from captioning.runtime.distributed import Distributed
from captioning.train import validation


def _equal(metrics: dict[str, float], expected: dict[str, float]) -> None:
    assert metrics.keys() == expected.keys()
    for key, value in expected.items():  # NaN (no relation stated, say) equals NaN here
        assert metrics[key] == value or (math.isnan(metrics[key]) and math.isnan(value)), key


@pytest.mark.parametrize("processes", [2, 3])
def test_validation_in_parts_gives_the_one_process_metrics(monkeypatch, tiny_run, processes: int) -> None:
    payload = load_checkpoint(tiny_run.checkpoint)
    config = from_dict(payload["config"], where="test")
    config.train.val_images = 7  # parts of 3 and 4 (2, 2, 3): not a multiple of the processes
    decoder = decoder_from_checkpoint(payload, config)
    vocab = Vocabulary(payload["vocab"])
    val = load_splits(config, ("val",))["val"]
    alone = validation.validation_metrics(decoder, val, vocab, config, device="cpu")
    assert alone["attention_words"] > 0  # the shapes scorer took part: its counts must be gathered too

    sent = {}

    def gather(context: Distributed, value):  # every rank's value reaches rank 0, in rank order
        sent[context.rank] = value
        return [sent[rank] for rank in range(context.world_size)] if context.is_main else None

    monkeypatch.setattr(validation.distributed, "gather", gather)
    for rank in reversed(range(processes)):  # rank 0 last: it scores what the others sent
        metrics = validation.validation_metrics(decoder, val, vocab, config, device="cpu",
                                      context=Distributed(rank=rank, world_size=processes))
        assert (metrics is None) == (rank != 0)
    parts = [len(sent[rank][0].results) for rank in range(processes)]
    assert sum(parts) == 7 and min(parts) >= 2
    _equal(metrics, alone)


def test_a_validation_part_of_no_images_is_fine(monkeypatch, tiny_run) -> None:
    """More processes than validation images: some decode nothing and still take part."""
    payload = load_checkpoint(tiny_run.checkpoint)
    config = from_dict(payload["config"], where="test")
    config.train.val_images = 1
    decoder, vocab = decoder_from_checkpoint(payload, config), Vocabulary(payload["vocab"])
    val = load_splits(config, ("val",))["val"]
    alone = validation.validation_metrics(decoder, val, vocab, config, device="cpu")
    sent = {}
    monkeypatch.setattr(validation.distributed, "gather", lambda context, value: (
        sent.__setitem__(context.rank, value) or ([sent[r] for r in range(2)] if context.is_main else None)))
    validation.validation_metrics(decoder, val, vocab, config, device="cpu", context=Distributed(rank=1, world_size=2))
    _equal(validation.validation_metrics(decoder, val, vocab, config, device="cpu",
                                         context=Distributed(rank=0, world_size=2)), alone)
    assert [len(sent[r][0].results) for r in (0, 1)] == [0, 1]


def test_validation_keeps_checkpoints_on_the_numbers_eval_reports(tiny_run) -> None:
    """With val_beam_size null and val_tokenizer ptb, validation scores the captions eval.py reports:
    the config's beam, the PTB tokenizer; its BLEU and CIDEr on the whole val split are eval.py's,
    digit for digit. Greedy decoding on the project's own tokenizer (the defaults) scores other numbers."""
    from captioning.eval.evaluate import evaluate_checkpoint
    from captioning.eval.metrics import PTB_TOKENIZER

    payload = load_checkpoint(tiny_run.checkpoint)
    config = from_dict({**payload["config"], "train": {**payload["config"]["train"], "val_images": None,
                                                        "val_beam_size": None, "val_tokenizer": "ptb"}}, where="test")
    assert config.decode.beam_size == 2 and validation.validation_beam(config) == 2
    assert validation.validation_tokenizer(config) == PTB_TOKENIZER  # Java is there (make test requires it)
    decoder, vocab = decoder_from_checkpoint(payload, config), Vocabulary(payload["vocab"])
    val = load_splits(config, ("val",))["val"]
    validated = validation.validation_metrics(decoder, val, vocab, config, device="cpu")
    reported = evaluate_checkpoint(tiny_run.checkpoint, split="val", overrides=tiny_run.overrides).metrics
    for metric in ("Bleu_1", "Bleu_4", "CIDEr"):
        assert validated[metric] == reported[metric], metric

    config.train.val_beam_size, config.train.val_tokenizer = 1, "own"
    greedy_own = validation.validation_metrics(decoder, val, vocab, config, device="cpu")
    assert any(greedy_own[m] != reported[m] for m in ("Bleu_1", "Bleu_4", "CIDEr"))  # the test sees a difference


@pytest.mark.parametrize(("config_file", "beam", "tokenizer"), [
    (None, 1, "own"),  # the embedded default: greedy, the project's tokenizer (fast)
    ("configs/flickr8k_soft.yaml", 3, "ptb"),  # real photos: what eval.py reports
    ("configs/coco_vgg19_soft.yaml", 3, "ptb"),
    ("configs/coco_resnet101_hard.yaml", 3, "ptb"),
    ("configs/folder_soft.yaml", 3, "ptb"),
])
def test_the_real_photos_configs_keep_checkpoints_on_what_eval_reports(config_file, beam, tokenizer) -> None:
    from captioning.config import load_config
    from tests.tiny import REPO

    config = load_config(None if config_file is None else REPO / config_file)
    assert validation.validation_beam(config) == beam == (beam if config_file is None else config.decode.beam_size)
    assert config.train.val_tokenizer == tokenizer
