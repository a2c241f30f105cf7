"""The short fault matrix (``python -m faults --short``): under a leader kill, a holder frozen past its TTL, a
frozen follower, a Redis restart without persistence, and a holder frozen past its TTL on ZooKeeper and on the
PostgreSQL lock table, the fenced workloads lose nothing; with the fence off, the checker sees the frozen holder's
damage. And the long form's cases (every fault of every service) and report, without running them.

Safety only: the longest gaps between grants are printed by the runner, not asserted.
"""

from __future__ import annotations

import pytest

from faults import SERVICES, Case, Options, Outcome, Result, check, long_cases, run_matrix, short_cases
from faults._checker import Audit
from faults._nemesis import HOLDER_PAUSE, Window
from faults._runner import verification
from faults._servers import RedisService
from faults._workload import Op

pytestmark = pytest.mark.timeout(300)


def test_the_short_matrix_loses_nothing_and_its_control_run_is_caught() -> None:
    cases = short_cases()
    assert any(case.control for case in cases) and any(not case.control for case in cases)
    assert {case.service for case in cases} == set(SERVICES)
    outcomes = run_matrix(cases, Options())
    for outcome in outcomes:
        result, label = outcome.result, outcome.case.label
        assert result.acknowledged > 0, f"{label}: nothing was written\n{result}"
        if outcome.case.control:
            assert result.violations > 0, f"{label}: the checker saw no violation with the fence off\n{result}"
        else:
            assert (result.lost, result.missing) == (0, 0), f"{label}: lost writes\n{result}"
            assert result.token_decreases == 0, f"{label}\n{result}"
            assert result.duplicate_tokens == 0, f"{label}\n{result}"


def test_the_checker_counts_lost_updates_token_decreases_and_gaps() -> None:
    """The checker alone, on a made-up history: a stale holder (token 5) overwrote the write of token 7."""
    history = [
        Op(worker=0, start=0.0, end=1.0, granted=0.5, token=5, outcome="ok", phase="done"),
        Op(worker=1, start=0.0, end=3.0, granted=2.5, token=7, outcome="ok", phase="done"),
        Op(worker=1, start=3.0, end=4.0, granted=3.5, token=9, outcome="fail", phase="write", error="Refused"),
    ]
    audit = [Audit(1, 7, 1, "1"), Audit(2, 5, 0, "1")]
    result = check(history, audit, final_value=1, final_items="", windows=[Window("leader-kill", 1.0, 2.0)])
    assert (result.lost, result.token_decreases, result.duplicate_tokens, result.refused) == (1, 1, 0, 1)
    assert result.longest_gap == pytest.approx(2.0)
    assert result.gaps == {"leader-kill #1": pytest.approx(2.0)}
    assert not result.ok
    assert "lost updates          1" in str(result)


def test_a_control_case_is_only_for_the_raw_api() -> None:
    assert Case("holder-pause", fence="off").control
    assert not Case("leader-kill", "sqla").control


def test_every_service_has_a_restart_a_pause_and_the_frozen_holder() -> None:
    assert set(SERVICES) == {"etcd", "redis", "zookeeper", "locktable"}
    for name, service in SERVICES.items():
        assert HOLDER_PAUSE in service.faults, name
        assert service.control in service.faults, name
        assert len(service.faults) == len(set(service.faults)) >= 3, name
    assert {"zookeeper-restart", "zookeeper-pause"} <= set(SERVICES["zookeeper"].faults)
    assert {"locktable-restart", "locktable-pause"} <= set(SERVICES["locktable"].faults)


def test_the_long_matrix_has_every_fault_of_every_service_workload_and_database_and_controls() -> None:
    cases = long_cases(("raw", "sqla", "django"), ("sqlite", "postgresql"))
    for name, service in SERVICES.items():
        mine = [case for case in cases if case.service == name]
        fenced = [case for case in mine if not case.control]
        assert {case.fault for case in fenced} == set(service.faults), name
        assert len(fenced) == len(service.faults) * (3 + 1) * 2  # {raw, sqla, django, lock-set} x {SQLite, PostgreSQL}
        assert {(case.fault, case.fence, case.db) for case in mine if case.control} == {
            (service.control, fence, db) for fence in ("off", "write-only") for db in ("sqlite", "postgresql")
        }
    only_etcd = long_cases(("raw",), ("sqlite",), {"etcd": ["leader-kill"], "redis": ()})
    assert {case.service for case in only_etcd} == {"etcd"}


def test_the_report_has_a_section_per_lock_service_and_the_redis_caveat() -> None:
    def outcome(server: str, case: Case, lost: int = 0) -> Outcome:
        result = Result(10, 9, 0, 1, 0, lost, 0, 0, 0, 0.5, {f"{case.fault} #1": 0.7})
        return Outcome(case, result, (), server, f"how {server} ran")

    outcomes = [
        outcome("etcd 3.5.1", Case("leader-kill")),
        outcome("etcd 3.4.23", Case("leader-kill")),
        outcome("etcd 3.4.23", Case("holder-pause", fence="off"), lost=3),
        outcome("Redis 7.0.15", Case("redis-restart", service="redis")),
        outcome("ZooKeeper 3.8.0", Case("zookeeper-restart", service="zookeeper")),
        outcome("PostgreSQL 15.18 lock table", Case("locktable-pause", service="locktable")),
    ]
    report = verification(outcomes, Options(etcd_bins=()), elapsed=60.0)
    sections = [line for line in report.splitlines() if line.startswith("## ")]
    assert sections == [
        "## etcd 3.5.1",
        "## etcd 3.4.23",
        "## Redis 7.0.15",
        "## ZooKeeper 3.8.0",
        "## PostgreSQL 15.18 lock table",
    ]
    assert report.index("how ZooKeeper 3.8.0 ran.") > report.index("## ZooKeeper 3.8.0")
    assert "zookeeper: zookeeper-restart; locktable: locktable-pause." in report
    assert report.count(RedisService.caveat) == 1
    assert report.index(RedisService.caveat) > report.index("## Redis 7.0.15")
    assert "| leader-kill | raw | sqlite | on | 10 | 9 | 0 | 0 | 0 | 1 | 0 | 0.70 s | ok |" in report
    assert "Control runs: 1 of 1 caught (3 violations)." in report
