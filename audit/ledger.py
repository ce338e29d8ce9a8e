"""The (ε, δ) ledger: lifetime caps per population, enforced across releases, processes and reruns.

Guarantee: for every population, at every moment,
``Σ ε of non-voided reservations + Σ ε of extra (re-draw) spends ≤ latest ε cap``, counted exactly in
integer nano-ε, over the releases of both privacy models; and, over the DP mode's releases alone,
``Σ δ ≤ latest δ cap`` (when one is set) and ``Σ δ < 1``, counted exactly in integer atto-δ (1e-18).
The check and the insert it guards run in one ``BEGIN IMMEDIATE`` transaction, so concurrent
releases cannot overspend. Amounts are converted conservatively: a charge is rounded up to the next
unit, a cap down (so the ledger never admits more than was declared).

Composition: the DP mode's releases are (ε_i, δ_i)-differentially private, so together they are
(Σ ε_i, Σ δ_i)-DP (basic composition); that is the population's *DP total* (``budget``). A release of
the method's own mode (``privacy_model: kepsilon``) is not differentially private: its ε is counted
against the ε cap like any other but never enters the DP total, which would then claim a guarantee
that does not hold. A reservation row carries δ exactly when it is a DP-mode reservation.

The ledger is append-only: a cap change, a reservation, the moment noise was drawn (spend) and a
void are each a new attributed row; a reservation's status is derived from later rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal, InvalidOperation
from fractions import Fraction
from typing import overload

import sqlite_utils

from kepsilon import settings
from kepsilon.tasks.errors import KepsilonError, SpecError

from .principals import authorise, is_signed, record_signature
from .signing import SignedAct
from .store import append, ensure_population, now, require_text, write_transaction

NANO = 10**9
ATTO = 10**18  # δ's unit: δ down to 1e-18 is charged exactly, a smaller one as 1e-18 (rounded up)
# The largest ε (or δ) amount the ledger takes: SQLite's INTEGER holds at most 2⁶³ − 1 ≈ 9.2e18 units,
# i.e. ε ≈ 9.2e9 in nano-ε; a round bound below it keeps every sum of admitted amounts (each sum is
# bounded by a cap) representable too. No meaningful privacy budget comes near it.
MAX_AMOUNT = 10**9
ENV_DEFAULT_CAP = "KEPSILON_DEFAULT_CAP"
DEFAULT_CAP_ACTOR = "kepsilon-default"


class BudgetExceeded(KepsilonError):
    """A reservation would take the population's ε beyond its cap; nothing was reserved or spent."""

    def __init__(self, population_id: str, requested: float, remaining: float, problem: str | None = None):
        self.population_id = population_id
        self.requested = requested
        self.remaining = remaining
        super().__init__(
            problem
            or f"population {population_id!r}: requested ε={requested:g} exceeds the remaining budget ε={remaining:g}"
        )


class DeltaBudgetExceeded(BudgetExceeded):
    """A DP-mode reservation would take the population's δ beyond its δ cap (or its total to 1)."""

    def __init__(self, population_id: str, requested: float, remaining: float, limit: str):
        super().__init__(
            population_id,
            requested,
            remaining,
            problem=f"population {population_id!r}: requested δ={requested:g} exceeds the remaining δ={remaining:g} "
            f"under {limit}; nothing was reserved",
        )


class CapMissing(BudgetExceeded):
    """The population has no cap yet, so no ε can be reserved for it."""

    def __init__(self, population_id: str, requested: float):
        super().__init__(
            population_id,
            requested,
            0.0,
            problem=(
                f"population {population_id!r} has no ε cap; set one first with "
                f"`kepsilon audit set-cap {population_id} CAP --by NAME --reason TEXT` "
                f"(or set env {ENV_DEFAULT_CAP} to create a default cap attributed to {DEFAULT_CAP_ACTOR!r})"
            ),
        )


class IdempotencyConflict(KepsilonError):
    """The idempotency key already belongs to a reservation for another population or ε."""

    def __init__(self, problem: str):
        super().__init__(f"parameter 'idempotency_key': {problem}")


class ReservationStateError(KepsilonError):
    """A void or spend was asked of a reservation in a state that forbids it."""


@dataclass(frozen=True)
class Reservation:
    """A reservation of ε for one logical release (one idempotency key)."""

    id: int
    population_id: str
    idempotency_key: str
    release_id: str
    epsilon: float
    status: str  # 'reserved' | 'spent' | 'voided'
    reused: bool
    nano_epsilon: int = 0
    delta: float | None = None  # a DP-mode reservation's δ; None for the method's own mode
    atto_delta: int | None = None


def to_nano(parameter: str, epsilon, *, round_up: bool) -> int:
    """ε as integer nano-ε, exactly from its decimal text; rounded up for charges, down for caps."""
    return _to_units(parameter, epsilon, NANO, round_up=round_up)


def to_atto(parameter: str, delta, *, round_up: bool) -> int:
    """δ as integer atto-δ (1e-18), exactly from its decimal text; rounded up for charges, down for caps."""
    return _to_units(parameter, delta, ATTO, round_up=round_up)


def _to_units(parameter: str, epsilon, units: int, *, round_up: bool) -> int:
    """A positive amount in integer ``units`` per 1, exactly from its decimal text."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, Decimal, Fraction, str)):
        raise SpecError(parameter, "must be a number")
    if isinstance(epsilon, Fraction):  # exact rational arithmetic
        if epsilon <= 0:
            raise SpecError(parameter, "must be positive")
        if epsilon > MAX_AMOUNT:
            raise SpecError(parameter, f"is beyond what the ledger can hold (at most {MAX_AMOUNT:,})")
        scaled = epsilon * units
        return math.ceil(scaled) if round_up else math.floor(scaled)
    try:
        value = Decimal(str(epsilon))
    except InvalidOperation:
        raise SpecError(parameter, "must be a number") from None
    if not value.is_finite():
        raise SpecError(parameter, "must be finite")
    if value <= 0:
        raise SpecError(parameter, "must be positive")
    if value > MAX_AMOUNT:
        raise SpecError(parameter, f"is beyond what the ledger can hold (at most {MAX_AMOUNT:,})")
    amount = int((value * units).to_integral_value(rounding=ROUND_CEILING if round_up else ROUND_FLOOR))
    if amount <= 0:
        raise SpecError(parameter, f"is below the ledger's resolution of 1e-{len(str(units)) - 1}")
    return amount


def require_delta_cap(parameter: str, delta) -> None:
    """Refuse a δ cap of 1 or more: the DP total is kept below 1 anyway, and such a cap guarantees nothing."""
    try:
        value = Decimal(str(delta))
    except InvalidOperation:
        raise SpecError(parameter, "must be a number") from None
    if value.is_finite() and value >= 1:
        raise SpecError(parameter, "must be below 1 (δ is a probability; a δ cap of 1 or more guarantees nothing)")


def from_nano(nano: int) -> float:
    """nano-ε back to a float, for display and the float-returning API."""
    return nano / NANO


@overload
def from_atto(atto: int) -> float: ...
@overload
def from_atto(atto: None) -> None: ...
def from_atto(atto: int | None) -> float | None:
    """atto-δ back to a float (None stays None)."""
    return None if atto is None else atto / ATTO


def _latest_cap(conn, population_id: str) -> tuple[int, int | None] | None:
    """(nano-ε cap, atto-δ cap or None) of the population's latest cap entry; None without one."""
    return conn.execute(
        "SELECT nano_epsilon, atto_delta FROM ledger WHERE population_id = ? AND kind = 'cap' ORDER BY id DESC LIMIT 1",
        (population_id,),
    ).fetchone()


def _cap_nano(conn, population_id: str) -> int | None:
    cap = _latest_cap(conn, population_id)
    return cap[0] if cap else None


def _delta_cap_atto(conn, population_id: str) -> int | None:
    cap = _latest_cap(conn, population_id)
    return cap[1] if cap else None


# ε in use: every non-voided reservation, plus each spend beyond a reservation's first (a visible
# re-draw of noise, charged again).
_USED_SQL = """
SELECT
  COALESCE((SELECT SUM(r.nano_epsilon) FROM ledger r
            WHERE r.population_id = :p AND r.kind = 'reserve'
              AND NOT EXISTS (SELECT 1 FROM ledger v WHERE v.reservation_id = r.id AND v.kind = 'void')), 0)
  + COALESCE((SELECT SUM(s.nano_epsilon) FROM ledger s
              WHERE s.population_id = :p AND s.kind = 'spend'
                AND s.id > (SELECT MIN(f.id) FROM ledger f WHERE f.reservation_id = s.reservation_id AND f.kind = 'spend')), 0)
"""


def _used_nano(conn, population_id: str) -> int:
    return conn.execute(_USED_SQL, {"p": population_id}).fetchone()[0]


# The DP total, the same sum over DP-mode rows only (they carry δ): ε in nano-ε, δ in atto-δ. A
# reservation's spends copy its δ, so a visible re-draw is charged δ again as well as ε.
_DP_USED_SQL = """
SELECT
  COALESCE((SELECT SUM(r.{column}) FROM ledger r
            WHERE r.population_id = :p AND r.kind = 'reserve' AND r.atto_delta IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM ledger v WHERE v.reservation_id = r.id AND v.kind = 'void')), 0)
  + COALESCE((SELECT SUM(s.{column}) FROM ledger s
              WHERE s.population_id = :p AND s.kind = 'spend' AND s.atto_delta IS NOT NULL
                AND s.id > (SELECT MIN(f.id) FROM ledger f WHERE f.reservation_id = s.reservation_id AND f.kind = 'spend')), 0)
"""


def _dp_used(conn, population_id: str) -> tuple[int, int]:
    """(nano-ε, atto-δ) in use by the population's DP-mode releases: their composed (ε, δ)."""
    nano = conn.execute(_DP_USED_SQL.format(column="nano_epsilon"), {"p": population_id}).fetchone()[0]
    atto = conn.execute(_DP_USED_SQL.format(column="atto_delta"), {"p": population_id}).fetchone()[0]
    return nano, atto


def _check_delta(conn, population_id: str, atto: int) -> None:
    """Refuse a δ charge that would pass the population's δ cap, or take its DP total to δ ≥ 1."""
    used = _dp_used(conn, population_id)[1]
    cap = _delta_cap_atto(conn, population_id)
    if cap is not None and atto > cap - used:
        raise DeltaBudgetExceeded(population_id, from_atto(atto), from_atto(max(cap - used, 0)), "its lifetime δ cap")
    if atto >= ATTO - used:
        raise DeltaBudgetExceeded(
            population_id, from_atto(atto), from_atto(max(ATTO - used, 0)), "δ < 1 (a total δ of 1 guarantees nothing)"
        )


def _status(conn, reservation_id: int) -> str:
    kinds = {k for (k,) in conn.execute("SELECT kind FROM ledger WHERE reservation_id = ?", (reservation_id,))}
    if "void" in kinds:
        return "voided"
    if "spend" in kinds:
        return "spent"
    return "reserved"


_RESERVATION_COLUMNS = "id, population_id, idempotency_key, release_id, nano_epsilon, atto_delta"


def _reservation_row(conn, reservation_id: int):
    row = conn.execute(
        f"SELECT {_RESERVATION_COLUMNS} FROM ledger WHERE id = ? AND kind = 'reserve'", (reservation_id,)
    ).fetchone()
    if row is None:
        raise SpecError("reservation_id", "no such reservation")
    return row


def _as_reservation(conn, row, reused: bool) -> Reservation:
    rid, population_id, key, release_id, nano, atto = row
    return Reservation(
        rid, population_id, key, release_id, from_nano(nano), _status(conn, rid), reused, nano, from_atto(atto), atto
    )


def _default_cap(conn, population_id: str) -> int | None:
    """Create the population's cap from env KEPSILON_DEFAULT_CAP, attributed to 'kepsilon-default'."""
    raw = settings.current().default_cap
    if not raw:
        return None
    nano = to_nano(ENV_DEFAULT_CAP, raw, round_up=False)
    append(
        conn,
        "ledger",
        {
            "population_id": population_id,
            "kind": "cap",
            "nano_epsilon": nano,
            "actor": DEFAULT_CAP_ACTOR,
            "reason": f"default cap from env {ENV_DEFAULT_CAP} on first reservation",
            "created_at": now(),
        },
    )
    return nano


def release_fields(
    population_id: str, epsilon: float, idempotency_key: str, release_id: str, delta: float | None, spec_hash: str | None
) -> dict:
    """What a steward signs to reserve a release's budget (``principals.make_act``): population, release id,
    idempotency key, ε and δ as charged, and the spec hash the approval was given for."""
    return {
        "population_id": require_text("population_id", population_id),
        "release_id": require_text("release_id", release_id),
        "idempotency_key": require_text("idempotency_key", idempotency_key),
        "nano_epsilon": to_nano("epsilon", epsilon, round_up=True),
        "atto_delta": None if delta is None else to_atto("delta", delta, round_up=True),
        "spec_hash": spec_hash,
    }


def reserve(
    db: sqlite_utils.Database,
    *,
    population_id: str,
    epsilon: float,
    idempotency_key: str,
    release_id: str,
    operator: str,
    delta: float | None = None,
    spec_hash: str | None = None,
    signed: SignedAct | None = None,
) -> Reservation:
    """Reserve ε (and, for a DP-mode release, δ) for one logical release, or return its existing
    reservation (``reused=True``, no new spend).

    ``delta``: the release's δ when it is (ε, δ)-differentially private (the DP mode); None for the
    method's own mode, whose ε then stays out of the DP total. Refuses, before any noise can be drawn,
    with ``BudgetExceeded`` when ε cap − ε in use < ε; with ``DeltaBudgetExceeded`` when δ would pass the
    δ cap or take the DP total to 1; with ``CapMissing`` when the population has no cap and env
    KEPSILON_DEFAULT_CAP is unset; with ``IdempotencyConflict`` when the key already reserved for
    another population, ε or δ. In a store with principals a new reservation must be ``signed`` by the
    operator, a steward, over ``release_fields`` (``SignatureRefused`` otherwise); a reused one needs nothing.
    """
    population_id = require_text("population_id", population_id)
    idempotency_key = require_text("idempotency_key", idempotency_key)
    release_id = require_text("release_id", release_id)
    operator = require_text("operator", operator)
    nano = to_nano("epsilon", epsilon, round_up=True)
    atto = None if delta is None else to_atto("delta", delta, round_up=True)
    with write_transaction(db) as conn:
        existing = conn.execute(
            f"""SELECT {_RESERVATION_COLUMNS} FROM ledger r
               WHERE r.kind = 'reserve' AND r.idempotency_key = ?
                 AND NOT EXISTS (SELECT 1 FROM ledger v WHERE v.reservation_id = r.id AND v.kind = 'void')
               ORDER BY id DESC LIMIT 1""",
            (idempotency_key,),
        ).fetchone()
        if existing is not None:
            if existing[1] != population_id or existing[4] != nano or existing[5] != atto:
                raise IdempotencyConflict(
                    "already reserved for another population, another ε or another δ; a changed release needs a new key"
                )
            return _as_reservation(conn, existing, reused=True)
        fields = release_fields(population_id, epsilon, idempotency_key, release_id, delta, spec_hash)
        authorised = authorise(conn, "release", signed, fields, by=operator)
        ensure_population(conn, population_id, operator)
        cap = _cap_nano(conn, population_id)
        if cap is None and not is_signed(conn):  # a store with principals takes caps signed by an officer only
            cap = _default_cap(conn, population_id)
        if cap is None:
            raise CapMissing(population_id, from_nano(nano))
        left = cap - _used_nano(conn, population_id)
        if nano > left:
            raise BudgetExceeded(population_id, from_nano(nano), from_nano(max(left, 0)))
        if atto is not None:
            _check_delta(conn, population_id, atto)
        rid = append(
            conn,
            "ledger",
            {
                "population_id": population_id,
                "kind": "reserve",
                "nano_epsilon": nano,
                "idempotency_key": idempotency_key,
                "release_id": release_id,
                "actor": operator,
                "created_at": now(),
                "atto_delta": atto,
            },
        )
        record_signature(conn, authorised, "ledger", rid)
        return Reservation(
            rid, population_id, idempotency_key, release_id, from_nano(nano), "reserved", False, nano, from_atto(atto), atto
        )


def mark_noise_drawn(db: sqlite_utils.Database, reservation_id: int, *, redraw: bool = False, actor: str = "kepsilon-flow") -> int:
    """Record that noise was drawn for the reservation: from now on its ε is spent and it cannot be voided.

    Returns the id of the 'spend' entry. Calling it again for an already spent reservation returns the
    first spend entry and records nothing (a rerun that re-derives identical noise from the sealed
    seed spends nothing). ``redraw=True`` declares fresh noise for the same release: a second spend
    entry that charges ε again, visibly, and is refused with ``BudgetExceeded`` if the cap forbids it.
    """
    with write_transaction(db) as conn:
        rid, population_id, key, release_id, nano, atto = _reservation_row(conn, reservation_id)
        status = _status(conn, rid)
        if status == "voided":
            raise ReservationStateError(f"reservation {rid} was voided; noise must not be drawn under it")
        if status == "spent" and not redraw:
            return conn.execute(
                "SELECT MIN(id) FROM ledger WHERE reservation_id = ? AND kind = 'spend'", (rid,)
            ).fetchone()[0]
        if status == "spent":
            cap = _cap_nano(conn, population_id)
            if cap is None:
                raise CapMissing(population_id, from_nano(nano))
            left = cap - _used_nano(conn, population_id)
            if nano > left:
                raise BudgetExceeded(population_id, from_nano(nano), from_nano(max(left, 0)))
            if atto is not None:
                _check_delta(conn, population_id, atto)
        return append(
            conn,
            "ledger",
            {
                "population_id": population_id,
                "kind": "spend",
                "nano_epsilon": nano,
                "reservation_id": rid,
                "idempotency_key": None,
                "release_id": release_id,
                "actor": actor,
                "reason": "fresh noise drawn again for the same release" if status == "spent" else "noise drawn",
                "created_at": now(),
                "atto_delta": atto,
            },
        )


def void(db: sqlite_utils.Database, reservation_id: int, reason: str, *, actor: str = "kepsilon-flow") -> int:
    """Release a reservation's ε (e.g. a release refused before noise); refused once noise was drawn."""
    reason = require_text("reason", reason)
    with write_transaction(db) as conn:
        rid, population_id, key, release_id, nano, atto = _reservation_row(conn, reservation_id)
        status = _status(conn, rid)
        if status == "spent":
            raise ReservationStateError(f"reservation {rid}: noise was already drawn, its ε stays spent")
        if status == "voided":
            raise ReservationStateError(f"reservation {rid} is already voided")
        return append(
            conn,
            "ledger",
            {
                "population_id": population_id,
                "kind": "void",
                "nano_epsilon": nano,
                "reservation_id": rid,
                "release_id": release_id,
                "actor": actor,
                "reason": reason,
                "created_at": now(),
                "atto_delta": atto,
            },
        )


def cap_fields(population_id: str, cap: float, reason: str, delta: float | None = None) -> dict:
    """What an officer signs to set a cap (``principals.make_act``): population, ε and δ asked for, reason."""
    if delta is not None:
        require_delta_cap("delta", delta)
    return {
        "population_id": require_text("population_id", population_id),
        "nano_epsilon": to_nano("cap", cap, round_up=False),
        "atto_delta": None if delta is None else to_atto("delta", delta, round_up=False),
        "reason": require_text("reason", reason),
    }


def set_cap(
    db: sqlite_utils.Database, population_id: str, cap: float, by: str | None, reason: str, *, delta: float | None = None,
    signed: SignedAct | None = None,
) -> int:
    """Set the population's lifetime caps (a new attributed entry; the latest one counts). Returns its id.

    ``cap`` limits ε over every release; ``delta`` limits δ over the DP mode's releases. Without
    ``delta`` the new entry keeps the δ cap in force (none if there was none), so changing the ε cap
    never lifts a δ cap by omission. A cap below what is already in use is recorded too: it simply
    admits nothing more. In a store with principals the cap must be ``signed`` by an officer's or an
    admin's key over ``cap_fields`` (``principals.authorise``) and is attributed to the key's holder.
    """
    fields = cap_fields(population_id, cap, reason, delta)
    population_id, nano, atto, reason = fields["population_id"], fields["nano_epsilon"], fields["atto_delta"], fields["reason"]
    with write_transaction(db) as conn:
        authorised = authorise(conn, "set-cap", signed, fields, by=by)
        by = authorised.name if authorised else require_text("by", by)
        ensure_population(conn, population_id, by)
        if atto is None:
            atto = _delta_cap_atto(conn, population_id)
        row = append(
            conn,
            "ledger",
            {
                "population_id": population_id,
                "kind": "cap",
                "nano_epsilon": nano,
                "actor": by,
                "reason": reason,
                "created_at": now(),
                "atto_delta": atto,
            },
        )
        record_signature(conn, authorised, "ledger", row)
        return row


def budget(db: sqlite_utils.Database, population_id: str, since: str | None = None) -> dict:
    """Exact budget state of a population in nano-ε: cap, reserved (not yet spent), spent, remaining;
    and its DP total, in nano-ε and atto-δ.

    ``since`` (a timestamp as stored) additionally counts ε spent since then (e.g. last 12 months).
    ``cap`` and ``remaining`` are None when no cap is set; ``delta_cap`` and ``delta_remaining`` when
    no δ cap is. ``dp_epsilon``/``dp_delta``: the composed (ε, δ) of the DP mode's releases in use;
    ``kepsilon_epsilon``: the ε of the method's own mode (bookkeeping, not a DP guarantee).
    """
    conn = db.conn
    cap = _cap_nano(conn, population_id)
    used = _used_nano(conn, population_id)
    dp_nano, dp_atto = _dp_used(conn, population_id)
    delta_cap = _delta_cap_atto(conn, population_id)
    spent_sql = """SELECT COALESCE(SUM(s.nano_epsilon), 0) FROM ledger s
                   WHERE s.population_id = ? AND s.kind = 'spend' AND s.created_at >= ?"""
    spent = conn.execute(spent_sql, (population_id, "")).fetchone()[0]
    spent_since = conn.execute(spent_sql, (population_id, since)).fetchone()[0] if since else None
    return {
        "population_id": population_id,
        "cap": cap,
        "in_use": used,
        "spent": spent,
        "reserved_unspent": used - spent,
        "spent_since": spent_since,
        "remaining": None if cap is None else cap - used,
        "dp_epsilon": dp_nano,
        "dp_delta": dp_atto,
        "kepsilon_epsilon": used - dp_nano,
        "delta_cap": delta_cap,
        "delta_remaining": None if delta_cap is None else delta_cap - dp_atto,
    }


def remaining(db: sqlite_utils.Database, population_id: str) -> float:
    """ε still available to the population under its latest cap (0.0 when no cap is set)."""
    state = budget(db, population_id)
    return from_nano(state["remaining"]) if state["remaining"] is not None else 0.0
