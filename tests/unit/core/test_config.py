"""One strict config layer: every params.yaml section is parsed by a typed Section whose defaults
equal params.yaml, and bad values fail with ``section.key``, the value and the fix."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from pipeline.core.errors import BertraceError
from tests.conftest import REPO


def _sections():
    from pipeline.checks.validate import ValidateConfig
    from pipeline.core.arithmetic import ComputeConfig
    from pipeline.data.clean import CleanConfig
    from pipeline.data.download import DownloadConfig
    from pipeline.data.examples import ExamplesConfig
    from pipeline.data.tokenizer_training import TokenizerConfig
    from pipeline.evaluate.report import EvaluateConfig
    from pipeline.finetune.loop import FinetuneConfig
    from pipeline.pretrain.config import PretrainConfig
    from pipeline.reports.learning_curve import LearningCurveConfig

    return {
        "download": DownloadConfig,
        "clean": CleanConfig,
        "tokenizer": TokenizerConfig,
        "examples": ExamplesConfig,
        "validate": ValidateConfig,
        "pretrain": PretrainConfig,
        "finetune": FinetuneConfig,
        "evaluate": EvaluateConfig,
        "compute": ComputeConfig,
        "learning_curve": LearningCurveConfig,
    }


PARAMS = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    "section",
    [
        "download",
        "clean",
        "tokenizer",
        "examples",
        "validate",
        "compute",
        "pretrain",
        "finetune",
        "evaluate",
        "learning_curve",
    ],
)
def test_code_defaults_equal_params_yaml(section):
    """Deleting a line of params.yaml must not change the run: the code's default is the same value."""
    cls = _sections()[section]
    from_file = cls.from_params(PARAMS[section]).to_dict()
    defaults = cls.from_params({}).to_dict()
    differ = {k: (from_file[k], defaults.get(k)) for k in from_file if from_file[k] != defaults.get(k)}
    assert not differ, f"params.yaml {section} vs code defaults (file, code): {differ}"
    assert set(PARAMS[section]) == set(from_file), "params.yaml should list every key of the section"


@pytest.mark.parametrize(
    "section, key, value, message",
    [
        ("clean", "min_chars", "x", "clean.min_chars = 'x': must be an integer"),
        ("clean", "valid_fraction", 1.5, "clean.valid_fraction = 1.5: must be < 1"),
        ("tokenizer", "vocab_size", "16k", "tokenizer.vocab_size = '16k': must be an integer"),
        ("tokenizer", "lowercase", "false", "tokenizer.lowercase = 'false': must be true or false (no quotes)"),
        ("tokenizer", "min_frequency", True, "tokenizer.min_frequency = True: must be an integer, not true/false"),
        ("evaluate", "batch_size", 0, "evaluate.batch_size = 0: must be >= 1"),
        ("evaluate", "splits", ["dev"], "evaluate.splits.0 = 'dev': input should be 'train', 'validation' or 'test'"),
        ("finetune", "seeds", [], "finetune.seeds = []: list should have at least 1 item"),
        ("download", "source", "ftp", "download.source = 'ftp': input should be 'hub' or 'local'"),
        ("validate", "nsp_tolerance", "wide", "validate.nsp_tolerance = 'wide': must be a number"),
    ],
)
def test_wrong_types_name_the_key_the_value_and_the_fix(section, key, value, message):
    cls = _sections()[section]
    with pytest.raises(BertraceError) as e:
        cls.from_params({**PARAMS[section], key: value})
    assert message in str(e.value) and "fix it in params.yaml" in str(e.value)


def test_unknown_keys_list_the_valid_ones():
    from pipeline.data.tokenizer_training import TokenizerConfig

    with pytest.raises(
        BertraceError,
        match=r"tokenizer.vocab: unknown key; valid keys: limit_alphabet, lowercase, "
        r"min_frequency, sample_bytes, seed, strip_accents, vocab_size, warn_chars_altered, workers",
    ):
        TokenizerConfig.from_params({"vocab": 100})


def test_yaml_numbers_without_a_dot_and_single_seeds_are_read_as_meant():
    from pipeline.finetune.loop import FinetuneConfig

    cfg = FinetuneConfig.from_params(yaml.safe_load("lr: 5e-5\nseeds: 0\nepochs: 2.0"))  # YAML 1.1: '5e-5' is a str
    assert (cfg.lr, cfg.seeds, cfg.epochs) == (5e-5, [0], 2)  # seeds: 0 is seed 0 (it used to run seed 42)


def test_a_bad_param_stops_the_stage_with_one_line_and_exit_2(tmp_path):
    params = {**PARAMS, "clean": {**PARAMS["clean"], "min_chars": "x"}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO), "BERTRACE_NO_MLFLOW": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "stages.clean"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "params.yaml: clean.min_chars = 'x': must be an integer; fix it in params.yaml" in out
    assert "Traceback" not in out
