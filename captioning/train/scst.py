"""Self-critical sequence training (Rennie et al., 2017): train.objective: scst.

Not in Show, Attend and Tell; it is how captioning models since 2017 gain their last CIDEr: after
cross-entropy training (start from its best.pt with train.init_from), the decoder samples K captions
per image and each sample's log-probability is pushed up or down by how much its CIDEr-D beats a
baseline:

    loss = - sum_k (r(w^k) - b_k) * sum_t log p(w^k_t | w^k_<t, I) / (words sampled)

with r the CIDEr-D against the image's references (document frequencies of the training
references, captioning.train.cider) and b the greedy caption's reward (Rennie et al.; decoded in
eval mode, as at test time) or the mean reward of the image's other samples (Luo, 2020;
leave_one_out, as REINFORCE's baseline of that name). With hard attention the cells sampled on
the way are part of the policy: their log alpha_t[s_t] joins the words' log-probabilities with the
same sequence reward.

A decoder trained with a fine-tuned encoder (encoder.fine_tune_from with encoder.cache_frozen) goes
on over its own encoder's annotations: the stages that were fine-tuned run on the cache of the
frozen ones, in eval mode and without gradients, so the encoder stays as the warm start left it and
only the decoder learns from the reward.

Notation: B images, K samples per image, N = B*K rows, T steps, L cells, D channels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

import captioning.config.bounds as bounds
from captioning.config import Config
from captioning.config.registry import OBJECTIVES
from captioning.data.dataset import by_reference
from captioning.data.run_data import RunData
from captioning.data.splits import uses_feature_cache
from captioning.data.vocab import Vocabulary
from captioning.model.attention import choosing, hard_attention
from captioning.model.decoding import greedy, stepper, unroll
from captioning.model.paper import AttentionDecoder, Draws, leave_one_out, sample
from captioning.runtime.hardware import Hardware
from captioning.runtime.precision import FULL_PRECISION, Precision
from captioning.train.build import RunModel
from captioning.train.cider import CiderD
from captioning.train.objective import Loss, StepResult, weighted_terms
from captioning.train.paper_objective import expectation_prob_at
from captioning.train.step import take_step


@dataclass
class ImageRows:
    """A batch of training images, by their rows in the split, with their cached annotations."""

    images: torch.Tensor  # [B] long: rows of the training split
    annotations: torch.Tensor  # [B, L, D]

    failures = ()  # cached annotations: every image is readable

    def __len__(self) -> int:
        return self.images.shape[0]

    def counts(self) -> dict[str, float]:
        """What processes would weigh their parts by (Batch.counts): the images, for both (the words
        are only known once sampled; self-critical training runs in one process)."""
        return {"words": float(len(self)), "images": float(len(self))}

    def to(self, device: torch.device, non_blocking: bool = False) -> ImageRows:
        # The cache's fp16 rows are widened after the move: half the bytes pinned and copied.
        return ImageRows(self.images, self.annotations.to(device, non_blocking=non_blocking).float())


class TrainingImages(Dataset):
    """The training split's cached annotations, one image per item."""

    def __init__(self, annotations):
        self.annotations = annotations  # [N, L, D] fp16, memory-mapped (or data.splits.Rows of it)

    def __getstate__(self) -> dict:
        return by_reference(self.__dict__)  # a DataLoader worker maps the cache again rather than receive a copy

    def __len__(self) -> int:
        return len(self.annotations)

    def __getitem__(self, row: int) -> tuple[int, np.ndarray]:
        return row, np.array(self.annotations[row])  # in the cache's dtype (fp16): widened on the device


def collate_image_rows(items: list[tuple[int, np.ndarray]]) -> ImageRows:
    return ImageRows(torch.tensor([row for row, _ in items]), torch.from_numpy(np.stack([a for _, a in items])))


def image_batches(count: int, *, batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The epoch's batches of image rows: a shuffle that is a function of (seed, epoch) alone."""
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed * 100_003 + epoch)).tolist()
    return [order[i:i + batch_size] for i in range(0, count, batch_size)]


@dataclass
class ScstConfig:
    """train.scst: self-critical sequence training's settings (Rennie et al., 2017)."""

    samples: int = 5  # captions sampled per image
    # What a sample's CIDEr-D is compared with: the greedy caption's (Rennie et al.) or the mean of
    # the image's other samples (Luo, 2020, "a better variant of SCST"; needs samples >= 2).
    baseline: str = "greedy"


BASELINES = ("greedy", "leave_one_out")  # train.scst.baseline's choices


class SelfCritical:
    """Samples, rewards and the policy-gradient loss of one batch of images."""

    def __init__(self, config: ScstConfig, *, references: Sequence[Sequence[Sequence[str]]], vocab: Vocabulary,
                 max_length: int, terms: dict[str, float] | None = None):
        """`references`: each training image's captions, tokenized as training targets are (a run
        passes its Tokenized captions, which hold them as arrays). `terms`: train.terms, added on
        the sampled captions' maps as cross-entropy adds them on the references' (objective.weighted_terms)."""
        self.samples, self.baseline, self.max_length = config.samples, config.baseline, max_length
        self.terms = terms or {}
        self.vocab = vocab
        self.cider = CiderD(references)

    def sample(self, decoder: AttentionDecoder, annotations: torch.Tensor,
               draws: Draws | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """K captions per image drawn from the decoder, with gradients: tokens [N, T] (<pad> after
        <end>), each step's log-probability [N, T] (the word's, plus the sampled cell's under hard
        attention; 0 after <end>) and each word's map [N, T, L].

        The loop is greedy decoding's (captioning.model.decoding.unroll), sampling instead of taking
        the most likely word. Words are drawn from the vocabulary less <pad> and <start>, which no
        caption contains: a sampled <pad> would leave the loss while its caption went on. <unk> may be
        drawn, unlike at test time (the greedy baseline blocks it, as decoding does): it matches no
        reference, so its low reward teaches the model what the block only hides. Hard
        attention's coin is flipped once per image in `start` (at `draws.expectation_prob`), before its K
        rows are made, so they share it. A step whose distribution is not finite draws its words
        uniformly (paper.sample) and its loss is not finite: the step is skipped rather than the
        run stopped."""
        step, state = stepper(decoder, annotations, self.samples, draws=draws, differentiable=True)
        never = torch.tensor([Vocabulary.pad_id, Vocabulary.start_id], device=annotations.device)
        out = unroll(step, state, max_length=self.max_length, pick=lambda log_p: sample(log_p.detach().exp()),
                     never=never)
        if out.cell_log_probs is None:
            return out.tokens, out.log_probs, out.alphas
        return out.tokens, out.log_probs + out.cell_log_probs, out.alphas  # hard attention: the cell is an action too

    def rewards(self, tokens: torch.Tensor, images: list[int]) -> np.ndarray:
        """CIDEr-D of each row's caption against its image's references. tokens [R, T], images [R]."""
        return self.cider.scores([self.vocab.decode(row) for row in tokens.tolist()], images)

    def surrogate(self, decoder: AttentionDecoder, batch: ImageRows, *, precision: Precision = FULL_PRECISION,
                  hard_choice: str | None = None, draws: Draws | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The self-critical surrogate of a batch of images (its gradient is the policy gradient) and
        its statistics. `hard_choice`: how the
        greedy baseline's hard attention picks its cell, as test-time decoding does (decode.hard_choice;
        None for soft attention). `draws`: hard attention's chance of the expectation (`sample`)."""
        images = batch.images.tolist()
        with precision.autocast():
            tokens, log_probs, alphas = self.sample(decoder, batch.annotations, draws=draws)
        sampled = self.rewards(tokens, [i for i in images for _ in range(self.samples)]).reshape(-1, self.samples)
        if self.baseline == "greedy":
            decoder.eval()  # the test-time caption: no dropout
            with torch.no_grad(), precision.autocast(), choosing(decoder, hard_choice):
                best = greedy(decoder, batch.annotations, max_length=self.max_length)
            decoder.train()
            baseline = self.rewards(best.tokens, images)[:, None].repeat(self.samples, axis=1)  # [B, K]
        else:  # the mean of the image's other samples (Luo, 2020)
            baseline = leave_one_out(torch.as_tensor(sampled))[0].numpy()  # [B, K]
        advantage = torch.as_tensor(sampled - baseline, dtype=torch.float32, device=log_probs.device).reshape(-1)
        steps = (tokens != Vocabulary.pad_id).float()  # [N, T]: the words sampled, <end> included
        loss = -(advantage[:, None] * log_probs * steps).sum() / steps.sum().clamp(min=1.0)
        stats = {"reward": float(sampled.mean()), "baseline": float(baseline.mean()),
                 "ended": float((tokens == Vocabulary.end_id).any(dim=1).float().mean())}
        for name, term in weighted_terms(self.terms, alphas, steps).items():  # train.terms, as under cross-entropy
            loss, stats[name] = loss + term, term
        return loss, stats

    def loss_at(self, decoder: AttentionDecoder, batch: ImageRows, *, step: int,
                precision: Precision = FULL_PRECISION, hard_choice: str | None = None, hard_warmup: int = 0) -> Loss:
        """The self-critical loss of a batch at the run's `step`, as a step applies it. Hard attention's
        coins are flipped at the run's chance of the expectation at `step`, which warms up over
        `hard_warmup` steps (captioning.train.paper_objective.expectation_prob_at)."""
        decoder.train()
        hard = hard_attention(decoder)
        draws = None if hard is None else Draws(expectation_prob=expectation_prob_at(
            step, expectation_prob=hard.expectation_prob, warmup=hard_warmup))
        loss, stats = self.surrogate(decoder, batch, precision=precision, hard_choice=hard_choice, draws=draws)
        return Loss(loss, stats)

    def step(self, decoder: AttentionDecoder, batch: ImageRows, optimizer: torch.optim.Optimizer, *,
             grad_clip: float, step: int, precision: Precision = FULL_PRECISION,
             scaler: torch.amp.GradScaler | None = None, hard_choice: str | None = None,
             hard_warmup: int = 0) -> StepResult:
        """One optimizer step of the self-critical loss (skipped where not finite: apply_gradients), as
        a run takes it (captioning.train.step.take_step)."""
        loss = self.loss_at(decoder, batch, step=step, precision=precision, hard_choice=hard_choice,
                            hard_warmup=hard_warmup)
        return take_step(loss, list(decoder.parameters()), optimizer, grad_clip=grad_clip, scaler=scaler)


@OBJECTIVES.register("scst", settings=ScstConfig)
class SelfCriticalObjective:
    """train.objective: scst as a run's objective: batches of training images (their cached
    annotations), each stepped by SelfCritical, in one process (a run refuses it under torchrun)."""

    def __init__(self, config: Config, *, data: RunData, model: RunModel, module: torch.nn.Module, hardware: Hardware):
        """As PaperObjective's; its loss reads the decoder itself (`module` is the one DDP would wrap)."""
        self.config, self.decoder, self.hardware = config, model.decoder, hardware
        self.encoder = model.encoder  # a fine-tuned encoder reading its frozen stages' cache; None: annotations
        self.critic = SelfCritical(config.train.scst, references=data.captions, vocab=data.vocab,
                                   max_length=config.decode.max_length, terms=config.train.terms)
        self.items, self.collate = TrainingImages(data.train.annotations), collate_image_rows
        self.images = len(data.train.records)
        # how hard attention picks its cell for the greedy baseline: as test-time decoding does
        self.hard_choice = config.decode.hard_choice if config.model.attention == "hard" else None

    @staticmethod
    def problems(config: Config) -> list[str]:
        """What self-critical training refuses of the rest of a config (captioning.config.checks asks
        the chosen objective)."""
        t = config.train
        problems = []
        if t.scst.baseline not in BASELINES:
            problems.append(f"train.scst.baseline '{t.scst.baseline}' is not one of {', '.join(BASELINES)}")
        if t.scst.samples < 1:
            problems.append(f"train.scst.samples must be at least 1, got {t.scst.samples}")
        if t.scst.samples > bounds.SAMPLES:
            problems.append(f"train.scst.samples must be at most {bounds.SAMPLES} (far beyond any real run: "
                            f"captioning/config/bounds.py), got {t.scst.samples}")
        if t.scst.baseline == "leave_one_out" and t.scst.samples < 2:
            problems.append(f"train.scst.baseline=leave_one_out needs train.scst.samples >= 2 (the image's other "
                            f"samples), got {t.scst.samples}")
        if not uses_feature_cache(config):
            problems.append("train.objective=scst trains the decoder on a feature cache: not with "
                            "data.feature_cache=false, nor with encoder.fine_tune_from without encoder.cache_frozen")
        if config.data.mirror or t.word_weights:
            problems.append("train.objective=scst has no reference pairs to mirror or words to weight: "
                            "set data.mirror=false and train.word_weights={}")
        return problems

    def batches(self, epoch: int) -> list[list[int]]:
        t = self.config.train
        return image_batches(self.images, batch_size=t.batch_size, seed=t.seed, epoch=epoch)

    def loss(self, batch: ImageRows, *, step: int, size: int, counted: bool = True) -> Loss:
        if self.encoder is not None:  # its own annotations [B, L, D] from its frozen stages' output; not trained
            self.encoder.eval()
            with torch.no_grad():
                batch = ImageRows(batch.images, self.encoder(batch.annotations)[0])
        return self.critic.loss_at(self.decoder, batch, step=step, precision=self.hardware.precision,
                                   hard_choice=self.hard_choice, hard_warmup=self.config.model.hard.warmup)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass
