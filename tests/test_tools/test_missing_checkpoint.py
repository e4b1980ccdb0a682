"""Testing with a checkpoint path that does not exist: one line (which file,
what to give instead), exit 1, before the config is loaded or any worker
starts (no config dump, no traceback, no Runner)."""
import os.path as osp

import pytest
from conftest import TOOLS, run, tool_namespace

CONFIG = 'configs/upernet_soft_small_512x512_160k_ade20k.py'


@pytest.mark.parametrize('tool', ['test.py', 'dist_test.sh', 'slurm_test.sh'])
def test_missing_checkpoint_one_line(tool, tmp_path, capsys):
    ckpt, work = str(tmp_path / 'no_such_dir' / 'epoch_12.pth'), tmp_path / 'w'
    args = [CONFIG, ckpt, '8'] if tool == 'dist_test.sh' else [CONFIG, ckpt]
    args += ['--work-dir', str(work)]
    if tool == 'test.py':  # in-process: main's sys.exit(line)
        with pytest.raises(SystemExit) as exc:
            tool_namespace('test')['main'](args)
        err, out, rc = exc.value.code, capsys.readouterr().out, 1
    else:
        part = ['part', 'job'] if tool == 'slurm_test.sh' else []
        proc = run(['bash', osp.join(TOOLS, tool), *part, *args], timeout=300)
        err, out, rc = proc.stderr.strip(), proc.stdout, proc.returncode
    # the fix; no weights to download from a model zoo (issue 51): the
    # authors' ImageNet files are on the official weights page
    assert rc == 1 and err == (
        f"error: checkpoint '{ckpt}' not found: give the path of a trained "
        'model (work_dirs/<config>/epoch_N.pth or iter_N.pth); mmsoft '
        "releases no trained weights (the authors' ImageNet classifiers, "
        'converted: docs/en/user_guides/official_weights.md)'), err
    assert out == '' and not osp.exists(work)
