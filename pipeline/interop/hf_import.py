"""Published checkpoints in: a Hugging Face model directory or hub snapshot -> bertrace's checkpoint.

``finetune.checkpoint`` and ``pretrain.init`` name one of

* our own checkpoint (``data/pretrain/best.pt``): not this module;
* a Hugging Face **model directory** (``save_pretrained`` / ``hf download --local-dir``):
  ``config.json``, weights (``model.safetensors``, ``pytorch_model.bin`` or a sharded index) and the
  tokenizer (``vocab.txt`` + ``tokenizer_config.json``, or ``tokenizer.json``);
* a **hub pointer file** (``.yaml``): ``hub: google/bert_uncased_L-2_H-128_A-2`` and
  ``revision: main`` (branch, tag or commit sha). The snapshot comes through
  ``huggingface_hub.snapshot_download`` (its cache, ``HF_HOME``); the commit it resolved to is
  recorded. A file, not an inline id, because DVC tracks ``finetune.checkpoint`` as a dependency
  path: editing the pointer (or the model directory) reruns the stage. The Python API also takes
  ``hf:<id>[@<revision>]``.

:func:`import_checkpoint` reads ``config.json`` (``model_type`` bert; electra when
``pipeline.interop.hf`` has an ELECTRA converter), maps the weights onto :class:`BertForPreTraining` with
the name maps of ``pipeline.interop.hf`` (the inverse of ``bertrace export --hf``) and returns the dict
the finetune stage loads from a pre-training checkpoint: ``{"model", "model_config",
"provenance"}``, plus ``tokenizer_json``: the checkpoint's vocabulary and casing rebuilt as
bertrace's tokenizer (``pipeline.data.tokenizer.build_tokenizer``: Google's BasicTokenizer + WordPiece).

Special ids. bertrace's files fix ``[PAD]=0 [UNK]=1 [CLS]=2 [SEP]=3 [MASK]=4``
(``pipeline.core.formats``); Google's vocabularies have ``[PAD]=0 [UNK]=100 [CLS]=101 [SEP]=102
[MASK]=103``. The import moves the five special tokens to the front and shifts the others
(an id permutation applied to the vocabulary, the word-embedding rows and the MLM output bias
alike), so the model computes exactly what the original does on the same text (tested to 1e-5).

Weights the checkpoint lacks but bertrace's model has (the pooler of a ``BertForMaskedLM``
save, the MLM/NSP heads of a bare ``BertModel``) start from the usual random init (seed 0), as
``transformers`` does, and are listed in the provenance (``weights.initialized``); task heads
(``classifier.*``, ``qa_outputs.*``) are dropped and listed (``weights.dropped``). Any other
missing or unexpected key is an error naming the keys and the ``model_type``.

Provenance: a root record ``{"stage": "imported", "source", "revision", "resolved_revision",
"inputs": {file: sha256}}`` of every file read, so ``bertrace trace`` shows "imported from
<source>@<revision>" at the root of the chain and ``--verify`` rehashes the files.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path
from typing import Any

import torch

from pipeline.core.errors import BertraceError
from pipeline.core.formats import SPECIAL_TOKENS

FORMAT = "bertrace-imported-checkpoint"
HUB_PREFIX = "hf:"
POINTER_SUFFIXES = (".yaml", ".yml")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "tokenizer.json", "special_tokens_map.json")
# the files snapshot_download fetches: nothing else (no TF / Flax / ONNX weights)
HUB_PATTERNS = [
    "config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model.bin.index.json",
    *TOKENIZER_FILES,
]
# weights a checkpoint may lack: fresh init (seed 0) as transformers does; heads we drop
OPTIONAL_PREFIXES = ("bert.pooler.", "cls.")
DROPPED_PREFIXES = ("classifier.", "qa_outputs.")
_SHA = re.compile(r"^[0-9a-f]{40}$")
_FORM = (
    "a Hugging Face model directory (config.json, model.safetensors or pytorch_model.bin, vocab.txt) or a "
    "hub pointer file (name.yaml holding `hub: <org/name>` and `revision: <branch|tag|sha>`)"
)


# ---------------------------------------------------------------------------------------------
# Where the checkpoint is


def is_hf_source(spec: str | Path) -> bool:
    """Whether ``spec`` names a Hugging Face checkpoint (directory, pointer file or ``hf:`` id)
    rather than one of our ``.pt`` checkpoints."""
    text = str(spec)
    if text.startswith(HUB_PREFIX):
        return True
    path = Path(text)
    return (path.is_dir() and not any(path.glob("*.pt"))) or path.suffix in POINTER_SUFFIXES


def parse_source(spec: str | Path, *, param: str = "finetune.checkpoint") -> dict[str, Any]:
    """``{"kind": "directory", "path"}`` or ``{"kind": "hub", "repo_id", "revision", "pointer"}``."""
    text = str(spec)
    if text.startswith(HUB_PREFIX):
        repo_id, _, revision = text[len(HUB_PREFIX) :].partition("@")
        return _hub(repo_id, revision or "main", None, text, param)
    path = Path(text)
    if path.suffix in POINTER_SUFFIXES:
        import yaml

        if not path.is_file():
            raise BertraceError(
                f"{param}: {path}: hub pointer file not found; write it (`hub: <org/name>`, "
                "`revision: main`) or give " + _FORM
            )
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise BertraceError(
                f"{path}: not valid YAML ({e}); a hub pointer file holds `hub:` and `revision:`"
            ) from None
        if not isinstance(data, dict) or set(data) - {"hub", "revision"} or not data.get("hub"):
            raise BertraceError(
                f"{path}: a hub pointer file holds exactly `hub: <org/name>` and optionally "
                f"`revision: <branch|tag|sha>` (default main); found {data!r}"
            )
        revision = data.get("revision") or "main"
        if not isinstance(revision, str):  # an unquoted sha YAML reads as a number (1e5...): the wrong revision
            raise BertraceError(f'{path}: revision {revision!r} is not a string; quote it (revision: "{revision}")')
        return _hub(str(data["hub"]), revision, path, text, param)
    if not path.is_dir():
        raise BertraceError(f"{param}: {path}: not found; give our .pt checkpoint or " + _FORM)
    return {"kind": "directory", "path": path, "display": path.as_posix()}


def _hub(repo_id: str, revision: str, pointer: Path | None, text: str, param: str) -> dict[str, Any]:
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?", repo_id):
        raise BertraceError(f"{param}: {text}: {repo_id!r} is not a hub model id (org/name)")
    return {"kind": "hub", "repo_id": repo_id, "revision": revision, "pointer": pointer, "display": f"hf:{repo_id}"}


def fetch(source: dict[str, Any]) -> tuple[Path, str | None]:
    """The local directory of ``source`` and the hub commit it resolved to (None for a directory).

    Hub snapshots: ``huggingface_hub.snapshot_download`` (cached; offline it fails unless cached,
    and the error names the id and the local-directory way round)."""
    if source["kind"] == "directory":
        return source["path"], None
    from huggingface_hub import snapshot_download

    repo_id, revision = source["repo_id"], source["revision"]
    try:
        local = Path(snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS))
    except Exception as e:  # noqa: BLE001 - network, auth, missing repo/revision: all the user's to fix
        raise BertraceError(
            f"hub checkpoint {repo_id}@{revision}: download failed ({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
            f"check the id and revision, or without internet download it elsewhere "
            f"(`hf download {repo_id} --revision {revision} --local-dir DIR`), copy DIR here and set "
            "finetune.checkpoint (or pretrain.init) to that directory"
        ) from None
    return local, (local.name if _SHA.match(local.name) else None)


# ---------------------------------------------------------------------------------------------
# Reading files (each read once, hashed as read)


class _Reader:
    """Reads files of one directory, keeping the sha256 of every file read."""

    def __init__(self, root: Path):
        self.root, self.sha256 = root, {}

    def has(self, name: str) -> bool:
        return (self.root / name).is_file()

    def bytes(self, name: str) -> bytes:
        data = (self.root / name).read_bytes()
        self.sha256[(self.root / name).as_posix()] = hashlib.sha256(data).hexdigest()
        return data

    def json(self, name: str) -> Any:
        try:
            return json.loads(self.bytes(name).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise BertraceError(f"{self.root / name}: not valid JSON ({e})") from None


def _load_weights(reader: _Reader) -> dict[str, torch.Tensor]:
    """The state dict of ``model.safetensors`` / ``pytorch_model.bin`` or of the shards an index names."""
    files = next(([f] for f in WEIGHT_FILES if reader.has(f)), None)
    if files is None:
        index = next((f for f in INDEX_FILES if reader.has(f)), None)
        if index is None:
            raise BertraceError(
                f"{reader.root}: no weights ({', '.join(WEIGHT_FILES + INDEX_FILES)}); TensorFlow "
                "and Flax checkpoints are not read: convert them with transformers first"
            )
        files = sorted(set((reader.json(index).get("weight_map") or {}).values()))
    sd: dict[str, torch.Tensor] = {}
    for name in files:
        data = reader.bytes(name)
        if name.endswith(".safetensors"):
            from safetensors.torch import load as load_safetensors

            part = load_safetensors(data)
        else:
            try:
                part = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            except Exception as e:  # noqa: BLE001 - pickle errors come in many types
                raise BertraceError(
                    f"{reader.root / name}: not a loadable weights file ({type(e).__name__}: "
                    f"{str(e)[:200]}); re-save it with save_pretrained (safetensors)"
                ) from None
        sd.update(part)
    # TF-converted checkpoints name LayerNorm's parameters gamma / beta (transformers renames them on load too)
    rename = {".gamma": ".weight", ".beta": ".bias"}
    return {
        next((k[: -len(a)] + b for a, b in rename.items() if k.endswith(a)), k): (
            v.float() if v.is_floating_point() else v
        )
        for k, v in sd.items()
    }


# ---------------------------------------------------------------------------------------------
# Tokenizer


def _token(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def convert_tokenizer(reader: _Reader) -> tuple[Any, list[int], dict[str, Any]]:
    """``(tokenizer, perm, info)``: bertrace's tokenizer for the checkpoint's vocabulary; ``perm[new id]
    = original id`` (special tokens first, see the module docstring); ``info`` for the provenance.

    ``vocab.txt`` + ``tokenizer_config.json`` (``do_lower_case``, ``strip_accents``) when present,
    else a WordPiece ``tokenizer.json`` with a BERT normaliser."""
    from tokenizers import Tokenizer, models

    from pipeline.data.tokenizer import build_tokenizer, normalizer_settings

    root = reader.root
    cfg = reader.json("tokenizer_config.json") if reader.has("tokenizer_config.json") else {}
    wrong = {
        k: _token(cfg.get(k))
        for k, t in (
            ("pad_token", "[PAD]"),
            ("unk_token", "[UNK]"),
            ("cls_token", "[CLS]"),
            ("sep_token", "[SEP]"),
            ("mask_token", "[MASK]"),
        )
        if cfg.get(k) is not None and _token(cfg.get(k)) != t
    }
    if wrong:
        raise BertraceError(
            f"{root / 'tokenizer_config.json'}: special tokens {wrong} are not BERT's "
            f"{list(SPECIAL_TOKENS)}; only BERT-style WordPiece vocabularies can be imported"
        )
    if reader.has("vocab.txt"):
        vocab = reader.bytes("vocab.txt").decode("utf-8").split("\n")
        if vocab and vocab[-1] == "":
            vocab.pop()
        vocab = [t.rstrip("\r") for t in vocab]
        lowercase = bool(cfg.get("do_lower_case", True))
        strip = cfg.get("strip_accents")  # None: Google's rule (strip iff lowercase)
        origin = "vocab.txt"
    elif reader.has("tokenizer.json"):
        spec = reader.json("tokenizer.json")
        model = spec.get("model") or {}
        if model.get("type") != "WordPiece" or model.get("continuing_subword_prefix", "##") != "##":
            raise BertraceError(
                f"{root / 'tokenizer.json'}: a {model.get('type')} tokenizer; only BERT's WordPiece "
                "(## continuation) can be imported"
            )
        by_id = sorted(model.get("vocab", {}).items(), key=lambda kv: kv[1])
        if [i for _, i in by_id] != list(range(len(by_id))):
            raise BertraceError(f"{root / 'tokenizer.json'}: the vocabulary ids have gaps; cannot import it")
        vocab = [t for t, _ in by_id]
        settings = normalizer_settings(Tokenizer.from_str(json.dumps(spec)))
        if settings["strip_accents"] is None:
            raise BertraceError(
                f"{root / 'tokenizer.json'}: its normaliser is not BERT's (BertNormalizer); cannot import it"
            )
        lowercase = bool(cfg.get("do_lower_case", settings["lowercase"]))
        strip = cfg.get("strip_accents", settings["strip_accents"])
        origin = "tokenizer.json"
    else:
        raise BertraceError(
            f"{root}: no tokenizer (vocab.txt or tokenizer.json); a checkpoint is imported with "
            "the tokenizer it was trained with"
        )
    seen: dict[str, int] = {}
    for i, t in enumerate(vocab):
        if t in seen:
            raise BertraceError(f"{root / origin}: token {t!r} appears twice (ids {seen[t]} and {i}); cannot import")
        seen[t] = i
    absent = [t for t in SPECIAL_TOKENS if t not in seen]
    if absent:
        raise BertraceError(
            f"{root / origin}: lacks the special tokens {absent}; BERT's vocabularies have {list(SPECIAL_TOKENS)}"
        )
    front = [seen[t] for t in SPECIAL_TOKENS]
    perm = front + [i for i in range(len(vocab)) if i not in set(front)]
    tok = build_tokenizer(lowercase=lowercase, strip_accents=strip)
    tok.model = models.WordPiece(
        vocab={vocab[old]: new for new, old in enumerate(perm)},
        unk_token="[UNK]",
        continuing_subword_prefix="##",
        max_input_chars_per_word=100,
    )
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    info = {
        "from": origin,
        "vocab_size": len(vocab),
        "lowercase": lowercase,
        "strip_accents": strip if strip is None else bool(strip),
        "special_ids_moved": {t: [seen[t], i] for i, t in enumerate(SPECIAL_TOKENS) if seen[t] != i},
    }
    return tok, perm, info


# ---------------------------------------------------------------------------------------------
# Weights


def _model_type(config: dict[str, Any], where: Path) -> str:
    """``config.json``'s ``model_type``; Google's early uploads (``google/bert_uncased_L-2_H-128_A-2``)
    have none: then their ``architectures`` (``Bert*``), or the repository is taken as BERT, as
    ``transformers.AutoConfig`` does by the name."""
    from pipeline.interop import hf

    model_type = config.get("model_type")
    if model_type is None:
        archs = config.get("architectures") or []
        model_type = config["model_type"] = (
            "electra"
            if any(str(a).startswith("Electra") for a in archs)
            else "bert"
            if not archs or any(str(a).startswith("Bert") for a in archs)
            else None
        )
    supported = ["bert"] + (["electra"] if hasattr(hf, "electra_state_dict_from_hf") else [])
    if model_type not in supported:
        raise BertraceError(
            f"{where}: model_type {model_type!r} (architectures {config.get('architectures')}) "
            f"cannot be mapped onto bertrace's BERT; supported: {supported}"
        )
    unsupported = {
        k: config[k]
        for k, ok in (("position_embedding_type", "absolute"), ("is_decoder", False), ("add_cross_attention", False))
        if config.get(k, ok) != ok
    }
    if unsupported:
        raise BertraceError(
            f"{where}: {model_type} with {unsupported} cannot be mapped onto bertrace's BERT "
            "(absolute positions, encoder only)"
        )
    return model_type


def convert_weights(
    config: dict[str, Any], hf_sd: dict[str, torch.Tensor], perm: list[int], *, source: str
) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, Any]]:
    """``(state dict in BertForPreTraining names, model_config, weights info)`` for a BERT
    checkpoint's Hugging Face state dict (``BertForPreTraining``, ``BertForMaskedLM``, ``BertModel``,
    ``BertForSequenceClassification`` ... saves); ``perm`` reorders the vocabulary."""
    from pipeline.interop.hf import config_from_hf, hf_state_dict_names, load_hf_state_dict, to_hf_state_dict
    from pipeline.models.bert import BertForPreTraining

    model_type = config.get("model_type")
    bert_config = config_from_hf(config)
    if not any(k.startswith("bert.") for k in hf_sd) and any(k.startswith("embeddings.") for k in hf_sd):
        hf_sd = {f"bert.{k}": v for k, v in hf_sd.items()}  # a bare BertModel save
    dropped = sorted(k for k in hf_sd if k.startswith(DROPPED_PREFIXES))
    sd = {k: v for k, v in hf_sd.items() if not k.startswith(DROPPED_PREFIXES)}
    with torch.random.fork_rng(devices=[]):  # weights the checkpoint lacks: the usual init, seed 0, and the
        torch.manual_seed(0)  # caller's RNG state left as it was
        model = BertForPreTraining(bert_config)
    needed, ignorable = hf_state_dict_names(model)
    missing = [k for k in needed if k not in sd]
    required = [k for k in missing if not k.startswith(OPTIONAL_PREFIXES)]
    unexpected = sorted(set(sd) - set(needed) - ignorable)
    if required or unexpected:
        raise BertraceError(
            f"{source}: {model_type} checkpoint (architectures {config.get('architectures')}) does not map onto "
            f"bertrace's BertForPreTraining: missing {len(required)} keys {required[:8]}, unexpected "
            f"{len(unexpected)} keys {unexpected[:8]}; only BERT encoders (with or without the MLM/NSP heads) "
            "are supported"
        )
    decoder = sd.get("cls.predictions.decoder.weight")
    if decoder is not None and not torch.equal(decoder, sd["bert.embeddings.word_embeddings.weight"]):
        raise BertraceError(
            f"{source}: the MLM decoder is not tied to the word embeddings "
            "(tie_word_embeddings false); bertrace's BERT ties them"
        )
    fresh = to_hf_state_dict(model)
    load_hf_state_dict(model, {**sd, **{k: fresh[k] for k in missing}}, strict=False, source=source)
    out = {k: v.detach().clone() for k, v in model.state_dict().items()}
    n_tok = len(perm)
    if n_tok > bert_config.vocab_size:
        raise BertraceError(
            f"{source}: the tokenizer has {n_tok} tokens but the model's vocab_size is "
            f"{bert_config.vocab_size}; not the checkpoint's own tokenizer"
        )
    if perm != list(range(n_tok)):
        full = torch.tensor(perm + list(range(n_tok, bert_config.vocab_size)))
        for key in ("bert.embeddings.word.weight", "mlm.decoder.weight", "mlm.decoder.bias"):
            out[key] = out[key][full].clone()
        out["mlm.decoder.weight"] = out["bert.embeddings.word.weight"]  # tied: one tensor
    model_config = {**bert_config.to_dict(), "pad_id": 0}  # [PAD] is id 0 after the remap, whatever config.json says
    if n_tok < bert_config.vocab_size:
        model_config["tokenizer_vocab_size"] = n_tok
    info = {"initialized": sorted(missing), "dropped": dropped}
    return out, model_config, info


# ---------------------------------------------------------------------------------------------
# The import


def _portable_path(root: Path, spec: str | Path) -> str:
    """Where the files were read, without this machine's absolute paths (records travel between
    clones): relative to the working directory when inside it, else the spec as the params give it."""
    try:
        return Path(root).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(spec)


def import_checkpoint(spec: str | Path, *, param: str = "finetune.checkpoint") -> dict[str, Any]:
    """The checkpoint dict (``model``, ``model_config``, ``provenance``, ``tokenizer_json``) of a
    Hugging Face model directory, hub pointer file or ``hf:<id>[@<revision>]``."""
    from pipeline.interop import hf
    from pipeline.lineage.provenance import library_versions

    source = parse_source(spec, param=param)
    root, commit = fetch(source)
    reader = _Reader(root)
    if not reader.has("config.json"):
        raise BertraceError(f"{param}: {root}: no config.json; give " + _FORM)
    config = reader.json("config.json")
    model_type = _model_type(config, root / "config.json")
    tok, perm, tok_info = convert_tokenizer(reader)
    hf_sd = _load_weights(reader)
    label = f"{source['display']} ({root})" if source["kind"] == "hub" else source["display"]
    if model_type == "electra":
        model, model_config, weights = _electra(hf, config, hf_sd, perm, label)
    else:
        model, model_config, weights = convert_weights(config, hf_sd, perm, source=label)
    if weights["initialized"] or weights["dropped"]:
        print(
            f"import {source['display']}: {len(weights['initialized'])} weights not in the checkpoint start from "
            f"a random init ({', '.join(weights['initialized'][:4])}{' ...' if len(weights['initialized']) > 4 else ''})"
            + (f"; dropped its task head {weights['dropped']}" if weights["dropped"] else "")
        )
    tokenizer_json = tok.to_str(pretty=True)
    provenance = {
        "record_version": 1,
        "stage": "imported",
        "source": source["display"],
        "kind": source["kind"],
        "revision": source.get("revision"),
        "resolved_revision": commit,
        "pointer": source["pointer"].as_posix() if source.get("pointer") else None,
        "path": _portable_path(root, spec),
        "model_type": model_type,
        "architectures": config.get("architectures"),
        "inputs": dict(sorted(reader.sha256.items())),
        "outputs": {},
        "tokenizer": tok_info,
        "tokenizer_sha256": hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest(),
        "weights": weights,
        "libraries": library_versions(),
    }
    if source.get("pointer"):
        provenance["inputs"][source["pointer"].as_posix()] = hashlib.sha256(source["pointer"].read_bytes()).hexdigest()
    return {
        "format": FORMAT,
        "model": model,
        "model_config": model_config,
        "provenance": provenance,
        "tokenizer_json": tokenizer_json,
    }


ELECTRA_DROPPED = ("generator_predictions.", "generator_lm_head.", "classifier.")


def _electra(hf, config, hf_sd, perm, label):
    """An ELECTRA discriminator (``ElectraForPreTraining`` / ``ElectraModel`` save) through
    ``pipeline.interop.hf.electra_state_dict_from_hf`` (the ELECTRA objective's map): the encoder under
    ``bert.*`` (no pooler in ELECTRA: ``bert.pooler`` is its classification head's dense layer,
    freshly initialised) and the replaced-token head under ``disc_head.*``."""
    if not any(k.startswith("electra.") for k in hf_sd):  # a bare ElectraModel save
        hf_sd = {
            ("electra." + k if k.startswith(("embeddings.", "embeddings_project.", "encoder.")) else k): v
            for k, v in hf_sd.items()
        }
    dropped = sorted(k for k in hf_sd if k.startswith(ELECTRA_DROPPED))
    known = set(hf.electra_hf_names(hf.electra_config_from_hf(config))) if hasattr(hf, "electra_hf_names") else None
    unexpected = sorted(
        k
        for k in hf_sd
        if k not in dropped
        and not k.endswith(("position_ids", "token_type_ids"))
        and (k not in known if known is not None else not k.startswith(("electra.", "discriminator_")))
    )
    if unexpected:
        raise BertraceError(
            f"{label}: electra checkpoint (architectures {config.get('architectures')}) does not map "
            f"onto bertrace's ELECTRA discriminator: unexpected {len(unexpected)} keys {unexpected[:8]}"
        )
    bert_config, state = hf.electra_state_dict_from_hf({k: v for k, v in hf_sd.items() if k not in dropped}, config)
    n_tok = len(perm)
    if n_tok > bert_config.vocab_size:
        raise BertraceError(
            f"{label}: the tokenizer has {n_tok} tokens but the model's vocab_size is "
            f"{bert_config.vocab_size}; not the checkpoint's own tokenizer"
        )
    if perm != list(range(n_tok)):
        key = "bert.embeddings.word.weight"
        state[key] = state[key][torch.tensor(perm + list(range(n_tok, bert_config.vocab_size)))].clone()
    model_config = {**bert_config.to_dict(), "pad_id": 0}
    if n_tok < bert_config.vocab_size:
        model_config["tokenizer_vocab_size"] = n_tok
    return state, model_config, {"initialized": ["bert.pooler.bias", "bert.pooler.weight"], "dropped": dropped}


def describe(provenance: dict[str, Any]) -> str:
    """``imported from <source>@<revision>`` (the resolved commit when known)."""
    rev = provenance.get("resolved_revision") or provenance.get("revision")
    return f"imported from {provenance.get('source')}" + (f"@{rev}" if rev else " (local directory)")


def write_tokenizer(ckpt: dict[str, Any], path: str | Path) -> str:
    """Write an imported checkpoint's tokenizer atomically; its sha256 (the one the provenance records)."""
    from pipeline.core.io import atomic_open, sha256_file

    with atomic_open(Path(path)) as f:
        f.write(ckpt["tokenizer_json"])
    digest = sha256_file(path)
    if digest != ckpt["provenance"]["tokenizer_sha256"]:
        raise BertraceError(
            f"{path}: written tokenizer hashes to {digest}, not the recorded "
            f"{ckpt['provenance']['tokenizer_sha256']}; check the disk"
        )
    return digest


__all__ = [
    "is_hf_source",
    "parse_source",
    "fetch",
    "convert_tokenizer",
    "convert_weights",
    "import_checkpoint",
    "describe",
    "write_tokenizer",
    "FORMAT",
]
