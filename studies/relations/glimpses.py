"""Where a two-glimpse decoder looks when it names a relation: on A, on B, or on both?

    python -m studies.relations.glimpses runs/relations_study/<run>/best.pt [...] [--images 300]

model.extras.glimpses=2 was added so that at the relation's first word ("to", "above", "below") one map
could sit on A and the other on B (captioning.model.decoder). This measures whether they do. For the first
reference caption of each validation image that reads "a A <relation> a B" (A and B two objects of
the image), it feeds the caption's words up to A under teacher forcing and takes both glimpses' maps
at the step that predicts the relation's first word: the share of each map inside A's box and inside
B's (evaluation.box_mass, as attention correctness), against a uniform map's. Results:
docs/attention.md.

    python -m studies.relations.glimpses <best.pt> [...] --correctness [--split test]

instead scores each glimpse's maps, and their mean (the map the decoder reports), on the split's
greedy captions as attention correctness does, as a multiple of chance: nothing ties "the glimpse
that lands on the named object" to the first or the second.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from captioning.data.shapes.scenes import RELATIONS
from captioning.eval.correctness import box_mass, box_share
from captioning.eval.evaluate import evaluate_split, scorer_for
from captioning.eval.shapes.scorer import word_objects
from captioning.model.extras.glimpses import TwoGlimpses
from studies.relations.errors import Run, load_run, teacher_forced

FIRST_WORDS = {stated.split()[0] for stated in RELATIONS}  # "to", "above", "below"


def two_glimpse_run(checkpoint: Path, *, data: str, split: str) -> Run:
    run = load_run(checkpoint, data=data, split=split)
    if not isinstance(run.decoder.attention, TwoGlimpses):  # model.extras.glimpses is 1 or 2
        raise SystemExit(f"{checkpoint}: model.extras.glimpses is 1; this needs two glimpses")
    return run


def masses(checkpoint: Path, *, data: str, images: int) -> dict[str, float]:
    """Mean share of each glimpse's map in A's and B's boxes at the relation's first word."""
    run = two_glimpse_run(checkpoint, data=data, split="val")
    val, decoder, vocab = run.images, run.decoder, run.vocab
    shares: dict[str, list[float]] = {"first on A": [], "first on B": [], "second on A": [], "second on B": [],
                                      "uniform on A": [], "uniform on B": []}
    for image in range(min(images, len(val.records))):
        truth = val.scenes[image]
        for caption in val.references[image]:
            words = caption.split()
            links = word_objects(words, truth.objects)  # (word position, object) per named shape
            if len(links) < 2 or links[0][1] == links[1][1] or words[links[0][0] + 1] not in FIRST_WORDS:
                continue
            (position, a), (_, b) = links[:2]
            annotations = torch.from_numpy(np.asarray(val.annotations[image:image + 1], dtype=np.float32))
            # inputs <start> .. A's shape: the last step predicts the relation's first word
            _, maps = teacher_forced(decoder, annotations, torch.tensor(vocab.encode(words)), position + 2)[-1]
            for glimpse, alpha in maps.items():  # [L] each
                for name, target in (("A", a), ("B", b)):
                    shares[f"{glimpse} on {name}"].append(box_mass(
                        alpha.view(*val.grid).numpy(), truth.objects[target].box, width=truth.width,
                        height=truth.height))
            for name, target in (("A", a), ("B", b)):
                shares[f"uniform on {name}"].append(box_share(truth.objects[target].box, width=truth.width,
                                                              height=truth.height))
            break
    return {"captions": len(shares["first on A"]), **{name: float(np.mean(v)) for name, v in shares.items()}}


def correctness_by_glimpse(checkpoint: Path, *, data: str, split: str) -> dict[str, float]:
    """Attention correctness / chance of the first glimpse's maps, of the second's, and of their mean
    (the map the decoder reports), on the split's greedy captions (the same captions for all three:
    what is reported does not change what is decoded)."""
    run = two_glimpse_run(checkpoint, data=data, split=split)
    part, decoder, vocab = run.images, run.decoder, run.vocab
    scores, first = {}, []

    def report_only(glimpse: str):
        """A hook on the second glimpse that makes the step's reported mean one glimpse's map: the
        contexts are computed by then, so the captions stay the same."""
        def hook(module, inputs, output):
            kept = first.pop()
            if glimpse == "first":
                output.alpha = kept.alpha
            else:
                kept.alpha = output.alpha
        return hook

    for glimpse in ("first", "second", "mean"):
        hooks = []
        if glimpse != "mean":
            hooks = [decoder.attention.first.register_forward_hook(lambda module, inputs, output: first.append(output)),
                     decoder.attention.second.register_forward_hook(report_only(glimpse))]
        try:
            metrics, _ = evaluate_split(decoder, part.annotations, image_ids=part.image_ids,
                                        references=part.references, vocab=vocab, grid=part.grid,
                                        scorer=scorer_for(part, vocab, probe=False), beam_size=1, full=False)
        finally:
            for hook in hooks:
                hook.remove()
        scores[glimpse] = metrics["attention_correctness"] / metrics["attention_correctness_chance"]
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", type=Path, nargs="+")
    parser.add_argument("--data", default="data/shapes")
    parser.add_argument("--images", type=int, default=300, help="the first N validation images")
    parser.add_argument("--correctness", action="store_true", help="each glimpse's attention correctness instead")
    parser.add_argument("--split", default="test", choices=("val", "test"), help="for --correctness")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.correctness:
        print("| run | first glimpse | second glimpse | their mean (reported) |\n|---|---|---|---|")
        for checkpoint in args.checkpoints:
            m = correctness_by_glimpse(checkpoint, data=args.data, split=args.split)
            print(f"| {checkpoint.parent.name} | {m['first']:.2f}x chance | {m['second']:.2f}x chance | "
                  f"{m['mean']:.2f}x chance |", flush=True)
        return
    print("| run | captions | first glimpse: A / B | second glimpse: A / B | uniform: A / B |")
    print("|---|---|---|---|---|")
    for checkpoint in args.checkpoints:
        m = masses(checkpoint, data=args.data, images=args.images)
        print(f"| {checkpoint.parent.name} | {m['captions']} | {m['first on A']:.3f} / {m['first on B']:.3f} | "
              f"{m['second on A']:.3f} / {m['second on B']:.3f} | {m['uniform on A']:.3f} / {m['uniform on B']:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
