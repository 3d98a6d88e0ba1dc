"""Config loading: defaults, the chain of `base:` files, the file, then `key.sub=value` overrides."""

from __future__ import annotations

import copy
import re

import pytest

from captioning.config import Config, ConfigError, apply_overrides, from_dict, load_config
from tests.tiny import REPO


def write(path, text):
    path.write_text(text)
    return path


def test_no_file_gives_the_dataclass_defaults():
    assert load_config() == Config()


def test_file_values_override_defaults_and_leave_the_rest(tmp_path):
    path = write(tmp_path / "run.yaml", "model:\n  hidden_dim: 32\n  gate: vector\ntrain:\n  lr: 0.01\n")
    config = load_config(path)
    assert config.model.hidden_dim == 32
    assert config.model.gate == "vector"
    assert config.train.lr == 0.01
    assert config.model.embed_dim == Config().model.embed_dim
    assert config.decode == Config().decode


def test_base_is_read_first_relative_to_the_file_and_the_file_wins(tmp_path):
    (tmp_path / "bases").mkdir()
    write(tmp_path / "bases" / "common.yaml", "model:\n  hidden_dim: 64\n  embed_dim: 24\ntrain:\n  epochs: 3\n")
    (tmp_path / "runs").mkdir()
    path = write(tmp_path / "runs" / "child.yaml", "base: ../bases/common.yaml\nmodel:\n  hidden_dim: 32\n")
    config = load_config(path)
    assert config.model.hidden_dim == 32  # the file beats its base
    assert config.model.embed_dim == 24  # from the base
    assert config.train.epochs == 3  # from the base
    assert config.train.lr == Config().train.lr  # from the defaults


def test_bases_chain_the_nearest_winning_each_relative_to_the_file_that_names_it(tmp_path):
    (tmp_path / "far").mkdir()
    write(tmp_path / "far" / "grand.yaml", "train:\n  epochs: 1\n  lr: 0.5\nmodel:\n  hidden_dim: 8\n")
    write(tmp_path / "base.yaml", "base: far/grand.yaml\ntrain:\n  epochs: 2\n")
    path = write(tmp_path / "child.yaml", "base: base.yaml\nmodel:\n  hidden_dim: 16\n")
    config = load_config(path)
    assert (config.train.epochs, config.train.lr, config.model.hidden_dim) == (2, 0.5, 16)


def test_a_circle_of_bases_is_one_line_naming_the_chain(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: ./a.yaml\n")
    with pytest.raises(ConfigError) as refused:
        load_config(tmp_path / "a.yaml")
    message = str(refused.value)
    assert "already in its chain" in message and "a.yaml -> " in message and "\n" not in message


def test_missing_base_file_is_a_config_error(tmp_path):
    path = write(tmp_path / "child.yaml", "base: nowhere.yaml\n")
    with pytest.raises(ConfigError, match="nowhere.yaml"):
        load_config(path)


@pytest.mark.parametrize("base", ["3", "true", "[a.yaml, b.yaml]", "{file: a.yaml}"])
def test_a_base_that_is_not_one_file_name_is_one_line_naming_the_file(tmp_path, base):
    path = write(tmp_path / "child.yaml", f"base: {base}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value).startswith(f"{path}: base must be the name of one config file")


@pytest.mark.parametrize("content", ["model:\n  dropout: 0.3  # \xdcbersetzung\n".encode("latin-1"),
                                     b"PK\x03\x04\x00\x00\x08\x08\xff\xfe"])  # Latin-1; a checkpoint (a zip)
def test_a_config_that_is_not_utf8_text_is_one_line_naming_the_file(tmp_path, content):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value).startswith(f"{path}: cannot read config (not UTF-8 text: byte ")


@pytest.mark.parametrize("text, key", [
    ("modle:\n  hidden_dim: 3\n", "modle"),
    ("model:\n  hiden_dim: 3\n", "hiden_dim"),
    ("train:\n  lr: 0.1\n  ds_wieght: 1.0\n", "ds_wieght"),
])
def test_unknown_keys_in_a_file_raise_naming_the_key(tmp_path, text, key):
    path = write(tmp_path / "bad.yaml", text)
    with pytest.raises(ConfigError, match=key):
        load_config(path)


def test_unknown_key_in_the_base_raises_too(tmp_path):
    write(tmp_path / "base.yaml", "decode:\n  beam_szie: 2\n")
    path = write(tmp_path / "child.yaml", "base: base.yaml\n")
    with pytest.raises(ConfigError, match="beam_szie"):
        load_config(path)


def test_a_section_given_a_scalar_is_an_error(tmp_path):
    path = write(tmp_path / "bad.yaml", "model: 3\n")
    with pytest.raises(ConfigError, match="model"):
        load_config(path)


def test_a_file_that_is_not_a_mapping_is_an_error(tmp_path):
    path = write(tmp_path / "bad.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError):
        load_config(path)


def test_overrides_are_parsed_as_yaml_and_applied_after_the_file(tmp_path):
    path = write(tmp_path / "run.yaml", "model:\n  hidden_dim: 32\ntrain:\n  max_steps: 5\n")
    config = load_config(path, ["model.hidden_dim=48", "train.max_steps=null", "model.dropout=0.5",
                                "encoder.weights_path=/some/where.pt", "data.dataset=shapes", "model.gate=vector"])
    assert config.model.hidden_dim == 48 and isinstance(config.model.hidden_dim, int)
    assert config.train.max_steps is None
    assert config.model.dropout == 0.5
    assert config.encoder.weights_path == "/some/where.pt"
    assert config.model.gate == "vector"


def test_value_may_contain_an_equals_sign():
    config = load_config(None, ["train.out_dir=runs/a=b"])
    assert config.train.out_dir == "runs/a=b"


def test_exponent_without_a_dot_is_a_number_in_a_float_field():
    # PyYAML (YAML 1.1) reads `1e-4` as a string; the optimizer would fail on it much later.
    config = load_config(None, ["train.lr=1e-4"])
    assert config.train.lr == pytest.approx(1e-4)
    assert isinstance(config.train.lr, float)
    with pytest.raises(ConfigError, match="lr"):
        load_config(None, ["train.lr=fast"])


def test_exponent_in_a_yaml_file_is_a_number_too(tmp_path):
    path = write(tmp_path / "run.yaml", "train:\n  lr: 3e-4\n")
    assert load_config(path).train.lr == pytest.approx(3e-4)


@pytest.mark.parametrize("override, message", [
    ("model.hiden_dim=3", "override 'model.hiden_dim=3': unknown key 'model.hiden_dim' .did you mean "
                          "'model.hidden_dim'"),
    ("model.atention=soft", "unknown key 'model.atention' .did you mean 'model.attention'. known in model: "
                            "attention, "),
    ("modle.hidden_dim=3", "unknown key 'modle' .did you mean 'model'"),
    ("data.feature=false", "unknown key 'data.feature' .did you mean 'data.feature_cache'"),
    ("data.folder.captions=c.csv", "unknown key 'data.folder.captions' .did you mean 'data.folder.captions_file'"),
    ("decode.beam=2", "unknown key 'decode.beam' .did you mean 'decode.beam_size'"),
    ("model.xyz=3", "unknown key 'model.xyz' .known in model: attention"),  # nothing close: no guess
    ("train.lr.x=1", "'lr' is a value, not a section"),  # `x` would otherwise silently become lr={'x': 1}
])
def test_unknown_override_keys_raise_naming_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize("override, message", [
    ("encoder.padding=circular", "encoder.padding 'circular' is not one of zeros, reflect, replicate"),
    ("encoder.layer=stride8", "encoder.layer 'stride8'"),
    ("model.deep_output=relu", "model.deep_output 'relu' is not one of linear, tanh"),
    ("model.extras.init=zeros", "model.extras.init 'zeros' is not one of mean, layout"),
    ("model.gate=diagonal", "model.gate 'diagonal' is not one of scalar, vector"),
    ("encoder.name=vgg", "encoder.name 'vgg' is not one of efficientnet_lite0"),
    ("model.hard.coin=epoch", "model.hard.coin 'epoch' is not one of image, batch"),
    ("decode.hard_choice=mode", "decode.hard_choice 'mode' is not one of expectation, argmax, sample"),
    ("model.local.window=square", "model.local.window 'square' is not one of gaussian, learned"),
    ("data.dataset=imagenet", "data.dataset 'imagenet' is not one of "),
    ("train.objective=rl", "train.objective 'rl' is not one of xe, scst"),
    ("train.reinforce.weight_warmup=-1", "train.reinforce.weight_warmup must be at least 0"),
    ("train.reinforce.location_samples=0", "train.reinforce.location_samples must be at least 1"),
    ("train.reinforce.baseline=critic", "train.reinforce.baseline 'critic' is not one of none, moving_average, "
                                        "leave_one_out"),
])
def test_values_no_run_could_use_raise_before_anything_is_built(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


def test_word_weights_are_a_mapping_from_a_file_or_an_override(tmp_path):
    assert Config().train.word_weights == {} and Config().train.word_weights is not Config().train.word_weights
    path = write(tmp_path / "c.yaml", "train:\n  word_weights: {above: 4, below: 2.5}\n")
    assert load_config(path).train.word_weights == {"above": 4, "below": 2.5}
    assert load_config(path, ["train.word_weights={to: 3}"]).train.word_weights == {"to": 3}  # replaced, not merged


@pytest.mark.parametrize("override", ["train.word_weights={above: 0}", "train.word_weights={above: -1}",
                                      "train.word_weights={above: x}", "train.word_weights=4",
                                      "train.word_weights={above: true}"])
def test_word_weights_must_be_positive_numbers(override):
    with pytest.raises(ConfigError, match="train.word_weights must map words to positive numbers"):
        load_config(None, [override])


def test_apply_overrides_rejects_unknown_keys_and_leaves_known_values():
    config = Config()
    with pytest.raises(ConfigError, match="unknown key 'decode.beam' .did you mean 'decode.beam_size'"):
        apply_overrides(config, ["decode.beam=5"])
    assert config.decode == Config().decode


def test_override_without_equals_sign_is_an_error():
    with pytest.raises(ConfigError, match="key.sub=value"):
        load_config(None, ["model.hidden_dim"])


def test_apply_overrides_changes_the_config_in_place_and_returns_it():
    config = Config()
    returned = apply_overrides(config, ["decode.beam_size=5", "train.seed=3"])
    assert returned is config
    assert config.decode.beam_size == 5
    assert config.train.seed == 3
    assert apply_overrides(config, []) == config


def test_round_trip_through_to_dict_and_from_dict():
    config = apply_overrides(Config(), ["model.hidden_dim=12", "train.max_steps=7"])
    assert from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="bogus"):
        from_dict({"train": {"bogus": 1}})


# every value checked at load, before any data or model work ----------------------------------------


@pytest.mark.parametrize("overrides, message", [
    (["train.val_metric=METEOR"], "train.val_metric 'METEOR' is not a metric that validation produces on "
                                  "data.dataset=shapes (it produces Bleu_1, Bleu_2, Bleu_3, Bleu_4, CIDEr, "),
    (["data.dataset=coco", "train.val_metric=relation_probe_accuracy"], "'relation_probe_accuracy' is not a metric"),
    (["model.score=telepathic"], "model.score 'telepathic' is not one of additive, concat, general, dot, scaled_dot, "
                                 "cosine, location, local"),
    (["model.attention=hard", "train.reinforce.baseline=leave_one_out"],
     "leave_one_out needs train.reinforce.location_samples >= 2"),
    (["model.extras.glimpses=2", "model.attention=hard"], "model.extras.glimpses=2 needs model.attention=soft"),
    (["model.local.sigma=2.0"], "model.local applies only with model.score=local, not model.score=additive"),
    (["train.scst.samples=3"], "train.scst applies only with train.objective=scst, not train.objective=xe"),
    (["model.hard.coin=batch"], "model.hard applies only with model.attention=hard"),
    (["train.reinforce.entropy_weight=0.1"], "train.reinforce applies only with model.attention=hard and "
                                             "train.objective=xe, not model.attention=soft"),
    (["model.attention=hard", "train.objective=scst", "train.reinforce.entropy_weight=0.1"],
     "train.reinforce applies only with model.attention=hard and train.objective=xe, not train.objective=scst"),
    (["data.folder.split_seed=3"], "data.folder applies only with data.dataset=folder, not data.dataset=shapes"),
    (["data.coco_official.train_images=images"], "data.coco_official applies only with data.dataset=coco_official"),
    (["model.score=local", "model.local.sigma=0.0"], "model.local.sigma must be positive"),
    (["model.score=cosine", "model.cosine.sharpness=0.0"], "model.cosine.sharpness must be positive"),
    (["model.score=local", "model.local.base=cosine", "model.cosine.sharpness=-1"],
     "model.cosine.sharpness must be positive"),
    (["data.dataset=folder", "data.folder.split_share=0.5"], "data.folder.split_share must be in (0, 0.5)"),
    (["train.objective=scst", "train.scst.baseline=critic"], "train.scst.baseline 'critic' is not one of greedy, "
                                                              "leave_one_out"),
    (["train.objective=scst", "train.scst.samples=0"], "train.scst.samples must be at least 1"),
    (["data.folder.split_seed=seven"], "data.folder.split_seed must be an integer"),
    (["decode.hard_choice=argmax"], "decode.hard_choice=argmax applies to hard attention only"),
    (["encoder.fine_tune_from=layer9"], "encoder.fine_tune_from 'layer9' is not a stage of efficientnet_lite0"),
    (["encoder.name=vgg19", "encoder.layer=head"], "encoder.layer=head is an EfficientNet's; vgg19 takes stride16 or"),
    (["train.epochs=ten"], "train.epochs must be an integer, got 'ten'"),
    (["train.epochs=2.5"], "train.epochs must be an integer"),
    (["model.extras.query_word=1"], "model.extras.query_word must be true or false"),
    (["train.max_steps=0"], "train.max_steps must be at least 1"),
    (["model.dropout=1.0"], "model.dropout must be in [0, 1)"),
    (["model.hard.expectation_prob=1.5"], "model.hard.expectation_prob must be in [0, 1]"),
    (["train.lr=-0.1"], "train.lr must be positive"),
    (["train.lr=.inf"], "train.lr must be positive and finite, got inf"),
    (["train.ds_lambda=.inf"], "train.ds_lambda must be at least 0 and finite, got inf"),
    (["train.out_dir=runs/exp #2"], "a '#' after a space starts a comment in YAML"),
    (["train.reinforce.entropy_weight=-1"], "train.reinforce.entropy_weight must be at least 0"),
    (["train.optimizer=sgd"], "train.optimizer 'sgd' is not one of adam, rmsprop"),
])
def test_a_value_no_run_can_use_is_refused_at_load_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as refused:
        load_config(None, overrides)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_the_shapes_metrics_can_pick_a_checkpoint_on_the_shapes_data():
    assert load_config(None, ["train.val_metric=relation_probe_accuracy"]).train.val_metric == "relation_probe_accuracy"
    assert load_config(None, ["data.dataset=coco", "train.val_metric=Bleu_4"]).train.val_metric == "Bleu_4"


def test_every_encoder_stage_the_config_accepts_is_one_the_encoder_has(resnet18_file):
    """stage_names lists the stages without building the encoder; it must be the built encoder's."""
    import torchvision

    from captioning.config.choices import stage_names
    from captioning.model.encoder import _cut, _vgg_stages, build_encoder

    for name, layer, weights in (("efficientnet_lite0", "stride16", None), ("efficientnet_lite0", "stride32", None),
                                 ("efficientnet_lite2", "head", None),
                                 ("resnet18", "stride16", resnet18_file), ("resnet18", "stride32", resnet18_file)):
        encoder = build_encoder(name=name, layer=layer, weights_path=None if weights is None else str(weights))
        assert stage_names(name, layer) == [stage for stage, _ in encoder.body.named_children()], (name, layer)
    vgg = torchvision.models.vgg19(weights=None).features  # the layers, without weights
    for layer, last in (("stride16", "relu5_4"), ("stride32", "pool5")):
        assert stage_names("vgg19", layer) == [stage for stage, _ in _cut(_vgg_stages(vgg), last).named_children()]


def test_a_checkpoints_config_is_checked_too():
    values = Config().to_dict()
    values["model"]["score"] = "telepathic"
    with pytest.raises(ConfigError, match="best.pt: config: model.score 'telepathic'"):
        from_dict(values, where="best.pt: config")


def test_an_int_given_for_a_number_becomes_a_float():
    config = load_config(None, ["train.lr=1", "model.local.sigma=2", "model.score=local"])
    assert isinstance(config.train.lr, float) and isinstance(config.model.local.sigma, float)


def test_a_removed_setting_is_refused_in_one_line_with_the_reason(tmp_path):
    """train.compile was removed: a file or an override that still sets it is told so, and why."""
    path = write(tmp_path / "old.yaml", "train:\n  compile: true\n")
    for where, load in ((str(path), lambda: load_config(path)),
                        ("override 'train.compile=false'", lambda: load_config(None, ["train.compile=false"]))):
        with pytest.raises(ConfigError) as error:
            load()
        message = str(error.value)
        assert "\n" not in message
        assert message.startswith(f"{where}: 'train.compile' was removed: ")
        assert "recompiled" in message  # the reason, not just "unknown key"


def test_a_checkpoints_config_naming_a_removed_setting_still_loads():
    """Every checkpoint written before the removal records train.compile: it did not shape the weights."""
    values = Config().to_dict()
    values["train"]["compile"] = False
    assert from_dict(values, where="last.pt: config") == Config()
    assert values["train"]["compile"] is False  # the caller's dict is left as it was


def test_the_doubly_stochastic_weight_under_its_old_name_is_refused_with_its_new_meaning(tmp_path):
    """train.ds_weight weighed a mean per image against a mean per word; train.ds_lambda is Eq. 14's
    lambda. A file or override with the old name would train on a number meant in the old units."""
    path = write(tmp_path / "old.yaml", "train:\n  ds_weight: 1.0\n")
    for where, load in ((str(path), lambda: load_config(path)),
                        ("override 'train.ds_weight=1.0'", lambda: load_config(None, ["train.ds_weight=1.0"]))):
        with pytest.raises(ConfigError) as error:
            load()
        message = str(error.value)
        assert "\n" not in message
        assert message.startswith(f"{where}: 'train.ds_weight' is now 'train.ds_lambda': ")
        assert "Eq. 14" in message and "mean caption length" in message  # what changed and the conversion
    assert load_config(None, ["train.ds_lambda=0.5"]).train.ds_lambda == 0.5


def test_a_checkpoints_config_with_the_old_doubly_stochastic_weight_loads_under_the_new_name():
    """Checkpoints of today's format record train.ds_weight: read, it becomes train.ds_lambda (the
    number as it was); the weights and captions do not depend on it."""
    values = Config().to_dict()
    del values["train"]["ds_lambda"]
    values["train"]["ds_weight"] = 0.25
    config = from_dict(values, where="last.pt: config")
    assert config.train.ds_lambda == 0.25 and "ds_weight" not in config.to_dict()["train"]
    assert values["train"]["ds_weight"] == 0.25 and "ds_lambda" not in values["train"]  # the caller's dict as it was


def test_the_doubly_stochastic_target_was_removed_and_checkpoints_that_record_it_still_load():
    """train.ds_target chose tau = 1 or T/L, which give the same gradient: a file naming it is told why,
    and a checkpoint's config that records it (every one written before) loads as today's."""
    with pytest.raises(ConfigError, match=r"'train.ds_target' was removed: .*same gradient"):
        load_config(None, ["train.ds_target=length"])
    values = Config().to_dict()
    values["train"]["ds_target"] = "length"
    assert from_dict(values, where="last.pt: config") == Config()


def test_the_scst_baseline_once_called_mean_is_refused_in_a_file_and_read_from_a_checkpoint(tmp_path):
    """train.scst.baseline 'mean' is REINFORCE's leave_one_out (the mean of the other samples) and
    took that name: a file or an override is told the new one, a checkpoint's config reads as it."""
    path = tmp_path / "old.yaml"
    path.write_text("train:\n  objective: scst\n  scst:\n    baseline: mean\n")
    with pytest.raises(ConfigError, match=r"old.yaml: train.scst.baseline 'mean' is now 'leave_one_out'"):
        load_config(path, [])
    with pytest.raises(ConfigError, match=r"train.scst.baseline 'mean' is now 'leave_one_out'"):
        load_config(None, ["train.scst.baseline=mean"])
    values = Config().to_dict()
    values["train"]["scst"]["baseline"] = "mean"
    assert from_dict(values, where="last.pt: config").train.scst.baseline == "leave_one_out"
    assert values["train"]["scst"]["baseline"] == "mean"  # the caller's dict is left as it was
    assert from_dict(Config().to_dict()).train.scst.baseline == "greedy"  # nothing else is renamed


def test_settings_renamed_since_format_2_load_from_a_checkpoint_under_their_new_names():
    """train.reinforce.warmup and .samples (each a name that meant two settings) and the folder's and
    COCO's own files (now in their format's section): a checkpoint written before records the old
    keys, and its config reads as the new ones, the caller's dict left as it was."""
    values = Config().to_dict()
    reinforce, data = values["train"]["reinforce"], values["data"]
    del reinforce["weight_warmup"], reinforce["location_samples"], data["folder"], data["coco_official"]
    reinforce.update(warmup=7, samples=3)
    data.update(captions_file="mine.jsonl", split_seed=4, split_share=0.2, allow_outside_images=True,
                train_captions="t.json", train_images="t", val_captions="v.json", val_images="v")
    before = copy.deepcopy(values)
    config = from_dict(values, where="last.pt: config")
    assert values == before  # the caller's dict is left as it was
    assert (config.train.reinforce.weight_warmup, config.train.reinforce.location_samples) == (7, 3)
    folder, coco = config.data.folder, config.data.coco_official
    assert (folder.captions_file, folder.split_seed, folder.split_share, folder.allow_outside_images) == (
        "mine.jsonl", 4, 0.2, True)
    assert (coco.train_captions, coco.train_images, coco.val_captions, coco.val_images) == (
        "t.json", "t", "v.json", "v")
    assert from_dict(Config().to_dict()) == Config()  # today's keys stay where they are


# The choice that owns a section (a section set without it is refused): what a test of a setting in it sets.
OWNERS = {"train.reinforce": "model.attention=hard", "data.folder": "data.dataset=folder",
          "data.coco_official": "data.dataset=coco_official"}


def owner_of(key: str) -> list[str]:
    return [choice for section, choice in OWNERS.items() if key.startswith(f"{section}.")]


@pytest.mark.parametrize("old, new, value", [
    ("train.reinforce.warmup=5", "train.reinforce.weight_warmup", 5),
    ("train.reinforce.samples=2", "train.reinforce.location_samples", 2),
    ("data.captions_file=c.jsonl", "data.folder.captions_file", "c.jsonl"),
    ("data.split_share=0.1", "data.folder.split_share", 0.1),
    ("data.val_images=val", "data.coco_official.val_images", "val"),
])
def test_a_renamed_setting_in_a_file_or_an_override_still_works_and_says_its_new_name(old, new, value, tmp_path):
    """The old names are aliases (README lists them): a run configured before the rename trains as it
    did, and is told the new name once."""
    key, text = old.split("=")
    *sections, leaf = key.split(".")
    nested = "".join(f"{'  ' * depth}{section}:\n" for depth, section in enumerate(sections))
    path = write(tmp_path / "old.yaml", f"{nested}{'  ' * len(sections)}{leaf}: {text}\n")
    owner = owner_of(new)
    for where, load in ((str(path), lambda: load_config(path, owner)),
                        (f"override '{old}'", lambda: load_config(None, [*owner, old]))):
        with pytest.warns(FutureWarning) as caught:
            config = load()
        assert [str(w.message) for w in caught] == [f"{where}: '{key}' is now '{new}' (the old name still works)"]
        setting = config
        for part in new.split("."):
            setting = getattr(setting, part)
        assert setting == value
    with pytest.warns(FutureWarning), pytest.raises(ConfigError, match="location_samples must be at least 1"):
        load_config(None, ["train.reinforce.samples=0"])  # checked as the setting it names


@pytest.mark.parametrize("old, new", [
    ("train.samples=2", "train.reinforce.location_samples"),  # format 1's flat keys, renamed twice since
    ("train.reinforce_warmup=5", "train.reinforce.weight_warmup"),
])
def test_a_format1_key_renamed_twice_is_refused_with_the_name_it_has_now(old, new):
    with pytest.raises(ConfigError, match=rf"override '{old}': '{old.split('=')[0]}' is now '{new}' "):
        load_config(None, [old])


def test_every_renamed_setting_stays_in_its_section_as_the_alias_reader_needs():
    """A file's old name is set where it lives now, below the section that named it (loading._merge):
    a rename across sections would land elsewhere."""
    from captioning.config import MOVED

    for old, new in MOVED.items():
        assert new.startswith(old.rsplit(".", 1)[0] + "."), (old, new)


@pytest.mark.parametrize("text, old, new", [
    ("train:\n  reinforce:\n    warmup: 5\n    weight_warmup: 3\n", "train.reinforce.warmup",
     "train.reinforce.weight_warmup"),
    ("data:\n  captions_file: a.csv\n  folder:\n    captions_file: b.csv\n", "data.captions_file",
     "data.folder.captions_file"),
])
def test_a_section_naming_a_setting_by_its_old_and_new_name_is_refused_naming_both(tmp_path, text, old, new):
    path = write(tmp_path / "both.yaml", text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == f"{path}: '{old}' and '{new}' name one setting (the first is its old name); keep one"


def test_a_dotted_key_in_a_file_is_one_line_naming_its_nested_form(tmp_path, recwarn):
    path = write(tmp_path / "dotted.yaml", "data.split_seed: 3\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == (f"{path}: 'data.split_seed': a file nests its settings (data: {{folder: "
                                 "{split_seed: ...}}); key.sub=value is how an override names one")
    assert not recwarn.list  # not warned about as an alias first


@pytest.mark.parametrize("override, guess", [
    ("train.beam_size=3", "decode.beam_size"),  # in another section, though train.batch_size is spelt close
    ("beam_size=3", "decode.beam_size"),
    ("decode.max_len=3", "decode.max_length"),
    ("data.cache=x", "data.cache_root"),
])
def test_did_you_mean_looks_in_every_section(override, guess):
    with pytest.raises(ConfigError, match=rf"did you mean '{guess}'\?"):
        load_config(None, [override])


def test_the_readme_says_which_old_names_are_aliases_and_which_are_refused():
    """Each old name the README lists as an alias reads with a warning, every alias is listed, and the
    format-1 names it says are refused are."""
    import re
    import warnings

    from captioning.config import MOVED, RENAMED

    text = " ".join((REPO / "README.md").read_text().split())
    paragraph = text[text.index("Settings renamed since checkpoint format 2"):text.index("as it was trained.")]
    named = set(re.findall(r"`([a-z_.]+)`", paragraph))
    leaves = {old.rsplit(".", 1)[-1] for old in MOVED}
    assert {old for old in MOVED if old in named or old.rsplit(".", 1)[-1] in named} == set(MOVED), named
    assert leaves <= {name.rsplit(".", 1)[-1] for name in named}
    for old in MOVED:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            value = {"data.split_share": 0.1, "data.allow_outside_images": "true"}.get(
                old, 1 if "reinforce" in old or "seed" in old else "x")
            load_config(None, [*owner_of(MOVED[old]), f"{old}={value}"])
        assert any("(the old name still works)" in str(w.message) for w in caught), old
    assert "The flat names of format 1" in paragraph and "are refused in a file or an override" in paragraph
    for old in RENAMED:
        with pytest.raises(ConfigError, match="is now"):
            load_config(None, [f"{old}=1"])


def test_a_section_from_a_base_config_that_its_owner_would_not_read_says_what_to_set() -> None:
    """A base config's values cannot be removed, only given again: "remove it" left a run from
    shapes_hard.yaml under SCST with no way out the message named."""
    hard = REPO / "configs" / "shapes_hard.yaml"
    said = (f"{hard}: train.reinforce applies only with model.attention=hard and train.objective=xe, "
            "not train.objective=scst: set train.reinforce.weight_warmup=0 or choose its owner")
    with pytest.raises(ConfigError, match=f"^{re.escape(said)}$"):
        load_config(hard, ["train.objective=scst"])
    assert load_config(hard, ["train.objective=scst", "train.reinforce.weight_warmup=0"])
    with pytest.raises(ConfigError, match=re.escape("not model.score=additive: set model.local.sigma=null or choose")):
        load_config(None, ["model.local.sigma=2.0"])
    load_config(None, ["model.local.sigma=2.0", "model.local.sigma=null"])
