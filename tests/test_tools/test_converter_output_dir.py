"""The converters create the folder of their output (issue 51): the
documented ``soft2mmsoft.py SRC weights/SRC --norm`` works in a fresh
clone, which has no ``weights/``.

The folders are created just before the file is written (a conversion
that fails leaves none behind, nor does a failed write); a file where a
folder must be stops before anything is read, with one line naming it.
"""
import os
import os.path as osp
import sys

import pytest
import torch
from conftest import TOOLS, load_tool, run, tiny_arch
from reference.official_soft_ref import random_official_state_dict

from mmsoft.models.converters import ConversionError

ARCH = tiny_arch()


@pytest.fixture(scope='module')
def official(tmp_path_factory):
    """An authors'-layout file of a tiny SOFT ({'model': state dict})."""
    path = tmp_path_factory.mktemp('official') / 'soft_norm_tiny.pth'
    sd = random_official_state_dict(
        ARCH['embed_dims'],
        ARCH['num_heads'],
        ARCH['depths'],
        dtype=torch.float32)
    torch.save({'model': sd}, path)
    return str(path)


def converter(name):
    return load_tool(f'model_converters/{name}.py')


def test_readme_command_in_a_fresh_clone(official, tmp_path):
    """The command of README.md / get_started.md / official_weights.md,
    run as a user does, from a directory without ``weights/``."""
    proc = run([
        sys.executable,
        osp.join(TOOLS, 'model_converters', 'soft2mmsoft.py'), official,
        'weights/soft_norm_tiny.pth', '--norm'
    ],
               cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert 'created the output directory weights' in proc.stdout
    ckpt = torch.load(tmp_path / 'weights' / 'soft_norm_tiny.pth')
    assert ckpt['meta']['attn_norm'] is True
    assert any(k.startswith('backbone.') for k in ckpt['state_dict'])


@pytest.mark.parametrize('name', ['soft2mmsoft', 'mmsoft2soft'])
def test_nested_folders_created(name, official, tmp_path, capsys):
    src = official
    if name == 'mmsoft2soft':  # its input: an mmsoft file
        src = str(tmp_path / 'mmsoft.pth')
        assert converter('soft2mmsoft').main([official, src]) == 0
    dst = tmp_path / 'a' / 'b' / 'out.pth'
    assert converter(name).main([src, str(dst)]) == 0
    assert dst.is_file()
    assert f'created the output directory {dst.parent}' in \
        capsys.readouterr().out
    # an existing folder: nothing to create, nothing said
    assert converter(name).main([src, str(dst)]) == 0
    assert 'created the output' not in capsys.readouterr().out


@pytest.mark.parametrize('name', ['soft2mmsoft', 'mmsoft2soft'])
def test_a_file_in_the_way_is_one_line(name, official, tmp_path, capsys):
    blocker = tmp_path / 'weights'
    blocker.write_text('not a folder')
    for dst in (blocker / 'x.pth', blocker / 'sub' / 'x.pth'):
        assert converter(name).main([official, str(dst)]) == 1
        out, err = capsys.readouterr()
        assert err.strip().splitlines() == [
            f'error: cannot create the output directory of {str(dst)!r}: '
            f'{str(blocker)!r} is a file, not a directory; choose another '
            f'output path'
        ]
        assert 'reading' not in out  # refused before the input is read
    assert os.listdir(tmp_path) == ['weights']
    assert blocker.read_text() == 'not a folder'


def test_failed_conversion_creates_nothing(tmp_path, capsys):
    bad = tmp_path / 'bad.pth'
    torch.save({'model': {'foo': torch.zeros(1)}}, bad)
    assert converter('soft2mmsoft').main(
        [str(bad), str(tmp_path / 'weights' / 'x.pth')]) == 1
    assert os.listdir(tmp_path) == ['bad.pth']


def test_failed_write_removes_the_folders_it_made(official, tmp_path,
                                                  monkeypatch, capsys):
    mod = converter('soft2mmsoft')
    (tmp_path / 'kept').mkdir()

    def full_disk(obj, path):
        raise ConversionError(f'cannot write {path!r}: No space left on '
                              'device (errno 28); nothing was written')

    monkeypatch.setattr(mod.files, 'save_checkpoint_atomic', full_disk)
    dst = tmp_path / 'kept' / 'new' / 'deeper' / 'x.pth'
    assert mod.main([official, str(dst)]) == 1
    assert 'No space left on device' in capsys.readouterr().err
    assert os.listdir(tmp_path / 'kept') == []  # made and removed


def test_folder_that_cannot_be_made_is_one_line(official, tmp_path,
                                                monkeypatch, capsys):
    mod = converter('mmsoft2soft')
    src = str(tmp_path / 'mmsoft.pth')
    assert converter('soft2mmsoft').main([official, src]) == 0
    capsys.readouterr()

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, 'Permission denied', path)

    monkeypatch.setattr(os, 'makedirs', refuse)  # the shared helper's
    dst = tmp_path / 'ro' / 'x.pth'
    assert mod.main([src, str(dst)]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f'error: cannot create the output directory '
        f'{str(dst.parent)!r}: Permission denied; choose another output path'
    ]
