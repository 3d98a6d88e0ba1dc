"""One setting given twice. In one YAML mapping (PyYAML would keep the last without a word), or on one
command line under its old and its new name, it is refused in one line naming it; overrides under
one name apply in order, the last over the others, as a child file over its base."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from captioning.cli import main
from captioning.config import ConfigError, load_config


def refused(capsys, *args: str) -> str:
    """`captioning prepare ARGS`: exit code 2 and its one line on stderr."""
    code = main(["prepare", *args])
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, captured.err
    return lines[0]


@pytest.mark.parametrize("overrides, first, second", [
    (["data.folder.split_share=0.1", "data.split_share=0.2"], "data.folder.split_share=0.1", "data.split_share=0.2"),
    (["data.split_share=0.2", "data.folder.split_share=0.1"], "data.split_share=0.2", "data.folder.split_share=0.1"),
    (["data.split_share=0.2", "data={folder: {split_share: 0.1}}"], "data.split_share=0.2",
     "data={folder: {split_share: 0.1}}"),
])
def test_one_setting_under_its_old_and_new_name_on_the_command_line_is_refused_naming_both(
        tmp_path, capsys, overrides, first, second):
    root = tmp_path / "photos"
    line = refused(capsys, "data.dataset=folder", f"data.root={root}", f"train.out_dir={tmp_path / 'run'}", *overrides)
    assert line == (f"error: overrides '{first}' and '{second}': 'data.split_share' and 'data.folder.split_share' "
                    "name one setting (the first is its old name); keep one")  # and no warning about the alias
    assert not root.exists() and not (tmp_path / "run").exists()


def test_the_old_and_new_name_of_a_setting_are_refused_however_the_overrides_are_applied():
    with pytest.raises(ConfigError, match="'train.reinforce.warmup' and 'train.reinforce.weight_warmup' name one"):
        load_config(None, ["model.attention=hard", "train.reinforce.weight_warmup=3", "train.reinforce.warmup=5"])


def test_overrides_under_one_name_apply_in_order_the_last_over_the_others():
    """A command line may add to another (`$COMMON model.hidden_dim=48`), and a program's overrides
    come in layers (its defaults, then a run's): a later one wins, as a child file over its base."""
    assert load_config(None, ["model.hidden_dim=32", "model.hidden_dim=64"]).model.hidden_dim == 64
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the old name, said once per override
        config = load_config(None, ["data.dataset=folder", "data.split_share=0.2", "data.split_share=0.1"])
    assert config.data.folder.split_share == 0.1


@pytest.mark.parametrize("text, key, line, first", [
    ("model:\n  hidden_dim: 64\n  embed_dim: 32\n  hidden_dim: 128\n", "model.hidden_dim", 4, 2),
    ("data:\n  dataset: folder\n  folder:\n    split_seed: 1\n    split_seed: 2\n", "data.folder.split_seed", 5, 4),
    ("train:\n  word_weights: {above: 2, above: 4}\n", "train.word_weights.above", 2, 2),
    ("model:\n  hidden_dim: 64\ndata:\n  dataset: folder\nmodel:\n  embed_dim: 32\n", "model", 5, 1),
    ("model:\n  hidden_dim: 64\n  'hidden_dim': 128\n", "model.hidden_dim", 3, 2),  # quoted, the same key
])
def test_a_key_given_twice_in_one_yaml_mapping_is_refused_naming_the_setting_and_the_line(
        tmp_path, capsys, text, key, line, first):
    path = tmp_path / "run.yaml"
    path.write_text(f"{text}data:\n  dataset: folder\n" if "dataset" not in text else text)
    root = tmp_path / "photos"
    assert refused(capsys, "--config", str(path), f"data.root={root}", f"train.out_dir={tmp_path / 'run'}") == (
        f"error: {path}: line {line}: '{key}' is given twice in one mapping (first on line {first}); keep one")
    assert not root.exists()


def test_a_key_given_twice_in_a_base_file_is_refused_naming_the_base(tmp_path):
    (tmp_path / "base.yaml").write_text("decode:\n  beam_size: 3\n  beam_size: 5\n")
    (tmp_path / "run.yaml").write_text("base: base.yaml\ndecode:\n  beam_size: 2\n")
    with pytest.raises(ConfigError) as error:
        load_config(tmp_path / "run.yaml")
    assert str(error.value) == (f"{tmp_path / 'base.yaml'}: line 3: 'decode.beam_size' is given twice in one mapping "
                                "(first on line 2); keep one")


def test_a_mapping_value_given_twice_in_an_override_is_refused(tmp_path, capsys):
    line = refused(capsys, "data.dataset=folder", "model.attention=hard", "model.hard={coin: batch, coin: image}",
                   f"data.root={tmp_path / 'data'}", f"train.out_dir={tmp_path / 'run'}")
    assert line == "error: override 'model.hard={coin: batch, coin: image}': 'model.hard.coin' is given twice; keep one"


def test_yaml_merge_keys_and_anchors_still_read(tmp_path):
    """`<<: *name` copies a mapping in, and the keys beside it override it: that is what it means."""
    path = tmp_path / "run.yaml"
    path.write_text("train:\n  word_weights: &weights {above: 2, below: 2}\n  reinforce: {}\n"
                    "decode:\n  beam_size: 2\n")
    assert load_config(path).train.word_weights == {"above": 2, "below": 2}
    import yaml

    from captioning.config.loading import _repeated_key

    node = yaml.compose("base: &b {a: 1, b: 2}\nrun:\n  <<: *b\n  a: 3\nloop: &l [1, *l]\n", Loader=yaml.SafeLoader)
    assert _repeated_key(node) is None


def test_a_file_or_an_override_yaml_cannot_read_is_one_line_saying_where(tmp_path, capsys):
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  hidden_dim: [32\n")
    assert refused(capsys, "--config", str(path), f"data.root={tmp_path / 'data'}") == (
        f"error: {path}: cannot read config (line 3, column 1: expected ',' or ']', but got '<stream end>' (while "
        "parsing a flow sequence))")
    assert refused(capsys, "model.hidden_dim=[32", f"data.root={tmp_path / 'data'}") == (
        "error: override 'model.hidden_dim=[32': cannot read its value (line 1, column 4: expected ',' or ']', but "
        "got '<stream end>' (while parsing a flow sequence))")
    assert not Path(tmp_path / "data").exists()
