"""``python -m tinker_rl_data.cookbook run ...``, the older spelling of ``tinker-rl-data run ...``."""

import sys

from ..patch.launch import main

sys.exit(main())
