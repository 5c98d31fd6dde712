"""Who is in a step's quorum: every member proves the run secret and shows its fingerprint, over
the step's own collectives, before the step's data and gradients are exchanged. torchft's
lighthouse admits any process that asks; a member that cannot prove the secret, or that trains
another configuration, makes the step fail for everyone (it cannot commit with them) and is named.

Two sums over the groups present, each group writing only its own row: first a fresh random nonce
per member, then each member's name, fingerprint and HMAC(key, every nonce, its rank, the number
of members, its name and fingerprint). A member that sends garbage spoils the round, which fails
for all alike: every group checks every row, its own included."""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Callable

import torch

from hlat.train.elastic.secret import mac

NONCE, NAME, FINGERPRINT, MAC = 32, 64, 16, 32


def member_problems(
    *,
    key: bytes,
    name: str,
    fingerprint: str,
    rank: int,
    members: int,
    sum_: Callable[[torch.Tensor], torch.Tensor],
) -> list[tuple[int, str]]:
    """(replica rank, what is wrong with it) for each member of the quorum that is not one of this
    run's groups with this group's fingerprint. `sum_`: in place over the groups present (after a
    failed one the step cannot commit, and what it returned does not matter)."""
    nonces = torch.zeros(members, NONCE, dtype=torch.uint8)
    nonces[rank] = torch.frombuffer(bytearray(secrets.token_bytes(NONCE)), dtype=torch.uint8)
    every_nonce = bytes(sum_(nonces).numpy())
    rows = torch.zeros(members, NAME + FINGERPRINT + MAC, dtype=torch.uint8)
    claim = name.encode()[:NAME].ljust(NAME, b"\0") + fingerprint.encode()[:FINGERPRINT].ljust(FINGERPRINT, b"\0")
    rows[rank] = torch.frombuffer(
        bytearray(claim + mac(key, "member", every_nonce, rank, members, claim)), dtype=torch.uint8
    )
    problems = []
    for r, row in enumerate(sum_(rows).numpy()):
        claim, tag = bytes(row[: NAME + FINGERPRINT]), bytes(row[NAME + FINGERPRINT :])
        called = _printable(claim[:NAME])
        if not hmac.compare_digest(tag, mac(key, "member", every_nonce, r, members, claim)):
            problems.append((r, f"(calling itself {called!r}) cannot prove the run secret"))
        elif (theirs := _printable(claim[NAME:])) != fingerprint:
            problems.append(
                (r, f"(group {called}) trains another configuration (fingerprint {theirs}, here {fingerprint})")
            )
    return problems


def _printable(raw: bytes) -> str:
    text = raw.rstrip(b"\0").decode("utf-8", "replace")
    return "".join(c if c.isprintable() else "?" for c in text)[:NAME]
