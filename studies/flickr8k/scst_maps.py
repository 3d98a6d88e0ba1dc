"""Where the maps look before and after self-critical training, on scikit-image's sample photos.

    python -m studies.flickr8k.scst_maps --out runs/flickr8k

The cross-entropy model SCST starts from (soft_side_seed1/best.pt) and the SCST run at its end
(scst_d3_loo_lr2e-4/last.pt, 240 steps) caption each sample photo as the recipe decodes (beam 3,
length penalty 1, no 2-gram twice). For each photo the captions and two numbers per model go to
RESULTS/scst_maps.json: the mean entropy of a word's map (nats; log 49 = 3.89 is a uniform 7x7
map) and the mean weight of a map's largest cell. One photo's maps, one row of words per model,
go to studies/flickr8k/scst_maps.jpg (the photos are public domain, shipped inside scikit-image).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from captioning import Captioner
from captioning.data.images import SAMPLE_PHOTOS, sample_photo
from studies.tables import REPO

MODELS = {"cross-entropy (the start)": ("soft_side_seed1", "best.pt"),
          "after SCST (240 steps, leave-one-out, lr 2e-4)": ("scst_d3_loo_lr2e-4", "last.pt")}
PICTURED = "motorcycle"


def map_statistics(alphas: np.ndarray) -> dict[str, float]:
    """alphas [T, Hg, Wg] -> the mean entropy of a word's map and the mean weight of its top cell."""
    flat = alphas.reshape(alphas.shape[0], -1).astype(np.float64)  # [T, L]
    entropy = -(flat * np.log(np.clip(flat, 1e-12, None))).sum(axis=1)
    return {"map_entropy": float(entropy.mean()), "top_cell": float(flat.max(axis=1).mean())}


def labelled(picture: Image.Image, label: str) -> Image.Image:
    band = 28
    canvas = Image.new("RGB", (picture.width, picture.height + band), "white")
    ImageDraw.Draw(canvas).text((8, 8), label, fill="black")
    canvas.paste(picture, (0, band))
    return canvas


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/flickr8k", help="the study's checkpoints")
    parser.add_argument("--results", default=str(REPO / "studies/flickr8k/results"))
    parser.add_argument("--picture", default=str(REPO / "studies/flickr8k/scst_maps.jpg"))
    args = parser.parse_args()
    photos = [sample_photo(name) for name in SAMPLE_PHOTOS]
    kept: dict[str, dict] = {}
    rows = []
    for label, (run, file) in MODELS.items():
        captioner = Captioner.from_checkpoint(Path(args.out) / run / file, device="cpu")
        results = captioner.caption(photos)
        kept[label] = {"checkpoint": f"{run}/{file}", "photos": {
            name: {"caption": result.caption, **map_statistics(result.alphas)}
            for name, result in zip(SAMPLE_PHOTOS, results)}}
        for name in SAMPLE_PHOTOS:
            print(f"{label:>48} | {name:<10} | {kept[label]['photos'][name]['caption']}")
        pictured = results[SAMPLE_PHOTOS.index(PICTURED)]
        rows.append(labelled(pictured.grid(thumbnail=112, columns=8), f"{label}: {pictured.caption}"))
    for label, model in kept.items():
        values = list(model["photos"].values())
        model["mean"] = {key: float(np.mean([v[key] for v in values])) for key in ("map_entropy", "top_cell")}
        print(f"{label}: map entropy {model['mean']['map_entropy']:.2f} nats, top cell {model['mean']['top_cell']:.3f}")
    width = max(row.width for row in rows)
    picture = Image.new("RGB", (width, sum(row.height for row in rows)), "white")
    top = 0
    for row in rows:
        picture.paste(row, (0, top))
        top += row.height
    picture.save(args.picture, quality=85)
    Path(args.results, "scst_maps.json").write_text(json.dumps(kept, indent=2))
    print(f"picture: {args.picture}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
