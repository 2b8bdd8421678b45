"""``python -m onceflow.testing.article_site``."""

from __future__ import annotations

import sys

from onceflow.testing.article_site.cli import main

sys.exit(main())
