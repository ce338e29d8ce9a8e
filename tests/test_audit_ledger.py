"""The ε ledger: exact arithmetic, idempotency, refusals, voids/spends, and racing processes."""

import multiprocessing as mp

import pytest

from kepsilon.audit.chain import verify_chain
from kepsilon.audit.ledger import (
    BudgetExceeded,
    CapMissing,
    IdempotencyConflict,
    ReservationStateError,
    budget,
    mark_noise_drawn,
    remaining,
    reserve,
    set_cap,
    void,
)
from kepsilon.audit.store import open_store
from kepsilon.tasks.errors import SpecError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("KEPSILON_DEFAULT_CAP", raising=False)
    monkeypatch.delenv("KEPSILON_AUDIT_DB", raising=False)


@pytest.fixture
def db(tmp_path):
    store = open_store(tmp_path / "audit.db")
    yield store
    store.close()


def _reserve(db, key, epsilon=0.1, population="pop"):
    return reserve(db, population_id=population, epsilon=epsilon, idempotency_key=key, release_id="rel", operator="op")


def test_store_has_wal_foreign_keys_and_refuses_updates(db):
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert db.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    set_cap(db, "pop", 1, "alice", "initial")
    with pytest.raises(Exception, match="append-only: UPDATE refused"):
        db.execute("UPDATE ledger SET nano_epsilon = 5")
    with pytest.raises(Exception, match="append-only: DELETE refused"):
        db.execute("DELETE FROM ledger")
    assert db.execute("SELECT nano_epsilon FROM ledger").fetchone()[0] == 10**9


def test_cap_of_point_three_admits_exactly_three_spends_of_point_one(db):
    set_cap(db, "pop", 0.3, "alice", "initial")
    for i in range(3):
        reservation = _reserve(db, f"key-{i}")
        mark_noise_drawn(db, reservation.id)
    assert remaining(db, "pop") == 0.0
    with pytest.raises(BudgetExceeded) as refused:
        _reserve(db, "key-3")
    message = str(refused.value)
    assert "'pop'" in message and "ε=0.1" in message and "remaining budget ε=0" in message
    assert budget(db, "pop")["spent"] == 3 * 10**8


def test_rerun_with_same_key_reuses_reservation_and_spends_nothing(db):
    set_cap(db, "pop", 0.5, "alice", "initial")
    first = _reserve(db, "release-1", 0.4)
    again = _reserve(db, "release-1", 0.4)
    assert (first.reused, again.reused) == (False, True)
    assert again.id == first.id and again.status == "reserved"
    mark_noise_drawn(db, first.id)
    third = _reserve(db, "release-1", 0.4)
    assert third.status == "spent" and third.reused
    assert db.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'reserve'").fetchone()[0] == 1
    assert remaining(db, "pop") == pytest.approx(0.1)


def test_same_key_with_other_epsilon_or_population_is_a_conflict(db):
    set_cap(db, "pop", 1, "alice", "initial")
    set_cap(db, "other", 1, "alice", "initial")
    _reserve(db, "release-1", 0.2)
    with pytest.raises(IdempotencyConflict, match="idempotency_key"):
        _reserve(db, "release-1", 0.3)
    with pytest.raises(IdempotencyConflict):
        _reserve(db, "release-1", 0.2, population="other")


def test_population_without_cap_is_refused_with_instructions(db):
    with pytest.raises(CapMissing) as refused:
        _reserve(db, "k")
    assert "kepsilon audit set-cap pop" in str(refused.value)
    assert db.execute("SELECT COUNT(*) FROM ledger").fetchone()[0] == 0


def test_default_cap_from_env_is_an_attributed_entry(db, monkeypatch):
    monkeypatch.setenv("KEPSILON_DEFAULT_CAP", "0.5")
    _reserve(db, "k", 0.2)
    cap = dict(db.execute("SELECT actor, nano_epsilon FROM ledger WHERE kind = 'cap'").fetchall())
    assert cap == {"kepsilon-default": 5 * 10**8}
    assert remaining(db, "pop") == pytest.approx(0.3)
    monkeypatch.setenv("KEPSILON_DEFAULT_CAP", "nonsense")
    with pytest.raises(SpecError, match="KEPSILON_DEFAULT_CAP"):
        _reserve(db, "k2", population="fresh")


def test_void_returns_budget_but_not_after_noise(db):
    set_cap(db, "pop", 0.4, "alice", "initial")
    reservation = _reserve(db, "a", 0.4)
    void(db, reservation.id, "refused by a check before noise")
    assert remaining(db, "pop") == pytest.approx(0.4)
    fresh = _reserve(db, "a", 0.4)
    assert fresh.reused is False and fresh.id != reservation.id  # a voided reservation is not reused
    mark_noise_drawn(db, fresh.id)
    with pytest.raises(ReservationStateError, match="already drawn"):
        void(db, fresh.id, "too late")
    assert remaining(db, "pop") == 0.0
    with pytest.raises(ReservationStateError, match="voided"):
        mark_noise_drawn(db, reservation.id)


def test_mark_noise_drawn_is_idempotent_and_a_redraw_charges_again_visibly(db):
    set_cap(db, "pop", 1.0, "alice", "initial")
    reservation = _reserve(db, "a", 0.4)
    first = mark_noise_drawn(db, reservation.id)
    assert mark_noise_drawn(db, reservation.id) == first
    assert remaining(db, "pop") == pytest.approx(0.6)
    mark_noise_drawn(db, reservation.id, redraw=True)
    assert remaining(db, "pop") == pytest.approx(0.2)
    assert db.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'spend'").fetchone()[0] == 2
    with pytest.raises(BudgetExceeded):
        mark_noise_drawn(db, reservation.id, redraw=True)


def test_lowering_a_cap_is_recorded_and_admits_nothing_more(db):
    set_cap(db, "pop", 1.0, "alice", "initial")
    _reserve(db, "a", 0.6)
    set_cap(db, "pop", 0.5, "bob", "policy tightened")
    assert remaining(db, "pop") == pytest.approx(-0.1)
    with pytest.raises(BudgetExceeded, match="remaining budget ε=0"):
        _reserve(db, "b", 0.01)
    assert db.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'cap'").fetchone()[0] == 2


@pytest.mark.parametrize(
    "epsilon,problem", [(0, "positive"), (-1, "positive"), (float("inf"), "finite"), (float("nan"), "finite"), ("x", "number"), (None, "number")]
)
def test_bad_epsilon_is_refused_naming_the_parameter(db, epsilon, problem):
    set_cap(db, "pop", 1, "alice", "initial")
    with pytest.raises(SpecError, match=f"parameter 'epsilon'.*{problem}"):
        _reserve(db, "k", epsilon)


def test_amounts_are_rounded_conservatively(db):
    """A charge finer than 1e-9 rounds up (never under-charged); a cap rounds down (never over-admits)."""
    set_cap(db, "pop", 1.0000000009, "alice", "initial")
    assert budget(db, "pop")["cap"] == 10**9
    _reserve(db, "tiny", 1e-12)
    assert budget(db, "pop")["in_use"] == 1
    with pytest.raises(SpecError, match="parameter 'cap'.*resolution"):
        set_cap(db, "pop", 1e-12, "alice", "too small")


def test_attribution_is_required(db):
    with pytest.raises(SpecError, match="'by'"):
        set_cap(db, "pop", 1, " ", "why")
    with pytest.raises(SpecError, match="'reason'"):
        set_cap(db, "pop", 1, "alice", "")


def _race(path, population, epsilon, index, barrier, results):
    store = open_store(path)
    barrier.wait()
    try:
        reserve(store, population_id=population, epsilon=epsilon, idempotency_key=f"{population}-{index}",
                release_id=f"r{index}", operator=f"op{index}")
        results.put(True)
    except BudgetExceeded:
        results.put(False)
    finally:
        store.close()


PROCESSES = 16
TRIALS = [("cap1-ask0.4", 1.0, 0.4, 2), ("cap0.3-ask0.1", 0.3, 0.1, 3), ("cap1-ask0.25", 1.0, 0.25, 4)] * 2


def test_racing_processes_never_overspend(tmp_path):
    """16 processes race `reserve` per trial; exactly floor(cap/ask) are admitted, every time."""
    path = tmp_path / "audit.db"
    store = open_store(path)
    context = mp.get_context("fork")
    for trial, (name, cap, ask, expected) in enumerate(TRIALS):
        population = f"{name}-{trial}"
        set_cap(store, population, cap, "alice", "race test")
        barrier, results = context.Barrier(PROCESSES), context.Queue()
        workers = [context.Process(target=_race, args=(path, population, ask, i, barrier, results)) for i in range(PROCESSES)]
        for worker in workers:
            worker.start()
        outcomes = [results.get(timeout=60) for _ in workers]
        for worker in workers:
            worker.join(timeout=60)
        assert sum(outcomes) == expected, population
        reserved = store.execute(
            "SELECT COUNT(*), SUM(nano_epsilon) FROM ledger WHERE kind = 'reserve' AND population_id = ?", [population]
        ).fetchone()
        assert reserved[0] == expected and reserved[1] <= round(cap * 10**9)
    ok, problems = verify_chain(store)
    assert ok, problems
    store.close()


def _open_fresh(path, barrier, results):
    barrier.wait()
    store = open_store(path)
    results.put(store.execute("SELECT COUNT(*), COUNT(DISTINCT name) FROM _sqlite_migrations").fetchone())
    store.close()


def test_processes_opening_a_fresh_store_together_apply_the_schema_once(tmp_path):
    context = mp.get_context("fork")
    barrier, results = context.Barrier(PROCESSES), context.Queue()
    workers = [context.Process(target=_open_fresh, args=(tmp_path / "fresh.db", barrier, results)) for _ in range(PROCESSES)]
    for worker in workers:
        worker.start()
    counts = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    reference = open_store(tmp_path / "reference.db")
    migrations = reference.execute("SELECT COUNT(*) FROM _sqlite_migrations").fetchone()[0]
    reference.close()
    assert migrations >= 2 and counts == [(migrations, migrations)] * PROCESSES


# --- δ beside ε: the DP mode's releases -------------------------------------------------------------


def _reserve_dp(db, key, epsilon=0.1, delta=1e-6, population="pop"):
    return reserve(db, population_id=population, epsilon=epsilon, idempotency_key=key, release_id="rel", operator="op",
                   delta=delta)


def test_dp_reservations_record_delta_and_compose_by_sums(db):
    set_cap(db, "pop", 1, "alice", "initial", delta=1e-5)
    first = _reserve_dp(db, "a", epsilon=0.3, delta=2e-6)
    _reserve_dp(db, "b", epsilon=0.2, delta=3e-6)
    assert (first.delta, first.atto_delta) == (2e-6, 2 * 10**12)
    assert db.execute("SELECT atto_delta FROM ledger WHERE id = ?", (first.id,)).fetchone()[0] == 2 * 10**12
    state = budget(db, "pop")
    assert (state["dp_epsilon"], state["dp_delta"]) == (5 * 10**8, 5 * 10**12)  # basic composition: sums
    assert (state["delta_cap"], state["delta_remaining"]) == (10**13, 5 * 10**12)


def test_the_dp_total_never_includes_the_method_s_own_mode(db):
    set_cap(db, "pop", 1, "alice", "initial", delta=1e-5)
    mark_noise_drawn(db, _reserve(db, "kepsilon-mode", epsilon=0.4).id)
    _reserve_dp(db, "dp", epsilon=0.1, delta=1e-6)
    state = budget(db, "pop")
    assert state["in_use"] == 5 * 10**8  # the ε cap counts both
    assert (state["dp_epsilon"], state["kepsilon_epsilon"]) == (10**8, 4 * 10**8)
    assert state["dp_delta"] == 10**12


def test_a_delta_cap_refuses_before_anything_is_reserved(db):
    set_cap(db, "pop", 10, "alice", "initial", delta=2e-6)
    _reserve_dp(db, "a", delta=1.5e-6)
    with pytest.raises(BudgetExceeded, match="δ=1e-06 exceeds the remaining δ=5e-07 under its lifetime δ cap"):
        _reserve_dp(db, "b", delta=1e-6)
    assert db.execute("SELECT COUNT(*) FROM ledger WHERE kind = 'reserve'").fetchone()[0] == 1
    _reserve(db, "kepsilon-mode")  # the method's own mode has no δ: the δ cap does not stop it


def test_without_a_delta_cap_the_dp_total_stays_below_one(db):
    set_cap(db, "pop", 10, "alice", "initial")
    _reserve_dp(db, "a", delta=0.6)
    with pytest.raises(BudgetExceeded, match="δ < 1"):
        _reserve_dp(db, "b", delta=0.4)


def test_changing_the_epsilon_cap_keeps_the_delta_cap(db):
    set_cap(db, "pop", 1, "alice", "initial", delta=1e-6)
    set_cap(db, "pop", 2, "alice", "more ε")
    assert budget(db, "pop")["delta_cap"] == 10**12
    set_cap(db, "pop", 2, "alice", "more δ", delta=1e-5)
    assert budget(db, "pop")["delta_cap"] == 10**13


def test_same_key_with_another_delta_is_a_conflict_and_a_rerun_reuses_it(db):
    set_cap(db, "pop", 1, "alice", "initial")
    first = _reserve_dp(db, "k", delta=1e-6)
    assert _reserve_dp(db, "k", delta=1e-6).id == first.id
    with pytest.raises(IdempotencyConflict, match="another δ"):
        _reserve_dp(db, "k", delta=2e-6)
    with pytest.raises(IdempotencyConflict):
        _reserve(db, "k")  # the same key without δ is another release too


def test_a_redraw_charges_delta_again_and_a_void_returns_it(db):
    set_cap(db, "pop", 1, "alice", "initial", delta=2.5e-6)
    drawn = _reserve_dp(db, "a", delta=1e-6)
    mark_noise_drawn(db, drawn.id)
    mark_noise_drawn(db, drawn.id, redraw=True)
    assert budget(db, "pop")["dp_delta"] == 2 * 10**12
    with pytest.raises(BudgetExceeded, match="δ cap"):
        mark_noise_drawn(db, drawn.id, redraw=True)
    voided = _reserve_dp(db, "b", delta=0.5e-6)
    assert budget(db, "pop")["delta_remaining"] == 0
    void(db, voided.id, "refused before noise")
    assert budget(db, "pop")["dp_delta"] == 2 * 10**12
    assert verify_chain(db) == (True, [])


def test_delta_is_rounded_up_when_charged_and_down_when_capped(db):
    set_cap(db, "pop", 1, "alice", "initial", delta="1.0000000000000000009e-6")
    assert budget(db, "pop")["delta_cap"] == 10**12
    assert _reserve_dp(db, "tiny", delta=1e-30).atto_delta == 1  # below the unit: charged one unit
    with pytest.raises(SpecError, match="delta"):
        _reserve_dp(db, "zero", delta=0)
