"""What self-critical training's rewards did on the training images, from each run's log.

    python -m studies.flickr8k.scst_rewards --out runs/flickr8k

For each run of the study's SCST budget under --out: the mean CIDEr-D of the sampled captions
(`reward`) and of the baseline they were compared with (`baseline`: the greedy caption's, or the
mean of the image's other samples) over its first and last 40 steps, from OUT/<run>/log.jsonl
(logged every 5 steps). Written to RESULTS/scst_rewards.json and as a table into the study's README.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from studies.flickr8k.runs import RUNS
from studies.tables import REPO, write_between

WINDOW = 40  # steps at each end


def trend(log: Path) -> dict[str, float] | None:
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    rows = [row for row in rows if "reward" in row]
    if not rows:
        return None
    last = rows[-1]["step"]
    first = [row for row in rows if row["step"] <= WINDOW]
    final = [row for row in rows if row["step"] > last - WINDOW]

    def mean(part: list[dict], key: str) -> float:
        return sum(row[key] for row in part) / len(part)

    return {"steps": last, "reward_first": mean(first, "reward"), "reward_last": mean(final, "reward"),
            "baseline_first": mean(first, "baseline"), "baseline_last": mean(final, "baseline")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/flickr8k", help="the study's runs")
    parser.add_argument("--results", default=str(REPO / "studies/flickr8k/results"))
    parser.add_argument("--doc", default=str(REPO / "studies/flickr8k/README.md"))
    args = parser.parse_args()
    kept = {}
    for name, spec in RUNS.items():
        log = Path(args.out) / name / "log.jsonl"
        if spec.group == "scst_budget" and log.exists() and (found := trend(log)) is not None:
            kept[name] = {"label": spec.label, **found}
    Path(args.results, "scst_rewards.json").write_text(json.dumps(kept, indent=2))
    lines = [f"| run | steps | sampled reward, first {WINDOW} steps | last {WINDOW} | baseline, first | last |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['label']} | {r['steps']} | {r['reward_first']:.3f} | {r['reward_last']:.3f} | "
              f"{r['baseline_first']:.3f} | {r['baseline_last']:.3f} |" for r in kept.values()]
    command = "python -m studies.flickr8k.scst_rewards --out runs/flickr8k"
    write_between(Path(args.doc), "flickr8k-scst-rewards", command, "\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
