"""Runtime parameters, global parameters and limits, checked in RabbitMQ's words.

RabbitMQ keeps per-vhost settings as runtime parameters (a vhost, a
component, a name and a JSON value) and cluster-wide ones as global
parameters (a name and a JSON value, e.g. C{cluster_name}). brokerd knows one
component, C{vhost-limits}, whose parameter C{limits} holds a vhost's
C{max-connections} and C{max-queues}; any other component is refused as a
RabbitMQ node without the plugin that registers it refuses it (C{shovel} and
C{federation-upstream} among them, until brokerd runs shovels). A user's
C{max-connections} and C{max-channels} are kept with the user, as RabbitMQ
keeps them. A limit that is not set, or negative, is no limit; 0 allows none.

L{RuntimeParameters} holds the parameters of an access database;
L{check_parameter} and L{check_user_limits} refuse, with RabbitMQ 3.10's
texts, what its validation refuses.
"""

import json

VHOST_LIMITS = "vhost-limits"  # the component, and
LIMITS = "limits"  # the one name, RabbitMQ keeps a vhost's limits under
VHOST_LIMIT_NAMES = ("max-connections", "max-queues")
USER_LIMIT_NAMES = ("max-connections", "max-channels")
COMPONENTS = (VHOST_LIMITS,)
CLUSTER_NAME = "cluster_name"  # the global parameter /api/overview shows as cluster_name
VALIDATION_FAILED = "Validation failed"


class ParameterRefused(ValueError):
    """A parameter or limit RabbitMQ would refuse; the message is its text."""


def erlang_term(value):
    """C{value} (decoded JSON) as RabbitMQ's C{~p} prints it in a refusal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return "<<" + json.dumps(value, ensure_ascii=False) + ">>"
    if isinstance(value, list):
        return "[" + ",".join(erlang_term(item) for item in value) + "]"
    if isinstance(value, dict):
        pairs = (f"{erlang_term(key)} => {erlang_term(value[key])}" for key in sorted(value))
        return "#{" + ",".join(pairs) + "}"
    return repr(value)


def limit_problems(name, known, value):
    """
    What RabbitMQ's C{rabbit_parameter_validation:proplist} says of C{value} as
    a set of C{known} integer limits named C{name}: a list of texts, none if fine.
    """
    if isinstance(value, list):  # a JSON list is an Erlang list: only an empty one is a proplist
        return [f"Unrecognised terms {erlang_term(value)} in {name}"] if value else []
    if not isinstance(value, dict):
        return [f"{name} not a list {erlang_term(value)}"]
    problems = [
        f"{key} should be a number, actually was {erlang_term(value[key])}"
        for key in reversed(known)
        if key in value and not is_integer(value[key])
    ]
    unknown = sorted(key for key in value if key not in known)
    if unknown:
        terms = ",".join(f"{{{erlang_term(key)},{erlang_term(value[key])}}}" for key in unknown)
        problems.insert(0, f"Unrecognised terms [{terms}] in {name}")
    return problems


def is_integer(value):
    return isinstance(value, int) and not isinstance(value, bool)


def validation_failed(problems):
    """RabbitMQ's C{rabbit_runtime_parameters} refusal of a value with C{problems}."""
    return ParameterRefused(f"{VALIDATION_FAILED}\n\n" + "".join(f"{p}\n" for p in problems))


def check_parameter(component, name, value):
    """
    The value to keep for parameter C{name} of C{component} (a dict of limits
    for C{vhost-limits}), or L{ParameterRefused} in RabbitMQ's words.
    """
    if component not in COMPONENTS:
        raise validation_failed([f"component {component} not found"])
    problems = limit_problems(name, VHOST_LIMIT_NAMES, value)
    if problems:
        raise validation_failed(problems)
    return dict(value) if value else {}


def check_user_limits(limits):
    """A user's limits as RabbitMQ's C{set_user_limits} checks them; L{ParameterRefused} if not."""
    problems = limit_problems("user-limits", USER_LIMIT_NAMES, limits)
    if problems:
        raise ParameterRefused(problems[0])
    return dict(limits) if limits else {}


def effective_limit(limits, name):
    """The limit C{name} of C{limits} (a dict) as enforced: None (none, or negative) or N >= 0."""
    value = (limits or {}).get(name)
    if not is_integer(value) or value < 0:
        return None
    return value


class RuntimeParameters:
    """
    The runtime and global parameters of one access database.

    @ivar parameters: C{(vhost, component, name)} -> value, in the order set.
    @ivar global_parameters: name -> value, in the order set.
    """

    def __init__(self):
        self.parameters = {}
        self.global_parameters = {}

    def vhost_limits(self, vhost):
        """The limits of C{vhost} (a dict, empty without any)."""
        return self.parameters.get((vhost, VHOST_LIMITS, LIMITS)) or {}

    def listed(self, vhost=None, component=None):
        """
        Runtime parameters in RabbitMQ's JSON shape, of C{vhost} and
        C{component} if given, by vhost, component and name.
        """
        return [
            parameter_entry(on, of, name, value)
            for (on, of, name), value in sorted(self.parameters.items())
            if (vhost is None or on == vhost) and (component is None or of == component)
        ]

    def forget_vhost(self, vhost):
        for key in [key for key in self.parameters if key[0] == vhost]:
            del self.parameters[key]

    def document(self):
        """The C{parameters} and C{global_parameters} sections of the database's file."""
        return {
            "parameters": self.listed(),
            "global_parameters": [
                {"name": name, "value": value} for name, value in self.global_parameters.items()
            ],
        }

    def take_document(self, document):
        """Load the sections L{document} wrote (a file from before parameters has none)."""
        self.parameters = {
            (entry["vhost"], entry["component"], entry["name"]): entry["value"]
            for entry in document.get("parameters", ())
        }
        self.global_parameters = {
            entry["name"]: entry["value"] for entry in document.get("global_parameters", ())
        }


def parameter_entry(vhost, component, name, value):
    """One runtime parameter as RabbitMQ's API and definitions write it."""
    return {"value": value, "vhost": vhost, "component": component, "name": name}
