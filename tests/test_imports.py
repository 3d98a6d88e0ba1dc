"""A command imports what it runs: the config and the command line's parser load no torch."""

import subprocess
import sys

from tests.tiny import REPO

LOADED = """
import sys
{statement}
heavy = sorted(m for m in sys.modules if m == "torch" or m.startswith(("captioning.train", "captioning.eval",
                                                                      "captioning.model", "numpy")))
print("loaded:" + ",".join(heavy))
"""


def _loaded(statement: str) -> str:
    done = subprocess.run([sys.executable, "-c", LOADED.format(statement=statement)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=True)
    return done.stdout.strip().splitlines()[-1].removeprefix("loaded:")


def test_importing_the_config_loads_no_torch_and_no_training_or_evaluation() -> None:
    assert _loaded("import captioning.config") == ""


def test_the_command_lines_help_loads_no_torch() -> None:
    statement = ("from captioning.cli import main\n"
                 "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
                 "try:\n    main(['train', '--help'])\nexcept SystemExit:\n    pass")
    assert _loaded(statement) == ""


def test_a_registry_read_fills_every_registry() -> None:
    # The registering modules are imported on the first read, not at `import captioning`.
    statement = ("from captioning.config.registry import DATASETS, OBJECTIVES, SCORES\n"
                 "print(SCORES.names(), file=sys.stderr)\n"
                 "assert 'additive' in SCORES and 'scst' in OBJECTIVES and 'coco' in DATASETS")
    assert "torch" in _loaded(statement).split(",")


def test_a_registry_lists_its_names_in_one_order_whatever_was_imported_first() -> None:
    # A script that imports self-critical training before anything reads a registry registered "scst"
    # before "xe"; the lists (and the messages that name them) stay in the package's order.
    statement = ("import captioning.train.scst\n"
                 "from captioning.config.registry import DATASETS, LOCAL_WINDOWS, OBJECTIVES\n"
                 "assert OBJECTIVES.names() == ('xe', 'scst'), OBJECTIVES.names()\n"
                 "assert LOCAL_WINDOWS.names() == ('gaussian', 'learned'), LOCAL_WINDOWS.names()\n"
                 "assert DATASETS.names()[-1] == 'shapes', DATASETS.names()")
    assert "torch" in _loaded(statement).split(",")
