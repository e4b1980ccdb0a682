"""``make mutations`` only: in mutmut's stats run a child process records
the mutated functions it ran to ``$MMSOFT_MUTMUT_HITS/<pid>.txt`` at exit,
credited to the running test by :mod:`mmsoft_mutmut_stats`."""
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

        # mutmut's recorder reads its config from the working directory
        trampoline.record_trampoline_hit = lambda name, caller=None: _hits.add(
            name)
        atexit.register(_dump)
