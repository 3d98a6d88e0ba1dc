"""What knowing each image by its contents costs (captioning/data/images.py): hashing image files
the first time a collection is read, and the stat that spares the hashing every later time.

    python benchmarks/content_digest.py --images 4000 --kilobytes 154 --folder /tmp

writes IMAGES files of about KILOBYTES each (COCO's 123 287 images hold 19 GB: 154 KB on average;
their bytes are random, which costs SHA-256 what a JPEG's do) under a temporary folder in FOLDER,
then times, with the files in the page cache, (1) hashing them all as a new collection's first read
does, and (2) reading them again as the splits record does for a collection whose files are as
recorded (a stat each, no hashing), and prints both with their extrapolation to COCO. A first read
from a disk that does not hold the files in its cache is bounded by the disk, not by the hash: 19 GB
at the disk's read speed.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

from captioning.data.images import file_digest, file_stat

COCO_IMAGES = 123_287
COCO_BYTES = 19e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4000, help="files to write and hash (default 4000)")
    parser.add_argument("--kilobytes", type=float, default=154, help="their mean size (default 154, COCO's)")
    parser.add_argument("--folder", default=None, help="where the temporary folder goes (default: the system's)")
    args = parser.parse_args()
    rng = random.Random(0)
    folder = Path(tempfile.mkdtemp(prefix="digest-", dir=args.folder))
    try:
        paths = []
        for index in range(args.images):  # sizes spread as photos' are: half to one and a half times the mean
            path = folder / f"{index:06d}.jpg"
            path.write_bytes(os.urandom(int(args.kilobytes * 1000 * rng.uniform(0.5, 1.5))))
            paths.append(path)
        total = sum(path.stat().st_size for path in paths)
        for path in paths:  # into the page cache, as the timing below assumes
            path.read_bytes()
        start = time.perf_counter()
        for path in paths:
            file_digest(path)
        hashing = time.perf_counter() - start
        start = time.perf_counter()
        for path in paths:
            file_stat(path)
        stating = time.perf_counter() - start
    finally:
        shutil.rmtree(folder)
    speed = total / hashing
    print(f"{args.images} files, {total / 1e9:.2f} GB: hashed in {hashing:.2f} s ({speed / 1e6:.0f} MB/s, "
          f"{args.images / hashing:.0f} images/s); a stat each in {stating:.3f} s")
    print(f"COCO ({COCO_IMAGES} images, {COCO_BYTES / 1e9:.0f} GB): first read {COCO_BYTES / speed:.0f} s of hashing "
          f"with the files in memory (else the disk's time to read 19 GB); every later read "
          f"{stating * COCO_IMAGES / args.images:.1f} s of stat")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
