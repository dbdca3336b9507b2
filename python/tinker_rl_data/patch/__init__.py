"""The patch layer: the pieces the feature modules declare (:mod:`.piece`,
collected by :mod:`.registry`), the install transaction
(:mod:`.transaction`), its report (:mod:`.report`) and the launcher
(:mod:`.launch`)."""

from .piece import Piece as Piece
from .report import Report as Report
from .transaction import install as install
from .transaction import installed as installed
from .transaction import status as status
from .transaction import uninstall as uninstall
