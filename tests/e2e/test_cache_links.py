"""The DVC cache without a second copy of the data: real `dvc repro`s of the data stages (download ->
clean -> tokenizer -> examples, tiny corpus) in a temporary repository whose cache links outputs
instead of copying them: the repository's own .dvc/config (hardlink first), then cache.type symlink
(what it falls back to when the cache is on another filesystem).

With a linked cache the workspace file IS the cache file (DVC makes it read-only; as root that
stops nothing): a stage that edited an output in place would change the cached bytes of an
earlier run. So after a first repro, a param change that rebuilds every data stage and a hand
run of the stages over the linked outputs, every cache object still hashes to its name, every
output is a link into the cache, `dvc status` is clean and outputs + cache take no more disk
than the outputs once (x1.3 allowed; cache.type copy, or reflink first on ext4, takes about x2).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, shared_file
from tests.support.repos import copy_repo, run_cmd, tiny_params

pytestmark = pytest.mark.slow
DATA_STAGES = ["download", "clean", "tokenizer", "examples"]


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _objects(root: Path) -> Path:
    return root / ".dvc" / "cache" / "files" / "md5"  # DVC 3's layout: <md5[:2]>/<md5[2:]>[.dir]


def _corrupted(root: Path) -> list[str]:
    """Cache objects whose bytes no longer hash to their name (and the count of objects checked)."""
    bad, n = [], 0
    for obj in sorted(p for p in _objects(root).rglob("*") if p.is_file()):
        n += 1
        name = obj.parent.name + obj.name.removesuffix(".dir")
        if _md5(obj) != name:
            bad.append(str(obj.relative_to(root)))
    assert n > 0, "the DVC cache is empty"
    return bad


def _outputs(root: Path) -> dict[Path, str]:
    """Every file the data stages' dvc.lock outs name (directories expanded): workspace path -> md5."""
    lock = yaml.safe_load((root / "dvc.lock").read_text())["stages"]
    files = {}
    for stage in DATA_STAGES:
        for out in lock[stage]["outs"]:
            if out["md5"].endswith(".dir"):
                listing = json.loads(_cache_path(root, out["md5"]).read_text())
                files.update({root / out["path"] / e["relpath"]: e["md5"] for e in listing})
            else:
                files[root / out["path"]] = out["md5"]
    return files


def _cache_path(root: Path, md5: str) -> Path:
    return _objects(root) / md5[:2] / md5[2:]


def _not_linked(root: Path, kind: str) -> list[str]:
    """Outputs that are not a ``kind`` link to their cache object."""
    wrong = []
    for path, md5 in _outputs(root).items():
        obj = _cache_path(root, md5)
        if kind == "symlink":
            ok = path.is_symlink() and path.resolve() == obj.resolve()
        else:
            ok = not path.is_symlink() and os.path.samefile(path, obj)
        if not ok:
            wrong.append(str(path.relative_to(root)))
    return wrong


def _disk(paths: list[Path]) -> int:
    """Bytes of disk the regular files under ``paths`` take, each inode once (as one `du -s` counts):
    a hard link costs nothing more, a symlink is its own tiny inode."""
    seen, total = set(), 0
    for top in paths:
        for p in [top, *top.rglob("*")] if top.is_dir() else [top]:
            st = p.lstat()
            if not p.is_dir() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def _status_clean(root: Path, env: dict) -> dict:
    return json.loads(run_cmd(["dvc", "status", "--json", "--with-deps", "examples"], root, env).stdout or "{}")


def _set_param(root: Path, section: str, key: str, value) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params[section][key] = value
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture(scope="module", params=["repository", "symlink"])
def linked(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"cache-{request.param}")
    copy_repo(root)
    params = tiny_params(yaml.safe_load((root / "params.yaml").read_text()))
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = str(root)
    env["BERTRACE_NO_MLFLOW"] = "1"
    env["BERTRACE_HUB_MIRROR"] = str(REPO / "mirrors" / "shared-data.yaml")
    env["TQDM_DISABLE"] = "1"
    shared_file("wikitext-2-raw", "wiki.test.raw")
    kind = "hardlink"  # the repository's .dvc/config, copied by copy_repo
    if request.param != "repository":
        kind = request.param
        run_cmd(["dvc", "config", "cache.type", kind], root, env)
    run_cmd(["git", "init", "-q"], root)
    run_cmd(["git", "add", "-A"], root)
    run_cmd(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"], root)
    run_cmd(["dvc", "repro", "examples"], root, env)
    return root, env, kind


def test_outputs_are_links_into_an_intact_cache_and_take_the_disk_once(linked):
    root, env, kind = linked
    assert _status_clean(root, env) == {}
    outputs = _outputs(root)
    assert any(p.match("data/examples/train/shard-*.parquet") for p in outputs)
    assert _not_linked(root, kind) == []
    assert _corrupted(root) == []
    once = sum(os.stat(p).st_blocks * 512 for p in set(map(os.path.realpath, outputs)))
    tops = sorted(
        {
            root / o["path"]
            for s in DATA_STAGES
            for o in yaml.safe_load((root / "dvc.lock").read_text())["stages"][s]["outs"]
        }
    )
    both = _disk([*tops, root / ".dvc" / "cache"])
    assert once > 1 << 20  # the tiny corpus' outputs: a few MiB
    assert both <= 1.3 * once, f"outputs {once} B, outputs + cache {both} B"


def test_a_param_change_rebuilds_fresh_files_and_keeps_the_old_ones_cached(linked):
    root, env, kind = linked
    before = _outputs(root)
    _set_param(root, "clean", "valid_fraction", 0.2)  # another split: clean, tokenizer and examples rebuild
    out = run_cmd(["dvc", "repro", "examples"], root, env)
    assert "Running stage 'clean'" in out.stdout and "Running stage 'examples'" in out.stdout, out.stdout
    after = _outputs(root)
    changed = [p for p in after if before.get(p) != after[p]]
    assert any(p.match("data/clean/train.txt") for p in changed) and any(p.match("*.parquet") for p in changed)
    assert _status_clean(root, env) == {}
    assert _not_linked(root, kind) == []
    for path, md5 in before.items():  # the first run's bytes, still in the cache
        assert _md5(_cache_path(root, md5)) == md5, path
    assert _corrupted(root) == []


def test_stages_run_by_hand_over_linked_outputs_leave_the_cache_intact(linked):
    """Outside `dvc repro` nothing removes the outputs first: each stage replaces the links with
    new files (even where the bytes come out the same); `dvc checkout --relink` links the locked
    outputs back."""
    root, env, kind = linked
    locked, params = _outputs(root), (root / "params.yaml").read_text()
    _set_param(root, "clean", "valid_fraction", 0.15)
    _set_param(root, "examples", "seed", 7)
    for stage in DATA_STAGES:
        run_cmd([sys.executable, "-m", f"stages.{stage}"], root, env)
    assert _corrupted(root) == []
    rewritten = [p for p, md5 in locked.items() if p.exists() and _md5(p) != md5]
    assert any(p.match("data/clean/train.txt") for p in rewritten)
    for path in rewritten:  # a new file in place of the link
        assert not path.is_symlink() and os.stat(path).st_nlink == 1, path
    assert _status_clean(root, env) != {}
    (root / "params.yaml").write_text(params)
    run_cmd(["dvc", "checkout", "--relink", "--force", "--with-deps", "examples"], root, env)
    assert _status_clean(root, env) == {}
    assert {p: _md5(p) for p in locked} == locked
    assert _not_linked(root, kind) == []
