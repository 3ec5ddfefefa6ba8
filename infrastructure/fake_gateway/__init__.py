"""A fake of the SaaS workspace gateway: a real HTTP server on loopback.

It speaks the calls of the gateway contract (docs/gateway.md) so that the
demo, the tests, the benchmarks and the reliability suite all exercise the real
HTTP adapter, and it adds admin endpoints under ``/_fake/`` to read, reset and
reconfigure it. Standard library only (`http.server` parses the requests).

Modules: `config` (the knobs), `replies` (requests and replies as values),
`metering` (rate limit, outages, drawn faults), `state` (what the fake knows and
answers), `routes` (gateway and admin routes, latency and faults), `server` (HTTP
and `FakeGateway`), `cli` (the `provisioner fake-gateway` command).

Gateway calls (need ``Authorization: Bearer <non-empty>``, else 401)::

    POST   /v2/workspaces/{parent}/child          {"title": T, "resources": {...}}
    GET    /v1/workspaces/{id}/status             {"status": S}
    GET    /v1/workspaces/{parent}/family         [{"id","title","status"}, ...] parent first
    GET    /v1/workspaces/{id}/projects?type=ai   {"items": [{"id": P}, ...]}
    DELETE /v1/workspaces/{id}/projects/{pid}     204, 404 when gone

Admin calls (JSON in and out, no auth, no faults, no rate limit, not counted)::

    GET  /_fake/state                     id_prefix, workspaces, creates per title, calls per
                                          operation, calls_total, faults played by kind,
                                          throttled, outage, outage_calls
    POST /_fake/reset                     forget everything but the configured parents;
                                          zero the counts, refill the bucket, end an outage
    POST /_fake/config                    set knobs (a subset), answer the whole config
    POST /_fake/workspaces                seed {"title","parent","status","projects": n}
    POST /_fake/workspaces/{id}/projects  add a project, answer {"id": P}
    POST /_fake/workspaces/{id}/refuse-deletes
                                          {"status": 409, "message": M}: answer every
                                          project delete in it so, deleting nothing (a 4xx
                                          but 404 and 429; 0 deletes again); answer the
                                          workspace
    POST /_fake/scripts                   {"title": "fate"}: fix what creates of that
                                          title do (zombie, creation_failed, failed,
                                          error, invalid subscription,
                                          timeout_after_create, timeout_without_create,
                                          unavailable_without_create (a 503), slow:N
                                          polls; "" clears); for demos and tests
    POST /_fake/outage                    {"seconds": N, "mode": "503" | "refuse"}: an
                                          outage of N s (0 ends one now); answers it

Behaviour worth knowing:

* A created child answers ``not ready`` until it settles: after ``settle_polls``
  status polls answered ``not ready`` AND ``settle_s`` seconds since creation.
  It then becomes ``created`` (or ``creation_failed`` if it was drawn terminal
  at creation time); a zombie stays ``not ready`` forever. The family listing
  and the admin state show what a poll would answer now, without counting as one.
* Seeded workspaces (admin, ``same_title_others``) and the parents keep the
  status they were given. ``status_case`` re-cases the status strings of gateway
  answers only; the admin state always shows them as stored.
* A create "timeout" either closes the connection unanswered (``hang_s`` = 0)
  or holds the request ``hang_s`` seconds (past the client's read timeout), then
  sends the real answer (timeout after create) or closes unanswered (timeout
  without create). Every create received is counted in ``creates``, including
  those that time out or are refused (401, 429, 503).
* ``rate_limit`` (calls/s, 0 = off) and ``burst`` (default 1): a token bucket
  over every gateway call, checked first (after an outage): a call beyond it is
  answered 429 with ``Retry-After`` (whole seconds, at least 1), does nothing
  and is counted in ``throttled``. Setting either knob, or a reset, refills it.
  With ``rate_window`` = S > 0 the limit is a quota instead: ``rate_limit`` x S
  calls in each S-second window, a call past it told to wait until the window
  ends, as a gateway that allows "600 requests a minute" counts.
* An outage answers every gateway call 503 (with ``Retry-After``) and does
  nothing (mode "503"), or closes the listening socket so that connections are
  refused, then binds the same port again when it ends (mode "refuse"; the admin
  calls are unreachable too, so it ends by itself, and its ``calls`` stay 0).
  ``outage`` in the state is the current or last one (``ends_in_s`` 0 once over).
* ``same_title_others`` = n: on a create of title T under a parent that has no
  child titled T yet, n ready children titled T with one project each are
  seeded first. They stand for same-title workspaces of OTHER brands.
* Random draws come from one ``random.Random(seed)`` under the state lock, and
  only for knobs whose rate is strictly between 0 and 1, so a fake started with
  the same seed and fed the same calls in the same order behaves the same.
  Ids are never reused within one fake's lifetime, even across resets, nor
  across restarts: each instance puts a random prefix of its own in them
  (``ws-1a2b3c4d-...``) unless given one (``id_prefix=""``, as
  ``provisioner fake-gateway --seed N`` does: ids from the seed alone).
* ``POST /_fake/reset`` keeps the configuration and the parents given at start
  (with their projects untouched, their deletes no longer refused); workspaces
  seeded with ``parent`` null are dropped like any other.
* A workspace whose deletes are refused answers every ``DELETE .../projects/{pid}``
  with that status and ``{"error": M}`` (known project or not) and deletes nothing;
  each counts in ``calls`` and in ``faults["delete_refused"]``. The state shows it
  on the workspace as ``refuse_deletes`` (``{"status", "message"}`` or null).
"""
