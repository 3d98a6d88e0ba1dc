"""`captioning caption`: image files, folders and glob patterns captioned in batches, in order, with
per-word attention overlays and a page to browse them; a file that cannot be read is one line on
stderr and the others are still captioned (exit code 1)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from captioning.cli.common import add_hard_choice_argument, add_quiet_argument, expected_errors
from captioning.config import ConfigError
from captioning.progress import quiet


def add_caption_command(commands: argparse._SubParsersAction) -> None:
    caption = commands.add_parser(
        "caption", help="caption images, optionally with per-word attention overlays and a page to browse them",
        description="Caption image files, folders and glob patterns, in batches, in the order given. A file "
                    "that cannot be read gets one line on stderr and the others are captioned (exit code 1).")
    caption.add_argument("inputs", nargs="*", metavar="IMAGE|FOLDER|GLOB|key.sub=value",
                         help="images, folders of images, glob patterns ('photos/*.jpg'); and overrides of what "
                              "inference may change: encoder.weights_path, decode.*")
    caption.add_argument("--list", metavar="FILE", help="also the images in FILE, one path per line")
    caption.add_argument("--recursive", "-r", action="store_true", help="folders: their sub-folders too")
    caption.add_argument("--checkpoint", metavar="FILE", action="append", help="best.pt or last.pt of a run "
                         "(default: the model that ships with the package, soft attention trained on Flickr8k's "
                         "photos); given more than once, the checkpoints caption together as one ensemble")
    caption.add_argument("--beam-size", type=int, help="default: the checkpoint config's decode.beam_size")
    add_hard_choice_argument(caption)
    caption.add_argument("--batch-size", type=int, default=16, help="images encoded and decoded at once (16)")
    caption.add_argument("--workers", type=int, help="processes reading the images (default: one per four cores "
                         "up to 4, none on four cores or fewer or for a single batch)")
    caption.add_argument("--overlays", metavar="DIR", help="write DIR/<image>/ (a JPEG per word, grid.jpg, "
                         "image.jpg) and DIR/index.html to browse them (hard attention with argmax or sample: "
                         "the chosen cell outlined over each map)")
    caption.add_argument("--gif", action="store_true", help="with --overlays: also DIR/<image>/words.gif, a "
                         "frame per word")
    caption.add_argument("--json", action="store_true", help="one JSON object per line (image, caption, tokens, "
                         "and image_id where the file name carries a COCO id)")
    caption.add_argument("--coco-results", metavar="FILE", help="write [{image_id, caption}] for the COCO "
                         "evaluation server (images whose name carries a COCO id)")
    caption.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    add_quiet_argument(caption)
    caption.set_defaults(run=_caption)


def split_overrides(values: Sequence[str]) -> tuple[list[str], list[str]]:
    """IMAGE and key.sub=value arguments share the command line: an override is a dotted key with
    `=` that is not also an existing file."""
    images, overrides = [], []
    for value in values:
        is_override = "=" in value and "." in value.split("=", 1)[0] and not Path(value).exists()
        (overrides if is_override else images).append(value)
    return images, overrides


def _caption(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from captioning.api import Captioner, Unreadable, empty_folders, find_images, read_list, reading_workers
    from captioning.eval.page import OverlayFolder
    from captioning.runtime.hardware import default_device

    if args.quiet:
        quiet()
    given, overrides = split_overrides(args.inputs)
    try:
        inputs = [*given, *(read_list(args.list) if args.list else [])]
        paths = find_images(inputs, recursive=args.recursive)
        empty = empty_folders(inputs, recursive=args.recursive)
        device = default_device(args.device)
        captioner = (Captioner.from_checkpoint(args.checkpoint, device=device, overrides=overrides) if args.checkpoint
                     else Captioner.from_pretrained(device=device, overrides=overrides))
    except expected_errors() as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for folder in empty:  # a folder with nothing to caption is a bad input like any other: one line
        print(f"error: {folder}", file=sys.stderr)
    if not paths:
        if not empty:
            print("error: no images given (files, folders, glob patterns or --list FILE)", file=sys.stderr)
        return 2
    workers = args.workers if args.workers is not None else (0 if len(paths) <= args.batch_size else
                                                             reading_workers())
    try:
        stream = captioner.caption_files(paths, batch_size=args.batch_size, num_workers=workers,
                                         progress=None if sys.stderr.isatty() or len(paths) > 8 else False,
                                         beam_size=args.beam_size, hard_choice=args.hard_choice)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    overlays = OverlayFolder(Path(args.overlays), animation=args.gif) if args.overlays else None
    failures, captioned, results = len(empty), 0, []
    try:
        for result in stream:
            if isinstance(result, Unreadable):
                failures += 1
                tqdm.write(f"error: {result.error}", file=sys.stderr)
                continue
            captioned += 1
            print(json.dumps(result.to_json()) if args.json else f"{result.source}\t{result.caption}", flush=True)
            if overlays is not None:
                try:
                    overlays.add(result)
                except (OSError, ValueError, RuntimeError) as error:  # e.g. the file changed since it was read
                    failures += 1
                    message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                    tqdm.write(f"error: {result.source}: overlays not written ({message})", file=sys.stderr)
            if args.coco_results:
                results.append(result)
    except KeyboardInterrupt:
        print(f"interrupted after {captioned} of {len(paths)} images", file=sys.stderr)
        return 130
    finally:
        if overlays is not None:
            overlays.finish()
    if args.coco_results:
        _write_coco_results(results, args.coco_results)
    return 1 if failures else 0


def _write_coco_results(results: list, path: str) -> None:
    """[{image_id, caption}], what the COCO evaluation server takes; images without an id in their
    name are left out, and said so."""
    records = [{"image_id": r.image_id, "caption": r.caption} for r in results if r.image_id is not None]
    left_out = [r.source for r in results if r.image_id is None]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(records))
    if left_out:
        print(f"note: {len(left_out)} images left out of {path}: their names carry no COCO image id "
              f"(e.g. {left_out[0]})", file=sys.stderr)
