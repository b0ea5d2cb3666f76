"""A PostgreSQL password never reaches a message, however the URL spells it: in the user
info (raw, with ``@``, ``:``, ``/``, spaces; or percent-encoded) or as a ``password=`` /
``sslpassword=`` parameter, through every error the store raises (unreachable server,
unparsable URL)."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lamina._cli import main
from lamina.pipeline import LaminaError
from lamina.pipeline._store.postgres import mask_url
from lamina.pipeline.store import PostgresStore

# The secret's two ends are marked, so a password only partly masked shows as a leak.
HEAD, TAIL = "Zk8", "Qx3"
MIDDLE = st.text(
    alphabet=st.sampled_from(list("ab9 @:/?#%&='\"\\+;é")), min_size=0, max_size=12
)
FORMS = ("raw", "encoded", "query", "query-raw", "ssl", "scheme")


def _url(form: str, password: str, sock: Path) -> str:
    encoded = urllib.parse.quote(password, safe="")
    return {
        "raw": f"postgresql://ada:{password}@/db?host={sock}",
        "encoded": f"postgresql://ada:{encoded}@/db?host={sock}",
        "query": f"postgresql:///db?host={sock}&password={encoded}",
        "query-raw": f"postgresql:///db?password={password}&host={sock}",
        "ssl": f"postgresql://ada@/db?host={sock}&sslpassword={encoded}",
        "scheme": f"postgres://ada:{encoded}@/db?host={sock}&connect_timeout=1",
    }[form]


def _leaks(message: str) -> bool:
    return HEAD in message or TAIL in message


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(middle=MIDDLE, form=st.sampled_from(FORMS))
@example(middle="%99", form="query-raw")  # a percent-escape that is not UTF-8
@example(middle="&a=", form="query-raw")  # a raw & in a query password
def test_no_error_message_holds_the_password(tmp_path: Path, middle: str, form: str) -> None:
    """No server listens on the socket folder: every open fails, one way or another."""
    url = _url(form, HEAD + middle + TAIL, tmp_path)
    try:
        PostgresStore(url, timeout=1)
    except LaminaError as exc:
        message = str(exc)
    else:  # pragma: no cover - nothing listens there
        raise AssertionError("opened a store on a folder with no server")
    assert not _leaks(message), message
    assert not _leaks(mask_url(url)), mask_url(url)
    assert message.startswith(f"store {mask_url(url)}: ")


def test_the_cli_line_masks_a_raw_at_sign_and_a_query_password(
    tmp_path: Path, capsys: object
) -> None:
    for url in (
        f"postgresql://ada:{HEAD}p@ss{TAIL}@/db?host={tmp_path}",
        f"postgresql:///db?host={tmp_path}&password={HEAD}secret{TAIL}",
    ):
        assert main(["export", url, "--conversation", "x"]) == 2
        err = capsys.readouterr().err  # type: ignore[attr-defined]
        assert err.count("\n") == 1 and not _leaks(err), err
