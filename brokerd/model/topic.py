"""Topic matching through a trie of binding-key words.

Binding keys and routing keys are words separated by dots. In a binding key,
``*`` matches exactly one word and ``#`` matches zero or more words. As in
RabbitMQ, the empty key has no words and ``a..b`` has an empty middle word.
Matching walks the trie once per routing key, whatever the number of bindings.
"""

STAR = "*"
HASH = "#"


def split_words(key):
    """The words of a topic key: none for the empty key, else the dot-separated parts."""
    return key.split(".") if key else []


class _Node:
    __slots__ = ("children", "destinations")

    def __init__(self):
        self.children = {}
        self.destinations = {}  # destination -> number of bindings ending here


class TopicTrie:
    """Maps topic binding keys to destinations and routing keys to the matching ones."""

    def __init__(self):
        self._root = _Node()

    def add(self, binding_key, destination):
        node = self._root
        for word in split_words(binding_key):
            child = node.children.get(word)
            if child is None:
                child = node.children[word] = _Node()
            node = child
        node.destinations[destination] = node.destinations.get(destination, 0) + 1

    def remove(self, binding_key, destination):
        """Removes one binding of C{destination} under C{binding_key}, pruning empty branches."""
        path = [self._root]
        words = split_words(binding_key)
        for word in words:
            child = path[-1].children.get(word)
            if child is None:
                return
            path.append(child)
        node = path[-1]
        count = node.destinations.get(destination, 0)
        if count <= 1:
            node.destinations.pop(destination, None)
        else:
            node.destinations[destination] = count - 1
        for depth in range(len(words), 0, -1):
            node = path[depth]
            if node.children or node.destinations:
                break
            del path[depth - 1].children[words[depth - 1]]

    def match(self, routing_key):
        """The set of destinations whose binding keys match C{routing_key}."""
        words = split_words(routing_key)
        count = len(words)
        matched = set()
        stack = [(self._root, 0)]
        expanded = set()  # (hash node, start) pairs already expanded
        while stack:
            node, index = stack.pop()
            children = node.children
            hash_node = children.get(HASH)
            if hash_node is not None and (id(hash_node), index) not in expanded:
                expanded.add((id(hash_node), index))
                # '#' swallows zero or more words: continue after any of them.
                for start in range(index, count + 1):
                    stack.append((hash_node, start))
            if index == count:
                if node.destinations:
                    matched.update(node.destinations)
                continue
            word = words[index]
            literal = children.get(word)
            if literal is not None:
                stack.append((literal, index + 1))
            if word != STAR:
                star = children.get(STAR)
                if star is not None:
                    stack.append((star, index + 1))
        return matched
