"""What the tests share: the plain-Python reference written from the
contract (:mod:`.reference`), hypothesis strategies for cookbook batches
(:mod:`.cookbook_strategies`) and tinker's own encoding of Datums
(:mod:`.tinker_bytes`). Strategies for evsys batches and fixtures are in
``tests/conftest.py``."""
