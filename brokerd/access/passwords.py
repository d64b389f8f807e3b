"""Password hashes in RabbitMQ's C{rabbit_password_hashing_sha256} format.

A hash is the base64 of a 4-byte random salt followed by SHA-256(salt +
UTF-8 password), as RabbitMQ stores it and exports it in its definitions, so
users exported from RabbitMQ keep their passwords here and back.
"""

import base64
import hashlib
import hmac
import os

HASHING_ALGORITHM = "rabbit_password_hashing_sha256"
SALT_LENGTH = 4


def hash_password(password, salt=None):
    """The hash of C{password} (str or UTF-8 bytes) with C{salt} (4 bytes; random without it)."""
    if isinstance(password, str):
        password = password.encode()
    salt = os.urandom(SALT_LENGTH) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password).digest()).decode("ascii")


def password_matches(password_hash, password):
    """Whether C{password} (str or UTF-8 bytes) is the one C{password_hash} was made from."""
    try:
        raw = base64.b64decode(password_hash, validate=True)
    except (ValueError, TypeError):
        return False
    if len(raw) != SALT_LENGTH + hashlib.sha256().digest_size:
        return False
    return hmac.compare_digest(raw, base64.b64decode(hash_password(password, raw[:SALT_LENGTH])))
