// Admin > Virtual Hosts: the vhosts with their messages, a form to add one (on the broker's
// store, or on a store of its own: brokerd's "backend" field) and deletion.

import { AdminPage, ConfirmBar, field } from "./admin.js";
import { apiPath } from "./api.js";
import { el, formatCount, replaceContent } from "./dom.js";
import { SortableTable } from "./table.js";

const count = (id, label) => ({ id, label, numeric: true, value: (row) => row[id] ?? 0, cell: (row) => formatCount(row[id]) });

export class VhostsView extends AdminPage {
  constructor(app) {
    super(app, "vhosts", "Virtual Hosts");
    this.confirm = new ConfirmBar("vhosts-confirm");
    this.deleted = el("p", { id: "vhosts-result", class: "result", role: "status" });
    this.table = new SortableTable({
      id: "vhosts-table",
      emptyText: "No virtual hosts.",
      sortBy: "name",
      rowData: (row) => ({ name: row.name }),
      columns: [
        { id: "name", label: "Name", value: (row) => row.name },
        count("messages_ready", "Ready"),
        count("messages_unacknowledged", "Unacked"),
        count("messages", "Total"),
        {
          id: "actions",
          label: "",
          value: () => "",
          cell: (row) =>
            this.deleteButton(
              this.confirm,
              this.deleted,
              `Delete virtual host ${row.name} and everything in it?`,
              (api) => api.delete(apiPath("vhosts", row.name)),
              `Virtual host ${row.name} deleted.`,
            ),
        },
      ],
    });
    const name = field("vhost-name", "Name", { required: true, autocomplete: "off" });
    const backend = field("vhost-backend", "Store (empty: the broker's; e.g. sqlite)", { autocomplete: "off" });
    const result = el("p", { id: "vhost-result", class: "result", role: "status" });
    const submit = (event) => {
      event.preventDefault();
      const vhost = name.input.value;
      const body = backend.input.value.trim() ? { backend: backend.input.value.trim() } : {};
      this.act(result, (api) => api.put(apiPath("vhosts", vhost), body), () => `Virtual host ${vhost} added.`);
    };
    const form = el("form", { id: "vhost-form", class: "panel", onsubmit: submit }, el("h2", {}, "Add a virtual host"), name.label, backend.label, el("button", { type: "submit" }, "Add virtual host"), result);
    replaceContent(this.content, this.table.element, this.confirm.element, this.deleted, el("div", { class: "panels" }, form));
  }

  async load(api) {
    this.table.update((await api.get(apiPath("vhosts"))) || []);
  }
}
