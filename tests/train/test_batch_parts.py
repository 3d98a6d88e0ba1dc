"""The run's side of a step (captioning.train.step): an objective only returns its loss, and the
run hands it this process's part of the batch, or a stand-in where that part is empty (whose items
must not count), weighs it by what the processes agreed on, and applies the gradients.

The processes are stood in for: a context of two and an `agree` that answers as the other process
would, so that no process group is needed (tests/train/test_ranks.py runs real ones)."""

from __future__ import annotations

import pytest
import torch

from captioning.config import load_config
from captioning.data.dataset import Batch
from captioning.runtime import distributed
from captioning.runtime.distributed import Agreement, Distributed
from captioning.runtime.hardware import Hardware
from captioning.runtime.precision import FULL_PRECISION
from captioning.train import step as stepping_module
from captioning.train.build import RunModel
from captioning.train.objective import Loss, TrainingError
from captioning.train.step import Stepping


class Recording:
    """An objective whose loss is its weight times the batch's rows, recording what it was handed."""

    def __init__(self) -> None:
        self.weight = torch.nn.Parameter(torch.tensor(1.0))
        self.seen: list[tuple[int, bool, list[list[int]]]] = []

    def loss(self, batch: Batch, *, step: int, size: int, counted: bool = True) -> Loss:
        self.seen.append((len(batch), counted, batch.tokens.tolist()))
        return Loss(self.weight * len(batch), {"rows": float(len(batch))})


def make(rank_of: int, world_size: int, monkeypatch, agreed: Agreement) -> tuple[Stepping, Recording, list]:
    objective = Recording()
    asked: list[dict] = []

    def agree(context, **counts):
        asked.append({key: value for key, value in counts.items() if key != "loss"})
        return agreed

    monkeypatch.setattr(stepping_module.distributed, "agree", agree)
    monkeypatch.setattr(stepping_module.distributed, "everyone", lambda context, value: [value] * world_size)
    config = load_config(None, ["data.max_bad_images=0.5"])
    hardware = Hardware(Distributed(rank=rank_of, world_size=world_size), torch.device("cpu"), FULL_PRECISION)
    model = RunModel(decoder=None, encoder=None, average=None, grid=(2, 2), annotation_dim=3)
    optimizer = torch.optim.SGD([objective.weight], lr=0.5)
    run = Stepping(config, objective=objective, model=model, module=torch.nn.ParameterList([objective.weight]),
                   optimizer=optimizer, scaler=torch.amp.GradScaler("cpu", enabled=False), hardware=hardware,
                   training_images=4)
    return run, objective, asked


def batch(rows: int, failures: tuple[str, ...] = ()) -> Batch:
    tokens = torch.tensor([[1, 5, 6, 2]] * rows, dtype=torch.long).reshape(rows, 4)
    return Batch(annotations=torch.zeros(rows, 4, 3), tokens=tokens, lengths=torch.full((rows,), 4),
                 failures=failures)


def test_an_empty_part_steps_on_a_stand_in_that_does_not_count_weighted_by_the_agreed_share(monkeypatch):
    run, objective, asked = make(1, 2, monkeypatch, Agreement(share=0.0))
    result = run(batch(0), step=3, size=1, received=None)
    assert objective.seen == [(1, False, [[1, 2]])]  # one blank image captioned "<start> <end>", not counted
    assert asked == [{"words": 0.0, "images": 0.0, "received": None, "unreadable": 0, "named": 0}]
    assert result.losses == {} and not result.skipped
    assert objective.weight.item() == 1.0  # a share of 0: its loss moved nothing


def test_an_own_part_counts_its_words_and_is_weighted_by_its_share(monkeypatch):
    run, objective, asked = make(0, 2, monkeypatch, Agreement(share=0.5))
    result = run(batch(2), step=0, size=3, received=None)
    assert objective.seen == [(2, True, [[1, 5, 6, 2]] * 2)]
    assert asked[0]["words"] == 6.0 and asked[0]["images"] == 2.0  # 3 target words a caption
    assert result.losses["loss"] == 2.0 and result.losses["rows"] == 2.0
    assert objective.weight.item() == pytest.approx(1.0 - 0.5 * 0.5 * 2.0)  # lr x share x d(loss)/d(weight)


def test_one_process_takes_no_step_on_an_empty_part_and_names_each_unreadable_image_once(monkeypatch, capsys):
    run, objective, _ = make(0, 1, monkeypatch, Agreement())
    result = run(batch(0, failures=("a.jpg: truncated",)), step=0, size=1, received=15)
    assert objective.seen == [] and result.agreement.empty and result.agreement.signal == 15
    run(batch(1, failures=("a.jpg: truncated",)), step=1, size=2, received=None)
    assert capsys.readouterr().err.count("a.jpg: truncated") == 1
    with pytest.raises(TrainingError, match="b.jpg"):  # 2 of 4 training images: past data.max_bad_images
        run(batch(1, failures=("b.jpg: empty", "c.jpg: empty")), step=2, size=3, received=None)


def test_distributed_agree_answers_one_process_without_a_group():
    """The stand-in above replaces a collective that, for one process, needs none."""
    agreed = distributed.agree(Distributed(), words=3.0, images=1.0, loss=torch.tensor(1.0), received=None)
    assert agreed.share == 1.0 and agreed.finite


@pytest.mark.parametrize("encoder, annotations, images", [
    (None, (1, 10, 3), None),  # cached annotations: the grid's 2 x 5 cells of 3 channels
    (type("OnTheFly", (), {"cached_grid": None})(), None, (1, 3, 224, 224)),  # pixels at data.image_size
    (type("Frozen", (), {"cached_grid": (3, 5), "cached_dim": 7})(), (1, 15, 7), None),  # the frozen stages' output
], ids=["cached annotations", "encoder on the fly", "frozen stages cached"])
def test_the_stand_in_is_one_blank_item_of_what_this_run_steps_on(monkeypatch, encoder, annotations, images):
    run, _, _ = make(1, 2, monkeypatch, Agreement(share=0.0))
    run.model = RunModel(decoder=None, encoder=encoder, average=None, grid=(2, 5), annotation_dim=3)
    blank = run.stand_in()
    assert (None if blank.annotations is None else tuple(blank.annotations.shape)) == annotations
    assert (None if blank.images is None else tuple(blank.images.shape)) == images
    assert blank.tokens.tolist() == [[1, 2]] and blank.lengths.tolist() == [2]
    assert not any(t.abs().sum() for t in (blank.annotations, blank.images) if t is not None)  # zeros
