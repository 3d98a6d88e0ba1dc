"""Command-line entry points: `captioning make-shapes | prepare | prepare-features | caption | train |
evaluate`, and the bodies of train.py and eval.py (which torchrun starts once per process).

Expected failures (bad config, missing data, unreadable checkpoint or image, weights that cannot be
had) end in one line on stderr naming the file and the problem, and a non-zero exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from captioning.config import ConfigError
from captioning.data.images import ImageReadError
from captioning.data.karpathy import DatasetError
from captioning.data.shapes.scenes import SHAPES_DEFAULT_COUNTS
from captioning.model.encoder import EncoderWeightsError
from captioning.train.checkpoint import CheckpointError
from captioning.train.hardware import default_device
from captioning.train.step import TrainingError

EXPECTED_ERRORS = (CheckpointError, ConfigError, DatasetError, EncoderWeightsError, ImageReadError, TrainingError)


def _guarded(function: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return function(args)
        except EXPECTED_ERRORS as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    return run


# make-shapes ---------------------------------------------------------------------------------------

def _make_shapes(args: argparse.Namespace) -> int:
    from captioning.data.shapes.scenes import make_shapes

    counts = {"train": args.train, "val": args.val, "test": args.test}
    try:
        split_file = make_shapes(args.out, counts, seed=args.seed, image_size=args.image_size,
                                 train_object_weights=args.train_object_weights)
    except ValueError as error:
        print(f"captioning make-shapes: {error}", file=sys.stderr)
        return 2
    print(f"wrote {args.train} / {args.val} / {args.test} images with 5 captions each; split file {split_file}")
    return 0


# train ---------------------------------------------------------------------------------------------

def _add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (default: the embedded default, configs/shapes_soft.yaml)")
    parser.add_argument("--resume", action="store_true", help="continue from OUT_DIR/last.pt")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")


@_guarded
def _train(args: argparse.Namespace) -> int:
    from captioning.config import load_config
    from captioning.train.loop import fit

    config = load_config(args.config, args.overrides)
    summary = fit(config, resume=args.resume, device=default_device(args.device))
    if os.environ.get("RANK", "0") != "0":  # under torchrun, rank 0 speaks for all
        return 0
    if summary["interrupted"]:
        print(f"stopped by {summary['interrupted']} after {summary['steps']} steps; {summary['last']} saved: "
              "continue with --resume", file=sys.stderr)
        return 128 + signal.Signals[summary["interrupted"]].value
    skipped = f"; {summary['skipped_images']} unreadable training images skipped" if summary["skipped_images"] else ""
    print(f"best {summary['metric']} {summary['best_metric']:.4f} after {summary['steps']} steps "
          f"({summary['seconds']:.0f} s){skipped}; checkpoints: {summary['best']}, {summary['last']}")
    return 0


# prepare, prepare-features -------------------------------------------------------------------------

def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (default: the embedded default)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")


@_guarded
def _prepare(args: argparse.Namespace) -> int:
    from captioning.config import load_config
    from captioning.data.prepare import prepare_vocabulary, vocabulary_path

    config = load_config(args.config, args.overrides)
    vocab, stats = prepare_vocabulary(config)
    print(f"vocabulary of {len(vocab)} words (min count {config.data.min_word_count}, from "
          f"{stats['captions']} training captions with {stats['distinct_words']} distinct words; "
          f"{stats['unk_share']:.2%} of their tokens become <unk>): {vocabulary_path(config)}")
    print(f"caption length: median {stats['length_p50']:.0f}, 99th percentile {stats['length_p99']:.0f} words; "
          f"{stats['clipped_share']:.2%} of training captions clipped at {config.data.max_caption_length}")
    return 0


@_guarded
def _prepare_features(args: argparse.Namespace) -> int:
    from captioning.config import load_config
    from captioning.data.prepare import prepare_features
    from captioning.data.splits import features_dir

    config = load_config(args.config, args.overrides)
    if config.encoder.fine_tune_from is not None:
        print(f"note: encoder.fine_tune_from={config.encoder.fine_tune_from}: training runs the encoder on the "
              "fly and does not read this cache (evaluation of a frozen encoder would)", file=sys.stderr)
    splits = prepare_features(config, splits=tuple(args.splits.split(",")), device=default_device(args.device))
    for name, split in splits.items():
        unreadable = f", {split.unreadable} unreadable images left out" if split.unreadable else ""
        print(f"{name}: {len(split.records)} images, annotations {list(split.annotations.shape)} "
              f"(grid {split.grid[0]}x{split.grid[1]}){unreadable}")
    print(f"cache: {features_dir(config)}")
    return 0


def train_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="train.py", description="Train a Show, Attend and Tell captioner.")
    _add_train_arguments(parser)
    return _train(parser.parse_args(argv))


# evaluate ------------------------------------------------------------------------------------------

def _add_hard_choice_argument(parser: argparse.ArgumentParser) -> None:
    from captioning.model.attention import HardAttention

    parser.add_argument("--hard-choice", choices=HardAttention.CHOICES,
                        help="how a hard attention model picks its cell per word (default: the checkpoint config's "
                             "decode.hard_choice, normally expectation); soft models take only expectation")
    # its name before the config had one word for it (decode.hard_attention)
    parser.add_argument("--hard-attention", dest="hard_choice", choices=HardAttention.CHOICES, help=argparse.SUPPRESS)


def _add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--beam-size", type=int, help="default: the checkpoint config's decode.beam_size")
    _add_hard_choice_argument(parser)
    parser.add_argument("--out", help="write the metrics here as JSON")
    parser.add_argument("--results", help="COCO results file [{image_id, caption}] (default: beside --out, "
                        "named after it: metrics_test.json -> metrics_test_captions.json)")
    parser.add_argument("--device")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="e.g. data.root=/data/shapes")


@_guarded
def _evaluate(args: argparse.Namespace) -> int:
    from captioning.eval.evaluate import evaluate_checkpoint, write_evaluation

    evaluation = evaluate_checkpoint(args.checkpoint, split=args.split, overrides=args.overrides,
                                     beam_size=args.beam_size, hard_choice=args.hard_choice,
                                     device=default_device(args.device))
    metrics, choice = evaluation.metrics, evaluation.hard_choice
    print(f"{args.checkpoint} on {args.split} ({len(evaluation.results)} images, beam {evaluation.beam_size}, "
          f"{evaluation.config.model.attention} attention{'' if choice == 'expectation' else ': ' + choice})")
    for name, value in metrics.items():
        print(f"  {name:<30} {value:.4f}" if isinstance(value, float) else f"  {name:<30} {value}")
    if "attention_correctness" in metrics:
        ratio = metrics["attention_correctness"] / metrics["attention_correctness_chance"]
        print(f"  {'attention / chance':<30} {ratio:.2f}x")
    written = write_evaluation(evaluation, checkpoint=args.checkpoint, split=args.split, out=args.out,
                               results=args.results)
    if "metrics" in written:
        print(f"metrics: {written['metrics']}")
    if "captions" in written:
        print(f"captions (COCO results format): {written['captions']}")
    return 0


def eval_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eval.py", description="Score a checkpoint's captions on a split.")
    _add_eval_arguments(parser)
    return _evaluate(parser.parse_args(argv))


# caption -------------------------------------------------------------------------------------------

def _caption(args: argparse.Namespace) -> int:
    from captioning.data.images import load_image, to_tensor
    from captioning.eval.overlays import save_overlays
    from captioning.train.checkpoint import captioner_from_checkpoint, refuse_hard_choice

    device = default_device(args.device)
    try:
        model, vocab, config = captioner_from_checkpoint(args.checkpoint, device=device)
    except (CheckpointError, ConfigError, EncoderWeightsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    beam_size = args.beam_size or config.decode.beam_size
    choice = args.hard_choice or config.decode.hard_choice
    try:
        refuse_hard_choice(model.decoder, choice, args.checkpoint)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    failures = 0
    used_names: set[str] = set()
    for path in args.images:
        try:
            image = load_image(path)
        except ImageReadError as error:
            print(f"error: {error}", file=sys.stderr)
            failures += 1
            continue
        pixels = to_tensor(image, size=config.data.image_size, mean=model.encoder.mean, std=model.encoder.std)
        captions, grid = model.generate(pixels[None].to(device), beam_size=beam_size,
                                        max_length=config.decode.max_length,
                                        length_penalty=config.decode.length_penalty, hard_choice=choice)
        tokens = captions.tokens[0].tolist()
        words = vocab.decode(tokens)
        caption = " ".join(words)
        if args.json:
            print(json.dumps({"image": path, "caption": caption, "tokens": words}), flush=True)
        else:
            print(f"{path}\t{caption}", flush=True)
        if args.overlays:
            name = Path(path).stem
            while name in used_names:
                name += "_"
            used_names.add(name)
            alphas = captions.alphas[0, : len(words)].view(len(words), *grid).float().cpu().numpy()
            locations = captions.locations[0, : len(words)].tolist() if captions.locations is not None else None
            save_overlays(image, words, alphas, Path(args.overlays) / name, locations=locations)
    return 1 if failures else 0


# captioning ... ------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="captioning", description="Show, Attend and Tell image captioning.")
    commands = parser.add_subparsers(dest="command", required=True)

    shapes = commands.add_parser("make-shapes", help="generate the synthetic shapes dataset")
    shapes.add_argument("--out", required=True)
    shapes.add_argument("--train", type=int, default=SHAPES_DEFAULT_COUNTS["train"])
    shapes.add_argument("--val", type=int, default=SHAPES_DEFAULT_COUNTS["val"])
    shapes.add_argument("--test", type=int, default=SHAPES_DEFAULT_COUNTS["test"])
    shapes.add_argument("--seed", type=int, default=0)
    shapes.add_argument("--image-size", type=int, default=224)
    shapes.add_argument("--train-object-weights", type=float, nargs=3, metavar=("ONE", "TWO", "THREE"),
                        help="odds of 1, 2 and 3 objects in a training image (default: even); validation and "
                             "test images are unchanged")
    shapes.set_defaults(run=_make_shapes)

    caption = commands.add_parser("caption", help="caption images, optionally with per-word attention overlays")
    caption.add_argument("images", nargs="+", metavar="IMAGE")
    caption.add_argument("--checkpoint", required=True)
    caption.add_argument("--beam-size", type=int, help="default: the checkpoint config's decode.beam_size")
    _add_hard_choice_argument(caption)
    caption.add_argument("--overlays", metavar="DIR", help="write a folder of per-word overlays per image here "
                         "(hard attention with argmax or sample: the chosen cell outlined over each map)")
    caption.add_argument("--json", action="store_true", help="one JSON object per line")
    caption.add_argument("--device")
    caption.set_defaults(run=_caption)

    prepare = commands.add_parser("prepare", help="the vocabulary of the training split -> TRAIN.OUT_DIR/vocab.json")
    _add_config_arguments(prepare)
    prepare.set_defaults(run=_prepare)

    features = commands.add_parser("prepare-features",
                                    help="cache the frozen encoder's fp16 annotations of each split (resumable)")
    _add_config_arguments(features)
    features.add_argument("--splits", default="train,val,test", help="comma-separated (default: train,val,test)")
    features.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    features.set_defaults(run=_prepare_features)

    train = commands.add_parser("train", help="the same as train.py")
    _add_train_arguments(train)
    train.set_defaults(run=_train)

    evaluate = commands.add_parser("evaluate", help="the same as eval.py")
    _add_eval_arguments(evaluate)
    evaluate.set_defaults(run=_evaluate)

    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    raise SystemExit(main())
