"""pipeline.lineage.chain: the provenance chain a checkpoint embeds, completed only by records linked by hash."""

from __future__ import annotations

from pipeline.lineage.chain import provenance_chain
from tests.support.chain import fake_chain


def test_provenance_chain_walks_the_embedded_records():
    chain = provenance_chain(fake_chain(), "finetune")
    assert [e["stage"] for e in chain] == ["finetune", "pretrain", "examples", "tokenizer", "clean", "download"]
    by = {e["stage"]: e for e in chain}
    assert by["pretrain"]["hashes"]["examples_manifest_sha256"] == "9" * 64
    assert by["finetune"]["hashes"]["task_files sst2/dev.tsv"] == "5" * 64
    assert by["download"]["hashes"]["output data/raw"] == "b" * 64
    assert all(e["source"] == "checkpoint" for e in chain)
    # data and params only: the commits and times fake_chain's records carry (as older checkpoints do) are not
    assert all(set(e) == {"stage", "params_hash", "hashes", "source"} for e in chain)


def test_provenance_chain_is_completed_only_by_records_linked_by_hash():
    record = fake_chain()
    examples = record["pretrain"]["upstream"].pop("examples")  # a checkpoint that embeds no upstream
    unrelated = {**examples, "outputs": {"data/examples/manifest.json": "e" * 64}}
    assert [e["stage"] for e in provenance_chain(record, records={"examples": unrelated})] == ["finetune", "pretrain"]
    chain = provenance_chain(record, records={"examples": examples, "validate": {"stage": "validate", "outputs": {}}})
    assert [e["stage"] for e in chain] == ["finetune", "pretrain", "examples", "tokenizer", "clean", "download"]
    assert {e["stage"]: e["source"] for e in chain}["examples"] == "linked by examples_manifest_sha256"
