"""`captioning inspect`'s lines (inspection.describe) for payloads built by hand: every line written
out in full here, so a field shown under another's name, a part left out or a wrong default fails."""

from __future__ import annotations

import pytest
import torch

from captioning.checkpoint import CheckpointError
from captioning.config import load_config
from captioning.inspection import describe


def _payload(**extra) -> dict:
    config = load_config(None, ["model.embed_dim=96", "model.hidden_dim=160", "model.attention_dim=48",
                                "data.image_size=192", "train.val_metric=Bleu_4"])
    return {"format_version": 2, "config": config.to_dict(), "vocab": ["<pad>", "<start>", "<end>", "a", "b"],
            "grid": [12, 7], "annotation_dim": 40, **extra,
            "decoder": {"embed.weight": torch.zeros(5, 96), "steps": torch.zeros((), dtype=torch.long)}}


def _tensor(name: str, shape: tuple, dtype: str) -> str:
    return f"    {name.ljust(44)} {str(shape).ljust(18)} {dtype}"


def test_describe_names_each_field_from_its_own_setting() -> None:
    payload = _payload(progress={"step": 321, "epoch": 4, "best_metric": 0.123456, "seconds": 360000.0},
                       training_decoder={"embed.weight": torch.zeros(5, 96, dtype=torch.float16)},
                       encoder={"conv.weight": torch.zeros(8, 3, 3, 3), "note": "not a tensor"},
                       optimizer={}, scheduler={}, rng={})
    assert describe(payload, "runs/x/best.pt") == [
        "runs/x/best.pt: captioning checkpoint, format 2",
        "  data        shapes at 192px, grid 12x7, vocabulary of 5 words",
        "  encoder     efficientnet_lite0 stride16",
        "  model       soft attention, additive score, embed 96, hidden 160, attention 48",
        "  training    xe, step 321, epoch 4, best Bleu_4 0.1235, 100.00 h trained",
        "  record      none (written before checkpoints recorded what made them)",
        "  decoder: 2 tensors, 481 numbers",
        _tensor("embed.weight", (5, 96), "float32"),
        _tensor("steps", (), "int64"),
        "  training_decoder: 1 tensors, 480 numbers",
        _tensor("embed.weight", (5, 96), "float16"),
        "  encoder: 1 tensors, 216 numbers",
        _tensor("conv.weight", (8, 3, 3, 3), "float32"),
        "  resumable   yes (optimizer, scheduler, rng)",
    ]


def test_describe_without_progress_or_optimizer_state_says_so() -> None:
    payload = _payload(rng={})
    payload["config"]["encoder"]["fine_tune_from"] = "block4"
    lines = describe(payload, "last.pt")
    assert lines[2] == "  encoder     efficientnet_lite0 stride16, fine-tuned from block4"
    assert lines[4] == "  training    xe, step ?, epoch ?, best Bleu_4 nan, its training time not recorded"
    assert lines[-1] == "  resumable   no (rng)"
    assert describe(_payload(), "last.pt")[-1] == "  resumable   no (no optimizer state)"
    decoder_only = describe(_payload(), "last.pt")  # no training_decoder or encoder part
    assert len(decoder_only) == 5 + 1 + 1 + 2 + 1  # header, record, decoder, its 2 tensors, resumable
    recorded = describe(_payload(record={"data": {"dataset": "shapes", "val_images": 8},
                                         "versions": {"torch": "2.14.1", "java": None}}), "best.pt")
    assert recorded[5:7] == ["  record data          dataset shapes, val_images 8",
                             "  record versions      torch 2.14.1, java None"]
    no_training_decoder = describe(_payload(encoder={"conv.weight": torch.zeros(2, 3, 1, 1)}), "last.pt")
    assert no_training_decoder[-3:-1] == ["  encoder: 1 tensors, 6 numbers", _tensor("conv.weight", (2, 3, 1, 1),
                                                                                     "float32")]


def test_describe_of_a_payload_without_a_vocabulary_names_the_file() -> None:
    payload = _payload()
    del payload["vocab"]
    with pytest.raises(CheckpointError, match=r"^runs/y/last\.pt: not a captioning checkpoint \(it has no vocab\)"):
        describe(payload, "runs/y/last.pt")


def test_what_is_missing_is_named_and_a_config_that_is_not_a_mapping_too() -> None:
    payload = _payload()
    del payload["vocab"], payload["grid"]
    with pytest.raises(CheckpointError, match=r"^x\.pt: not a captioning checkpoint \(it has no vocab, grid\)$"):
        describe(payload, "x.pt")
    with pytest.raises(CheckpointError, match=r"^x\.pt: not a captioning checkpoint \(it has no config\)$"):
        describe(_payload(config="shapes_soft.yaml"), "x.pt")


@pytest.mark.parametrize(("edit", "said"), [
    ({"grid": 14}, "not as captioning writes them: grid"),
    ({"grid": [14, 14, 3]}, "not as captioning writes them: grid"),
    ({"annotation_dim": "512", "decoder": [1, 2]}, "not as captioning writes them: annotation_dim, decoder"),
    ({"vocab": "a b c"}, "not as captioning writes them: vocab"),
    ({"annotation_dim": None}, "not as captioning writes them: annotation_dim"),
])
def test_a_payload_edited_by_hand_is_one_line_not_a_traceback(edit: dict, said: str) -> None:
    """A grid that was a number was a TypeError, a decoder that was a list an AttributeError, a
    missing annotation_dim a KeyError when the decoder was built."""
    with pytest.raises(CheckpointError, match=rf"^x\.pt: not a captioning checkpoint \({said}\)$"):
        describe({**_payload(), **edit}, "x.pt")
    missing = _payload()
    del missing["annotation_dim"]
    with pytest.raises(CheckpointError, match=r"^x\.pt: not a captioning checkpoint \(it has no annotation_dim\)$"):
        describe(missing, "x.pt")


def test_a_format_1_file_without_a_config_is_not_ours_in_one_line(tmp_path) -> None:
    from captioning.checkpoint import load_checkpoint

    torch.save({"format_version": 1, "decoder": {}}, tmp_path / "old.pt")
    with pytest.raises(CheckpointError, match=r"old\.pt: not a captioning checkpoint \(it has no config\)$"):
        load_checkpoint(tmp_path / "old.pt")


@pytest.mark.parametrize(("error", "said"), [
    (RuntimeError("Error(s) in loading state_dict for AttentionDecoder:\n\tMissing key(s): embed.weight"),
     "Error(s) in loading state_dict for AttentionDecoder:"),
    (KeyError(), "KeyError"),  # no message: its kind
])
def test_weights_that_do_not_fit_say_the_first_line_of_why(error, said, monkeypatch, tmp_path) -> None:
    from captioning.checkpoint import load_trained
    from captioning.model.paper import AttentionDecoder

    def refusing(self, state, *args, **kwargs):
        raise error

    monkeypatch.setattr(AttentionDecoder, "load_state_dict", refusing)
    payload = _payload(annotation_dim=512)
    payload["vocab"] = ["<pad>", "<start>", "<end>", "<unk>", "a"]
    torch.save(payload, tmp_path / "x.pt")
    with pytest.raises(CheckpointError) as refused:
        load_trained(tmp_path / "x.pt")
    assert str(refused.value) == f"{tmp_path / 'x.pt'}: its weights do not fit the model its config describes ({said})"
