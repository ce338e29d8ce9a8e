"""The output-folder check that runs before ε is reserved: writable, room for twice the output, file-size limit."""

import os
import resource

import pytest

from kepsilon.tasks.errors import SpecError
from kepsilon.tasks.preflight import ROOM_FACTOR, check_output_dir, expected_output_bytes
from kepsilon.tasks.publish import AlreadyPublished


def test_a_missing_folder_is_made_and_nothing_is_left_in_it(tmp_path):
    folder = check_output_dir(tmp_path / "a" / "b", "r1", 1000)
    assert folder == (tmp_path / "a" / "b").absolute() and list(folder.iterdir()) == []


def test_a_file_is_not_a_folder(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(SpecError, match="output_dir.*is a file"):
        check_output_dir(tmp_path / "f", "r1", 1000)
    with pytest.raises(SpecError, match="output_dir.*cannot be made"):
        check_output_dir(tmp_path / "f" / "sub", "r1", 1000)


def test_an_existing_release_folder_is_refused(tmp_path):
    (tmp_path / "r1").mkdir()
    with pytest.raises(AlreadyPublished, match="r1"):
        check_output_dir(tmp_path, "r1", 1000)


def test_a_folder_without_room_for_twice_the_output_is_refused(tmp_path):
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    too_big = free // (2 * ROOM_FACTOR) + 1  # its expected output (two files) doubled exceeds the free space
    with pytest.raises(SpecError, match="bytes free; this release needs"):
        check_output_dir(tmp_path, "r1", too_big)
    check_output_dir(tmp_path, "r1", 10_000)


def test_a_file_size_limit_below_the_expected_data_file_is_refused(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    largest, _ = expected_output_bytes(10_000_000)
    resource.setrlimit(resource.RLIMIT_FSIZE, (largest - 1, hard))
    try:
        with pytest.raises(SpecError, match="ulimit -f"):
            check_output_dir(tmp_path, "r1", 10_000_000)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_an_unwritable_folder_is_refused(tmp_path):
    from reliability.harness import make_unwritable

    folder = tmp_path / "ro"
    folder.mkdir()
    undo = make_unwritable(folder)
    if undo is None:
        pytest.skip("neither mode 0555 nor chattr +i makes a folder unwritable here")
    try:
        with pytest.raises(SpecError, match="output_dir.*not writable"):
            check_output_dir(folder, "r1", 1000)
    finally:
        undo()
