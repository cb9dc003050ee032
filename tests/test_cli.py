"""The ``queen`` console script: help texts that name the environment variables, and ``token create``."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
from pathlib import Path

import orjson
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from broker.auth import Principal, TokenVerifier
from broker.config import Settings

QUEEN = str(Path(sys.executable).with_name("queen"))


def queen(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    return subprocess.run([QUEEN, *args], env={**base, **(env or {})}, capture_output=True, text=True, timeout=30)


def test_help_lists_commands_and_environment():
    out = queen("--help")
    assert out.returncode == 0
    for word in ("serve", "migrate", "token", "conformance", "loadtest", "bench", "docs"):
        assert word in out.stdout
    for var in ("QUEEN_PORT", "QUEEN_WORKERS", "QUEEN_DATABASE_URL", "QUEEN_DATA_DIR", "QUEEN_JWT_SECRET"):
        assert var in out.stdout


def test_serve_help_names_flags_and_environment():
    out = queen("serve", "--help")
    assert out.returncode == 0
    for word in ("--port", "--host", "--workers", "QUEEN_PORT", "QUEEN_WORKERS", "QUEEN_DATABASE_URL", "QUEEN_ENCRYPTION_KEYS"):
        assert word in out.stdout, word


def test_no_command_is_a_usage_error():
    out = queen()
    assert out.returncode == 2 and "usage: queen" in out.stderr


def test_token_create_hs256_from_flag_and_from_env():
    out = queen("token", "create", "--tenant", "acme", "--sub", "ci", "--grant", "produce", "--grant", "consume", "--secret", "k")
    assert out.returncode == 0, out.stderr
    v = TokenVerifier(Settings(jwt_secret="k"))
    assert v.verify(out.stdout.strip()) == Principal("acme", "ci", frozenset({"produce", "consume"}))
    out = queen("token", "create", "--tenant", "acme", "--sub", "ops", "--grant", "admin", env={"QUEEN_JWT_SECRET": "from-env"})
    assert out.returncode == 0, out.stderr
    assert TokenVerifier(Settings(jwt_secret="from-env")).verify(out.stdout.strip()).grants == {"admin"}


def test_token_create_eddsa_and_ttl(tmp_path: Path):
    key = ed25519.Ed25519PrivateKey.generate()
    (tmp_path / "k.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    (tmp_path / "p.pem").write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    out = queen("token", "create", "--tenant", "t", "--sub", "s", "--private-key", str(tmp_path / "k.pem"), "--ttl", "0")
    assert out.returncode == 0, out.stderr
    token = out.stdout.strip()
    assert TokenVerifier(Settings(jwt_public_key_file=str(tmp_path / "p.pem"))).verify(token) == Principal("t", "s", frozenset())
    body = token.split(".")[1]
    claims = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    assert "exp" not in claims  # --ttl 0: no expiry


def test_token_create_refusals():
    out = queen("token", "create", "--tenant", "t", "--sub", "s", "--grant", "root", "--secret", "k")
    assert out.returncode == 2 and "unknown grant(s) ['root']" in out.stderr and out.stdout == ""
    out = queen("token", "create", "--tenant", "t", "--sub", "s")
    assert out.returncode == 2 and "--secret" in out.stderr and out.stdout == ""
    out = queen("token", "create", "--sub", "s", "--secret", "k")
    assert out.returncode == 2 and "--tenant" in out.stderr


def test_delegated_commands_get_their_own_options():
    for command in ("conformance", "bench"):
        out = queen(command, "--help")
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"usage: queen {command}"), out.stdout[:200]
        assert "unrecognized arguments" not in out.stderr


def run_without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``queen ARGS`` in a child where importing ``module`` fails as if it were not installed."""
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from broker.process.cli import main\n"
            "raise SystemExit(main(sys.argv[1:]))")
    base = {k: v for k, v in os.environ.items() if not k.startswith("QUEEN_")}
    return subprocess.run([sys.executable, "-c", code, *args], env=base, capture_output=True, text=True, timeout=30)


def test_delegated_command_without_its_extra_names_the_extra():
    cases = (("conformance", "pytest", "conformance", ("--list",)),
             ("loadtest", "locust", "load", ("push_pop",)),
             ("bench", "pytest_benchmark", "bench", ()))
    for command, module, extra, rest in cases:
        out = run_without(module, command, *rest)
        assert out.returncode == 2, (command, out.returncode, out.stderr)
        assert out.stdout == ""
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1, out.stderr  # one line, not a traceback
        assert "Traceback" not in out.stderr
        assert f"[{extra}]" in lines[0] and module in lines[0] and f"queen-broker[{extra}]" in lines[0], lines[0]


def test_help_names_the_extra_of_each_delegated_command():
    out = queen("--help")
    assert out.returncode == 0
    for extra in ("[conformance]", "[load]", "[bench]", "[docs]"):
        assert extra in out.stdout, out.stdout
