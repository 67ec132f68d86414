"""How to get back a stage's outputs after ``dvc repro`` removed them and the stage then failed
(its tracking server was down): the clause a stage appends to that one-line error.

``dvc repro`` deletes a stage's outputs before it starts the command. Which command restores them
*as dvc.lock names them* depends on where those bytes are: the local DVC cache (``dvc checkout``),
only a DVC remote (``dvc pull``), git's HEAD for a ``cache: false`` output whose committed bytes
have dvc.lock's md5 (``git checkout --``); after a run that was not committed, HEAD holds older
bytes, and the stage must rerun. Output-neutral (``provenance.OUTPUT_NEUTRAL``): it only words an
error, so editing it reruns no stage.
"""

from __future__ import annotations

import hashlib
import os
import subprocess

TAIL = " (`make repro` checks the store before DVC touches anything)"


def restore_hint(dvc_stage: str | None) -> str:
    """``; ...`` naming the commands that put back ``dvc_stage``'s outputs as dvc.lock names them
    (:func:`restore_plan`); empty outside ``dvc repro`` (``dvc_stage`` None: DVC sets
    ``DVC_STAGE`` for the stage it runs)."""
    if not dvc_stage:
        return ""
    name = dvc_stage
    try:
        plan = restore_plan(name)
    except Exception:  # noqa: BLE001 - the hint must never hide the error it is appended to
        return f"; DVC removed {name}'s outputs before it ran: `dvc checkout {name}` puts back those in the DVC cache{TAIL}"
    if plan is None:
        return f"; dvc.lock has no entry for {name}: run `dvc repro {name}` once the tracking server answers{TAIL}"
    lost, pull, from_git = plan
    if lost:
        it = "it" if len(lost) == 1 else "them"
        return (
            f"; DVC removed {name}'s outputs before it ran and neither the DVC cache, a DVC remote nor "
            f"git's HEAD holds {' '.join(lost)} as dvc.lock names {it}: rerun `dvc repro {name}` once "
            f"the tracking server answers{TAIL}"
        )
    hint = f"; DVC removed {name}'s outputs before it ran: `dvc {'pull' if pull else 'checkout'} {name}` puts them back"
    if from_git:
        hint += f" (`git checkout -- {' '.join(from_git)}` the uncached ones)"
    return hint + TAIL


def restore_plan(name: str) -> tuple[list[str], bool, list[str]] | None:
    """For the outputs of stage ``name`` that DVC removes before running it: ``(lost, pull,
    from_git)``, the paths nothing here restores as ``dvc.lock`` names them, whether some cached ones
    are missing from the local DVC cache (and a DVC remote is set to pull them from), the uncached
    ones git's HEAD holds with dvc.lock's md5; None when dvc.lock has no entry for the stage."""
    from dvc.repo import Repo
    from dvc_data.hashfile import check, load

    lost: list[str] = []
    from_git: list[str] = []
    pull = False
    with Repo(os.environ.get("DVC_ROOT") or None) as repo:
        (dvc_stage,) = repo.stage.collect(name)
        outs = [out for out in dvc_stage.outs if not out.persist]  # DVC keeps persist outputs
        if outs and not any(out.hash_info for out in outs):
            return None
        remote = repo.config["core"].get("remote")
        for out in outs:
            if not out.hash_info:
                lost.append(out.def_path)
            elif out.use_cache:
                try:
                    check(out.cache, load(out.cache, out.hash_info), check_hash=False)
                except (FileNotFoundError, OSError, ValueError):
                    if (out.remote or remote) and out.can_push:
                        pull = True
                    else:
                        lost.append(out.def_path)
            else:
                head = subprocess.run(
                    ["git", "show", f"HEAD:./{os.path.relpath(out.fs_path, repo.root_dir)}"],
                    cwd=repo.root_dir,
                    capture_output=True,
                )
                same = (
                    head.returncode == 0
                    and not out.hash_info.isdir
                    and hashlib.md5(head.stdout).hexdigest() == out.hash_info.value
                )
                (from_git if same else lost).append(out.def_path)
    return lost, pull, from_git
