"""Ray's token authentication for hvdsync's driver: find out before ``ray.init`` whether the cluster wants a token, and
connect the way Ray's own clients do.

Ray (2.52 and later) authenticates every request to a cluster started with ``RAY_AUTH_MODE=token`` with one shared
token, and since 2.59 ``ray start --head`` turns that on by itself wherever a token already exists (``~/.ray/auth_token``,
left by any earlier local ``ray.init()``). A client decides its own mode once per process: ``RAY_AUTH_MODE`` if set,
else, for ``address="auto"`` only, "token" where it finds a token. hvdsync resolves ``auto`` to ``HOST:PORT`` (to check
the head answers, in seconds), and an explicit address never turns authentication on: the driver then talked to an
authenticated cluster without a token and Ray's client retried for a minute, printing a screen of ``InvalidAuthToken``
lines before "Failed to connect".

So the driver asks the head first: one gRPC call (the GCS's ``GetClusterId``, what every Ray client sends first) without
a token. If the head refuses it as unauthenticated, the cluster wants a token: hvdsync finds it where Ray looks
(``RAY_AUTH_TOKEN``, then the file ``RAY_AUTH_TOKEN_PATH`` names, then ``~/.ray/auth_token``), checks the head accepts it
(a second call), and turns token mode on in this process for the job, as ``ray.init(address="auto")`` would. A missing
or rejected token is one line naming the address, where the token was looked for and how to get the right one
(``ray get-auth-token`` on the head), never the token itself. The workers need nothing from here: Ray starts them from
their node's raylet, which has the cluster's mode and token already, and hvdsync never forwards ``RAY_AUTH_*`` to them.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

from hvdsync.config import ConfigError

MODE_ENV, TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"
PROBE_TIMEOUT_S = 5
# The GCS method every Ray client calls first; its request message is empty, so no protobuf is needed to send it.
_PROBE_METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
GET_TOKEN = "print the cluster's token with `ray get-auth-token` on its head node"


def default_token_path() -> Path:
    """Where Ray keeps a user's token unless told otherwise (``ray get-auth-token --generate`` writes it there)."""
    return Path.home() / ".ray" / "auth_token"


def find_token() -> tuple[str | None, str]:
    """(token or None, where it came from, said without the token): Ray's own order of precedence. A
    ``RAY_AUTH_TOKEN_PATH`` that cannot be read, or is empty, is an error, as it is to Ray (no silent fallback)."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        return token, TOKEN_ENV
    named = os.environ.get(TOKEN_PATH_ENV)
    if named:
        try:
            token = Path(named).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"{TOKEN_PATH_ENV}: {named} cannot be read ({exc.strerror}); point it at the file that "
                              f"holds the Ray cluster's token ({GET_TOKEN}), or unset it") from None
        if not token:
            raise ConfigError(f"{TOKEN_PATH_ENV}: {named} is empty; put the Ray cluster's token in it ({GET_TOKEN}), "
                              "or unset it")
        return token, f"{TOKEN_PATH_ENV}={named}"
    path = default_token_path()
    try:
        token = path.read_text().strip()
    except OSError:
        return None, str(path)
    return token or None, str(path)


def head_accepts(address: str, token: str | None) -> bool | None:
    """Whether the head at ``address`` answers one request carrying ``token`` (None: none): True, False where it
    refuses it as unauthenticated, None where it says anything else (left to ``ray.init`` to report)."""
    import grpc  # Ray's own dependency: present wherever ray is

    metadata = [("authorization", f"Bearer {token}")] if token else []
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(_PROBE_METHOD)
        try:
            call(b"", metadata=metadata, timeout=PROBE_TIMEOUT_S)
        except grpc.RpcError as exc:
            return False if exc.code() == grpc.StatusCode.UNAUTHENTICATED else None
    return True


def needs_token(address: str) -> tuple[bool, str | None, str]:
    """(whether the cluster at ``address`` wants a token, the token to use, where it came from), or the
    :class:`ConfigError` line that says what is missing or wrong. Nothing is changed in this process."""
    if head_accepts(address, None) is not False:
        return False, None, ""
    mode = os.environ.get(MODE_ENV, "").strip().lower()
    if mode == "disabled":
        raise ConfigError(f"ray_address: the Ray cluster at {address} requires token authentication, but "
                          f"{MODE_ENV}=disabled here; unset {MODE_ENV} (hvdsync then finds the token as Ray's "
                          f"clients do) or set {MODE_ENV}=token")
    token, source = find_token()
    if token is None:
        raise ConfigError(f"ray_address: the Ray cluster at {address} requires token authentication and no token "
                          f"was found here ({TOKEN_ENV}, {TOKEN_PATH_ENV} and {source} are all empty or absent); "
                          f"{GET_TOKEN} and save it as {source} here, or set {TOKEN_PATH_ENV} to a file that holds "
                          "it")
    if head_accepts(address, token) is False:
        raise ConfigError(f"ray_address: the Ray cluster at {address} rejected the token from {source} (not the "
                          f"cluster's token); {GET_TOKEN} and put it there, or set {TOKEN_PATH_ENV} to a file that "
                          "holds it")
    return True, token, source


@contextlib.contextmanager
def authenticated(address: str) -> Iterator[None]:
    """For the ``with`` block: this process talks to the cluster at ``address`` with token authentication where the
    cluster wants it (checked as :func:`needs_token` says), as ``ray.init(address="auto")`` would have decided.
    ``RAY_AUTH_MODE`` is set for the block and put back after: a notebook's later ``ray.init`` sees its own setting."""
    wanted, _, _ = needs_token(address)
    if not wanted or os.environ.get(MODE_ENV, "").strip().lower() == "token":
        yield
        return
    from ray._raylet import Config

    os.environ[MODE_ENV] = "token"
    # Ray's client reads its mode into a process-wide config once; Ray itself re-reads it the same way when
    # `ray.init("auto")` turns token mode on (ray._private.authentication.authentication_token_setup).
    Config.initialize("")
    try:
        yield
    finally:
        os.environ.pop(MODE_ENV, None)
        Config.initialize("")
