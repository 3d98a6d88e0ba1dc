"""What the CPU's arithmetic allows: FLOPs per caption of cases a, b, c3, c5 against measured sgemm speed.

    python benchmarks/flops.py [--threads N]

Counts the multiply-adds (2 FLOPs each) of the products the model cannot avoid, over the *real*
(unpadded) steps only, with the mean caption of the benchmark (lengths uniform in 10..22 tokens:
9..21 predicted words and <end>, i.e. 15 steps on average). Elementwise work (tanh, softmax, the
LSTM gates, Adam) is not counted, so the ceiling below is optimistic. Then it times large float32
matrix products (torch.mm) on this machine and prints the implied ceiling in captions (images)/s.

Notation: L cells, D channels, A attention, H hidden, E embedding, V vocabulary, G gate width (1),
s real steps per caption, K beams.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from run import ATTENTION, BEAM_STEPS, EMBED, HIDDEN, LONGEST, SHORTEST, VOCAB, machine

H, A, E, V, G = HIDDEN, ATTENTION, EMBED, VOCAB, 1


def per_step_forward(cells: int, dim: int) -> float:
    """Multiply-adds of one decoder step (one row), forward."""
    hidden = H * (A + G + 4 * H)  # W_h h, f_beta(h), W_hh h
    lstm_inputs = 4 * H * (dim + E)  # W_ih [E y; z]
    attention = cells * A + cells * dim  # v^T tanh(.), sum_i alpha_i a_i
    output = H * E + dim * E + E * V  # L_h h, L_z z, L_o (.)  (Eq. 7)
    return hidden + lstm_inputs + attention + output


def training_flops(cells: int, dim: int, steps: float) -> float:
    """FLOPs per caption of a training step: forward, and backward (input and weight gradients) = 3x,
    except the keys W_a a_i, whose input (the annotations) needs no gradient: 2x."""
    keys = cells * dim * A
    init = 2 * dim * H
    return 2 * (2 * (keys + init) + 3 * steps * per_step_forward(cells, dim))


def beam_flops(beams: int, steps: int = BEAM_STEPS) -> float:
    """FLOPs per image of beam search at 14x14x2048: keys once per image, every step for every beam."""
    cells, dim = 196, 2048
    return 2 * (cells * dim * A + 2 * dim * H + beams * steps * per_step_forward(cells, dim))


def sgemm_gflops(shape: tuple[int, int, int], repeats: int = 7) -> tuple[float, float]:
    m, k, n = shape
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(2):
        a @ b
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        seconds.append(time.perf_counter() - start)
    flops = 2 * m * k * n
    return flops / statistics.median(seconds) / 1e9, flops / min(seconds) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    info = machine()
    print(f"# {info['date']}  {info['cpu']} ({info['cpus']} CPUs, load {info['load_average']})  torch "
          f"{info['torch']}  threads {info['threads']}")
    steps = (SHORTEST + LONGEST) / 2 - 1  # mean real steps: predicted words and <end>
    best = 0.0
    for shape in [(2048, 2048, 2048), (480, 512, 10000), (6272, 2048, 512)]:
        median, top = sgemm_gflops(shape)
        best = max(best, median)
        print(f"sgemm {shape[0]}x{shape[1]} @ {shape[1]}x{shape[2]}: {median:6.1f} GFLOP/s median, {top:6.1f} best")
    cases = {"a": training_flops(196, 2048, steps), "b": training_flops(49, 512, steps),
             "c3": beam_flops(3), "c5": beam_flops(5)}
    for case, flops in cases.items():
        unit = "images/s" if case.startswith("c") else "captions/s"
        print(f"{case:<3} {flops / 1e9:6.2f} GFLOP per {'image' if case.startswith('c') else 'caption'}  "
              f"ceiling at {best:.1f} GFLOP/s: {best * 1e9 / flops:6.1f} {unit}")


if __name__ == "__main__":
    main()
