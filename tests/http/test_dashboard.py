"""The dashboard in a real headless Chromium (through Selenium) against a real broker.

The page is served by the broker's HTTP listener at C{/}; the tests log in as
guest, see a queue filled over AMQP appear in the queues table with its depth,
sort and filter the table, open the queue's page, publish to it and get from
it there, purge it (and check with the API that it is empty), and see a wrong
password refused with RabbitMQ's reason. Chromium and its driver are Debian's
C{chromium} and C{chromium-driver} (C{.ci/run} installs them); without them the
module is skipped.
"""

import http.client
from urllib.parse import quote

import pika
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select

from brokerd.testing import BrokerProcess
from tests.support.dashboard import (  # noqa: F401 (browser, page: fixtures)
    NEEDS_BROWSER,
    browser,
    log_in,
    page,
    row_selector,
    text_of,
    wait_for_text,
    wait_until,
)
from tests.support.httpapi import api, broker, segment  # noqa: F401 (api, broker: the module's fixtures)

pytestmark = NEEDS_BROWSER

# A queue name that would be markup if the page wrote it as HTML, with a '/' to URL-encode.
QUEUE = "dash <b>jobs</b> & /1"


@pytest.fixture(scope="module")
def publish(broker):
    """C{publish(queue, count)}: declare the queue and put C{count} messages in it over AMQP, confirmed."""
    host, port = broker.wait_address("AMQP")
    parameters = pika.ConnectionParameters(host, port, connection_attempts=1, socket_timeout=10)
    connection = pika.BlockingConnection(parameters)
    channel = connection.channel()
    channel.confirm_delivery()

    def publish(queue, count):
        channel.queue_declare(queue, durable=True)
        for number in range(count):
            channel.basic_publish("", queue, b"message %d" % number)

    yield publish
    connection.close()


def fetch(api, path, headers=None):
    """C{(status, headers, body)} of a GET of C{path} sent as written (http.client keeps C{..} and C{%2F})."""
    host, port = api.base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def test_the_page_and_its_files_are_served_without_login_and_nothing_outside_them(api):
    status, headers, body = fetch(api, "/")
    assert (status, headers["content-type"]) == (200, "text/html; charset=utf-8")
    assert b'<script type="module" src="static/app.js"></script>' in body
    assert "default-src 'self'" in headers["content-security-policy"]
    for asset, wanted in (("app.js", "text/javascript"), ("chart.js", "text/javascript"), ("style.css", "text/css")):
        status, headers, body = fetch(api, f"/static/{asset}")
        assert (status, headers["content-type"]) == (200, f"{wanted}; charset=utf-8") and body
    cached = {"If-Modified-Since": headers["last-modified"]}
    assert fetch(api, "/static/style.css", cached)[0] == 304  # the browser's copy is still good
    for escape in ("/static/../../../../etc/passwd", "/static/..%2F..%2F..%2F..%2Fetc%2Fpasswd", "/../../etc/passwd",
                   "/static/%2Fetc%2Fpasswd", "/static/../server.py", "/static/..%2Fserver.py", "/static/",
                   "/static", "/static/app.js/../../server.py", "/static/app.js/x"):
        status, _, body = fetch(api, escape)
        assert status == 404, (escape, status)
        assert b"root:" not in body and b"import" not in body
    assert fetch(api, "/api/overview")[0] == 401  # the data still needs a login


def test_a_refused_login_shows_why_in_rabbitmqs_words(page, api):
    log_in(page, "guest", "not the password")
    wait_for_text(page, "#login-error", "Login failed")
    assert not page.find_element(By.ID, "nav").is_displayed()
    assert page.execute_script("return sessionStorage.length") == 0

    assert api.put("/api/users/dash-plain", {"password": "plain", "tags": ""})[0] == 201  # no management tag
    for field in ("login-username", "login-password"):
        page.find_element(By.ID, field).clear()
    log_in(page, "dash-plain", "plain")
    wait_for_text(page, "#login-error", "Not management user")
    assert not page.find_element(By.ID, "nav").is_displayed()


def queue_names(browser):
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('#queues-table tbody tr'), row => row.dataset.name)")


def wait_for_queues(browser, expected):
    wait_until(browser, lambda driver: queue_names(driver) == expected,
               lambda: f"the queues table did not list {expected} (it lists {queue_names(browser)})")


def test_a_queue_appears_with_its_depth_and_its_page_purges_it(page, api, publish):
    log_in(page, "guest", "guest")
    wait_for_text(page, "#session-user", "guest (administrator)")
    wait_until(page, lambda driver: text_of(driver, '#object-totals [data-total="queues"] .tile-value') is not None)
    assert text_of(page, '#chart-rates [data-series="publish"] .legend-value').endswith("/s")
    assert page.execute_script("return document.querySelector('#chart-rates canvas').width") > 0  # drawn
    page.find_element(By.CSS_SELECTOR, '#nav a[data-route="queues"]').click()
    wait_until(page, expected_conditions.visibility_of_element_located((By.ID, "queues-table")))

    publish(QUEUE, 7)
    wait_for_text(page, row_selector("/", QUEUE, "messages"), "7")
    assert text_of(page, row_selector("/", QUEUE, "messages_ready")) == "7"
    link = page.find_element(By.CSS_SELECTOR, row_selector("/", QUEUE, "name") + " a")
    assert link.text == QUEUE  # written as text, not markup
    link.click()
    queue_page = f"#/queues/%2F/{quote(QUEUE, safe='')}"  # the vhost and the name URL-encoded
    wait_until(page, lambda driver: driver.execute_script("return location.hash") == queue_page)
    wait_for_text(page, "#queue-name", QUEUE)
    wait_for_text(page, '#queue-figures [data-figure="messages"] dd', "7")

    page.find_element(By.ID, "publish-payload").send_keys("<i>from the page</i>")
    page.find_element(By.CSS_SELECTOR, "#publish-form button[type=submit]").click()
    wait_for_text(page, "#publish-result", "Message published.")
    wait_for_text(page, '#queue-figures [data-figure="messages"] dd', "8")
    page.find_element(By.ID, "get-count").clear()
    page.find_element(By.ID, "get-count").send_keys("8")
    page.find_element(By.CSS_SELECTOR, "#get-form button[type=submit]").click()  # ack_requeue_true: they stay
    wait_for_text(page, "#get-result", "8 message(s).")
    payloads = page.execute_script(
        "return Array.from(document.querySelectorAll('#get-messages .payload'), payload => payload.textContent)")
    assert payloads == [f"message {number}" for number in range(7)] + ["<i>from the page</i>"]

    page.find_element(By.ID, "purge-button").click()
    wait_until(page, expected_conditions.visibility_of_element_located((By.ID, "purge-confirm")))
    assert "8 ready message(s)" in text_of(page, "#purge-confirm")
    page.find_element(By.ID, "purge-yes").click()
    wait_for_text(page, "#purge-result", "Queue purged.")
    wait_for_text(page, '#queue-figures [data-figure="messages"] dd', "0")
    queue = api.get(f"/api/queues/%2F/{segment(QUEUE)}")
    assert (queue["messages"], queue["messages_ready"]) == (0, 0)
    assert api.post(f"/api/queues/%2F/{segment(QUEUE)}/get",
                    {"count": 10, "ackmode": "ack_requeue_true", "encoding": "auto"}) == (200, [])


def test_the_queues_table_sorts_on_a_column_and_filters_by_vhost_and_name(page, api, publish):
    for name, depth in (("sorted b", 5), ("sorted a", 3), ("sorted c", 1)):
        publish(name, depth)
    assert api.put("/api/vhosts/dash-team")[0] == 201
    assert api.put("/api/permissions/dash-team/guest", {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    assert api.put("/api/queues/dash-team/sorted%20team", {"durable": True})[0] == 201
    log_in(page, "guest", "guest")
    wait_for_text(page, "#session-user", "guest (administrator)")
    page.find_element(By.CSS_SELECTOR, '#nav a[data-route="queues"]').click()
    wait_until(page, expected_conditions.visibility_of_element_located((By.ID, "filter-name"))).send_keys("SORTED")
    wait_for_queues(page, ["sorted a", "sorted b", "sorted c", "sorted team"])  # by name

    total = page.find_element(By.CSS_SELECTOR, '#queues-table th[data-column="messages"] button')
    total.click()
    wait_for_queues(page, ["sorted b", "sorted a", "sorted c", "sorted team"])  # biggest first
    header = page.find_element(By.CSS_SELECTOR, '#queues-table th[data-column="messages"]')
    assert header.get_attribute("aria-sort") == "descending"
    total.click()
    wait_for_queues(page, ["sorted team", "sorted c", "sorted a", "sorted b"])

    wait_until(page, lambda driver: driver.find_elements(By.CSS_SELECTOR, '#filter-vhost option[value="dash-team"]'))
    Select(page.find_element(By.ID, "filter-vhost")).select_by_value("dash-team")
    wait_for_queues(page, ["sorted team"])
    wait_for_text(page, "#view-queues .count", "1 queue")


def test_connections_channels_exchanges_and_bindings_are_listed_until_logging_out(page, publish):
    publish("listed", 1)  # the module's AMQP connection and channel, and the default binding of a queue
    log_in(page, "guest", "guest")
    wait_for_text(page, "#session-user", "guest (administrator)")
    expected = {
        "connections": '#connections-table td[data-column="user"]',
        "channels": '#channels-table td[data-column="user"]',
        "exchanges": '#exchanges-table tr[data-name="amq.topic"] td[data-column="type"]',
        "bindings": '#bindings-table tr[data-source=""][data-destination="listed"] td[data-column="source"]',
    }
    texts = {"connections": "guest", "channels": "guest", "exchanges": "topic", "bindings": "(AMQP default)"}
    for route, selector in expected.items():
        page.find_element(By.CSS_SELECTOR, f'#nav a[data-route="{route}"]').click()
        wait_for_text(page, selector, texts[route])

    page.find_element(By.ID, "logout").click()
    wait_until(page, expected_conditions.visibility_of_element_located((By.ID, "login-form")))
    assert not page.find_element(By.ID, "views").is_displayed()
    assert page.execute_script("return sessionStorage.length") == 0


def test_a_refused_permission_is_shown_and_the_user_stays_logged_in(page, api, publish):
    publish("guarded", 2)
    assert api.put("/api/users/dash-reader", {"password": "reader", "tags": "management"})[0] == 201
    assert api.put("/api/permissions/%2F/dash-reader", {"configure": "", "write": "", "read": "^$"})[0] == 201
    page.execute_script("location.hash = '#/queues/%2F/guarded'")
    log_in(page, "dash-reader", "reader")
    wait_for_text(page, '#queue-figures [data-figure="messages"] dd', "2")
    page.find_element(By.ID, "purge-button").click()
    page.find_element(By.ID, "purge-yes").click()
    wait_for_text(page, "#purge-result", "Access refused.")  # RabbitMQ 3.10.8's words
    assert page.find_element(By.ID, "nav").is_displayed() and not page.find_element(By.ID, "login").is_displayed()
    assert api.get("/api/queues/%2F/guarded")["messages"] == 2


def resource_tile(browser, resource):
    """C{(data-alarm, label, value)} of the overview's tile of C{resource}, or None while there is none."""
    return browser.execute_script(
        "const tile = document.querySelector(`#node-resources [data-resource='${arguments[0]}']`);"
        "return tile && tile.offsetParent ? [tile.dataset.alarm, tile.querySelector('.tile-label').innerText,"
        " tile.querySelector('.tile-value').innerText] : null", resource)


def test_the_overview_shows_the_free_disk_space_and_the_disk_alarm(page, tmp_path):
    log_in(page, "guest", "guest")
    wait_until(page, lambda driver: (resource_tile(driver, "disk") or [None])[0] == "clear",
               lambda: f"the disk tile shows {resource_tile(page, 'disk')}")
    alarm, label, value = resource_tile(page, "disk")
    assert label == "Disk free" and value.endswith("iB")
    assert resource_tile(page, "disk-limit")[2] == "47.7 MiB"  # RabbitMQ's default, 50 MB

    # A broker whose limit no disk reaches: its alarm is raised from its first measure.
    short = BrokerProcess(["--backend=memory", "--native", "none", "--disk-free-limit", "1000000GB"], cwd=tmp_path)
    try:
        _, host, port = short.wait_listening("HTTP API").split(":")
        page.get(f"http://{host}:{port}/")
        page.refresh()
        wait_until(page, lambda driver: driver.find_element(By.ID, "login-username").is_displayed())
        log_in(page, "guest", "guest")
        wait_until(page, lambda driver: (resource_tile(driver, "disk") or [None])[0] == "raised",
                   lambda: f"the disk tile shows {resource_tile(page, 'disk')}")
        assert resource_tile(page, "disk")[1] == "Disk free: alarm"
        assert resource_tile(page, "memory")[:2] == ["clear", "Memory watermark"]
        colour = page.execute_script("return getComputedStyle(document.querySelector("
                                     "\"#node-resources [data-resource='disk']\")).borderColor")
        assert colour == "rgb(192, 57, 43)"
    finally:
        assert short.stop() == 0


COINCIDING_SERIES = """
const done = arguments[arguments.length - 1];
import("./static/chart.js").then(({ LineChart }) => {
  const series = [{ key: "publish", label: "Published", color: "#d9822b" },
                  { key: "deliver", label: "Delivered", color: "#2b7bd9" },
                  { key: "ack", label: "Acknowledged", color: "#3a9a4a" }];
  const chart = new LineChart({ id: "chart-coinciding", title: "Coinciding", series, format: String });
  document.body.append(chart.element);
  for (let second = 0; second <= 300; second += 5) {
    const rate = Math.round(50 + 40 * Math.sin(second / 30));
    chart.add(1000 + second, { publish: rate, deliver: rate, ack: rate }); // the three series coincide everywhere
  }
  const canvas = chart.canvas;
  const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  const shown = series.map((line) => {
    const wanted = [1, 3, 5].map((start) => parseInt(line.color.slice(start, start + 2), 16));
    let count = 0;
    for (let index = 0; index < pixels.length; index += 4) {
      const distance = Math.hypot(...wanted.map((channel, offset) => pixels[index + offset] - channel));
      if (pixels[index + 3] > 200 && distance < 40) count += 1;
    }
    return count;
  });
  const legend = Array.from(chart.element.querySelectorAll(".legend li"), (item) => ({
    series: item.dataset.series, dash: item.dataset.dash, width: item.dataset.width,
    value: item.querySelector(".legend-value").textContent }));
  chart.element.remove();
  done({ shown, legend });
}).catch((error) => done({ error: String(error) }));
"""


def test_series_that_coincide_all_stay_visible_each_in_a_style_of_its_own(page):
    drawn = page.execute_async_script(COINCIDING_SERIES)
    assert "error" not in drawn, drawn
    published, delivered, acknowledged = drawn["shown"]
    assert min(published, delivered, acknowledged) >= 50, drawn["shown"]  # pixels of each series' own colour
    legend = drawn["legend"]
    assert [entry["series"] for entry in legend] == ["publish", "deliver", "ack"]
    assert len({(entry["dash"], entry["width"]) for entry in legend}) == 3  # each line drawn in its own style
    assert len({entry["dash"] for entry in legend}) == 3
    assert {entry["value"] for entry in legend} == {legend[0]["value"]}  # and each one's value in the legend


def test_the_connections_list_shows_the_name_a_client_gave(page, broker):
    host, port = broker.wait_address("AMQP")
    parameters = pika.ConnectionParameters(host, port, client_properties={"connection_name": "billing <worker>"})
    with pika.BlockingConnection(parameters):
        log_in(page, "guest", "guest")
        wait_for_text(page, "#session-user", "guest (administrator)")
        page.find_element(By.CSS_SELECTOR, '#nav a[data-route="connections"]').click()
        selector = '#connections-table td[data-column="name"] .provided-name'
        wait_for_text(page, selector, "billing <worker>")
