"""The documentation site (mkdocs.yml, docs/) builds with ``mkdocs build --strict``, offline.

The build goes through ``queen docs --out DIR`` (a temporary directory: the site is never written into
the checkout), so the command users run is the one tested. --strict turns every warning into a failure:
a broken link or anchor, a page missing from the nav, a nav entry without its page. The Reference pages
are generated from the code by ``docs/hooks/reference.py``: the tests check they hold every setting,
every route, the raised reasons and every command's help, and that nothing in the built pages is fetched
from elsewhere (no web fonts, scripts or style sheets from another origin). Where the machine allows it
(root, as on CI) the build runs in an empty network namespace, so a build that needs the network fails.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
QUEEN = str(Path(sys.executable).with_name("queen"))

pytestmark = pytest.mark.slow


def _reference():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", ROOT / "docs" / "hooks" / "reference.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _offline() -> list[str]:
    """A prefix that runs a command without any network (a new, empty network namespace), where the
    machine allows it (root and util-linux's unshare, as on CI): the build must not need the network."""
    unshare = shutil.which("unshare")
    if unshare and hasattr(os, "geteuid") and os.geteuid() == 0:
        probe = subprocess.run([unshare, "-n", "true"], capture_output=True)
        if probe.returncode == 0:
            return [unshare, "-n"]
    return []


def _queen_docs(*args: str, cwd: Path = ROOT, offline: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    env["NO_MKDOCS_2_WARNING"] = "1"
    prefix = _offline() if offline else []
    return subprocess.run([*prefix, QUEEN, "docs", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = _queen_docs("--out", str(out), offline=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "--strict" in proc.stderr  # the command it ran
    return out


def test_the_site_builds_strict_with_every_section(site: Path):
    for page in ("index.html", "getting-started/install.html", "getting-started/tour.html",
                 "concepts/log.html", "concepts/timers.html", "concepts/sweeper.html", "concepts/deadlines.html",
                 "concepts/tenants.html", "guides/deploying.html", "guides/capacity-planning.html",
                 "guides/operating.html", "reference/configuration.html", "reference/http-api.html",
                 "reference/errors.html", "reference/cli.html", "timer-routes.html", "queued-call-deadlines.html",
                 "protocol.html", "decisions.html", "contributing.html"):
        assert (site / page).is_file(), page
    assert not (site / "hooks").exists(), "the build hook was published as a page asset"
    assert not (ROOT / "site").exists() or not subprocess.run(
        ["git", "ls-files", "site"], cwd=ROOT, capture_output=True, text=True).stdout, "a built site was committed"


def test_nothing_in_the_site_is_fetched_from_elsewhere(site: Path):
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "#"))
    assert config["theme"]["font"] is False
    assert [p if isinstance(p, str) else next(iter(p)) for p in config.get("plugins", [])] == ["search"]
    external = re.compile(r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""", re.I)
    for page in site.rglob("*.html"):
        html = page.read_text()
        assert not external.search(html), (page, external.search(html).group(0))  # type: ignore[union-attr]
        assert "fonts.googleapis" not in html and "fonts.gstatic" not in html, page
    for css in site.rglob("*.css"):
        assert "@import url(http" not in css.read_text(), css


def test_configuration_page_lists_every_setting_config_reads(site: Path):
    read = set(re.findall(r'"((?:QUEEN|PROMETHEUS)_[A-Z0-9_]+)"', (ROOT / "broker" / "config.py").read_text().split("MEANINGS")[0]))
    html = (site / "reference" / "configuration.html").read_text()
    assert len(read) > 50
    missing = sorted(v for v in read if f"<code>{v}</code></td>" not in html)
    assert missing == []
    rows = {r["name"]: r for r in _reference().settings_rows()}
    assert set(rows) == read
    assert rows["QUEEN_PORT"]["default"] == "`6632`" and rows["QUEEN_PORT"]["allowed"] == "0–65535"
    assert rows["QUEEN_WORKERS"]["default"] == "CPU count"
    assert rows["QUEEN_POOL_MIN"]["default"] == "`QUEEN_POOL_MAX`"
    assert rows["QUEEN_SWEEPER_ENABLED"]["default"] == "`1`" and rows["QUEEN_SWEEPER_ENABLED"]["allowed"] == "boolean"
    assert rows["QUEEN_TIMERS_HORIZON_MS"]["default"] == "`7776000000` (90 days)"


def test_a_setting_without_its_meaning_fails_the_build(monkeypatch):
    from broker import config

    ref = _reference()
    monkeypatch.delitem(config.MEANINGS, "QUEEN_PORT")
    with pytest.raises(RuntimeError, match="QUEEN_PORT"):
        ref.render_configuration()


def test_http_api_page_has_every_operation_of_the_document(site: Path):
    doc = yaml.safe_load((ROOT / "broker" / "openapi.yaml").read_text())
    html = (site / "reference" / "http-api.html").read_text()
    for path, item in doc["paths"].items():
        for method in ("get", "put", "post", "delete", "patch"):
            if method in item:
                assert f"{method.upper()} {path}" in html, (method, path)


def test_errors_page_has_the_reasons_the_broker_raises(site: Path):
    reasons = _reference().error_reasons()
    html = (site / "reference" / "errors.html").read_text()
    # one from each way a reason is raised: an ApiError class, a module constant, a module's helper,
    # a conditional reason, the HTTP server's own envelope
    for reason in ("missing_grant", "database_unavailable", "kv_reserved_namespace", "timers_server_owned_field",
                   "kv_rate_limited", "too_many_connections", "header_timeout", "booting"):
        assert reason in reasons, reason
    assert len(reasons) > 100
    missing = [r for r in reasons if f"<code>{r}</code>" not in html]
    assert missing == []
    assert reasons["missing_grant"]["statuses"] == {(403, "forbidden")}


def test_cli_page_has_every_commands_help(site: Path):
    html = (site / "reference" / "cli.html").read_text()
    for command in ("queen --help", "queen serve --help", "queen migrate --help", "queen token create --help",
                    "queen conformance --help", "queen loadtest --help", "queen bench --help", "queen docs --help"):
        assert f"<code>{command}</code>" in html, command
    assert "usage: queen conformance" in html and "usage: queen loadtest" in html and "usage: queen bench" in html


def test_strict_build_fails_on_a_broken_link(tmp_path: Path):
    """The strictness is real: a copy of the sources with one broken link does not build."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "contributing.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    proc = _queen_docs("--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stderr


def test_docs_without_mkdocs_names_the_extra():
    code = ("import sys; sys.modules['mkdocs'] = None\n"
            "from broker.process.cli import main\n"
            "raise SystemExit(main(sys.argv[1:]))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    proc = subprocess.run([sys.executable, "-c", code, "docs"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "queen docs: needs the [docs] extra (missing: mkdocs); install it with: pip install 'queen-broker[docs]'"]


def test_docs_finds_the_checkout_from_anywhere(tmp_path: Path, monkeypatch):
    """From another directory `queen docs` uses the checkout the package was installed from (editable)."""
    import broker.process.cli as cli

    monkeypatch.chdir(tmp_path)
    assert cli._docs_config() == ROOT / "mkdocs.yml"


def test_docs_serve_serves_the_site_and_stops_on_sigterm(tmp_path: Path):
    """`queen docs --serve` is mkdocs serve itself (the process is replaced), so SIGTERM stops it."""
    import signal
    import urllib.request

    from helpers import wait_for

    from broker.process.localserver import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    env["NO_MKDOCS_2_WARNING"] = "1"
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen([QUEEN, "docs", "--serve", "--addr", f"127.0.0.1:{port}"], cwd=tmp_path, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        def page() -> bytes | None:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/getting-started/tour.html", timeout=2) as r:
                    return r.read()
            except OSError:
                return None

        body = wait_for(page, timeout=120, what="queen docs --serve to answer", interval=0.5)
        assert b"A five-minute tour" in body
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            assert proc.wait(timeout=30) is not None
        finally:
            if proc.poll() is None:
                proc.kill()
            log.close()


def test_the_readme_is_a_short_front_page_whose_links_resolve():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert len(local) > 15
    missing = [link for link in local if not (ROOT / link).is_file()]
    assert missing == []
    # every page of the site's nav that exists on this branch is reachable from the front page
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def pages(node: object) -> list[str]:
        if isinstance(node, str):
            return [node]
        if isinstance(node, dict):
            return [p for v in node.values() for p in pages(v)]
        if isinstance(node, list):
            return [p for v in node for p in pages(v)]
        return []

    linked = {link.removeprefix("docs/") for link in local}
    unlinked = [p for p in pages(config["nav"]) if p not in linked and p not in ("index.md", "screens/README.md")]
    assert unlinked == []
