"""The contract check (decisions-part2, "Contract check"): runs a plugin through its discovery,
its health and its own fixtures, and reports every check and issue.

Run by the `plugins` worker for a new registration and by `contentsvc plugin check`
locally; both call `run_contract_check` with the pinned manifest, the plugin's address
and the folder its fixture files are in. The order is fixed; a failed `discovery.*`
check skips everything after it. `failed` = 0 means validated, and `certified` means
validated with nothing skipped.
"""

from __future__ import annotations

from contentsvc.plugins.contract_check.command import check_command
from contentsvc.plugins.contract_check.report import Check, CheckReport, Issue
from contentsvc.plugins.contract_check.run import run_contract_check

__all__ = ["Check", "CheckReport", "Issue", "check_command", "run_contract_check"]
