"""A lineage (:func:`pipeline.lineage.trace.lineage`) and its verification
(:func:`pipeline.lineage.trace_verify.verify`) as text: the tree ``bertrace trace`` prints, how to
reproduce the run, and whether this machine would recompute the pre-training weights byte for byte."""

from __future__ import annotations

from typing import Any

from pipeline.core.arithmetic import host_line, is_x86_64
from pipeline.core.errors import BertraceError
from pipeline.lineage.trace_verify import CHANGED, MISSING, OK, summary


def _short(h: str | None, n: int = 12) -> str:
    return h[:n] if h else "-"


_WORDS = {OK: "ok", CHANGED: "CHANGED", MISSING: "not present"}
_MAX_LISTED = 10  # shards not present, listed one per line before "... and N more"


def _shards_by_manifest(verification: list[dict[str, Any]], stage: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for v in verification:
        if v["role"] == "shard" and v["stage"] == stage:
            out.setdefault(v.get("manifest"), []).append(v)
    return out


_DVC_WORDS = {OK: "in DVC cache", MISSING: "not in DVC cache"}


def _mark(v: dict[str, Any] | None) -> str:
    if v is None:
        return ""
    if v["role"] == "dvc":
        return "  " + _DVC_WORDS[v["status"]]
    if v["status"] == CHANGED:
        return f"  CHANGED (now {_short(v['actual'])})"
    return "  " + _WORDS[v["status"]]


def format_tree(lin: dict[str, Any], verification: list[dict[str, Any]] | None = None) -> str:
    """A readable tree, newest stage first, with short hashes and (when verified) status marks."""
    by_key = {(v["stage"], v["role"], v["path"]): v for v in (verification or [])}
    lines = [f"{lin['target']}  ({lin['kind']}, sha256 {_short(lin.get('target_sha256'))})"]
    for check in lin.get("checks") or []:
        v = by_key.get((lin["chain"][0]["stage"] if lin.get("chain") else "-", "target", check["path"]))
        lines.append(f"   {check.get('what')}: {check['path']}  {_short(check['recorded'])}{_mark(v)}")
    chain = lin.get("chain", [])
    for depth, node in enumerate(chain):
        pad = "   " * depth
        known = node.get("run_known", True)
        commit = _short(node.get("git_commit")) if node.get("git_commit") else "no git" if known else "?"
        dirty = " (dirty)" if node.get("git_dirty") else ""
        params = f"params {_short(node.get('params_hash'))}"
        pv = by_key.get((node["stage"], "params", f"params.yaml:{node['stage']}"))
        if pv is not None and pv["status"] == CHANGED:
            params += f" (params.yaml now {_short(pv['actual'])})"
        if node["stage"] == "imported":  # a published checkpoint: no commit or params of ours
            lines.append(f"{pad}└─ imported")
        else:
            unknown = "" if known else "  (no run log of this record here: made in another copy, or restored by DVC)"
            lines.append(
                f"{pad}└─ {node['stage']}  commit {commit}{dirty}  {params}  finished {node.get('finished') or '?'}{unknown}"
            )
        body = pad + ("     " if depth == len(chain) - 1 else "   │ ")
        if node["stage"] == "pretrain" and (node.get("params") or {}).get("time_minutes"):
            lines.append(
                f"{body} wall-clock budget: not reproducible from its commit "
                f"(pretrain.time_minutes = {node['params']['time_minutes']}; set max_steps instead)"
            )
        for earlier in (node.get("budget") or {}).get("extends") or []:
            was = ", ".join(f"{k} {v}" for k, v in earlier.items() if k != "at_step")
            lines.append(
                f"{body} extends a run trained under {was} (resumed at update {earlier.get('at_step')}): "
                "not the weights these params give from scratch"
            )
        if node["stage"] == "pretrain" and (node.get("params") or {}).get("objective"):
            lines.append(f"{body} objective {node['params']['objective']}")  # mlm_nsp | mlm | electra ...
        if node.get("compute"):
            lines.append(f"{body} computed {compute_line(node['compute'])}")
        if node.get("git_dirty") and node.get("dirty_paths"):
            lines.append(f"{body} uncommitted: {', '.join(node['dirty_paths'])}")
        if node.get("experiment"):
            lines.append(f"{body} {experiment_line(node['experiment'])}")
        if node.get("source"):
            lines.append(f"{body} {'imported from' if node['stage'] == 'imported' else 'source'} {node['source']}")
        rows = [("in ", "input", p, h) for p, h in sorted(node.get("inputs", {}).items())]
        rows += [("out", "output", p, h) for p, h in sorted(node.get("outputs", {}).items())]
        rows += [("dvc", "dvc", p, h) for p, h in sorted((node.get("dvc_outs") or {}).items())]
        width = max((len(p) for _, _, p, _ in rows), default=0)
        for label, role, path, digest in rows:
            digest = _short(digest) if role != "dvc" else "md5 " + _short(digest)
            lines.append(
                f"{body} {label} {path:<{width}}  {digest}{_mark(by_key.get((node['stage'], role, path)))}".rstrip()
            )
        for manifest, shards in _shards_by_manifest(verification or [], node["stage"]).items():
            c = summary(shards)
            marks = [f"{c[OK]} ok"] + [f"{c[s]} {_WORDS[s]}" for s in (CHANGED, MISSING) if c[s]]
            lines.append(f"{body} {len(shards)} shards listed in {manifest}: {', '.join(marks)}")
    if lin.get("conflicts"):
        lines.append("conflicting copies of upstream records: " + ", ".join(lin["conflicts"]))
    if verification is not None:
        bad = [v for v in verification if v["status"] == CHANGED]
        for v in bad:
            what = {
                "link": f"input of {v['stage']} vs output of {v.get('upstream')}",
                "params": f"params of {v['stage']}",
                "target": v.get("what") or "target",
                "shard": f"shard listed in {v.get('manifest')}",
            }.get(v["role"], f"{v['role']} of {v['stage']}")
            lines.append(f"CHANGED {v['path']}  ({what})")
            lines.append(f"   recorded {v['recorded']}")
            lines.append(f"   {'upstream' if v['role'] == 'link' else 'now     '} {v['actual']}")
            for d in v.get("detail") or []:
                lines.append(f"   {d}")
        gone = [v for v in verification if v["role"] == "shard" and v["status"] == MISSING]
        for v in gone[:_MAX_LISTED]:
            lines.append(f"not present {v['path']}  (shard listed in {v.get('manifest')})")
        if len(gone) > _MAX_LISTED:
            lines.append(f"   ... and {len(gone) - _MAX_LISTED} more shards not present")
        c = summary(verification)
        lines.append(f"verify: {c[OK]} ok, {c[CHANGED]} changed, {c[MISSING]} not present")
    lines += reproduce_hint(lin)
    return "\n".join(lines)


def compute_line(c: dict[str, Any]) -> str:
    """``on cpu (x86_64 Linux), bf16 autocast, torch 2.13.0+cpu, 2 CPU threads``."""
    where = " ".join(str(c[k]) for k in ("machine", "system") if c.get(k))
    device = str(c.get("device") or "")
    parts = [f"on {device or 'a device not recorded'}" + (f" ({where})" if where else "")]
    precision = c.get("precision")
    parts.append(
        "precision not recorded" if not precision else "fp32" if precision == "fp32" else f"{precision} autocast"
    )
    parts.append(f"torch {c.get('torch') or '?'}")
    if c.get("num_threads") and device in ("", "cpu"):
        parts.append(f"{c['num_threads']} CPU thread{'s' if c['num_threads'] != 1 else ''}")
    if (c.get("world_size") or 1) > 1:
        parts.append(f"{c['world_size']} processes")
    arithmetic = c.get("arithmetic")
    if arithmetic and device in ("", "cpu"):
        parts.append(f"{arithmetic.get('kernels')} kernels ({arithmetic.get('cpu_capability')})")
    return ", ".join(parts)


def compute_differences(compute: dict[str, Any], params: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(differences, unknowns)``: what this machine would do differently from a recorded ``compute``
    (a node's of :func:`pipeline.lineage.trace.lineage`) when it reran the stage with the recorded
    ``params`` (their ``device``, ``precision`` and ``num_threads`` keys resolved here) — each difference means other bytes —
    and what the record leaves open. Both empty when device kind, precision, torch build and
    thread count match (the CPU's instruction set, not recorded, can still change fp32 sums)."""
    import torch  # only here: tracing a record needs no torch

    from pipeline.core.device import cpu_bf16_native, cpu_model, precision_name, resolve_device, resolve_precision

    diffs: list[str] = []
    unknown: list[str] = []
    recorded_type = str(compute.get("device") or "").split(":")[0] or None
    try:
        here = resolve_device(str(params.get("device") or "auto"))
    except BertraceError:
        here = None
    if recorded_type and (here is None or here.type != recorded_type):
        diffs.append(f"device {here.type if here is not None else 'none usable'} here, {recorded_type} when recorded")
    elif here is not None:
        asked = str(params.get("precision") or "auto")
        try:
            precision = precision_name(resolve_precision(asked, here)[0])
        except BertraceError:
            precision = "an error"
        if here.type == "cpu" and asked == "auto" and _portable(compute):
            precision = "fp32"  # what auto gives under the portable pins, which the stage sets
        no_bf16 = (
            " (this CPU has no bf16 instructions: AVX512-BF16, AMX or Arm BF16)"
            if here.type == "cpu" and not cpu_bf16_native()
            else ""
        )
        if not compute.get("precision"):
            unknown.append(
                f"precision {asked} gives {precision} here{no_bf16 if precision == 'fp32' else ''}; "
                "the record does not say what it gave (reports/pretrain.json does)"
            )
        elif precision != compute["precision"]:
            diffs.append(
                f"precision {asked} gives {precision} here{no_bf16 if asked == 'auto' else ''}, "
                f"{compute['precision']} when recorded"
            )
        elif precision == "bf16" and no_bf16:
            diffs.append(
                "bf16 is emulated on this CPU (no bf16 instructions): the same setting, far "
                "slower, and not promised to round as the recorded run's instructions did"
            )
        if here.type == "cpu" and compute.get("num_threads"):
            threads = int(params.get("num_threads") or 0) or torch.get_num_threads()
            if threads != compute["num_threads"]:
                diffs.append(
                    f"{threads} CPU threads here, {compute['num_threads']} when recorded "
                    f"(pretrain.num_threads: {compute['num_threads']} runs with as many)"
                )
    if compute.get("torch") and compute["torch"] != torch.__version__:
        diffs.append(f"torch {torch.__version__} here, {compute['torch']} when recorded")
    arithmetic = compute.get("arithmetic")
    if arithmetic is None:
        unknown.append("which CPU kernels it ran is not recorded here (a checkpoint's provenance records them)")
    elif arithmetic.get("host_specific") and arithmetic.get("cpu") != cpu_model():
        diffs.append(f"{host_line(arithmetic)}; this one is a {cpu_model()}")
    elif here is not None and here.type == "cpu" and not (is_x86_64() and torch.cpu.get_capabilities().get("avx2")):
        diffs.append("portable kernels need an x86-64 CPU with AVX2, which this one is not")
    return diffs, unknown


def _portable(compute: dict[str, Any]) -> bool:
    return bool(compute.get("arithmetic")) and not compute["arithmetic"].get("host_specific")


def this_machine(lin: dict[str, Any]) -> list[str]:
    """Whether rerunning pre-training on this machine would give the recorded weights, and if
    not why (`bertrace trace` prints these lines last; ``--json``: ``this_machine``)."""
    lines = []
    for node in lin.get("chain") or []:
        if not node.get("compute"):
            continue
        diffs, unknown = compute_differences(node["compute"], node.get("params") or {})
        if diffs:
            lines.append(f"this machine: `dvc repro` of {node['stage']} here gives other weights than recorded:")
        elif unknown:
            lines.append(f"this machine: {node['stage']} here matches the record as far as it goes:")
        else:
            lines.append(
                f"this machine: {node['stage']} here matches the record's device, precision, torch, "
                "CPU threads and "
                + (
                    "portable kernels: the same bytes"
                    if _portable(node["compute"])
                    else "kernels (the same bytes also need the same kind of CPU)"
                )
            )
        lines += [f"   {d}" for d in diffs] + [f"   cannot tell: {u}" for u in unknown]
    return lines


def experiment_line(exp: dict[str, Any]) -> str:
    """``DVC experiment <name> (baseline <rev>): a.b 1 -> 2, …`` for a record made by ``dvc exp run``."""
    diff = exp.get("params_diff") or {}
    changes = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in list(diff.items())[:6])
    more = f", … ({len(diff)} params)" if len(diff) > 6 else ""
    return f"DVC experiment {exp.get('name')} (baseline {_short(exp.get('baseline_rev'), 10)})" + (
        f": {changes}{more}" if changes else ""
    )


def reproduce_hint(lin: dict[str, Any]) -> list[str]:
    """How to get this run's code and inputs back (docs/provenance.md "Reproduce a checkpoint")."""
    chain = lin.get("chain") or []
    if not chain or not chain[0].get("git_commit"):
        return []
    head = chain[0]
    exp = head.get("experiment")
    if exp and exp.get("name"):
        lines = [
            f"reproduce: dvc exp apply {exp['name']} && dvc repro   (the experiment's code and params; "
            f"or git checkout {exp.get('ref') or exp['name']})"
        ]
        if any(n.get("dvc_outs") for n in chain):
            lines.append(f"   inputs: dvc exp apply {exp['name']} && dvc checkout   (the experiment's dvc.lock)")
        return lines
    lines = [
        f"reproduce: git checkout {_short(head['git_commit'])} && dvc repro   (code and params of {head['stage']})"
        + ("; the tree was dirty: uncommitted changes are in no commit" if head.get("git_dirty") else "")
    ]
    md5 = next((m for n in chain for m in (n.get("dvc_outs") or {}).values()), None)
    if md5:
        lines.append(
            f"   inputs: git checkout $(git log --reverse --format=%h -S {md5} -- dvc.lock | head -1) && dvc checkout"
        )
    return lines
