"""The overlay page in a real browser: headless Chromium takes a screenshot of DIR/index.html, and the
first image's first-word overlay must be in it, pixel for pixel (within JPEG decoding noise), where
the plain image is not. Run by `make browser-check`, not by the test suite (it needs Chromium).

    python tests/browser_check.py DIR [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

# Chromium as this machine's notes start it headless: no sandbox (root), no GPU, and none of the
# background connections that a closed network refuses.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--force-color-profile=srgb", "--force-device-scale-factor=1",
         "--window-size=1280,900")


def screenshot(page: Path, out: Path, chromium: str) -> Path:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={out}", page.resolve().as_uri()],
                       check=True, capture_output=True, timeout=120)
    return out


def best_match(picture: np.ndarray, template: np.ndarray) -> tuple[float, tuple[int, int]]:
    """The smallest mean absolute difference of `template` over every place in `picture`, and where."""
    from numpy.lib.stride_tricks import sliding_window_view

    height, width = template.shape[:2]
    middle = template[height // 2].astype(np.int16)  # [W, 3]: find the rows by the template's middle row
    best, where = np.inf, (0, 0)
    for y in range(picture.shape[0] - height + 1):
        windows = sliding_window_view(picture[y + height // 2].astype(np.int16), (width, 3))[:, 0]  # [X, W, 3]
        scores = np.abs(windows - middle).mean(axis=(1, 2))
        x = int(scores.argmin())
        if scores[x] < 8:
            whole = np.abs(picture[y:y + height, x:x + width].astype(np.int16) - template).mean()
            if whole < best:
                best, where = float(whole), (x, y)
    return best, where


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="where `captioning caption --overlays` wrote index.html")
    parser.add_argument("--chromium", default="chromium")
    args = parser.parse_args()
    page = args.folder / "index.html"
    first = re.search(r'<img src="([^"]+)"', page.read_text())
    if first is None:
        print(f"{page}: no image on the page", file=sys.stderr)
        return 1
    shown = args.folder / first.group(1)
    plain = shown.parent / "image.jpg"
    shot = screenshot(page, args.folder / "screenshot.png", args.chromium)
    picture = np.asarray(Image.open(shot).convert("RGB"))
    overlay = np.asarray(Image.open(shown).convert("RGB")).astype(np.int16)
    difference, (x, y) = best_match(picture, overlay)
    image = np.asarray(Image.open(plain).convert("RGB")).astype(np.int16)
    against_plain = np.abs(picture[y:y + image.shape[0], x:x + image.shape[1]].astype(np.int16) - image).mean()
    print(f"{shot}: {shown.name} found at ({x}, {y}) with mean difference {difference:.2f} (the plain image "
          f"differs there by {against_plain:.2f})")
    if not difference < 4 or not against_plain > 4 * max(difference, 1):
        print(f"{shot}: the first image's overlay is not on the page as drawn", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
