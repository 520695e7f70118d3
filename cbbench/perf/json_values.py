"""JSON values as types: what `json.loads` gives back (`JSONValue`, `JSONObject`), for the result files, reports and
HTTP bodies perf reads, and the narrowing of a parsed value to the shape a reader expects (`as_object`, `as_list`)."""

from __future__ import annotations

JSONValue = str | int | float | bool | None | list["JSONValue"] | dict[str, "JSONValue"]
JSONObject = dict[str, JSONValue]


def as_object(v: JSONValue) -> JSONObject:
    """`v` if it is a JSON object, else an empty one (a field that is absent, null or of another shape)."""
    return v if isinstance(v, dict) else {}


def as_list(v: JSONValue) -> list[JSONValue]:
    """`v` if it is a JSON array, else an empty one."""
    return v if isinstance(v, list) else []
