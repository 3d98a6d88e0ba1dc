"""Command-line entry points: `captioning make-shapes | prepare | prepare-features | caption | train |
evaluate`, and the bodies of train.py and eval.py (which torchrun starts once per process).

Expected failures (bad config, missing data, unreadable checkpoint or image, weights that cannot be
had) end in one line on stderr naming the file and the problem, and a non-zero exit code
(common.py); the caption command, the one that reads a user's files, is caption.py.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from captioning.cli.caption import add_caption_command
from captioning.cli.common import (
    add_beam_size_argument,
    add_hard_choice_argument,
    add_pretrained_argument,
    add_quiet_argument,
    expected_errors,
    guarded,
    pretrained_alone,
    tolerance,
    whole_number,
)
from captioning.config.bounds import IMAGE_SIDE
from captioning.data.shapes import SHAPES_DEFAULT_COUNTS

# A command imports what it runs inside its function: building the parser (and `--help`) loads no
# torch, nor any training or evaluation module.


def default_device(name: str | None):  # noqa: ANN201 - torch.device, typed where torch is imported
    from captioning.runtime.hardware import default_device as chosen

    return chosen(name)

# make-shapes ---------------------------------------------------------------------------------------

def _make_shapes(args: argparse.Namespace) -> int:
    from captioning.data.shapes.scenes import make_shapes, write_folder

    if args.folder is not None:
        try:
            captions_file = write_folder(args.out, args.folder, seed=args.seed, image_size=args.image_size)
        except ValueError as error:  # DatasetError: --out holds someone's files
            print(f"captioning make-shapes: {error}", file=sys.stderr)
            return 2
        print(f"wrote {args.folder} images to {Path(args.out) / 'images'} with 5 captions each in {captions_file}")
        return 0
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
    add_quiet_argument(parser)
    parser.add_argument("--config", help="YAML config (default: the embedded default, configs/shapes_soft.yaml)")
    parser.add_argument("--resume", action="store_true", help="continue from OUT_DIR/last.pt")
    parser.add_argument("--dry-run", action="store_true", help="check the config in seconds: what the run would "
                        "refuse of OUT_DIR (read only), then a few images on disk, two steps, one validation batch, a "
                        "checkpoint written and read, in a temporary folder; exit 0 or one line saying what is wrong")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")


@guarded
def _train(args: argparse.Namespace) -> int:
    from captioning.config import load_config
    from captioning.data.records import make_missing_data
    from captioning.train.loop import fit

    config = load_config(args.config, args.overrides)
    device = default_device(args.device)  # a device that is not here: said before any data is made
    if args.dry_run:  # in a temporary folder, shapes data of its own included
        return _dry_run(config, device=device, resume=args.resume)
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:  # under torchrun, prepare-features first (docs/coco.md)
        make_missing_data(config)  # the embedded default on a fresh clone: its data made here, said in one line
    summary = fit(config, resume=args.resume, device=device)
    speaks = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 speaks for all; all exit alike
    if summary["interrupted"]:
        if speaks:
            print(f"stopped by {summary['interrupted']} after {summary['steps']} steps; {summary['last']} saved: "
                  "continue with --resume", file=sys.stderr)
        return 128 + signal.Signals[summary["interrupted"]].value
    if summary["best"] is None:  # every process knows it (the metric is broadcast), and all exit alike
        if speaks:
            print(f"error: train.val_metric {summary['metric']} was not measured (NaN) at any validation, so this run "
                  f"kept no best.pt; {summary['last']} holds the {summary['steps']} steps trained: go on with "
                  "--resume and another train.val_metric, which validates it first", file=sys.stderr)
        return 1
    if not speaks:
        return 0
    skipped = f"; {summary['skipped_images']} unreadable training images skipped" if summary["skipped_images"] else ""
    print(f"best {summary['metric']} {summary['best_metric']:.4f} after {summary['steps']} steps "
          f"({summary['seconds']:.0f} s){skipped}; checkpoints: {summary['best']}, {summary['last']}")
    return 0


def _dry_run(config, *, device, resume: bool) -> int:
    from captioning.train.dry_run import dry_run

    try:
        result = dry_run(config, device=device, resume=resume)
    except expected_errors():
        raise
    except Exception as error:  # noqa: BLE001 - a dry run reports any failure in one line, it is its job
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        print(f"dry run failed: {error.__class__.__name__}: {first} (run without --dry-run for the traceback)",
              file=sys.stderr)
        return 1
    # a metric never measured (attention_correctness on data without boxes) is NaN, kept as no best (-inf)
    value = f"{result.value:.4f}" if math.isfinite(result.value) else "not measured (NaN)"
    print(f"dry run passed in {result.seconds:.0f} s: {result.steps} steps, validation {result.metric} {value}, "
          "checkpoint written and read back")
    return 0


@guarded
def _sample_photos(args: argparse.Namespace) -> int:
    from captioning.data.images import write_sample_photos

    for path in write_sample_photos(args.out):
        print(path)
    return 0


# prepare, prepare-features -------------------------------------------------------------------------

def _add_config_arguments(parser: argparse.ArgumentParser) -> None:
    add_quiet_argument(parser)
    parser.add_argument("--config", help="YAML config (default: the embedded default)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")


@guarded
def _prepare(args: argparse.Namespace) -> int:
    from captioning.config import load_config
    from captioning.data.prepare import prepare_vocabulary, vocabulary_path
    from captioning.data.records import format_extra, make_missing_data

    config = load_config(args.config, args.overrides)
    make_missing_data(config)
    report = format_extra(config.data, "prepare_report")  # what the data's format says of it (a folder's)
    for line in report(config) if report is not None else ():
        print(line)
    vocab, stats = prepare_vocabulary(config)
    print(f"vocabulary of {len(vocab)} words (min count {config.data.min_word_count}, from "
          f"{stats['captions']} training captions with {stats['distinct_words']} distinct words; "
          f"{stats['unk_share']:.2%} of their tokens become <unk>): {vocabulary_path(config)}")
    print(f"caption length: median {stats['length_p50']:.0f}, 99th percentile {stats['length_p99']:.0f} words; "
          f"{stats['clipped_share']:.2%} of training captions clipped at {config.data.max_caption_length}")
    return 0


@guarded
def _prepare_features(args: argparse.Namespace) -> int:
    from captioning.config import load_config
    from captioning.data.prepare import prepare_features
    from captioning.data.records import counted, held_out_note, make_missing_data
    from captioning.data.splits import features_dir

    config = load_config(args.config, args.overrides)
    device = default_device(args.device)  # a device that is not here: said before any data is made
    make_missing_data(config)
    names = tuple(args.splits.split(",")) if args.splits else ("train", "val", "test")
    if args.splits is None and (note := held_out_note(config.data)) is not None:  # held out: nothing to cache
        print(note, file=sys.stderr)
        names = ("train", "val")
    if config.encoder.fine_tune_from is not None and config.encoder.cache_frozen:
        print(f"note: encoder.cache_frozen: this caches the stages before {config.encoder.fine_tune_from}, which "
              "training reads", file=sys.stderr)
    elif config.encoder.fine_tune_from is not None:
        print(f"note: encoder.fine_tune_from={config.encoder.fine_tune_from}: training runs the encoder on the "
              "fly and does not read this cache (evaluation of a frozen encoder would)", file=sys.stderr)
    splits = prepare_features(config, splits=names, device=device)
    for name, split in splits.items():
        unreadable = f", {counted(split.unreadable, 'unreadable image')} left out" if split.unreadable else ""
        print(f"{name}: {counted(len(split.records), 'image')}, annotations {list(split.annotations.shape)} "
              f"(grid {split.grid[0]}x{split.grid[1]}){unreadable}")
    print(f"cache: {features_dir(config)}")
    return 0


def train_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="train.py", description="Train a Show, Attend and Tell captioner.")
    _add_train_arguments(parser)
    return _train(_parse(parser, argv))


# evaluate ------------------------------------------------------------------------------------------

def _add_eval_arguments(parser: argparse.ArgumentParser) -> None:
    add_quiet_argument(parser)
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--checkpoint", metavar="FILE", action="append", help="best.pt or last.pt of a run; given "
                       "more than once, the checkpoints decode together as one ensemble (the mean of their word "
                       "probabilities; the first one's config)")
    add_pretrained_argument(model, use="give data.root=FLICKR8K, and data.cache_root where that folder is "
                            "read-only; decoded as its card says")
    parser.add_argument("--split", default="test", help="train, val or test of the checkpoint's data (default: test)")
    add_beam_size_argument(parser)
    add_hard_choice_argument(parser)
    parser.add_argument("--out", metavar="FILE", help="write the metrics here as JSON")
    parser.add_argument("--results", metavar="FILE", help="COCO results file [{image_id, caption}] (default: "
                        "beside --out, named after it: metrics_test.json -> metrics_test_captions.json)")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="where the data and weights are and how "
                        "to decode, e.g. data.root=/data/shapes; the model's settings only as the checkpoint has them")


@guarded
def _evaluate(args: argparse.Namespace) -> int:
    from captioning.data.records import counted
    from captioning.eval.evaluate import evaluate_checkpoint, write_evaluation
    from captioning.shipped import pretrained_path

    checkpoints = [str(pretrained_path(args.pretrained))] if args.pretrained is not False else args.checkpoint
    evaluation = evaluate_checkpoint(checkpoints, split=args.split, overrides=args.overrides,
                                     beam_size=args.beam_size, hard_choice=args.hard_choice,
                                     device=default_device(args.device))
    metrics, choice = evaluation.metrics, evaluation.hard_choice
    print(f"{' + '.join(checkpoints)} on {args.split} ({counted(len(evaluation.results), 'image')}, "
          f"beam {evaluation.beam_size}, "
          f"{evaluation.config.model.attention} attention{'' if choice == 'expectation' else ': ' + choice})")
    print(f"  {'tokenizer':<30} {evaluation.tokenizer}")
    for name, value in metrics.items():
        print(f"  {name:<30} {value:.4f}" if isinstance(value, float) else f"  {name:<30} {value}")
    if metrics.get("attention_correctness_chance", 0) > 0:  # COCO: masks outside the centre square have none
        ratio = metrics["attention_correctness"] / metrics["attention_correctness_chance"]
        print(f"  {'attention / chance':<30} {ratio:.2f}x")
    written = write_evaluation(evaluation, checkpoint=" + ".join(checkpoints), split=args.split, out=args.out,
                               results=args.results)
    if "metrics" in written:
        print(f"metrics: {written['metrics']}")
    if "captions" in written:
        print(f"captions (COCO results format): {written['captions']}")
    return 0


def eval_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eval.py", description="Score a checkpoint's captions on a split.")
    _add_eval_arguments(parser)
    return _evaluate(_parse(parser, argv))


# inspect -------------------------------------------------------------------------------------------

@guarded
def _inspect(args: argparse.Namespace) -> int:
    from captioning.checkpoint import load_checkpoint
    from captioning.inspection import describe

    print("\n".join(describe(load_checkpoint(args.checkpoint), args.checkpoint)))
    return 0


@guarded
def _verify(args: argparse.Namespace) -> int:
    from captioning.train.verify import report, verify

    verification = verify(args.checkpoint, overrides=tuple(args.overrides), device=default_device(args.device),
                          tolerance=args.tolerance)
    print("\n".join(report(verification, args.checkpoint)))
    return 0 if verification.reproduces else 1


# captioning ... ------------------------------------------------------------------------------------

def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Positional values may come after options too (`caption a.jpg --checkpoint best.pt b.jpg x.y=1`,
    `train.py x.y=1 --resume z.w=2`), and after `--` even where they start with '-' (`caption a.jpg
    --json -- -b.jpg`): argparse alone takes a command's positionals in one run and leaves the rest."""
    args, extra = parser.parse_known_args(pretrained_alone(sys.argv[1:] if argv is None else argv))
    spread = "inputs" if hasattr(args, "inputs") else "overrides"
    cut = extra.index("--") if "--" in extra else len(extra)
    before, after = extra[:cut], extra[cut + 1:]
    if any(value.startswith("-") for value in before) or (extra and not hasattr(args, spread)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if before or after:
        setattr(args, spread, [*getattr(args, spread), *before, *after])
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="captioning", description="Show, Attend and Tell image captioning.")
    commands = parser.add_subparsers(dest="command", required=True)

    shapes = commands.add_parser("make-shapes", help="generate the synthetic shapes dataset")
    shapes.add_argument("--out", required=True, metavar="DIR", help="where the images, captions and split file go")
    for split in ("train", "val", "test"):
        shapes.add_argument(f"--{split}", type=whole_number(0), default=SHAPES_DEFAULT_COUNTS[split], metavar="N",
                            help=f"{split} images (default: %(default)s)")
    shapes.add_argument("--seed", type=int, default=0, help="the same seed, the same images (default: 0)")
    shapes.add_argument("--image-size", type=whole_number(1, IMAGE_SIDE), default=224, metavar="PIXELS",
                        help="side of the square images (default: 224)")
    shapes.add_argument("--train-object-weights", type=float, nargs=3, metavar=("ONE", "TWO", "THREE"),
                        help="odds of 1, 2 and 3 objects in a training image (default: even); validation and "
                             "test images are unchanged")
    shapes.add_argument("--folder", type=whole_number(3), metavar="IMAGES", help="instead, this many images (at "
                        "least 3: train, val and test) as a folder of your own photos would come: DIR/images/ and "
                        "DIR/captions.csv, no splits (docs/data.md)")
    shapes.set_defaults(run=_make_shapes)

    photos = commands.add_parser("sample-photos", help="write scikit-image's public-domain photos (astronaut, "
                                 "chelsea the cat, coffee, motorcycle, rocket) as PNG files, to caption")
    photos.add_argument("--out", required=True, metavar="DIR", help="where the PNG files go")
    photos.set_defaults(run=_sample_photos)

    add_caption_command(commands)

    inspect = commands.add_parser("inspect", help="what a checkpoint holds (config, progress, tensors), read "
                                  "without unpickling code")
    inspect.add_argument("checkpoint", metavar="FILE", help="a checkpoint (best.pt, last.pt)")
    inspect.set_defaults(run=_inspect)

    check = commands.add_parser("verify", help="score a checkpoint again as its run's validation did and say whether "
                                "its recorded numbers reproduce, and if not, what differs from its record")
    check.add_argument("checkpoint", metavar="FILE", help="best.pt (last.pt only where it was saved at a validation)")
    check.add_argument("overrides", nargs="*", metavar="key.sub=value", help="e.g. data.root=/data/coco")
    check.add_argument("--tolerance", type=tolerance, default=1e-4, help="largest difference that reproduces (1e-4)")
    check.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    add_quiet_argument(check)
    check.set_defaults(run=_verify)

    prepare = commands.add_parser("prepare", help="the vocabulary of the training split -> TRAIN.OUT_DIR/vocab.json")
    _add_config_arguments(prepare)
    prepare.set_defaults(run=_prepare)

    features = commands.add_parser("prepare-features",
                                    help="cache the frozen encoder's fp16 annotations of each split (resumable)")
    _add_config_arguments(features)
    features.add_argument("--splits", help="comma-separated (default: train,val,test, or train,val where the data "
                          "holds no test split)")
    features.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    features.set_defaults(run=_prepare_features)

    train = commands.add_parser("train", help="the same as train.py")
    _add_train_arguments(train)
    train.set_defaults(run=_train)

    evaluate = commands.add_parser("evaluate", help="the same as eval.py")
    _add_eval_arguments(evaluate)
    evaluate.set_defaults(run=_evaluate)

    args = _parse(parser, argv)
    try:
        return args.run(args)
    except BrokenPipeError:  # `captioning caption photos/ | head`: the reader has gone; so do we, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
