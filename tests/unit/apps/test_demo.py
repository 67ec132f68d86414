"""``bertrace demo``: the page's outputs per model kind, the install hint without Gradio, and the
page itself served by the CLI and driven in headless Chromium (type a sentence, read the label
probabilities and the trace summary).

Also a script for the README's picture:
``python tests/unit/apps/test_demo.py --model data/finetune/model.pt --out docs/demo.png``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
if str(REPO) not in sys.path:  # run as a script
    sys.path.insert(0, str(REPO))

from pipeline.core.errors import BertraceError  # noqa: E402
from tests.support.chain import make_finetuned  # noqa: E402

SENTENCE = "a gripping , funny film"


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


def chromium() -> tuple[str | None, str | None]:
    """(browser, chromedriver) paths of Debian's chromium / chromium-driver, or Nones."""
    browser = next(
        (shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None
    )
    return browser, shutil.which("chromedriver")


def browser_skip_reason() -> str | None:
    if not _has("gradio"):
        return "gradio not installed (pip install -e '.[demo]')"
    if not _has("selenium"):
        return "selenium not installed (pip install -e '.[test]')"
    browser, driver = chromium()
    if not browser or not driver:
        return "no headless Chromium (Debian: apt-get install chromium chromium-driver)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------
# Serving and driving the page (shared by the test and the screenshot script)


def start_demo(model: Path, port: int, cwd: Path, timeout: float = 120.0) -> subprocess.Popen:
    """``bertrace demo --model MODEL --port PORT`` in a subprocess, once the page answers."""
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stages.cli", "demo", "--model", str(model), "--port", str(port)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"bertrace demo exited with {proc.returncode}:\n{proc.stdout.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.5)
    stop(proc)
    raise AssertionError(f"bertrace demo did not answer on port {port} within {timeout:.0f} s")


def stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    try:
        out, _ = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


def open_browser(width: int = 1280, height: int = 820):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = chromium()
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={width},{height}",
        "--hide-scrollbars",
    ):
        opts.add_argument(arg)
    return webdriver.Chrome(options=opts, service=Service(executable_path=driver))


def classify_in_page(driver, url: str, text: str, timeout: float = 60.0) -> tuple[dict[str, float], str]:
    """Type ``text``, press the button; ``({label: probability}, trace text)`` as the page shows them.

    The probabilities are read from the ``<meter value=...>`` bars of Gradio's Label (full
    precision; the percentages beside them are rounded)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    wait = WebDriverWait(driver, timeout)
    box = wait.until(EC.element_to_be_clickable((By.CSS_SELECTOR, "#demo-input textarea")))
    box.clear()
    box.send_keys(text)
    driver.find_element(By.CSS_SELECTOR, "#demo-run").click()
    meters = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#demo-output meter") or False)
    probs = {m.get_attribute("aria-label"): float(m.get_attribute("value")) for m in meters}
    trace = driver.find_element(By.CSS_SELECTOR, "#demo-trace").text
    return probs, trace


# --------------------------------------------------------------------------------------------
# Tests


@pytest.fixture(scope="module")
def model_pt(tmp_path_factory) -> Path:
    return make_finetuned(tmp_path_factory.mktemp("demo") / "data" / "finetune")


def test_outputs_match_the_classifier_and_trace_summary_names_the_chain(model_pt):
    from pipeline.apps import demo
    from pipeline.evaluate.inference import Classifier

    m = demo.load_model(model_pt)
    assert m.kind == "classification"
    probs = demo.classify(m, SENTENCE)
    expected = Classifier.load(model_pt).predict([SENTENCE])[0]["probabilities"]
    assert list(probs) == ["negative", "positive"]
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-9)
    assert np.allclose([probs[k] for k in expected], list(expected.values()), atol=1e-6)
    assert set(demo.RENDERERS) == set(demo.KINDS)

    summary = demo.trace_summary(model_pt)
    for stage in ("finetune", "pretrain", "examples", "tokenizer", "clean", "download"):
        assert f"| {stage} | `" in summary
    assert "| finetune | `6666666666` |" in summary  # tests/unit/evaluate/test_evaluate.py fake_chain's commits
    assert "| download | `1111111111` |" in summary
    assert "reproduce: `git checkout 666666666666 && dvc repro`" in summary
    assert "model.pt" in summary.splitlines()[0]


def test_a_sentence_pair_model_gets_two_text_boxes(tmp_path):
    from pipeline.apps import demo

    m = demo.load_model(
        make_finetuned(
            tmp_path / "pair",
            text_columns=("sentence1", "sentence2"),
            label_names=("entailment", "neutral", "contradiction"),
        )
    )
    probs = demo.classify(m, "a man is playing", "nobody plays")
    assert list(probs) == ["entailment", "neutral", "contradiction"]
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-9)
    assert probs == pytest.approx(m.model.predict([("a man is playing", "nobody plays")])[0]["probabilities"])
    if _has("gradio"):
        labels = {c.get("props", {}).get("label") for c in demo.build_app(m, "trace").get_config_file()["components"]}
        assert {"sentence1", "sentence2"} <= labels


def test_trace_summary_of_a_checkpoint_without_provenance_says_so(tmp_path):
    from pipeline.apps import demo

    bare = make_finetuned(tmp_path / "ft", provenance={})
    assert demo.trace_summary(bare).startswith("**No trace**")
    assert "no provenance record" in demo.trace_summary(bare)


def test_a_masked_lm_checkpoint_is_a_clear_error(tmp_path):
    import torch

    from pipeline.apps import demo
    from pipeline.models.bert import BertForPreTraining
    from tests.support.chain import tiny_config

    config = tiny_config(300)
    path = tmp_path / "best.pt"
    torch.save({"model": BertForPreTraining(config).state_dict(), "model_config": config.to_dict()}, path)
    with pytest.raises(BertraceError, match="masked-LM pre-training checkpoint"):
        demo.load_model(path)


def test_without_gradio_the_command_says_how_to_install(model_pt, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "gradio", None)  # import gradio -> ImportError
    from stages.cli import demo as demo_stage

    with pytest.raises(BertraceError, match=r"pip install -e '\.\[demo\]'"):
        demo_stage.main(["--model", str(model_pt)])
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['gradio'] = None; "
            "from stages.cli.main import main; main(['demo', '--model', sys.argv[1]])",
            str(model_pt),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "pip install -e '.[demo]'" in out.stderr


def _save_head(out_dir: Path, head, label_names: list[str], task_type: str, num_labels: int) -> Path:
    """A tiny fine-tuned checkpoint of ``task_type`` with a random ``head`` model (SPEC format)."""
    import torch
    from tokenizers import Tokenizer

    from pipeline.core.io import sha256_file
    from pipeline.models.checkpoint import save_finetuned
    from tests.support.chain import fake_chain, tiny_config, train_tiny_tokenizer

    tok = train_tiny_tokenizer(out_dir / "tokenizer.json")
    config = tiny_config(Tokenizer.from_file(str(tok)).get_vocab_size())
    torch.manual_seed(0)
    model = head(config, num_labels)
    return save_finetuned(
        out_dir / "model.pt",
        state_dict=model.state_dict(),
        model_config=config.to_dict(),
        label_names=label_names,
        num_labels=num_labels,
        task={"type": task_type, "text_columns": ["sentence"], "max_len": 32, "truncation": "head"},
        tokenizer_sha256=sha256_file(tok),
        mode="full",
        seed=0,
        metrics={},
        provenance=fake_chain(),
    )


def test_each_kind_of_model_gets_its_output(tmp_path):
    """Regression: a score; NER: the text with entity spans; causal LM: text growing as it streams."""
    import torch

    from pipeline.apps import demo
    from pipeline.models.bert import BertForSequenceClassification

    reg = demo.load_model(_save_head(tmp_path / "reg", BertForSequenceClassification, [], "regression", 1))
    assert reg.kind == "regression"
    assert isinstance(demo.score(reg, SENTENCE), float)
    assert demo.score(reg, SENTENCE) == pytest.approx(reg.model.predict([SENTENCE])[0]["score"])

    try:
        from pipeline.models.bert import BertForTokenClassification
    except ImportError:
        BertForTokenClassification = None
    if BertForTokenClassification is not None:
        labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
        ner = demo.load_model(
            _save_head(tmp_path / "ner", BertForTokenClassification, labels, "token_classification", len(labels))
        )
        assert ner.kind == "token_classification"
        value = demo.tag(ner, "alice moved to paris")
        assert value["text"] == "alice moved to paris"
        for e in value["entities"]:  # character spans of the text, typed without the B-/I- prefix
            assert 0 <= e["start"] < e["end"] <= len(value["text"]) and e["entity"] in ("PER", "LOC")

    try:
        from pipeline.models.gpt import GPT
    except ImportError:
        GPT = None
    if GPT is not None:
        from tokenizers import Tokenizer

        from pipeline.core.io import sha256_file
        from tests.support.chain import tiny_config, train_tiny_tokenizer

        tok = train_tiny_tokenizer(tmp_path / "lm" / "tokenizer.json")
        config = tiny_config(Tokenizer.from_file(str(tok)).get_vocab_size())
        torch.manual_seed(0)
        torch.save(
            {"model": GPT(config).state_dict(), "model_config": config.to_dict(), "tokenizer_sha256": sha256_file(tok)},
            tmp_path / "lm" / "best.pt",
        )
        lm = demo.load_model(tmp_path / "lm" / "best.pt")
        assert lm.kind == "causal_lm"
        texts = list(demo.stream(lm, "the film", max_new_tokens=8, temperature=1.0, seed=3))
        assert len(texts) >= 2 and texts[-1].startswith("the film") and len(texts[-1]) > len("the film")
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # each update extends the last
        assert texts == list(demo.stream(lm, "the film", max_new_tokens=8, temperature=1.0, seed=3))  # seeded

    if _has("gradio"):  # every kind's page builds (inputs, button and output with the shared ids)
        for m in [reg] + ([ner] if BertForTokenClassification else []) + ([lm] if GPT else []):
            app = demo.build_app(m, "trace")
            ids = {c.get("props", {}).get("elem_id") for c in app.get_config_file()["components"]}
            assert {"demo-input", "demo-run", "demo-output", "demo-trace"} <= ids, m.kind


@pytest.mark.slow
@pytest.mark.skipif(browser_skip_reason() is not None, reason=str(browser_skip_reason()))
def test_demo_page_in_headless_chromium(model_pt, tmp_path):
    """`bertrace demo` on a free port; Chromium types a sentence and reads the page."""
    from pipeline.evaluate.inference import Classifier

    port = free_port()
    proc = start_demo(model_pt, port, cwd=tmp_path)
    driver = None
    try:
        driver = open_browser()
        probs, trace = classify_in_page(driver, f"http://127.0.0.1:{port}/", SENTENCE)
        shot = tmp_path / "demo.png"
        driver.save_screenshot(str(shot))
    finally:
        if driver is not None:
            driver.quit()
        log = stop(proc)
    expected = Classifier.load(model_pt).predict([SENTENCE])[0]["probabilities"]
    assert set(probs) == {"negative", "positive"}, log
    assert sum(probs.values()) == pytest.approx(1.0, abs=1e-6)
    assert probs == pytest.approx(expected, abs=1e-6)
    assert "Trace" in trace and "finetune" in trace and "pretrain" in trace and "666666666666" in trace
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# --------------------------------------------------------------------------------------------
# README picture


def screenshot(model: Path, out: Path, text: str, cwd: Path) -> dict[str, float]:
    port = free_port()
    proc = start_demo(model, port, cwd=cwd)  # model: relative to cwd, as a user types it
    try:
        driver = open_browser()
        try:
            probs, _ = classify_in_page(driver, f"http://127.0.0.1:{port}/", text)
            time.sleep(1.0)  # the bars' transition
            out.parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(str(out))
        finally:
            driver.quit()
    finally:
        stop(proc)
    return probs


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="screenshot of `bertrace demo` (README)")
    ap.add_argument("--model", type=Path, default=Path("data/finetune/model.pt"))
    ap.add_argument("--out", type=Path, default=Path("docs/demo.png"))
    ap.add_argument("--text", default="a gripping , funny and moving film")
    ap.add_argument("--cwd", type=Path, default=Path("."), help="repository the trace resolves from")
    args = ap.parse_args()
    reason = browser_skip_reason()
    if reason:
        sys.exit(f"error: {reason}")
    print(screenshot(args.model, args.out.resolve(), args.text, args.cwd), "->", args.out)
