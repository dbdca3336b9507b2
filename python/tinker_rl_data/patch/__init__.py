"""The patch layer: what a feature declares (:mod:`.feature`, its pieces
:mod:`.piece`), the install transaction (:mod:`.transaction`), its report
(:mod:`.report`) and the launcher (:mod:`.launch`). It names no feature:
it is handed the declarations (registered in :mod:`tinker_rl_data.features`)."""

from .feature import Feature as Feature
from .piece import Piece as Piece
from .report import Report as Report
from .transaction import install as install
from .transaction import installed as installed
from .transaction import status as status
from .transaction import uninstall as uninstall
