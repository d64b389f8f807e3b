"""Both ends of a replication link prove they hold the cluster's shared secret.

Challenge-response with HMAC-SHA256: each end sends a fresh random nonce and
answers the other's with an HMAC over both nonces and what it claims (role,
cluster id, node name, resume point), so an answer cannot be replayed on
another connection nor reflected back in the other role. The secret itself
never travels; answers are compared in constant time.
"""

import hashlib
import hmac
import os

from brokerd.replication.codec import NONCE_SIZE, POSITION, SEQUENCE, pack_history, pack_name


def nonce():
    return os.urandom(NONCE_SIZE)


def follower_proof(secret, leader_nonce, follower_nonce, cluster_id, node_name, epoch, sequence,
                   flags):
    """What a follower sends to show it holds C{secret}, binding what it claims."""
    message = (b"brokerd follower\0" + leader_nonce + follower_nonce + pack_name(cluster_id)
               + pack_name(node_name) + POSITION.pack(epoch, sequence, flags))
    return hmac.new(secret, message, hashlib.sha256).digest()


def leader_proof(secret, leader_nonce, follower_nonce, cluster_id, epoch, history):
    """What a leader sends back to show it holds C{secret} too, binding its epoch and history."""
    message = (b"brokerd leader\0" + follower_nonce + leader_nonce + pack_name(cluster_id)
               + SEQUENCE.pack(epoch) + pack_history(history))
    return hmac.new(secret, message, hashlib.sha256).digest()


def same(expected, given):
    """Constant-time comparison of two proofs."""
    return hmac.compare_digest(expected, given)
