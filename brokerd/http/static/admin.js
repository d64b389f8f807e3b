// What the Admin pages (users, virtual hosts, policies, limits) share: their sub-navigation,
// a page that shows the API's refusal in place of its content, form fields, a line that says
// what an action did, and a question asked before deleting.

import { el, replaceContent } from "./dom.js";

export const ADMIN_PAGES = [
  ["users", "Users"],
  ["vhosts", "Virtual Hosts"],
  ["policies", "Policies"],
  ["limits", "Limits"],
];

/** A form's result line: done (text) or refused (the API's reason, marked as an error). */
export function report(line, text, failed = false) {
  line.textContent = text;
  line.className = failed ? "result error" : "result";
}

/** A labelled input: field("user-name", "Name", { required: true }) -> { label, input }. */
export function field(id, label, attributes = {}, tag = "input") {
  const input = el(tag, { id, name: id, ...attributes });
  return { input, label: el("label", {}, label, input) };
}

/** A select of [value, label] choices. */
export function choice(id, label, choices) {
  const input = el("select", { id, name: id }, choices.map(([value, text]) => el("option", { value }, text)));
  return { input, label: el("label", {}, label, input) };
}

/** Offer values in a select, keeping the chosen one while it is still offered. */
export function setOptions(select, values) {
  const current = Array.from(select.options, (option) => option.value);
  if (JSON.stringify(values) === JSON.stringify(current)) return;
  const chosen = select.value;
  replaceContent(select, values.map((value) => el("option", { value }, value)));
  if (values.includes(chosen)) select.value = chosen;
}

/** A question asked before a deletion: ask(text, action) shows it; Delete runs action. */
export class ConfirmBar {
  constructor(id) {
    this.action = null;
    this.question = el("span");
    this.element = el(
      "div",
      { id, class: "confirm", hidden: true },
      this.question,
      el("button", { type: "button", class: "danger confirm-yes", onclick: () => this.confirmed() }, "Delete"),
      el("button", { type: "button", class: "confirm-no", onclick: () => this.cancel() }, "Cancel"),
    );
  }

  ask(text, action) {
    this.question.textContent = text;
    this.action = action;
    this.element.hidden = false;
  }

  cancel() {
    this.action = null;
    this.element.hidden = true;
  }

  confirmed() {
    const action = this.action;
    this.cancel();
    if (action) action();
  }
}

/**
 * One Admin page: the sub-navigation, a title, a refusal line shown instead of the content
 * when the API refuses this user (RabbitMQ's words: "Not administrator user"), the content.
 * A page implements load(api), which throws the API's errors.
 */
export class AdminPage {
  constructor(app, id, title) {
    this.app = app;
    this.id = id;
    this.refused = el("p", { class: "error refused", role: "alert", hidden: true });
    this.content = el("div", { class: "admin-content" });
    const links = ADMIN_PAGES.map(([page, label]) =>
      el("a", { href: `#/${page}`, "data-page": page, "aria-current": page === id ? "page" : null }, label),
    );
    this.element = el(
      "section",
      { id: `view-${id}`, class: "view", hidden: true },
      el("nav", { class: "subnav" }, links),
      el("h1", {}, title),
      this.refused,
      this.content,
    );
  }

  async refresh(api) {
    try {
      await this.load(api);
    } catch (error) {
      if (error.status !== 401 || !(await this.app.stillLoggedIn(error))) throw error;
      this.refused.textContent = error.reason || error.message;
      this.refused.hidden = false;
      this.content.hidden = true;
      return;
    }
    this.refused.hidden = true;
    this.content.hidden = false;
  }

  /** Run an API call for a form: its result line says what happened; the page refreshes after. */
  async act(line, call, done) {
    const api = this.app.api;
    try {
      report(line, done(await call(api)));
    } catch (error) {
      if (!(await this.app.stillLoggedIn(error))) return;
      report(line, error.reason || error.message, true);
    }
    this.app.refreshNow();
  }

  /** A Delete button for a table row: asks with confirm, then runs call, reported on line. */
  deleteButton(confirm, line, question, call, done) {
    return el(
      "button",
      { type: "button", class: "delete", onclick: () => confirm.ask(question, () => this.act(line, call, () => done)) },
      "Delete",
    );
  }
}
