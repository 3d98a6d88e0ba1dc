"""What `captioning prepare` says of a folder collection (data.dataset=folder, formats/folder.py) and
writes of it: what it found wrong, one line each with a count and the first few names (`check`),
the splits the seed made (`describe_made`), each split's images (`split_counts`) and the run's copy
of every image's split (`write_splits`). They are the folder format's extras (data.records.format_extra):
its reader carries `prepare_report` and `beside_vocabulary`, so no command asks for the format by name."""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from PIL import Image, UnidentifiedImageError

from captioning.config import Config
from captioning.data.formats.folder import (
    Collection,
    ImageKeys,
    Row,
    folder_collection,
    image_count,
    read_folder,
)
from captioning.data.images import is_image_file
from captioning.data.records import SPLITS, first_names


def check(collection: Collection, *, max_bad_images: float, readable: bool = True) -> list[str]:
    """What `captioning prepare` tells the user of the collection, one line each with a count and the
    first few names: images listed but missing or unreadable, images in the folder with no caption,
    empty captions dropped, and the splits made by the seed. `readable` opens each listed image's
    header (a file that is there but not an image)."""
    findings = []
    left_out = f"training leaves them out, and stops if a split has more than data.max_bad_images={max_bad_images:g}"
    missing, unreadable = [], []
    for image in collection.images:
        path = collection.image_root / image
        if not path.is_file():
            missing.append(image)
        elif readable and not _opens(path):
            unreadable.append(image)
    where = collection.image_root
    if missing:
        findings.append(f"{len(missing)} of {image_count(len(collection.images))} listed in "
                        f"{collection.captions_file.name} are not in {where} ({first_names(missing)}); {left_out}")
    if unreadable:
        findings.append(f"{image_count(len(unreadable))} cannot be read as images ({first_names(unreadable)}); "
                        f"{left_out}")
    unlisted = _unlisted(collection)
    if unlisted:
        findings.append(f"{image_count(len(unlisted))} in {where} with no caption in "
                        f"{collection.captions_file.name}, not used ({first_names(unlisted)})")
    if collection.empty_captions:
        lines = collection.empty_captions
        plural = "s" if len(lines) > 1 else ""
        findings.append(f"{len(lines)} empty caption{plural} dropped ({collection.captions_file.name} "
                        f"line{plural} {first_names([str(n) for n in lines])})")
    name = collection.captions_file.name
    for lines, what in ((collection.wordless_captions, "with no word once tokenized dropped"),
                        (collection.duplicate_rows, "repeating an earlier row's image and caption, kept (each "
                                                    "counts in training and as a reference)")):
        if lines:
            plural = "s" if len(lines) > 1 else ""
            findings.append(f"{len(lines)} caption{plural} {what} ({name} line{plural} "
                            f"{first_names([str(n) for n in lines])})")
    if collection.moved_by_rows:
        moved = [f"{image}: {was} -> {now}" for image, (was, now) in collection.moved_by_rows.items()]
        findings.append(f"{image_count(len(moved))} the splits record kept elsewhere now in the split their rows give "
                        f"({first_names(moved)}); an image trained on may now be tested on ({collection.record})")
    findings += _recalled_lines(collection)
    uncaptioned = [image for image in collection.images if not collection.captions[image]]
    if uncaptioned:
        findings.append(f"{image_count(len(uncaptioned))} with only empty captions, not used "
                        f"({first_names(uncaptioned)})")
    return findings


def _recalled_lines(collection: Collection) -> list[str]:
    """What the splits record knew of images under other names: moved, renamed or copied photos that
    keep their split, another record whose splits were taken, and recorded images gone while new ones
    came (edited photos look so: a model may then be tested on what an older run trained on)."""
    lines = []
    if collection.adopted is not None:
        other, count = collection.adopted
        lines.append(f"{image_count(count)} of this data found in the splits record {other} (the data's own, or "
                     f"this data's before it moved) keep the splits placed there; this data's record is now "
                     f"{collection.record}")
    moved = [f"{image} (was {old})" for image, old in collection.moved_by_contents.items()
             if image not in collection.copies]  # a copy is said below, with the photo it repeats
    if moved:
        lines.append(f"{image_count(len(moved))} moved, renamed or copied since the splits record placed them keep "
                     f"their split, known by their contents ({first_names(moved)})")
    if collection.replaced:
        lines.append(f"{image_count(len(collection.replaced))} under the names the splits record placed them by hold "
                     f"other contents, that no image had, and keep their split as the same photos edited "
                     f"({first_names(collection.replaced)})")
    if collection.copies:
        copies = [f"{image} = {original}" for image, original in collection.copies.items()]
        lines.append(f"{image_count(len(copies))} repeat the contents of another under another name, and share its "
                     f"split ({first_names(copies)})")
    if collection.rejoined:
        rejoined = [f"{image}: {was} -> {now}" for image, (was, now) in collection.rejoined.items()]
        lines.append(f"{image_count(len(rejoined))} the splits record kept apart from a copy of theirs now share its "
                     f"split ({first_names(rejoined)}); scores taken on the older splits held photos trained on "
                     f"({collection.record})")
    if collection.gone and collection.appeared:
        lines.append(f"{image_count(len(collection.gone))} of the splits record no longer in "
                     f"{collection.captions_file.name} ({first_names(collection.gone)}) while "
                     f"{image_count(len(collection.appeared))} with contents the record does not know appeared "
                     f"({first_names(collection.appeared)}): those were placed as new photos; if they are the old "
                     "ones edited (resized, re-encoded), a model may be tested on what an older run trained on")
    return lines


def _opens(path: Path) -> bool:
    try:
        with Image.open(path) as image:
            image.verify()  # the header and, for most formats, the structure; no full decode
        return True
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError):
        return False


def _unlisted(collection: Collection) -> list[str]:
    """The images in the folder that no row names, by the file each one is: a link to a captioned image
    is that image (rows are keyed by the file they name, ImageKeys), not an image without a caption."""
    if not collection.image_root.is_dir():
        return []
    listed = set(collection.images)
    keys = ImageKeys(collection.image_root, source=collection.captions_file, allow_outside=True)
    found = sorted(str(path.relative_to(collection.image_root)) for path in collection.image_root.rglob("*")
                   if is_image_file(path))
    return [name for name in found if keys.key(Row(line=0, image=name, caption="", split="")) not in listed]


def write_splits(collection: Collection, path: str | Path) -> Path:
    """Every image's split as CSV (image,split), made ones included: the splits written down."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["image", "split"])
        writer.writerows([image, collection.splits[image]] for image in collection.images)
    return path


def split_counts(collection: Collection) -> dict[str, int]:
    counted = {split: 0 for split in SPLITS}
    for image in collection.images:
        if collection.captions[image]:
            counted[collection.splits[image]] += 1
    return counted


def describe_made(collection: Collection, *, seed: int, share: float) -> Iterable[str]:
    """A line for each split the seed made or filled."""
    for split in ("val", "test", "train"):  # what the seed chose, then where the rest went
        chosen = collection.made.get(split, [])
        if not chosen:
            continue
        if split == "train":
            yield f"{image_count(len(chosen))} without a split go to train ({first_names(chosen)})"
        else:
            yield (f"no row names a {split} split: made it of {image_count(len(chosen))} with "
                   f"data.folder.split_seed={seed} (about data.folder.split_share={share:g} of them; "
                   f"{first_names(chosen)})")


def splits_path(config: Config) -> Path:
    """The run's copy of every image's split, beside its vocabulary."""
    return Path(config.train.out_dir) / "splits.csv"


def prepare_report(config: Config) -> list[str]:
    """What `captioning prepare` says of a folder of your own images before its vocabulary: what is
    wrong with the collection and which splits the seed made, a line each, then the split counts."""
    collection = folder_collection(config.data)
    lines = check(collection, max_bad_images=config.data.max_bad_images)
    lines += describe_made(collection, seed=config.data.folder.split_seed, share=config.data.folder.split_share)
    counts = split_counts(collection)
    lines.append(f"{sum(counts.values())} captioned images: " + ", ".join(f"{n} {s}" for s, n in counts.items())
                 + f"; splits kept in {collection.record}, a copy in {splits_path(config)}")
    return lines


def beside_vocabulary(config: Config) -> None:
    """The splits written down beside the vocabulary, made ones included."""
    write_splits(folder_collection(config.data), splits_path(config))


read_folder.prepare_report = prepare_report
read_folder.beside_vocabulary = beside_vocabulary
