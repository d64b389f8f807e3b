"""The overview page's table of a cluster's nodes, in a real Chromium: each node with its role, whether it runs
and is in sync, and its lag; a stopped node shown not running once another took the lead. The nodes are real
candidates on a real etcd in this process; the browser is driven from a thread while the reactor serves the API."""

from selenium.webdriver.common.by import By
from twisted.internet import defer, reactor, threads
from twisted.trial import unittest

from backends.memory import MemoryStore
from brokerd.access.database import AccessDatabase
from brokerd.http.server import ApiContext, make_site
from brokerd.model.broker import Broker
from tests.support.broker import wait_until as reactor_wait_until
from tests.support.cluster_api import start_cluster
from tests.support.dashboard import BROWSER, DRIVER, logged_in, start_browser, wait_until
from tests.support.etcd import needs_etcd, start_etcd

ROW_SCRIPT = """
return Array.from(document.querySelectorAll('#nodes-table tbody tr')).map((row) => [
  row.dataset.node, row.dataset.role, row.dataset.running, row.dataset.inSync,
  row.querySelector('[data-column=lag-operations]').innerText, row.querySelector('[data-column=lag-bytes]').innerText]);
"""


def rows(browser):
    return browser.execute_script(ROW_SCRIPT)


def wait_for_rows(browser, expected):
    wait_until(browser, lambda driver: rows(driver) == expected,
               lambda: f"the nodes table did not show {expected} (it shows {rows(browser)})")


def open_overview(browser, base):
    """The dashboard of the API at C{base}, logged in as guest, refreshing every second."""
    browser.get(base + "/")
    browser.execute_script("sessionStorage.clear(); localStorage.setItem('brokerd.dashboard.refresh', '1');")
    browser.refresh()
    wait_until(browser, lambda driver: driver.find_element(By.ID, "login-username").is_displayed())
    logged_in(browser)


@needs_etcd
class ClusterNodesTableTests(unittest.TestCase):
    def setUp(self):
        if BROWSER is None or DRIVER is None:
            raise unittest.SkipTest("the dashboard tests need Chromium and chromedriver")
        self.etcd = start_etcd(self)
        d = threads.deferToThread(start_browser)

        def started(browser):
            self.browser = browser
            self.addCleanup(threads.deferToThread, browser.quit)
        return d.addCallback(started)

    def in_browser(self, steps, *arguments):
        """Runs C{steps(browser, ...)} in a thread, so the reactor goes on serving the API meanwhile."""
        return threads.deferToThread(steps, self.browser, *arguments)

    @defer.inlineCallbacks
    def test_each_node_is_shown_with_its_role_and_lag_and_a_stopped_one_as_not_running(self):
        figures = [{"node": "b", "acked": 5, "in_sync": True, "lag_operations": 1200, "lag_bytes": 4096,
                    "paused": False, "pauses": 0}]
        nodes = yield start_cluster(self, self.etcd, "a", "b", "c", followers=figures)
        yield nodes["a"].candidate.put_in_sync_set(["a", "b"])
        yield reactor_wait_until(lambda: nodes["a"].status.in_sync_set() == ["a", "b"]
                                 and nodes["c"].status.in_sync_set() == ["a", "b"])

        def on_the_leader(browser):
            open_overview(browser, nodes["a"].api.base)
            wait_for_rows(browser, [["brokerd@a", "leader", "true", "true", "0", "0 B"],
                                    ["brokerd@b", "follower", "true", "true", "1,200", "4.0 KiB"],
                                    ["brokerd@c", "follower", "true", "false", "", ""]])
            # The resource tiles are this node's own.
            assert browser.find_element(By.ID, "node-resources").is_displayed()

        yield self.in_browser(on_the_leader)

        def on_a_follower(browser):
            open_overview(browser, nodes["c"].api.base)
            wait_for_rows(browser, [["brokerd@a", "leader", "true", "true", "0", "0 B"],
                                    ["brokerd@b", "follower", "true", "true", "", ""],
                                    ["brokerd@c", "follower", "true", "false", "", ""]])

        yield self.in_browser(on_a_follower)
        yield nodes["a"].stop()
        yield reactor_wait_until(lambda: nodes["c"].status.leader_name() == "b", timeout=10)

        def after_the_takeover(browser):
            wait_for_rows(browser, [["brokerd@a", "follower", "false", "true", "", ""],
                                    ["brokerd@b", "leader", "true", "true", "0", "0 B"],
                                    ["brokerd@c", "follower", "true", "false", "", ""]])
            cell = browser.find_element(By.CSS_SELECTOR, '#nodes-table tr[data-node="brokerd@a"] [data-column=running]')
            assert cell.text == "no"

        yield self.in_browser(after_the_takeover)

    @defer.inlineCallbacks
    def test_a_node_on_its_own_shows_no_cluster_table(self):
        broker = Broker(MemoryStore(), reactor)
        access = AccessDatabase.in_memory()
        port = reactor.listenTCP(0, make_site(ApiContext(broker, access, None)), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.addCleanup(broker.stop)

        def alone(browser):
            open_overview(browser, f"http://127.0.0.1:{port.getHost().port}")
            wait_until(browser, lambda driver: driver.find_element(By.ID, "node-resources").is_displayed())
            assert not browser.find_element(By.ID, "cluster-nodes").is_displayed()
            assert rows(browser) == []

        yield self.in_browser(alone)
