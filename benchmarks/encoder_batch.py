"""How many images per second the embedded default's encoder takes, by batch size and memory layout.

    python benchmarks/encoder_batch.py [--threads N] [--seconds S] [--batches 1,2,4,8,16]

EfficientNet-Lite0 at 224² (the embedded default), frozen, random input; for each batch size, the
default (NCHW) layout and channels-last. Each cell runs for --seconds after two warm-up batches.
The caption command (captioning.model.captioner.EncoderDecoder.encode) encodes a few images at a time in
channels-last on a CPU because of what this prints on the machines we have.
"""

from __future__ import annotations

import argparse
import time

import torch

from captioning.model.encoder import build_encoder


def images_per_second(encoder: torch.nn.Module, batch: int, *, channels_last: bool, seconds: float) -> float:
    layout = torch.channels_last if channels_last else torch.contiguous_format
    encoder = encoder.to(memory_format=layout)
    pixels = torch.randn(batch, 3, 224, 224).contiguous(memory_format=layout)
    with torch.no_grad():
        for _ in range(2):
            encoder(pixels)
        start, done = time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            encoder(pixels)
            done += batch
    return done / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--batches", default="1,2,4,8,16")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    encoder = build_encoder(name="efficientnet_lite0", layer="stride16").eval()
    print(f"# efficientnet_lite0 224², torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("batch  NCHW images/s  channels-last images/s")
    for batch in map(int, args.batches.split(",")):
        plain = images_per_second(encoder, batch, channels_last=False, seconds=args.seconds)
        last = images_per_second(encoder, batch, channels_last=True, seconds=args.seconds)
        print(f"{batch:5d}  {plain:14.1f}  {last:22.1f}", flush=True)


if __name__ == "__main__":
    main()
