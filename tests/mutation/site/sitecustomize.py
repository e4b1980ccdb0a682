"""Imported by every interpreter that ``make mutations`` starts (this folder
is on ``PYTHONPATH`` there, nowhere else).

During mutmut's stats run (``MUTANT_UNDER_TEST=stats``) the tests that run a
tool in a child process (the script server, ``tools/dist_train.sh``) call
mutated functions in that child, where mutmut does not see them. Here such
a child records the names itself and writes them, at exit, to
``$MMSOFT_MUTMUT_HITS/<pid>.txt``; :mod:`mmsoft_mutmut_stats` adds them to
the test that started the child. Without it, a function that only the
tools' tests reach has no test for mutmut ("no tests").
"""
import os

if (os.environ.get('MUTANT_UNDER_TEST') == 'stats'
        and os.environ.get('MMSOFT_MUTMUT_HITS')):
    import atexit

    try:
        from mutmut.mutation import trampoline
    except ImportError:  # not the interpreter of the mutation run
        trampoline = None
    if trampoline is not None:
        _hits = set()

        def _record(name, caller=None):
            _hits.add(name)

        def _dump(folder=os.environ['MMSOFT_MUTMUT_HITS']):
            if not _hits:
                return
            path = os.path.join(folder, f'{os.getpid()}.txt')
            with open(path + '.part', 'w') as f:
                f.write('\n'.join(sorted(_hits)))
            os.replace(path + '.part', path)

        # mutmut's own recorder reads its configuration from the working
        # directory, which a tool's child does not share
        trampoline.record_trampoline_hit = _record
        atexit.register(_dump)
