"""What goes to tinker: its request bytes made by the Rust core
(:mod:`.forward_backward`, :mod:`.sample`, declared together in
:mod:`.request_bytes`), coalesced sampling (:mod:`.coalesce`) and its
transport (:mod:`.transport`), each module declaring its pieces.

:func:`tinker_rl_data.install` puts in the request bytes alone, for a
program that sends its own Datums; a cookbook trainer uses
:func:`tinker_rl_data.cookbook.install`, which includes them. Both are
above this package (they read the whole list of features,
:mod:`tinker_rl_data.features`, where each feature module here registers
its declaration; ``tinker_rl_data.cookbook`` imports them): nothing here
imports upwards.
"""
