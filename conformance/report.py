"""The compatibility matrix and the HTML report, from one or more JSON reports of the suite (one per broker).

A matrix row is a contract family (the id's first segment: LOG, TMR, KV ...), a column a broker; a cell
says what happened to that family's contracts on that broker: "not implemented" when the broker offers
none of it, else the counts (passed, failed, not verified, not implemented). The same table, per profile,
comes first: it is what a user reads to decide whether a broker is Queen-compatible.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from conformance.catalogue import BY_ID, FEATURES, PROFILES, REFERENCE_DEVIATIONS
from conformance.outcomes import LABELS, STATUSES, cell

FAMILY_NAMES = {
    "LOG": "message log", "CLI": "official client surface", "ENV": "errors and envelope", "XB": "several brokers",
    "TXN": "transaction riders", "TMR": "timers", "MET": "timer metering", "DL": "deadlines", "EDGE": "limits at the edge",
    "KV": "KV", "LCK": "locks", "EPH": "ephemeral queues", "STR": "streams", "LIM": "plans and quotas",
}


def _order(families: set[str]) -> list[str]:
    known = list(FAMILY_NAMES)
    return sorted(families, key=lambda f: (known.index(f) if f in known else len(known), f))


def matrix(reports: list[dict[str, Any]], by: str = "families") -> tuple[list[str], list[list[str]]]:
    """(header, rows): one row per family (``by="families"``) or profile (``by="profiles"``)."""
    header = ["profile" if by == "profiles" else "family"] + [str(r.get("broker")) for r in reports]
    keys: set[str] = set()
    for r in reports:
        keys |= {k for k, v in r["summary"][by].items() if any(v.values())}
    ordered = [p for p in PROFILES if p in keys] if by == "profiles" else _order(keys)
    rows = []
    for k in ordered:
        label = k if by == "profiles" else f"{k} ({FAMILY_NAMES.get(k, k)})"
        rows.append([label] + [cell(r["summary"][by].get(k, {})) for r in reports])
    return header, rows


def markdown(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(out)


def text(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(x[i]) for x in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in [header, *rows])


def compare(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """The reference run's document: both reports' matrices, the core contracts one broker fails, and
    the recorded deviations."""
    core_failed = {str(r.get("broker")): sorted(cid for cid, c in r["contracts"].items()
                                                if c["status"] == "failed" and c.get("profile") == "core")
                   for r in reports}
    return {
        "brokers": [r.get("broker") for r in reports],
        "matrix": {"profiles": matrix(reports, "profiles"), "families": matrix(reports, "families")},
        "core_failed": core_failed,
        "deviations": {cid: vars(d) for cid, d in REFERENCE_DEVIATIONS.items()},
        "reports": reports,
    }


def write_html(path: Path, reports: list[dict[str, Any]]) -> None:
    e = html.escape

    def table(header: list[str], rows: list[list[str]]) -> str:
        head = "".join(f"<th>{e(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    parts = ["<!doctype html><meta charset=utf-8><title>queen conformance</title>",
             "<style>body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}"
             ".failed{color:#b00}.passed{color:#070}.not_verified,.not_implemented{color:#a60}</style>",
             "<h1>queen conformance</h1>",
             "<h2>Compatibility matrix: profiles</h2>", table(*matrix(reports, "profiles")),
             "<h2>Compatibility matrix: families</h2>", table(*matrix(reports, "families"))]
    for r in reports:
        parts.append(f"<h2>{e(str(r.get('broker')))}</h2>")
        missing = {f: v for f, v in r.get("features", {}).items() if v.get("missing")}
        if missing:
            parts.append("<p>Not implemented:</p><ul>" + "".join(
                f"<li>{e(FEATURES[f])}: <code>{e(v['evidence'])}</code></li>" for f, v in sorted(missing.items())) + "</ul>")
        rows = []
        for cid, c in sorted(r["contracts"].items()):
            if c["status"] == "not_run" or c["status"] == "not_implemented":
                continue
            note = "; ".join(c["reasons"][:1])
            if c["status"] == "failed" and cid in REFERENCE_DEVIATIONS:
                d = REFERENCE_DEVIATIONS[cid]
                note = f"recorded deviation of {d.broker}: {d.what} (evidence: {d.evidence}) -- {note}"
            sentence = BY_ID[cid].sentence if cid in BY_ID else ""
            rows.append(f"<tr><td>{e(cid)}</td><td>{e(str(c.get('profile')))}</td>"
                        f"<td class={c['status']}>{e(LABELS[c['status']])}</td><td>{e(sentence)}</td><td>{e(note[:600])}</td></tr>")
        parts.append("<table><thead><tr><th>contract</th><th>profile</th><th>outcome</th><th>sentence</th>"
                     "<th>reason</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>")
    path.write_text("\n".join(parts))


__all__ = ["STATUSES", "compare", "markdown", "matrix", "text", "write_html"]
