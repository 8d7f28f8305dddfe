"""``--space`` checked before Ray starts (``tune.spaces.validate_space``, ``tune.sweep``'s ``--space`` type): a
range over a whole-number setting, values of another type than the setting's, a knob naming a section and text that
is not JSON each end in one line naming the input and the fix, never a traceback or trials failing inside Ray."""

from __future__ import annotations

import pytest

from ropim.errors import ConfigError
from ropim.train.pretrain.config import PretrainConfig
from tune.spaces import validate_space
from tune.sweep import config_from_args, main

BASE = PretrainConfig().to_dict()


def test_valid_spaces_of_every_setting_type_pass():
    spaces = [({"rho": {"uniform": [0.05, 0.6]}, "base_lr": {"loguniform": [5e-4, 2e-2]},
                "epochs": {"choice": [2, 4, 8]}, "warmup_epochs": {"uniform": [0, 2]}}, "tpe"),
              ({"rho": {"grid": [0.07, 0.14]}, "seed": {"grid": [0, 1]}, "model.depth": {"grid": [None, 2]}}, "grid"),
              ({"clip_grad": {"choice": [None, 1, 5.0]}, "precision": {"choice": ["fp32", "bf16"]},
                "compile": {"choice": [True, False]}, "weight_decay": {"choice": [0, 0.05]}}, "tpe")]
    for space, search in spaces:
        assert validate_space(space, search, BASE) is space


def test_a_range_over_a_whole_number_setting_is_refused_before_ray():
    """Before: only the range's ends were tried, so every trial drew epochs=2.09… and failed inside Ray."""
    cases = [({"epochs": {"uniform": [1, 3]}}, r"space knob 'epochs': uniform draws fractions, but epochs must be an "
                                               r"integer; use choice .*\{\"epochs\": \{\"choice\": \[1, 2, 3\]\}\}"),
             ({"model.depth": {"loguniform": [1, 8]}}, "model.depth must be an integer or null; use choice"),
             ({"seed": {"uniform": [0, 100]}}, r"\{\"seed\": \{\"choice\": \[0, 33, 67, 100\]\}\}"),
             ({"compile": {"uniform": [0, 1]}}, "compile must be true or false; use choice .* over its values")]
    for space, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            validate_space(space, "tpe", BASE)
    cfg = config_from_args(["--search", "tpe", "--space", '{"epochs": {"uniform": [1, 3]}}', "--num_samples", "1",
                            "--num_workers", "1", "--no-register"])
    with pytest.raises(ConfigError, match="space knob 'epochs': uniform draws fractions"):
        cfg.validate()


def test_values_of_another_type_or_a_section_are_refused_in_one_line(tmp_path, monkeypatch):
    """Before: TypeError tracebacks ('<' between str and float; 'int' object is not a mapping)."""
    cases = [({"rho": {"grid": [0.1, "abc"]}}, "grid", r"grid value 'abc' is not a number, which model.rho must be"),
             ({"base_lr": {"uniform": [1, "x"]}}, "tpe", r"uniform needs \[low, high\], two numbers .*got \[1, 'x'\]"),
             ({"model": {"grid": [1]}}, "grid", "'model': a section of the pretraining config, not one setting; "
                                                "name one of its settings, e.g. model.arch"),
             ({"epochs": {"choice": [2, 4.5]}}, "tpe", "choice value 4.5 is not an integer, which epochs must be"),
             ({"epochs": {"choice": [2, True]}}, "tpe", "choice value True is not an integer"),
             ({"precision": {"choice": ["fp32", 3]}}, "tpe", "choice value 3 is not a string"),
             ({"clip_grad": {"choice": [None, "a"]}}, "tpe", "choice value 'a' is not a number or null")]
    for space, search, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            validate_space(space, search, BASE)
    monkeypatch.chdir(tmp_path)
    commands = [(['{"rho": {"grid": [0.1, "abc"]}}'], "grid value 'abc' is not a number"),
                (['{"base_lr": {"uniform": [1, "x"]}}', "--search", "tpe"], r"uniform needs \[low, high\]"),
                (['{"model": {"grid": [1]}}'], "'model': a section of the pretraining config"),
                (['{"epochs": {"grid": [1, "x"]}}'], "grid value 'x' is not an integer")]  # before: in max_epochs
    for argv, msg in commands:
        with pytest.raises(SystemExit, match=f"^ropim sweep: space knob .*{msg}"):
            main(["--space", *argv, "--no-register"])
    assert not list(tmp_path.iterdir())  # nothing started


def test_space_that_is_not_valid_json_says_so():
    """Before: jsonargparse's 'Does not validate against any of the Union subtypes … Expected a <class 'dict'>'."""
    with pytest.raises(SystemExit, match=r"^ropim sweep: argument --space: not valid JSON \(Expecting ',' delimiter: "
                                         r"line 1 column 28 \(char 27\)\); e\.g\. '\{\"rho\": \{\"grid\": \[0\.14, "
                                         r"0\.25\]\}\}' \(see `ropim sweep --help`\)$"):
        main(["--space", '{"rho": {"grid": [0.1, 0.3]'])
    with pytest.raises(SystemExit, match=r"argument --space: \[1\] is not a JSON object of knobs; e\.g\. "):
        main(["--space", "[1]"])
    assert config_from_args(["--space", '{"rho": {"grid": [0.1, 0.3]}}']).space == {"rho": {"grid": [0.1, 0.3]}}
    assert config_from_args(["--space", "{rho: {grid: [0.1]}}"]).space == {"rho": {"grid": [0.1]}}  # YAML flow too
    assert config_from_args(["--preset", "tpe"]).space["rho"] == {"uniform": [0.05, 0.6]}  # a preset's mapping
