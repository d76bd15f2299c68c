"""nmt.files.replace_dir: a directory swapped in whole."""

from nmt.files import replace_dir


def test_a_finished_directory_replaces_the_old_one_whole(tmp_path):
    dest, new = tmp_path / "bin", tmp_path / ".bin.tmp"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    new.mkdir()
    (new / "new.txt").write_text("new")
    replace_dir(new, dest)
    assert [p.name for p in dest.iterdir()] == ["new.txt"] and not new.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]  # the old one was removed


def test_a_directory_with_no_predecessor_is_put_in_place(tmp_path):
    new = tmp_path / "new"
    new.mkdir()
    replace_dir(new, tmp_path / "dest")
    assert (tmp_path / "dest").is_dir() and not new.exists()
