"""The meta-test: every catalogued contract has a test, and no test names an unknown contract."""

from __future__ import annotations

from conformance.catalogue import BY_ID, CONTRACTS
from conformance.plugin import contract_index


def test_every_contract_has_a_test_and_every_test_a_known_contract():
    index = contract_index()
    untested = [c.id for c in CONTRACTS if not index.get(c.id)]
    unknown = {cid: tests for cid, tests in index.items() if cid not in BY_ID}
    assert not untested, f"catalogued contracts without a test: {untested}"
    assert not unknown, f"tests naming contracts that are not in the catalogue: {unknown}"
