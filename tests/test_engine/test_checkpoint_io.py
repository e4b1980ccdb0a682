""":mod:`mmsoft.utils.checkpoint_io` on small files: what is no complete
checkpoint, and the one line of a refused one."""
import pickle

import pytest
import torch

from mmsoft.utils import checkpoint_io as cio


def test_describe_damage_names_each_kind(tmp_path):
    good = tmp_path / 'good.pth'
    torch.save(dict(w=torch.zeros(256)), good)
    assert cio.describe_damage(str(good)) is None
    legacy = tmp_path / 'legacy.pth'
    torch.save(dict(w=1), legacy, _use_new_zipfile_serialization=False)
    assert cio.describe_damage(str(legacy)) is None  # torch.load checks it
    empty = tmp_path / 'empty.pth'
    empty.write_bytes(b'')
    assert cio.describe_damage(str(empty)) == 'is empty (0 bytes)'
    gif = tmp_path / 'image.pth'
    gif.write_bytes(b'GIF89a' + bytes(100))
    assert cio.describe_damage(str(gif)) == \
        "is not a torch checkpoint (starts with b'GIF8')"
    data = bytearray(good.read_bytes())
    cut = tmp_path / 'cut.pth'
    cut.write_bytes(bytes(data[:len(data) // 2]))
    assert cio.describe_damage(str(cut)).startswith(
        f'is truncated or corrupt ({len(data) // 2} bytes; ')
    at = data.index(bytes(1024))  # inside the tensor's record
    data[at] ^= 0xFF
    flipped = tmp_path / 'flipped.pth'
    flipped.write_bytes(bytes(data))
    reason = cio.describe_damage(str(flipped))
    assert reason.startswith("is corrupt (CRC error in record '") and \
        reason.endswith("/data/0')")
    assert cio.describe_damage(str(tmp_path / 'gone.pth')) == \
        'cannot be read (No such file or directory)'


def test_load_verified_honours_map_location(tmp_path):
    path = tmp_path / 'w.pth'
    torch.save(dict(w=torch.ones(2)), path)
    seen = []

    def where(storage, location):
        seen.append(location)
        return storage

    assert torch.equal(
        cio.load_verified(str(path), map_location=where)['w'], torch.ones(2))
    assert seen == ['cpu']
    assert cio.load_verified(str(path))['w'].device == torch.device('cpu')


def test_refusal_is_one_line_naming_what_and_the_fix(tmp_path):
    zipped = tmp_path / 'zip.pth'
    torch.save(dict(w=1), zipped)
    head = f'checkpoint {zipped} was refused: it holds '
    tail = ('which could run code when unpickled; convert it with '
            'tools/model_converters/soft2mmsoft.py SRC DST (add '
            '--trust-checkpoint there only if you trust the file)')
    # objects of classes: the converter may unpickle a trusted file
    assert cio.refusal_message(str(zipped), ['x.Opaque', 'argparse.Action']) \
        == (f'{head}pickled objects other than tensors and plain '
            f'containers (x.Opaque, argparse.Action), {tail}')
    # code: named, and no advice that would unpickle it
    code = cio.refusal_message(
        str(zipped), ['x.Opaque', 'os.system', 'builtins.eval'], fix='FIX')
    assert code == (f'{head}pickled code (os.system, builtins.eval) that '
                    f'would run when unpickled; mmsoft never unpickles such '
                    f'a file, whatever the options: get the weights again '
                    f'from their original source')
    assert cio.refusal_message(str(zipped), []) == (
        f'{head}pickled objects other than tensors and plain containers, '
        f'{tail}')
    plain = tmp_path / 'plain.pkl'
    plain.write_bytes(pickle.dumps(dict(w=1)))
    assert cio.refusal_message(
        str(plain), [], fix='use the .pth'
    ) == (f"checkpoint {plain} was refused: it holds a plain / legacy pickle "
          f"(not torch's zip format) with pickled objects other than tensors "
          f'and plain containers, which could run code when unpickled; use '
          f'the .pth')
    gone = str(tmp_path / 'gone.pth')
    assert 'legacy' not in cio.refusal_message(gone, [])


def _legacy_checkpoint(path):
    """An mmengine training checkpoint in torch's legacy format; its bytes."""
    import numpy as np
    from mmengine.logging import HistoryBuffer
    model = torch.nn.Linear(64, 32)
    torch.save(
        dict(
            state_dict=dict(model.state_dict(), idx=torch.arange(5)),
            optimizer=torch.optim.SGD(model.parameters(), 0.1).state_dict(),
            meta=dict(epoch=1, seed=np.int64(3), arr=np.zeros(3)),
            message_hub=dict(loss=HistoryBuffer([1.0, 2.0], [1, 1]))),
        path,
        _use_new_zipfile_serialization=False)
    return path.read_bytes()


def test_describe_damage_reads_a_whole_legacy_file(tmp_path):
    """An undamaged legacy file: no verdict (and nothing of it runs)."""
    _legacy_checkpoint(tmp_path / 'whole.pth')
    assert cio.describe_damage(str(tmp_path / 'whole.pth')) is None


@pytest.mark.parametrize(
    'keep, where',
    [
        (40, 'pickles'),  # in the system info
        (300, 'pickles'),  # in the checkpoint's pickle
        (-200, 'tensor data'),  # in the last storage
        (-1, 'tensor data'),
    ])
def test_describe_damage_of_a_cut_legacy_file(tmp_path, keep, where):
    """A legacy file cut short: truncated, and where it ends."""
    data = _legacy_checkpoint(tmp_path / 'whole.pth')
    n = keep % len(data)
    cut = tmp_path / 'cut.pth'
    cut.write_bytes(data[:n])
    assert cio.describe_damage(str(cut)) == (
        f"is truncated or corrupt ({n} bytes; torch's legacy (non-zip) "
        f'format, cut short in its {where})')
    with pytest.raises(cio.CheckpointError, match='is truncated or corrupt'):
        cio.load_verified(str(cut))


def test_load_verified_names_a_damaged_legacy_file(tmp_path, monkeypatch):
    """torch.load's error in a legacy file is a CheckpointError."""
    data = _legacy_checkpoint(tmp_path / 'whole.pth')
    cut = tmp_path / 'cut.pth'
    cut.write_bytes(data[:-100])
    monkeypatch.setattr(cio, 'describe_damage', lambda path: None)
    with pytest.raises(cio.CheckpointError) as e:
        cio.load_verified(str(cut))
    assert str(e.value).startswith(
        f"checkpoint {cut} is truncated or corrupt (torch's legacy (non-zip) "
        'format: RuntimeError: unexpected EOF')
