"""The argument checks every entry point shares: what each accepts, what it returns, and the
message that names the argument, its value and what is allowed."""

import math

import numpy as np
import pytest

from decodelab import checks


@pytest.mark.parametrize("value", [3, np.int32(3), np.int64(3)])
def test_check_int_returns_a_python_int(value):
    result = checks.check_int("n", value, 1)
    assert result == 3 and type(result) is int


@pytest.mark.parametrize("value, message", [
    (0, "n must be an int >= 1, got 0"),
    (True, "n must be an int >= 1, got True"),
    (np.bool_(True), "n must be an int >= 1, got np.True_"),
    (2.0, "n must be an int >= 1, got 2.0"),
    ("2", "n must be an int >= 1, got '2'"),
    (9, "n must be <= 8, got 9"),
])
def test_check_int_refuses_by_name(value, message):
    with pytest.raises(ValueError) as refused:
        checks.check_int("n", value, 1, 8)
    assert str(refused.value) == message


def test_check_size_refuses_what_int32_cannot_hold():
    assert checks.check_size("max_len", 2**31 - 1, 1) == 2**31 - 1
    with pytest.raises(ValueError) as refused:
        checks.check_size("max_len", 2**31, 1)
    assert str(refused.value) == ("max_len must be <= 2**31 - 1 (it is stored as int32), got "
                                  "2147483648")


@pytest.mark.parametrize("value", [0.5, 1, np.float32(0.5), np.int64(1)])
def test_check_number_returns_the_value_unchanged(value):
    assert checks.check_number("x", value, 0, 1) is value


@pytest.mark.parametrize("bounds, value, message", [
    (dict(), math.nan, "x must be a finite number, got nan"),
    (dict(), math.inf, "x must be a finite number, got inf"),
    (dict(), True, "x must be a finite number, got True"),
    (dict(), "1.0", "x must be a finite number, got '1.0'"),
    (dict(low=0, open_low=True), 0, "x must be a finite number > 0, got 0"),
    (dict(low=0), -0.5, "x must be a finite number >= 0, got -0.5"),
    (dict(high=1, open_high=True), 1.0, "x must be a finite number < 1, got 1.0"),
    (dict(high=1), 2, "x must be a finite number <= 1, got 2"),
    (dict(low=0, high=1, open_high=True), 1.0, "x must be a finite number in [0, 1), got 1.0"),
    (dict(low=0, high=1.0, open_low=True), 0.0, "x must be a finite number in (0, 1.0], got 0.0"),
])
def test_check_number_names_the_range_it_refuses(bounds, value, message):
    with pytest.raises(ValueError) as refused:
        checks.check_number("x", value, **bounds)
    assert str(refused.value) == message


def test_the_ends_of_a_closed_range_are_accepted_and_of_an_open_one_refused():
    assert checks.check_number("x", 0, 0, 1) == 0 and checks.check_number("x", 1, 0, 1) == 1
    for value in (0, 1):
        with pytest.raises(ValueError, match=r"x must be a finite number in \(0, 1\)"):
            checks.check_number("x", value, 0, 1, open_low=True, open_high=True)


def test_check_one_of_and_check_bool_name_what_is_allowed():
    assert checks.check_one_of("mode", "chunks", ("chunks", "sliding")) == "chunks"
    with pytest.raises(ValueError) as refused:
        checks.check_one_of("mode", "windows", ("chunks", "sliding"))
    assert str(refused.value) == "mode must be one of ('chunks', 'sliding'), got 'windows'"
    assert checks.check_bool("flag", False) is False
    with pytest.raises(ValueError, match="^flag must be a bool, got 1$"):
        checks.check_bool("flag", 1)


def test_check_path_reads_only_what_exists_as_its_kind(tmp_path):
    (tmp_path / "file").write_text("x")
    assert checks.check_path("path", str(tmp_path / "file"), "file") == tmp_path / "file"
    with pytest.raises(ValueError, match=f"^path must be an existing tokenizer model file, got "
                                         f"'{tmp_path / 'nope'}'$"):
        checks.check_path("path", tmp_path / "nope", "file", what="tokenizer model ")
    with pytest.raises(ValueError, match=f"^path must be a directory, got a file: "
                                         f"'{tmp_path / 'file'}'$"):
        checks.check_path("path", tmp_path / "file", "directory")
    for empty in ("", None, 3):
        with pytest.raises(ValueError, match=f"^path must be a non-empty path .*, got {empty!r}$"):
            checks.check_path("path", empty, "directory", write=True)


def test_check_path_to_write_creates_the_folder_and_refuses_one_it_cannot_write(tmp_path):
    made = checks.check_path("out", tmp_path / "a" / "b.model", "file", write=True)
    assert made == tmp_path / "a" / "b.model" and list((tmp_path / "a").iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=f"^out must be a path this process can write, got "
                                         f"'{tmp_path / 'file' / 'ckpt'}': cannot write "
                                         f"'{tmp_path / 'file'}"):
        checks.check_path("out", tmp_path / "file" / "ckpt", "directory", write=True)
    with pytest.raises(ValueError, match="^out must be a file, got a directory"):
        checks.check_path("out", tmp_path / "a", "file", write=True)
