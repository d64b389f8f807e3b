"""Every path of the management API and the handler answering it."""

from brokerd.http import accessapi, clients, definitionsapi, health, messages, overview, topology
from brokerd.http import clusterapi, parametersapi
from brokerd.http import topicpermissionsapi as topics
from brokerd.http.routes import Route

BINDING_SORT = (
    "vhost", "source", "destination_type", "destination", "routing_key", "properties_key"
)
PERMISSION_SORT = ("vhost", "user")
PARAMETER_SORT = ("vhost", "component", "name")

PARAMETER_ROUTES = [
    Route("GET", "/api/parameters", parametersapi.list_parameters, sort=PARAMETER_SORT),
    Route("GET", "/api/parameters/{component}", parametersapi.list_parameters, sort=PARAMETER_SORT),
    Route(
        "GET", "/api/parameters/{component}/{vhost}", parametersapi.list_parameters,
        sort=PARAMETER_SORT,
    ),
    Route("GET", "/api/parameters/{component}/{vhost}/{name}", parametersapi.get_parameter),
    Route("PUT", "/api/parameters/{component}/{vhost}/{name}", parametersapi.put_parameter),
    Route("DELETE", "/api/parameters/{component}/{vhost}/{name}", parametersapi.delete_parameter),
    Route("GET", "/api/global-parameters", parametersapi.list_global_parameters, sort=("name",)),
    Route("GET", "/api/global-parameters/{name}", parametersapi.get_global_parameter),
    Route("PUT", "/api/global-parameters/{name}", parametersapi.put_global_parameter),
    Route("DELETE", "/api/global-parameters/{name}", parametersapi.delete_global_parameter),
    Route("GET", "/api/vhost-limits", parametersapi.list_vhost_limits, sort=("vhost",)),
    Route("GET", "/api/vhost-limits/{vhost}", parametersapi.list_vhost_limits, sort=("vhost",)),
    Route("PUT", "/api/vhost-limits/{vhost}/{name}", parametersapi.put_vhost_limit),
    Route("DELETE", "/api/vhost-limits/{vhost}/{name}", parametersapi.delete_vhost_limit),
    Route("GET", "/api/user-limits", parametersapi.list_user_limits, sort=("user",)),
    Route("GET", "/api/user-limits/{user}", parametersapi.list_user_limits, sort=("user",)),
    Route("PUT", "/api/user-limits/{user}/{name}", parametersapi.put_user_limit),
    Route("DELETE", "/api/user-limits/{user}/{name}", parametersapi.delete_user_limit),
]
TOPIC_PERMISSION_SORT = ("vhost", "user", "exchange")

ROUTES = [
    Route("GET", "/api/overview", overview.overview),
    Route("GET", "/api/whoami", overview.whoami),
    Route("GET", "/api/nodes", clusterapi.nodes, sort=("name",)),
    Route("GET", "/api/nodes/{name}", clusterapi.node),
    Route("GET", "/api/cluster", clusterapi.cluster),
    Route("GET", "/api/aliveness-test/{vhost}", health.aliveness_test),
    Route("GET", "/api/healthchecks/node", health.node),
    Route("GET", "/api/healthchecks/node/{name}", health.node),
    Route("GET", "/api/health/checks/alarms", health.alarms),
    Route("GET", "/api/health/checks/local-alarms", health.local_alarms),
    Route("GET", "/api/health/checks/port-listener/{port}", health.port_listener),
    Route("GET", "/api/health/checks/protocol-listener/{protocols}", health.protocol_listener),
    Route("GET", "/api/health/checks/virtual-hosts", health.virtual_hosts),
    Route("GET", "/api/vhosts", accessapi.list_vhosts),
    Route("GET", "/api/vhosts/{vhost}", accessapi.get_vhost),
    Route("PUT", "/api/vhosts/{vhost}", accessapi.put_vhost),
    Route("DELETE", "/api/vhosts/{vhost}", accessapi.delete_vhost),
    Route(
        "GET", "/api/vhosts/{vhost}/permissions", accessapi.vhost_permissions,
        sort=PERMISSION_SORT,
    ),
    Route("GET", "/api/users", accessapi.list_users, sort=("name",)),
    Route("GET", "/api/users/{name}", accessapi.get_user),
    Route("PUT", "/api/users/{name}", accessapi.put_user),
    Route("DELETE", "/api/users/{name}", accessapi.delete_user),
    Route("GET", "/api/users/{name}/permissions", accessapi.user_permissions, sort=PERMISSION_SORT),
    Route("GET", "/api/permissions", accessapi.list_permissions, sort=PERMISSION_SORT),
    Route("GET", "/api/permissions/{vhost}/{user}", accessapi.get_permission, sort=PERMISSION_SORT),
    Route("PUT", "/api/permissions/{vhost}/{user}", accessapi.put_permission),
    Route("DELETE", "/api/permissions/{vhost}/{user}", accessapi.delete_permission),
    Route("GET", "/api/topic-permissions", topics.list_all, sort=TOPIC_PERMISSION_SORT),
    Route(
        "GET", "/api/topic-permissions/{vhost}/{user}", topics.get_entries,
        sort=TOPIC_PERMISSION_SORT,
    ),
    Route("PUT", "/api/topic-permissions/{vhost}/{user}", topics.put_entry),
    Route("DELETE", "/api/topic-permissions/{vhost}/{user}", topics.delete_entries),
    Route(
        "GET", "/api/topic-permissions/{vhost}/{user}/{exchange}", topics.get_entries,
        sort=TOPIC_PERMISSION_SORT,
    ),
    Route("PUT", "/api/topic-permissions/{vhost}/{user}/{exchange}", topics.put_entry),
    Route("DELETE", "/api/topic-permissions/{vhost}/{user}/{exchange}", topics.delete_entries),
    Route(
        "GET", "/api/users/{name}/topic-permissions", topics.of_user, sort=TOPIC_PERMISSION_SORT
    ),
    Route(
        "GET", "/api/vhosts/{vhost}/topic-permissions", topics.of_vhost,
        sort=TOPIC_PERMISSION_SORT,
    ),
    Route("GET", "/api/queues", topology.list_queues),
    Route("GET", "/api/queues/{vhost}", topology.list_queues),
    Route("GET", "/api/queues/{vhost}/{name}", topology.get_queue),
    Route("PUT", "/api/queues/{vhost}/{name}", topology.put_queue),
    Route("DELETE", "/api/queues/{vhost}/{name}", topology.delete_queue),
    Route("DELETE", "/api/queues/{vhost}/{name}/contents", topology.purge_queue),
    Route("POST", "/api/queues/{vhost}/{name}/get", messages.get),
    Route("GET", "/api/queues/{vhost}/{name}/bindings", topology.queue_bindings, sort=BINDING_SORT),
    Route("GET", "/api/exchanges", topology.list_exchanges),
    Route("GET", "/api/exchanges/{vhost}", topology.list_exchanges),
    Route("GET", "/api/exchanges/{vhost}/{name}", topology.get_exchange),
    Route("PUT", "/api/exchanges/{vhost}/{name}", topology.put_exchange),
    Route("DELETE", "/api/exchanges/{vhost}/{name}", topology.delete_exchange),
    Route("POST", "/api/exchanges/{vhost}/{name}/publish", messages.publish),
    Route(
        "GET", "/api/exchanges/{vhost}/{name}/bindings/source", topology.exchange_bindings_from,
        sort=BINDING_SORT,
    ),
    Route(
        "GET", "/api/exchanges/{vhost}/{name}/bindings/destination",
        topology.exchange_bindings_to, sort=BINDING_SORT,
    ),
    Route("GET", "/api/bindings", topology.list_bindings, sort=BINDING_SORT),
    Route("GET", "/api/bindings/{vhost}", topology.list_bindings, sort=BINDING_SORT),
    Route(
        "GET", "/api/bindings/{vhost}/e/{source}/q/{destination}", topology.bindings_to_queue,
        sort=BINDING_SORT,
    ),
    Route("POST", "/api/bindings/{vhost}/e/{source}/q/{destination}", topology.bind_queue),
    Route(
        "GET", "/api/bindings/{vhost}/e/{source}/q/{destination}/{props}",
        topology.get_queue_binding, sort=BINDING_SORT,
    ),
    Route(
        "DELETE", "/api/bindings/{vhost}/e/{source}/q/{destination}/{props}",
        topology.unbind_queue,
    ),
    Route(
        "GET", "/api/bindings/{vhost}/e/{source}/e/{destination}", topology.bindings_to_exchange,
        sort=BINDING_SORT,
    ),
    Route("POST", "/api/bindings/{vhost}/e/{source}/e/{destination}", topology.bind_exchange),
    Route(
        "GET", "/api/bindings/{vhost}/e/{source}/e/{destination}/{props}",
        topology.get_exchange_binding, sort=BINDING_SORT,
    ),
    Route(
        "DELETE", "/api/bindings/{vhost}/e/{source}/e/{destination}/{props}",
        topology.unbind_exchange,
    ),
    Route("GET", "/api/connections", clients.list_connections),
    Route("GET", "/api/vhosts/{vhost}/connections", clients.list_connections),
    Route("GET", "/api/connections/{name}", clients.get_connection),
    Route("DELETE", "/api/connections/{name}", clients.close_connection),
    Route("GET", "/api/channels", clients.list_channels),
    Route("GET", "/api/vhosts/{vhost}/channels", clients.list_channels),
    Route("GET", "/api/channels/{name}", clients.get_channel),
    Route("GET", "/api/consumers", clients.list_consumers),
    Route("GET", "/api/consumers/{vhost}", clients.list_consumers),
    Route("GET", "/api/definitions", definitionsapi.get_definitions),
    Route("POST", "/api/definitions", definitionsapi.post_definitions),
    Route("GET", "/api/definitions/{vhost}", definitionsapi.get_definitions),
    Route("POST", "/api/definitions/{vhost}", definitionsapi.post_definitions),
    Route("GET", "/api/policies", definitionsapi.list_policies),
    Route("GET", "/api/policies/{vhost}", definitionsapi.list_policies),
    Route("GET", "/api/policies/{vhost}/{name}", definitionsapi.get_policy),
    Route("PUT", "/api/policies/{vhost}/{name}", definitionsapi.put_policy),
    Route("DELETE", "/api/policies/{vhost}/{name}", definitionsapi.delete_policy),
    *PARAMETER_ROUTES,
]
