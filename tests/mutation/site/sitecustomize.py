"""On ``PYTHONPATH`` of ``make mutations`` only: in mutmut's stats run a
tool's child process (the script server, ``tools/dist_train.sh``) records
the mutated functions it ran and writes them at exit to
``$MMSOFT_MUTMUT_HITS/<pid>.txt``, which :mod:`mmsoft_mutmut_stats` credits
to the running test (mutmut sees its own process only)."""
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

        def _dump(folder=os.environ['MMSOFT_MUTMUT_HITS']):
            if _hits:
                path = os.path.join(folder, f'{os.getpid()}.txt')
                with open(path + '.part', 'w') as f:
                    f.write('\n'.join(sorted(_hits)))
                os.replace(path + '.part', path)

        # mutmut's own recorder reads its configuration from the working
        # directory, which a tool's child does not share
        trampoline.record_trampoline_hit = lambda name, caller=None: _hits.add(
            name)
        atexit.register(_dump)
