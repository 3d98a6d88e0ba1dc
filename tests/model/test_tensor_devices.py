"""Every tensor the model and the training step make is made where its inputs are.

A tensor made without `device=` lands on the default device: the CPU, so on a CPU test it looks
fine, and on a GPU it is a copy each time (a wait, tests/train/test_syncs.py) or a device mismatch.
Here the default device is "meta" (shapes without data) while the model and its inputs are on the
CPU: such a tensor is a meta tensor, and the first op that meets it with a CPU tensor, or reads it,
fails. The model, optimizer and inputs are built before the `with`, on the CPU, as a run builds them
on its device.
"""

from __future__ import annotations

import pytest
import torch

from captioning.config import load_config
from captioning.model.decoding import decode
from captioning.model.encoder_decoder import EncoderDecoder, build_decoder
from captioning.model.paper import Reinforce
from captioning.train.paper_objective import train_step
from tests.train.test_syncs import D, V, _batch

MODELS = {  # model.* overrides: the paper's decoder, then every attention and every seam of model/extras
    "soft additive (fused)": [],
    "soft dot, vector gate, tanh output": ["model.score=dot", "model.gate=vector", "model.deep_output=tanh"],
    "soft concat": ["model.score=concat"],
    "soft general, temperature": ["model.score=general", "model.extras.temperature=2.0"],
    "soft scaled_dot": ["model.score=scaled_dot"],
    "soft cosine": ["model.score=cosine"],
    "soft location": ["model.score=location"],
    "soft local": ["model.score=local"],
    "soft layout init, query word": ["model.extras.init=layout", "model.extras.query_word=true"],
    "soft two glimpses, learned position": ["model.extras.glimpses=2", "model.extras.position=learned"],
    "soft coordinates, unit annotations": ["model.extras.position=coordinates", "model.extras.unit_annotations=true"],
    "hard additive": ["model.attention=hard"],
    "hard additive, 2 samples": ["model.attention=hard", "train.reinforce.location_samples=2",
                                 "train.reinforce.baseline=leave_one_out", "train.reinforce.entropy_weight=0.1"],
    "hard local, batch coin": ["model.attention=hard", "model.score=local", "model.hard.coin=batch"],
}


def _model(overrides: list[str]):
    torch.manual_seed(0)
    config = load_config(None, ["model.embed_dim=8", "model.hidden_dim=16", "model.attention_dim=8",
                                "model.dropout=0.1", *overrides])
    decoder = build_decoder(config.model, vocab_size=V, annotation_dim=D, grid=(3, 3))
    hard = config.model.attention == "hard"
    reinforce = Reinforce.from_config(config.train.reinforce) if hard else None
    return decoder, reinforce


@pytest.mark.parametrize("name", list(MODELS))
def test_training_and_decoding_make_no_tensor_off_their_inputs_device(name):
    decoder, reinforce = _model(MODELS[name])
    model = EncoderDecoder(encoder=None, decoder=decoder) if reinforce is not None else decoder
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batches = [_batch(seed) for seed in range(2)]  # two steps: the REINFORCE baseline starts, then moves
    choices = ["expectation", "argmax", "sample"] if reinforce is not None else [None]
    with torch.device("meta"):
        for step, batch in enumerate(batches):
            losses = train_step(model, batch, optimizer, grad_clip=5.0, ds_lambda=1.0,
                                reinforce=reinforce, step=step)
        decoder.eval()
        captions = [decode(decoder, batches[0].annotations, beam_size=beam, max_length=6, hard_choice=choice)
                    for beam in (1, 3) for choice in choices]
    assert all(value == value for value in losses.losses.values())  # numbers, not NaN
    for result in captions:
        for tensor in (result.tokens, result.alphas, result.lengths, result.scores, result.locations):
            assert tensor.device.type == "cpu"
    assert all(p.device.type == "cpu" and torch.isfinite(p).all() for p in model.parameters())
