"""What the tests share: the plain-Python reference written from the
contract (:mod:`.reference`), hypothesis strategies for cookbook batches
(:mod:`.cookbook_strategies`), tinker's own encoding of Datums
(:mod:`.tinker_bytes`), and the trainer harness: a fake tinker service
(:mod:`.fake_tinker`), one process running tinker-cookbook's own
`rl.train.main` against it (:mod:`.trainer_run`) on token-list workloads
(:mod:`.cookbook_env`, :mod:`.workloads`), and a run's checks against
stock's (:mod:`.trainer_checks`). bench/ imports these, never the reverse.
Strategies for evsys batches and fixtures are in ``tests/conftest.py``."""
