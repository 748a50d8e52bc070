"""The suite runs the same in any terminal: Rich pins a console's width to $COLUMNS when the console is made (at
import of kvplan's CLI modules), so a suite started from an 80-column shell would render every command at 80
columns, whatever width a test asks CliRunner for. The tests that check widths set COLUMNS per invocation."""

from __future__ import annotations

import os

os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)
