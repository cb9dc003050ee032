"""``Settings.from_env``: defaults, parsing, validation (a bad value is a ConfigError naming the
variable) and ``queen serve`` exiting 2 with that message before it starts anything."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import ConfigError, Settings

KEY_A = base64.b64encode(b"a" * 32).decode()
KEY_B = base64.b64encode(b"b" * 32).decode()


def test_defaults_from_an_empty_environment():
    s = Settings.from_env({})
    assert (s.host, s.port, s.workers) == ("127.0.0.1", 6632, os.cpu_count() or 1)
    assert s.database_url is None and s.data_dir == Path(".queen")
    assert not s.auth_enabled and s.encryption_keys == ()
    assert s.max_body_bytes == 8 * 1024 * 1024 and s.test_hooks is False and s.sweeper_enabled is True
    assert s == Settings(workers=os.cpu_count() or 1)  # from_env and the dataclass defaults agree


def test_values_are_parsed_and_trimmed():
    s = Settings.from_env(
        {
            "QUEEN_PORT": " 7000 ",
            "QUEEN_WORKERS": "3",
            "QUEEN_SWEEPER_ENABLED": "off",
            "QUEEN_TEST_HOOKS": "Yes",
            "QUEEN_DATABASE_URL": "postgresql://u:pw@db/queen",
            "QUEEN_LOG_LEVEL": "debug",
            "QUEEN_JWT_SECRET": "x",
            "QUEEN_HOST": "",  # empty means unset
        }
    )
    assert (s.port, s.workers, s.sweeper_enabled, s.test_hooks) == (7000, 3, False, True)
    assert s.log_level == "DEBUG" and s.host == "127.0.0.1" and s.auth_enabled
    described = s.describe()
    assert described["database_url"] == "postgresql://u:***@db/queen" and described["jwt_secret"] == "***"


def test_key_ring_first_key_encrypts_bare_key_gets_default_id():
    s = Settings.from_env({"QUEEN_ENCRYPTION_KEYS": f"k2:{KEY_B}, k1:{KEY_A}"})
    assert s.encryption_keys == (("k2", b"b" * 32), ("k1", b"a" * 32))
    assert s.describe()["encryption_keys"] == ["k2", "k1"]  # ids only, never key bytes
    assert Settings.from_env({"QUEEN_ENCRYPTION_KEYS": KEY_A}).encryption_keys == (("default", b"a" * 32),)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"QUEEN_PORT": "http"}, "QUEEN_PORT='http' is not an integer"),
        ({"QUEEN_PORT": "70000"}, "QUEEN_PORT=70000 is above the maximum 65535"),
        ({"QUEEN_WORKERS": "0"}, "QUEEN_WORKERS=0 is below the minimum 1"),
        ({"QUEEN_MAX_BODY_BYTES": "1.5e6"}, "QUEEN_MAX_BODY_BYTES='1.5e6' is not an integer"),
        ({"QUEEN_SWEEPER_ENABLED": "maybe"}, "QUEEN_SWEEPER_ENABLED='maybe' is not a boolean"),
        ({"QUEEN_TEST_HOOKS": "2"}, "QUEEN_TEST_HOOKS='2' is not a boolean"),
        ({"QUEEN_ENCRYPTION_KEYS": "k1:not base64!"}, "key 'k1' is not valid base64"),
        ({"QUEEN_ENCRYPTION_KEYS": "k1:" + base64.b64encode(b"short").decode()}, "key 'k1' must be 32 bytes"),
        ({"QUEEN_ENCRYPTION_KEYS": f"k1:{KEY_A},k1:{KEY_B}"}, "key id 'k1' appears twice"),
        ({"QUEEN_POOL_MIN": "20", "QUEEN_POOL_MAX": "5"}, "QUEEN_POOL_MIN must not exceed QUEEN_POOL_MAX"),
        ({"QUEEN_SWEEPER_MIN_SLEEP_MS": "50", "QUEEN_SWEEPER_MAX_SLEEP_MS": "10"}, "QUEEN_SWEEPER_MIN_SLEEP_MS"),
        ({"QUEEN_JWT_PUBLIC_KEY_FILE": "/nonexistent/key.pem"}, "QUEEN_JWT_PUBLIC_KEY_FILE='/nonexistent/key.pem'"),
        ({"QUEEN_LOG_LEVEL": "chatty"}, "QUEEN_LOG_LEVEL='CHATTY'"),
    ],
)
def test_bad_values_are_config_errors_naming_the_variable(env, message):
    with pytest.raises(ConfigError) as exc:
        Settings.from_env(env)
    assert message in str(exc.value)


def test_settings_are_frozen_and_with_returns_a_copy():
    s = Settings.from_env({})
    with pytest.raises(AttributeError):
        s.port = 1  # type: ignore[misc]
    t = s.with_(port=1)
    assert (s.port, t.port) == (6632, 1)


def _serve(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    return subprocess.run(
        [sys.executable, "-m", "broker", "serve", *args], env={**base, **env}, capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    "env",
    [
        {"QUEEN_WORKERS": "many"},
        {"QUEEN_SWEEPER_ENABLED": "perhaps"},
        {"QUEEN_ENCRYPTION_KEYS": "k1:" + base64.b64encode(b"16 bytes, no more").decode()},
    ],
)
def test_queen_serve_exits_2_with_the_message(env, tmp_path):
    out = _serve({**env, "QUEEN_DATA_DIR": str(tmp_path / "data"), "QUEEN_PORT": "0"})
    assert out.returncode == 2, out.stderr
    name = next(iter(env))
    assert out.stderr.startswith("queen: configuration error: ") and name in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "data").exists(), "serve started something before refusing its configuration"


ROOT = Path(__file__).resolve().parent.parent


def test_every_setting_has_its_meaning_and_the_docs_give_the_ci_command():
    """The configuration reference (docs/reference/configuration.md) is rendered from broker/config.py
    and its MEANINGS table at build time (tests/test_docs_site.py builds it): every variable the module
    reads has its line there. The README and the install page give the two commands, the second being
    exactly what CI runs."""
    import re

    from broker.config import MEANINGS

    source = (ROOT / "broker" / "config.py").read_text().split("MEANINGS: dict")[0]
    read = set(re.findall(r'"((?:QUEEN|PROMETHEUS)_[A-Z0-9_]+)"', source))
    assert len(read) > 30
    assert sorted(read - set(MEANINGS)) == [], "settings without their line in broker.config.MEANINGS"
    assert sorted(set(MEANINGS) - read) == [], "MEANINGS documents settings config.py does not read"
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    serve = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/queen serve"
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started" / "install.md"):
        blocks = re.findall(r"```sh\n(.*?)\n```", page.read_text(), re.S)
        assert blocks[:2] == [serve, ci], page


def test_the_pool_opens_whole_unless_told_otherwise():
    """QUEEN_POOL_MIN follows QUEEN_POOL_MAX when unset (every connection opened at boot, none under load)."""
    assert (Settings.from_env({}).pool_min, Settings.from_env({}).pool_max) == (10, 10)
    assert (Settings.from_env({"QUEEN_POOL_MAX": "4"}).pool_min, Settings.from_env({"QUEEN_POOL_MAX": "4"}).pool_max) == (4, 4)
    assert Settings.from_env({"QUEEN_POOL_MIN": "2", "QUEEN_POOL_MAX": "6"}).pool_min == 2


def test_from_env_takes_every_default_from_the_settings_fields():
    """The fields of ``Settings`` are the one table of defaults: every variable ``from_env`` reads
    defaults to ``DEFAULTS.<the field it feeds>`` (the docs' configuration table is built from these
    expressions, and ``SweeperConfig`` declares its own from the class), except the two defaults that
    depend on something else (``workers``: the CPU count; ``pool_min``: the pool's maximum) and the
    variables that are unset by default."""
    import ast

    from broker import config
    from broker.timers.sweeper import SweeperConfig

    tree = ast.parse(Path(config.__file__).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings")
    from_env = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "from_env")
    odd = []
    for node in ast.walk(from_env):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "cls"):
            continue
        for kw in node.keywords:
            for call in ast.walk(kw.value):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in ("_int", "_bool", "_str"):
                    default = ast.unparse(call.args[2])
                    if default not in (f"DEFAULTS.{kw.arg}", f"str(DEFAULTS.{kw.arg})", "None", "cpu", "pool_max"):
                        odd.append((kw.arg, default))
    assert odd == []
    assert Settings.from_env({}) == Settings() == config.DEFAULTS
    assert SweeperConfig.from_settings(Settings()) == SweeperConfig(peers=Settings().workers)
