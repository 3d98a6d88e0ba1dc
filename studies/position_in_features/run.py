"""How much absolute position the annotation vectors carry, with each border padding of the backbone.

    python -m studies.position_in_features.run                 # compute what is missing, rewrite the table
    python -m studies.position_in_features.run --tables-only   # rewrite docs/attention.md from the kept results

A soft attention context z_t = sum_i alpha_ti a_i knows where it looked only as far as the vectors
a_i themselves say where their cell is. CNN features are translation-equivariant except at the
border, where zero padding shows the network an edge (Islam et al., ICLR 2020). This measures it:
a linear read-out (least squares with a bias) from one annotation vector to its cell's centre
(x, y) in [-1, 1], fitted on the cells of the first half of the shapes test images and scored (R²)
on the second half, for the encoder's convolutions padding with zeros (as trained), by reflection,
or by replicating the border (encoder.padding). R² is given over all cells, the background cells
(no object's box holds their centre) and the inner cells (not on the grid's outer ring), so that
what the border gives can be told from what the objects give. Results are kept per padding in
RESULTS/<padding>.json (default studies/position_in_features/results/); what each padding does to attention after
training is in the localization study (studies/attention_table/run.py, rows soft_reflect and
soft_replicate).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from captioning.config import load_config
from captioning.config.choices import PADDINGS
from captioning.data.shapes.scenes import make_shapes
from captioning.data.splits import load_splits
from studies.object_cells import object_cells
from studies.tables import REPO, study_parser, write_between

COUNTS = {"train": 1500, "val": 150, "test": 300}  # the attention study's data (studies/attention_table/run.py)
CELLS = {"all cells": "all", "background cells": "background", "inner cells": "inner"}


def cell_masks(test, rows: int, columns: int) -> dict[str, torch.Tensor]:
    """[N, L] bool per kind of cell: all, background (no box holds the centre), inner (not the outer ring)."""
    objects = np.stack([object_cells(truth, rows, columns) for truth in test.scenes])  # [N, L]
    background_t = ~torch.from_numpy(objects)
    inner = torch.zeros(rows, columns, dtype=torch.bool)
    inner[1:-1, 1:-1] = True
    return {"all": torch.ones_like(background_t), "background": background_t,
            "inner": inner.flatten().expand_as(background_t)}


def position_r2(annotations: torch.Tensor, grid: tuple[int, int], masks: dict[str, torch.Tensor]) -> dict:
    """Fit cell centre (x, y) from the annotation on the first half of the images; R² on the second."""
    images, cells, _ = annotations.shape  # [N, L, D]
    rows, columns = grid
    y = (torch.arange(rows, dtype=torch.float64) + 0.5) / rows * 2 - 1
    x = (torch.arange(columns, dtype=torch.float64) + 0.5) / columns * 2 - 1
    grid_y, grid_x = torch.meshgrid(y, x, indexing="ij")
    targets = torch.stack([grid_x, grid_y], dim=2).flatten(0, 1).expand(images, cells, 2)  # [N, L, 2]
    inputs = torch.cat([annotations.double(), torch.ones(images, cells, 1, dtype=torch.float64)], dim=2)
    fit, held = slice(0, images // 2), slice(images // 2, images)
    result = {}
    for kind, mask in masks.items():
        weights = torch.linalg.lstsq(inputs[fit][mask[fit]], targets[fit][mask[fit]]).solution  # [D + 1, 2]
        truth = targets[held][mask[held]]  # [M, 2]
        error = ((inputs[held][mask[held]] @ weights - truth) ** 2).sum(0)
        spread = ((truth - truth.mean(0)) ** 2).sum(0)
        r2 = 1 - error / spread
        result[kind] = {"x": float(r2[0]), "y": float(r2[1]), "cells": int(mask[held].sum())}
    return result


def measure(padding: str, *, data: Path) -> dict:
    config = load_config(REPO / "configs/shapes_soft.yaml", [f"data.root={data}", f"encoder.padding={padding}"])
    test = load_splits(config, ("test",))["test"]
    annotations = torch.from_numpy(np.asarray(test.annotations, dtype=np.float32))  # [N, L, D]
    return {"padding": padding, "images": annotations.shape[0], "grid": list(test.grid),
            **position_r2(annotations, test.grid, cell_masks(test, *test.grid))}


def table(results: dict[str, dict]) -> str:
    head = " | ".join(f"{label}: R² x / y" for label in CELLS)
    lines = [f"| encoder.padding | {head} |", "|---|" + "---|" * len(CELLS)]
    for padding, r in results.items():
        cells = " | ".join(f"{r[kind]['x']:.2f} / {r[kind]['y']:.2f}" for kind in CELLS.values())
        lines.append(f"| {padding} | {cells} |")
    first = next(iter(results.values()))
    cells = ", ".join(f"{label} {first[kind]['cells']}" for label, kind in CELLS.items())
    lines += ["", f"Linear read-out of the cell centre from one stride-16 annotation ({first['grid'][0]}x"
              f"{first['grid'][1]} grid), fitted on {first['images'] // 2} test images and scored on the other "
              f"{first['images'] - first['images'] // 2} (held-out cells: {cells})."]
    return "\n".join(lines)


def main() -> int:
    args = study_parser(__doc__, data="data/study", out=None, results="studies/position_in_features/results",
                        data_help=f"shapes data (made if missing: {COUNTS})",
                        table_doc="studies/position_in_features/README.md").parse_args()
    torch.set_num_threads(1)
    data, kept = Path(args.data), Path(args.results)
    results = {}
    for padding in PADDINGS:
        path = kept / f"{padding}.json"
        if path.exists() or args.tables_only or (args.only and args.only not in padding):
            if path.exists():
                results[padding] = json.loads(path.read_text())
            continue
        if not (data / "dataset_shapes.json").exists():
            make_shapes(data, COUNTS, seed=0)
        results[padding] = measure(padding, data=data)
        kept.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results[padding], indent=2))
        print(padding, {k: v for k, v in results[padding].items() if k in CELLS.values()}, flush=True)
    write_between(Path(args.doc), "padding", "python -m studies.position_in_features.run", table(results))
    print(f"table written to {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
