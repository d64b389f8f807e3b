"""The query parameters of RabbitMQ's management listings: columns, sort,
pagination and the name filter.

As C{rabbit_mgmt_util}: C{columns=a,b.c} keeps only those (dotted) fields of
each item; C{sort=KEY} (dotted) sorts by that key then the listing's default
keys, in Erlang's term order, and C{sort_reverse=true} reverses; C{page=N}
(with C{page_size}, at most 500, 100 if not given) answers one page in
RabbitMQ's envelope (C{total_count}, C{filtered_count}, C{item_count},
C{page}, C{page_size}, C{page_count}, C{items}), filtered by C{name} (a
case-insensitive substring, or with C{use_regex=true} a regular expression).

A name regex comes from a peer, so it is held to a shape whose matching time
is bounded per name (see L{compile_name_regex}), and the whole filter to a
time budget: a pattern that would stall the broker is refused with a 400.
"""

import json
import re
import time

try:
    from re import _parser as regex_parser
except ImportError:  # Python < 3.11
    import sre_parse as regex_parser

from brokerd.http.routes import RawJson, bad_request, query_value

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 500
MAX_FILTER_LENGTH = 1024
FILTER_BUDGET_SECONDS = 0.25
DEFAULT_SORT = ("vhost", "name")
QUERY_NAMES = ("columns", "sort", "sort_reverse", "page")

_SINGLE_CHARACTER = {"LITERAL", "NOT_LITERAL", "ANY", "IN", "CATEGORY"}
_REPEATS = {"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"}


class ListingQuery:
    """The listing parameters of one request; L{shape} applies them to a handler's answer."""

    def __init__(self, request):
        self.columns = _columns(query_value(request, "columns"))
        sort = query_value(request, "sort")
        self.sort = None if sort is None else (sort or None)
        self.explicitly_unsorted = sort == ""
        self.reverse = query_value(request, "sort_reverse") == "true"
        self.page, self.page_size = _pagination(request)
        name = query_value(request, "name")
        self.name_filter = None
        if self.page is not None and name:
            self.name_filter = _name_filter(name, query_value(request, "use_regex") == "true")

    @classmethod
    def of(cls, request):
        """The request's listing query, or None when it asks for none of it (the quick path)."""
        if not request.args or not any(name.encode() in request.args for name in QUERY_NAMES):
            return None
        return cls(request)

    def shape(self, body, default_sort=DEFAULT_SORT):
        """
        The answer with these parameters applied: lists sorted, paged and cut
        to columns; objects cut.
        """
        if isinstance(body, RawJson):
            body = json.loads(body.text)
        if isinstance(body, dict):
            return _extract(body, self.columns)
        if not isinstance(body, list):
            return body
        items = body
        if not self.explicitly_unsorted and (
            self.sort is not None or self.page is not None or self.reverse
        ):
            keys = [self.sort] if self.sort is not None else []
            keys += [key for key in default_sort if key not in keys]
            items = sorted(items, key=lambda item: [_term_key(_dotted(item, key)) for key in keys])
            if self.reverse:
                items.reverse()
        items = [_extract(item, self.columns) for item in items]
        if self.page is None:
            return items
        return self._page_of(items)

    def _page_of(self, items):
        filtered = items if self.name_filter is None else self.name_filter(items)
        offset = (self.page - 1) * self.page_size
        if offset > len(filtered):
            raise bad_request(f"Page out of range, page: {self.page} page size: {self.page_size},"
                              f" len: {len(filtered)}", error="page_out_of_range")
        page = filtered[offset:offset + self.page_size]
        return {"total_count": len(items), "item_count": len(page), "filtered_count": len(filtered),
                "page": self.page, "page_size": self.page_size,
                "page_count": (len(filtered) + self.page_size - 1) // self.page_size, "items": page}


def _columns(text):
    if text is None:
        return None
    return [column.split(".") for column in text.split(",") if column]


def _pagination(request):
    page, size = query_value(request, "page"), query_value(request, "page_size")
    if page is None:
        return None, None
    try:
        number = int(page)
        size_number = DEFAULT_PAGE_SIZE if size is None else int(size)
    except ValueError:
        number = size_number = None
    if number is None or number < 1 or not 0 < size_number <= MAX_PAGE_SIZE:
        shown_size = "undefined" if size is None else size  # Erlang's word for a missing parameter
        raise bad_request(
            f"Invalid pagination parameters: page number {page}, page size {shown_size}",
            error="invalid_pagination_parameters",
        )
    return number, size_number


def _extract(item, columns):
    """C{item} with only the (dotted) C{columns}, as RabbitMQ's C{extract_column_items}."""
    if columns is None or not isinstance(item, dict):
        return item
    kept = {}
    for key, value in item.items():
        deeper = [column[1:] for column in columns if column[0] == key]
        if not deeper:
            continue
        kept[key] = value if any(not rest for rest in deeper) else _extract(value, deeper)
    return kept


def _dotted(item, key):
    """
    The value at dotted C{key} in C{item}; 0 where there is none (sorts first,
    as in RabbitMQ).
    """
    value = item
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return 0
        value = value[part]
    return value


def _term_key(value):
    """
    A sort key following Erlang's term order: numbers, atoms (booleans, null),
    maps, lists, binaries.
    """
    if isinstance(value, bool) or value is None:
        return (1, 0, {False: "false", None: "null", True: "true"}[value])
    if isinstance(value, (int, float)):
        return (0, value, "")
    if isinstance(value, dict):
        return (2, 0, json.dumps(value, sort_keys=True, default=str))
    if isinstance(value, list):
        return (3, 0, json.dumps(value, default=str))
    return (4, 0, str(value).encode("utf-8", "surrogatepass"))


def _name_filter(text, use_regex):
    """A function keeping the items whose C{name} matches C{text} (case-insensitively)."""
    if not use_regex:
        wanted = text.lower()
        return lambda items: [item for item in items if wanted in str(item.get("name", "")).lower()]
    if len(text) > MAX_FILTER_LENGTH:
        raise bad_request("name filter regex is too long", error="invalid_pagination_parameters")
    search = compile_name_regex(text).search

    def keep(items):
        deadline = time.monotonic() + FILTER_BUDGET_SECONDS
        kept = []
        for number, item in enumerate(items):
            if number % 256 == 255 and time.monotonic() > deadline:
                raise bad_request(
                    "name filter regex took too long", error="invalid_pagination_parameters"
                )
            if search(str(item.get("name", ""))):
                kept.append(item)
        return kept
    return keep


def compile_name_regex(text):
    """
    C{text} compiled case-insensitively, if its matching time is bounded:
    repeats only of single characters, none nested, no back-references, and
    at most two open-ended repeats counting an unanchored start as one (a
    255-character name then costs at most some 65,000 steps). Else 400.
    """
    try:
        parsed = regex_parser.parse(text, re.IGNORECASE)
        compiled = re.compile(text, re.IGNORECASE)
    except (re.error, RecursionError, OverflowError) as problem:
        raise bad_request(f"name filter regex is not valid: {problem}",
                          error="invalid_pagination_parameters") from None
    items = list(parsed)
    anchored = bool(items) and str(items[0][0]) == "AT" and str(items[0][1]) == "AT_BEGINNING"
    if _repeat_cost(items) + (0 if anchored else 1) > 2:
        raise bad_request(
            "name filter regex is too complex: use at most two repeats of single characters,"
            " not nested, and no back-references",
            error="invalid_pagination_parameters",
        )
    return compiled


def _repeat_cost(items, inside_repeat=False):
    """
    How many open-ended repeats C{items} holds; a large number for a shape that
    can backtrack without bound.
    """
    cost = 0
    for op, argument in items:
        name = str(op)
        if name in _REPEATS:
            low, high, body = argument
            body = list(body)
            if inside_repeat or not (len(body) == 1 and str(body[0][0]) in _SINGLE_CHARACTER):
                return 100
            if high != low:
                cost += 1
        elif name == "SUBPATTERN":
            cost += _repeat_cost(list(argument[-1]), inside_repeat)
        elif name == "BRANCH":
            cost += max(
                (_repeat_cost(list(branch), inside_repeat) for branch in argument[1]), default=0
            )
        elif name in (
            "GROUPREF", "GROUPREF_EXISTS", "GROUPREF_IGNORE", "ASSERT", "ASSERT_NOT", "ATOMIC_GROUP"
        ):
            return 100
    return cost
