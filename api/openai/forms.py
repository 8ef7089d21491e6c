"""A multipart form, as the ``openai`` SDK sends it, back into the nested object a JSON body holds.

Measured with openai 3.51.0: every ``videos.create`` is ``multipart/form-data``; ``extra_body``
values arrive as strings, nested objects and lists flattened to bracketed keys
(``video_params[fps]=16``, ``image_reference[][image_url]=...``). The SDK groups repeated keys,
so the parts of one list element are not adjacent, and a list element's keys carry no index:
the n-th ``image_reference[][image_url]`` and the n-th ``image_reference[][audio_url]`` are
taken to belong to element n. That holds only when every element gives the same keys: with
``[{image_url: A, audio_url: a}, {image_url: B}]`` the one ``audio_url`` could be either
element's, so a bracket-less list whose keys are given different numbers of times (or one that
holds another bracket-less list given more than once) is refused, naming the field, rather than
guessed. Explicit indexes (``image_reference[0][image_url]``) say which element a part belongs
to, and work whatever the elements give. Values stay strings: the request model's lax parsing
gives them the same meaning as the JSON body's numbers.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from typing import Any

_KEY = re.compile(r"^([^\[\]]+)((?:\[[^\[\]]*\])*)$")
_SEGMENT = re.compile(r"\[([^\[\]]*)\]")
MAX_DEPTH = 16  # bracketed levels of one key: far deeper than any request field


class FormError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def unflatten(items: Iterable[tuple[str, Any]], max_index: int = 1000) -> dict[str, Any]:
    """Bracketed form keys -> nested dicts and lists. A plain key given twice becomes a list."""
    out: dict[str, Any] = {}
    seen: Counter[str] = Counter()
    lists: dict[str, list[str]] = {}  # "image_reference[]" -> the keys of its elements' parts
    for key, value in items:
        match = _KEY.match(key)
        if match is None:
            raise FormError(key, "malformed form field name")
        name, rest = match.group(1), _SEGMENT.findall(match.group(2))
        if len(rest) > MAX_DEPTH:  # no request field nests this deep; recursion would
            raise FormError(name, f"{key[:80]} nests deeper than {MAX_DEPTH} levels")
        occurrence = seen[key]
        seen[key] += 1
        if occurrence == 0 and "" in rest[:-1]:  # a list of objects (or lists) without indexes
            cut = rest.index("")
            lists.setdefault(name + "".join(f"[{s}]" for s in rest[: cut + 1]), []).append(key)
        if not rest:
            if name in out:
                previous = out[name]
                out[name] = [*previous, value] if isinstance(previous, list) else [previous, value]
            else:
                out[name] = value
            continue
        _put(out, name, rest, value, occurrence, key, max_index)
    for prefix, keys in lists.items():
        _paired_by_position(prefix, keys, seen)
    return out


def _paired_by_position(prefix: str, keys: list[str], seen: Counter[str]) -> None:
    """Refuse a bracket-less list (``prefix`` ``image_reference[]``, ``keys`` its elements' parts)
    whose parts cannot be told apart by position: its keys given different numbers of times, or a
    bracket-less list inside it given more than once."""
    field = prefix[:-2]

    def refuse(key: str, why: str) -> FormError:
        indexed = f"{field}[0]{key[len(prefix) :]}"  # image_reference[0][audio_url]
        return FormError(
            field,
            f"{why}, so which element each part belongs to is lost: send a JSON body, or index "
            f"the elements in the form ({indexed})",
        )

    nested = next((k for k in keys if "[]" in k[len(prefix) :] and seen[k] > 1), None)
    if nested is not None:
        raise refuse(nested, f"{nested} is given {seen[nested]} times in a list without indexes")
    if len({seen[k] for k in keys}) > 1:
        counts = ", ".join(f"{k} {seen[k]} times" for k in keys)
        fewest = min(keys, key=lambda k: seen[k])
        raise refuse(fewest, f"the elements of a list without indexes give different fields ({counts})")


def _put(
    container: dict[str, Any] | list[Any],
    name: str | int,
    rest: list[str],
    value: Any,
    occurrence: int,
    key: str,
    max_index: int,
) -> None:
    head, tail = rest[0], rest[1:]
    slot = _get(container, name)
    if head == "" or head.isdigit():
        if slot is None:
            slot = []
            _set(container, name, slot)
        if not isinstance(slot, list):
            raise FormError(key, "mixes a list and a single value")
        if head == "" and not tail:
            slot.append(value)
            return
        index = occurrence if head == "" else int(head)
        if index > max_index:
            raise FormError(key, f"list index above {max_index}")
        while len(slot) <= index:
            slot.append(None)
        if not tail:
            slot[index] = value
            return
        _put(slot, index, tail, value, occurrence, key, max_index)
        return
    if slot is None:
        slot = {}
        _set(container, name, slot)
    if not isinstance(slot, dict):
        raise FormError(key, "mixes an object and a single value")
    if not tail:
        slot[head] = value
        return
    _put(slot, head, tail, value, occurrence, key, max_index)


def _get(container: dict[str, Any] | list[Any], name: str | int) -> Any:
    if isinstance(container, list):
        return container[name]  # type: ignore[index]
    return container.get(name)  # type: ignore[arg-type]


def _set(container: dict[str, Any] | list[Any], name: str | int, value: Any) -> None:
    container[name] = value  # type: ignore[index]
