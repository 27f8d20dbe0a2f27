"""The Files and Batches API, as OpenAI's SDKs call it.

    POST   /v1/files                      multipart: `file` (JSONL), `purpose` = batch,
                                          `expires_after` (anchor created_at, seconds)
    GET    /v1/files?purpose=&order=&after=&limit=   newest first unless order=asc
    GET    /v1/files/{id}                 the file object
    GET    /v1/files/{id}/content         its bytes (input, output or error file)
    DELETE /v1/files/{id}
    POST   /v1/batches                    input_file_id, endpoint, completion_window, metadata,
                                          output_expires_after
    GET    /v1/batches/{id}               any replica answers (the state is shared)
    GET    /v1/batches?after=&limit=      newest first
    POST   /v1/batches/{id}/cancel

Every call is authenticated like a proxied request; files and batches are the caller's
tenant's (another tenant's id is not found). The batch keeps the hash of the key that
created it: its lines run as that key.
"""

from __future__ import annotations

import re
import time
from typing import Any

import orjson
from aiohttp import BodyPartReader, web

from gateway.batches.files import expiry_s
from gateway.batches.model import ENDPOINTS, Batch, new_id
from gateway.batches.service import BatchService
from gateway.core.auth import TENANT_HEADER, Identity
from gateway.core.errors import BadRequest, NotFound, PayloadTooLarge
from gateway.pipeline.request_body import json_object, read_limited

BATCHES = web.AppKey("routegate.batches", BatchService)

_WINDOW = re.compile(r"^([1-9][0-9]*)(s|m|h)$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}
MAX_WINDOW_S = 7 * 24 * 3600
MAX_METADATA_PAIRS = 16  # OpenAI's limits
MAX_METADATA_VALUE = 512
MAX_PAGE = 100
MAX_FILE_PAGE = 10_000  # OpenAI's: the files listing's default and largest page


def window_s(text: object) -> float:
    """`24h` (OpenAI's one window), or any `<n>s|m|h` up to a week."""
    match = _WINDOW.match(text) if isinstance(text, str) else None
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)] if match else 0
    if not match or seconds > MAX_WINDOW_S:
        raise BadRequest("completion_window must be a duration such as `24h` (s, m or h, "
                         f"at most a week); got {text!r}.", param="completion_window")
    return float(seconds)


def _service(request: web.Request) -> tuple[BatchService, Identity]:
    service = request.app[BATCHES]
    pipeline = service.pipeline
    return service, pipeline.auth.authenticate(request, pipeline.live.current)


def _json(body: object, identity: Identity, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json",
                        headers={TENANT_HEADER: identity.tenant})


async def create_file(request: web.Request) -> web.Response:
    service, identity = _service(request)
    settings = service.pipeline.live.current.file.batches
    if not request.content_type.startswith("multipart/"):
        raise BadRequest("Upload the file as multipart/form-data with `file` and `purpose`.",
                         param="file")
    purpose, data, filename = None, None, "upload.jsonl"
    expires: dict[str, str] = {}  # `expires_after[anchor]`, `expires_after[seconds]`
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            continue
        if part.name == "purpose":
            purpose = await _text_part(part)
        elif part.name == "file":
            filename = part.filename or filename
            data = await _read_part(part, settings.max_file_bytes)
        elif part.name in _EXPIRES_PARTS:
            expires[_EXPIRES_PARTS[part.name]] = await _text_part(part)
    if data is None:
        raise BadRequest("The form has no `file` part.", param="file")
    if purpose is None:
        raise BadRequest("The form has no `purpose` part (batch).", param="purpose")
    file = await service.files.upload(identity.tenant, filename, purpose, data, settings,
                                      expiry_s(expires or None, "expires_after"))
    return _json(file.openai(), identity)


_EXPIRES_PARTS = {"expires_after[anchor]": "anchor", "expires_after[seconds]": "seconds"}
MAX_TEXT_PART = 1024  # a form field other than the file


async def _text_part(part: BodyPartReader) -> str:
    return (await _read_part(part, MAX_TEXT_PART)).decode(errors="replace")


async def _read_part(part: BodyPartReader, limit: int) -> bytes:
    chunks, size = [], 0
    while chunk := await part.read_chunk():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"The file is over the limit of {limit} bytes "
                                  "(batches.max_file_bytes).")
        chunks.append(chunk)
    return b"".join(chunks)


async def get_file(request: web.Request) -> web.Response:
    service, identity = _service(request)
    file = await service.files.get(identity.tenant, request.match_info["file_id"])
    return _json(file.openai(), identity)


async def file_content(request: web.Request) -> web.Response:
    service, identity = _service(request)
    file = await service.files.get(identity.tenant, request.match_info["file_id"])
    return web.Response(body=await service.files.content(file),
                        content_type="application/jsonl",
                        headers={TENANT_HEADER: identity.tenant})


async def delete_file(request: web.Request) -> web.Response:
    service, identity = _service(request)
    file = await service.files.get(identity.tenant, request.match_info["file_id"])
    await service.files.delete(file)
    return _json({"id": file.id, "object": "file", "deleted": True}, identity)


async def create_batch(request: web.Request) -> web.Response:
    service, identity = _service(request)
    policy = service.pipeline.live.current
    body = json_object(await read_limited(request, policy.file.server.max_body_bytes,
                                          policy.file.server.body_read_timeout_s))
    endpoint = body.get("endpoint")
    if endpoint not in ENDPOINTS:
        raise BadRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}; got {endpoint!r}.",
                         param="endpoint")
    seconds = window_s(body.get("completion_window"))
    metadata = _metadata(body.get("metadata"))
    file_id = body.get("input_file_id")
    if not isinstance(file_id, str):
        raise BadRequest("input_file_id must be the id of an uploaded file.",
                         param="input_file_id")
    file = await service.files.get(identity.tenant, file_id)
    if file.purpose != "batch":
        raise BadRequest(f"File '{file_id}' has purpose {file.purpose!r}, not 'batch'.",
                         param="input_file_id")
    output_expires_s = expiry_s(body.get("output_expires_after"), "output_expires_after")
    now = int(time.time())
    batch = Batch(id=new_id("batch"), tenant=identity.tenant, key_hash=identity.key_hash,
                  endpoint=endpoint, input_file_id=file.id,
                  completion_window=body["completion_window"], window_s=seconds,
                  created_at=now, expires_at=now + int(seconds), metadata=metadata,
                  total=file.lines, output_expires_s=output_expires_s)
    await service.state.create(batch)
    service.wake.set()
    return _json(batch.openai(), identity)


def _metadata(value: object) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_METADATA_PAIRS or not all(
            isinstance(k, str) and isinstance(v, str) and len(v) <= MAX_METADATA_VALUE
            for k, v in value.items()):
        raise BadRequest(f"metadata must be an object of at most {MAX_METADATA_PAIRS} string "
                         f"pairs (values up to {MAX_METADATA_VALUE} characters).",
                         param="metadata")
    return value


async def _batch(request: web.Request) -> tuple[BatchService, Identity, Batch]:
    service, identity = _service(request)
    batch_id = request.match_info["batch_id"]
    batch = await service.state.get(batch_id)
    if batch is None or batch.tenant != identity.tenant:
        raise NotFound(f"No batch found with id '{batch_id}'.", param="batch_id")
    return service, identity, batch


async def get_batch(request: web.Request) -> web.Response:
    _, identity, batch = await _batch(request)
    return _json(batch.openai(), identity)


async def cancel_batch(request: web.Request) -> web.Response:
    service, identity, batch = await _batch(request)
    if batch.final:
        raise BadRequest(f"Batch '{batch.id}' is {batch.status}; it cannot be cancelled.",
                         param="batch_id", code="batch_not_cancellable")
    await service.state.request_cancel(batch.id, int(time.time()))
    found = await service.state.get(batch.id)
    return _json((found or batch).openai(), identity)


async def list_batches(request: web.Request) -> web.Response:
    service, identity = _service(request)
    limit = _limit(request, default=20, most=MAX_PAGE)
    found = await service.state.listing(identity.tenant, request.query.get("after"), limit + 1)
    return _page([batch.openai() for batch in found], limit, identity)


async def list_files(request: web.Request) -> web.Response:
    service, identity = _service(request)
    limit = _limit(request, default=MAX_FILE_PAGE, most=MAX_FILE_PAGE)
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest(f"order must be asc or desc; got {order!r}.", param="order")
    found = await service.state.file_listing(
        identity.tenant, request.query.get("purpose"), request.query.get("after"), limit + 1,
        newest_first=order == "desc", now=time.time())
    return _page([file.openai() for file in found], limit, identity)


def _limit(request: web.Request, *, default: int, most: int) -> int:
    text = request.query.get("limit", str(default))
    if not text.isdigit() or not 1 <= int(text) <= most:
        raise BadRequest(f"limit must be a whole number from 1 to {most}.", param="limit")
    return int(text)


def _page(found: list[dict[str, Any]], limit: int, identity: Identity) -> web.Response:
    """A cursor page, as OpenAI's lists are (`found`: up to one past the page)."""
    page = found[:limit]
    return _json({"object": "list", "data": page,
                  "first_id": page[0]["id"] if page else None,
                  "last_id": page[-1]["id"] if page else None,
                  "has_more": len(found) > limit}, identity)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/files", create_file)
    app.router.add_get("/v1/files", list_files)
    app.router.add_get("/v1/files/{file_id}", get_file)
    app.router.add_get("/v1/files/{file_id}/content", file_content)
    app.router.add_delete("/v1/files/{file_id}", delete_file)
    app.router.add_post("/v1/batches", create_batch)
    app.router.add_get("/v1/batches", list_batches)
    app.router.add_get("/v1/batches/{batch_id}", get_batch)
    app.router.add_post("/v1/batches/{batch_id}/cancel", cancel_batch)
