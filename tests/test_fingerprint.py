"""Verifier fingerprints over real modules written to a temporary package on sys.path."""

from __future__ import annotations

import importlib
import json
import os
import sys
import uuid

import pytest

from scorers.identity import cache as fp_cache
from scorers.identity import fingerprint as fp_module
from scorers.identity.cache import cache_dir, sys_path_stamp
from scorers.identity.fingerprint import fingerprint
from scorers.registry import Verifier

HELPER = '''
"""Helper the verifier imports."""

def normalise(text):
    return text.strip().lower()
'''

CHECK = '''
"""A toy verifier."""
import json  # stdlib: not hashed as project code

from {pkg}.helper import normalise
from scorers.grade import scored


def grade(view):
    """Compare normalised strings."""
    got = normalise(view.completion)
    return scored(float(got == view.target), answer=got, explanation="", reason="cmp")
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A fresh package `<pkg>` with `check` (the verifier module) importing `helper`."""
    pkg = f"toyverifier_{uuid.uuid4().hex[:8]}"
    root = tmp_path / pkg
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "helper.py").write_text(HELPER)
    (root / "check.py").write_text(CHECK.format(pkg=pkg))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    module = importlib.import_module(f"{pkg}.check")

    def verifier(**params):
        return Verifier("toy", module.grade, f"{pkg}.check", params, "toy v1")

    yield root, verifier
    for name in [m for m in sys.modules if m.startswith(pkg)]:
        del sys.modules[name]


def edit(path, old, new):
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    # make sure the (mtime, size) cache key moves even on a coarse-mtime filesystem
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))


def test_deterministic_and_names_its_inputs(toy):
    root, verifier = toy
    a, b = fingerprint(verifier(tol=0)), fingerprint(verifier(tol=0))
    assert a == b
    assert len(a.digest) == 64 and a.name == "toy" and a.label == "toy v1"
    assert a.params == {"tol": 0}
    assert f"# ---- module {root.name}.helper" in a.source
    assert f"# ---- module {root.name}.check" in a.source
    assert "scorers.grade" in a.source  # project modules it imports are hashed too
    assert "# ---- module json" not in a.source


def test_comments_formatting_and_docstrings_do_not_count(toy):
    root, verifier = toy
    before = fingerprint(verifier()).digest
    edit(root / "check.py", "    got = normalise", "    # a comment\n\n    got  =  normalise")
    edit(root / "check.py", '"""Compare normalised strings."""', '"""Reworded docs."""')
    assert fingerprint(verifier()).digest == before


def test_a_code_change_changes_it(toy):
    root, verifier = toy
    before = fingerprint(verifier()).digest
    edit(root / "check.py", "float(got == view.target)", "float(got != view.target)")
    assert fingerprint(verifier()).digest != before


def test_a_change_in_an_imported_project_module_changes_it(toy):
    root, verifier = toy
    before = fingerprint(verifier())
    edit(root / "helper.py", "text.strip().lower()", "text.strip()")
    after = fingerprint(verifier())
    assert after.digest != before.digest
    assert "text.strip().lower()" not in after.source


def test_parameters_change_it_and_key_order_does_not(toy):
    _, verifier = toy
    assert fingerprint(verifier(a=1, b=2)).digest == fingerprint(verifier(b=2, a=1)).digest
    assert fingerprint(verifier(a=1, b=2)).digest != fingerprint(verifier(a=1, b=3)).digest


def test_third_party_versions_are_part_of_it(toy):
    _, verifier = toy
    fp = fingerprint(verifier())
    # scorers.grade imports inspect_ai: its installed version is recorded
    assert '"inspect_ai": "' in fp.source.splitlines()[2]


def test_bad_inputs_fail_clearly():
    with pytest.raises(ValueError, match="not found"):
        fingerprint(Verifier("x", lambda v: None, "no_such_module_xyz", {}, ""))
    with pytest.raises(ValueError, match="parameters must be JSON"):
        fingerprint(Verifier("x", lambda v: None, "scorers.grade", {"f": object()}, ""))


def test_the_registered_verifiers_fingerprint(tmp_path):
    from scorers.registry import all_verifiers

    verifiers = all_verifiers()
    if not verifiers:
        pytest.skip("no verifiers registered yet")
    for v in verifiers.values():
        fp = fingerprint(v)
        assert fp.digest == fingerprint(v).digest
        assert f"# ---- module {v.module}" in fp.source


# -- the on-disk cache (scorers.identity.cache) -------------------------------------------


@pytest.fixture
def new_process(tmp_path, monkeypatch):
    """Simulate a fresh process: forget in-memory work; a private cache dir; returns a
    function that forgets again (the disk cache stays)."""
    monkeypatch.setenv("GRADEBOOK_CACHE_DIR", str(tmp_path / "cache"))

    def forget():
        monkeypatch.setattr(fp_module, "_FILE_CACHE", {})
        monkeypatch.setattr(fp_module, "_DISK", None)
        monkeypatch.setattr(fp_module, "_INSTALLED", None)

    forget()
    return forget


def _no_parsing(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("parsed a module the cache holds")

    def refuse_scan():
        raise AssertionError("scanned the installed distributions again")

    monkeypatch.setattr(fp_module.ast, "parse", refuse)
    monkeypatch.setattr(fp_module.importlib.metadata, "packages_distributions", refuse_scan)


def test_a_new_process_reuses_the_disk_cache_with_the_same_result(toy, new_process, monkeypatch):
    _, verifier = toy
    cold = fingerprint(verifier(tol=1))  # nothing cached: computed, then saved
    assert (cache_dir() / fp_cache._FILE_NAME).is_file()
    new_process()
    with monkeypatch.context() as m:
        _no_parsing(m)
        warm = fingerprint(verifier(tol=1))
    assert warm == cold  # digest and the explained source alike


def test_an_edited_file_is_reparsed_despite_the_disk_cache(toy, new_process):
    root, verifier = toy
    before = fingerprint(verifier())
    new_process()
    edit(root / "helper.py", "text.strip().lower()", "text.strip()")
    after = fingerprint(verifier())
    assert after.digest != before.digest
    new_process()
    (cache_dir() / fp_cache._FILE_NAME).unlink()
    assert fingerprint(verifier()) == after  # the same as computed with no cache at all


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b"\xff\xfe", b"[]", b'{"format": 1, "files": 7}', b'{"format": 99}'],
)
def test_a_corrupt_cache_is_ignored_and_rewritten(toy, new_process, content):
    _, verifier = toy
    expected = fingerprint(verifier())
    new_process()
    cache_file = cache_dir() / fp_cache._FILE_NAME
    cache_file.write_bytes(content)
    assert fingerprint(verifier()) == expected
    assert json.loads(cache_file.read_text())["files"]  # replaced by a valid cache


def test_corrupt_entries_are_recomputed(toy, new_process):
    _, verifier = toy
    expected = fingerprint(verifier())
    new_process()
    cache_file = cache_dir() / fp_cache._FILE_NAME
    data = json.loads(cache_file.read_text())
    for entry in data["files"].values():
        entry["imports"] = 5
    data["files"]["not a key"] = {"normalised": 1}
    for dists in data["dists"]:
        dists["map"] = {"json": "not-a-list"}
    data["dists"].append("not a map")
    cache_file.write_text(json.dumps(data))
    assert fingerprint(verifier()) == expected


def test_checkouts_taking_turns_keep_each_ones_distribution_map(toy, new_process, monkeypatch):
    """Two checkouts of one user (each its own virtualenv) share the cache file: a command in
    one must not make the other's next command scan every installed distribution again
    (seconds on a busy machine, the bulk of a no-op `gradebook score`)."""
    _, verifier = toy
    here = sys_path_stamp()
    expected = fingerprint(verifier())  # this environment's map saved
    new_process()
    monkeypatch.setattr(fp_module, "sys_path_stamp", lambda: [["/other/checkout/.venv", 1]])
    fingerprint(verifier())  # another environment: scans, saves its own map
    new_process()
    monkeypatch.setattr(fp_module, "sys_path_stamp", lambda: here)
    with monkeypatch.context() as m:
        _no_parsing(m)
        assert fingerprint(verifier()) == expected


def test_a_save_keeps_the_map_another_checkout_saved_meanwhile(toy, new_process):
    """Two commands of two checkouts at once: the one that saves last keeps the other's map."""
    _, verifier = toy
    other = [["/other/checkout/.venv", 1]]
    fp_module._disk()  # this command loads the cache (empty) first
    theirs = fp_cache.FingerprintCache.load()  # meanwhile another checkout's command saves
    theirs.put_dists({"stamp": other, "map": {}, "versions": {}})
    theirs.save()
    fingerprint(verifier())  # this command scans its environment and saves
    saved = json.loads((cache_dir() / fp_cache._FILE_NAME).read_text())["dists"]
    assert sorted(json.dumps(d["stamp"]) for d in saved) == sorted(
        [json.dumps(other), json.dumps(sys_path_stamp())]
    )


def test_an_unwritable_cache_dir_is_not_an_error(toy, new_process, tmp_path, monkeypatch):
    _, verifier = toy
    expected = fingerprint(verifier())
    new_process()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("GRADEBOOK_CACHE_DIR", str(blocker / "cache"))
    assert fingerprint(verifier()) == expected


def test_the_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("GRADEBOOK_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "gradebook"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "gradebook"
    monkeypatch.setenv("GRADEBOOK_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


@pytest.mark.parametrize("dirname", ["site-packages", "a-plain-dir"])
def test_installing_a_distribution_invalidates_the_distribution_map(tmp_path, dirname):
    target = tmp_path / dirname
    target.mkdir()
    sys.path.append(str(target))
    try:
        before = sys_path_stamp()
        (target / "newdist-1.0.dist-info").mkdir()
        assert sys_path_stamp() != before
    finally:
        sys.path.remove(str(target))


def test_a_directory_without_distributions_on_sys_path_keeps_the_distribution_map(tmp_path):
    """A command run from a fresh working directory (it lands on sys.path) reuses the cached
    scan of the installed distributions instead of redoing it."""
    target = tmp_path / "a-fresh-cwd"
    target.mkdir()
    before = sys_path_stamp()
    sys.path.insert(1, str(target))
    try:
        assert sys_path_stamp() == before
    finally:
        sys.path.remove(str(target))
