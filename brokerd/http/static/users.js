// Admin > Users: the users with their tags and the vhosts they may use, a form to add one (or
// change its password and tags), its permissions on a vhost, and deletion; as RabbitMQ's
// management UI, for administrators (the API refuses the others: "Not administrator user").

import { AdminPage, ConfirmBar, field, setOptions } from "./admin.js";
import { apiPath } from "./api.js";
import { el, replaceContent } from "./dom.js";
import { SortableTable } from "./table.js";

const TAGS = ["administrator", "monitoring", "policymaker", "management", "impersonator"];

/** Tags typed as RabbitMQ's form takes them: comma-separated, blanks dropped. */
function tagsOf(text) {
  return text
    .split(",")
    .map((tag) => tag.trim())
    .filter(Boolean);
}

export class UsersView extends AdminPage {
  constructor(app) {
    super(app, "users", "Users");
    this.permissions = [];
    this.confirm = new ConfirmBar("users-confirm");
    this.deleted = el("p", { id: "users-result", class: "result", role: "status" });
    this.table = new SortableTable({
      id: "users-table",
      emptyText: "No users.",
      sortBy: "name",
      rowData: (row) => ({ name: row.name }),
      columns: [
        { id: "name", label: "Name", value: (row) => row.name },
        { id: "tags", label: "Tags", value: (row) => (row.tags || []).join(", ") },
        { id: "vhosts", label: "Can access virtual hosts", value: (row) => this.vhostsOf(row.name) },
        { id: "password", label: "Has password", value: (row) => (row.password_hash ? "yes" : "no") },
        {
          id: "actions",
          label: "",
          value: () => "",
          cell: (row) =>
            this.deleteButton(this.confirm, this.deleted, `Delete user ${row.name}?`, (api) => api.delete(apiPath("users", row.name)), `User ${row.name} deleted.`),
        },
      ],
    });
    this.permissionsTable = new SortableTable({
      id: "permissions-table",
      emptyText: "No permissions.",
      sortBy: "user",
      rowData: (row) => ({ user: row.user, vhost: row.vhost }),
      columns: [
        { id: "user", label: "User", value: (row) => row.user },
        { id: "vhost", label: "Virtual host", value: (row) => row.vhost },
        { id: "configure", label: "Configure regexp", value: (row) => row.configure },
        { id: "write", label: "Write regexp", value: (row) => row.write },
        { id: "read", label: "Read regexp", value: (row) => row.read },
        {
          id: "actions",
          label: "",
          value: () => "",
          cell: (row) =>
            this.deleteButton(
              this.confirm,
              this.deleted,
              `Clear the permissions of ${row.user} on ${row.vhost}?`,
              (api) => api.delete(apiPath("permissions", row.vhost, row.user)),
              `Permissions of ${row.user} on ${row.vhost} cleared.`,
            ),
        },
      ],
    });
    replaceContent(this.content, [
      el("h2", {}, "All users"),
      this.table.element,
      this.confirm.element,
      this.deleted,
      el("div", { class: "panels" }, this.userForm(), this.permissionForm()),
      el("h2", {}, "Permissions"),
      this.permissionsTable.element,
    ]);
  }

  userForm() {
    const name = field("user-name", "Username", { required: true, autocomplete: "off" });
    const password = field("user-password", "Password", { type: "password", autocomplete: "new-password" });
    const tags = field("user-tags", "Tags (comma-separated)", { autocomplete: "off" });
    this.userResult = el("p", { id: "user-result", class: "result", role: "status" });
    const addTag = (tag) => {
      const current = tagsOf(tags.input.value);
      if (!current.includes(tag)) tags.input.value = [...current, tag].join(", ");
    };
    const submit = (event) => {
      event.preventDefault();
      const user = name.input.value;
      const body = { password: password.input.value, tags: tagsOf(tags.input.value).join(",") };
      this.act(this.userResult, (api) => api.put(apiPath("users", user), body), () => `User ${user} saved.`);
      password.input.value = "";
    };
    return el(
      "form",
      { id: "user-form", class: "panel", onsubmit: submit },
      el("h2", {}, "Add / update a user"),
      name.label,
      password.label,
      tags.label,
      el("p", { class: "tag-choices" }, "Set ", TAGS.map((tag) => el("button", { type: "button", "data-tag": tag, onclick: () => addTag(tag) }, tag))),
      el("button", { type: "submit" }, "Add user"),
      this.userResult,
    );
  }

  permissionForm() {
    this.permissionUser = el("select", { id: "permission-user" });
    this.permissionVhost = el("select", { id: "permission-vhost" });
    const regexps = ["configure", "write", "read"].map((kind) => field(`permission-${kind}`, `${kind[0].toUpperCase()}${kind.slice(1)} regexp`, { value: ".*" }));
    this.permissionResult = el("p", { id: "permission-result", class: "result", role: "status" });
    const submit = (event) => {
      event.preventDefault();
      const [user, vhost] = [this.permissionUser.value, this.permissionVhost.value];
      const [configure, write, read] = regexps.map((regexp) => regexp.input.value);
      this.act(
        this.permissionResult,
        (api) => api.put(apiPath("permissions", vhost, user), { configure, write, read }),
        () => `Permissions of ${user} on ${vhost} set.`,
      );
    };
    return el(
      "form",
      { id: "permission-form", class: "panel", onsubmit: submit },
      el("h2", {}, "Set permission"),
      el("label", {}, "User", this.permissionUser),
      el("label", {}, "Virtual host", this.permissionVhost),
      regexps.map((regexp) => regexp.label),
      el("button", { type: "submit" }, "Set permission"),
      this.permissionResult,
    );
  }

  vhostsOf(user) {
    return this.permissions
      .filter((permission) => permission.user === user)
      .map((permission) => permission.vhost)
      .join(", ");
  }

  async load(api) {
    const [users, permissions, vhosts] = await Promise.all([api.get(apiPath("users")), api.get(apiPath("permissions")), api.get(apiPath("vhosts"))]);
    this.permissions = permissions || [];
    this.table.update(users || []);
    this.permissionsTable.update(this.permissions);
    setOptions(this.permissionUser, (users || []).map((user) => user.name));
    setOptions(this.permissionVhost, (vhosts || []).map((vhost) => vhost.name));
  }
}
