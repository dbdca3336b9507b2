"""``python -m tinker_rl_data run ...``: see :mod:`tinker_rl_data.patch.launch`."""

import sys

from .patch.launch import main

sys.exit(main())
