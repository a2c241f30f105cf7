"""The README's demo, end to end at a small scale, against the session's etcd."""

from __future__ import annotations

import pytest

from scripts import demo


def test_demo_reports_no_lost_updates_and_a_rejected_stale_write(
    etcd_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert demo.main(["--etcd", etcd_url, "--processes", "3", "--rounds", "4"]) == 0
    out = capsys.readouterr().out
    assert "lost updates:           0" in out
    assert "stale writes rejected:  1" in out
    assert "REFUSED by the database" in out


def test_demo_with_an_unreachable_etcd_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert demo.main(["--etcd", "etcd://127.0.0.1:1"]) == 2
    assert "could not reach etcd at 127.0.0.1:1" in capsys.readouterr().err
