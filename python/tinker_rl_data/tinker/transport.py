"""tinker's step requests sent lean over tinker's own transport.

Each request tinker's ``AsyncAPIClient.post`` sends passes through
``FinalRequestOptions`` and two copies of it, headers rebuilt and wrapped in
``httpx.Headers``, ``httpx.build_request``, an async-generator auth flow,
``AsyncPyqwestTransport``'s header copy and ``wait_for``s, an
``AsyncAPIResponse``: most of a sample call's client CPU. For the paths a
training step sends (:data:`PATHS`: ``asample``, ``retrieve_future``,
``forward_backward``, ``optim_step``; ``compute_logprobs`` is an ``asample``)
the replacement of ``post`` sends the same request, through the same
``pyqwest`` transport object the client's httpx client holds (its TLS,
HTTP/2, pool and timeouts; the answer read whole by pyqwest's buffering
client over it, one await), with the rest made once:

- a *template* per client and request shape (path, the names of the extra
  headers, the timeout, the SDK method attributed): the request tinker builds
  for it with marker values, captured where the adapter hands it to pyqwest;
  a request fills its markers (idempotency key, retry count, Content-Length,
  the extra headers' values). So the method, URL, header names, order and
  values are tinker's by construction.
- tinker's retry loop (``AsyncAPIClient.request``) as it is: the same
  idempotency key across attempts, its ``_should_retry``, its
  ``_sleep_for_retry`` backoff, its exception classes with ``.request``,
  ``.response``, ``.body`` built by its own methods (the httpx objects are
  made only then), the adapter's mapping of pyqwest's errors, one deadline
  over the exchange as the adapter's; a redirect the transport answers
  (one whose Location pyqwest could not use) followed by httpx's own code,
  as tinker's httpx client follows it.
- the answer parsed by the client's own ``_process_response_data`` (an
  ``AsyncAPIResponse`` where tinker returns one: ``with_raw_response``).

A third piece (:mod:`.futures`) lets each call's concurrent future drop
its callbacks once done, so the call is freed when its caller drops it
rather than at the next full collection, and runs a call tinker makes on
its own loop (a request's ``_APIFuture``) without waking that loop.

Tinker's layers above ``post`` stay: its ``RetryHandler`` and
``execute_with_retries``, the sample dispatch semaphores and backpressure,
the ``_APIFuture`` polling loop (``try_again``, ``complete_metadata``, 410,
the 45 s long poll), telemetry.

A request goes to tinker's own ``post`` unless the client is one ours
reproduces (the one check, :meth:`_Lane.open` and :meth:`_Lane.ready`):
tinker's default httpx client over ``AsyncPyqwestTransport``,
no mounted or environment proxy, no event hooks, no cookies, a static API
key (not a JWT, not a credential command), the base methods of
``AsyncAPIClient`` and ``httpx.AsyncClient`` for building and sending (on
the class and on the instance), asyncio, and no debug logging of tinker or
info logging of httpx (their log lines are tinker's). Cookies, hooks, the
instance's methods, logging and the transport are checked per request (the
server can set a cookie; the server's ``use_pyqwest_transport`` flag picks
the transport per client); a change to the client's defaults (tinker's or
its httpx client's headers and query, its timeout, also changed in place)
drops the templates made before it. A service that turns pyqwest off
(``use_pyqwest_transport: false`` in its client config) gives every client
tinker makes for it httpx's own transport, so that check sends none of their
requests lean: the service's answer is seen when it passes through ``post``
(the config is fetched as the first client is made, before any step
request), and ``status()`` says from then on that the two lean pieces stand
aside (:func:`aside`). The install probe (:func:`probe_post`) sends the same calls
through tinker's ``post`` and ours on two clients whose transport records
instead of sending, and compares the requests and what the callers get
(answers, HTTP errors, connection errors, timeouts, a retried 5xx).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import json
import logging
import os
import secrets
import threading
import time
import types as pytypes
import warnings
import weakref
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

from .. import features, switches
from ..patch.feature import Feature
from ..patch.piece import Piece, check
from . import futures, sample_path

__all__ = ["PATHS", "PIECES", "make_fetch", "make_post", "probe_fetch", "probe_post"]

#: The paths sent lean; every other request goes to tinker's ``post``.
PATHS = frozenset({"/api/v1/asample", "/api/v1/retrieve_future", "/api/v1/forward_backward", "/api/v1/optim_step"})

# The request options resources pass that ours reproduces (others: tinker's).
_OPTIONS = frozenset({"headers", "max_retries", "timeout"})
_MAX_TEMPLATES = 64


@dataclass(frozen=True)
class _Template:
    """One request shape as tinker sends it: each header a fixed value or
    the index of the marker it holds (``_IDEMPOTENCY``, ``_RETRY``,
    ``_LENGTH``, ``_EXTRA + i``), filled per request."""

    method: str
    url: str
    headers: tuple[tuple[str, str, int], ...]  # at pyqwest: (name, value, marker or -1)
    httpx_headers: tuple[tuple[str, str, int], ...]  # the httpx.Request's (exceptions, raw responses)
    timeout: float | None  # the adapter's operation timeout
    extensions: dict[str, Any]
    httpx_url: Any  # the request's httpx.URL, parsed once


class _Lane:
    """What ours needs of one ``AsyncTinker`` client, checked once: its
    transport, auth, and the templates of its request shapes."""

    def __init__(self, client: Any, adapter: Any, auth: Any, token: str) -> None:
        self.adapter = adapter
        self.auth = auth
        self.token = token
        self.base_url = client._base_url
        self.custom = _kept(_custom(client))
        self.own_keys = type(client)._idempotency_key is _base_idempotency_key()
        self.templates: dict[tuple[Any, ...], _Template | None] = {}
        self._buffered: tuple[Any, Any] = (None, None)

    def buffered(self, transport: Any) -> Any:
        """pyqwest's buffering client over ``transport`` (the adapter's
        pyqwest transport): one await for the whole answer, read in pyqwest's
        native code."""
        held, client = self._buffered
        if held is not transport:
            from pyqwest._pyqwest import Client

            client = Client(transport=transport)
            self._buffered = (transport, client)
        return client

    @classmethod
    def open(cls, client: Any) -> _Lane | None:
        """The lane of ``client``, or None when ours does not reproduce it."""
        try:
            return cls._open(client)
        except Exception:  # a client not built as ours reads it: tinker's
            return None

    @classmethod
    def _open(cls, client: Any) -> _Lane | None:
        import httpx
        from pyqwest.httpx import AsyncPyqwestTransport
        from tinker._base_client import AsyncAPIClient
        from tinker.lib._auth_token_provider import ApiKeyAuthProvider

        http = getattr(client, "_client", None)
        auth = getattr(client, "_auth", None)
        cls_ = type(client)
        if not (
            isinstance(http, httpx.AsyncClient)
            and all(getattr(type(http), name) is getattr(httpx.AsyncClient, name) for name in _REPLACED_HTTPX)
            and type(http._transport) is AsyncPyqwestTransport
            and not http._mounts
            and type(auth) is ApiKeyAuthProvider
            and not auth._token.startswith("eyJ")  # a JWT expires: tinker checks it per request
            and client.custom_auth is auth
            and all(getattr(cls_, name) is getattr(AsyncAPIClient, name) for name in _REPLACED_CLIENT)
            and not switches.proxy_set()
        ):
            return None
        return cls(client, http._transport, auth, auth._token)

    def ready(self, client: Any, options: Any) -> bool:
        """Whether this request may go lean (what can change per request)."""
        http = client._client
        if not (
            http._transport is self.adapter
            and client._auth is self.auth
            and self.auth._token == self.token
            and not http.is_closed
            and not http.cookies
            and not any(http._event_hooks.values())
            and client.__dict__.keys().isdisjoint(_OWN_ON_THE_CLIENT)
            and http.__dict__.keys().isdisjoint(_REPLACED_HTTPX)
            and not _tinker_log.isEnabledFor(logging.DEBUG)
            and not _httpx_log.isEnabledFor(logging.INFO)
            and _OPTIONS.issuperset(options)
        ):
            return False
        custom = _custom(client)
        if client._base_url is not self.base_url or custom != self.custom:
            self.base_url, self.custom = client._base_url, _kept(custom)
            self.templates.clear()
        headers = options.get("headers")
        if headers is not None:
            for name, value in headers.items():
                if type(value) is not str or not value.isascii() or not name.isascii():
                    return False
                lower = name.lower()
                if (lower == _RAW_HEADER and value == "stream") or lower == _OVERRIDE_HEADER:
                    return False
        timeout = options.get("timeout")
        return timeout is None or type(timeout) in (int, float)

    async def template(self, client: Any, path: str, names: tuple[str, ...], options: Any) -> _Template | None:
        """The template for this shape (made on first use), or None when
        tinker's request for it is not one ours sends."""
        timeout = options.get("timeout", _UNSET)
        key = (path, names, timeout, type(timeout), _sdk_method())  # (45 and 45.0: two headers)
        try:
            return self.templates[key]
        except KeyError:
            pass
        if len(self.templates) >= _MAX_TEMPLATES:
            self.templates.clear()
        template = self.templates[key] = await _capture_template(client, path, names, options)
        return template


_UNSET = object()


def _custom(client: Any) -> tuple[Any, ...]:
    """What a template holds of the client's defaults, as they are now
    (one made before a change is dropped): tinker's default headers, query
    and timeout (an ``httpx.Timeout`` changes in place), its httpx client's
    headers and query."""
    timeout = client.timeout
    as_dict = getattr(timeout, "as_dict", None)  # an httpx.Timeout's fields
    http = client._client
    return (
        tuple(client._custom_headers.items()),
        tuple(client._custom_query.items()),
        timeout if as_dict is None else as_dict(),
        tuple(http.headers.raw),
        http.params,
    )


# Methods of tinker's client and of its httpx client that ours does the
# work of: overridden on the class, the lane is not opened; on the
# instance (checked per request), tinker's post sends the request. A class's
# own ``_idempotency_key`` is called (``_Lane.own_keys``); an instance's too,
# by tinker's post.
_REPLACED_CLIENT = ("request", "_prepare_options", "_prepare_request", "_build_request", "_build_headers", "_should_retry")
_OWN_ON_THE_CLIENT = frozenset({*_REPLACED_CLIENT, "_idempotency_key"})
_REPLACED_HTTPX = ("send", "build_request", "_send_handling_auth", "_send_handling_redirects", "_send_single_request")


def _kept(custom: tuple[Any, ...]) -> tuple[Any, ...]:
    """``custom`` as a lane keeps it: a copy, so that a value changed in
    place later compares unequal."""
    try:
        return copy.deepcopy(custom)
    except Exception:  # a value that does not copy: compared as it is
        return custom


_tinker_log = logging.getLogger("tinker._base_client")
_httpx_log = logging.getLogger("httpx")
_RAW_HEADER = "x-stainless-raw-response"
_OVERRIDE_HEADER = "____stainless_override_cast_to"

# Marker indices: what a request fills in its template.
_IDEMPOTENCY, _RETRY, _LENGTH, _EXTRA = 0, 1, 2, 3
_RETRY_MARK = 7_654_321  # a retry count no request has
_LENGTH_MARK = 54_321  # the marker body's length


def _base_idempotency_key() -> Any:
    from tinker._base_client import BaseClient

    return BaseClient._idempotency_key


_random_bytes = bytearray()
_random_lock = threading.Lock()


def _idempotency_key() -> str:
    """A key as tinker's ``BaseClient._idempotency_key`` makes it
    (``stainless-python-retry-`` and ``str(uuid.uuid4())``), its random bytes
    read from ``os.urandom`` 4 KiB at a time instead of 16 bytes a call, the
    version and variant bits set as ``uuid.UUID(..., version=4)`` sets them."""
    with _random_lock:
        if not _random_bytes:
            _random_bytes.extend(os.urandom(4096))
        key = _random_bytes[-16:]
        del _random_bytes[-16:]
    key[6] = (key[6] & 0x0F) | 0x40  # version 4
    key[8] = (key[8] & 0x3F) | 0x80  # RFC 4122 variant
    h = key.hex()
    return f"stainless-python-retry-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


os.register_at_fork(after_in_child=_random_bytes.clear)  # a child draws its own


def _sdk_method() -> Any:
    """The SDK method a request is attributed to (tinker 0.38's
    ``x-sdk-method`` header; None before it)."""
    var = _sdk_method_var()
    return None if var is None else var.get()


@functools.cache
def _sdk_method_var() -> Any:
    try:
        from tinker.lib import sdk_method
    except ImportError:  # tinker 0.36: no such header
        return None
    return sdk_method._current_sdk_method


async def _capture_template(client: Any, path: str, names: tuple[str, ...], options: Any) -> _Template | None:
    """tinker's request for this shape, built by its own code with marker
    values, as the adapter would hand it to pyqwest (nothing sent)."""
    from pyqwest.httpx import _transport as adapter
    from tinker._base_client import FinalRequestOptions

    salt = secrets.token_hex(6)
    idempotency = f"trd-idempotency-{salt}"
    extra = [f"trd-header-{i}-{salt}" for i in range(len(names))]
    marks = {idempotency: _IDEMPOTENCY, str(_RETRY_MARK): _RETRY, str(_LENGTH_MARK): _LENGTH}
    marks.update({value: _EXTRA + i for i, value in enumerate(extra)})
    fields: dict[str, Any] = {"headers": dict(zip(names, extra))} if names else {}
    if "timeout" in options:
        fields["timeout"] = options["timeout"]
    built = FinalRequestOptions.construct(
        method="post", url=path, json_data=b" " * _LENGTH_MARK, idempotency_key=idempotency, **fields
    )
    request = client._build_request(built, retries_taken=_RETRY_MARK)
    if set(request.extensions) != {"timeout"}:
        return None
    flow = client.custom_auth.async_auth_flow(request)
    request = await flow.__anext__()
    await flow.aclose()
    try:
        adapter.check_scheme(request)
        at_transport = adapter.convert_headers(request).items()
    except Exception:  # a request tinker's adapter would refuse: tinker says so
        return None

    def slots(pairs: Any) -> tuple[tuple[str, str, int], ...]:
        return tuple((name, value, marks.get(value, -1)) for name, value in pairs)

    headers = slots(at_transport)
    found = [mark for _, _, mark in headers if mark >= 0]
    if not {_RETRY, _LENGTH, *range(_EXTRA, _EXTRA + len(names))} <= set(found) or len(found) != len(set(found)):
        return None  # a marker lost, or one used twice: not a shape ours fills
    return _Template(
        method=request.method,
        url=str(request.url),
        headers=headers,
        httpx_headers=slots(request.headers.multi_items()),
        timeout=adapter.convert_timeout(request.extensions),
        extensions=dict(request.extensions),
        httpx_url=request.url,
    )


def make_post(original: Callable[..., Any]) -> Callable[..., Any]:
    """``AsyncAPIClient.post`` with the requests of :data:`PATHS` sent lean
    (see the module's docstring); every other call is ``original``'s."""
    state = {"active": True}

    @functools.wraps(original)
    async def post(
        self: Any,
        path: str,
        *,
        cast_to: Any,
        body: Any = None,
        files: Any = None,
        options: Any = {},  # noqa: B006 (tinker's signature; never modified)
        extra_headers_secret: Any = None,
        stream: bool = False,
        stream_cls: Any = None,
    ) -> Any:
        if (
            state["active"]
            and path in PATHS
            and files is None
            and not stream
            and extra_headers_secret is None
            and type(body) in (bytes, dict)
            and asyncio._get_running_loop() is not None
        ):
            route = await _route(self, path, options)
            if route is not None:
                return await _send(self, *route, path, cast_to, body, options)
        answer = await original(
            self,
            path,
            cast_to=cast_to,
            body=body,
            files=files,
            options=options,
            extra_headers_secret=extra_headers_secret,
            stream=stream,
            stream_cls=stream_cls,
        )
        if path == _CLIENT_CONFIG_PATH:
            _saw_client_config(self, answer)
        return answer

    _switches.append(state)
    _made_posts.add(post)
    return post


_CLIENT_CONFIG_PATH = "/api/v1/client/config"
PYQWEST_OFF = "the service turned pyqwest off (use_pyqwest_transport: false)"
# Per service (base URL): whether its client config left pyqwest on.
_pyqwest_by_service: dict[str, bool] = {}


def _saw_client_config(client: Any, answer: Any) -> None:
    """Keeps the service's ``use_pyqwest_transport`` from its client config
    (tinker's ``ClientConfigResponse``; anything else is not read)."""
    flag = getattr(answer, "use_pyqwest_transport", None)
    if type(flag) is bool:
        _pyqwest_by_service[str(client.base_url)] = flag


def aside() -> dict[str, str]:
    """The feature's ``aside`` hook: the lean pieces (post and the future
    polls), and why, once a service this process's clients asked turned
    pyqwest off; the third piece (futures freed when dropped) does not
    depend on the transport."""
    off = [url for url, on in _pyqwest_by_service.items() if not on]
    if not off:
        return {}
    why = PYQWEST_OFF if len(off) == len(_pyqwest_by_service) else f"{PYQWEST_OFF} at {', '.join(off)}"
    return {piece.where: why for piece in _LEAN}


# Each client's lane (None: a client ours does not reproduce).
_lanes: weakref.WeakKeyDictionary[Any, _Lane | None] = weakref.WeakKeyDictionary()
# The posts make_post made (the future polls' check that a client's post is
# tinker's or ours).
_made_posts: weakref.WeakSet[Any] = weakref.WeakSet()


async def _route(client: Any, path: str, options: Any) -> tuple[_Lane, _Template] | None:
    """The lane and template a request of ``client`` goes lean by, or None
    (tinker's ``post`` sends it)."""
    try:
        lane = _lanes[client]
    except KeyError:
        lane = _lanes[client] = _Lane.open(client)
    if lane is None or not lane.ready(client, options):
        return None
    if client._platform is None:  # as tinker's request: its blocking IO off the loop
        from tinker._base_client import get_platform
        from tinker._utils import asyncify

        client._platform = await asyncify(get_platform)()
    template = await lane.template(client, path, tuple(options.get("headers") or ()), options)
    return None if template is None else (lane, template)


# httpx's encoding of ``json=``: ``json.dumps`` with these options makes
# this encoder anew per call.
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _httpx_json(data: Any) -> bytes:
    """What httpx sends for ``json=data``."""
    return _JSON.encode(data).encode("utf-8")


async def _send(
    client: Any,
    lane: _Lane,
    template: _Template,
    path: str,
    cast_to: Any,
    body: Any,
    options: Any,
    *,
    answer_only: bool = False,
) -> Any:
    """``AsyncAPIClient.request``'s loop for one POST, over the template.
    With ``answer_only``, a raw request's plain 2xx answer (no cookie, no
    encoding) comes back as an :class:`_Answer` (the future polls read no
    more of it), else as tinker's ``AsyncAPIResponse``."""
    httpx, ClientState, Headers, _exceptions = _late()
    _sent[0] += 1
    headers = options.get("headers") or {}
    content = body if type(body) is bytes else _httpx_json(body)
    idempotency = _idempotency_key() if lane.own_keys else client._idempotency_key()
    values = [idempotency, "", str(len(content)), *headers.values()]
    max_retries = options.get("max_retries", client.max_retries)
    buffered = lane.buffered(lane.adapter._transport)
    loop = asyncio.get_running_loop()

    async def processed(full: Any, retries_taken: int) -> Any:
        """tinker's own reading of a response (raw, a cookie, an encoding)."""
        return await client._process_response(
            cast_to=cast_to,
            options=_request_options(path, body, options, idempotency),
            response=full,
            stream=False,
            stream_cls=None,
            retries_taken=retries_taken,
        )

    async def sleep_for_retry(retries_taken: int, full: Any) -> None:
        """tinker's backoff before the next attempt (its options made only then)."""
        await client._sleep_for_retry(
            retries_taken=retries_taken,
            max_retries=max_retries,
            options=_request_options(path, body, options, idempotency),
            response=full,
        )

    for retries_taken in range(max_retries + 1):
        remaining = max_retries - retries_taken
        values[_RETRY] = str(retries_taken)
        start = time.perf_counter()
        deadline = None if template.timeout is None else loop.time() + template.timeout
        try:
            http = client._client
            if http._state == ClientState.CLOSED:  # closed while this call slept before a retry: as httpx's send
                raise RuntimeError("Cannot send a request, as the client has been closed.")
            http._state = ClientState.OPENED
            request_headers = Headers([(n, v if m < 0 else values[m]) for n, v, m in template.headers])
            async with asyncio.timeout_at(deadline):
                response = await buffered.execute(template.method, template.url, request_headers, content)
            status, answer, data = response.status, response.headers, response.content
            plain = 200 <= status < 300 and "set-cookie" not in answer and "content-encoding" not in answer
            # httpx's send reads (and decodes) the body inside tinker's try: a
            # body that does not decode is a connection error there too.
            full = None if plain else _httpx_response(client, template, values, content, response, data, start)
            if full is not None and full.has_redirect_location and http.follow_redirects:
                full = await _follow(http, full)  # pyqwest left it (a Location it could not use): httpx follows
        except Exception as exc:
            sent = _httpx_request(client, template, values, content)
            error = _as_httpx_error(exc, sent)
            try:  # raised as the adapter raises it, handled as tinker's request handles it
                raise error
            except Exception:
                if remaining > 0:
                    await sleep_for_retry(retries_taken, None)
                    continue
                if isinstance(error, httpx.TimeoutException):
                    raise _exceptions.APITimeoutError(request=sent) from error
                raise _exceptions.APIConnectionError(request=sent) from error
        if full is None:
            if "x-deprecation-note" in answer:
                _deprecation_note(client, template, values, content, response, data, start)
            raw = headers and any(n.lower() == _RAW_HEADER and v for n, v in headers.items())
            if raw and answer_only:
                return _Answer(answer, data)
            if not raw:
                parsed = _parse(client, cast_to, answer, data)
                if parsed is not _UNPARSED:
                    return parsed
            full = _httpx_response(client, template, values, content, response, data, start)
            return await processed(full, retries_taken)
        if full.is_success:  # it set a cookie or is encoded: as tinker reads it
            from tinker._base_client import _log_deprecation_note

            _log_deprecation_note(full)
            return await processed(full, retries_taken)
        try:  # as tinker's request: handled as httpx's status error
            full.raise_for_status()
        except httpx.HTTPStatusError:
            if remaining > 0 and client._should_retry(full):
                await sleep_for_retry(retries_taken, full)
                continue
            from tinker._base_client import _log_deprecation_note

            _log_deprecation_note(full)
            raise client._make_status_error_from_response(full) from None
        raise AssertionError(f"httpx raised no status error for a {status}")  # it raises for each but 2xx
    raise AssertionError("could not resolve response (should never happen)")


@functools.cache
def _late() -> tuple[Any, Any, Any, Any]:
    """What :func:`_send` uses of httpx, pyqwest and tinker, imported once
    (at the first request: the module imports none of them)."""
    import httpx
    from httpx._client import ClientState
    from pyqwest import Headers
    from tinker import _exceptions

    return httpx, ClientState, Headers, _exceptions


# Requests sent lean in this process (the probe checks its calls were).
_sent = [0]


class _Unparsed:
    pass


_UNPARSED = _Unparsed()


def _parse(client: Any, cast_to: Any, answer: Any, data: bytes) -> Any:
    """What ``AsyncAPIResponse.parse`` gives for a JSON answer cast to one
    of tinker's models, or _UNPARSED (then tinker's own parse runs)."""
    from tinker._models import BaseModel
    from tinker._types import ModelBuilderProtocol

    if not (
        isinstance(cast_to, type)
        and issubclass(cast_to, BaseModel)
        and not issubclass(cast_to, ModelBuilderProtocol)
        and answer.get("content-type", "*").split(";")[0].endswith("json")
    ):
        return _UNPARSED
    try:
        parsed = json.loads(data)
        return client._process_response_data(data=parsed, cast_to=cast_to, response=None)
    except Exception:  # tinker's parse raises its own exception with the response
        return _UNPARSED


def _request_options(path: str, body: Any, options: Any, idempotency: str) -> Any:
    """The ``FinalRequestOptions`` tinker's ``request`` holds."""
    from tinker._base_client import FinalRequestOptions

    return FinalRequestOptions.construct(
        method="post", url=path, json_data=body, idempotency_key=idempotency, **options
    )


def _httpx_request(client: Any, template: _Template, values: list[str], content: bytes) -> Any:
    """The ``httpx.Request`` tinker would have sent (for its exceptions and
    responses)."""
    import httpx

    return httpx.Request(
        template.method,
        template.httpx_url,
        headers=[(n, v if m < 0 else values[m]) for n, v, m in template.httpx_headers],
        content=content,
        extensions=template.extensions,
    )


def _httpx_response(
    client: Any, template: _Template, values: list[str], content: bytes, response: Any, data: bytes, start: float
) -> Any:
    """The ``httpx.Response`` tinker's client would hold, read."""
    import httpx

    full = httpx.Response(
        status_code=response.status,
        headers=httpx.Headers(tuple(response.headers.items())),
        stream=httpx.ByteStream(data),  # as the adapter's: no header added; decoded as httpx decodes
        request=_httpx_request(client, template, values, content),
        extensions={"get_trailers": functools.partial(_trailers, response)},  # as the adapter's
        default_encoding=client._client._default_encoding,
    )
    if "set-cookie" in full.headers:  # as httpx: before the body is read
        client._client.cookies.extract_cookies(full)
    full.read()
    full.elapsed = timedelta(seconds=time.perf_counter() - start)
    return full


async def _follow(http: Any, first: Any) -> Any:
    """What tinker's httpx client does with a redirect its transport
    answered: follows it, by its own code (through tinker's adapter), the
    answer read, as ``httpx.AsyncClient.send`` does."""
    request = http._build_redirect_request(first.request, first)
    final = await http._send_handling_redirects(request, follow_redirects=True, history=[first])
    try:
        await final.aread()
    except BaseException:
        await final.aclose()
        raise
    return final


def _trailers(response: Any) -> Any:
    import httpx

    return httpx.Headers(tuple(response.trailers.items()))


def _deprecation_note(
    client: Any, template: _Template, values: list[str], content: bytes, response: Any, data: bytes, start: float
) -> None:
    from tinker._base_client import _log_deprecation_note

    _log_deprecation_note(_httpx_response(client, template, values, content, response, data, start))


# pyqwest's text for an error reading a body whole, and reading it as a stream.
_BUFFERED_READ, _STREAM_READ = "Error reading full content: ", "Error reading content: "


def _as_httpx_error(exc: Exception, request: Any) -> Exception:
    """The exception tinker's adapter raises for ``exc`` (pyqwest's, or the
    deadline's), with ``exc`` as its cause."""
    import pyqwest
    from pyqwest.httpx import _transport as adapter

    text = exc.args[0] if exc.args and type(exc.args[0]) is str else ""
    if text.startswith(_BUFFERED_READ):  # ours: read whole; tinker's adapter: read as a stream
        exc.args = (_STREAM_READ + text[len(_BUFFERED_READ) :], *exc.args[1:])
    if isinstance(exc, pyqwest.StreamError):
        error: Exception = adapter.map_stream_error(exc)
    elif isinstance(exc, pyqwest.RemoteProtocolError):
        error = adapter.map_remote_protocol_error(exc, request)
    elif isinstance(exc, pyqwest.TooManyRedirects):
        import httpx

        error = httpx.TooManyRedirects(str(exc), request=request)
    elif isinstance(exc, ConnectionError):
        error = adapter.map_connection_error(exc, request)
    elif isinstance(exc, TimeoutError):
        error = adapter.map_timeout_error(exc, request)
    elif isinstance(exc, (pyqwest.ReadError, pyqwest.WriteError)):
        error = adapter.map_network_error(exc, request)
    elif isinstance(exc, ValueError):
        error = adapter.map_value_error(exc, request)
    else:
        return exc
    error.__cause__ = exc
    return error


# --------------------------------------------------------------------------
# The future polls


@dataclass(frozen=True)
class _Answer:
    """A future poll's plain 2xx answer: pyqwest's headers and the body."""

    headers: Any
    data: bytes

    def content_type(self) -> str:
        """What httpx's ``Headers.get("content-type", "")`` reads: every
        value of the name, joined."""
        return ", ".join(self.headers.getall("content-type"))


_RETRIEVE_PATH = "/api/v1/retrieve_future"


def make_fetch(original: Callable[..., Any]) -> Callable[..., Any]:
    """``_APIFuture._fetch_via_rest`` with its ``retrieve_future`` request
    sent lean: the request tinker's ``client.futures.with_raw_response.retrieve``
    sends (its headers, the raw-response header, the timeout of 45 s, no
    retries, the body its ``model_dump`` makes), from the same pool client,
    through :func:`_send`, and its answer read as tinker's code reads it
    (protobuf bytes; else the JSON, parsed by ``orjson`` as tinker's response,
    then try_again / complete_metadata / error / result), without making the
    httpx request and response and tinker's response object. A client ours
    does not reproduce (see the module's docstring), a post or retrieve not
    tinker's or ours, and an answer that sets a cookie or is encoded go
    through tinker's own call."""
    import tinker
    from tinker._constants import RAW_RESPONSE_HEADER
    from tinker._response import orjson
    from tinker.lib import api_future_impl as impl
    from tinker.lib.client_connection_pool_type import ClientConnectionPoolType
    from tinker.resources.futures import AsyncFuturesResource
    from tinker.types.future_retrieve_request import FutureRetrieveRequest
    from tinker.types.future_retrieve_response import FutureRetrieveResponse

    pool = ClientConnectionPoolType.RETRIEVE_PROMISE
    retrieve = AsyncFuturesResource.retrieve
    loads = orjson.loads
    state = {"active": True}

    @functools.wraps(original)
    async def _fetch_via_rest(self: Any, loop_state: Any, iteration: int) -> Any:
        if not state["active"]:
            return await original(self, loop_state, iteration)
        headers = {
            "X-Tinker-Request-Iteration": str(iteration),
            "X-Tinker-Request-Type": self.request_type,
        }
        if self.model_cls in impl.PROTO_SUPPORTED_TYPES:
            headers["Accept"] = "application/x-protobuf"
        if iteration == 0:
            headers["X-Tinker-Create-Promise-Roundtrip-Time"] = str(self.request_queue_roundtrip_time)

        try:
            with self.holder.aclient(pool) as client:
                request_id, allow = self.request_id, loop_state.allow_metadata_only
                route = None
                if type(request_id) is str and type(allow) is bool and _tinkers_retrieve(client, retrieve):
                    # What async_to_raw_response_wrapper adds, last.
                    options = {"headers": {**headers, RAW_RESPONSE_HEADER: "raw"}, "timeout": 45, "max_retries": 0}
                    route = await _route(client, _RETRIEVE_PATH, options)
                if route is not None:
                    body = {"request_id": request_id, "allow_metadata_only": allow}
                    response = await _send(
                        client, *route, _RETRIEVE_PATH, FutureRetrieveResponse, body, options, answer_only=True
                    )
                else:
                    response = await client.futures.with_raw_response.retrieve(
                        request=FutureRetrieveRequest(request_id=request_id, allow_metadata_only=allow),
                        timeout=45,
                        extra_headers=headers,
                        max_retries=0,
                    )
        except tinker.APIStatusError as e:
            return impl._rest_status_error_to_transport_error(e)
        except tinker.APIConnectionError as e:
            return impl._TransportError(
                kind=impl._TransportErrorKind.RETRY_WITH_BACKOFF,
                status_code=0,
                detail=str(e),
                exception=e,
                event_name="connection_error",
            )

        if type(response) is _Answer:
            if "application/x-protobuf" in response.content_type():
                return impl._SuccessProto(proto_bytes=response.data)
            result_dict: Any = loads(response.data)
        else:
            if "application/x-protobuf" in response.headers.get("content-type", ""):
                return impl._SuccessProto(proto_bytes=response.http_response.content)
            result_dict = await response.json()

        # From here as tinker's.
        if result_dict.get("type") == "try_again":
            impl.logger.warning(f"Retrying request {self.request_id=} because of try_again")
            qs_str = result_dict.get("queue_state") or ""
            return impl._TryAgain(
                queue_state=impl._rest_queue_state_to_enum(qs_str),
                queue_state_reason=result_dict.get("queue_state_reason"),
            )
        if result_dict.get("status") == "complete_metadata":
            return impl._MetadataOnly(payload_size=result_dict.get("response_payload_size") or 0)
        if "error" in result_dict:
            error_category = impl.RequestErrorCategory.Unknown
            with contextlib.suppress(Exception):
                error_category = impl.RequestErrorCategory(result_dict.get("category"))
            return impl._Failed(error_message=result_dict["error"], error_category=error_category)
        return impl._SuccessJson(result_dict=result_dict)

    _switches.append(state)
    return _fetch_via_rest


# Whether a client class's post is tinker's own or ours (by function).
_own_posts: dict[Any, bool] = {}


def _tinkers_retrieve(client: Any, retrieve: Any) -> bool:
    """Whether tinker's raw retrieve on ``client`` would reach tinker's
    resource method and tinker's (or our) post: else a user's or a fork's
    code stands between (on the class, the client or its futures resource),
    and tinker's call runs it."""
    futures = client.futures
    bound = futures._post  # the client's post when the resource was made
    return (
        _own_post(type(client).post)
        and "post" not in vars(client)
        and type(futures).retrieve is retrieve
        and "retrieve" not in vars(futures)
        and getattr(bound, "__self__", None) is client
        and _own_post(getattr(bound, "__func__", None))
    )


def _own_post(function: Any) -> bool:
    """Whether ``function`` is tinker's ``AsyncAPIClient.post`` or ours
    around it; known by its code, not its names (``functools.wraps`` copies
    those)."""
    try:
        return _own_posts[function]
    except KeyError:
        pass
    except TypeError:  # not hashable: not a function of ours or tinker's
        return False
    inner = function.__wrapped__ if function in _made_posts else function
    code = getattr(inner, "__code__", None)
    own = _own_posts[function] = (
        code is not None
        and code.co_qualname == "AsyncAPIClient.post"
        and os.path.normcase(code.co_filename).endswith(os.path.normcase(os.path.join("tinker", "_base_client.py")))
    )
    return own


def undo_post() -> None:
    """At uninstall: a resource that bound ours while installed (tinker's
    resources keep ``client.post`` from when they were made) calls
    tinker's again."""
    while _switches:
        _switches.pop()["active"] = False


# Each made post's switch, until uninstall.
_switches: list[dict[str, bool]] = []


# --------------------------------------------------------------------------
# The probe


class _Recorder:
    """A pyqwest transport that records each request and answers from a
    script instead of sending: an answer is (status, headers, body) or an
    exception to raise."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.requests: list[tuple[str, str, list[tuple[str, str]], bytes]] = []

    async def execute(self, request: Any) -> Any:
        import pyqwest

        content = request.content
        if content is None:
            content = b""
        elif not isinstance(content, (bytes, bytearray, memoryview)):
            content = b"".join([bytes(c) async for c in content])
        content = bytes(content)
        self.requests.append((request.method, request.url, list(request.headers.items()), content))
        answer = self.script.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        status, headers, body = answer
        return pyqwest.Response(status=status, headers=pyqwest.Headers(headers), content=body)


def probe_post(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    """Raises ProbeFailed unless tinker's ``post`` and ours, each on a client
    whose transport records instead of sending, send the same requests and
    give their callers the same answers and exceptions for the calls a step
    makes (a sample, a raw future poll, forward_backward and optim_step, a
    retried 500, a 400, a connection error, a timeout, a body that does not
    decode)."""
    _run_apart(_probe(original, ours))


def _run_apart(probe: Any) -> None:
    """Runs a probe's coroutine on its own event loop, in a thread of its
    own (whatever loop the caller runs); tinker's request building warns
    (pydantic's `construct` deprecation) at each request: not the probe's to
    show, nor (under ``python -X dev``) its loop's slow-callback lines."""
    from concurrent.futures import ThreadPoolExecutor

    with warnings.catch_warnings(), ThreadPoolExecutor(1) as pool:
        warnings.simplefilter("ignore", DeprecationWarning)
        pool.submit(asyncio.run, probe, debug=False).result()


def _recording_client(platform: Any) -> Any:
    """An ``AsyncTinker`` whose pyqwest transport records instead of
    sending (:func:`_replay` gives it each case's answers)."""
    from pyqwest.httpx import AsyncPyqwestTransport
    from tinker._client import AsyncTinker

    client = AsyncTinker(api_key="tml-probe-key", base_url="http://probe.invalid:8000")
    client._platform = platform
    client._client._transport = AsyncPyqwestTransport(_Recorder([]))  # type: ignore[arg-type]
    return client


def _replay(client: Any, script: list[Any]) -> _Recorder:
    """``client``'s transport answers ``script`` from here, and records."""
    recorder = _Recorder(script)
    client._client._transport._transport = recorder
    client._client.cookies.clear()  # a case's cookie is not the next one's
    return recorder


def _probe_cases() -> list[tuple[str, Callable[[Any], Any], list[Any]]]:
    """(name, call on a client, the transport's answers)."""
    import pyqwest
    from tinker import types
    from tinker.types.future_retrieve_request import FutureRetrieveRequest

    request = types.SampleRequest(
        sampling_session_id="probe-session",
        seq_id=7,
        num_samples=1,
        prompt=types.ModelInput.from_ints([1, 2, 3]),
        sampling_params=types.SamplingParams(max_tokens=4, stop=["\n"]),
        prompt_logprobs=False,
    )
    future = (200, [("content-type", "application/json")], b'{"request_id": "r-1", "sample_sequence_ids": ["s-3"]}')
    polled = (200, [("content-type", "application/json"), ("x-probe", "1")], b'{"type": "try_again"}')
    failed = (500, [("content-type", "application/json"), ("retry-after-ms", "1")], b'{"error": "x"}')
    empty400 = (400, [("content-length", "0")], b"")
    undecodable = (200, [("content-type", "application/json"), ("content-encoding", "deflate")], b"not deflate")
    moved = (307, [("location", "/api/v1/asample-moved")], b"")

    def asample(client: Any, retries: int = 0) -> Any:
        return client.sampling.asample(
            request=request, max_retries=retries, extra_headers={"X-Tinker-Sampling-Backpressure": "1"}
        )

    async def poll(client: Any) -> Any:
        response = await client.futures.with_raw_response.retrieve(
            request=FutureRetrieveRequest(request_id="r-1", allow_metadata_only=True),
            timeout=45,
            extra_headers={
                "X-Tinker-Request-Iteration": "0",
                "X-Tinker-Request-Type": "Sample",
                "Accept": "application/x-protobuf",
                "X-Tinker-Create-Promise-Roundtrip-Time": "0.25",
            },
            max_retries=0,
        )
        return (response.status_code, list(response.headers.multi_items()), await response.json())

    def optim_step(client: Any) -> Any:
        return client.training.optim_step(
            # adam_params: 0.36's field, 0.38's alias of optim_params
            request=types.OptimStepRequest(adam_params=types.AdamParams(learning_rate=1e-4), model_id="m", seq_id=2)  # type: ignore[call-arg]
        )

    def forward_backward(client: Any) -> Any:
        datum = types.Datum(
            model_input=types.ModelInput.from_ints([1, 2]),
            loss_fn_inputs={"target_tokens": types.TensorData(data=[2, 3], dtype="int64", shape=[2])},
        )
        return client.training.forward_backward(
            request=types.ForwardBackwardRequest(
                forward_backward_input=types.ForwardBackwardInput(data=[datum], loss_fn="cross_entropy"),
                model_id="m",
                seq_id=3,
            )
        )

    return [
        ("sample", asample, [future]),
        ("future poll", poll, [polled]),
        ("optim_step", optim_step, [future]),
        ("forward_backward", forward_backward, [future]),
        ("a retried 500", lambda c: asample(c, 2), [failed, failed, future]),
        ("a 500", asample, [failed]),
        ("an empty 400", asample, [empty400]),
        ("a connection error", asample, [ConnectionError("refused")]),
        ("a timeout", asample, [TimeoutError("timed out")]),
        ("a reset stream", asample, [pyqwest.ReadError("reset")]),
        ("a redirect its transport answered", asample, [moved, future]),  # (httpx follows it)
        ("a redirect to a bad Location", asample, [(307, [("location", "http://[::1")], b"")]),
        ("an answer that does not decode", asample, [undecodable]),  # (retried, tinker sleeps ~0.5 s: a test's)
    ]


async def _probe(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    from tinker._base_client import get_platform

    platform = get_platform()
    clients = []
    for post in (original, ours):
        client = _recording_client(platform)
        client.post = pytypes.MethodType(post, client)  # resources bind it when made
        clients.append(client)
    try:
        for name, call, script in _probe_cases():
            seen = []
            before = _sent[0]
            for client in clients:
                recorder = _replay(client, script)
                try:
                    got: Any = ("ok", _comparable(await call(client)))
                except Exception as exc:
                    got = ("raised", _comparable_error(exc))
                keys = {v for _, _, headers, _ in recorder.requests for n, v in headers if n.lower() == "x-idempotency-key"}
                seen.append((got, [_comparable_request(r) for r in recorder.requests], len(keys)))
            (theirs, their_requests, their_keys), (mine, my_requests, my_keys) = seen
            # One call's attempts share one key (tinker's retries are idempotent).
            check(my_keys == their_keys, f"{name}: ours sent {my_keys} idempotency key(s), tinker's {their_keys}")
            check(bool(their_requests), f"{name}: tinker's post sent nothing (probe out of date)")
            check(_sent[0] > before, f"{name}: ours left the call to tinker's post")
            check(
                my_requests == their_requests,
                f"{name}: our requests differ from tinker's: {my_requests} vs {their_requests}",
            )
            check(mine == theirs, f"{name}: callers get {mine} from ours, {theirs} from tinker's")
    finally:
        for client in clients:
            await client.close()


def probe_fetch(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    """Raises ProbeFailed unless tinker's ``_APIFuture._fetch_via_rest`` and
    ours, each polling through a client whose transport records instead of
    sending, send the same requests, log the same lines and return (or
    raise) the same outcome for each answer a poll gets: a protobuf result,
    a JSON result, try_again, complete_metadata, a failed request, 408,
    410, 429, 500, an empty 400, 403, a cookie set, a connection error,
    a timeout, a body that is not JSON, a body that does not decode."""
    _run_apart(_probe_fetch(original, ours))


class _Captured(logging.Filter):
    """Keeps, and drops, one thread's records of a logger."""

    def __init__(self) -> None:
        super().__init__()
        self.thread = threading.get_ident()
        self.lines: list[tuple[str, str]] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread != self.thread:
            return True
        self.lines.append((record.levelname, record.getMessage()))
        return False


def _fetch_cases() -> list[tuple[str, Any, int, bool, list[Any]]]:
    """(name, the future's result type, iteration, metadata allowed, the
    transport's answers)."""
    from tinker import types

    proto = [("content-type", "application/x-protobuf")]
    json_ = [("content-type", "application/json")]
    sample = types.SampleResponse
    return [
        ("a protobuf result", sample, 0, True, [(200, proto, b"\x0a\x00")]),
        ("a JSON result", types.OptimStepResponse, 1, False, [(200, json_, b'{"metrics": {"a": 1.5}}')]),
        ("try_again", sample, 2, True, [(200, json_, b'{"type": "try_again", "queue_state": "paused_capacity"}')]),
        ("complete_metadata", sample, 0, True, [(200, json_, b'{"status": "complete_metadata", "response_payload_size": 7}')]),
        ("a failed request", sample, 1, False, [(200, json_, b'{"error": "bad", "category": "user"}')]),
        ("a 408", sample, 3, True, [(408, json_, b'{"queue_state": "active"}')]),
        ("a 410", sample, 0, True, [(410, json_, b'{"error": "gone"}')]),
        ("a 429", sample, 0, True, [(429, json_, b"{}")]),
        ("a 500", sample, 0, True, [(500, json_, b'{"error": "x"}')]),
        ("an empty 400", sample, 0, True, [(400, [("content-length", "0")], b"")]),
        ("a 403", sample, 0, True, [(403, json_, b'{"detail": "no"}')]),
        ("a cookie set", sample, 0, True, [(200, [*json_, ("set-cookie", "a=b")], b'{"type": "try_again"}')]),
        ("a connection error", sample, 0, True, [ConnectionError("refused")]),
        ("a timeout", sample, 0, True, [TimeoutError("timed out")]),
        ("a body that is not JSON", sample, 0, True, [(200, json_, b"<html>")]),
        ("a body that does not decode", sample, 0, True, [(200, [*json_, ("content-encoding", "deflate")], b"not deflate")]),
    ]


async def _probe_fetch(original: Callable[..., Any], ours: Callable[..., Any]) -> None:
    from tinker import types
    from tinker._base_client import get_platform
    from tinker.lib import api_future_impl as impl

    platform = get_platform()
    captured = _Captured()
    impl.logger.addFilter(captured)
    clients = [_recording_client(platform) for _ in range(2)]
    try:
        for name, model_cls, iteration, allow, script in _fetch_cases():
            seen = []
            before = _sent[0]
            for fetch, client in zip((original, ours), clients):
                recorder = _replay(client, script)
                future: Any = object.__new__(impl._APIFuture)
                future.model_cls = model_cls
                future.holder = pytypes.SimpleNamespace(aclient=lambda kind, client=client: contextlib.nullcontext(client))
                future.untyped_future = types.UntypedAPIFuture(request_id="r-9")
                future.request_type = "Sample"
                future.request_queue_roundtrip_time = 0.125
                loop_state = impl._LoopState(allow_metadata_only=allow)
                del captured.lines[:]
                try:
                    got: Any = ("ok", _comparable_outcome(await fetch(future, loop_state, iteration)))
                except Exception as exc:
                    got = ("raised", _comparable_error(exc))
                seen.append((got, [_comparable_request(r) for r in recorder.requests], list(captured.lines)))
            (theirs, their_requests, their_lines), (mine, my_requests, my_lines) = seen
            check(bool(their_requests), f"{name}: tinker's poll sent nothing (probe out of date)")
            check(_sent[0] > before, f"{name}: ours left the poll to tinker's call")
            check(my_requests == their_requests, f"{name}: our requests differ from tinker's: {my_requests} vs {their_requests}")
            check(mine == theirs, f"{name}: the loop gets {mine} from ours, {theirs} from tinker's")
            check(my_lines == their_lines, f"{name}: ours logs {my_lines}, tinker's {their_lines}")
    finally:
        impl.logger.removeFilter(captured)
        for client in clients:
            await client.close()


def _comparable_outcome(outcome: Any) -> Any:
    """An outcome dataclass as a value: its class and fields, an exception
    field as what callers read of it."""
    import dataclasses

    if not dataclasses.is_dataclass(outcome):
        return outcome
    def comparable(value: Any) -> Any:
        if isinstance(value, BaseException):
            return _comparable_error(value)
        if isinstance(value, dict):  # headers: the key's random part aside
            return {k: v[:23] if k.lower() == "x-idempotency-key" else v for k, v in value.items()}
        return value

    return type(outcome), {f.name: comparable(getattr(outcome, f.name)) for f in dataclasses.fields(outcome)}


def _comparable_request(request: tuple[str, str, list[tuple[str, str]], bytes]) -> Any:
    """A request but its idempotency key's random part."""
    method, url, headers, content = request
    return method, url, [(n, v[:23] if n.lower() == "x-idempotency-key" else v) for n, v in headers], content


def _comparable(result: Any) -> Any:
    return result.model_dump() if hasattr(result, "model_dump") else result


def _comparable_error(exc: BaseException) -> Any:
    """What callers read of an exception: its class, message, status,
    body, response headers, request line, and the classes of its chains of
    causes and of contexts."""
    response = getattr(exc, "response", None)
    request = getattr(exc, "request", None)
    causes: list[type] = []
    contexts: list[type] = []
    cause, context = exc.__cause__, exc.__context__
    while cause is not None:
        causes.append(type(cause))
        cause = cause.__cause__
    while context is not None and len(contexts) < 8:
        contexts.append(type(context))
        context = context.__context__
    return (
        type(exc),
        str(exc),
        getattr(exc, "body", None),
        None
        if response is None
        else (response.status_code, list(response.headers.multi_items()), response.content, _extensions(response)),
        None
        if request is None
        else (request.method, str(request.url), [(n, v) for n, v in request.headers.multi_items() if n.lower() != "x-idempotency-key"]),
        causes,
        contexts,
    )


def _extensions(response: Any) -> Any:
    """A response's extensions as callers read them: names, and trailers."""
    get_trailers = response.extensions.get("get_trailers")
    return sorted(response.extensions), None if get_trailers is None else list(get_trailers().multi_items())


PIECES = (
    Piece(
        "tinker._base_client",
        "AsyncAPIClient.post",
        "transport",
        make_post,
        probe_post,
        spread=False,
        undo=undo_post,
        label="step requests sent lean",
    ),
    Piece(
        "tinker.lib.api_future_impl",
        "_APIFuture._fetch_via_rest",
        "transport",
        make_fetch,
        probe_fetch,
        spread=False,
        undo=undo_post,
        label="future polls sent lean",
    ),
    Piece(
        "tinker.lib.internal_client_holder",
        "InternalClientHolder.run_coroutine_threadsafe",
        "transport",
        futures.make_run_coroutine_threadsafe,
        futures.probe_run_coroutine_threadsafe,
        spread=False,
        label="request futures freed when dropped",
    ),
    *sample_path.PIECES,
)

_LEAN = PIECES[:2]  # post and the future polls: what goes over pyqwest

FEATURE = features.register(__name__, Feature("transport", "tinker's step requests sent lean", PIECES, aside=aside))
