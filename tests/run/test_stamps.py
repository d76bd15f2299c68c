"""Stage stamps (nmt/run/stamps.py): a stage is done only for the inputs it was stamped with."""

from nmt.run.stamps import hash_files, stage_is_done, write_stamp


def test_stamps_detect_changed_inputs(tmp_path):
    f = tmp_path / "a.txt"
    f.write_text("one")
    digest = hash_files([f], {"k": 1})
    assert not stage_is_done(tmp_path, "stage", digest)
    write_stamp(tmp_path, "stage", digest)
    assert stage_is_done(tmp_path, "stage", digest)
    assert not stage_is_done(tmp_path, "stage", hash_files([f], {"k": 2}))
    f.write_text("two")
    assert not stage_is_done(tmp_path, "stage", hash_files([f], {"k": 1}))
