"""The cache folder and ``written_whole``: files and folders appear whole or not at all, whoever writes them."""

import os
from pathlib import Path

import pytest

from ps_agent.cache import cache_dir, written_whole


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PS_AGENT_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("PS_AGENT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "ps_agent"


def test_a_file_appears_only_when_the_block_completes(tmp_path):
    target = tmp_path / "sub" / "manifest.json"
    with written_whole(target) as partial:
        partial.write_text("{}")
        assert not target.exists() and partial.parent.parent == target.parent
    assert target.read_text() == "{}"
    assert [p.name for p in target.parent.iterdir()] == ["manifest.json"]


def test_a_crash_leaves_neither_the_target_nor_a_partial(tmp_path):
    target = tmp_path / "index"
    with pytest.raises(KeyboardInterrupt), written_whole(target) as partial:
        partial.mkdir()
        (partial / "half").write_text("x")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_folder_replaces_the_folder_there(tmp_path):
    target = tmp_path / "bm25"
    target.mkdir()
    (target / "stale").write_text("old")
    with written_whole(target) as partial:
        partial.mkdir()
        (partial / "fresh").write_text("new")
    assert [p.name for p in target.iterdir()] == ["fresh"]
    assert [p.name for p in tmp_path.iterdir()] == ["bm25"]


def test_concurrent_writers_never_share_a_partial_path_and_the_result_is_whole(tmp_path):
    """Two writers of the same file (two processes building one cache) interleaved: each writes its own
    partial, so neither clobbers the other's half-written file, and the target is one writer's whole file."""
    target = tmp_path / "shard.npy"
    with written_whole(target) as first, written_whole(target) as second:
        assert first != second
        first.write_text("first, whole")
        second.write_text("second, whole")
        assert first.read_text() == "first, whole"
    assert target.read_text() == "first, whole"  # the last to finish renames last
    assert [p.name for p in tmp_path.iterdir()] == ["shard.npy"]


def test_a_folder_another_writer_put_in_place_first_is_kept(tmp_path, monkeypatch):
    target = tmp_path / "model"
    replace = os.replace

    def other_writer_first(src, dst):
        if Path(dst) == target:  # another process renames its own complete folder into place first
            target.mkdir()
            (target / "theirs").write_text("whole")
        replace(src, dst)

    with written_whole(target) as partial:
        partial.mkdir()
        (partial / "ours").write_text("whole")
        monkeypatch.setattr(os, "replace", other_writer_first)
    assert [p.name for p in target.iterdir()] == ["theirs"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
