"""The package is layers (docs/architecture.md): every module imports only its own folder and the
layers below it, at the top of a file or inside a function alike, so there is no import circle to
dodge; the design document's map names every module; and every choice the config accepts is one
the code implements."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import torch

from captioning.config import choices, load_config, registry
from tests.tiny import REPO

PACKAGE = REPO / "captioning"
# Bottom to top; a part imports only its own folder and the parts of lower layers.
LAYERS = (
    ("config", "runtime", "progress"),  # what a run is; where and how a process computes and writes
    # files (weights stored below fp32 among them); progress bars
    ("model",),  # the paper's model: encoder, scores, attention, decoder, decoding
    ("data",),  # images, captions, vocabulary, splits, the feature cache, batches
    ("checkpoint",),  # a trained model on disk, and the model built from it
    ("shipped", "inspection"),  # the models the package ships, a checkpoint cut for shipping; what one holds
    ("eval",),  # captions scored, maps scored and drawn
    ("train",),  # a run: the objective's steps, validation, checkpoints, several processes
    ("api",),  # captioning from Python
    ("cli", "__init__"),  # the commands, and the package's face
    ("__main__",),  # `python -m captioning`: the command
)


def part(module: str) -> str:
    """captioning.train.loop -> train; captioning.api -> api; captioning -> __init__."""
    names = module.split(".")
    return names[1] if len(names) > 1 else "__init__"


def layer(name: str) -> int:
    return next(i for i, parts in enumerate(LAYERS) if name in parts)


def module_name(path: Path) -> str:
    names = path.relative_to(REPO).with_suffix("").parts
    return ".".join(names[:-1] if names[-1] == "__init__" else names)


def _imported(nodes) -> list[tuple[str, int]]:
    """(imported captioning module, line) for each import among `nodes`; `from captioning import
    progress` is captioning.progress."""
    found = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "captioning":
            if node.module == "captioning":
                found += [(f"captioning.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names if alias.name.split(".")[0] == "captioning"]
    return found


def imports(path: Path) -> list[tuple[str, int]]:
    """Every import in the file: top level, inside functions, under TYPE_CHECKING alike."""
    return _imported(ast.walk(ast.parse(path.read_text())))


def test_every_import_goes_to_its_own_folder_or_a_lower_layer() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = part(module_name(path))
        for target, line in imports(path):
            to = part(target)
            if to != source and layer(to) >= layer(source):
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {target} ({to} is not below {source})")
    assert not wrong, "\n".join(wrong)


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {part(module_name(path)) for path in PACKAGE.rglob("*.py")}
    assert parts == {name for names in LAYERS for name in names}


def test_no_import_circle_inside_a_folder() -> None:
    """Within a layer's folder modules may import each other, top-level imports only in one direction."""
    graph = {module_name(path): {target for target, _ in _imported(ast.parse(path.read_text()).body)}
             for path in PACKAGE.rglob("*.py")}

    def visit(module: str, trail: tuple[str, ...]) -> None:
        for target in graph.get(module, ()):
            if target in trail:
                raise AssertionError(f"import circle: {' -> '.join((*trail[trail.index(target):], target))}")
            visit(target, (*trail, target))

    for module in graph:
        visit(module, (module,))


def test_the_layers_in_the_design_document_are_these() -> None:
    """docs/architecture.md states each layer in a line; it names every part listed here, in order."""
    text = (REPO / "docs" / "architecture.md").read_text()
    table = text[text.index("<!-- layers:start -->"):text.index("<!-- layers:end -->")]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| layer")
            and not line.startswith("|---")]
    assert len(rows) == len(LAYERS)
    for row, parts in zip(rows, reversed(LAYERS)):  # the table reads from the top down
        for name in parts:
            assert f"`{name}" in row, (name, row)



def test_the_design_documents_map_names_every_module() -> None:
    """docs/architecture.md's map of the package names each module of a folder in that folder's
    lines (a sub-folder as `name/`), and each module at the top anywhere in it: a module added
    without a place on the map fails here."""
    text = (REPO / "docs" / "architecture.md").read_text()
    start = text.index("```", text.index("<!-- layers:end -->"))
    diagram = text[start:text.index("```", start + 3)]
    folders: dict[str, str] = {}
    current = None
    for line in diagram.splitlines():
        if header := re.match(r"^  (\w+)(/|\.py)", line):
            current = header[1] if header[2] == "/" else None
        elif not line.strip() or line.strip().startswith("│"):
            current = None
        if current is not None:
            folders[current] = folders.get(current, "") + line + "\n"
    missing = []
    for path in sorted(PACKAGE.glob("*.py")):
        if path.stem not in ("__init__", "__main__") and not re.search(rf"\b{path.stem}\b", diagram):
            missing.append(path.name)
    for folder in sorted(p for p in PACKAGE.iterdir() if (p / "__init__.py").exists()):
        lines = folders.get(folder.name, "")
        for path in sorted(folder.iterdir()):
            named = f"{path.name}/" if (path / "__init__.py").exists() else path.stem if path.suffix == ".py" else None
            if named not in (None, "__init__", "__main__") and not re.search(rf"(?<![\w/]){re.escape(named)}"
                                                                         rf"(?![\w])", lines):
                missing.append(f"{folder.name}/{path.name}")
    assert missing == [], f"not on docs/architecture.md's map: {missing}"


# Every choice the config accepts is one the code implements -----------------------------------------

def test_every_model_choice_the_config_accepts_builds_a_decoder() -> None:
    """Each value of each model choice list, alone on the defaults (with what it needs), gives a
    decoder that runs a step: no value the config accepts is one the model does not know."""
    from captioning.model.encoder_decoder import build_decoder

    needs = {"model.attention=hard": (), "model.score=local": (), "model.local.window=learned": ("model.score=local",),
             "model.extras.glimpses=2": (),
             **{f"model.hard.coin={v}": ("model.attention=hard",) for v in choices.COINS}}  # hard attention's section
    overrides = [f"model.attention={v}" for v in choices.ATTENTIONS] + [f"model.score={v}" for v in registry.SCORES] \
        + [f"model.gate={v}" for v in choices.GATES] + [f"model.deep_output={v}" for v in choices.DEEP_OUTPUTS] \
        + [f"model.hard.coin={v}" for v in choices.COINS] \
        + [f"model.local.window={v}" for v in registry.LOCAL_WINDOWS] \
        + [f"model.extras.init={v}" for v in choices.INITS] + [f"model.extras.position={v}" for v in choices.POSITIONS]
    for override in overrides:
        model = load_config(None, ["model.embed_dim=8", "model.hidden_dim=8", "model.attention_dim=8",
                                   *needs.get(override, ()), override]).model
        decoder = build_decoder(model, vocab_size=7, annotation_dim=6, grid=(2, 2)).eval()
        memory, state = decoder.start(torch.randn(1, 4, 6))
        logits, _, _ = decoder.next_word(memory, state, torch.tensor([1]))
        assert logits.shape == (1, 7), override


def test_the_metrics_validation_may_pick_are_those_it_computes(tiny_run) -> None:
    """train.val_metric picks from VALIDATION_METRICS (and SHAPES_METRICS on the shapes data):
    validation's caption metrics and the shapes scorer give every one of them."""
    from captioning.checkpoint import decoder_from_checkpoint, load_checkpoint
    from captioning.data.splits import load_splits
    from captioning.data.vocab import Vocabulary
    from captioning.eval.evaluate import evaluate_split, scorer_for

    payload = load_checkpoint(tiny_run.checkpoint)
    config = load_config(None, list(tiny_run.overrides))
    val = load_splits(config, ("val",))["val"]
    vocab = Vocabulary(payload["vocab"])
    metrics, _ = evaluate_split(decoder_from_checkpoint(payload, config), val.annotations, image_ids=val.image_ids,
                                references=val.references, vocab=vocab, grid=val.grid, scorer=scorer_for(val, vocab),
                                full=False)
    assert set(choices.VALIDATION_METRICS) | set(choices.SHAPES_METRICS) <= set(metrics)


def test_the_metrics_validation_may_pick_are_those_where_higher_is_better() -> None:
    """train.val_metric keeps the checkpoint with the highest value: CHAIR (lower is better, on the
    shapes data and on COCO) is never a choice, nor COCO's scores (only where its instances files are)."""
    from captioning.eval.coco.scorer import CocoScorer

    picked = set(choices.VALIDATION_METRICS) | set(choices.SHAPES_METRICS)
    assert not {name for name in picked if name.startswith("CHAIR")}
    assert not picked & set(CocoScorer([], []).metrics()) - set(choices.SHAPES_METRICS)
