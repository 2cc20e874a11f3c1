"""Schemathesis hooks for scripts/api-fuzz.sh.

`schema_valid_requests_are_accepted` is schemathesis's positive-data check
made exact for Reeve: a request the document calls valid must not be
refused for its shape (400, 413, 415 or 422). A few refusals depend on the
Space's state, which no schema can express, and are the documented answer
to a well-formed request: an upload id that names no upload of this Space,
or one whose file has not arrived. A priced task's `402` is not a refusal
either: it is the price. And a NUL character in a string is refused
(`invalid_input` / `invalid_query`, as the document's `400` says), since
Postgres cannot store it; JSON Schema has no word for that short of a
pattern on every string of every kind's input, so the check lets exactly
that refusal pass when the request holds a NUL, and no other. Likewise a
bulk cancel's time range whose `created_after` is not before its
`created_before`: an order between two fields, which JSON Schema cannot
state, refused as `invalid_request` naming both; and a bulk cancel that
names none of its filters (at least one of five fields, which utoipa does
not put in the document), refused as `invalid_request`. And a `webhook` given as
a bare string: the document gives its `{url, events}` form a pattern, but
utoipa puts none on the one-string form, so a string that is no http(s) URL
is refused there (`invalid_webhook`) as the document says in words.
"""

import schemathesis

# Pinned with schemathesis in scripts/requirements.txt: it tells the
# coverage phase's deliberately wrong probes (a method the route lacks) apart.
from schemathesis.specs.openapi.checks import is_unexpected_http_status_case

# Refusals that depend on what the server holds, not on the request's shape:
# the Space's uploads, and a payment (a PAYMENT-SIGNATURE is a signed
# authorization; no schema can say whether its signature and funds are good).
STATE_CODES = {
    "unknown_upload",
    "upload_not_ready",
    "upload_rejected",
    "invalid_payment",
    "payment_mismatch",
    "payment_invalid",
    "payment_failed",
    "payment_replayed",
    "facilitator_unavailable",
}
SHAPE_STATUSES = {400, 413, 415, 422}
NUL_CODES = {"invalid_input", "invalid_query"}


def holds_nul(value):
    """Whether a NUL is in any string (or key) of a decoded body or query."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(holds_nul(k) or holds_nul(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(holds_nul(v) for v in value)
    return False


@schemathesis.check
def schema_valid_requests_are_accepted(ctx, response, case):
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive:
        return None
    if is_unexpected_http_status_case(case):
        return None
    if response.status_code not in SHAPE_STATUSES:
        return None
    try:
        error = response.json().get("error", {})
    except Exception:  # noqa: BLE001 - any non-JSON refusal is a failure below
        error = {}
    if error.get("code") in STATE_CODES:
        return None
    nul = holds_nul(case.body) or holds_nul(case.query) or holds_nul(case.path_parameters)
    if nul and error.get("code") in NUL_CODES and "NUL" in str(error.get("message")):
        return None
    body = case.body if isinstance(case.body, dict) else {}
    after, before = body.get("created_after"), body.get("created_before")
    if (
        error.get("code") == "invalid_request"
        and "created_after must be earlier than created_before" in str(error.get("message"))
        and isinstance(after, str)
        and isinstance(before, str)
    ):
        return None
    filters = ("ids", "kind", "status", "created_after", "created_before")
    if (
        error.get("code") == "invalid_request"
        and str(error.get("message")).startswith("name at least one of ids")
        and not any(body.get(f) not in (None, [], "") for f in filters)
    ):
        return None
    if error.get("code") == "invalid_webhook" and isinstance(body.get("webhook"), str):
        return None
    raise AssertionError(
        f"a request the document calls valid was refused: {response.status_code} "
        f"{error.get('code')}: {error.get('message')}"
    )
