"""Utilities of mmsoft that know nothing of its models: paths of the
shipped files (:mod:`.paths`), atomic writes (:mod:`.atomic`), safely read
checkpoints (:mod:`.checkpoint_io`), strict
state-dict comparison (:mod:`.strict_load`) and RNG states
(:mod:`.rng_state`). Import the submodules; nothing here imports
:mod:`mmsoft.models` (the official-checkpoint key map lives in
:mod:`mmsoft.models.arch_zoo`, its conversion in
:mod:`mmsoft.models.converters`, loading weights into models in
:mod:`mmsoft.models.loading`)."""
