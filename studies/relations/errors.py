"""Where a decoder gets spatial relations wrong: close to the diagonal, or among three objects?

    python -m studies.relations.errors runs/relations_study/<run>/best.pt [--split val]
        [--captions <eval.py's captions: metrics_test_captions.json beside its --out>]

Two things can make a relation hard on the shapes data. Its *axis* is the one along which the two
centres differ most (captioning.data.shapes.scenes.relation), so a pair near the diagonal, |dx| close to
|dy|, needs positions read finely. And with three objects, the relation is said before B is named,
so naming B must find the object that lies that way of A and not the third one. This splits the
relation probe's answers (captioning.eval.shapes.probe: whole captions "a A <relation> a B", B given) by the
pair's margin (|dx| - |dy|, as a share of the image side), by the image's object count, and by
whether two of its objects share a shape (then naming one takes its colour too). In
images of three objects it then feeds each reference caption "a A <relation> a B" and looks at the
step that predicts B's colour: where the map sits (on A, B or the third object C) and whose colour
the decoder rates likeliest. Where a reference caption's first object shares its shape with another
(a red square beside a yellow square), it says where the map that predicts that shape sits, fed the
colour: on the red square, or on its twin. With
`--captions` (eval.py's COCO-format results for the same split) it also splits the verdicts of the
relations the captions state (captioning.eval.shapes.scorer.VERDICTS) by object count, and says why each
false one is false (CAUSES): no object lies that way of A, or one does and B named another, or a
phrase names no object, and splits them by whether two objects of the image share a shape; and,
teacher-forced on those captions, where the maps sit at the first stated relation's first word,
by verdict. Results: docs/attention.md.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from captioning.checkpoint import decoder_from_checkpoint, load_checkpoint
from captioning.config import apply_overrides, from_dict
from captioning.data.shapes.scenes import RELATIONS, SHAPES, SceneObjects, ShapeObject, relation
from captioning.data.splits import Split, load_splits
from captioning.data.vocab import Vocabulary
from captioning.eval.correctness import box_mass
from captioning.eval.shapes.probe import relation_probe
from captioning.eval.shapes.scorer import VERDICTS, relation_verdict, stated_relations, word_objects
from captioning.model.extras.glimpses import TwoGlimpses

MARGINS = (0.0, 0.05, 0.1, 0.2, 0.3, 1.0)  # bins of | |dx| - |dy| | as a share of the image side
HORIZONTAL = np.array(["left" in stated or "right" in stated for stated in RELATIONS])  # [4]
FIRST_WORDS = {stated.split()[0] for stated in RELATIONS}  # "to", "above", "below"


def pair_geometry(scenes) -> list[tuple[float, int]]:
    """Per ordered pair (A, B), in relation_probe's order: (|dx| - |dy|) / side, and the object count."""
    rows = []
    for truth in scenes:
        objects = truth.objects
        for a in range(len(objects)):
            for b in range(len(objects)):
                if a != b:
                    (ax, ay), (bx, by) = objects[a].centre, objects[b].centre
                    rows.append(((abs(bx - ax) - abs(by - ay)) / truth.width, len(objects)))
    return rows


def shares_a_shape(objects: list[ShapeObject]) -> bool:
    """Whether two of the objects have the same shape (a red square and a yellow square): then naming
    one of them takes its colour as well as its shape."""
    return len({o.shape for o in objects}) < len(objects)


def pair_twins(scenes) -> list[bool]:
    """Per ordered pair (A, B), in relation_probe's order: whether two objects of its image share a shape."""
    return [shares_a_shape(truth.objects) for truth in scenes
            for _ in range(len(truth.objects) * (len(truth.objects) - 1))]


@dataclass
class Run:
    """A checkpoint's decoder (eval mode) and vocabulary, and one split's data under its config:
    loaded once, for every breakdown of that checkpoint."""

    checkpoint: Path
    split: str
    decoder: torch.nn.Module
    vocab: Vocabulary
    images: Split


def load_run(checkpoint: Path, *, data: str, split: str) -> Run:
    payload = load_checkpoint(checkpoint)
    config = apply_overrides(from_dict(payload["config"], where=f"{checkpoint}: config"), [f"data.root={data}"])
    return Run(checkpoint, split, decoder_from_checkpoint(payload, config).eval(), Vocabulary(payload["vocab"]),
               load_splits(config, (split,))[split])


def probe_breakdown(run: Run, *, batch: int = 50) -> list[str]:
    decoder, vocab, images = run.decoder, run.vocab, run.images
    answers = []
    with torch.no_grad():
        for start in range(0, len(images.scenes), batch):
            annotations = torch.from_numpy(np.asarray(images.annotations[start:start + batch], dtype=np.float32))
            answers += relation_probe(decoder, annotations, images.scenes[start:start + batch], vocab)
    margin, count = (np.array(column) for column in zip(*pair_geometry(images.scenes)))
    twins = np.array(pair_twins(images.scenes))
    truth, picked = np.array([(a.truth, a.picked) for a in answers]).T
    right, axis = truth == picked, HORIZONTAL[truth] == HORIZONTAL[picked]
    # What the decoder would say before naming B holds of A and some other object; chance: the share
    # of the four relations that hold of A and some other object.
    words = np.array([a.words in a.holding for a in answers])
    chance = np.array([len(a.holding) / len(RELATIONS) for a in answers])
    lines = [f"{run.checkpoint} on {run.split}: {len(answers)} pairs, probe {right.mean():.3f}, "
             f"axis {axis.mean():.3f}"]
    # The two are confounded (a third object adds pairs of every margin), so each count is split too.
    for objects in (2, 3):
        of_count = count == objects
        lines.append(f"  {objects} objects: {of_count.sum():4d} pairs, probe {right[of_count].mean():.3f}, "
                     f"axis {axis[of_count].mean():.3f}; relation words {words[of_count].mean():.3f} "
                     f"(chance {chance[of_count].mean():.3f})")
        for low, high in zip(MARGINS, MARGINS[1:]):
            where = of_count & (np.abs(margin) >= low) & (np.abs(margin) < high)
            lines.append(f"    margin {low:.2f}-{high:.2f} of the side: {where.sum():4d} pairs, "
                         f"probe {right[where].mean():.3f}, axis {axis[where].mean():.3f}")
        for shared, where in ((True, "two objects share a shape"), (False, "no two share a shape")):
            chosen = of_count & (twins == shared)
            lines.append(f"    {where}: {chosen.sum():4d} pairs, probe {right[chosen].mean():.3f}, "
                         f"relation words {words[chosen].mean():.3f}")
    return lines


def teacher_forced(decoder, annotations: torch.Tensor, tokens: torch.Tensor,
                   steps: int) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
    """Feeds one image's annotations [1, L, D] and tokens [<start>, w_0, w_1, ..] one by one for
    `steps` steps. Per step k (fed token k, predicting w_k): the logits [V] and each glimpse's own map
    [L] by name ("first"; "second" with two glimpses; the decoder reports their mean)."""
    maps: dict[str, torch.Tensor] = {}
    attention = decoder.attention
    glimpses = ({"first": attention.first, "second": attention.second} if isinstance(attention, TwoGlimpses)
                else {"first": attention})
    hooks = [module.register_forward_hook(lambda module, inputs, output, name=name: maps.update({name: output.alpha}))
             for name, module in glimpses.items()]
    found = []
    try:
        with torch.no_grad():
            memory, state = decoder.start(annotations)
            for k in range(steps):
                logits, state, _ = decoder.next_word(memory, state, tokens[k:k + 1])
                found.append((logits[0], {name: maps[name][0] for name in glimpses}))
    finally:
        for hook in hooks:
            hook.remove()
    return found


def naming_breakdown(run: Run, *, images: int) -> list[str]:
    """In images of three objects A, B, C with three colours, teacher-forced on each reference caption
    "a A <relation> a B": at the step that predicts the relation's first word, the share of each
    glimpse's map inside each object's box, and how much of what lies inside them is on one object;
    at the step that predicts B's colour, the share of the (first) map inside each object's box, and
    which of the three colours the decoder rates likeliest."""
    decoder, vocab, split_data = run.decoder, run.vocab, run.images
    masses: dict[str, list[float]] = {"A": [], "B": [], "C": []}
    at_relation: dict[tuple[str, str], list[float]] = {}  # (glimpse, object) -> shares at the relation's first word
    picks: Counter = Counter()
    for image in range(min(images, len(split_data.records))):
        truth = split_data.scenes[image]
        if len(truth.objects) != 3 or len({o.colour for o in truth.objects}) != 3:
            continue
        annotations = torch.from_numpy(np.asarray(split_data.annotations[image:image + 1], dtype=np.float32))
        for caption in split_data.references[image]:
            words = caption.split()
            links = word_objects(words, truth.objects)  # (position of the shape word, object) per named object
            if len(links) < 2 or links[0][1] == links[1][1] or words[links[0][0] + 1] not in FIRST_WORDS:
                continue
            a, b = links[0][1], links[1][1]
            c = 3 - a - b
            colour_at = links[1][0] - 1  # "a [small] blue square": the colour is just before the shape
            steps = teacher_forced(decoder, annotations, torch.tensor(vocab.encode(words)), colour_at + 1)
            for glimpse, alpha in steps[links[0][0] + 1][1].items():  # the step that predicts the relation's first word
                for name, target in (("A", a), ("B", b), ("C", c)):
                    at_relation.setdefault((glimpse, name), []).append(box_mass(
                        alpha.view(*split_data.grid).numpy(), truth.objects[target].box, width=truth.width,
                        height=truth.height))
            logits, maps = steps[colour_at]  # the step that predicts B's colour
            alpha = maps["first"].view(*split_data.grid).numpy()
            for name, target in (("A", a), ("B", b), ("C", c)):
                masses[name].append(box_mass(alpha, truth.objects[target].box, width=truth.width,
                                             height=truth.height))
            colours = [vocab.encode([truth.objects[o].colour])[1] for o in (a, b, c)]  # past <start>
            # Naming C is no error where the stated relation holds of A and C too.
            only_b = relation(truth.objects[a], truth.objects[c]) != relation(truth.objects[a], truth.objects[b])
            picks["ABC"[int(logits[colours].argmax())], only_b] += 1
    lines = [f"{run.checkpoint} on {run.split}, three objects, teacher-forced on \"a A <relation> a B\":"]
    for glimpse in ("first", "second"):
        if (glimpse, "A") in at_relation:
            # Means over captions cannot tell a map that blends the three objects from maps that each
            # pick one, a different one from caption to caption: the share on its top object can.
            shares = np.array([at_relation[glimpse, name] for name in "ABC"]).T  # [captions, 3]
            inside = shares.sum(1)
            top = shares.max(1)[inside > 0] / inside[inside > 0]
            lines.append(f"  at the relation's first word, {glimpse} map inside A / B / C: "
                         + " / ".join(f"{np.mean(at_relation[glimpse, name]):.3f}" for name in "ABC")
                         + f"; inside any {inside.mean():.2f}, of which on its top object {top.mean():.2f} "
                         "(1/3: spread evenly, 1: one object)")
    lines.append("  at B's colour, map inside A / B / C: "
                 + " / ".join(f"{np.mean(masses[name]):.3f}" for name in "ABC"))
    for only_b, where in ((True, "the relation holds of B only"), (False, "it holds of C too")):
        total = sum(picks[name, only_b] for name in "ABC")
        lines.append(f"  {where} ({total} captions): likeliest colour "
                     + ", ".join(f"{name}'s {picks[name, only_b] / max(total, 1):.0%}" for name in "ABC"))
    return lines


def read_captions(captions: Path) -> dict[int, str]:
    """eval.py's COCO-format results: image id -> caption."""
    try:
        return {int(row["image_id"]): row["caption"] for row in json.loads(captions.read_text())}
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"{captions}: not eval.py's results (a JSON list of image_id, caption): {error}") from None


def caption_breakdown(captions: Path, stated: dict[int, str], *, run: Run) -> list[str]:
    """Verdicts of the relations `stated` (read from `captions`, for the run's split) by the image's
    object count."""
    images, split = run.images, run.split
    missing = [image for image in images.image_ids if image not in stated]
    if missing:
        raise SystemExit(f"{captions}: no caption for {len(missing)} of the {split} split's images "
                         f"(e.g. {missing[0]}); is it that split's results?")
    verdicts: dict[int, Counter] = {2: Counter(), 3: Counter()}
    causes: dict[int, Counter] = {2: Counter(), 3: Counter()}
    twins: Counter = Counter()  # (object count, two objects share a shape, true) -> stated relations
    by_relation: Counter = Counter()  # (the relation stated, true) -> stated relations
    for image, truth in zip(images.image_ids, images.scenes):
        words = stated[image].split()
        objects = truth.objects
        if len(objects) in verdicts:
            shared = shares_a_shape(objects)
            for a, said, b in stated_relations(words, objects):
                verdict, cause = verdict_cause(a, said, b, objects)
                verdicts[len(objects)][verdict] += 1
                twins[len(objects), shared, verdict == "true"] += 1
                by_relation[said, verdict == "true"] += 1
                if cause is not None:
                    causes[len(objects)][cause] += 1
    lines = [f"{captions}: stated relations by object count"]
    for objects, found in verdicts.items():
        total = sum(found.values())
        share = found["true"] / total if total else float("nan")
        lines.append(f"  {objects} objects: {total:4d} stated, {share:.0%} true; "
                     + ", ".join(f"{verdict} {found[verdict]}" for verdict in VERDICTS))
        lines.append("    of the false ones: " + ", ".join(f"{cause} {causes[objects][cause]}" for cause in CAUSES))
        for shared, where in ((True, "two of them share a shape"), (False, "no two share a shape")):
            true, total = twins[objects, shared, True], twins[objects, shared, True] + twins[objects, shared, False]
            lines.append(f"    where {where}: {total} stated, "
                         + (f"{true / total:.0%} true" if total else "none"))
    lines.append("  by the relation stated (true of stated): " + ", ".join(
        f"{said} {by_relation[said, True]} of {by_relation[said, True] + by_relation[said, False]}"
        for said in RELATIONS))
    return lines


# Why a stated relation "A <relation> B" is false. Wrong or self: either no object of the image lies
# that way of A (the relation word was wrong whatever came next), or one does and B named another.
# Absent: A's or B's phrase names no object of the image (e.g. one object's colour on another's shape).
CAUSES = ("no object that way", "another object that way", "A names none", "B names none")


def verdict_causes(words: list[str], truth: SceneObjects) -> list[tuple[str, str | None]]:
    """Per relation the words state: its verdict (captioning.eval.shapes.scorer.VERDICTS) and, where it is
    not true, its cause (CAUSES)."""
    return [verdict_cause(a, stated, b, truth.objects) for a, stated, b in stated_relations(words, truth.objects)]


def verdict_cause(a: int | None, stated: str, b: int | None,
                  objects: list[ShapeObject]) -> tuple[str, str | None]:
    """One stated relation's verdict and, where it is not true, its cause (CAUSES)."""
    verdict = relation_verdict(a, stated, b, objects)
    if verdict == "true":
        return verdict, None
    if verdict == "absent":
        return verdict, CAUSES[2] if a is None else CAUSES[3]
    that_way = any(relation(objects[a], other) == stated for k, other in enumerate(objects) if k != a)
    return verdict, CAUSES[1] if that_way else CAUSES[0]


def binding_breakdown(run: Run, *, images: int) -> list[str]:
    """Teacher-forced on each reference caption whose first object A shares its shape with another
    object of the image (its twin: "a red square" beside a yellow square): at the step that predicts
    A's shape, fed A's colour, the share of the (first) map inside A and inside its twins. With the
    paper's query (h_{t-1}) that map is computed before the colour was chosen; with
    model.extras.query_word it has seen it."""
    decoder, vocab, split_data = run.decoder, run.vocab, run.images
    rows = []  # [inside A, inside its twins] per caption
    for image in range(min(images, len(split_data.records))):
        truth = split_data.scenes[image]
        annotations = None
        for caption in split_data.references[image]:
            words = caption.split()
            links = word_objects(words, truth.objects)
            if not links:
                continue
            at, a = links[0]
            twins = [k for k, o in enumerate(truth.objects) if k != a and o.shape == truth.objects[a].shape]
            if not twins:
                continue
            if annotations is None:
                annotations = torch.from_numpy(np.asarray(split_data.annotations[image:image + 1], dtype=np.float32))
            steps = teacher_forced(decoder, annotations, torch.tensor(vocab.encode(words)), at + 1)
            alpha = steps[at][1]["first"].view(*split_data.grid).numpy()  # fed A's colour, predicting its shape
            mass = [box_mass(alpha, o.box, width=truth.width, height=truth.height) for o in truth.objects]
            rows.append([mass[a], sum(mass[k] for k in twins)])
    if not rows:
        return [f"{run.checkpoint} on {run.split}: no reference caption names first an object with a twin"]
    rows = np.array(rows)
    on_a = rows[:, 0] > rows[:, 1]
    return [f"{run.checkpoint} on {run.split}, {len(rows)} captions whose first object A shares its shape with "
            f"another (its twin), at the step that predicts A's shape: map inside A {rows[:, 0].mean():.3f}, "
            f"inside its twin {rows[:, 1].mean():.3f}; more on A than on the twin in {on_a.mean():.0%}"]


def stated_glimpses(run: Run, stated: dict[int, str]) -> list[str]:
    """Teacher-forced on the decoder's own captions (`stated`, from eval.py): at the step that predicts
    the first stated relation's first word, each glimpse's share inside A, inside the object named B
    (none where B names A again) and inside the other objects, by the relation's verdict and cause.
    Does a relation that points where no object lies come with maps that looked elsewhere?"""
    decoder, vocab, split_data = run.decoder, run.vocab, run.images
    shares: dict[tuple[str, str], list[list[float]]] = {}  # (cause or "true", glimpse) -> [A, B, others] per caption
    for index, (image, truth) in enumerate(zip(split_data.image_ids, split_data.scenes)):
        words = stated[image].split()
        relations = stated_relations(words, truth.objects)
        at = next((k for k in range(len(words) - 1) if words[k] in SHAPES and words[k + 1] in FIRST_WORDS), None)
        if not relations or at is None:
            continue
        a, said, b = relations[0]
        verdict, cause = verdict_cause(a, said, b, truth.objects)
        if verdict == "absent" or (at, a) not in word_objects(words, truth.objects):  # A: the shape before it
            continue
        steps = teacher_forced(decoder, torch.from_numpy(np.asarray(split_data.annotations[index:index + 1],
                                                                     dtype=np.float32)),
                               torch.tensor(vocab.encode(words)), at + 2)
        for glimpse, alpha in steps[at + 1][1].items():
            mass = [box_mass(alpha.view(*split_data.grid).numpy(), o.box, width=truth.width, height=truth.height)
                    for o in truth.objects]
            others = sum(m for k, m in enumerate(mass) if k not in (a, b))
            named_b = mass[b] if b != a else 0.0
            shares.setdefault((cause or "true", glimpse), []).append([mass[a], named_b, others])
    lines = [f"{run.checkpoint} on {run.split}, its own captions, at the first stated relation's first word: "
             "map inside A / B (0 where B is A) / the other objects"]
    for glimpse in ("first", "second"):
        for group in ("true", *CAUSES[:2]):
            if (group, glimpse) in shares:
                rows = np.array(shares[group, glimpse])
                lines.append(f"  {glimpse}, {group} ({len(rows)}): " + " / ".join(f"{v:.3f}" for v in rows.mean(0)))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", type=Path)
    parser.add_argument("--split", default="val", choices=("val", "test"))
    parser.add_argument("--data", default="data/shapes")
    parser.add_argument("--images", type=int, default=500, help="the first N images, for B's naming")
    parser.add_argument("--captions", type=Path, help="eval.py's results file for --split (one checkpoint only)")
    args = parser.parse_args()
    if args.captions and len(args.checkpoints) != 1:
        parser.error("--captions goes with exactly one checkpoint")
    stated = read_captions(args.captions) if args.captions else None  # a bad file fails before the probe runs
    for checkpoint in args.checkpoints:
        run = load_run(checkpoint, data=args.data, split=args.split)
        print("\n".join(probe_breakdown(run)), flush=True)
        print("\n".join(naming_breakdown(run, images=args.images)), flush=True)
        print("\n".join(binding_breakdown(run, images=args.images)), flush=True)
        if stated is not None:  # one checkpoint only
            print("\n".join(caption_breakdown(args.captions, stated, run=run)))
            print("\n".join(stated_glimpses(run, stated)))


if __name__ == "__main__":
    main()
