"""brokerd-admin's table printer, the one every listing goes through: a header, aligned columns,
no trailing spaces, dotted names into nested objects, and how each kind of value shows."""

from brokerd.admin.tables import cell, field, table


def test_columns_are_aligned_under_their_header_without_trailing_spaces():
    rows = [{"name": "guest", "tags": ["administrator"]}, {"name": "a-much-longer-name", "tags": []}]
    assert table(["name", "tags"], rows) == (
        "name                tags\n"
        "guest               administrator\n"
        "a-much-longer-name\n")


def test_a_table_without_rows_is_its_header():
    assert table(["user", "vhost"], []) == "user  vhost\n"


def test_a_dotted_column_reaches_into_a_nested_object_and_a_missing_one_is_empty():
    row = {"queue": {"name": "jobs", "vhost": "/"}, "consumer_tag": "ctag"}
    assert field(row, "queue.name") == "jobs"
    assert field(row, "channel_details.name") is None
    assert field(row, "consumer_tag.name") is None
    assert table(["queue.name", "channel_details.name", "consumer_tag"], [row]) == (
        "queue.name  channel_details.name  consumer_tag\n"
        "jobs                              ctag\n")


def test_none_is_empty_booleans_are_lowercase_lists_comma_separated_and_objects_sorted_json():
    assert [cell(value) for value in (None, True, False, 0, 3.5, ["a", "b"], {"b": 1, "a": [2]}, "text")] == [
        "", "true", "false", "0", "3.5", "a,b", '{"a": [2], "b": 1}', "text"]
