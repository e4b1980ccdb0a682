"""Import-time noise of the supported stacks that a user cannot act on.

torch 2.4 warns, on importing ``torch.distributed.optim``, that TorchScript
support for functional optimizers is deprecated. It sets
``warnings.simplefilter('always')`` around that warning, so no filter of
the caller can hide it, and mmengine imports that module
(``mmengine.optim.optimizer.zero_optimizer``) whenever ``mmsoft`` or a tool
imports mmengine's runner: every tool's first line of output was that
warning, before the tool's own one-line message.

:func:`quiet_stack_imports` imports the module once, before mmengine does,
and drops exactly that message while doing so. It does nothing when the
module is already imported (a user who imported it sees torch's warning as
usual) or on stacks without the warning; any other warning is shown.
"""
import importlib
import sys
import warnings

#: module -> the start of the one warning dropped while importing it
NOISY_IMPORTS = {
    'torch.distributed.optim':
    '`TorchScript` support for functional optimizers is deprecated',
}


def quiet_stack_imports():
    """Import the modules of :data:`NOISY_IMPORTS` without their warning.

    Returns:
        list[str]: the modules imported by this call.
    """
    done = []
    for module, prefix in NOISY_IMPORTS.items():
        if module in sys.modules:
            continue
        shown = warnings.showwarning

        def show(message,
                 category,
                 filename,
                 lineno,
                 file=None,
                 line=None,
                 _prefix=prefix,
                 _shown=shown):
            if not str(message).startswith(_prefix):
                _shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        try:
            importlib.import_module(module)
            done.append(module)
        except Exception:  # noqa: BLE001 (no distributed build: mmengine
            pass  # copes with that itself)
        finally:
            warnings.showwarning = shown
    return done
