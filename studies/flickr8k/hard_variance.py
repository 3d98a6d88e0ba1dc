"""How noisy hard attention's REINFORCE gradient is on Flickr8k, and what each variance reduction
of Sec. 4.1 buys, measured on a trained model rather than argued:

    python -m studies.flickr8k.hard_variance --data DATA --cache CACHE --out runs/flickr8k

The model is --run's best.pt under --out (hard_side_seed1: hard attention's best on val). On
--batches fixed batches of --captions training captions each, every caption samples its locations
(no soft substitution, no dropout: the locations are the only randomness), --draws times over. For
each number K of location samples per caption and each baseline b, a draw's gradient of the
REINFORCE term (lambda_r = 1, as the recipe; the surrogate of captioning.model.paper.Reinforce,
divided by the words) is taken over all of the decoder's weights, and over the draws:

    signal = |mean gradient|^2,   noise = mean |gradient - mean gradient|^2,

each against |cross-entropy gradient|^2 of the same rows (the term that trains the words); the
mean over draws still holds 1/D of the noise, which the table takes out (unbiased_signal). The
baselines: none (b = 0); the run's moving average, stood in for by the mean reward of the *other*
batches (what a moving average over recent batches holds); the batch's own mean reward (the best a
single number per batch can do); leave-one-out over a caption's K samples (K >= 2). The reward
r = log p(y | s, a) is also split into its spread between captions and between one caption's draws.
Results go to results/hard_variance.json and, as a table, into the study's README.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import nn

from captioning.checkpoint import load_trained
from captioning.data.dataset import CaptionPairs, collate
from captioning.data.tokenized import tokenized, tokens_dir
from captioning.model.paper import Draws, Reinforce, caption_log_likelihood, cross_entropy
from captioning.model.tokens import PAD_ID
from studies.tables import REPO, write_between

SAMPLES = (1, 2, 4)  # location samples per caption (train.reinforce.location_samples)


def _flat_grad(loss: torch.Tensor, parameters: list[nn.Parameter]) -> torch.Tensor:
    grads = torch.autograd.grad(loss, parameters, retain_graph=True, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, parameters)])


def _surrogate(reinforce: Reinforce, *, logits, targets, mask, output) -> torch.Tensor:
    return reinforce(logits=logits, targets=targets, mask=mask, log_probs=output.log_probs.float(),
                     entropies=output.entropies.float(), locations=output.locations).loss


def measure(decoder: nn.Module, batches: list, *, draws: int, seed: int) -> dict:
    parameters = [p for p in decoder.parameters() if p.requires_grad]
    decoder.train()
    for module in decoder.modules():  # the locations are the only randomness
        if isinstance(module, nn.Dropout):
            module.eval()
    torch.manual_seed(seed)
    rows: dict[str, dict[str, list[float]]] = {}
    spread = {"between_captions": [], "between_draws": []}
    batch_means: list[float] = []
    kept: list[dict] = []
    for batch in batches:  # first pass: each batch's rewards under K = 1, for the baselines that need them
        tokens = batch.tokens
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        mask = (targets != PAD_ID).float()
        with torch.no_grad():
            rewards = torch.stack([
                caption_log_likelihood(decoder(batch.annotations.float(), inputs, lengths=mask.sum(1).long(),
                                               draws=Draws(expectation_prob=0.0)).logits.float(), targets, mask)
                for _ in range(draws)])  # [D, B]
        spread["between_captions"].append(rewards.mean(0).var().item())
        spread["between_draws"].append(rewards.var(0).mean().item())
        batch_means.append(rewards.mean().item())
        kept.append({"annotations": batch.annotations.float(), "tokens": tokens})
    for index, batch in enumerate(kept):
        others = [m for i, m in enumerate(batch_means) if i != index]
        moving = sum(others) / len(others)
        for k in SAMPLES:
            tokens = batch["tokens"].repeat_interleave(k, dim=0)  # [B*K, T], a caption's K rows in a row
            annotations = batch["annotations"].repeat_interleave(k, dim=0)  # [B*K, L, D]
            inputs, targets = tokens[:, :-1], tokens[:, 1:]
            mask = (targets != PAD_ID).float()
            baselines = {"none": Reinforce(baseline="none"), "moving average": Reinforce(),
                         "batch mean": Reinforce()}
            baselines["moving average"].value = moving  # the other batches' mean reward
            if k > 1:
                baselines["leave-one-out"] = Reinforce(baseline="leave_one_out", location_samples=k)
            gradients: dict[str, list[torch.Tensor]] = {name: [] for name in baselines}
            xe_norms = []
            for _ in range(draws):
                output = decoder(annotations, inputs, lengths=mask.sum(1).long(), draws=Draws(expectation_prob=0.0))
                logits = output.logits.float()
                xe_norms.append(_flat_grad(cross_entropy(logits, targets, mask), parameters).square().sum().item())
                for name, reinforce in baselines.items():
                    surrogate = _surrogate(reinforce, logits=logits, targets=targets, mask=mask, output=output)
                    gradients[name].append(_flat_grad(surrogate, parameters))
            xe = sum(xe_norms) / len(xe_norms)
            for name, grads in gradients.items():
                stacked = torch.stack(grads)  # [D, P]
                mean = stacked.mean(0)
                signal = mean.square().sum().item()
                noise = (stacked - mean).square().sum(1).mean().item()
                row = rows.setdefault(f"{k}|{name}", {"signal": [], "noise": [], "xe": []})
                row["signal"].append(signal)
                row["noise"].append(noise)
                row["xe"].append(xe)
    result = {"rows": [], "reward": {key: sum(v) / len(v) for key, v in spread.items()},
              "batches": len(batches), "captions": batches[0].tokens.shape[0], "draws": draws}
    for key, row in rows.items():
        k, name = key.split("|")
        mean = {field: sum(values) / len(values) for field, values in row.items()}
        result["rows"].append({"samples": int(k), "baseline": name, "noise_over_xe": mean["noise"] / mean["xe"],
                               "signal_over_xe": mean["signal"] / mean["xe"],
                               "noise_over_signal": mean["noise"] / mean["signal"]})
    return result


def unbiased_signal(row: dict, draws: int) -> float:
    """|E gradient|^2 / |cross-entropy gradient|^2 without the noise that the mean of `draws` draws
    still holds: E|mean|^2 = |E g|^2 + tr(Cov)/D, and `noise` (the spread about the mean) is
    (D - 1)/D tr(Cov)."""
    return row["signal_over_xe"] - row["noise_over_xe"] / (draws - 1)


def table(result: dict) -> str:
    """Each row's noise, and how many draws its mean needs to stand out of it. Every baseline is
    unbiased, so the REINFORCE term has one mean gradient whatever the row: it is estimated from the
    rows whose noise is least (leave-one-out), where the draws resolve it."""
    draws = result["draws"]
    resolved = [unbiased_signal(row, draws) for row in result["rows"] if row["baseline"] == "leave-one-out"]
    signal = sum(resolved) / len(resolved)
    lines = ["| samples per caption | baseline | noise / cross-entropy | batches to average till the mean stands out |",
             "|---|---|---|---|"]
    for row in result["rows"]:
        lines.append(f"| {row['samples']} | {row['baseline']} | {row['noise_over_xe']:.2f} | "
                     f"{row['noise_over_xe'] / signal:,.0f} |")
    reward = result["reward"]
    lines += ["", f"Noise: the mean squared distance of one batch's REINFORCE gradient from its mean over draws, "
                  f"against the squared norm of the cross-entropy gradient of the same rows. The mean itself "
                  f"(estimated without bias from the leave-one-out rows) is {signal:.4f} of that squared norm. "
                  f"The reward log p(y | s, a) varies {reward['between_captions']:.0f} nats² between captions "
                  f"(their means over draws) and {reward['between_draws']:.1f} nats² between one caption's draws "
                  f"({result['batches']} batches of {result['captions']} captions, {draws} draws)."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="Flickr8k: dataset_flickr8k.json and Flicker8k_Dataset/")
    parser.add_argument("--cache", required=True, help="data.cache_root: the feature caches")
    parser.add_argument("--out", type=Path, required=True, help="the study's runs (OUT/<run>/best.pt)")
    parser.add_argument("--run", default="hard_side_seed1")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--captions", type=int, default=32)
    parser.add_argument("--draws", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", type=Path, default=REPO / "studies/flickr8k/results/hard_variance.json")
    parser.add_argument("--tables-only", action="store_true", help="the README's table from the kept result")
    args = parser.parse_args()
    if args.tables_only:
        _write(json.loads(args.results.read_text()))
        return
    torch.set_num_threads(args.threads)
    trained = load_trained(args.out / args.run / "best.pt",
                           overrides=[f"data.root={args.data}", f"data.cache_root={args.cache}"])
    train, _ = trained.split("train")
    data = trained.config.data
    captions = tokenized(train.records, cache=tokens_dir(data), language=data.language)
    pairs = CaptionPairs(train.annotations, captions, trained.vocab, max_length=trained.config.data.max_caption_length)
    order = torch.randperm(len(pairs), generator=torch.Generator().manual_seed(args.seed))
    batches = [collate([pairs[int(i)] for i in order[b * args.captions:(b + 1) * args.captions]])
               for b in range(args.batches)]
    result = {"run": args.run, **measure(trained.decoder, batches, draws=args.draws, seed=args.seed)}
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    _write(result)


def _write(result: dict) -> None:
    text = table(result)
    print(text)
    write_between(REPO / "studies/flickr8k/README.md", "flickr8k-hard-variance",
                  "python -m studies.flickr8k.hard_variance --data DATA --cache CACHE --out OUT", text)


if __name__ == "__main__":
    main()
