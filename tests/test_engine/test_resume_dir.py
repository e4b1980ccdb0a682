""":mod:`mmsoft.engine.hooks.resume`: the file to resume, the dir's owner."""
import logging
import os
import os.path as osp
import zipfile

import pytest
import torch
from mmengine.logging import MMLogger

from mmsoft.engine.hooks import checkpoint_hook as resume


def _ckpt(path, meta=True):
    sd = dict(w=torch.zeros(2))
    torch.save(dict(meta={}, state_dict=sd) if meta else sd, path)
    return str(path)


def _dirs(tmp_path, *names):
    for name in names:
        (tmp_path / name).mkdir()
    return (tmp_path / name for name in names)


@pytest.fixture
def logged():
    """The warnings of the current MMLogger (the Runner's log)."""
    records, handler = [], logging.Handler(logging.WARNING)
    handler.emit = lambda r: records.append(r.getMessage())
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_candidates_are_this_runs_checkpoints_newest_first(tmp_path):
    """By N, then mtime; ``extra`` last; other names left out."""
    work, out = _dirs(tmp_path, 'work', 'out')
    for name in ('iter_9.pth', 'iter_10.pth', 'iter_2.pth.bak',
                 '.iter_12.pth.99.0123abcd.mmsoft-tmp', 'best.pth',
                 'iter_1.pth'):
        (work / name).write_bytes(b'x')
    os.utime(work / 'iter_1.pth', (1e9, 1e9))  # older than best.pth
    (out / 'iter_10.pth').write_bytes(b'x')
    os.utime(work / 'iter_10.pth', (1e9, 1e9))
    os.utime(out / 'iter_10.pth', (2e9, 2e9))  # the newer of the two
    (out / 'epoch_3.pth').write_bytes(b'x')
    found = resume.checkpoint_candidates(
        [str(work), str(out), str(tmp_path / 'gone')],
        [str(work / 'best.pth'),
         str(tmp_path / 'missing.pth'), None])
    assert found == [
        str(out / 'iter_10.pth'),
        str(work / 'iter_10.pth'),
        str(work / 'iter_9.pth'),
        str(out / 'epoch_3.pth'),
        str(work / 'iter_1.pth'),
        str(work / 'best.pth'),
    ]
    os.utime(work / 'iter_10.pth', (3e9, 3e9))  # now the work dir's
    assert resume.checkpoint_candidates([str(work), str(out)])[:2] == \
        [str(work / 'iter_10.pth'), str(out / 'iter_10.pth')]


def test_check_complete_names_what_is_wrong(tmp_path, monkeypatch):
    assert resume.check_complete(_ckpt(tmp_path / 'iter_2.pth')) is None
    assert resume.check_complete(_ckpt(tmp_path / 'w.pth', meta=False)) == \
        'is not a training checkpoint (no meta)'
    empty = tmp_path / 'iter_4.pth'
    empty.write_bytes(b'')
    assert resume.check_complete(str(empty)) == (
        f'checkpoint {empty} is empty (0 bytes); it was not loaded (use an '
        f'earlier or a fresh copy)')
    # a zip but no checkpoint: the load error's type and first line
    path = str(tmp_path / 'notes.pth')
    with zipfile.ZipFile(path, 'w') as z:
        z.writestr('notes.txt', 'not a checkpoint')
    with pytest.raises(Exception) as e:
        resume.load_verified(path)
    first = str(e.value).splitlines()[0]
    assert first and resume.check_complete(path) == \
        f'cannot be loaded ({type(e.value).__name__}: {first})'

    def load(path):
        raise EOFError()

    monkeypatch.setattr(resume, 'load_verified', load)
    assert resume.check_complete(path) == 'cannot be loaded (EOFError: )'


def test_newest_complete_through_last_checkpoint(tmp_path):
    """Naming an older file: the newest wins; a renamed file: found."""
    work, = _dirs(tmp_path, 'work')
    good, newest = _ckpt(work / 'iter_2.pth'), _ckpt(work / 'iter_6.pth')
    (work / 'last_checkpoint').write_text(good + '\n')
    assert resume.find_newest_complete(str(work)) == (newest, [])
    os.unlink(newest)
    (work / 'iter_4.pth').write_bytes(b'')
    os.rename(good, work / 'final.pth')
    (work / 'last_checkpoint').write_text(str(work / 'final.pth'))
    path, skipped = resume.find_newest_complete(str(work))
    assert path == str(work / 'final.pth')
    assert [p for p, _ in skipped] == [str(work / 'iter_4.pth')]


def test_checkpoint_dir_belongs_to_the_first_work_dir(tmp_path):
    """The first run owns it; another is refused in one line."""
    ckpt_dir = str(tmp_path / 'out' / 'run')
    a, b = str(tmp_path / 'a' / 'run'), str(tmp_path / 'b' / 'run')
    marker = osp.join(ckpt_dir, resume.OWNER_FILE)
    resume.claim_checkpoint_dir(ckpt_dir, a)
    assert open(marker).read() == osp.realpath(a) + '\n'
    resume.claim_checkpoint_dir(ckpt_dir, a)
    with pytest.raises(resume.CheckpointDirInUse) as e:
        resume.claim_checkpoint_dir(ckpt_dir, b)
    msg = str(e.value)
    assert '\n' not in msg
    assert msg.startswith(f'checkpoint directory {ckpt_dir} ')
    assert f'belongs to the run in work dir {osp.realpath(a)} ({marker}), ' \
        f'not to this one ({osp.realpath(b)})' in msg
    assert msg.endswith(f'delete {marker})')
    open(marker, 'w').close()
    resume.claim_checkpoint_dir(ckpt_dir, b)
    assert open(marker).read() == osp.realpath(b) + '\n'
    # the work dir itself needs no owner file
    resume.claim_checkpoint_dir(a, a)
    assert not osp.exists(osp.join(a, resume.OWNER_FILE))


def test_last_checkpoint_through_another_spelling_of_the_work_dir(
        tmp_path, logged):
    """``last_checkpoint`` naming the file through a symlink: no warning."""
    work, = _dirs(tmp_path, 'real')
    link = tmp_path / 'link'
    link.symlink_to(work, target_is_directory=True)
    _ckpt(work / 'final.pth')
    named = str(link / 'final.pth')
    (work / 'last_checkpoint').write_text(named)
    assert resume.find_newest_complete(str(work)) == (named, [])
    assert logged == []


def test_resume_search_warnings(tmp_path, logged):
    """One warning per foreign, damaged or missing file."""
    work, out, other = _dirs(tmp_path, 'work', 'out', 'other')
    last = osp.join(work, 'last_checkpoint')
    foreign = _ckpt(other / 'iter_8.pth')
    (work / 'last_checkpoint').write_text(foreign)
    (out / 'iter_6.pth').write_bytes(b'')
    _ckpt(work / 'iter_4.pth', meta=False)
    good = _ckpt(work / 'iter_2.pth')
    assert resume.find_newest_complete(str(work), str(out))[0] == good
    assert logged == [
        f'mmsoft: {last} names {foreign}, outside this run\'s checkpoint '
        f'directory (a copied or moved work dir?): ignored; resuming from '
        f'the newest checkpoint of {work} / {out}',
        f'mmsoft: skipping checkpoint {out / "iter_6.pth"} is empty (0 '
        f'bytes); it was not loaded (use an earlier or a fresh copy)',
        f'mmsoft: skipping checkpoint {work / "iter_4.pth"}: it is not a '
        f'training checkpoint (no meta)',
    ]
    logged.clear()
    gone = str(work / 'iter_10.pth')
    (work / 'last_checkpoint').write_text(gone)
    for f in ('iter_4.pth', 'iter_2.pth'):
        os.unlink(work / f)
    os.unlink(out / 'iter_6.pth')
    assert resume.find_newest_complete(str(work), str(out)) == (None, [])
    assert logged == [
        f'mmsoft: last_checkpoint names {gone}, which does not exist'
    ]
