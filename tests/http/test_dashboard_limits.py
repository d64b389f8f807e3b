"""The dashboard's Admin > Limits page in a real headless Chromium against a real broker.

An administrator sets a vhost's max-connections and max-queues and a user's max-connections and max-channels through
the page's forms, sees them listed, sees pika refused by them with RabbitMQ's codes and texts, and clears them through
the page. A management user sees the limits of the vhosts it may use and every user's limits, as RabbitMQ 3.10's
API shows them to it, without the forms and Delete buttons (RabbitMQ's UI shows those to administrators only); the
API refuses it a change with 401 "Not administrator user".
"""

import contextlib

import pika.exceptions
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select

from tests.support.dashboard import (  # noqa: F401 (browser, page: fixtures)
    NEEDS_BROWSER,
    browser,
    click_in_table,
    css_string,
    fill,
    logged_in,
    open_admin,
    page,
    text_of,
    wait_for_text,
    wait_until,
)
from tests.support.httpapi import amqp, api, broker  # noqa: F401 (api, broker: the module's fixtures)

pytestmark = NEEDS_BROWSER

EVERY_PERMISSION = {"configure": ".*", "write": ".*", "read": ".*"}
NOT_ADMINISTRATOR = {"error": "not_authorised", "reason": "Not administrator user"}  # RabbitMQ 3.10's answer


@pytest.fixture(scope="module")
def tenant(api):
    """Vhost dash-metered and user dash-worker, who may use it and /."""
    assert api.put("/api/vhosts/dash-metered", {}) == (201, None)
    assert api.put("/api/users/dash-worker", {"password": "pw", "tags": ""}) == (201, None)
    for vhost in ("dash-metered", "%2F"):
        assert api.put(f"/api/permissions/{vhost}/dash-worker", EVERY_PERMISSION) == (201, None)
    return "dash-metered"


def limit_cell(kind, owner, limit, column):
    row = f'#{kind}-limits-table tr[data-owner="{css_string(owner)}"][data-limit="{css_string(limit)}"]'
    return f'{row} td[data-column="{column}"]'


def listed(page, kind):
    """The limits the page's C{kind} table lists, as [(owner, limit, value shown)]."""
    return [tuple(row) for row in page.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0] + ' tbody tr'),"
        " row => [row.dataset.owner, row.dataset.limit, row.querySelector('[data-column=value]').innerText])",
        f"#{kind}-limits-table")]


def set_limit(page, kind, owner, limit, value):
    """Set a limit through the page's form and wait for its result line."""
    wait_until(page, lambda driver: driver.find_elements(
        By.CSS_SELECTOR, f'#{kind}-limit-owner option[value="{css_string(owner)}"]'))
    Select(page.find_element(By.ID, f"{kind}-limit-owner")).select_by_value(owner)
    Select(page.find_element(By.ID, f"{kind}-limit-name")).select_by_value(limit)
    fill(page, f"{kind}-limit-value", str(value))
    page.find_element(By.CSS_SELECTOR, f"#{kind}-limit-form button[type=submit]").click()
    wait_for_text(page, f"#{kind}-limit-result", f"{limit} of {owner} set.")
    wait_for_text(page, limit_cell(kind, owner, limit, "value"), f"{value:,}")


def clear_limit(page, kind, owner, limit):
    """Clear a limit with its row's Delete button, confirmed, and wait until it is no longer listed."""
    click_in_table(page, limit_cell(kind, owner, limit, "actions") + " button")
    wait_until(page, expected_conditions.visibility_of_element_located((By.ID, "limits-confirm")))
    assert text_of(page, "#limits-confirm span") == f"Clear {limit} of {owner}?"
    page.find_element(By.CSS_SELECTOR, "#limits-confirm .confirm-yes").click()
    wait_for_text(page, "#limits-result", f"{limit} of {owner} cleared.")
    wait_until(page, lambda driver: not driver.find_elements(By.CSS_SELECTOR, limit_cell(kind, owner, limit, "name")))


def refused(broker, vhost, user="dash-worker", password="pw"):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refusal:
        amqp(broker, user, password, vhost)
    return str(refusal.value)


def test_vhost_limits_set_on_the_page_hold_and_are_cleared_on_the_page(page, api, broker, tenant):
    logged_in(page)
    open_admin(page, "limits")
    wait_for_text(page, "#vhost-limits-table + .table-note", "No limits.")
    set_limit(page, "vhost", tenant, "max-connections", 1)
    set_limit(page, "vhost", tenant, "max-queues", 1000)
    set_limit(page, "vhost", tenant, "max-queues", 1)  # the same limit again: replaced
    assert listed(page, "vhost") == [(tenant, "max-connections", "1"), (tenant, "max-queues", "1")]
    assert api.get("/api/vhost-limits") == [{"vhost": tenant, "value": {"max-connections": 1, "max-queues": 1}}]

    with contextlib.closing(amqp(broker, "dash-worker", "pw", tenant)) as connection:
        assert refused(broker, tenant) == (
            "ConnectionClosedByBroker: (530) \"NOT_ALLOWED - access to vhost 'dash-metered' refused for user"
            " 'dash-worker': connection limit (1) is reached\"")
        channel = connection.channel()
        channel.queue_declare("dash-q1")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.queue_declare("dash-q2")
        assert (closed.value.reply_code, closed.value.reply_text) == (
            406, "PRECONDITION_FAILED - cannot declare queue 'dash-q2': queue limit in vhost 'dash-metered' (1)"
                 " is reached")

        clear_limit(page, "vhost", tenant, "max-connections")
        clear_limit(page, "vhost", tenant, "max-queues")
        assert api.get("/api/vhost-limits") == []
        with contextlib.closing(amqp(broker, "dash-worker", "pw", tenant)) as second:  # lifted at once
            second.channel().queue_declare("dash-q2", auto_delete=True)
        connection.channel().queue_delete("dash-q1")
    wait_for_text(page, "#vhost-limits-table + .table-note", "No limits.")


def test_user_limits_set_on_the_page_hold_and_are_cleared_on_the_page(page, api, broker, tenant):
    logged_in(page)
    open_admin(page, "limits")
    set_limit(page, "user", "dash-worker", "max-connections", 1)
    set_limit(page, "user", "dash-worker", "max-channels", 2)
    assert listed(page, "user") == [("dash-worker", "max-channels", "2"), ("dash-worker", "max-connections", "1")]
    listing = api.get("/api/user-limits/dash-worker")
    assert listing == [{"user": "dash-worker", "value": {"max-connections": 1, "max-channels": 2}}]
    assert list(listing[0]["value"]) == ["max-channels", "max-connections"]  # by name, as RabbitMQ lists them

    connection = amqp(broker, "dash-worker", "pw", tenant)
    assert refused(broker, "/") == (  # whichever vhost
        "ConnectionClosedByBroker: (530) \"NOT_ALLOWED - connection refused for user 'dash-worker':"
        " user connection limit (1) is reached\"")
    connection.channel()
    connection.channel()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        connection.channel()
    assert (closed.value.reply_code, closed.value.reply_text) == (
        530, "NOT_ALLOWED - number of channels opened for user 'dash-worker' has reached the maximum allowed"
             " user limit of (2)")
    assert connection.is_closed

    clear_limit(page, "user", "dash-worker", "max-connections")
    clear_limit(page, "user", "dash-worker", "max-channels")
    assert api.get("/api/user-limits/dash-worker") == []
    with contextlib.closing(amqp(broker, "dash-worker", "pw", tenant)) as first, \
            contextlib.closing(amqp(broker, "dash-worker", "pw", "/")) as second:
        for connection in (first, second, first):
            connection.channel()


def test_a_management_user_sees_the_limits_it_may_see_and_may_not_change_them(page, api, tenant):
    """RabbitMQ 3.10.8 answers a management user's GET /api/vhost-limits with the vhosts it has permissions on,
    GET /api/user-limits with every user's, and any PUT or DELETE of a limit with 401 "Not administrator user"."""
    assert api.put("/api/users/dash-viewer", {"password": "viewer", "tags": "management"}) == (201, None)
    assert api.put("/api/permissions/dash-metered/dash-viewer", EVERY_PERMISSION) == (201, None)
    assert api.put("/api/vhosts/dash-hidden", {}) == (201, None)
    limits = {"/api/vhost-limits/dash-metered/max-queues": 10, "/api/vhost-limits/dash-hidden/max-queues": 20,
              "/api/user-limits/dash-worker/max-channels": 30}
    for path, value in limits.items():
        assert api.put(path, {"value": value}) == (204, None)
    viewer = api.as_user("dash-viewer", "viewer")
    try:
        assert viewer.get("/api/vhost-limits") == [{"vhost": "dash-metered", "value": {"max-queues": 10}}]
        assert viewer.get("/api/vhost-limits/dash-metered") == [{"vhost": "dash-metered", "value": {"max-queues": 10}}]
        assert viewer.request("GET", "/api/vhost-limits/dash-hidden")[:2] == (
            401, {"error": "not_authorised", "reason": "User not authorised to access virtual host"})
        assert viewer.get("/api/user-limits") == [{"user": "dash-worker", "value": {"max-channels": 30}}]
        assert viewer.get("/api/user-limits/dash-worker") == [{"user": "dash-worker", "value": {"max-channels": 30}}]
        assert viewer.request("GET", "/api/user-limits/nobody")[0] == 404
        for path in limits:
            assert viewer.request("PUT", path, {"value": 1})[:2] == (401, NOT_ADMINISTRATOR)
            assert viewer.request("DELETE", path)[:2] == (401, NOT_ADMINISTRATOR)
        assert api.as_user("dash-worker", "pw").request("GET", "/api/user-limits")[:2] == (
            401, {"error": "not_authorised", "reason": "Not management user"})

        logged_in(page, "dash-viewer", "viewer")
        open_admin(page, "limits")
        wait_for_text(page, limit_cell("user", "dash-worker", "max-channels", "value"), "30")
        assert listed(page, "vhost") == [("dash-metered", "max-queues", "10")]
        assert listed(page, "user") == [("dash-worker", "max-channels", "30")]
        shown = page.find_element(By.ID, "view-limits").find_elements(By.CSS_SELECTOR, "form, td button")
        assert not [element.get_attribute("id") or element.text for element in shown if element.is_displayed()]
        assert not page.find_element(By.CSS_SELECTOR, "#view-limits .refused").is_displayed()
    finally:
        for path in limits:
            assert api.delete(path) == (204, None)
