"""A COCO-sized stand-in, made here, and the time and memory of a stage at 1 000, 10 000 and 123 287 images.

    python benchmarks/scale.py write --root /tmp/scale            # the three corpora, both layouts (15 s)
    python benchmarks/scale.py prepare --root /tmp/scale          # `captioning prepare` on each
    python benchmarks/scale.py scst --root /tmp/scale             # SCST's CIDEr-D set-up and rewards (after prepare)
    python benchmarks/scale.py workers --root /tmp/scale          # a DataLoader worker's memory over an epoch
    python benchmarks/scale.py stages --root /tmp/scale           # prepare-features to caption, at each size
    python benchmarks/scale.py table --root /tmp/scale            # docs/scale.md's table of the stages
    python benchmarks/scale.py encoders                           # the real encoders' cost per image here

The corpus has COCO's Karpathy counts at full size (113 287 training images, restval included,
5 000 validation, 5 000 test; five captions each, a few with six or seven: 616 767 captions) and
the same proportions at 1 000 and 10 000 images. Captions follow COCO's length (about 10.5 words,
6 to 50) over a Zipf-like vocabulary (exponent 1.4 over 50 000 words), which leaves about COCO's
10 000 words seen at least 5 times at full size. It is written in Karpathy's JSON and as the
official captions_train2014.json / captions_val2014.json. Every image file is a link to one small
JPEG: the stages measured here read, resize and cache images, and the encoder's own cost per image
is measured apart (`encoders`; `stages` runs a stand-in of VGG-19's output shape, probes/scale_stage.py).
Each stage runs as its own process: wall time and memory, with the exponent of the growth from
10 000 to 123 287 images (1 is linear).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
FULL = {"train": 82_783, "restval": 30_504, "val": 5_000, "test": 5_000}  # 123 287 images
SIZES = {"1k": 1_000, "10k": 10_000, "full": sum(FULL.values())}
WORDS, EXPONENT = 50_000, 1.4
CONFIG = "configs/coco_vgg19_soft.yaml"  # the paper's setup: VGG-19 at 224², soft attention
STEPS = 20  # training steps timed in the first run; the resumed run times 3 more


def split_counts(images: int) -> dict[str, int]:
    """Karpathy's split of `images` images, in COCO's proportions (COCO's own counts at full size)."""
    total = sum(FULL.values())
    counts = {name: count * images // total for name, count in FULL.items()}
    counts["train"] += images - sum(counts.values())
    return counts


def write(root: Path, images: int, *, seed: int = 0) -> None:
    """ROOT/dataset_coco.json (Karpathy's layout), ROOT/annotations/captions_{train,val}2014.json (the
    official one: train2014 holds Karpathy's train, val2014 his restval, val and test, as in COCO) and
    ROOT/{train2014,val2014}/COCO_*.jpg, each a link to one small JPEG."""
    rng = np.random.default_rng(seed)
    probabilities = 1.0 / np.arange(1, WORDS + 1) ** EXPONENT
    probabilities /= probabilities.sum()
    extra = rng.random(images)  # six captions for about 0.27% of the images, seven for a few (COCO: 616 767)
    per_image = 5 + (extra < 0.0027) + (extra < 0.0001)
    lengths = np.clip(np.rint(rng.normal(10.5, 2.4, size=int(per_image.sum()))), 6, 50).astype(int)
    words = rng.choice(WORDS, size=int(lengths.sum()), p=probabilities)
    ends = np.cumsum(lengths)
    sentences = [" ".join(f"w{w}" for w in words[end - n:end]) for end, n in zip(ends, lengths)]
    source = root / "blank.jpg"
    root.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (64, 48), (120, 110, 100)).save(source, quality=90)
    entries, caption = [], 0
    official: dict[str, dict[str, list]] = {folder: {"images": [], "annotations": []}
                                           for folder in ("train2014", "val2014")}
    splits = [name for name, count in split_counts(images).items() for _ in range(count)]
    for cocoid, (split, count) in enumerate(zip(splits, per_image.tolist())):
        folder = "train2014" if split == "train" else "val2014"
        name = f"COCO_{folder}_{cocoid:012d}.jpg"
        (root / folder).mkdir(exist_ok=True)
        target = root / folder / name
        if not target.is_symlink():
            target.symlink_to(source)
        mine = sentences[caption:caption + count]
        entries.append({"filepath": folder, "filename": name, "cocoid": cocoid, "split": split,
                        "sentences": [{"raw": s} for s in mine]})
        official[folder]["images"].append({"id": cocoid, "file_name": name, "width": 64, "height": 48})
        official[folder]["annotations"] += [{"id": caption + i, "image_id": cocoid, "caption": s}
                                            for i, s in enumerate(mine)]
        caption += count
    (root / "dataset_coco.json").write_text(json.dumps({"dataset": "coco", "images": entries}))
    (root / "annotations").mkdir(exist_ok=True)
    for folder, content in official.items():
        (root / "annotations" / f"captions_{folder}.json").write_text(json.dumps(content))


def timed(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak resident GB, what it printed) of a child process; the peak is the child's
    own (its rusage, from wait4), not the largest of all children so far."""
    import tempfile

    start = time.perf_counter()
    with tempfile.TemporaryFile(mode="w+") as out:
        child = subprocess.Popen(command, cwd=REPO, stdout=out)
        _, status, usage = os.wait4(child.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise subprocess.CalledProcessError(os.waitstatus_to_exitcode(status), command)
        out.seek(0)
        return time.perf_counter() - start, usage.ru_maxrss / 1e6, out.read()  # kB -> GB


def prepare(root: Path) -> None:
    """`captioning prepare` on each size, from Karpathy's JSON and from the official captions files."""
    import shutil

    # Karpathy's last: its tokens stay for the stages that read them (scst, workers, stages' train)
    for layout, extra in (("official", ["data.dataset=coco_official"]), ("karpathy", [])):
        rows = {}
        for label, images in SIZES.items():
            data, out = root / label, root / "runs" / (label if layout == "karpathy" else f"{label}-{layout}")
            shutil.rmtree(data / "tokens", ignore_errors=True)  # a first prepare: nothing tokenized yet
            rows[label] = timed([sys.executable, "-m", "captioning.cli", "prepare", "--config", CONFIG,
                                 f"data.root={data}", f"train.out_dir={out}", *extra, "--quiet"])[:2]
            vocab = len(json.loads((out / "vocab.json").read_text()))
            print(f"{layout} {label:>5} ({images:,} images): {rows[label][0]:.1f} s, peak {rows[label][1]:.2f} GB, "
                  f"vocabulary {vocab:,}", flush=True)
        growth = math.log(SIZES["full"] / SIZES["10k"])
        print(f"{layout} growth 10k -> full: time x^{math.log(rows['full'][0] / rows['10k'][0]) / growth:.2f}, "
              f"memory x^{math.log(rows['full'][1] / rows['10k'][1]) / growth:.2f}", flush=True)


def scst_child(data: Path, out: Path) -> None:
    """In its own process: SCST's reward set-up on the training split (its references' tokens, read
    from the file `captioning prepare` left, and the document frequencies of their n-grams), the
    reward of one batch (64 images x 5 samples, each image's references seen for the first time),
    then a reward for every training image once, as an epoch leaves the store of reference vectors.
    Prints the times as JSON."""
    from captioning.config import load_config
    from captioning.data.records import read_records
    from captioning.data.tokenized import tokenized, tokens_dir
    from captioning.data.vocab import Vocabulary
    from captioning.train.scst import SelfCritical

    def resident() -> float:  # GB now
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9

    config = load_config(REPO / "configs" / "coco_vgg19_scst.yaml", [f"data.root={data}"])
    records = read_records(config.data, "train")
    vocab = Vocabulary.load(out / "vocab.json")
    before = resident()
    start = time.perf_counter()
    references = tokenized(records, cache=tokens_dir(config.data), language=config.data.language)
    critic = SelfCritical(config.train.scst, references=references, vocab=vocab, max_length=config.decode.max_length)
    setup, after_setup = time.perf_counter() - start, resident()
    candidates = [references.caption(int(c)) for c in references.first[:-1]]  # each image's first reference
    start = time.perf_counter()
    batch = [i for i in range(64) for _ in range(5)]
    critic.cider.scores([candidates[i] for i in batch], batch)
    one_batch = time.perf_counter() - start
    start = time.perf_counter()
    for first in range(0, len(records), 64):  # a batch of images a step, as training calls it
        rows = list(range(first, min(first + 64, len(records))))
        critic.cider.scores([candidates[i] for i in rows], rows)
    epoch = time.perf_counter() - start
    start = time.perf_counter()
    for first in range(0, min(10_000, len(records)), 64):  # the same count at every size: the store's size apart
        rows = list(range(first, min(first + 64, 10_000, len(records))))
        critic.cider.scores([candidates[i] for i in rows], rows)
    first_10k = time.perf_counter() - start
    print(json.dumps({"setup_s": setup, "batch_s": one_batch, "every_image_s": epoch, "first_10k_s": first_10k,
                      "store_after_setup_gb": after_setup - before, "store_after_epoch_gb": resident() - before}))


def scst(root: Path) -> None:
    rows = {}
    for label, images in SIZES.items():
        command = [sys.executable, str(Path(__file__).resolve()), "scst-child", "--root", str(root / label),
                   "--out", str(root / "runs" / label)]
        wall, peak, printed = timed(command)
        times = json.loads(printed.strip().splitlines()[-1])
        rows[label] = (times["setup_s"], peak)
        print(f"{label:>5} ({images:,} images): set-up {times['setup_s']:.1f} s, one batch of 64 x 5 rewards "
              f"{times['batch_s']:.2f} s, every image once {times['every_image_s']:.1f} s (the first "
              f"{min(images, 10_000):,}: {times['first_10k_s']:.1f} s); reward store "
              f"{times['store_after_setup_gb']:.2f} GB after set-up, {times['store_after_epoch_gb']:.2f} GB after "
              f"every image; process {wall:.1f} s, peak {peak:.2f} GB", flush=True)
    growth = math.log(SIZES["full"] / SIZES["10k"])
    print(f"growth 10k -> full: set-up x^{math.log(rows['full'][0] / rows['10k'][0]) / growth:.2f}, "
          f"memory x^{math.log(rows['full'][1] / rows['10k'][1]) / growth:.2f}")


def probe(stage: str, argv: list[str]) -> tuple[float, dict]:
    """(wall seconds, what benchmarks/probes/scale_stage.py measured) of one stage in its own process."""
    start = time.time()
    script = REPO / "benchmarks" / "probes" / "scale_stage.py"
    done = subprocess.run([sys.executable, str(script), stage, repr(start), "--", *argv], cwd=REPO, capture_output=True,
                          text=True)
    if done.returncode != 0:
        sys.exit(f"{stage} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return time.time() - start, json.loads(done.stdout.strip().splitlines()[-1])


PARTS = ("features", "cold_start", "train", "resume", "eval", "caption")


def stages(root: Path, labels: list[str], only: set[str] | None = None) -> None:
    """prepare-features, training's start-up and steps, a mid-epoch resume, validation, eval.py on the
    test split and `captioning caption` on its files, at each size: one JSON line each, kept in
    ROOT/stages.json. `only`: these parts (PARTS) again, the others' numbers kept; resume, eval and
    caption read the run the train part made."""
    import shutil

    path = root / "stages.json"
    rows: dict[str, dict] = json.loads(path.read_text()) if path.exists() else {}
    for label in labels:
        data, out = root / label, root / "runs" / label / "train"
        common = ["--config", CONFIG, f"data.root={data}", f"train.out_dir={out}", "--quiet"]
        row = rows.setdefault(label, {"images": SIZES[label]})

        def want(part: str) -> bool:
            return only is None or part in only

        if want("features"):
            shutil.rmtree(data / "features", ignore_errors=True)
            wall, features = probe("features", ["prepare-features", *common, "--device", "cpu"])
            row["features"] = {"wall_s": wall, "peak_rss_gb": features["peak_rss_gb"],
                               "anon_gb": features["anon_gb"],
                               "cache_gb": sum(f.stat().st_size for f in (data / "features").rglob("*.npy")) / 1e9}
            print(json.dumps({label: {"features": row["features"]}}), flush=True)
        training = [*common, "--device", "cpu", "train.epochs=1", f"train.save_every_steps={STEPS // 2}"]
        if want("cold_start"):  # a first start ever: the captions not tokenized yet (its own run folder)
            shutil.rmtree(data / "tokens", ignore_errors=True)
            shutil.rmtree(out.with_name("cold"), ignore_errors=True)
            wall, cold = probe("first-steps", ["train", *training, f"train.out_dir={out.with_name('cold')}",
                                               f"train.max_steps={STEPS}"])
            row["cold_start"] = {"first_step_s": cold["steps"][0][1] - cold["started"], "anon_gb": cold["anon_gb"]}
            print(json.dumps({label: {"cold_start": row["cold_start"]}}), flush=True)
        if want("train"):  # with the tokens kept (by the cold start here, by `captioning prepare` for a user)
            shutil.rmtree(out, ignore_errors=True)
            wall, run = probe("train", ["train", *training, f"train.max_steps={STEPS}"])
            steps = [end - start for start, end in run["steps"]]
            shuffle_start, shuffle_end = run["shuffles"][0]
            row["train"] = {
                "wall_s": wall, "first_step_s": run["steps"][0][1] - run["started"],
                "imports_s": run["imported"] - run["started"], "built_s": run["built"] - run["started"],
                "step_s": sorted(steps[1:])[len(steps[1:]) // 2], "first_step_only_s": steps[0],
                "shuffle_s": shuffle_end - shuffle_start, "loader_start_s": run["first_batch"] - shuffle_end,
                "validation_s": run["validations"][-1], "save_s": max(run["saves"]),
                "anon_gb": run["anon_gb"], "worker_gb": run["worker_gb"],
                "worker_batches_gb": run["worker_batches_gb"], "peak_rss_gb": run["peak_rss_gb"]}
            print(json.dumps({label: {"train": row["train"]}}), flush=True)
        if want("resume"):
            wall, resumed = probe("resume", ["train", *training, f"train.max_steps={STEPS * 2}", "--resume"])
            row["resume"] = {"first_step_s": resumed["steps"][0][1] - resumed["started"],
                             "step_s": sorted(end - start for start, end in resumed["steps"][1:])[0],
                             "anon_gb": resumed["anon_gb"], "worker_gb": resumed["worker_gb"]}
            print(json.dumps({label: {"resume": row["resume"]}}), flush=True)
        if want("eval"):
            wall, evaluation = probe("eval", ["evaluate", "--checkpoint", str(out / "last.pt"), "--split", "test",
                                              "--device", "cpu", "--out", str(out / "metrics_test.json"), "--quiet"])
            row["eval"] = {"wall_s": wall, "peak_rss_gb": evaluation["peak_rss_gb"], "anon_gb": evaluation["anon_gb"]}
            print(json.dumps({label: {"eval": row["eval"]}}), flush=True)
        if want("caption"):
            entries = json.loads((data / "dataset_coco.json").read_text())["images"]
            listing = out / "test_images.txt"
            listing.write_text("".join(f"{data / e['filepath'] / e['filename']}\n" for e in entries
                                       if e["split"] == "test"))
            wall, captioned = probe("caption", ["caption", "--list", str(listing), "--checkpoint",
                                                str(out / "last.pt"), "--device", "cpu", "--quiet", "--json"])
            row["caption"] = {"wall_s": wall, "files": len(listing.read_text().splitlines()),
                              "peak_rss_gb": captioned["peak_rss_gb"], "anon_gb": captioned["anon_gb"]}
            print(json.dumps({label: {"caption": row["caption"]}}), flush=True)
        path.write_text(json.dumps(rows, indent=1))  # after each size


def table(root: Path) -> None:
    """The stages' table of docs/scale.md, from ROOT/stages.json (what `stages` measured)."""
    rows = json.loads((root / "stages.json").read_text())
    labels = [label for label in SIZES if label in rows]

    def cells(read) -> str:
        values = [read(rows[label]) for label in labels]
        growth = ""
        if {"10k", "full"} <= set(labels):
            small, large = values[labels.index("10k")], values[labels.index("full")]
            growth = f"x^{math.log(large / small) / math.log(SIZES['full'] / SIZES['10k']):.2f}"
        return " | ".join(f"{value:.2f}" if value < 10 else f"{value:.0f}" for value in values) + f" | {growth}"

    lines = [
        ("prepare-features (stand-in encoder), s", lambda r: r["features"]["wall_s"]),
        ("  its own memory, GB", lambda r: r["features"]["anon_gb"]["features"]),
        ("first start, captions not yet tokenized: to the first step, s", lambda r: r["cold_start"]["first_step_s"]),
        ("start after `prepare`: to the first step, s", lambda r: r["train"]["first_step_s"]),
        ("  of which interpreter and imports, s", lambda r: r["train"]["imports_s"]),
        ("training step (median of 19), s", lambda r: r["train"]["step_s"]),
        ("an epoch's shuffle and bucketing, s", lambda r: r["train"]["shuffle_s"]),
        ("an epoch's loader start, to its first batch, s", lambda r: r["train"]["loader_start_s"]),
        ("checkpoint save, s", lambda r: r["train"]["save_s"]),
        ("mid-epoch resume: to the first step, s", lambda r: r["resume"]["first_step_s"]),
        ("training process's own memory, peak, GB", lambda r: max(r["train"]["anon_gb"].values())),
        ("a DataLoader worker's own memory, peak, GB", lambda r: r["train"]["worker_gb"]),
        ("validation (greedy, the val split), s", lambda r: r["train"]["validation_s"]),
        ("  the process's own memory meanwhile, peak, GB", lambda r: r["train"]["anon_gb"]["validation"]),
        ("eval.py (beam 3, the test split, Java metrics), s", lambda r: r["eval"]["wall_s"]),
        ("  its own memory, GB", lambda r: r["eval"]["anon_gb"]["eval"]),
        ("`captioning caption` on the test split's files, s", lambda r: r["caption"]["wall_s"]),
        ("  its own memory, GB", lambda r: r["caption"]["anon_gb"]["caption"]),
    ]
    print("| stage | " + " | ".join(f"{SIZES[label]:,} images" for label in labels) + " | 10k -> full |")
    print("|---" * (len(labels) + 2) + "|")
    for name, read in lines:
        print(f"| {name} | {cells(read)} |")


def workers(root: Path) -> None:
    """What a DataLoader worker comes to hold of its own over an epoch at full size: one worker,
    forked from a process that holds the training pairs, reads every pair once (an epoch's share
    with one worker; annotations of one cell, so that only the pairs are read), and reports its
    private anonymous memory as it goes. The pairs as arrays (how training holds them), and as the
    Python list of (image, ids) pairs that training held before."""
    import numpy as np
    from probes.scale_stage import _private_kb  # under this file's folder
    from torch.utils.data import DataLoader

    from captioning.config import load_config
    from captioning.data.dataset import CaptionPairs
    from captioning.data.records import read_records
    from captioning.data.tokenized import tokenized, tokens_dir
    from captioning.data.vocab import Vocabulary

    class ListedPairs(CaptionPairs):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.listed = [CaptionPairs.pair(self, i) for i in range(len(self))]

        def pair(self, index: int) -> tuple[int, list[int]]:
            return self.listed[index]

    def own_memory(items: list) -> tuple[int, int]:  # runs in the worker
        return len(items), _private_kb(os.getpid())[0]

    data = root / "full"
    config = load_config(REPO / CONFIG, [f"data.root={data}"])
    records = read_records(config.data, "train")
    captions = tokenized(records, cache=tokens_dir(config.data), language=config.data.language)
    vocab = Vocabulary.load(root / "runs" / "full" / "vocab.json")
    cells = np.zeros((len(records), 1, 1), dtype=np.float16)
    for name, kind in (("arrays", CaptionPairs), ("a list of pairs", ListedPairs)):
        pairs = kind(cells, captions, vocab, max_length=config.data.max_caption_length)
        start, read, most = time.perf_counter(), 0, 0
        for count, kb in DataLoader(pairs, batch_size=512, num_workers=1, collate_fn=own_memory):
            read, most = read + count, max(most, kb)
        print(f"pairs as {name}: a worker read all {read:,} pairs in {time.perf_counter() - start:.0f} s and "
              f"came to hold {most / 1e6:.2f} GB of its own", flush=True)
        del pairs


def decoding(root: Path) -> None:
    """Why validation grows a little faster than its images: greedy decoding, as validation does it
    (batches of 100, beam 1), of the full-size val cache's first 405 images (the 10 000-image val
    split's count) and of all 5 000, by the decoder trained at 10 000 images (1 864 words) and by the
    one trained at full size (11 206 words). Every stand-in image is the same JPEG, so the two
    decoders read the same annotations and differ only in their vocabulary."""
    from captioning.checkpoint import load_trained
    from captioning.eval.evaluate import decode_split

    full = root / "full"
    for label in ("10k", "full"):
        trained = load_trained(root / "runs" / label / "train" / "best.pt", overrides=[f"data.root={full}"])
        split, annotations = trained.split("val")
        for images in (405, 5000):
            start = time.perf_counter()
            decode_split(trained.decoder, annotations[:images], image_ids=split.image_ids[:images],
                         vocab=trained.vocab, grid=split.grid, beam_size=1, max_length=trained.config.decode.max_length,
                         batch_size=100)
            per_image = (time.perf_counter() - start) / images
            print(f"decoder of {label} ({len(trained.vocab):,} words): {images:,} images, "
                  f"{per_image * 1000:.1f} ms an image", flush=True)


def encoders() -> None:
    """The per-image cost of each COCO config's real encoder on this machine's CPU (random weights:
    the cost does not depend on them), batches of 8, after one warm-up batch; and what that makes
    of a COCO cache built here (prepare-features measures the rest of the pipeline)."""
    import tempfile

    import torch
    import torchvision

    from captioning.config import load_config
    from captioning.model.encoder import build_encoder

    for config_name in ("coco_vgg19_soft", "coco_resnet101_soft"):
        config = load_config(REPO / "configs" / f"{config_name}.yaml", [])
        e, size = config.encoder, config.data.image_size
        with tempfile.TemporaryDirectory() as folder:  # a local weights file, as a machine offline uses
            weights = Path(folder) / f"{e.name}.pth"
            torch.save(getattr(torchvision.models, e.name)(weights=None).state_dict(), weights)
            encoder = build_encoder(name=e.name, layer=e.layer, weights_path=str(weights), padding=e.padding)
        images = torch.randn(8, 3, size, size)
        with torch.no_grad():
            encoder(images)
            start = time.perf_counter()
            for _ in range(3):
                encoder(images)
        per_image = (time.perf_counter() - start) / 24
        print(f"{config_name}: {e.name} {e.layer} at {size}², {per_image * 1000:.0f} ms an image on "
              f"{torch.get_num_threads()} threads; COCO's 123,287 images: {per_image * 123_287 / 3600:.1f} h",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stage", choices=("write", "prepare", "scst", "scst-child", "stages", "table", "workers",
                                          "encoders", "decoding"))
    parser.add_argument("--sizes", default="1k,10k,full", help="stages: which corpora (default: all three)")
    parser.add_argument("--only", help=f"stages: these parts again, comma-separated ({', '.join(PARTS)})")
    parser.add_argument("--root", type=Path, help="where the corpora are (all stages but encoders)")
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage == "write":
        for label, images in SIZES.items():
            start = time.perf_counter()
            write(args.root / label, images)
            print(f"{label}: {images:,} images in {time.perf_counter() - start:.0f} s", flush=True)
    elif args.stage == "prepare":
        prepare(args.root)
    elif args.stage == "table":
        table(args.root)
    elif args.stage == "workers":
        workers(args.root)
    elif args.stage == "encoders":
        encoders()
    elif args.stage == "decoding":
        decoding(args.root)
    elif args.stage == "stages":
        stages(args.root, args.sizes.split(","), set(args.only.split(",")) if args.only else None)
    elif args.stage == "scst":
        scst(args.root)
    else:
        scst_child(args.root, args.out)


if __name__ == "__main__":
    main()
