"""What bf16 autocast costs on a CPU, with and without bf16 instructions: why train.amp runs in
float32 on a CPU that has none (captioning.runtime.precision).

    python benchmarks/cpu_precision.py [--repeats N] [--isas default,AVX512_CORE,AVX2]

A ResNet-101 forward (random weights) on 2 images at 448², the COCO ResNet config's encoder, in
float32 and under bf16 autocast. Each ISA runs in its own process with oneDNN capped to it
(ONEDNN_MAX_CPU_ISA), which is how one machine shows what CPUs without AVX512-BF16 (AVX512_CORE:
AVX-512 without BF16, e.g. Zen 3 servers' successors without it, Skylake-X; AVX2: Zen 1 to 3) do
with bf16: emulate it. "default" is the machine as it is. The table gives the median seconds of each
and bf16's time as a multiple of float32's; the CPU is named on the first line.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path


def forward_seconds(repeats: int) -> tuple[float, float]:
    """(float32, bf16 autocast) median seconds of one forward, in this process."""
    import torch
    import torchvision

    model = torchvision.models.resnet101().eval()
    pixels = torch.randn(2, 3, 448, 448)

    def once(bf16: bool) -> float:
        start = time.perf_counter()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            model(pixels)
        return time.perf_counter() - start

    once(False), once(True)  # warm-up: oneDNN picks and compiles its kernels
    full = [once(False) for _ in range(repeats)]
    half = [once(True) for _ in range(repeats)]
    return statistics.median(full), statistics.median(half)


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--isas", default="default,AVX512_CORE,AVX2", help="oneDNN ISA caps, comma-separated")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: print one row's numbers
    args = parser.parse_args()
    if args.one:
        print(*forward_seconds(args.repeats))
        return
    import torch

    from captioning.runtime.precision import cpu_has_native_bf16

    print(f"# {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, "
          f"bf16 instructions: {'yes' if cpu_has_native_bf16() else 'no'}")
    print("| oneDNN ISA | float32 s | bf16 autocast s | bf16 / float32 |")
    print("|---|---|---|---|")
    for isa in args.isas.split(","):
        env = dict(os.environ)
        if isa != "default":
            env["ONEDNN_MAX_CPU_ISA"] = isa
        done = subprocess.run([sys.executable, __file__, "--one", "--repeats", str(args.repeats)], env=env,
                              capture_output=True, text=True, check=True)
        full, half = map(float, done.stdout.split())
        print(f"| {isa} | {full:.2f} | {half:.2f} | {half / full:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
