// The dashboard: login, the page's routes (#/, #/queues, #/queues/VHOST/NAME, ...) and the
// polling that keeps the shown page and the overview's charts up to date.

import { ADMIN_PAGES } from "./admin.js";
import { apiPath, forgetLogin, logIn, saveLogin, savedLogin } from "./api.js";
import { LimitsView } from "./limits.js";
import { bindingsView, channelsView, connectionsView, exchangesView, queuesView } from "./lists.js";
import { FilterBar } from "./listview.js";
import { OverviewView } from "./overview.js";
import { PoliciesView } from "./policies.js";
import { QueueView } from "./queue.js";
import { UsersView } from "./users.js";
import { VhostsView } from "./vhosts.js";

const REFRESH_KEY = "brokerd.dashboard.refresh";

function byId(id) {
  return document.getElementById(id);
}

/** The route of a location hash: { name, args } with the URL-decoded segments after the name. */
function parseRoute(hash) {
  const segments = hash.replace(/^#\/?/, "").split("/").filter((segment, index) => segment !== "" || index > 0);
  try {
    const [name = "overview", ...args] = segments.map(decodeURIComponent);
    if (name === "queues" && args.length === 2) return { name: "queue", args };
    return { name, args };
  } catch {
    return { name: "overview", args: [] }; // a malformed %-escape
  }
}

class Dashboard {
  constructor() {
    this.api = null;
    this.whoami = null;
    this.timer = null;
    this.polling = false;
    this.filters = new FilterBar(() => this.refreshNow());
    this.overview = new OverviewView();
    this.views = {
      overview: this.overview,
      queues: queuesView(this.filters),
      connections: connectionsView(this.filters),
      channels: channelsView(this.filters),
      exchanges: exchangesView(this.filters),
      bindings: bindingsView(this.filters),
      queue: new QueueView(this),
      users: new UsersView(this),
      vhosts: new VhostsView(this),
      policies: new PoliciesView(this),
      limits: new LimitsView(this),
    };
    this.current = this.overview;
    const container = byId("views");
    container.append(...Object.values(this.views).map((view) => view.element));

    this.interval = byId("refresh-interval");
    const offered = Array.from(this.interval.options, (option) => option.value);
    const savedInterval = localStorage.getItem(REFRESH_KEY);
    if (offered.includes(savedInterval)) this.interval.value = savedInterval; // else the default
    this.interval.addEventListener("change", () => {
      localStorage.setItem(REFRESH_KEY, this.interval.value);
      this.startPolling();
    });
    byId("login-form").addEventListener("submit", (event) => this.submitLogin(event));
    byId("logout").addEventListener("click", () => this.logOut(""));
    window.addEventListener("hashchange", () => this.route());
    window.addEventListener("resize", () => this.overview.redraw());

    const saved = savedLogin();
    if (saved) this.start(saved);
    else this.showLogin("");
  }

  showLogin(reason) {
    this.stopPolling();
    this.api = null;
    for (const id of ["nav", "session", "views"]) byId(id).hidden = true;
    byId("login").hidden = false;
    byId("login-error").textContent = reason;
    byId("login-password").value = "";
    byId("login-username").focus();
  }

  async submitLogin(event) {
    event.preventDefault();
    const button = byId("login-button");
    button.disabled = true;
    byId("login-error").textContent = "";
    try {
      const login = await logIn(byId("login-username").value, byId("login-password").value);
      saveLogin(login.api, login.whoami);
      this.start(login);
    } catch (error) {
      byId("login-error").textContent = error.reason || error.message;
    } finally {
      button.disabled = false;
    }
  }

  start({ api, whoami }) {
    this.api = api;
    this.whoami = whoami;
    const tags = (whoami.tags || []).join(", ");
    byId("session-user").textContent = tags ? `${whoami.name} (${tags})` : whoami.name;
    byId("login").hidden = true;
    byId("login-error").textContent = "";
    for (const id of ["nav", "session", "views"]) byId(id).hidden = false;
    this.route();
    this.startPolling();
  }

  /** Whether the user logged in has the administrator tag (/api/whoami said so at login). */
  isAdministrator() {
    return Boolean(this.whoami && (this.whoami.tags || []).includes("administrator"));
  }

  logOut(reason) {
    forgetLogin();
    this.showLogin(reason);
  }

  /** A failure of a request: shown above the page, unless the login itself is refused now. */
  async handleError(error) {
    if (await this.stillLoggedIn(error)) {
      const banner = byId("banner");
      banner.textContent = error.reason || error.message;
      banner.hidden = false;
    }
  }

  /**
   * False, back at the login form, if error says the login is refused now (the password changed,
   * the user was deleted): the API answers 401 to a refused permission as well, so a 401 is
   * checked with /api/whoami.
   */
  async stillLoggedIn(error) {
    const api = this.api;
    if (!api) return false;
    if (error.status !== 401) return true;
    try {
      await api.get(apiPath("whoami"));
      return api === this.api;
    } catch (again) {
      if (api === this.api && again.status === 401) this.logOut(again.reason);
      return api === this.api;
    }
  }

  route() {
    if (!this.api) return;
    const { name, args } = parseRoute(location.hash);
    const view = this.views[name] || this.overview;
    if (view.show) view.show(...args);
    for (const each of Object.values(this.views)) each.element.hidden = each !== view;
    for (const link of document.querySelectorAll("#nav a")) {
      const admin = ADMIN_PAGES.some(([page]) => page === name);
      const active = link.dataset.route === (name === "queue" ? "queues" : admin ? "admin" : name);
      if (active) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    this.current = view;
    if (view === this.overview) this.overview.redraw();
    this.refreshNow();
  }

  startPolling() {
    this.stopPolling();
    this.timer = setInterval(() => this.poll(), Number(this.interval.value) * 1000);
    this.poll();
  }

  stopPolling() {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
  }

  /** One round: the overview (for the charts, whatever page is shown), the vhosts, the page shown. */
  async poll() {
    if (this.polling || !this.api) return; // the round before has not finished: skip this one
    this.polling = true;
    const api = this.api;
    try {
      const [overview, vhosts] = await Promise.all([api.get(apiPath("overview")), api.get(apiPath("vhosts"))]);
      if (api !== this.api) return;
      this.overview.sample(overview);
      this.filters.setVhosts(vhosts || []);
      await this.refreshShown(api);
    } catch (error) {
      if (api === this.api) this.handleError(error);
    } finally {
      this.polling = false;
    }
  }

  /** Refresh the page shown now (after a route change, a filter change or an action). */
  refreshNow() {
    const api = this.api;
    if (!api) return;
    this.refreshShown(api).catch((error) => {
      if (api === this.api) this.handleError(error);
    });
  }

  async refreshShown(api) {
    const view = this.current;
    if (view.refresh) await view.refresh(api);
    if (api === this.api) byId("banner").hidden = true;
  }
}

new Dashboard();
