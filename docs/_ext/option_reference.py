"""
The option reference, generated from the code so that it cannot drift from it.

Two directives:

- C{.. twistd-options::} renders the options of C{twistd brokerd} as
  C{twistd brokerd --help} lists them (the parameters and flags of
  L{brokerd.process.tap.Options}, with their defaults and help texts);
- C{.. backend-options::} renders every registered storage backend (found by
  name through L{brokerd.storage.registry.available_backends}) with its
  description and the C{options} table of its L{brokerd.interfaces.IStoreBackend},
  as C{twistd brokerd --help-backends} prints them.
"""

from docutils import nodes
from docutils.parsers.rst import Directive


def twistd_options():
    """
    The options C{twistd brokerd --help} lists, in its order: a list of
    C{(name, takes_value, default, help)}, where C{default} is None for an option
    without one.
    """
    from brokerd.process.tap import Options

    options = Options()
    rows = []
    for declared in options.longOpt:
        takes_value = declared.endswith("=")
        name = declared.rstrip("=")
        rows.append((name, takes_value, options.defaults.get(name) if takes_value else None, options.docs[name]))
    # twisted.python.usage.docMakeChunks sorts them by their short name, else their long one.
    short = {long: key for key, long in options.synonyms.items() if key != long and len(key) == 1}
    return sorted(rows, key=lambda row: short.get(row[0]) or row[0])


def backend_options():
    """Every registered backend: a list of C{(name, description, [(option, default, help), ...])}."""
    from brokerd.storage import registry

    backends = []
    for name in registry.available_backends():
        backend = registry.load_backend(name)
        options = [(option, str(default), text) for option, (default, text) in sorted(backend.options.items())]
        backends.append((name, backend.description, options))
    return backends


def _paragraph(text):
    return nodes.paragraph("", "", nodes.Text(text))


def _literal_entry(text):
    return nodes.entry("", nodes.paragraph("", "", nodes.literal(text, text)))


def _text_entry(text):
    return nodes.entry("", _paragraph(text))


def _table(headings, rows, widths):
    """A docutils table of C{headings} and C{rows} (each a list of entry nodes)."""
    group = nodes.tgroup(cols=len(headings))
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    head += nodes.row("", *[_text_entry(heading) for heading in headings])
    body = nodes.tbody()
    for row in rows:
        body += nodes.row("", *row)
    group += head
    group += body
    return nodes.table("", group, classes=["option-reference", "colwidths-auto"])


class TwistdOptions(Directive):
    """C{.. twistd-options::}: the table of C{twistd brokerd}'s options."""

    has_content = False

    def run(self):
        rows = []
        for name, takes_value, default, text in twistd_options():
            shown = f"--{name}=" if takes_value else f"--{name}"
            default_entry = _literal_entry(default) if default is not None else _text_entry("")
            rows.append([_literal_entry(shown), default_entry, _text_entry(text)])
        return [_table(["option", "default", "meaning"], rows, [22, 22, 56])]


class BackendOptions(Directive):
    """C{.. backend-options::}: a section per backend, with the table of its options."""

    has_content = False

    def run(self):
        found = []
        for name, description, options in backend_options():
            section = nodes.section(ids=[f"backend-{name}"], names=[f"backend {name}"])
            section += nodes.title(name, name)
            section += _paragraph(description + ".")
            if options:
                rows = [[_literal_entry(f"{option}="), _literal_entry(default), _text_entry(text)]
                        for option, default, text in options]
                section += _table(["option", "default", "meaning"], rows, [22, 22, 56])
            else:
                section += _paragraph("No options.")
            self.state.document.note_implicit_target(section)
            found.append(section)
        return found


def setup(app):
    app.add_directive("twistd-options", TwistdOptions)
    app.add_directive("backend-options", BackendOptions)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
