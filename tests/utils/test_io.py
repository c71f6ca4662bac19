"""Atomic writes and jsonl logs that survive a kill mid-write."""
import os

import pytest

from posbias.utils.io import append_jsonl, atomic_write_json, read_jsonl, repair_jsonl


def test_atomic_write_has_normal_permissions_and_leaves_no_temp(tmp_path):
    atomic_write_json(tmp_path / "a.json", {"x": 1})
    mask = os.umask(0)
    os.umask(mask)
    assert os.stat(tmp_path / "a.json").st_mode & 0o777 == 0o666 & ~mask
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]


def test_torn_last_line_is_dropped_and_appends_continue(tmp_path):
    log = tmp_path / "r.jsonl"
    append_jsonl(log, {"id": 1})
    with open(log, "a") as f:
        f.write('{"id": 2, "tor')  # killed mid-write
    assert [r["id"] for r in repair_jsonl(log)] == [1]
    append_jsonl(log, {"id": 3})
    assert [r["id"] for r in read_jsonl(log, strict=True)] == [1, 3]


def test_malformed_line_in_the_middle_names_file_and_line(tmp_path):
    log = tmp_path / "r.jsonl"
    log.write_text('{"id": 1}\n{oops\n{"id": 3}\n')
    with pytest.raises(ValueError, match=r"r.jsonl:2: malformed JSON line"):
        read_jsonl(log)


def test_an_append_after_a_torn_line_never_lands_on_it(tmp_path):
    """Readers that only read_jsonl (the long-context grid, perplexity, tune) then append: the torn
    tail is cut by the append itself, so the log stays readable strictly."""
    log = tmp_path / "r.jsonl"
    append_jsonl(log, {"id": 1})
    with open(log, "a") as f:
        f.write('{"id": 2, "tor')  # killed mid-write
    assert [r["id"] for r in read_jsonl(log)] == [1]  # a resuming reader sees id 1 done
    append_jsonl(log, {"id": 2})
    append_jsonl(log, {"id": 3})
    assert [r["id"] for r in read_jsonl(log, strict=True)] == [1, 2, 3]
    torn_only = tmp_path / "t.jsonl"
    torn_only.write_text('{"id": 1, "to')
    append_jsonl(torn_only, {"id": 1})
    assert read_jsonl(torn_only, strict=True) == [{"id": 1}]


def test_a_complete_last_line_without_its_newline_is_kept(tmp_path):
    """A log written by hand or another tool may end in a valid record without a newline: the
    append adds the newline instead of cutting the record a reader has already seen."""
    log = tmp_path / "r.jsonl"
    log.write_text('{"a": 1}\n{"b": 2}')
    assert read_jsonl(log) == [{"a": 1}, {"b": 2}]
    append_jsonl(log, {"c": 3})
    assert read_jsonl(log, strict=True) == [{"a": 1}, {"b": 2}, {"c": 3}]
