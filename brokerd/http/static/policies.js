// Admin > Policies: the policies of the vhosts this user sees, a form to add one (pattern,
// what it applies to, its definition as a JSON object, priority) and deletion.

import { AdminPage, ConfirmBar, choice, field, report, setOptions } from "./admin.js";
import { apiPath } from "./api.js";
import { el, formatJson, replaceContent } from "./dom.js";
import { SortableTable } from "./table.js";

// RabbitMQ 3.10's choices for apply-to
const APPLY_TO = [
  ["all", "Exchanges and queues"],
  ["queues", "Queues"],
  ["exchanges", "Exchanges"],
];

export class PoliciesView extends AdminPage {
  constructor(app) {
    super(app, "policies", "Policies");
    this.confirm = new ConfirmBar("policies-confirm");
    this.deleted = el("p", { id: "policies-result", class: "result", role: "status" });
    const text = (id, label) => ({ id, label, value: (row) => String(row[id] ?? "") });
    this.table = new SortableTable({
      id: "policies-table",
      emptyText: "No policies.",
      sortBy: "name",
      rowData: (row) => ({ vhost: row.vhost, name: row.name }),
      columns: [
        text("vhost", "Virtual host"),
        text("name", "Name"),
        text("pattern", "Pattern"),
        text("apply-to", "Apply to"),
        { id: "definition", label: "Definition", value: (row) => formatJson(row.definition) },
        { id: "priority", label: "Priority", numeric: true, value: (row) => row.priority ?? 0 },
        {
          id: "actions",
          label: "",
          value: () => "",
          cell: (row) =>
            this.deleteButton(
              this.confirm,
              this.deleted,
              `Delete policy ${row.name} of virtual host ${row.vhost}?`,
              (api) => api.delete(apiPath("policies", row.vhost, row.name)),
              `Policy ${row.name} deleted.`,
            ),
        },
      ],
    });
    replaceContent(this.content, this.table.element, this.confirm.element, this.deleted, el("div", { class: "panels" }, this.form()));
  }

  form() {
    this.vhost = el("select", { id: "policy-vhost" });
    const name = field("policy-name", "Name", { required: true, autocomplete: "off" });
    const pattern = field("policy-pattern", "Pattern (a regular expression)", { required: true, autocomplete: "off" });
    const applyTo = choice("policy-apply-to", "Apply to", APPLY_TO);
    const priority = field("policy-priority", "Priority", { type: "number", value: 0 });
    const definition = field("policy-definition", "Definition (a JSON object)", { rows: 4, placeholder: '{"max-length": 1000}' }, "textarea");
    const result = el("p", { id: "policy-result", class: "result", role: "status" });
    const submit = (event) => {
      event.preventDefault();
      let parsed;
      try {
        parsed = JSON.parse(definition.input.value);
      } catch {
        parsed = null;
      }
      if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) {
        report(result, "The definition must be a JSON object, such as {\"max-length\": 1000}.", true);
        return;
      }
      const [vhost, policy] = [this.vhost.value, name.input.value];
      const body = { pattern: pattern.input.value, definition: parsed, "apply-to": applyTo.input.value, priority: Number(priority.input.value) || 0 };
      this.act(result, (api) => api.put(apiPath("policies", vhost, policy), body), () => `Policy ${policy} saved.`);
    };
    return el(
      "form",
      { id: "policy-form", class: "panel", onsubmit: submit },
      el("h2", {}, "Add / update a policy"),
      el("label", {}, "Virtual host", this.vhost),
      name.label,
      pattern.label,
      applyTo.label,
      priority.label,
      definition.label,
      el("button", { type: "submit" }, "Add / update policy"),
      result,
    );
  }

  async load(api) {
    const [policies, vhosts] = await Promise.all([api.get(apiPath("policies")), api.get(apiPath("vhosts"))]);
    this.table.update(policies || []);
    setOptions(this.vhost, (vhosts || []).map((vhost) => vhost.name));
  }
}
