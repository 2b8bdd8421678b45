"""``python -m onceflow.testing.sheets_emulator``."""

from __future__ import annotations

import sys

from onceflow.testing.sheets_emulator.cli import main

sys.exit(main())
