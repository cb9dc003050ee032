"""The meta-test: every catalogued contract has a test, and no test names an unknown contract."""

from __future__ import annotations

from conformance.catalogue import BY_ID, CONTRACTS, PROFILES, profile_of
from conformance.plugin import _test_functions, contract_index


def test_every_contract_has_a_test_and_every_test_a_known_contract():
    index = contract_index()
    untested = [c.id for c in CONTRACTS if not index.get(c.id)]
    unknown = {cid: tests for cid, tests in index.items() if cid not in BY_ID}
    assert not untested, f"catalogued contracts without a test: {untested}"
    assert not unknown, f"tests naming contracts that are not in the catalogue: {unknown}"


def test_a_core_verdict_is_never_mixed_with_another_profile():
    """A test naming a core contract names only core contracts: a strict habit or an extension's absence
    must never fail a core contract (split such a test into one per profile)."""
    mixed = {}
    for mod, name, fn in _test_functions():
        ids = [cid for m in getattr(fn, "pytestmark", []) if m.name == "contract" for cid in m.args if cid in BY_ID]
        profiles = {profile_of(cid) for cid in ids}
        if "core" in profiles and len(profiles) > 1:
            mixed[f"{mod}.py::{name}"] = {cid: profile_of(cid) for cid in ids}
    assert not mixed, f"tests mixing core contracts with other profiles: {mixed}"


def test_every_contract_has_a_known_profile():
    assert {profile_of(c.id) for c in CONTRACTS} <= set(PROFILES)
