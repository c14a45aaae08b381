"""`convert --overwrite` of a TFRecord folder replaces it in one step a kill cannot split, and the
next conversion never deletes the only whole copy of an output (NOTE [ Replacing OUT in one step ]
in converters/swap.py); --overwrite deletes only files that are ours by name and contents, and
never follows a link planted at OUT or at a temporary's name."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest

from loadprof.converters import ConvertError, ConvertOptions, convert, inspect_path, tfrecord
from loadprof.converters.conversion import _host_tag
from tests.convert_helpers import ROOT, leftovers, loadprof

OLD, NEW = 36, 30  # records in the previous and the new output; 4 per shard, so 9 and 8 shards

# Runs the conversion with os-level calls counted; the call numbered KILL_AT is never made:
# the process SIGKILLs itself first. Writes the calls it made to LOG when it finishes.
CHILD = textwrap.dedent("""
    import os, signal, sys
    kill_at, mode, log = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    calls = []

    def seam(name, fn):
        def call(*args, **kwargs):
            calls.append(name + " " + " ".join(os.path.basename(os.fsdecode(a)) for a in args if not isinstance(a, int)))
            if len(calls) == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)
        return call

    for name in ("rename", "replace", "unlink", "rmdir", "mkdir"):
        setattr(os, name, seam(name, getattr(os, name)))
    try:
        from loadprof.converters import swap
    except ImportError:  # a loadprof without it
        swap = None
    if swap is not None:
        if mode == "fallback" or swap._renameat2 is None:
            swap._renameat2 = None  # a filesystem without RENAME_EXCHANGE
        else:
            swap._renameat2 = seam("renameat2", swap._renameat2)
    from loadprof.cli import main
    calls.clear()
    code = main(["convert", "new.npz", "out", "--to", "tfrecord", "--overwrite", "--shard-size", "200"])
    with open(log, "w") as f:
        f.write("\\n".join(calls))
    sys.exit(code)
""")


def _ids(n: int, start: int) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int64)


def _whole(out, ids_old, ids_new):
    """OUT is the previous or the new output, all of it, with its info file; readers agree."""
    from loadprof.converters.torch import TFRecordDataset

    summary = inspect_path(out)
    assert summary.format == "TFRecord (loadprof-tfrecord)"
    assert summary.records in (OLD, NEW)
    assert "per-field checksums match those stored at conversion" in summary.checks
    got = [int(item["id"]) for item in TFRecordDataset(out)]
    assert got in (ids_old.tolist(), ids_new.tolist())
    return got == ids_new.tolist()


@pytest.mark.parametrize("mode", ["exchange", "fallback"])
def test_a_kill_at_any_step_of_the_swap_leaves_the_old_or_the_new_output_whole(tmp_path, mode):
    pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    ids_old, ids_new = _ids(OLD, 0), _ids(NEW, 1000)
    np.savez(tmp_path / "old.npz", id=ids_old, x=rng.standard_normal((OLD, 4)).astype(np.float32))
    np.savez(tmp_path / "new.npz", id=ids_new, x=rng.standard_normal((NEW, 4)).astype(np.float32))
    np.save(tmp_path / "small.npy", np.arange(3))
    convert(tmp_path / "old.npz", tmp_path / "pristine", ConvertOptions(to="tfrecord", shard_size=200))
    assert len(list((tmp_path / "pristine").glob("*.tfrecord"))) == 9
    (tmp_path / "child.py").write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run_child(kill_at):
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
        shutil.copytree(tmp_path / "pristine", tmp_path / "out")
        return subprocess.run([sys.executable, "child.py", str(kill_at), mode, "calls.log"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    done = run_child(0)  # no kill: learn the steps
    assert done.returncode == 0, done.stderr
    assert _whole(tmp_path / "out", ids_old, ids_new)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    # The swap: every step after the last shard got its final name.
    swap_from = max(i for i, c in enumerate(calls) if ".partial" in c) + 2
    points = list(range(swap_from, len(calls) + 1))
    picked = sorted(set(random.Random(0).sample(points, min(9, len(points))) + [swap_from, swap_from + 1]))
    picked += random.Random(1).sample(range(1, swap_from), 2)  # and two while the shards are written
    outcomes = set()
    for k, kill_at in enumerate(picked):
        killed = run_child(kill_at)
        assert killed.returncode == -9, (kill_at, killed.stderr)
        # Any later conversion in the same folder deals with what the kill left.
        convert(tmp_path / "small.npy", tmp_path / f"other{k}", ConvertOptions(to="tfrecord"))
        outcomes.add(_whole(tmp_path / "out", ids_old, ids_new))
        assert leftovers(tmp_path) == [], (kill_at, calls[kill_at - 1])
    assert outcomes == {False, True}  # some kills came before the output changed, some after


def _dead_pid():
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def _tree(root):
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def test_a_whole_output_left_aside_is_put_back_or_kept_never_deleted(tmp_path):
    """What a kill between renaming OUT aside and the new one into place leaves: OUT absent, the
    previous output whole under `.OUT.old-...`. It may be the only copy."""
    np.save(tmp_path / "x.npy", np.arange(20))
    np.save(tmp_path / "small.npy", np.arange(3))
    convert(tmp_path / "x.npy", tmp_path / "made", ConvertOptions(to="tfrecord", shard_size=100))
    aside = tmp_path / f".out.old-{_dead_pid()}-{_host_tag()}-abcdefgh"
    (tmp_path / "made").rename(aside)
    proc = loadprof("convert", "small.npy", "o2", "--to", "tfrecord", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"loadprof: note: restored out from {aside.name}: a whole output left aside by a conversion "
        "that did not finish"]
    assert inspect_path(tmp_path / "out").records == 20 and leftovers(tmp_path) == []
    # OUT there but not a whole output (here, partly deleted): the copy aside is kept, and said.
    shutil.copytree(tmp_path / "out", aside)
    (tmp_path / "out" / "train.info.json").unlink()
    before = _tree(aside)
    proc = loadprof("convert", "small.npy", "o3", "--to", "tfrecord", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"loadprof: note: kept {aside.name}: it holds a whole output and out is not one; rename it to "
        "out to use it"]
    assert _tree(aside) == before
    # A conversion refused for another reason still says that OUT came back.
    shutil.rmtree(tmp_path / "out")
    proc = loadprof("convert", "small.npy", "out", "--to", "tfrecord", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "loadprof: error: out: already exists (pass --overwrite to replace it) (note: restored out "
        f"from {aside.name}: a whole output left aside by a conversion that did not finish)"]
    assert inspect_path(tmp_path / "out").records == 20


# ---------------------------------------------------------------- what --overwrite deletes


@pytest.fixture
def out(tmp_path):
    np.save(tmp_path / "x.npy", np.arange(20))
    convert(tmp_path / "x.npy", tmp_path / "out", ConvertOptions(to="tfrecord", shard_size=100))
    return tmp_path / "out"


def _edit(info_path, edit):
    info = json.loads(info_path.read_text())
    edit(info)
    info_path.write_text(json.dumps(info))


def test_a_hand_edited_info_file_cannot_make_overwrite_delete_a_users_file(tmp_path, out):
    info = out / "train.info.json"
    original = info.read_text()
    shards = json.loads(original)["shards"]
    # A user's file listed under its own name: not a name loadprof gives its shards.
    (out / "notes.txt").write_text("precious\n")
    _edit(info, lambda i: i["shards"].append({"file": "notes.txt", "records": 1, "bytes": 9}))
    before = _tree(tmp_path)
    with pytest.raises(ConvertError, match=r"this directory holds train.info.json, which is not a complete loadprof "
                                           r"info file \('shards' entry 5 is \"notes.txt\", not a name loadprof "
                                           r"gives a shard of \"train\"\)$"):
        convert(tmp_path / "x.npy", out, ConvertOptions(to="tfrecord", overwrite=True))
    assert _tree(tmp_path) == before
    # A user's file in a shard's place, with the name and size the info file gives: its framing is not ours.
    (out / "notes.txt").unlink()
    info.write_text(original)
    name = shards[1]["file"]
    (out / name).write_bytes(b"precious" * (shards[1]["bytes"] // 8) + b"!" * (shards[1]["bytes"] % 8))
    before = _tree(tmp_path)
    with pytest.raises(ConvertError, match=rf"this directory holds {name}, whose size or framing is not what "
                                           r"train.info.json records: not written by loadprof$"):
        convert(tmp_path / "x.npy", out, ConvertOptions(to="tfrecord", overwrite=True))
    assert _tree(tmp_path) == before and leftovers(tmp_path) == []
    # And one the info file gives another size.
    (out / name).write_bytes(b"precious\n")
    with pytest.raises(ConvertError, match=rf"holds {name}, whose size or framing is not what"):
        convert(tmp_path / "x.npy", out, ConvertOptions(to="tfrecord", overwrite=True))
    assert (out / name).read_bytes() == b"precious\n"


def test_a_previous_output_with_a_shard_missing_is_still_replaced(tmp_path, out):
    next(out.glob("*.tfrecord")).unlink()  # every file left is ours: replacing it is safe
    result = convert(tmp_path / "x.npy", out, ConvertOptions(to="tfrecord", overwrite=True, shard_size=100))
    assert inspect_path(out).records == result.records == 20 and leftovers(tmp_path) == []


# ---------------------------------------------------------------- links planted at OUT or a temporary's name


@pytest.mark.parametrize("target", ["victim", "nowhere"])
def test_a_link_at_out_is_refused_with_or_without_overwrite(tmp_path, target):
    np.save(tmp_path / "x.npy", np.arange(4))
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "keep.txt").write_text("mine")
    (tmp_path / "out").symlink_to(target)
    before = _tree(tmp_path)
    proc = loadprof("convert", "x.npy", "out", "--to", "tfrecord", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == "loadprof: error: out: already exists (pass --overwrite to replace it)\n"
    proc = loadprof("convert", "x.npy", "out", "--to", "tfrecord", "--overwrite", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr == (
        "loadprof: error: out: not replaced: --overwrite replaces only a previous loadprof output, and this is a "
        "symbolic link\n")
    assert _tree(tmp_path) == before and os.readlink(tmp_path / "out") == target


@pytest.mark.parametrize("renameat2", ["libc", None])
def test_a_link_planted_at_a_temporarys_name_is_never_followed(tmp_path, out, monkeypatch, renameat2):
    """mkdtemp's first choice of name is taken by a link to a user's folder: another name is used,
    and the folder and the link are untouched (with and without RENAME_EXCHANGE, whose fallback
    makes a second temporary for the previous output)."""
    from loadprof.converters import swap

    if renameat2 is None:
        monkeypatch.setattr(swap, "_renameat2", None)
    (tmp_path / "victim").mkdir()
    (tmp_path / "victim" / "keep.txt").write_text("mine")
    host = _host_tag()
    links = [tmp_path / f".out.{kind}-{os.getpid()}-{host}-aaaaaaaa" for kind in ("tmp", "old")]
    for link in links:
        link.symlink_to(tmp_path / "victim")
    monkeypatch.setattr(tempfile, "_get_candidate_names", lambda: iter(["aaaaaaaa", "bbbbbbbb"]))
    before = _tree(tmp_path / "victim")
    np.save(tmp_path / "y.npy", np.arange(7))
    convert(tmp_path / "y.npy", out, ConvertOptions(to="tfrecord", overwrite=True))
    assert _tree(tmp_path / "victim") == before
    assert all(link.is_symlink() for link in links)
    assert inspect_path(out).records == 7
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == sorted(link.name for link in links)


def test_shard_files_are_created_new_never_through_a_planted_link(tmp_path):
    """Inside the temporary the writer creates each file (O_EXCL | O_NOFOLLOW): a link there is an error."""
    (tmp_path / "victim").write_text("mine")
    (tmp_path / "a.tfrecord").symlink_to(tmp_path / "victim")
    with pytest.raises(FileExistsError):
        tfrecord.TFRecordFileWriter(tmp_path / "a.tfrecord", exclusive=True)
    assert (tmp_path / "victim").read_text() == "mine"
