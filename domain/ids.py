"""Deterministic aggregate ids: registering twice is idempotent by construction."""

from __future__ import annotations

import re
from uuid import UUID, uuid5

# What a gateway workspace id may look like (docs/gateway.md): anything else an
# answer or a message carries is refused before it is stored or acted on.
GATEWAY_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")


def is_gateway_id(value: object) -> bool:
    return isinstance(value, str) and GATEWAY_ID.fullmatch(value) is not None


# A fixed namespace for this project's name-based ids. Never change it: every
# stored Brand and WorkspaceClaim id is derived from it.
NAMESPACE = UUID("6f1c7d2e-3b7a-5f43-9a0e-2c41d8e7b915")


def brand_aggregate_id(brand_id: str) -> UUID:
    return uuid5(NAMESPACE, f"brand:{brand_id}")


def claim_aggregate_id(workspace_id: str) -> UUID:
    return uuid5(NAMESPACE, f"workspace-claim:{workspace_id}")


def slot_aggregate_id(parent_workspace_id: str, title: str) -> UUID:
    # A newline cannot occur in either part (requests refuse control characters).
    return uuid5(NAMESPACE, f"title-slot:{parent_workspace_id}\n{title}")
