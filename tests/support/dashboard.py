"""What the dashboard's browser tests share: a headless Chromium (through Selenium) on the broker's page, and
waits on what the page shows.

The fixtures C{browser} (one Chromium per module) and C{page} (the page logged out, refreshing every second) are
used by importing them, with C{api} and C{broker} of L{tests.support.httpapi}; C{NEEDS_BROWSER} skips a module
where Debian's C{chromium} and C{chromium-driver} are not installed.
"""

import shutil

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

BROWSER = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
DRIVER = shutil.which("chromedriver")
WAIT_SECONDS = 10  # for the page to show what the broker has (it polls every second in these tests)
POLL_SECONDS = 0.05  # how often a wait looks at the page (Selenium's default, 0.5 s, would add up)

NEEDS_BROWSER = pytest.mark.skipif(
    BROWSER is None or DRIVER is None,
    reason="the dashboard tests need Chromium and chromedriver (Debian: apt-get install chromium chromium-driver)",
)



def start_browser(width=1280, height=800):
    """A headless Chromium driven by chromedriver, its window C{width} x C{height}."""
    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}", "--disable-extensions", "--no-first-run",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the page's console, for failures
    return webdriver.Chrome(service=Service(DRIVER), options=options)


@pytest.fixture(scope="module")
def browser():
    driver = start_browser()
    yield driver
    driver.quit()


@pytest.fixture
def page(browser, api):
    """The browser on the dashboard's page, logged out, refreshing every second."""
    browser.get(api.base + "/")
    browser.execute_script("sessionStorage.clear(); localStorage.setItem('brokerd.dashboard.refresh', '1');")
    browser.refresh()  # the page starts again without the login saved in this tab
    wait_until(browser, lambda driver: driver.find_element(By.ID, "login-username").is_displayed())
    return browser


def wait_until(browser, condition, describe=lambda: "the page did not get there"):
    """What C{condition(browser)} gives once true; if it is not within the wait, a failure that
    says C{describe()} (then) and what the page's console has."""
    try:
        return WebDriverWait(browser, WAIT_SECONDS, poll_frequency=POLL_SECONDS).until(condition)
    except TimeoutException:
        console = "\n".join(entry["message"] for entry in browser.get_log("browser")) or "(nothing)"
        raise AssertionError(f"{describe()} within {WAIT_SECONDS} s; the page's console:\n{console}") from None


def text_of(browser, selector):
    """The text of the element C{selector} finds, or None while there is none."""
    return browser.execute_script("const found = document.querySelector(arguments[0]);"
                                  "return found ? found.innerText.trim() : null", selector)


def wait_for_text(browser, selector, expected):
    wait_until(browser, lambda driver: text_of(driver, selector) == expected,
               lambda: f"{selector} did not show {expected!r} (it shows {text_of(browser, selector)!r})")


def log_in(browser, user, password):
    browser.find_element(By.ID, "login-username").send_keys(user)
    browser.find_element(By.ID, "login-password").send_keys(password)
    browser.find_element(By.ID, "login-button").click()


def logged_in(page, user="guest", password="guest"):
    log_in(page, user, password)
    wait_until(page, expected_conditions.visibility_of_element_located((By.ID, "nav")))
    return page


def open_admin(page, name):
    """Show the Admin page C{name} (users, vhosts, policies, limits) through the navigation."""
    page.find_element(By.CSS_SELECTOR, '#nav a[data-route="admin"]').click()
    wait_until(page, expected_conditions.visibility_of_element_located((By.ID, "view-users")))
    if name != "users":
        page.find_element(By.CSS_SELECTOR, f'#view-users .subnav a[data-page="{name}"]').click()
    wait_until(page, expected_conditions.visibility_of_element_located((By.ID, f"view-{name}")))
    assert page.find_element(By.CSS_SELECTOR, '#nav a[data-route="admin"]').get_attribute("aria-current") == "page"


def fill(page, field_id, text):
    field = page.find_element(By.ID, field_id)
    field.clear()
    field.send_keys(text)


def click_in_table(page, selector):
    """Click what C{selector} finds in a table, again if the table was redrawn (it is, every second) meanwhile."""
    def clicked(driver):
        try:
            driver.find_element(By.CSS_SELECTOR, selector).click()
        except StaleElementReferenceException:
            return False
        return True
    wait_until(page, clicked, lambda: f"{selector} could not be clicked")


def row_selector(vhost, name, column):
    row = f'#queues-table tr[data-vhost="{css_string(vhost)}"][data-name="{css_string(name)}"]'
    return f'{row} td[data-column="{column}"]'


def css_string(text):
    return text.replace("\\", "\\\\").replace('"', '\\"')
