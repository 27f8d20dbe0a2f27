"""`/admin/keys` and `/admin/spend` (docs/keys.md).

    POST  /admin/keys                 create: the answer holds `key`, this once
    GET   /admin/keys                 list: ?tenant= &label= &status= &limit= &after=
    GET   /admin/keys/{id}            one key, with its spend and what its budgets leave
    PATCH /admin/keys/{id}            update (fields left out stay; null clears)
    POST  /admin/keys/{id}/rotate     a new key; the old one works `grace_s` more seconds
    POST  /admin/keys/{id}/revoke     revoke: refused everywhere within a second
    GET   /admin/spend                ?group_by=tenant,key,model,route,backend &from= &to=
                                      &format=json|csv, per UTC day

Reads need `admin:read`, changes `admin:write` (a policy admin key has both). Every
change is audited with the key before and after; two concurrent updates of one key both
succeed, the last one written wins, and both are in the audit log.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, date, datetime, timedelta
from typing import Any

import orjson
from aiohttp import web

from gateway.core.errors import BadRequest, Forbidden, NotFound, PayloadTooLarge
from gateway.keys.admin_auth import Admin, authorize
from gateway.keys.admission import limit_tenant
from gateway.keys.payloads import CreateKey, RotateKey, UpdateKey, changes, check_tenant, parse
from gateway.keys.record import KeyRecord, new_key_id
from gateway.keys.service import KeyService
from gateway.keys.spend import as_csv, group
from gateway.keys.store import SPEND_DIMENSIONS, KeyStoreUnavailable
from gateway.keys.view import KeysUnavailable
from gateway.limits.store import StoreUnavailable
from policies.keys import hash_key, new_key

SERVICE = web.AppKey("routegate.keys", KeyService)
MAX_PAGE = 1000
MAX_SPEND_DAYS = 366
MAX_BODY_BYTES = 64 * 1024  # a key's fields are a few hundred bytes


async def _body(request: web.Request) -> bytes:
    """The body, up to `MAX_BODY_BYTES` (the app's own cap is for inference bodies)."""
    if (request.content_length or 0) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"An admin request body is at most {MAX_BODY_BYTES} bytes.")
    body = bytearray()
    while chunk := await request.content.read(MAX_BODY_BYTES + 1 - len(body)):
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise PayloadTooLarge(f"An admin request body is at most {MAX_BODY_BYTES} bytes.")
    return bytes(body)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/admin/keys", create_key)
    app.router.add_get("/admin/keys", list_keys)
    app.router.add_get("/admin/keys/{id}", get_key)
    app.router.add_patch("/admin/keys/{id}", update_key)
    app.router.add_post("/admin/keys/{id}/rotate", rotate_key)
    app.router.add_post("/admin/keys/{id}/revoke", revoke_key)
    app.router.add_get("/admin/spend", get_spend)


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _admin(request: web.Request, *, write: bool) -> tuple[KeyService, Admin]:
    service = request.app[SERVICE]
    return service, authorize(request, service.live.current, service.view, service.guard,
                              service.audit, write=write)


def _unavailable(exc: KeyStoreUnavailable) -> KeysUnavailable:
    return KeysUnavailable(f"The key store is unavailable ({exc}); nothing was changed.")


async def _record(service: KeyService, admin: Admin, key_id: str) -> KeyRecord:
    try:
        record = await service.store.get(key_id)
    except KeyStoreUnavailable as exc:
        raise _unavailable(exc) from exc
    if record is None or (admin.tenant is not None and record.tenant != admin.tenant):
        raise NotFound(f"No key {key_id!r}.", param="id", code="key_not_found")
    return record


async def _changed(request: web.Request, service: KeyService, admin: Admin, action: str,
                   before: KeyRecord, after: KeyRecord) -> None:
    """Write `after` whole over `before` (the last write wins), and audit it."""
    now = service.clock()
    try:
        await service.store.put(after)
    except KeyStoreUnavailable as exc:
        service.audit.write(who=admin.who, action=action, outcome="store_unavailable",
                            remote=request.remote, target=after.id)
        raise _unavailable(exc) from exc
    await service.written(after)
    service.audit.write(who=admin.who, action=action, outcome="ok", remote=request.remote,
                        target=after.id, before=before.public(now), after=after.public(now))


async def create_key(request: web.Request) -> web.Response:
    service, admin = _admin(request, write=True)
    body = parse(CreateKey, await _body(request))
    policy, now = service.live.current, service.clock()
    check_tenant(policy, body.tenant)
    if admin.tenant is not None and body.tenant != admin.tenant:
        raise Forbidden(f"This key may manage keys of tenant {admin.tenant!r} only.")
    key = new_key()
    record = KeyRecord(id=new_key_id(), key_hash=hash_key(key), tenant=body.tenant,
                       created_at=now, updated_at=now,
                       **changes(body, policy, body.tenant, now))
    try:
        await service.store.create(record)
    except KeyStoreUnavailable as exc:
        service.audit.write(who=admin.who, action="create", outcome="store_unavailable",
                            remote=request.remote, target=record.id)
        raise _unavailable(exc) from exc
    await service.written(record)
    shown = record.public(now)
    service.audit.write(who=admin.who, action="create", outcome="ok", remote=request.remote,
                        target=record.id, after=shown)
    return _json({**shown, "key": key}, status=201)


async def list_keys(request: web.Request) -> web.Response:
    service, admin = _admin(request, write=False)
    query, now = request.query, service.clock()
    tenant = admin.tenant or query.get("tenant")
    label, status, after = query.get("label"), query.get("status"), query.get("after", "")
    if status not in (None, "active", "revoked", "expired"):
        raise BadRequest("`status`: one of active, revoked, expired.", param="status")
    limit = _int(query.get("limit", "100"), "limit", 1, MAX_PAGE)
    found = sorted(
        (record for record in service.view.records.values()
         if record.id > after and (tenant is None or record.tenant == tenant)
         and (label is None or label in record.labels)
         and (status is None or record.status(now) == status)),
        key=lambda record: record.id)
    page = found[:limit]
    return _json({"object": "list", "data": [record.public(now) for record in page],
                  "has_more": len(found) > limit,
                  "next_after": page[-1].id if len(found) > limit else None})


async def get_key(request: web.Request) -> web.Response:
    service, admin = _admin(request, write=False)
    record = await _record(service, admin, request.match_info["id"])
    now = service.clock()
    out = record.public(now)
    spend: dict[str, Any] = {"day_micros": None, "month_micros": None, "total_micros": None}
    if record.budget_day_micros is not None or record.budget_month_micros is not None:
        # what the budgets are enforced against: the key's ledger in the limit store
        with contextlib.suppress(StoreUnavailable):  # the limit store is out: unknown
            usage = await service.limiter.store.usage(limit_tenant(record.id), now)
            spend["day_micros"], spend["month_micros"] = (usage.day.spend_micros,
                                                          usage.month.spend_micros)
    if spend["day_micros"] is None:
        with contextlib.suppress(KeyStoreUnavailable):
            await service.ledger.flush()
            today = datetime.fromtimestamp(now, UTC).date()
            rows = [row for row in await service.store.spend(
                today.replace(day=1).isoformat(), today.isoformat()) if row.key == record.id]
            spend["day_micros"] = sum(row.cost_micros for row in rows
                                      if row.day == today.isoformat())
            spend["month_micros"] = sum(row.cost_micros for row in rows)
    with contextlib.suppress(KeyStoreUnavailable):
        spend["total_micros"] = await service.ledger.key_total_micros(record.id)
    out["spend"] = spend
    out["remaining"] = {
        name: None if limit is None or spent is None else max(0, limit - spent)
        for name, limit, spent in (
            ("day_micros", record.budget_day_micros, spend["day_micros"]),
            ("month_micros", record.budget_month_micros, spend["month_micros"]),
            ("total_micros", record.budget_total_micros, spend["total_micros"]))}
    return _json(out)


async def update_key(request: web.Request) -> web.Response:
    service, admin = _admin(request, write=True)
    body = parse(UpdateKey, await _body(request))
    before = await _record(service, admin, request.match_info["id"])
    if before.revoked_at is not None:
        raise BadRequest(f"Key {before.id} is revoked; a revoked key cannot be changed.",
                         param="id", code="key_revoked")
    now = service.clock()
    after = before.updated(now, **changes(body, service.live.current, before.tenant, now))
    await _changed(request, service, admin, "update", before, after)
    return _json(after.public(now))


async def rotate_key(request: web.Request) -> web.Response:
    service, admin = _admin(request, write=True)
    body = parse(RotateKey, await _body(request))
    before = await _record(service, admin, request.match_info["id"])
    if before.revoked_at is not None:
        raise BadRequest(f"Key {before.id} is revoked; a revoked key cannot be rotated.",
                         param="id", code="key_revoked")
    now, key = service.clock(), new_key()
    grace = body.grace_s > 0
    after = before.updated(now, key_hash=hash_key(key),
                           previous_hash=before.key_hash if grace else None,
                           previous_until=now + body.grace_s if grace else None)
    await _changed(request, service, admin, "rotate", before, after)
    return _json({**after.public(now), "key": key})


async def revoke_key(request: web.Request) -> web.Response:
    service, admin = _admin(request, write=True)
    before = await _record(service, admin, request.match_info["id"])
    now = service.clock()
    if before.revoked_at is not None:  # already: nothing to write, the same answer
        return _json(before.public(now))
    after = before.updated(now, revoked_at=now, previous_hash=None, previous_until=None)
    await _changed(request, service, admin, "revoke", before, after)
    return _json(after.public(now))


async def get_spend(request: web.Request) -> web.Response:
    service, admin = _admin(request, write=False)
    query = request.query
    by = [name.strip() for name in query.get("group_by", "tenant").split(",") if name.strip()]
    unknown = [name for name in by if name not in SPEND_DIMENSIONS]
    if unknown or len(set(by)) != len(by):
        raise BadRequest(f"`group_by`: {', '.join(unknown) or 'a repeated name'}; use "
                         f"{', '.join(SPEND_DIMENSIONS)}.", param="group_by")
    today = datetime.fromtimestamp(service.clock(), UTC).date()
    first = _day(query.get("from"), "from", today)
    last = _day(query.get("to"), "to", today)
    if last < first or (last - first) > timedelta(days=MAX_SPEND_DAYS):
        raise BadRequest(f"`to`: from {first} to {last} is not a range of at most "
                         f"{MAX_SPEND_DAYS} days.", param="to")
    output = query.get("format", "json")
    if output not in ("json", "csv"):
        raise BadRequest("`format`: json or csv.", param="format")
    try:
        await service.ledger.flush()  # this replica's latest requests, too
        rows = await service.store.spend(first.isoformat(), last.isoformat())
    except KeyStoreUnavailable as exc:
        raise KeysUnavailable(f"Spend cannot be read: the key store is unavailable ({exc}).") \
            from exc
    if admin.tenant is not None:
        rows = [row for row in rows if row.tenant == admin.tenant]
    grouped = group(rows, by)
    if output == "csv":
        return web.Response(text=as_csv(grouped, by), content_type="text/csv")
    return _json({"object": "list", "from": first.isoformat(), "to": last.isoformat(),
                  "group_by": by, "data": grouped})


def _day(value: str | None, name: str, default: date) -> date:
    if value is None:
        return default
    try:
        return date.fromisoformat(value[:10])
    except ValueError as exc:
        raise BadRequest(f"`{name}`: a date, YYYY-MM-DD.", param=name) from exc


def _int(value: str, name: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError as exc:
        raise BadRequest(f"`{name}`: a whole number.", param=name) from exc
    if not low <= number <= high:
        raise BadRequest(f"`{name}`: from {low} to {high}.", param=name)
    return number


