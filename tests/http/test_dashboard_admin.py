"""The dashboard's Admin pages and the queues' Features column, in a real headless Chromium against a real broker.

Users are added with tags through the form, given permissions and deleted; vhosts and policies are added and
deleted; a user named as markup is shown as text; a management user is refused the users page with RabbitMQ's
words (the API answers it 401 "Not administrator user", as RabbitMQ 3.10 does) and stays logged in. The Features
column marks a queue's flags, arguments and policy as RabbitMQ's management UI does (D, TTL, Lim, DLX, DLK, Pri,
Args, the policy's name), each titled with what it stands for.
"""

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
    row_selector,
    text_of,
    wait_for_text,
    wait_until,
)
from tests.support.httpapi import api, broker, segment  # noqa: F401 (api, broker: the module's fixtures)

pytestmark = NEEDS_BROWSER

HOSTILE_USER = '<img src=x onerror="document.title=\'owned\'">'
HOSTILE_POLICY = "dash <i>policy</i>"


def cell(table, attributes, column):
    selector = "".join(f'[data-{name}="{css_string(value)}"]' for name, value in attributes.items())
    return f'#{table} tr{selector} td[data-column="{column}"]'


def rows(page, table, attribute="name"):
    return page.execute_script(
        f"return Array.from(document.querySelectorAll('#{table} tbody tr'), row => row.dataset.{attribute})")


def delete_row(page, table, attributes, confirm):
    click_in_table(page, cell(table, attributes, "actions") + " button")
    wait_until(page, expected_conditions.visibility_of_element_located((By.ID, confirm)))
    page.find_element(By.CSS_SELECTOR, f"#{confirm} .confirm-yes").click()


def test_the_features_column_marks_flags_arguments_and_policy_as_rabbitmq_does(page, api):
    arguments = {"x-message-ttl": 60000, "x-dead-letter-exchange": "dlx", "x-dead-letter-routing-key": "dead",
                 "x-max-length": 10, "x-max-priority": 5, "x-custom": "kept"}
    assert api.put("/api/queues/%2F/featured", {"durable": True, "arguments": arguments})[0] == 201
    assert api.put("/api/queues/%2F/featured-ad", {"durable": False, "auto_delete": True})[0] == 201
    assert api.put(f"/api/policies/%2F/{segment(HOSTILE_POLICY)}", {
        "pattern": "^featured$", "definition": {"max-length": 100}, "apply-to": "queues"})[0] == 201
    logged_in(page)
    page.find_element(By.CSS_SELECTOR, '#nav a[data-route="queues"]').click()
    features = row_selector("/", "featured", "features")
    wait_for_text(page, features, f"D TTL Lim DLX DLK Pri Args {HOSTILE_POLICY}")
    assert text_of(page, row_selector("/", "featured-ad", "features")) == "AD"
    assert text_of(page, row_selector("/", "featured", "type")) == "classic"
    titles = page.execute_script("return Array.from(document.querySelectorAll(arguments[0] + ' abbr'),"
                                 " mark => [mark.textContent, mark.title])", features)
    assert titles == [["D", "durable: true"], ["TTL", "x-message-ttl: 60000"], ["Lim", "x-max-length: 10"],
                      ["DLX", "x-dead-letter-exchange: dlx"], ["DLK", "x-dead-letter-routing-key: dead"],
                      ["Pri", "x-max-priority: 5"], ["Args", "x-custom: kept"],
                      [HOSTILE_POLICY, f"Policy: {HOSTILE_POLICY}"]]
    assert page.execute_script("return document.querySelectorAll(arguments[0] + ' i').length", features) == 0
    click_in_table(page, row_selector("/", "featured", "name") + " a")  # the queue's page
    wait_for_text(page, '#queue-figures [data-figure="policy"] dd', HOSTILE_POLICY)
    assert text_of(page, '#queue-figures [data-figure="features"] dd') == f"D TTL Lim DLX DLK Pri Args {HOSTILE_POLICY}"
    assert text_of(page, '#queue-figures [data-figure="effective_policy_definition"] dd') == '{"max-length":100}'


def test_a_user_added_with_tags_gets_permissions_and_is_deleted(page, api):
    logged_in(page)
    open_admin(page, "users")
    fill(page, "user-name", "dash-ops")
    fill(page, "user-password", "ops-secret")
    for tag in ("management", "monitoring"):
        page.find_element(By.CSS_SELECTOR, f'#user-form button[data-tag="{tag}"]').click()
    page.find_element(By.CSS_SELECTOR, "#user-form button[type=submit]").click()
    wait_for_text(page, "#user-result", "User dash-ops saved.")
    wait_for_text(page, cell("users-table", {"name": "dash-ops"}, "tags"), "management, monitoring")
    assert api.get("/api/users/dash-ops")["tags"] == ["management", "monitoring"]
    assert api.as_user("dash-ops", "ops-secret").get("/api/whoami") == {"name": "dash-ops",
                                                                        "tags": ["management", "monitoring"]}

    wait_until(page, lambda driver: driver.find_elements(By.CSS_SELECTOR, '#permission-user option[value="dash-ops"]'))
    Select(page.find_element(By.ID, "permission-user")).select_by_value("dash-ops")
    Select(page.find_element(By.ID, "permission-vhost")).select_by_value("/")
    fill(page, "permission-write", "^dash-")
    page.find_element(By.CSS_SELECTOR, "#permission-form button[type=submit]").click()
    wait_for_text(page, "#permission-result", "Permissions of dash-ops on / set.")
    wait_for_text(page, cell("users-table", {"name": "dash-ops"}, "vhosts"), "/")
    wait_for_text(page, cell("permissions-table", {"user": "dash-ops", "vhost": "/"}, "write"), "^dash-")
    assert api.get("/api/permissions/%2F/dash-ops") == {"user": "dash-ops", "vhost": "/", "configure": ".*",
                                                        "write": "^dash-", "read": ".*"}

    delete_row(page, "users-table", {"name": "dash-ops"}, "users-confirm")
    wait_for_text(page, "#users-result", "User dash-ops deleted.")
    wait_until(page, lambda driver: "dash-ops" not in rows(driver, "users-table"))
    assert api.request("GET", "/api/users/dash-ops")[0] == 404


def test_a_user_named_as_markup_is_shown_as_text(page, api):
    logged_in(page)
    open_admin(page, "users")
    fill(page, "user-name", HOSTILE_USER)
    fill(page, "user-password", "x")
    page.find_element(By.CSS_SELECTOR, "#user-form button[type=submit]").click()
    wait_for_text(page, "#user-result", f"User {HOSTILE_USER} saved.")
    wait_for_text(page, cell("users-table", {"name": HOSTILE_USER}, "name"), HOSTILE_USER)
    assert page.execute_script("return document.querySelectorAll('#view-users img').length") == 0
    assert page.title != "owned"
    assert api.get(f"/api/users/{segment(HOSTILE_USER)}")["name"] == HOSTILE_USER
    assert api.delete(f"/api/users/{segment(HOSTILE_USER)}")[0] == 204


def test_a_vhost_is_added_and_deleted(page, api):
    logged_in(page)
    open_admin(page, "vhosts")
    fill(page, "vhost-name", "dash-added")
    page.find_element(By.CSS_SELECTOR, "#vhost-form button[type=submit]").click()
    wait_for_text(page, "#vhost-result", "Virtual host dash-added added.")
    wait_for_text(page, cell("vhosts-table", {"name": "dash-added"}, "messages"), "0")
    assert api.get("/api/vhosts/dash-added")["name"] == "dash-added"
    delete_row(page, "vhosts-table", {"name": "dash-added"}, "vhosts-confirm")
    wait_for_text(page, "#vhosts-result", "Virtual host dash-added deleted.")
    wait_until(page, lambda driver: "dash-added" not in rows(driver, "vhosts-table"))
    assert api.request("GET", "/api/vhosts/dash-added")[0] == 404


def test_a_policy_is_added_from_its_json_definition_and_deleted(page, api):
    logged_in(page)
    open_admin(page, "policies")
    wait_until(page, lambda driver: driver.find_elements(By.CSS_SELECTOR, '#policy-vhost option[value="/"]'))
    Select(page.find_element(By.ID, "policy-vhost")).select_by_value("/")
    fill(page, "policy-name", "dash-limit")
    fill(page, "policy-pattern", "^dash-")
    Select(page.find_element(By.ID, "policy-apply-to")).select_by_value("queues")
    fill(page, "policy-priority", "3")
    fill(page, "policy-definition", '{"max-length": ')  # not JSON: refused on the page, nothing sent
    page.find_element(By.CSS_SELECTOR, "#policy-form button[type=submit]").click()
    wait_for_text(page, "#policy-result", 'The definition must be a JSON object, such as {"max-length": 1000}.')
    assert api.request("GET", "/api/policies/%2F/dash-limit")[0] == 404
    fill(page, "policy-definition", '{"max-length": 5}')
    page.find_element(By.CSS_SELECTOR, "#policy-form button[type=submit]").click()
    wait_for_text(page, "#policy-result", "Policy dash-limit saved.")
    wait_for_text(page, cell("policies-table", {"vhost": "/", "name": "dash-limit"}, "definition"), '{"max-length":5}')
    assert api.get("/api/policies/%2F/dash-limit") == {"vhost": "/", "name": "dash-limit", "pattern": "^dash-",
                                                       "apply-to": "queues", "definition": {"max-length": 5},
                                                       "priority": 3}
    delete_row(page, "policies-table", {"vhost": "/", "name": "dash-limit"}, "policies-confirm")
    wait_for_text(page, "#policies-result", "Policy dash-limit deleted.")
    wait_until(page, lambda driver: "dash-limit" not in rows(driver, "policies-table"))
    assert api.request("GET", "/api/policies/%2F/dash-limit")[0] == 404


def test_the_users_page_is_refused_to_a_management_user_as_rabbitmq_refuses_it(page, api):
    assert api.put("/api/users/dash-manager", {"password": "manager", "tags": "management"})[0] == 201
    manager = api.as_user("dash-manager", "manager")
    refusal = {"error": "not_authorised", "reason": "Not administrator user"}  # RabbitMQ 3.10's answer
    assert manager.request("GET", "/api/users")[:2] == (401, refusal)
    assert manager.request("GET", "/api/permissions")[:2] == (401, refusal)
    assert manager.request("PUT", "/api/vhosts/dash-not-made", {})[:2] == (401, refusal)
    logged_in(page, "dash-manager", "manager")
    open_admin(page, "users")
    wait_for_text(page, "#view-users .refused", "Not administrator user")
    assert not page.find_element(By.CSS_SELECTOR, "#view-users .admin-content").is_displayed()
    assert page.find_element(By.ID, "nav").is_displayed()  # still logged in
    assert page.find_element(By.ID, "banner").get_attribute("hidden") is not None
