"""Testing with a checkpoint path that does not exist: one line on stderr
(which file, what to give instead) and exit status 1, before the config is
loaded or any worker starts (no config dump, no traceback)."""
import os.path as osp
import sys

import pytest
from conftest import TOOLS, run

CONFIG = 'configs/upernet_soft_small_512x512_160k_ade20k.py'
COMMANDS = {
    'test.py': [sys.executable,
                osp.join(TOOLS, 'test.py'), CONFIG],
    'dist_test.sh': ['bash', osp.join(TOOLS, 'dist_test.sh'), CONFIG],
    'slurm_test.sh':
    ['bash', osp.join(TOOLS, 'slurm_test.sh'), 'part', 'job', CONFIG],
}


@pytest.mark.parametrize('tool', sorted(COMMANDS))
def test_missing_checkpoint_one_line(tool, tmp_path):
    ckpt = str(tmp_path / 'no_such_dir' / 'epoch_12.pth')
    cmd = COMMANDS[tool] + [ckpt]
    if tool == 'dist_test.sh':
        cmd.append('8')  # GPUS
    proc = run(cmd + ['--work-dir', str(tmp_path / 'work')], timeout=300)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"error: checkpoint '{ckpt}' not found")
    assert 'work_dirs/<config>/epoch_N.pth' in lines[0]  # the fix
    # no weights to download from the model zoo (issue 51): the authors'
    # ImageNet files are on the official weights page
    assert 'mmsoft releases no trained weights' in lines[0]
    assert 'docs/en/user_guides/official_weights.md' in lines[0]
    assert proc.stdout == ''  # no config dump
    assert not osp.exists(tmp_path / 'work')  # no Runner
