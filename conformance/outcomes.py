"""The outcomes of a contract and how the reports name them, shared by the plugin (terminal summary, JSON
report) and the HTML report (conformance/report.py), so neither imports the other for them."""

from __future__ import annotations

STATUSES = ("passed", "failed", "not_verified", "not_implemented")
LABELS = {"passed": "PASSED", "failed": "FAILED", "not_verified": "NOT VERIFIED", "not_implemented": "NOT IMPLEMENTED"}


def cell(counts: dict[str, int]) -> str:
    """One matrix cell: 'not implemented' when nothing of the family is offered, else the counts that are
    not zero (passed first)."""
    ran = {k: v for k, v in counts.items() if v}
    if not ran:
        return "-"
    if set(ran) == {"not_implemented"}:
        return "not implemented"
    return ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in sorted(ran.items(), key=lambda kv: STATUSES.index(kv[0])))
