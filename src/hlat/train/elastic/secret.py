"""The run secret of an elastic run: the replica groups prove it to each other (HMAC-SHA256 over
fresh nonces) before one sends another its state, loads a state sent to it, or commits a step
with it. It is read from the file or environment variable that the config names; the config,
the run directory, the logs and the metrics only ever hold that name, never the secret."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from hlat.config.elastic import ElasticConfig
from hlat.errors import UserError

MIN_CHARS = 32  # `hlat elastic-secret` writes 64 hex digits (256 bits)
CREATE = "create one with `hlat elastic-secret FILE`"


def create_secret(path: Path) -> None:
    """Write a new secret to `path`, readable by its owner only; an existing file is never replaced."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise UserError(f"{path} exists: a run's groups must share one secret; give a new file name") from None
    except OSError as err:
        raise UserError(f"{path}: cannot create it ({err.strerror}); give a file in a writable directory") from None
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")


def run_key(cfg: ElasticConfig) -> bytes:
    """The key every MAC of this run is made with; with elastic.trusted_network and no secret, a
    key anyone can compute (the groups then only check each other's configuration)."""
    if cfg.secret_file:
        text, where = _read_file(Path(cfg.secret_file).expanduser()), f"elastic.secret_file={cfg.secret_file}"
    elif cfg.secret_env:
        text, where = os.environ.get(cfg.secret_env, ""), f"elastic.secret_env={cfg.secret_env}"
    else:
        return hashlib.sha256(b"hlat elastic: trusted network, no secret").digest()
    if len(text.strip()) < MIN_CHARS:
        raise UserError(f"{where}: the secret has fewer than {MIN_CHARS} characters; {CREATE}")
    return hashlib.sha256(b"hlat elastic run secret\0" + text.strip().encode()).digest()


def mac(key: bytes, *parts: bytes | str | int) -> bytes:
    """HMAC-SHA256 of `parts`, each length-prefixed (no two lists of parts give the same message)."""
    message = b"".join(_framed(p) for p in parts)
    return hmac.new(key, message, hashlib.sha256).digest()


def _framed(part: bytes | str | int) -> bytes:
    data = part if isinstance(part, bytes) else str(part).encode()
    return len(data).to_bytes(8, "big") + data


def _read_file(path: Path) -> str:
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UserError(f"elastic.secret_file={path} can be read by other users; run `chmod 600 {path}`")
        return path.read_text()
    except OSError as err:
        raise UserError(f"elastic.secret_file={path}: cannot read it ({err.strerror}); {CREATE}") from None
