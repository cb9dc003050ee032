"""Headless Chromium for the tests that look at pages (the console, the load report).

Tests that use it carry the ``browser`` marker; ``conftest.pytest_collection_finish`` calls ``prepare``
when any is selected. The browser is Debian's ``chromium-headless-shell`` (or ``chromium``), driven by Playwright's Python
package with ``executable_path=`` (Playwright never downloads a browser here). On a fresh machine where
neither is installed and we are root with apt-get (CI runs ``.ci/run`` as root), the session installs
``chromium-headless-shell`` once, bounded in time; anywhere else the tests fail with a message saying what
to install. ``QUEEN_TEST_CHROMIUM=/path`` picks another binary.

Screenshots of failures go to ``QUEEN_TEST_ARTIFACTS`` (default ``test-artifacts/`` in the working
directory); ``QUEEN_CONSOLE_SCREENS=DIR`` also saves one PNG per console view there on success.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

CANDIDATES = ("chromium-headless-shell", "chromium", "chromium-browser")
PACKAGE = "chromium-headless-shell"
INSTALL_TIMEOUT_S = 900


def _find() -> str | None:
    explicit = os.environ.get("QUEEN_TEST_CHROMIUM")
    if explicit:
        return explicit
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


def _install() -> str:
    from broker.process import apt

    try:
        apt.install([PACKAGE, "fonts-dejavu-core"], timeout_s=INSTALL_TIMEOUT_S, present=lambda: _find() is not None)
    except apt.AptError as exc:
        pytest.fail(str(exc), pytrace=False)
    path = _find()
    if path is None:
        pytest.fail(f"{PACKAGE} was installed but no chromium binary is on PATH", pytrace=False)
    return path


_prepared: dict[str, str] = {}


def chromium_path() -> str:
    if "path" in _prepared:
        return _prepared["path"]
    if "error" in _prepared:
        pytest.fail(_prepared["error"], pytrace=False)
    path = _find()
    if path:
        return path
    from broker.process import apt

    if apt.may_install():
        return _install()
    pytest.fail(
        f"no headless Chromium: install Debian's `{PACKAGE}` (apt-get install -y {PACKAGE}) "
        "or point QUEEN_TEST_CHROMIUM at a Chromium binary",
        pytrace=False,
    )


def prepare() -> None:
    """Find or install Chromium once, before any test runs (so no test's timeout covers the install).
    A failure is kept and reported by every browser test, not by the session."""
    try:
        _prepared["path"] = chromium_path()
    except pytest.fail.Exception as exc:
        _prepared["error"] = str(exc.msg)


@contextlib.contextmanager
def launched() -> Iterator[object]:
    """A headless Chromium (Playwright ``Browser``) for the block.

    Keep it short-lived: while Playwright's sync API is active it runs an asyncio loop in this thread,
    so ``asyncio.run`` (and async tests) cannot run in the same thread until the block ends."""
    from playwright.sync_api import sync_playwright

    exe = chromium_path()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    """A headless Chromium for one test module (never the session: see ``launched``)."""
    with launched() as browser:
        yield browser


def artifacts_dir() -> Path:
    path = Path(os.environ.get("QUEEN_TEST_ARTIFACTS", "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def shot_on_failure(page: object, name: str) -> Iterator[None]:
    """Save a full-page screenshot as ``<artifacts>/<name>.png`` when the block raises."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            out = artifacts_dir() / f"{name}.png"
            page.screenshot(path=str(out), full_page=True)  # type: ignore[attr-defined]
            print(f"screenshot of the failure: {out}")
        raise


def save_view(page: object, name: str) -> None:
    """One PNG per view when ``QUEEN_CONSOLE_SCREENS`` names a directory (for people, not assertions)."""
    target = os.environ.get("QUEEN_CONSOLE_SCREENS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(target) / f"{name}.png"), full_page=True)  # type: ignore[attr-defined]
