"""A checkpoint cut for shipping (shipped.for_captioning): what captioning reads and nothing to
resume, the decoder stored in fp16 and computed in fp32, a release note that inspect shows."""

from __future__ import annotations

import pytest
import torch

from captioning.api import Captioner
from captioning.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from captioning.inspection import describe
from captioning.shipped import for_captioning


def test_an_exported_checkpoint_captions_and_holds_nothing_to_resume(tiny_run, tmp_path) -> None:
    payload = load_checkpoint(tiny_run.checkpoint)
    slim = for_captioning(payload, release={"licence": "research use"})
    path = tmp_path / "slim.pt"
    save_checkpoint(path, slim)
    again = load_checkpoint(path)
    assert {"optimizer", "scheduler", "rng", "scaler"}.isdisjoint(again) and "optimizer" in payload
    assert all(v.dtype == torch.float16 for v in again["decoder"].values() if v.is_floating_point())
    assert path.stat().st_size < tiny_run.checkpoint.stat().st_size / 2
    full = Captioner.from_checkpoint(tiny_run.checkpoint, device="cpu")
    cut = Captioner.from_checkpoint(path, device="cpu")
    assert all(p.dtype == torch.float32 for p in cut.model.decoder.parameters())
    for mine, theirs in zip(cut.model.decoder.state_dict().values(), full.model.decoder.state_dict().values()):
        if theirs.is_floating_point():  # fp16 storage: each weight rounded to about 3 digits, no more
            torch.testing.assert_close(mine, theirs, rtol=1e-3, atol=1e-4)
    assert "  release licence      research use" in describe(again, path)


def _fine_tuned_run(tiny_run, *, seed: int = 2) -> dict:
    """The tiny run as if its encoder's last stage had been fine-tuned (encoder.fine_tune_from): its
    checkpoint holds the whole encoder, that stage's weights moved."""
    from captioning.checkpoint import load_trained

    payload = load_checkpoint(tiny_run.checkpoint)
    encoder = load_trained(tiny_run.checkpoint).encoder()
    last = [name for name, _ in encoder.body.named_children()][-1]
    payload["config"]["encoder"]["fine_tune_from"] = last
    generator = torch.Generator().manual_seed(seed)
    payload["encoder"] = {name: value * (1 + 0.2 * torch.randn(value.shape, generator=generator))
                          if value.is_floating_point() and name.startswith(f"body.{last}.") else value
                          for name, value in encoder.state_dict().items()}
    return payload


def test_a_fine_tuned_encoder_is_exported_as_the_stages_it_fine_tuned(tiny_run, tmp_path) -> None:
    """Only the stages that fine-tuned travel (the frozen ones are the pretrained weights); read back,
    the encoder is the run's: its own last stage, the package's weights before it."""
    from captioning.checkpoint import load_trained

    payload = _fine_tuned_run(tiny_run)
    last = payload["config"]["encoder"]["fine_tune_from"]
    slim = for_captioning(payload)
    assert slim["encoder"] and all(name.startswith(f"body.{last}.") for name in slim["encoder"])
    save_checkpoint(tmp_path / "tuned.pt", slim)
    encoder = load_trained(tmp_path / "tuned.pt").encoder()
    pretrained = load_trained(tiny_run.checkpoint).encoder().state_dict()
    for name, value in encoder.state_dict().items():
        expected = payload["encoder"][name]
        torch.testing.assert_close(value, expected.to(value.dtype), rtol=1e-3, atol=1e-4, msg=name)  # fp16 storage
        if not name.startswith(f"body.{last}."):
            assert torch.equal(value, pretrained[name]), name
    slim["encoder"].pop(next(name for name in slim["encoder"] if name.endswith("weight")))
    save_checkpoint(tmp_path / "lacking.pt", slim)
    with pytest.raises(CheckpointError, match=r"lacking\.pt: its weights do not fit .*\(missing body\."):
        load_trained(tmp_path / "lacking.pt").encoder()


def test_int8_storage_moves_each_weight_by_at_most_half_its_groups_step_and_halves_the_file(tiny_run,
                                                                                              tmp_path) -> None:
    """precision="int8": matrices and kernels as int8 codes with a scale per 32 numbers. Each weight
    read back is within half a step (max |w| of its group / 127 / 2, and the fp16 scale's rounding) of
    the run's; vectors keep fp16; the file is smaller than fp16's and captions."""
    from captioning.checkpoint import load_trained

    payload = _fine_tuned_run(tiny_run)
    save_checkpoint(tmp_path / "fp16.pt", for_captioning(payload))
    save_checkpoint(tmp_path / "int8.pt", for_captioning(payload, precision="int8"))
    assert (tmp_path / "int8.pt").stat().st_size < 0.7 * (tmp_path / "fp16.pt").stat().st_size
    stored = load_checkpoint(tmp_path / "int8.pt")
    assert stored["decoder"]["lstm.weight_hh"].dtype == torch.int8
    assert stored["decoder"]["lstm.bias_hh"].dtype == torch.float16
    loaded = load_trained(tmp_path / "int8.pt")
    for part, module in (("decoder", loaded.decoder), ("encoder", loaded.encoder())):
        state = module.state_dict()
        for name, original in payload[part].items():
            if not original.is_floating_point():
                continue
            rows = original.float().reshape(original.shape[0], -1)
            width = 32 if rows.shape[1] % 32 == 0 else rows.shape[1]
            bound = rows.reshape(rows.shape[0], -1, width).abs().amax(2, keepdim=True) / 127 * 0.502 + 1e-6
            step = bound.expand(-1, -1, width).reshape(original.shape) if original.dim() > 1 else \
                original.float().abs() * 1e-3 + 1e-6  # vectors: fp16's rounding
            assert ((state[name].float() - original.float()).abs() <= step).all(), f"{part} {name}"
    weights = sum(value.numel() for value in payload["decoder"].values())  # inspect counts weights, not scales
    assert any(line.startswith(f"  decoder: {len(payload['decoder'])} tensors, {weights:,} numbers (int8 codes for ")
               for line in describe(stored, tmp_path / "int8.pt"))
    with pytest.raises(ValueError, match="precision 'int4': one of fp16, int8"):
        for_captioning(payload, precision="int4")
    files = sorted((tiny_run.data_root / "images" / "val").iterdir())[:2]
    assert all(r.caption for r in Captioner.from_checkpoint(tmp_path / "int8.pt", device="cpu").caption(files))


def test_int8_keeps_its_bound_where_a_groups_scale_is_below_fp16s_normal_range() -> None:
    """Scales under 6.1e-5 (groups whose largest weight is under 1e-2) are fp16 subnormals, rounded by
    up to a third: rounded down, the largest weight's code clipped at 127 and it moved by 24 times half
    a step. An encoder's dead channels have such groups (the shipped model, 128 of them)."""
    from captioning.runtime.files import SCALE, float_weights, int8_weights

    torch.manual_seed(0)
    largest = torch.logspace(-1, -5.5, 64)  # one group per row, 0.1 down to 3e-6
    weights = (torch.rand(64, 32) * 2 - 1) * largest[:, None]
    weights[:, 0] = largest
    stored = int8_weights({"w": weights})
    step = stored["w" + SCALE].float()  # [64, 1]: the scale as stored, what the codes multiply
    moved = (float_weights(stored)["w"] - weights).abs()
    assert (moved <= step * 0.5 * (1 + 1e-3)).all()
    assert (step * 127 >= largest[:, None]).all()  # no code clipped


def test_an_exported_checkpoint_names_no_place_on_the_machine_that_trained_it(tiny_run, tmp_path) -> None:
    """Its data.root as the configs name it and no cache root (eval.py with data.root=DIR alone would
    otherwise keep its caches under the trainer's cache root), the run's folder by its name; its
    validation history and time kept for inspect and verify."""
    payload = load_checkpoint(tiny_run.checkpoint)
    payload["config"]["data"]["cache_root"] = "/scratch/someone/cache"
    payload["config"]["encoder"]["weights_path"] = "/models/lite0.pth"
    slim = for_captioning(payload)
    assert slim["config"]["data"]["root"] == "data/shapes" and slim["config"]["data"]["cache_root"] is None
    assert slim["config"]["train"]["out_dir"] == f"runs/{tiny_run.run_dir.name}"
    assert slim["config"]["encoder"]["weights_path"] == "lite0.pth"
    assert payload["config"]["data"]["cache_root"] == "/scratch/someone/cache"  # the payload itself untouched
    assert slim["progress"]["history"] == payload["progress"]["history"]
    assert slim["progress"]["seconds"] == payload["progress"]["seconds"]


def test_a_released_model_is_verified_against_its_cards_numbers(tiny_run, tmp_path) -> None:
    """verify scores a released model as its card says (val, the card's beam), not its run's greedy
    validation (whose numbers are the fp32 weights'); a card that does not match says so."""
    import dataclasses

    from captioning.eval.evaluate import evaluate_checkpoint
    from captioning.train.verify import report, verify

    path = tmp_path / "released.pt"
    save_checkpoint(path, for_captioning(load_checkpoint(tiny_run.checkpoint)))
    data = f"data.root={tiny_run.data_root}"
    scored = evaluate_checkpoint(path, split="val", overrides=[data], beam_size=2)
    slim = load_checkpoint(path)
    slim["release"] = {"name": "tiny", "val": {"Bleu_4": scored.metrics["Bleu_4"], "CIDEr": scored.metrics["CIDEr"],
                                               "beam_size": 2, "tokenizer": scored.tokenizer}}
    save_checkpoint(path, slim)
    verification = verify(path, overrides=(data,))
    lines = report(verification, path)
    assert lines[0] == f"{path}: a released model (tiny): its card's numbers on val (beam 2, {scored.tokenizer}), " \
                       "scored again"
    assert verification.reproduces and lines[-1] == "reproduces: every number within 0.0001"
    recorded = {**verification.recorded, "CIDEr": verification.recorded["CIDEr"] + 0.01}  # a card that does not match
    assert not dataclasses.replace(verification, recorded=recorded).reproduces


def test_a_released_models_card_says_how_it_decoded_and_an_override_of_it_is_named(tiny_run, tmp_path) -> None:
    """The card's numbers are those of its decoding: verify with another length penalty names the
    card's decoding as what differs, not the hardware."""
    from captioning.train.verify import report, verify

    path = tmp_path / "released.pt"
    save_checkpoint(path, for_captioning(load_checkpoint(tiny_run.checkpoint)))
    data = f"data.root={tiny_run.data_root}"
    slim = load_checkpoint(path)
    slim["release"] = {"name": "tiny", "val": {"Bleu_4": 0.5, "beam_size": 2, "tokenizer": "any",
                                               "decode": {"length_penalty": 0.0, "no_repeat_ngram": 0}}}
    save_checkpoint(path, slim)
    lines = report(verify(path, overrides=(data, "decode.length_penalty=2.0")), path)
    assert any(line.startswith("  card differs from the record:") and "length_penalty 0.0 -> 2.0" in line
               for line in lines)
    assert not any("hardware" in line for line in lines)


def _other_run(tiny_run) -> dict:
    """A second model of the same run's vocabulary and annotations: its decoder's weights moved."""
    payload = load_checkpoint(tiny_run.checkpoint)
    generator = torch.Generator().manual_seed(1)
    payload["decoder"] = {name: value + 0.2 * torch.randn(value.shape, generator=generator)
                          if value.is_floating_point() else value for name, value in payload["decoder"].items()}
    return payload


def test_several_checkpoints_cut_into_one_file_caption_as_they_do_given_together(tiny_run, tmp_path) -> None:
    """The reference: each cut alone into its own file, then decoded together (load_ensemble)."""
    from captioning.checkpoint import weights_digest
    from captioning.model.ensemble import Ensemble

    first, other = load_checkpoint(tiny_run.checkpoint), _other_run(tiny_run)
    save_checkpoint(tmp_path / "first.pt", for_captioning(first))
    save_checkpoint(tmp_path / "other.pt", for_captioning(other))
    save_checkpoint(tmp_path / "both.pt", for_captioning(first, members=[other]))
    both = load_checkpoint(tmp_path / "both.pt")
    assert len(both["members"]) == 1 and both["members"][0]["config"]["data"]["root"] == "data/shapes"
    assert both["record"]["weights"] == {"decoder": weights_digest(both["decoder"]),
                                         "members": [weights_digest(both["members"][0]["decoder"])]}
    files = sorted((tiny_run.data_root / "images" / "val").iterdir())[:4]
    one_file = Captioner.from_checkpoint(tmp_path / "both.pt", device="cpu")
    two_files = Captioner.from_checkpoint([tmp_path / "first.pt", tmp_path / "other.pt"], device="cpu")
    alone = Captioner.from_checkpoint(tmp_path / "first.pt", device="cpu")
    assert isinstance(one_file.model.decoder, Ensemble) and len(one_file.model.decoder.members) == 2
    said = [r.caption for r in one_file.caption(files)]
    assert said == [r.caption for r in two_files.caption(files)]
    assert said != [r.caption for r in alone.caption(files)]  # the second decoder is heard
    for mine, theirs in zip(one_file.caption(files), two_files.caption(files)):
        torch.testing.assert_close(mine.alphas, theirs.alphas)
    # a file of two given with a third checkpoint: three decoders, each weighing the same
    three = Captioner.from_checkpoint([tmp_path / "both.pt", tmp_path / "first.pt"], device="cpu")
    assert len(three.model.decoder.members) == 3
    lines = describe(both, tmp_path / "both.pt")
    assert any(line.startswith("  ensemble    2 decoders caption together") for line in lines)
    assert any(line.startswith(f"  member 2    xe, seed 0, step {other['progress']['step']}, ") for line in lines)


def test_an_ensemble_in_one_file_without_a_card_is_not_verified_as_its_first_run(tiny_run, tmp_path) -> None:
    from captioning.train.verify import verify

    save_checkpoint(tmp_path / "both.pt", for_captioning(load_checkpoint(tiny_run.checkpoint),
                                                         members=[_other_run(tiny_run)]))
    with pytest.raises(CheckpointError, match="holds 2 decoders that caption together and no release card"):
        verify(tmp_path / "both.pt", overrides=(f"data.root={tiny_run.data_root}",))


def test_a_fine_tuned_member_cut_into_one_file_captions_as_it_does_given_beside_the_other(tiny_run,
                                                                                          tmp_path) -> None:
    """A frozen run and a fine-tuned one in one file: the member keeps its encoder's own stages, and
    the file captions as the two cut alone and given together do."""
    from captioning.checkpoint import run_weights

    first, tuned = load_checkpoint(tiny_run.checkpoint), _fine_tuned_run(tiny_run)
    save_checkpoint(tmp_path / "first.pt", for_captioning(first))
    save_checkpoint(tmp_path / "tuned.pt", for_captioning(tuned))
    save_checkpoint(tmp_path / "both.pt", for_captioning(first, members=[tuned]))
    both = load_checkpoint(tmp_path / "both.pt")
    assert "encoder" not in both and both["members"][0]["encoder"]
    assert both["record"]["weights"] == run_weights(both)  # verify compares these
    assert both["record"]["weights"]["member_encoders"] == [run_weights(both)["member_encoders"][0]]
    files = sorted((tiny_run.data_root / "images" / "val").iterdir())[:4]
    one_file = Captioner.from_checkpoint(tmp_path / "both.pt", device="cpu")
    two_files = Captioner.from_checkpoint([tmp_path / "first.pt", tmp_path / "tuned.pt"], device="cpu")
    assert one_file.model.decoder.views == [0, 1]
    for mine, theirs in zip(one_file.caption(files), two_files.caption(files)):
        assert mine.caption == theirs.caption
        torch.testing.assert_close(mine.alphas, theirs.alphas)


def test_a_member_over_an_encoder_of_another_width_cut_into_one_file_captions_as_two_files_do(tmp_path) -> None:
    """EfficientNet-Lite0 and -Lite2 give one 14x14 grid at 224 pixels, but 112 and 120 channels at
    stride 16: each member's decoder is built over its own width, not the file's first."""
    from captioning.checkpoint import load_ensemble, load_trained
    from captioning.config import load_config
    from captioning.data.vocab import SPECIALS
    from captioning.model.encoder_decoder import build_decoder

    words = [*SPECIALS, "a", "red", "circle"]

    def payload(encoder: str, width: int, seed: int) -> dict:
        config = load_config(None, [f"encoder.name={encoder}", "encoder.layer=stride16"])
        torch.manual_seed(seed)
        decoder = build_decoder(config.model, vocab_size=len(words), annotation_dim=width, grid=(14, 14))
        return {"config": config.to_dict(), "vocab": words, "grid": [14, 14], "annotation_dim": width,
                "decoder": decoder.state_dict()}

    lite0, lite2 = payload("efficientnet_lite0", 112, seed=0), payload("efficientnet_lite2", 120, seed=1)
    save_checkpoint(tmp_path / "lite0.pt", for_captioning(lite0))
    save_checkpoint(tmp_path / "lite2.pt", for_captioning(lite2))
    save_checkpoint(tmp_path / "both.pt", for_captioning(lite0, members=[lite2]))
    one_file = load_trained(tmp_path / "both.pt").model()
    two_files = load_ensemble([tmp_path / "lite0.pt", tmp_path / "lite2.pt"]).model()
    pixels = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(one_file.caption(pixels, max_length=4), two_files.caption(pixels, max_length=4))


def test_run_weights_names_each_decoder_and_fine_tuned_encoder_a_file_holds() -> None:
    """The record's digests, which verify and loading compare: one per decoder in order, a member's
    encoder only where one fine-tuned, and no key for what the file does not hold."""
    from captioning.checkpoint import run_weights, weights_digest

    parts = {name: {"w": torch.full((2,), float(i))} for i, name in enumerate("ABCDE")}
    digest = {name: weights_digest(state) for name, state in parts.items()}
    assert len(set(digest.values())) == 5
    assert run_weights({"decoder": parts["A"]}) == {"decoder": digest["A"]}
    assert run_weights({"decoder": parts["A"], "encoder": parts["E"]}) == {"decoder": digest["A"],
                                                                           "encoder": digest["E"]}
    assert run_weights({"decoder": parts["A"], "members": [{"decoder": parts["B"]}, {"decoder": parts["D"]}]}) == {
        "decoder": digest["A"], "members": [digest["B"], digest["D"]]}
    both = {"decoder": parts["A"], "encoder": parts["E"],
            "members": [{"decoder": parts["B"], "encoder": parts["C"]}, {"decoder": parts["D"]}]}
    assert run_weights(both) == {"decoder": digest["A"], "members": [digest["B"], digest["D"]],
                                 "member_encoders": [digest["C"], None], "encoder": digest["E"]}
    assert run_weights({"decoder": parts["A"], "encoder": None}) == {"decoder": digest["A"]}  # not fine-tuned


def test_a_file_whose_members_are_not_decoders_with_their_configs_is_one_line(tiny_run, tmp_path) -> None:
    from captioning.checkpoint import load_trained
    from captioning.config import ConfigError

    payload = load_checkpoint(tiny_run.checkpoint)
    member = {"config": payload["config"], "decoder": payload["decoder"]}
    for members in ([member, "a decoder"], [{**member, "config": "shapes_soft.yaml"}], [{"config": payload["config"]}],
                    [{**member, "decoder": [1, 2]}], [{**member, "encoder": "tuned.pt"}],
                    [{**member, "annotation_dim": "112"}], {"member": member}):
        save_checkpoint(tmp_path / "odd.pt", {**payload, "members": members})
        with pytest.raises(CheckpointError, match=f"^{tmp_path / 'odd.pt'}: its members are not decoders with their "
                                                  "configs$"):
            load_trained(tmp_path / "odd.pt")
    wrong = {**member, "config": {**payload["config"], "model": {**payload["config"]["model"], "hidden_dim": -1}}}
    save_checkpoint(tmp_path / "odd.pt", {**payload, "members": [member, wrong]})
    with pytest.raises(ConfigError, match=f"^{tmp_path / 'odd.pt'}: member 3's config"):
        load_trained(tmp_path / "odd.pt")
