"""What the feature cache's self-checks cost on a large cache (captioning.data.features).

    python benchmarks/cache_check.py [--gigabytes 4] [--images 20000] [--folder /tmp]

Writes a synthetic finished cache of --gigabytes (rows of 196 x 512 fp16, like VGG-19 conv5_4 at
224²) with its checksums and --images small image files, then times: the checksums a finished
build computes (every block), the check on each open (file size and a sample of blocks), and the
stat of every image that finds changed ones. The open check runs with the file in the page cache
(warm) and, where the system lets us drop it, cold.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from captioning.data import features
from captioning.data.records import ImageRecord


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gigabytes", type=float, default=4.0)
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--folder", default=tempfile.gettempdir())
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.folder) as folder:
        directory = Path(folder)
        rows = int(args.gigabytes * 2**30 / (196 * 512 * 2))
        array = np.lib.format.open_memmap(directory / "train.npy", mode="w+", dtype=np.float16, shape=(rows, 196, 512))
        for start in range(0, rows, 1024):
            array[start:start + 1024] = np.float16(start % 7)
        array.flush()
        start = time.perf_counter()
        digests = [d for _, d in sorted(features._digests(array).items())]
        full = time.perf_counter() - start
        del array
        records = []
        for i in range(args.images):
            path = directory / f"{i:06d}.jpg"
            path.write_bytes(b"x" * 100)
            records.append(ImageRecord(image_id=i, path=path, captions=("a",)))
        records = records + [ImageRecord(image_id=args.images + i, path=directory / "none.jpg", captions=("a",))
                             for i in range(rows - len(records))] if rows > len(records) else records[:rows]
        meta = {"image_ids": [r.image_id for r in records], "grid": [14, 14], "unreadable": [],
                "shape": [rows, 196, 512], "stats": features._stats(records), "digests": digests}
        (directory / "train.json").write_text(json.dumps(meta))
        timings = {}
        for label in ("warm", "cold"):
            if label == "cold":
                dropped = subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], capture_output=True)
                if dropped.returncode != 0:
                    timings["cold"] = None
                    continue
            start = time.perf_counter()
            assert features.read_cache(directory, "train", records) is not None
            timings[label] = time.perf_counter() - start
        start = time.perf_counter()
        features._stats(records[: args.images])
        stats = time.perf_counter() - start
    cold = (f"{timings['cold']:.2f} s cold" if timings.get("cold") is not None
            else "cold not measured (cannot drop the page cache)")
    print(f"cache of {args.gigabytes:g} GB ({rows} rows of 196x512 fp16, {len(digests)} blocks of "
          f"{features.BLOCK_BYTES >> 20} MB): all checksums {full:.2f} s; check on open {timings['warm']:.3f} s warm, "
          f"{cold}; stat of {args.images} images {stats:.3f} s")


if __name__ == "__main__":
    main()
