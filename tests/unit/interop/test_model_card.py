"""The model card of an export: Hub front matter, data, recipe, metrics with the seed, provenance,
limits; `bertrace attest` fills in its attestation line."""

from __future__ import annotations

import yaml

from pipeline.interop.model_card import note_attestation, render, write_card

INFO = {
    "kind": "classifier",
    "architecture": "BertForSequenceClassification",
    "source_checkpoint": "data/finetune/model.pt",
    "source_sha256": "ab" * 32,
    "task": {"type": "classification", "source": {"type": "hub", "dataset": "stanfordnlp/sst2"}},
    "provenance": {
        "stage": "finetune",
        "params": {"lr": 2e-4, "epochs": 1, "seeds": [0, 1, 2], "task": {"type": "classification"}},
        "upstream": {
            "pretrain": {
                "stage": "pretrain",
                "params": {"max_steps": 8000, "objective": "mlm_nsp"},
                "upstream": {
                    "download": {
                        "stage": "download",
                        "params": {"source": "hub", "hub": {"dataset": "stanfordnlp/imdb"}},
                    }
                },
            }
        },
    },
}
CKPT = {
    "architecture": "bert",
    "seed": 3,
    "metrics": {"validation_accuracy": 0.8463, "validation_loss": 0.3656},
    "model_config": {
        "vocab_size": 16000,
        "hidden_size": 128,
        "num_layers": 2,
        "num_heads": 2,
        "intermediate_size": 512,
    },
}


def test_card_front_matter_data_recipe_metrics_and_limits():
    text = render(INFO, CKPT)
    front = yaml.safe_load(text.split("---\n")[1])
    assert front == {
        "library_name": "transformers",
        "pipeline_tag": "text-classification",
        "tags": ["bertrace", "bert"],
        "datasets": ["stanfordnlp/sst2"],
    }
    assert "Pre-training corpus: `hub stanfordnlp/imdb @ main`; WordPiece vocabulary of 16000 pieces" in text
    assert '"max_steps": 8000' in text and '"lr": 0.0002' in text and "task" not in text.split("Fine-tuning:")[1][:80]
    assert "| validation_accuracy | 0.8463 |" in text and "this checkpoint's seed: 3" in text
    assert "sha256 `" + "ab" * 32 + "`" in text and "Attestation: none yet" in text
    assert "demonstration-size model (hidden size 128)" in text
    big = render(INFO, {**CKPT, "model_config": {**CKPT["model_config"], "hidden_size": 768}})
    assert "demonstration-size" not in big


def test_attest_fills_in_the_attestation_line(tmp_path):
    write_card(tmp_path, INFO, CKPT)
    before = (tmp_path / "README.md").read_text()
    assert note_attestation(tmp_path, "cd" * 32) == tmp_path / "README.md"
    after = (tmp_path / "README.md").read_text()
    assert "sha256 `" + "cd" * 32 + "`" in after and "none yet" not in after
    assert [a for a, b in zip(before.splitlines(), after.splitlines()) if a != b] == [
        line for line in before.splitlines() if line.startswith("- Attestation:")
    ]
    assert note_attestation(tmp_path / "nothing", "cd" * 32) is None
